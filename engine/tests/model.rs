//! The model test: random command sequences run against a real [`Engine`] and against
//! an independent in-memory model of SPEC §6 (`model/reference.rs`). They must agree on
//! every command's outcome or exact rejection, and, at checkpoints and at the end, on
//! every query: heads, listings, transcript pages at the head and at every revision the
//! model recorded, revision pages and graphs, context, usage, the tool ledger, the
//! event log's seq and stream density, and the content objects. Then the projections
//! are rebuilt from the log and must be byte-identical, and so must they be after a
//! close and a reopen.
//!
//! Each case opens the engine with a random checkpoint policy (eager, lazy, the default,
//! or a delta bound small enough that the writer waits for the checkpointer), so queries
//! read every mix of checkpoint and delta. Sequences also hold checkpoint points
//! ([`Engine::checkpoint`]: the delta empties, every query still agrees) and reopen
//! points: close, then keep the projections file, delete it (the open rebuilds it), or
//! put back a copy taken at an earlier close (the open folds the log past it, as after a
//! crash that left the delta since then unflushed), and open again with another random
//! policy. After a reopen the open must have folded exactly the events the projections
//! file lacked, every query agrees, and the projections equal a rebuild from the log.
//!
//! `PROPTEST_CASES` overrides the number of cases (64 by default).

#[path = "model/ops.rs"]
mod ops;
#[path = "model/reference.rs"]
mod reference;

use annal::*;
use ops::{
    in_universe, limits, policy, resolve, sequence, sid, unknown_revision, AtOpen, History, Op, Policy, SESSIONS,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use reference::{carried_content, revision_view, GraphView, Model};
use std::collections::BTreeSet;
use std::fmt::{Debug, Display};
use std::path::{Path, PathBuf};

type Checked<T = ()> = Result<T, TestCaseError>;

/// Default number of cases; `PROPTEST_CASES` overrides it.
const CASES_DEFAULT: u32 = 64;
/// Operations per case at most.
const OPS_MAX: usize = 40;
/// A full comparison runs after this many operations, besides the generated checks.
const CHECK_EVERY_OPS: usize = 16;

fn ok<T>(r: annal::Result<T>, what: &str) -> Checked<T> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {e:?}")))
}

fn same<T: PartialEq + Debug>(got: T, want: T, what: impl Display) -> Checked {
    if got != want {
        return Err(TestCaseError::fail(format!("{what}\nengine: {got:#?}\n model: {want:#?}")));
    }
    Ok(())
}

fn options(policy: Policy) -> Options {
    Options { limits: limits(), durability: Durability::Relaxed, checkpoint: policy.checkpoint(), ..Options::default() }
}

fn open(path: &Path, policy: Policy) -> Checked<Engine> {
    ok(Engine::open_with(path, options(policy)), "open")
}

fn io<T>(r: std::io::Result<T>, what: &str) -> Checked<T> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))
}

const EVENT_PAGE_ITEMS: u64 = 100;
const EVENT_PAGE_BYTES: u64 = 1 << 20;

/// Tells the model the commit time of every event after its tip.
fn learn_clock(engine: &Engine, model: &mut Model) -> Checked {
    let mut from = model.seq + 1;
    loop {
        let q = EventQuery { from_seq: from, max_events: EVENT_PAGE_ITEMS, max_bytes: EVENT_PAGE_BYTES };
        let page = ok(engine.events(q), "events")?;
        for e in &page.events {
            model.clock.insert(e.record.seq, e.record.committed_at_ms);
        }
        if !page.has_more {
            return Ok(());
        }
        from = page.next_seq;
    }
}

fn all_events(engine: &Engine) -> Checked<Vec<StoredEvent>> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let q = EventQuery { from_seq: from, max_events: EVENT_PAGE_ITEMS, max_bytes: EVENT_PAGE_BYTES };
        let page = ok(engine.events(q), "events")?;
        out.extend(page.events);
        if !page.has_more {
            return Ok(out);
        }
        from = page.next_seq;
    }
}

/// The global log holds exactly the model's events, densely; every session's stream
/// holds its own, densely; commit times never decrease.
fn events_agree(engine: &Engine, model: &Model) -> Checked {
    let events = all_events(engine)?;
    let got: Vec<_> = events.iter().map(|e| (e.record.session, e.record.stream_seq, e.record.event.kind())).collect();
    same(&got, &model.log, "log (session, stream seq, kind) by seq")?;
    let seqs: Vec<u64> = events.iter().map(|e| e.record.seq).collect();
    same(seqs, (1..=model.seq).collect(), "log seqs are dense from 1")?;
    let times: Vec<u64> = events.iter().map(|e| e.record.committed_at_ms).collect();
    same(times.windows(2).all(|w| w[0] <= w[1]), true, "commit times never decrease")?;
    same(times, (1..=model.seq).map(|s| model.ms(s)).collect(), "commit times")?;
    for s in sessions(model) {
        let mut got = Vec::new();
        let mut from = 1;
        loop {
            let q = EventQuery { from_seq: from, max_events: 7, max_bytes: EVENT_PAGE_BYTES };
            let page = ok(engine.session_events(s, q), "session events")?;
            got.extend(page.events.iter().map(|e| (e.record.stream_seq, e.record.seq)));
            if !page.has_more {
                break;
            }
            from = page.next_seq;
        }
        let want: Vec<(u64, u64)> =
            (0..model.log.len()).filter(|i| model.log[*i].0 == s).map(|i| (model.log[i].1, i as u64 + 1)).collect();
        same(got, want, format_args!("stream of {s}"))?;
    }
    Ok(())
}

/// The universe's slots and every session the model holds.
fn sessions(model: &Model) -> BTreeSet<SessionId> {
    (0..SESSIONS).map(sid).chain(model.sessions.keys().copied()).collect()
}

/// Runs `command` on the engine, through the typed method where one returns the whole
/// outcome. A fork to a fresh id goes through `fork_at` or `fork_replace`, which pick
/// the id themselves: the command is returned with the id the engine picked.
fn execute(engine: &Engine, command: Command) -> (Command, annal::Result<Outcome>) {
    let created = |r: SessionReceipt| Outcome::Created { session: r.session, receipt: r.receipt };
    match command {
        Command::Batch(members) => {
            let got = engine.batch(members.clone()).map(Outcome::Batch);
            (Command::Batch(members), got)
        }
        Command::Fork(mut f) if f.labels.is_none() && !in_universe(&f.session) => {
            let got = match f.replacement.clone() {
                None => engine.fork_at(f.parent, f.index),
                Some(m) => engine.fork_replace(f.parent, f.index, m),
            };
            if let Ok(r) = &got {
                f.session = r.session;
            }
            (Command::Fork(f), got.map(created))
        }
        Command::CreateSession(c) => (Command::CreateSession(c.clone()), engine.create_session(c).map(created)),
        Command::CommitTurn(c) => {
            let got = engine.commit_turn(c.clone()).map(|t| match t {
                TurnOutcome::Committed(r) => Outcome::Committed(r),
                TurnOutcome::AlreadyCommitted(r) => Outcome::AlreadyCommitted(r),
            });
            (Command::CommitTurn(c), got)
        }
        Command::Rewrite(c) => (Command::Rewrite(c.clone()), engine.rewrite(c).map(Outcome::Rewritten)),
        Command::Restore(c) => (Command::Restore(c.clone()), engine.restore(c).map(Outcome::Rewritten)),
        other => (other.clone(), engine.execute(other)),
    }
}

fn list_queries() -> Vec<ListQuery> {
    vec![
        ListQuery::new(),
        ListQuery::new().include_archived(),
        ListQuery::new().label("a", "1"),
        ListQuery::new().label("a", "1").label("b", "2"),
        ListQuery::new().label("b", ""),
        ListQuery::new().label("c", "1").include_archived(),
        ListQuery::new().page(1, 2),
        ListQuery::new().include_archived().page(0, 1),
        ListQuery::new().include_archived().page(7, 3),
        ListQuery::new().page(0, 0),
        ListQuery::new().page(0, 101),
        ListQuery::new().recently_updated(),
        ListQuery::new().recently_updated().include_archived().page(1, 2),
        ListQuery::new().recently_updated().label("a", "1"),
        ListQuery::new().recently_updated().label("b", "2").label("a", "1").include_archived(),
        ListQuery::new().label("b", "2").label("a", "1"),
        ListQuery::new().label("a", "1").label("a", "2"),
        ListQuery::new().recently_updated().label("c", "1").page(1, 1),
    ]
}

fn pages() -> [PageRequest; 6] {
    [
        PageRequest::first(100),
        PageRequest::new(1, 2),
        PageRequest::new(3, 1),
        PageRequest::new(100, 5),
        PageRequest::first(0),
        PageRequest::first(101),
    ]
}

fn session_agrees(engine: &Engine, model: &Model, s: SessionId, when: &str) -> Checked {
    same(ok(engine.head(s), "head")?, model.head(&s), format_args!("{when}: head of {s}"))?;
    for p in pages() {
        same(engine.transcript(s, p), model.transcript(&s, p), format_args!("{when}: transcript of {s} {p:?}"))?;
        let got = engine.revisions(s, p).map(revision_view);
        same(got, model.revisions(&s, p), format_args!("{when}: revisions of {s} {p:?}"))?;
        same(engine.tool_ops(s, p), model.tool_ops(&s, p), format_args!("{when}: tool ops of {s} {p:?}"))?;
    }
    let mut targets = model.all_revisions();
    targets.push(unknown_revision());
    targets.sort();
    targets.dedup();
    for r in targets {
        for p in [PageRequest::first(100), PageRequest::new(1, 1)] {
            let what = format_args!("{when}: transcript of {s} at {r:?} {p:?}");
            same(engine.transcript_at(s, r, p), model.transcript_at(&s, &r, p), what)?;
        }
    }
    same(engine.graph(s).map(GraphView::from), model.graph(&s), format_args!("{when}: graph of {s}"))?;
    same(engine.context(s), model.context(&s), format_args!("{when}: context of {s}"))?;
    same(engine.pending_context(s), model.pending_context(&s), format_args!("{when}: pending context of {s}"))?;
    same(engine.usage(s), model.usage(&s), format_args!("{when}: usage of {s}"))?;
    same(engine.unsettled(s), model.unsettled(&s), format_args!("{when}: unsettled of {s}"))?;
    for op in ["o0", "o1", "o2", "o9"] {
        same(engine.tool_op(s, op), model.tool_op(&s, op), format_args!("{when}: tool op {op} of {s}"))?;
    }
    let stream = model.head(&s).map_or(0, |h| h.stream_seq);
    let mut names = model.state_names(&s);
    names.insert("never".into());
    for name in names {
        let what = format_args!("{when}: host state {name:?} of {s}");
        same(engine.host_state(s, &name), model.host_state(&s, &name, None), what)?;
        for at in 0..=stream + 1 {
            let what = format_args!("{when}: host state {name:?} of {s} at {at}");
            same(engine.host_state_at(s, &name, at), model.host_state(&s, &name, Some(at)), what)?;
        }
    }
    Ok(())
}

/// Every query agrees with the model.
fn compare_all(engine: &Engine, model: &Model, never_stored: &BTreeSet<ContentId>, when: &str) -> Checked {
    for q in list_queries() {
        same(engine.list_sessions(&q), model.list(&q), format_args!("{when}: list {q:?}"))?;
    }
    for s in sessions(model) {
        session_agrees(engine, model, s, when)?;
    }
    for p in [PageRequest::first(100), PageRequest::new(1, 1), PageRequest::new(3, 2), PageRequest::first(101)] {
        same(engine.unsettled_all(p), model.unsettled_all(p), format_args!("{when}: unsettled_all {p:?}"))?;
    }
    events_agree(engine, model)?;
    for (id, bytes) in &model.content {
        same(ok(engine.content(*id), "content")?, Some(bytes.clone()), format_args!("{when}: content {id:?}"))?;
    }
    for id in never_stored.iter().filter(|id| !model.content.contains_key(*id)) {
        same(ok(engine.content(*id), "content")?, None, format_args!("{when}: rejected content {id:?} stored"))?;
    }
    Ok(())
}

/// Checks the projections against a rebuild from the log (which leaves them rebuilt).
fn equal_a_rebuild(engine: &Engine, when: &str) -> Checked {
    let digests = ok(engine.projection_digests(), "digests")?;
    ok(engine.rebuild(ProjectionSet::all()), "rebuild")?;
    same(ok(engine.projection_digests(), "digests")?, digests, format_args!("{when}: projections equal a rebuild"))
}

/// A case's database file, and the copies of its projections file taken at each close.
struct Files {
    path: PathBuf,
    saved: Vec<Saved>,
}

/// A copy of the projections file taken at a close, and the log tip it holds.
struct Saved {
    path: PathBuf,
    seq: u64,
}

/// Closes `engine`, does `at_open` to the projections file, opens the database again
/// with `policy`, and checks that the open folded exactly the events the file lacked,
/// every query, and the projections against a rebuild. Returns the new engine.
fn reopen(
    engine: Engine,
    files: &mut Files,
    policy: Policy,
    at_open: AtOpen,
    model: &Model,
    never_stored: &BTreeSet<ContentId>,
    when: &str,
) -> Checked<Engine> {
    ok(engine.close(), "close")?;
    let file = projections_path(&files.path);
    // Close checkpointed the whole delta: the file holds every event.
    let copy = files.path.with_extension(format!("projections.{}", files.saved.len()));
    io(std::fs::copy(&file, &copy), "copy the projections file")?;
    let folded = match at_open {
        AtOpen::Keep => 0,
        AtOpen::Delete => {
            io(std::fs::remove_file(&file), "delete the projections file")?;
            model.seq
        }
        AtOpen::Stale(_) if files.saved.is_empty() => 0,
        AtOpen::Stale(n) => {
            let old = &files.saved[n as usize % files.saved.len()];
            io(std::fs::copy(&old.path, &file), "put back an old projections file")?;
            model.seq - old.seq
        }
    };
    files.saved.push(Saved { path: copy, seq: model.seq });
    let engine = open(&files.path, policy)?;
    same(engine.stats().recovered_events, folded, format_args!("{when}: events folded at open"))?;
    same(ok(engine.tip(), "tip")?.0, model.seq, format_args!("{when}: log tip"))?;
    compare_all(&engine, model, never_stored, when)?;
    equal_a_rebuild(&engine, when)?;
    Ok(engine)
}

fn run(first: Policy, ops: &[Op]) -> Checked {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut files = Files { path: dir.path().join("model.redb"), saved: Vec::new() };
    let mut policy = first;
    let mut engine = open(&files.path, policy)?;
    let mut model = Model::new(limits());
    let mut history = History::default();
    let mut never_stored = BTreeSet::new();
    for (step, op) in ops.iter().enumerate() {
        if matches!(op, Op::Check) || (step + 1) % CHECK_EVERY_OPS == 0 {
            compare_all(&engine, &model, &never_stored, &format!("before step {step}"))?;
        }
        match op {
            Op::Check => continue,
            Op::Checkpoint => {
                ok(engine.checkpoint(), "checkpoint")?;
                same(engine.stats().delta_bytes, 0, format_args!("step {step}: delta bytes after a checkpoint"))?;
                compare_all(&engine, &model, &never_stored, &format!("after the checkpoint at step {step}"))?;
                continue;
            }
            Op::Reopen { policy: next, projections } => {
                let when = format!("after the reopen at step {step} ({projections:?}, {policy:?} -> {next:?})");
                engine = reopen(engine, &mut files, *next, *projections, &model, &never_stored, &when)?;
                policy = *next;
                continue;
            }
            _ => {}
        }
        let command = resolve(op, &model, &history);
        let (command, got) = execute(&engine, command);
        learn_clock(&engine, &mut model)?;
        let want = model.apply(&command).map_err(Error::Rejected);
        same(&got, &want, format_args!("step {step}: {command:#?}"))?;
        history.record(&command, want.as_ref().ok());
        same(ok(engine.tip(), "tip")?.0, model.seq, format_args!("step {step}: log tip"))?;
        if want.is_err() {
            never_stored.extend(carried_content(&command));
        }
    }
    compare_all(&engine, &model, &never_stored, "at the end")?;
    let digests = ok(engine.projection_digests(), "digests")?;
    ok(engine.rebuild(ProjectionSet::all()), "rebuild")?;
    same(ok(engine.projection_digests(), "digests")?, digests.clone(), "projections after a rebuild")?;
    compare_all(&engine, &model, &never_stored, "after a rebuild")?;
    ok(engine.close(), "close")?;
    let engine = open(&files.path, policy)?;
    same(ok(engine.projection_digests(), "digests")?, digests, "projections after a reopen")?;
    compare_all(&engine, &model, &never_stored, "after a reopen")?;
    ok(engine.close(), "close")
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(CASES_DEFAULT);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn engine_agrees_with_the_model(first in policy(), ops in sequence(OPS_MAX)) {
        run(first, &ops)?;
    }
}
