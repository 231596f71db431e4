//! Copying sessions between databases: `Reader::export_sessions` and `Engine::copy_in`.
//! A copied session answers every query as in its source (sequence numbers and times
//! aside), its projections equal a rebuild, a second copy is a no-op, a conflicting
//! session or a fork without its parent is a typed rejection that writes nothing, and
//! content the target holds is not stored again.

mod common;

use annal::codec::content::entries;
use annal::pieces::ContentReader;
use annal::*;
use common::*;
use redb::ReadableDatabase;
use std::collections::HashSet;
use std::fmt::Debug;

/// `value`'s debug text with every global sequence number and every time masked: the
/// numbers after a field named `seq`, `*_seq` (but `stream_seq`, which a copy keeps) or
/// `*_ms`. A copy keeps everything else.
fn masked<T: Debug>(value: &T) -> String {
    let text = format!("{value:?}");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(": ") {
        let (before, after) = rest.split_at(at);
        out.push_str(before);
        out.push_str(": ");
        let after = &after[2..];
        let name: String = {
            let mut rev: Vec<char> = before.chars().rev().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            rev.reverse();
            rev.into_iter().collect()
        };
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        let mask = name == "seq" || name.ends_with("_ms") || (name.ends_with("_seq") && name != "stream_seq");
        if digits > 0 && mask {
            out.push('#');
            rest = &after[digits..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A source database with the shared workload (every event kind; a session `s` with
/// two forks), plus a session of its own that is never copied.
fn source() -> (Db, Engine, Vec<SessionId>) {
    let db = Db::new();
    let engine = db.open();
    let (other, rev) = create(&engine, &[Message::system("not copied")]);
    commit_turns(&engine, other, "o", 2, rev);
    let sessions = workload(&engine);
    (db, engine, sessions)
}

/// A target database that already holds sessions, one of them with a message and an
/// attachment the workload also has (so they are shared content).
fn target() -> (Db, Engine) {
    let db = Db::new();
    let engine = db.open();
    let shared = [Message::system("be helpful"), Message::user("hello").with_attachment(b"png bytes".to_vec())];
    let (s, rev) = create(&engine, &shared);
    commit_turns(&engine, s, "t", 3, rev);
    let (t, rev) = create(&engine, &[Message::system("another")]);
    engine.append_context(context(t, "k", "v")).unwrap();
    commit_turns(&engine, t, "u", 1, rev);
    (db, engine)
}

/// Asserts that `session` answers every query in `b` as it does in `a`, sequence
/// numbers and times aside.
fn assert_same_session(a: &Reader, b: &Reader, session: SessionId) {
    let (ha, hb) = (a.head(session).unwrap().unwrap(), b.head(session).unwrap().unwrap());
    assert_eq!(masked(&ha), masked(&hb), "head");
    assert_eq!(transcript(a, session), transcript(b, session), "transcript");
    let page = PageRequest::first(1000);
    let revisions = a.revisions(session, page).unwrap();
    assert_eq!(masked(&revisions), masked(&b.revisions(session, page).unwrap()), "revisions");
    for node in &revisions.page.items {
        let at_a = a.transcript_at(session, node.revision, page).unwrap();
        assert_eq!(at_a, b.transcript_at(session, node.revision, page).unwrap(), "revision {}", node.revision);
    }
    // Fork edges name only the forks the target holds.
    let mut graph = a.graph(session).unwrap();
    graph.forks.retain(|f| b.head(f.child).unwrap().is_some());
    assert_eq!(masked(&graph), masked(&b.graph(session).unwrap()), "graph");
    assert_eq!(masked(&a.tool_ops(session, page).unwrap()), masked(&b.tool_ops(session, page).unwrap()), "tools");
    assert_eq!(masked(&a.unsettled(session).unwrap()), masked(&b.unsettled(session).unwrap()), "unsettled");
    assert_eq!(a.usage(session).unwrap(), b.usage(session).unwrap(), "usage");
    assert_eq!(masked(&a.context(session).unwrap()), masked(&b.context(session).unwrap()), "context");
    let stream = |r: &Reader| -> Vec<(u64, Event)> {
        session_events(r, session).into_iter().map(|e| (e.record.stream_seq, e.record.event)).collect()
    };
    assert_eq!(stream(a), stream(b), "the events, byte for byte");
}

/// The whole log verifies, its clock never goes back, and the projections equal a
/// rebuild.
fn assert_consistent(engine: &Engine) {
    let events = all_events(engine);
    assert_eq!(events.len() as u64, tip_seq(engine), "dense");
    assert!(events.windows(2).all(|w| w[0].record.committed_at_ms <= w[1].record.committed_at_ms), "clock");
    let live = engine.projection_digests().unwrap();
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), live, "projections equal a rebuild");
}

/// Every content object stored in the closed database at `db`, by id (an id stored
/// twice appears twice).
fn stored_content(db: &Db) -> Vec<ContentId> {
    let raw = redb::Database::open(&db.path).unwrap();
    let txn = raw.begin_read().unwrap();
    let table = ContentReader::open(&txn).unwrap();
    let mut ids = Vec::new();
    for row in table.iter().unwrap() {
        let (_, value) = row.unwrap();
        for object in entries(&value, u64::MAX) {
            ids.push(object.unwrap().id);
        }
    }
    ids
}

#[test]
fn a_copied_session_answers_every_query_as_in_its_source() {
    let (_a_db, a, sessions) = source();
    let (b_db, b) = target();
    let (s, fork, branch) = (sessions[0], sessions[1], sessions[2]);
    let before = b.tip().unwrap().0;
    let notices = b.subscribe();

    // The forks with their ancestry: the parent comes first.
    let export = a.export_sessions(&[fork, branch], true).unwrap();
    assert_eq!(export.sessions(), vec![s, fork, branch]);
    let ids: HashSet<ContentId> = export.content.iter().map(|c| codec::content_id(c)).collect();
    assert_eq!(ids.len(), export.content.len(), "each object once");
    let held: usize = ids.iter().filter(|id| b.content(**id).unwrap().is_some()).count();
    assert!(held >= 2, "the target holds a message and its attachment already");

    let outcome = b.copy_in(export.clone()).unwrap();
    assert_eq!(outcome.copied, vec![s, fork, branch]);
    assert!(outcome.already_present.is_empty());
    assert_eq!(outcome.records, export.records.len() as u64);
    assert_eq!(outcome.first_seq, Some(before + 1));
    assert_eq!(outcome.tip_seq, before + outcome.records);
    assert_eq!(b.tip().unwrap().0, outcome.tip_seq);
    assert_eq!(outcome.content_objects as usize, ids.len() - held, "shared content is not stored again");
    let notice = notices.try_recv().expect("one notice");
    assert_eq!((notice.first_seq, notice.last_seq), (before + 1, outcome.tip_seq));
    assert_eq!(notice.sessions, vec![s, fork, branch]);
    assert!(notices.try_recv().is_err(), "exactly one notice");

    for session in [s, fork, branch] {
        assert_same_session(&a, &b, session);
    }
    assert_consistent(&b);

    // The same export again: already present, nothing written, nobody notified.
    let digests = b.projection_digests().unwrap();
    let tip = b.tip().unwrap();
    let again = b.copy_in(export).unwrap();
    assert!(again.copied.is_empty());
    assert_eq!(again.already_present, vec![s, fork, branch]);
    assert_eq!((again.records, again.content_objects, again.first_seq), (0, 0, None));
    assert_eq!(again.tip_seq, tip.0);
    assert_eq!(b.tip().unwrap(), tip);
    assert_eq!(b.projection_digests().unwrap(), digests);
    assert!(notices.try_recv().is_err());

    // Reopened, the copy is all there; every object is stored once.
    let before_close = b.projection_digests().unwrap();
    b.close().unwrap();
    let ids = stored_content(&b_db);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len(), "no object stored twice");
    let b = b_db.open();
    assert_eq!(b.projection_digests().unwrap(), before_close);
    assert_same_session(&a, &b, s);
}

#[test]
fn a_copy_keeps_original_times_unless_they_would_go_back() {
    let (_a_db, a, sessions) = source();
    let export = a.export_session(sessions[0], false).unwrap();
    let originals: Vec<u64> = export.records.iter().map(|r| r.committed_at_ms).collect();

    // Into an empty database the original times stand.
    let empty = Db::new();
    let e = empty.open();
    e.copy_in(export.clone()).unwrap();
    let times: Vec<u64> = all_events(&e).iter().map(|e| e.record.committed_at_ms).collect();
    assert_eq!(times, originals);
    assert_eq!(
        all_events(&e).iter().map(|e| e.record.seq).collect::<Vec<_>>(),
        (1..=originals.len() as u64).collect::<Vec<_>>()
    );

    // Behind a later commit they are clamped to the target's clock.
    let (_b_db, b) = target();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let (late, rev) = create(&b, &[Message::system("late")]);
    commit_turns(&b, late, "l", 1, rev);
    let clock = all_events(&b).last().unwrap().record.committed_at_ms;
    assert!(clock > *originals.last().unwrap());
    b.copy_in(export).unwrap();
    let copied: Vec<u64> = session_events(&b, sessions[0]).iter().map(|e| e.record.committed_at_ms).collect();
    assert!(copied.iter().all(|t| *t == clock), "max(original, previous)");
    assert_consistent(&b);
}

#[test]
fn a_session_with_another_history_is_a_conflict_that_writes_nothing() {
    let (_a_db, a, sessions) = source();
    let s = sessions[0];
    let (_b_db, b) = target();
    let export = a.export_session(s, false).unwrap();
    b.copy_in(export.clone()).unwrap();
    let state = |e: &Engine| (e.tip().unwrap(), e.projection_digests().unwrap());
    let before = state(&b);

    // The source moved on: the export extends what the target holds.
    a.commit_turn(turn(s, "later", head(&a, s).revision)).unwrap();
    let longer = a.export_session(s, false).unwrap();
    assert_eq!(rejected(b.copy_in(longer)), Rejection::SessionConflict { session: s });
    assert_eq!(state(&b), before);

    // The target moved on: the export is a prefix of what it holds.
    b.commit_turn(turn(s, "here", head(&b, s).revision)).unwrap();
    let before = state(&b);
    assert_eq!(rejected(b.copy_in(export.clone())), Rejection::SessionConflict { session: s });
    assert_eq!(state(&b), before);

    // Same id, same length, another event.
    let mut edited = export.clone();
    let last = edited.records.last_mut().unwrap();
    last.event = Event::LabelsChanged(codec::LabelsChanged {
        set: [("x".to_string(), "y".to_string())].into_iter().collect(),
        remove: Default::default(),
    });
    let (_c_db, c) = target();
    c.copy_in(export.clone()).unwrap();
    let before = state(&c);
    assert_eq!(rejected(c.copy_in(edited)), Rejection::SessionConflict { session: s });
    assert_eq!(state(&c), before);

    // A conflict anywhere refuses the whole copy, new sessions included.
    let with_fork = a.export_sessions(&[sessions[1]], true).unwrap();
    assert_eq!(with_fork.sessions(), vec![s, sessions[1]]);
    let before = state(&b);
    let notices = b.subscribe();
    assert_eq!(rejected(b.copy_in(with_fork)), Rejection::SessionConflict { session: s });
    assert_eq!(state(&b), before);
    assert!(b.head(sessions[1]).unwrap().is_none());
    assert!(notices.try_recv().is_err(), "a rejection notifies nobody");
}

#[test]
fn a_fork_needs_its_parent_at_the_forked_revision() {
    let (_a_db, a, sessions) = source();
    let (s, fork) = (sessions[0], sessions[1]);

    // Without its ancestry, into a database without the parent: refused.
    let (_b_db, b) = target();
    let tip = b.tip().unwrap();
    let alone = a.export_session(fork, false).unwrap();
    assert_eq!(alone.sessions(), vec![fork]);
    assert_eq!(rejected(b.copy_in(alone.clone())), Rejection::ForkParentMissing { session: fork, parent: s });
    assert_eq!(b.tip().unwrap(), tip);

    // With the parent copied first (same history, still at the forked revision): fine.
    let parent = b.copy_in(a.export_session(s, false).unwrap()).unwrap();
    assert_eq!(parent.copied, vec![s]);
    let outcome = b.copy_in(alone).unwrap();
    assert_eq!(outcome.copied, vec![fork]);
    assert_same_session(&a, &b, fork);
    assert_consistent(&b);

    // The parent moves past the forked revision in the source. Copied alone, the parent
    // no longer has the fork's origin as its head, so the fork alone is refused...
    a.commit_turn(turn(s, "after-forks", head(&a, s).revision)).unwrap();
    let (_c_db, c) = target();
    c.copy_in(a.export_session(s, false).unwrap()).unwrap();
    let tip = c.tip().unwrap();
    let moved = rejected(c.copy_in(a.export_session(fork, false).unwrap()));
    assert_eq!(moved, Rejection::ForkParentMoved { session: fork, parent: s });
    assert_eq!(c.tip().unwrap(), tip);

    // ...but with its ancestry, into a database without them, the records keep the
    // source's order and the fork folds where it was taken.
    let (_d_db, d) = target();
    let outcome = d.copy_in(a.export_session(fork, true).unwrap()).unwrap();
    assert_eq!(outcome.copied, vec![s, fork]);
    assert_same_session(&a, &d, s);
    assert_same_session(&a, &d, fork);
    assert_consistent(&d);
}

#[test]
fn a_malformed_export_is_refused_at_its_record_and_writes_nothing() {
    let (_a_db, a, sessions) = source();
    let s = sessions[0];
    let export = a.export_session(s, false).unwrap();
    let (_b_db, b) = target();
    let tip = b.tip().unwrap();
    let invalid_at = |e: SessionExport| match rejected(b.copy_in(e)) {
        Rejection::InvalidImport { seq, reason } => (seq, reason),
        other => panic!("expected InvalidImport, got {other:?}"),
    };

    // A record missing from the middle of the session.
    let mut gap = export.clone();
    let gone = gap.records.remove(3);
    let (seq, reason) = invalid_at(gap);
    assert_eq!(seq, export.records[4].seq);
    assert!(reason.contains("whole sessions"), "{reason} (removed {})", gone.seq);

    // Records out of order.
    let mut swapped = export.clone();
    swapped.records.swap(1, 2);
    assert_eq!(invalid_at(swapped).0, export.records[2].seq);

    // Content neither offered nor held.
    let mut missing = export.clone();
    let refs: Vec<ContentId> = export.records.iter().flat_map(|r| r.event.content_refs()).collect();
    let id = *refs.iter().find(|id| b.content(**id).unwrap().is_none()).expect("content the target lacks");
    missing.content.retain(|c| codec::content_id(c) != id);
    let (_, reason) = invalid_at(missing);
    assert!(reason.contains("neither offered nor stored"), "{reason}");

    // An event whose revision does not recompute: the fold catches it.
    let mut forged = export.clone();
    let turn = forged.records.iter_mut().find_map(|r| match &mut r.event {
        Event::TurnCommitted(t) if !t.messages.is_empty() => Some((r.seq, t)),
        _ => None,
    });
    let (seq, t) = turn.unwrap();
    t.revision_after = RevisionId::empty();
    let (at, reason) = invalid_at(forged);
    assert_eq!(at, seq);
    assert!(reason.contains("does not recompute"), "{reason}");

    assert_eq!(b.tip().unwrap(), tip, "nothing was written");
    assert!(b.head(s).unwrap().is_none());

    // An unknown session cannot be exported.
    let unknown = new_session_id();
    assert_eq!(rejected(a.export_session(unknown, true)), Rejection::NotFound { session: unknown });
}
