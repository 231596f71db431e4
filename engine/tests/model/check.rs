//! The comparisons shared by the model test and the simulation: every query of an
//! [`Engine`] against the reference model, and the log against the model's events.

use super::ops::{in_universe, sid, unknown_revision, SESSIONS};
use super::reference::{revision_view, GraphView, Model};
use annal::*;
use proptest::test_runner::TestCaseError;
use std::collections::BTreeSet;
use std::fmt::{Debug, Display};

/// A check's result: a failure carries what disagreed.
pub type Checked<T = ()> = Result<T, TestCaseError>;

/// The value, or a failure naming `what`.
pub fn ok<T>(r: annal::Result<T>, what: &str) -> Checked<T> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {e:?}")))
}

/// A failure unless `got == want`.
pub fn same<T: PartialEq + Debug>(got: T, want: T, what: impl Display) -> Checked {
    if got != want {
        return Err(TestCaseError::fail(format!("{what}\nengine: {got:#?}\n model: {want:#?}")));
    }
    Ok(())
}

/// Events per page when reading the log.
pub const EVENT_PAGE_ITEMS: u64 = 100;
/// Bytes per page when reading the log.
pub const EVENT_PAGE_BYTES: u64 = 1 << 20;

/// Tells the model the commit time of every event after its tip.
pub fn learn_clock(engine: &Engine, model: &mut Model) -> Checked {
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

/// Every event of the log, page by page.
pub fn all_events(engine: &Engine) -> Checked<Vec<StoredEvent>> {
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
pub fn events_agree(engine: &Engine, model: &Model) -> Checked {
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
pub fn sessions(model: &Model) -> BTreeSet<SessionId> {
    (0..SESSIONS).map(sid).chain(model.sessions.keys().copied()).collect()
}

/// The listing queries compared.
pub fn list_queries() -> Vec<ListQuery> {
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

/// The page requests compared.
pub fn pages() -> [PageRequest; 6] {
    [
        PageRequest::first(100),
        PageRequest::new(1, 2),
        PageRequest::new(3, 1),
        PageRequest::new(100, 5),
        PageRequest::first(0),
        PageRequest::first(101),
    ]
}

/// Every query about session `s` agrees with the model.
pub fn session_agrees(engine: &Engine, model: &Model, s: SessionId, when: &str) -> Checked {
    // A purged session's head is `Purged { session, seq }`; any other absent one is `None`.
    let want = match model.purged.get(&s) {
        Some(seq) => Err(Error::Rejected(Rejection::Purged { session: s, seq: *seq })),
        None => Ok(model.head(&s)),
    };
    same(engine.head(s), want, format_args!("{when}: head of {s}"))?;
    if let Some(seq) = model.purged.get(&s) {
        let purged = Err(Error::Rejected(Rejection::Purged { session: s, seq: *seq }));
        same(engine.lease(s).map(|_| ()), purged.clone(), format_args!("{when}: lease of purged {s}"))?;
        same(engine.inbox(s).map(|_| ()), purged.clone(), format_args!("{when}: inbox of purged {s}"))?;
        same(engine.input(s, "any").map(|_| ()), purged, format_args!("{when}: input of purged {s}"))?;
    } else {
        same(ok(engine.lease(s), "lease")?, model.lease(&s), format_args!("{when}: lease of {s}"))?;
        same(engine.inbox(s), model.inbox(&s), format_args!("{when}: inbox of {s}"))?;
        for id in model.input_ids(&s) {
            let want = model.sessions.get(&s).and_then(|x| x.input(&id));
            same(ok(engine.input(s, &id), "input")?, want, format_args!("{when}: input {id} of {s}"))?;
        }
    }
    same(engine.drafts(s, u64::MAX), model.drafts_of(&s), format_args!("{when}: drafts of {s}"))?;
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
pub fn compare_all(engine: &Engine, model: &Model, never_stored: &BTreeSet<ContentId>, when: &str) -> Checked {
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

/// Runs `command` on the engine, through the typed method where one returns the whole
/// outcome. A fork to a fresh id goes through `fork_at` or `fork_replace`, which pick
/// the id themselves: the command is returned with the id the engine picked.
pub fn execute(engine: &Engine, command: Command) -> (Command, annal::Result<Outcome>) {
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

/// The proptest configuration of a model test: `cases_default` cases unless
/// `PROPTEST_CASES` says otherwise, and no failure files.
pub fn config(cases_default: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases_default);
    proptest::test_runner::Config { cases, failure_persistence: None, ..proptest::test_runner::Config::default() }
}
