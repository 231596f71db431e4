//! The invariants of SPEC §7 that hold at the engine level: 1 (dense sequences), 2
//! (rejections change nothing), 3 (rebuild is byte-identical), 5 (revision ids depend
//! only on messages), 7 (schema versions) and 10 (every limit is typed). Invariant 7's
//! newer-schema half is also exercised by the S16 scenarios in `scenarios.rs`.

mod common;

use annal::codec::{wire, ContextAppended, ContextAppendedV0, EventKind, HEADER_LEN, RECORD_LEN_MIN};
use annal::tables::meta_keys;
use annal::*;
use common::*;
use std::collections::BTreeMap;

/// Issues commands that every engine must reject (or treat as no-ops), against the
/// sessions of [`workload`], and checks each one wrote nothing.
fn rejected_commands(engine: &Engine, sessions: &[SessionId]) {
    let s = sessions[0];
    let h = head(engine, s);
    let stale = RevisionId([1; 32]);
    let ghost = SessionId([0xee; 16]);
    let tip = tip_seq(engine);
    let commands = vec![
        Command::CreateSession(CreateSession::with_id(s)),
        Command::CommitTurn(turn(s, "new", stale)),
        Command::CommitTurn(turn(ghost, "new", stale)),
        Command::CommitTurn(CommitTurn::new(s, "w0", Expected::Any).message(Message::user("other content"))),
        Command::CommitTurn(turn(s, "new", h.revision).apply_context("repo")),
        Command::CommitTurn(turn(s, "new", h.revision).tool_op("unknown")),
        Command::Rewrite(rewrite(s, h.revision, 5, 2, vec![], RewriteReason::Edit)),
        Command::Rewrite(rewrite(s, stale, 0, 1, vec![], RewriteReason::Edit)),
        Command::Restore(restore(s, h.revision, h.revision)),
        Command::Restore(restore(s, h.revision, stale)),
        Command::Fork(Fork { parent: s, session: new_session_id(), index: 999, replacement: None, labels: None }),
        Command::Fork(Fork { parent: s, session: sessions[1], index: 0, replacement: None, labels: None }),
        Command::Archive { session: ghost, reason: String::new() },
        Command::Archive { session: sessions[2], reason: "already".into() },
        Command::Revive { session: s, reason: String::new() },
        Command::AppendContext(context(s, "repo", "other text")),
        Command::AppendContext(context(s, "repo", "src/ holds the code")),
        Command::AppendContext(context(s, "blank", "  ")),
        Command::AppendContext(context(sessions[2], "k", "v")),
        Command::RecordToolCall(tool_call(s, "op1", "zsh", "ls")),
        Command::RecordToolCall(tool_call(s, "op1", "bash", "ls")),
        Command::RecordToolResult(tool_result(s, "op1", "other")),
        Command::RecordToolResult(tool_result(s, "op1", "a b c")),
        Command::RecordToolResult(tool_result(s, "missing", "x")),
        Command::SetLabels(SetLabels { session: s, set: BTreeMap::new(), remove: ["absent".into()].into() }),
        Command::Batch(vec![
            Command::CreateSession(CreateSession::with_id(SessionId([0xdd; 16]))),
            Command::CommitTurn(turn(SessionId([0xdd; 16]), "b", RevisionId::empty())),
            Command::CommitTurn(turn(SessionId([0xdd; 16]), "c", stale)),
        ]),
    ];
    for command in commands {
        let before = engine.projection_digests().unwrap();
        match engine.execute(command.clone()) {
            Err(Error::Rejected(_)) => {}
            Ok(outcome) => assert!(
                matches!(
                    outcome,
                    Outcome::AlreadyCommitted(_)
                        | Outcome::Duplicate
                        | Outcome::Archived { seq: None }
                        | Outcome::Tool { created: false, seq: None }
                        | Outcome::Labels { seq: None }
                ),
                "{command:?} wrote: {outcome:?}"
            ),
            Err(other) => panic!("{command:?} failed with {other:?}"),
        }
        assert_eq!(tip_seq(engine), tip, "{command:?} consumed a seq");
        assert_eq!(engine.projection_digests().unwrap(), before, "{command:?} changed a projection");
    }
}

// ----------------------------------------------------------------- invariant 1

#[test]
fn inv1_sequences_are_dense_and_rejections_consume_none() {
    let db = Db::new();
    let engine = db.open();
    let sessions = workload(&engine);
    rejected_commands(&engine, &sessions);
    let tip = tip_seq(&engine);
    // The next accepted command takes the very next seq, in its session's next slot.
    let s = sessions[0];
    let stream_before = head(&engine, s).stream_seq;
    let r = engine.commit_turn(turn(s, "next", head(&engine, s).revision)).unwrap().receipt();
    assert_eq!(r.seq, tip + 1);
    assert_eq!(head(&engine, s).stream_seq, stream_before + 1);
    rejected_commands(&engine, &sessions);

    let events = all_events(&engine);
    let seqs: Vec<u64> = events.iter().map(|e| e.record.seq).collect();
    assert_eq!(seqs, (1..=tip + 1).collect::<Vec<_>>());
    assert!(events.windows(2).all(|w| w[0].record.committed_at_ms <= w[1].record.committed_at_ms));

    let mut per_session: BTreeMap<SessionId, Vec<&StoredEvent>> = BTreeMap::new();
    for e in &events {
        per_session.entry(e.record.session).or_default().push(e);
    }
    let mut counted = 0;
    for (session, list) in &per_session {
        let streams: Vec<u64> = list.iter().map(|e| e.record.stream_seq).collect();
        assert_eq!(streams, (1..=list.len() as u64).collect::<Vec<_>>(), "stream of {session}");
        let indexed = session_events(&engine, *session);
        assert_eq!(
            indexed.iter().map(|e| &e.record).collect::<Vec<_>>(),
            list.iter().map(|e| &e.record).collect::<Vec<_>>()
        );
        assert_eq!(head(&engine, *session).stream_seq, list.len() as u64);
        assert_eq!(head(&engine, *session).last_seq, list.last().unwrap().record.seq);
        counted += list.len();
    }
    assert_eq!(counted, events.len());
}

// ----------------------------------------------------------------- invariant 2

/// What each file of a database is, in the order of [`database_files`].
const FILE_NAMES: [&str; 4] = ["log file", "projections file", "journal file 0", "journal file 1"];

/// The hash of every file of the database at `path` ([`database_files`]: the log file, its
/// projections file and its two journal files), `None` for one that does not exist.
fn files_hash(path: &std::path::Path) -> [Option<blake3::Hash>; 4] {
    database_files(path).map(|file| match std::fs::read(&file) {
        Ok(bytes) => Some(blake3::hash(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("read {}: {e}", file.display()),
    })
}

/// The names of the files whose hashes differ between `left` and `right`.
fn changed_files(left: &[Option<blake3::Hash>; 4], right: &[Option<blake3::Hash>; 4]) -> Vec<&'static str> {
    FILE_NAMES.iter().zip(left.iter().zip(right)).filter(|(_, (l, r))| l != r).map(|(name, _)| *name).collect()
}

#[test]
fn inv2_a_rejection_changes_no_byte_of_the_file_and_notifies_nobody() {
    let db = Db::new();
    let engine = db.open_durable();
    let sessions = workload(&engine);
    let rx = engine.subscribe();
    // Durable commits are on disk when acknowledged, so the open files can be hashed. The
    // workload's projection rows are checkpointed first (the journal goes into the log
    // file with them), so that no checkpoint writes the projections file while they are.
    engine.checkpoint().unwrap();
    let before = files_hash(&db.path);
    assert!(before.iter().all(Option::is_some), "a durable engine has every file open: {before:?}");
    rejected_commands(&engine, &sessions);
    let changed = changed_files(&before, &files_hash(&db.path));
    assert!(changed.is_empty(), "a rejected command changed the {}", changed.join(", "));
    assert!(rx.try_recv().is_err(), "a rejected command notified a subscriber");
    // The subscription works: an accepted command is heard, and it wrote.
    let r = engine.create_session(CreateSession::new()).unwrap();
    let heard = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("a commit notice");
    assert_eq!(heard.first_seq, r.receipt.seq);
    assert!(!changed_files(&before, &files_hash(&db.path)).is_empty());
}

#[test]
fn inv2_a_rejection_changes_no_byte_of_the_file_across_close() {
    let db = Db::new();
    let engine = db.open_durable();
    let sessions = workload(&engine);
    engine.close().unwrap();
    // Two copies of one database; both are opened and closed, only one sees rejections.
    let control = db.dir.path().join("control.redb");
    let tested = db.dir.path().join("tested.redb");
    for copy in [&control, &tested] {
        for (from, to) in database_files(&db.path).iter().zip(database_files(copy)) {
            if from.exists() {
                std::fs::copy(from, to).unwrap();
            }
        }
    }
    assert!(files_hash(&control)[..2].iter().all(Option::is_some), "the log and projections files were copied");
    Engine::open(&control).unwrap().close().unwrap();
    let engine = Engine::open(&tested).unwrap();
    rejected_commands(&engine, &sessions);
    engine.close().unwrap();
    let changed = changed_files(&files_hash(&control), &files_hash(&tested));
    assert!(changed.is_empty(), "rejected commands changed the {}", changed.join(", "));
}

// ----------------------------------------------------------------- invariant 3

#[test]
fn inv3_rebuild_is_byte_identical_to_the_live_projections() {
    let db = Db::new();
    let engine = db.open();
    workload(&engine);
    let live = engine.projection_digests().unwrap();

    // An offline fold of the log with the same `evolve`, in memory.
    let mut mem = MemStore::default();
    let view = engine.snapshot().unwrap();
    for e in view.log_entries(0, engine.limits(), engine.chain()).unwrap() {
        let e = e.unwrap();
        // The view answers for the records a rewrite's fold reads.
        let mut folding = annal::store::WithRecords::write(&mut mem, &view);
        evolve(&mut folding, &e.record, &e.introduced, ProjectionSet::all()).unwrap();
    }
    assert_eq!(annal::query::mem_digests(&mem), live);

    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), live);
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), live);
    let tip = tip_seq(&engine);
    engine.close().unwrap();

    // Every projection stale at open: rebuilt by itself, to the same bytes.
    for p in Projection::ALL {
        set_meta(&projections_path(&db.path), &meta_keys::version(p), &(p.version() + 1).to_le_bytes());
    }
    let engine = db.open();
    assert_eq!(engine.projection_digests().unwrap(), live);
    engine.close().unwrap();
    for p in Projection::ALL {
        let projections = projections_path(&db.path);
        assert_eq!(meta_u64(&projections, &meta_keys::version(p)), Some(p.version() as u64), "{}", p.name());
        assert_eq!(meta_u64(&projections, &meta_keys::cursor(p)), Some(tip), "{}", p.name());
    }
}

// ----------------------------------------------------------------- invariant 5

#[test]
fn inv5_revision_ids_depend_only_on_messages() {
    let db = Db::new();
    let engine = db.open();
    let m = [
        Message::system("sys"),
        Message::user("q1"),
        Message::assistant("a1"),
        Message::user("q2").with_attachment(b"file".to_vec()),
        Message::assistant("a2"),
    ];
    // All at once, with labels and metadata.
    let mut c = CreateSession::new().label("k", "v").metadata(b"meta".to_vec());
    for x in &m {
        c = c.message(x.clone());
    }
    let a = engine.create_session(c).unwrap();
    // Turn by turn, with usage and run ids.
    let (b, rev) = create(&engine, &m[..1]);
    let t = CommitTurn::new(b, "b1", Expected::Exact(rev)).message(m[1].clone()).message(m[2].clone());
    let rev = engine.commit_turn(t.usage("p", "x", 1, 2)).unwrap().receipt().revision;
    let t = CommitTurn::new(b, "b2", Expected::Exact(rev)).message(m[3].clone()).message(m[4].clone()).run_id("run");
    let b_rev = engine.commit_turn(t).unwrap().receipt().revision;
    // Through a rewrite.
    let (c, rev) = create(&engine, &[m[0].clone(), m[1].clone(), m[2].clone(), Message::user("wrong")]);
    let c_rev = engine.rewrite(rewrite(c, rev, 3, 4, vec![m[3].clone(), m[4].clone()], RewriteReason::Edit)).unwrap();
    // As a fork.
    let d = engine.fork_at(b, 5).unwrap();

    let expected = revision_of(&m);
    assert_eq!([a.receipt.revision, b_rev, c_rev.revision, d.receipt.revision], [expected; 4]);
    let chains = |s| transcript(&engine, s).into_iter().map(|x| x.chain).collect::<Vec<_>>();
    assert_eq!(chains(a.session), chains(b));
    assert_eq!(chains(a.session), chains(c));
    assert_eq!(chains(a.session), chains(d.session));

    // Any difference in a message changes the id.
    let variants = [
        Message::new(Role::User, "text/plain", b"a2".to_vec()),
        Message::new(Role::Assistant, "text/markdown", b"a2".to_vec()),
        Message::assistant("a2").with_attachment(b"x".to_vec()),
        Message::assistant("a2 "),
    ];
    for v in variants {
        let (_, rev) = create(&engine, &[m[0].clone(), m[1].clone(), m[2].clone(), m[3].clone(), v.clone()]);
        assert_ne!(rev, expected, "{v:?}");
    }
    let (_, swapped) = create(&engine, &[m[0].clone(), m[2].clone(), m[1].clone(), m[3].clone(), m[4].clone()]);
    assert_ne!(swapped, expected);

    // Restoring a parent yields exactly its id, after a compaction and an edit.
    let compacted = engine
        .rewrite(rewrite(a.session, expected, 0, 3, vec![Message::system("summary")], RewriteReason::Compaction))
        .unwrap()
        .revision;
    let edited = engine
        .rewrite(rewrite(a.session, compacted, 1, 2, vec![Message::user("q2!")], RewriteReason::Edit))
        .unwrap()
        .revision;
    assert_eq!(engine.restore(restore(a.session, edited, expected)).unwrap().revision, expected);
    assert_eq!(head(&engine, a.session).revision, expected);
    assert_eq!(chains(a.session), chains(b));
    assert_eq!(engine.restore(restore(a.session, expected, compacted)).unwrap().revision, compacted);
    assert_eq!(head(&engine, a.session).revision, compacted);
}

// ----------------------------------------------------------------- invariant 7

#[test]
fn inv7_an_older_supported_schema_is_upcast_on_read_and_replay() {
    let db = Db::new();
    let engine = db.open();
    let (s, _) = create(&engine, &[Message::system("sys")]);
    engine.append_context(context(s, "repo", "text")).unwrap();
    engine
        .commit_turn(CommitTurn::new(s, "t", Expected::Any).message(Message::user("u")).apply_context("repo"))
        .unwrap();
    let appended = match &all_events(&engine)[1].record.event {
        Event::ContextAppended(e) => e.clone(),
        other => panic!("expected ContextAppended, got {other:?}"),
    };
    engine.close().unwrap();

    // Store the record as schema version 0, which had no `source`.
    let v0 = ContextAppendedV0 { key: appended.key.clone(), content: appended.content };
    let payload = wire::to_bytes(&v0, u64::MAX).unwrap();
    edit_log_record(&db.path, 2, |bytes| {
        let mut rewritten = bytes[..HEADER_LEN].to_vec();
        rewritten[6..8].copy_from_slice(&0u16.to_le_bytes());
        rewritten[48..52].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        rewritten.extend_from_slice(&payload);
        rewritten.extend_from_slice(&[0; RECORD_LEN_MIN - HEADER_LEN]);
        *bytes = rewritten;
    });

    let engine = db.open();
    let read = &all_events(&engine)[1];
    assert_eq!(read.schema_version, 0);
    assert_eq!(read.record.event.kind(), EventKind::ContextAppended);
    let upcast = ContextAppended { source: String::new(), ..appended };
    assert_eq!(read.record.event, Event::ContextAppended(upcast));
    engine.rebuild(ProjectionSet::all()).unwrap();
    let entry = &engine.context(s).unwrap()[0];
    assert_eq!((entry.key.as_str(), entry.source.as_str()), ("repo", ""));
    assert!(matches!(entry.state, ContextState::Applied { .. }));
}

// ----------------------------------------------------------------- invariant 10

/// Runs `over` (which must be rejected with exactly `limit`, `max + 1`, `max` and write
/// nothing), then `at` (which must succeed).
#[track_caller]
fn at_and_over(engine: &Engine, limit: Limit, max: u64, at: Command, over: Command) {
    let tip = tip_seq(engine);
    let digests = engine.projection_digests().unwrap();
    assert_eq!(rejected(engine.execute(over)), Rejection::LimitExceeded { limit, actual: max + 1, max });
    assert_eq!(tip_seq(engine), tip, "{limit}: the rejection consumed a seq");
    assert_eq!(engine.projection_digests().unwrap(), digests, "{limit}: the rejection changed a projection");
    engine.execute(at).unwrap_or_else(|e| panic!("{limit}: at the limit: {e}"));
    assert!(tip_seq(engine) > tip, "{limit}: the command at the limit wrote nothing");
}

fn limited(f: impl FnOnce(&mut Limits)) -> (Db, Engine) {
    let mut limits = Limits::default();
    f(&mut limits);
    let db = Db::new();
    let engine = db.open_limits(limits);
    (db, engine)
}

fn create_with_labels(n: usize, key_len: usize, value_len: usize) -> Command {
    let mut c = CreateSession::new();
    for i in 0..n {
        c = c.label(format!("{i:0>key_len$}"), "v".repeat(value_len));
    }
    Command::CreateSession(c)
}

fn create_with_messages(n: usize) -> Command {
    Command::CreateSession(CreateSession { messages: vec![Message::user("m"); n], ..CreateSession::new() })
}

fn text(n: usize) -> String {
    "x".repeat(n)
}

#[test]
fn inv10_content_bytes() {
    let (_db, engine) = limited(|l| l.content_bytes_max = 64);
    let (s, _) = create(&engine, &[]);
    let ctx = |key: &str, n| Command::AppendContext(AppendContext { content: vec![b'x'; n], ..context(s, key, "") });
    at_and_over(&engine, Limit::ContentBytes, 64, ctx("a", 64), ctx("b", 65));
    let call =
        |op: &str, n| Command::RecordToolCall(RecordToolCall { args: vec![b'x'; n], ..tool_call(s, op, "t", "") });
    at_and_over(&engine, Limit::ContentBytes, 64, call("a", 64), call("b", 65));
    let result = |n| Command::RecordToolResult(RecordToolResult { result: vec![b'x'; n], ..tool_result(s, "a", "") });
    at_and_over(&engine, Limit::ContentBytes, 64, result(64), result(65));
    let attachment = |n| {
        Command::CommitTurn(
            CommitTurn::new(s, format!("t{n}"), Expected::Any)
                .message(Message::user("m").with_attachment(vec![b'a'; n])),
        )
    };
    at_and_over(&engine, Limit::ContentBytes, 64, attachment(64), attachment(65));
    // The limit bounds what the host sends: a message body of exactly the limit is
    // accepted (its stored object is larger), one byte more is refused with the host's
    // own number.
    let message =
        |n| Command::CommitTurn(CommitTurn::new(s, format!("m{n}"), Expected::Any).message(Message::user(text(n))));
    at_and_over(&engine, Limit::ContentBytes, 64, message(64), message(65));
    let page = engine.transcript(s, PageRequest::first(10)).unwrap();
    assert_eq!(page.messages.last().unwrap().message.body.len(), 64);
}

#[test]
fn inv10_command_bytes() {
    let (_db, engine) = limited(|l| l.command_bytes_max = 200);
    let create = |n| Command::CreateSession(CreateSession::new().metadata(vec![0; n]));
    at_and_over(&engine, Limit::CommandBytes, 200, create(200), create(201));
    let (s, _) = common::create(&engine, &[]);
    let turn =
        |n: usize| Command::CommitTurn(CommitTurn::new(s, "t", Expected::Any).message(Message::user(text(n - 11))));
    at_and_over(&engine, Limit::CommandBytes, 200, turn(200), turn(201));
}

#[test]
fn inv10_messages_per_command() {
    let (_db, engine) = limited(|l| l.messages_per_command_max = 3);
    at_and_over(&engine, Limit::MessagesPerCommand, 3, create_with_messages(3), create_with_messages(4));
    let (s, _) = create(&engine, &[Message::user("m")]);
    let t = |n| {
        Command::CommitTurn(CommitTurn {
            messages: vec![Message::user("u"); n],
            ..CommitTurn::new(s, "t", Expected::Any)
        })
    };
    at_and_over(&engine, Limit::MessagesPerCommand, 3, t(3), t(4));
    let head_rev = head(&engine, s).revision;
    let r = |n| Command::Rewrite(rewrite(s, head_rev, 0, 4, vec![Message::system("s"); n], RewriteReason::Compaction));
    at_and_over(&engine, Limit::MessagesPerCommand, 3, r(3), r(4));
}

#[test]
fn inv10_labels_per_session() {
    let (_db, engine) = limited(|l| l.labels_per_session_max = 2);
    at_and_over(&engine, Limit::LabelsPerSession, 2, create_with_labels(2, 1, 1), create_with_labels(3, 1, 1));
    let s = engine.create_session(CreateSession::new().label("a", "1")).unwrap().session;
    let set = |key: &str| {
        Command::SetLabels(SetLabels {
            session: s,
            set: [(key.to_string(), "v".to_string())].into(),
            remove: Default::default(),
        })
    };
    let third = Command::SetLabels(SetLabels {
        session: s,
        set: [("c".to_string(), "v".to_string()), ("d".to_string(), "v".to_string())].into(),
        remove: Default::default(),
    });
    assert_eq!(
        rejected(engine.execute(third)),
        Rejection::LimitExceeded { limit: Limit::LabelsPerSession, actual: 3, max: 2 }
    );
    engine.execute(set("b")).unwrap();
    let tip = tip_seq(&engine);
    assert_eq!(
        rejected(engine.execute(set("c"))),
        Rejection::LimitExceeded { limit: Limit::LabelsPerSession, actual: 3, max: 2 }
    );
    assert_eq!(tip_seq(&engine), tip);
    assert_eq!(head(&engine, s).labels.len(), 2);
}

#[test]
fn inv10_label_key_and_value_bytes() {
    let (_db, engine) = limited(|l| {
        l.label_key_bytes_max = 8;
        l.label_value_bytes_max = 8;
    });
    at_and_over(&engine, Limit::LabelKeyBytes, 8, create_with_labels(1, 8, 1), create_with_labels(1, 9, 1));
    at_and_over(&engine, Limit::LabelValueBytes, 8, create_with_labels(1, 1, 8), create_with_labels(1, 1, 9));
    let (s, _) = create(&engine, &[]);
    let set = |k: usize, v: usize| {
        Command::SetLabels(SetLabels { session: s, set: [(text(k), text(v))].into(), remove: Default::default() })
    };
    at_and_over(&engine, Limit::LabelKeyBytes, 8, set(8, 1), set(9, 1));
    at_and_over(&engine, Limit::LabelValueBytes, 8, set(1, 8), set(1, 9));
}

#[test]
fn inv10_id_bytes() {
    let (_db, engine) = limited(|l| l.id_bytes_max = 10);
    // Content types are ids too: "text/plain" is 10 bytes.
    let (s, _) = create(&engine, &[]);
    let t = |n| Command::CommitTurn(CommitTurn::new(s, text(n), Expected::Any).message(Message::user("u")));
    at_and_over(&engine, Limit::IdBytes, 10, t(10), t(11));
    let ctx = |n| Command::AppendContext(context(s, &"k".repeat(n), "v"));
    at_and_over(&engine, Limit::IdBytes, 10, ctx(10), ctx(11));
    let call =
        |n| Command::RecordToolCall(RecordToolCall { call_id: "c".into(), ..tool_call(s, &"o".repeat(n), "t", "a") });
    at_and_over(&engine, Limit::IdBytes, 10, call(10), call(11));
    let run = |n| {
        Command::CommitTurn(
            CommitTurn::new(s, format!("r{n}"), Expected::Any).message(Message::user("u")).run_id(text(n)),
        )
    };
    at_and_over(&engine, Limit::IdBytes, 10, run(10), run(11));
    let typed = |n| {
        let m = Message::new(Role::User, "t".repeat(n), b"u".to_vec());
        Command::CommitTurn(CommitTurn::new(s, format!("c{n}"), Expected::Any).message(m))
    };
    at_and_over(&engine, Limit::IdBytes, 10, typed(10), typed(11));
}

#[test]
fn inv10_page_items_and_page_bytes() {
    let (_db, engine) = limited(|l| {
        l.page_items_max = 5;
        l.page_bytes_max = 1000;
        // A page budget must hold the largest message (`Limits::validate`).
        l.content_bytes_max = 200;
        l.attachments_per_message_max = 8;
    });
    let (s, rev) = create(&engine, &vec![Message::user("m"); 7]);
    let over = |r: Result<()>| {
        assert_eq!(rejected(r), Rejection::LimitExceeded { limit: Limit::PageItems, actual: 6, max: 5 })
    };
    assert_eq!(engine.transcript(s, PageRequest::first(5)).unwrap().messages.len(), 5);
    over(engine.transcript(s, PageRequest::first(6)).map(drop));
    assert_eq!(engine.transcript_at(s, rev, PageRequest::first(5)).unwrap().messages.len(), 5);
    over(engine.transcript_at(s, rev, PageRequest::first(6)).map(drop));
    engine.revisions(s, PageRequest::first(5)).unwrap();
    over(engine.revisions(s, PageRequest::first(6)).map(drop));
    engine.list_sessions(&ListQuery::new().page(0, 5)).unwrap();
    over(engine.list_sessions(&ListQuery::new().page(0, 6)).map(drop));
    engine.tool_ops(s, PageRequest::first(5)).unwrap();
    over(engine.tool_ops(s, PageRequest::first(6)).map(drop));
    engine.unsettled_all(PageRequest::first(5)).unwrap();
    over(engine.unsettled_all(PageRequest::first(6)).map(drop));
    engine.unsettled_page(s, PageRequest::first(5)).unwrap();
    over(engine.unsettled_page(s, PageRequest::first(6)).map(drop));
    let q = |max_events, max_bytes| EventQuery { from_seq: 1, max_events, max_bytes };
    engine.events(q(5, 1000)).unwrap();
    over(engine.events(q(6, 1000)).map(drop));
    over(engine.session_events(s, q(6, 1000)).map(drop));
    assert_eq!(
        rejected(engine.events(q(5, 1001))),
        Rejection::LimitExceeded { limit: Limit::PageBytes, actual: 1001, max: 1000 }
    );
    assert_eq!(
        rejected(engine.session_events(s, q(5, 1001))),
        Rejection::LimitExceeded { limit: Limit::PageBytes, actual: 1001, max: 1000 }
    );
}

/// A transcript page's byte budget: the configured `page_bytes_max`, or a request's own
/// below it. A page stops before the message that would take it over; a first message
/// over the budget by itself is `OversizedMessage` with its position and size, never a
/// page silently over budget.
#[test]
fn inv10_transcript_page_byte_budget() {
    let (_db, engine) = limited(|l| {
        l.page_bytes_max = 1000;
        l.content_bytes_max = 200;
        l.attachments_per_message_max = 8;
    });
    let bodies = [100usize, 150, 200, 50];
    let messages: Vec<Message> = bodies.iter().map(|n| Message::user(text(*n))).collect();
    let (s, rev) = create(&engine, &messages);
    let sizes = |p: &TranscriptPage| p.messages.iter().map(|m| m.message.body.len()).collect::<Vec<_>>();

    // The whole transcript fits the configured budget.
    assert_eq!(sizes(&engine.transcript(s, PageRequest::first(10)).unwrap()), bodies);
    // A request's own budget: 100 + 150 fit in 300, 200 more would not.
    let page = engine.transcript(s, PageRequest::first(10).with_max_bytes(300)).unwrap();
    assert_eq!(sizes(&page), [100, 150]);
    assert!(page.has_more);
    let page = engine.transcript_at(s, rev, PageRequest::first(10).with_max_bytes(450)).unwrap();
    assert_eq!(sizes(&page), [100, 150, 200]);
    // A first message over the budget by itself is a typed error naming it.
    assert_eq!(
        engine.transcript(s, PageRequest::new(2, 10).with_max_bytes(199)).unwrap_err(),
        Error::OversizedMessage { position: 2, size: 200, max_bytes: 199 }
    );
    assert_eq!(
        engine.transcript_at(s, rev, PageRequest::new(1, 10).with_max_bytes(149)).unwrap_err(),
        Error::OversizedMessage { position: 1, size: 150, max_bytes: 149 }
    );
    // A request may not raise the configured budget.
    assert_eq!(
        rejected(engine.transcript(s, PageRequest::first(10).with_max_bytes(1001)).map(drop)),
        Rejection::LimitExceeded { limit: Limit::PageBytes, actual: 1001, max: 1000 }
    );
}

#[test]
fn inv10_record_bytes() {
    // Measure the record of a session created with 100 bytes of metadata.
    let size = {
        let db = Db::new();
        let engine = db.open();
        engine.create_session(CreateSession::with_id(SessionId([1; 16])).metadata(vec![0; 100])).unwrap();
        all_events(&engine)[0].size
    };
    let (_db, engine) = limited(|l| l.record_bytes_max = size);
    let create = |id: u8, n| Command::CreateSession(CreateSession::with_id(SessionId([id; 16])).metadata(vec![0; n]));
    at_and_over(&engine, Limit::RecordBytes, size, create(1, 100), create(2, 101));
    assert_eq!(all_events(&engine)[0].size, size);
    assert!(!engine.is_poisoned());
    // A batch member over the limit rejects the batch, and the engine keeps writing.
    let batch = Command::Batch(vec![create(3, 10), create(4, 101)]);
    assert_eq!(
        rejected(engine.execute(batch)),
        Rejection::Batch {
            index: 1,
            rejection: Box::new(Rejection::LimitExceeded { limit: Limit::RecordBytes, actual: size + 1, max: size })
        }
    );
    engine.execute(create(5, 10)).unwrap();
}

#[test]
fn inv10_metadata_bytes() {
    let (_db, engine) = limited(|l| l.metadata_bytes_max = 16);
    let create = |n| Command::CreateSession(CreateSession::new().metadata(vec![7; n]));
    at_and_over(&engine, Limit::MetadataBytes, 16, create(16), create(17));
}

#[test]
fn inv10_batch_commands() {
    let (_db, engine) = limited(|l| l.batch_commands_max = 2);
    let batch = |n| Command::Batch((0..n).map(|_| Command::CreateSession(CreateSession::new())).collect());
    at_and_over(&engine, Limit::BatchCommands, 2, batch(2), batch(3));
}

#[test]
fn inv10_attachments_per_message() {
    let (_db, engine) = limited(|l| l.attachments_per_message_max = 2);
    let with = |n: usize| {
        let m = (0..n).fold(Message::user("m"), |m, i| m.with_attachment(vec![i as u8]));
        Command::CreateSession(CreateSession::new().message(m))
    };
    at_and_over(&engine, Limit::AttachmentsPerMessage, 2, with(2), with(3));
}

#[test]
fn inv10_list_items() {
    let (_db, engine) = limited(|l| l.list_items_max = 2);
    let (s, _) = create(&engine, &[]);
    for key in ["a", "b", "c", "d", "e"] {
        engine.append_context(context(s, key, "text")).unwrap();
    }
    for op in ["o1", "o2", "o3", "o4", "o5"] {
        engine.record_tool_call(tool_call(s, op, "t", op)).unwrap();
    }
    let base = |id: &str| CommitTurn::new(s, id, Expected::Any).message(Message::user("u"));
    let usage =
        |n| Command::CommitTurn((0..n).fold(base(&format!("u{n}")), |t, i| t.usage("p", &format!("m{i}"), 1, 1)));
    at_and_over(&engine, Limit::ListItems, 2, usage(2), usage(3));
    let keys = |keys: &[&str]| {
        Command::CommitTurn(keys.iter().fold(base(&format!("c{}", keys.len())), |t, k| t.apply_context(*k)))
    };
    at_and_over(&engine, Limit::ListItems, 2, keys(&["a", "b"]), keys(&["c", "d", "e"]));
    let ops =
        |ops: &[&str]| Command::CommitTurn(ops.iter().fold(base(&format!("o{}", ops.len())), |t, o| t.tool_op(*o)));
    at_and_over(&engine, Limit::ListItems, 2, ops(&["o1", "o2"]), ops(&["o3", "o4", "o5"]));
}

#[test]
fn inv10_note_bytes() {
    let (_db, engine) = limited(|l| l.note_bytes_max = 8);
    let (s, rev) = create(&engine, &[Message::user("m")]);
    let archive = |n| Command::Archive { session: s, reason: text(n) };
    at_and_over(&engine, Limit::NoteBytes, 8, archive(8), archive(9));
    let revive = |n| Command::Revive { session: s, reason: text(n) };
    at_and_over(&engine, Limit::NoteBytes, 8, revive(8), revive(9));
    let edit =
        |n| Command::Rewrite(Rewrite { note: text(n), ..rewrite(s, rev, 0, 1, vec![], RewriteReason::Redaction) });
    at_and_over(&engine, Limit::NoteBytes, 8, edit(8), edit(9));
    let back = |n| Command::Restore(Restore { actor: text(n), ..restore(s, RevisionId::empty(), rev) });
    at_and_over(&engine, Limit::NoteBytes, 8, back(8), back(9));
    let ctx = |n| Command::AppendContext(AppendContext { source: text(n), ..context(s, "k", "v") });
    at_and_over(&engine, Limit::NoteBytes, 8, ctx(8), ctx(9));
}
