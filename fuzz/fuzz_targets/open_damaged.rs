//! A small valid database, damaged by arbitrary byte edits (and truncation), opened with
//! `Engine::open_with_backends` on in-memory copies of its two files: the log file and
//! the projections file beside it, which holds a checkpoint at the log's tip. Each input
//! runs twice, the same edits applied to one file at a time:
//!
//! 1. the log file damaged, beside its pristine projections file: the open checks the
//!    checkpoint against the damaged log (and folds, or refuses, what it cannot trust),
//!    and the rebuild folds the damaged log from the start;
//! 2. the pristine log beside a damaged projections file: projections are disposable, so
//!    besides never panicking, a rebuild that succeeds must reproduce exactly the
//!    projections of the pristine database. (An open that refuses the damaged file with
//!    an error is allowed.)
//!
//! In both passes, opening, every query on every session, a rebuild and a write must
//! each return an answer or an error: never panic, never hang.

#![no_main]

use annal::{
    AppendContext, CommitTurn, CreateSession, Durability, Engine, EventQuery, Expected, ListQuery, Message, Options,
    PageRequest, ProjectionSet, RecordToolCall, RecordToolResult, Recovery, Restore, Rewrite, RewriteReason, SessionId,
    SetLabels, TableDigest, ToolOutcome,
};
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use redb::StorageBackend;
use std::sync::OnceLock;

#[derive(Arbitrary, Debug)]
enum Edit {
    /// Overwrite bytes at an offset (taken modulo the file length).
    Write { offset: u32, bytes: Vec<u8> },
    /// Flip one bit.
    Flip { offset: u32, bit: u8 },
    /// Cut the file short.
    Truncate { len: u32 },
}

/// The pristine files, the sessions in them and their projection digests.
struct Sample {
    log: Vec<u8>,
    projections: Vec<u8>,
    sessions: Vec<SessionId>,
    digests: Vec<TableDigest>,
}

/// The configuration for files that may be damaged: redb's integrity check at open.
/// Without it, damage inside redb's own page structures can make redb panic inside a
/// destructor while it unwinds from an earlier panic, which aborts the process and which
/// no caller can catch (see docs/guarantees.md).
fn options() -> Options {
    Options {
        durability: Durability::Relaxed,
        cache_bytes: 1 << 20,
        check_integrity_on_open: true,
        ..Options::default()
    }
}

/// Builds a small file holding every kind of event.
fn sample() -> &'static Sample {
    static SAMPLE: OnceLock<Sample> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sample.redb");
        let engine = Engine::open_with(&path, options()).expect("open");
        let a = engine.create_session(CreateSession::new().label("k", "v").message(Message::system("sys"))).unwrap();
        let s = a.session;
        engine
            .append_context(AppendContext { session: s, key: "ctx".into(), content: b"c".to_vec(), source: "m".into() })
            .unwrap();
        let mut head = a.receipt.revision;
        for i in 0..4 {
            let mut t = CommitTurn::new(s, format!("t{i}"), Expected::Exact(head))
                .message(Message::user(format!("u{i}")).with_attachment(vec![i; 8]))
                .message(Message::assistant(format!("a{i}")))
                .usage("p", "m", 10, 5);
            if i == 1 {
                t = t.apply_context("ctx");
            }
            head = engine.commit_turn(t).unwrap().receipt().revision;
        }
        let before = head;
        let rewritten = engine
            .rewrite(Rewrite {
                session: s,
                expected: head,
                start: 0,
                end: 3,
                replacement: vec![Message::system("summary")],
                reason: RewriteReason::Compaction,
                note: "n".into(),
                actor: "a".into(),
            })
            .unwrap();
        engine
            .restore(Restore {
                session: s,
                expected: rewritten.revision,
                target: before,
                note: "r".into(),
                actor: "a".into(),
            })
            .unwrap();
        for op in ["op1", "op2"] {
            engine
                .record_tool_call(RecordToolCall {
                    session: s,
                    op_id: op.into(),
                    call_id: "c".into(),
                    tool_name: "bash".into(),
                    args: b"ls".to_vec(),
                    parent_op: None,
                    turn_id: None,
                    recovery: Recovery::ReplaySafe,
                })
                .unwrap();
        }
        engine
            .record_tool_result(RecordToolResult {
                session: s,
                op_id: "op1".into(),
                outcome: ToolOutcome::Ok,
                result: b"r".to_vec(),
            })
            .unwrap();
        let f = engine.fork_at(s, 3).unwrap();
        engine
            .set_labels(SetLabels {
                session: f.session,
                set: [("x".to_string(), "y".to_string())].into(),
                remove: Default::default(),
            })
            .unwrap();
        engine.archive(f.session, "done").unwrap();
        let digests = engine.projection_digests().unwrap();
        engine.close().unwrap();
        let sample = Sample {
            log: std::fs::read(&path).expect("read sample log"),
            projections: std::fs::read(annal::projections_path(&path)).expect("read sample projections"),
            sessions: vec![s, f.session],
            digests,
        };
        // The pristine pair opens with nothing to fold: the projections file holds a
        // checkpoint at the log's tip, so the first pass starts from a real checkpoint.
        let engine = open(&sample.log, &sample.projections).expect("the pristine copies open");
        assert_eq!(engine.stats().recovered_events, 0, "the sample's projections are checkpointed at its tip");
        assert_eq!(engine.projection_digests().unwrap(), sample.digests);
        engine.close().unwrap();
        sample
    })
}

/// An in-memory copy of a file.
fn backend(bytes: &[u8]) -> Option<redb::backends::InMemoryBackend> {
    let backend = redb::backends::InMemoryBackend::new();
    (backend.set_len(bytes.len() as u64).is_ok() && backend.write(0, bytes).is_ok()).then_some(backend)
}

/// Opens an engine on in-memory copies of a log file and a projections file.
fn open(log: &[u8], projections: &[u8]) -> Option<Engine> {
    Engine::open_with_backends(backend(log)?, backend(projections)?, options()).ok()
}

/// `pristine` with `edits` applied.
fn damaged(pristine: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut bytes = pristine.to_vec();
    for edit in edits.iter().take(16) {
        if bytes.is_empty() {
            break;
        }
        let len = bytes.len();
        match edit {
            Edit::Write { offset, bytes: b } => {
                let at = *offset as usize % len;
                let n = b.len().min(len - at).min(64);
                bytes[at..at + n].copy_from_slice(&b[..n]);
            }
            Edit::Flip { offset, bit } => bytes[*offset as usize % len] ^= 1 << (bit % 8),
            Edit::Truncate { len: l } => bytes.truncate(*l as usize % len),
        }
    }
    bytes
}

fn exercise(engine: &Engine, sessions: &[SessionId]) {
    let page = PageRequest::first(32);
    let _ = engine.tip();
    let _ = engine.projection_digests();
    let mut all = sessions.to_vec();
    if let Ok(list) = engine.list_sessions(&ListQuery::new().include_archived()) {
        all.extend(list.items.iter().map(|h| h.session));
    }
    let _ = engine.unsettled_all(page);
    let mut from = 1;
    for _ in 0..64 {
        match engine.events(EventQuery { from_seq: from, max_events: 8, max_bytes: 1 << 20 }) {
            Ok(p) if p.has_more && p.next_seq > from => from = p.next_seq,
            _ => break,
        }
    }
    for s in all.iter().take(8) {
        let _ = engine.head(*s);
        let _ = engine.transcript(*s, page);
        let _ = engine.graph(*s);
        let _ = engine.context(*s);
        let _ = engine.pending_context(*s);
        let _ = engine.usage(*s);
        let _ = engine.tool_op(*s, "op1");
        let _ = engine.unsettled(*s);
        let _ = engine.tool_ops(*s, page);
        let _ = engine.session_events(*s, EventQuery { from_seq: 1, max_events: 8, max_bytes: 1 << 20 });
        if let Ok(revs) = engine.revisions(*s, page) {
            for node in revs.page.items.iter().take(8) {
                let _ = engine.transcript_at(*s, node.revision, page);
            }
        }
        if let Ok(t) = engine.transcript(*s, page) {
            for m in t.messages.iter().take(4) {
                let _ = engine.content(m.content_id);
            }
        }
    }
}

/// A write after everything else.
fn write(engine: &Engine, sessions: &[SessionId]) {
    if let Some(s) = sessions.first() {
        let _ = engine.commit_turn(CommitTurn::new(*s, "after", Expected::Any).message(Message::user("x")));
    }
}

/// libFuzzer aborts on every panic, even one that is caught. redb may panic on pages it
/// cannot make sense of, and the engine turns such a panic into `Error::Corrupt`
/// (`fail_closed`), so a panic raised inside redb is let through to that handler; any
/// other panic still aborts and is reported as a crash.
fn let_storage_panics_unwind() {
    let abort = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.location().is_some_and(|l| l.file().contains("/redb-")) {
            return;
        }
        abort(info);
    }));
}

fuzz_target!(init: let_storage_panics_unwind(), |edits: Vec<Edit>| {
    let sample = sample();
    // Pass 1: the log damaged, the projections file pristine.
    if let Some(engine) = open(&damaged(&sample.log, &edits), &sample.projections) {
        exercise(&engine, &sample.sessions);
        let _ = engine.rebuild(ProjectionSet::all());
        write(&engine, &sample.sessions);
        let _ = engine.close();
    }
    // Pass 2: the log pristine, the projections file damaged.
    if let Some(engine) = open(&sample.log, &damaged(&sample.projections, &edits)) {
        exercise(&engine, &sample.sessions);
        if engine.rebuild(ProjectionSet::all()).is_ok() {
            let digests = engine.projection_digests().expect("digests after a rebuild");
            assert_eq!(digests, sample.digests, "a rebuild from the pristine log repairs any damaged projection");
        }
        write(&engine, &sample.sessions);
        let _ = engine.close();
    }
});
