//! The acceptance scenarios of SPEC §11, through the public API, each command checked
//! against its row of SPEC §6: the success and every typed rejection.

mod common;

use annal::codec::{content_id, EventKind};
use annal::tables::{self, meta_keys, META};
use annal::*;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn set_labels(session: SessionId, set: &[(&str, &str)], remove: &[&str]) -> SetLabels {
    SetLabels { session, set: labels(set), remove: remove.iter().map(|k| k.to_string()).collect() }
}

/// Asserts that a rejected command wrote nothing: same tip, same projections.
#[track_caller]
fn assert_unchanged(engine: &Engine, tip: u64, digests: &[TableDigest]) {
    assert_eq!(tip_seq(engine), tip, "a rejection consumed a seq");
    assert_eq!(engine.projection_digests().unwrap(), digests, "a rejection changed a projection");
}

// ---------------------------------------------------------------------------- S1

#[test]
fn s1_create_session_head_is_the_chain_of_its_initial_messages() {
    let db = Db::new();
    let engine = db.open();
    let initial = vec![
        Message::system("You are a coding agent."),
        Message::user("fix the build").with_attachment(b"log.txt".to_vec()),
        Message::new(Role::Assistant, "application/json", br#"{"plan":["read","edit"]}"#.to_vec()),
    ];
    let mut c = CreateSession::new().label("project", "annal").metadata(b"host=cli".to_vec());
    for m in &initial {
        c = c.message(m.clone());
    }
    let created = engine.create_session(c).unwrap();
    let expected = revision_of(&initial);
    assert_eq!(created.receipt.revision, expected);
    assert_eq!(created.receipt.seq, 1);
    let h = head(&engine, created.session);
    assert_eq!(h.revision, expected);
    assert_eq!(h.message_count, 3);
    assert_eq!(h.labels, labels(&[("project", "annal")]));
    assert_eq!(h.metadata, b"host=cli");
    assert!(!h.archived);
    let read = transcript(&engine, created.session);
    let ids: Vec<ContentId> = initial.iter().map(message_id).collect();
    assert_eq!(read.iter().map(|m| m.content_id).collect::<Vec<_>>(), ids);
    assert_eq!(read[2].message.content_type, "application/json");
    assert_eq!(read[1].message.attachments, vec![content_id(b"log.txt")]);
    assert_eq!(engine.content(content_id(b"log.txt")).unwrap().unwrap(), b"log.txt");
    assert_eq!(read[2].chain, expected);

    let empty = engine.create_session(CreateSession::new()).unwrap();
    assert_eq!(empty.receipt.revision, RevisionId::empty());
    assert_eq!(head(&engine, empty.session).message_count, 0);
}

#[test]
fn s1_create_session_rejections() {
    let db = Db::new();
    let engine = db.open();
    let id = SessionId([7; 16]);
    engine.create_session(CreateSession::with_id(id).message(Message::user("first"))).unwrap();
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());

    let again = engine.create_session(CreateSession::with_id(id).message(Message::user("other")));
    assert_eq!(rejected(again), Rejection::AlreadyExists { session: id });
    let blank_key = engine.create_session(CreateSession::new().label("", "x"));
    assert!(matches!(rejected(blank_key), Rejection::InvalidRequest { .. }));
    let blank_type = engine.create_session(CreateSession::new().message(Message::new(Role::User, "", b"x".to_vec())));
    assert!(matches!(rejected(blank_type), Rejection::InvalidRequest { .. }));
    let mut many = CreateSession::new();
    for i in 0..65 {
        many = many.label(format!("k{i}"), "v");
    }
    assert_eq!(
        rejected(engine.create_session(many)),
        Rejection::LimitExceeded { limit: Limit::LabelsPerSession, actual: 65, max: 64 }
    );
    assert_unchanged(&engine, tip, &digests);
    assert_eq!(transcript(&engine, id)[0].message.body, b"first");
}

// ---------------------------------------------------------------------------- S2

#[test]
fn s2_turn_against_the_head_advances_and_a_stale_one_conflicts() {
    let db = Db::new();
    let engine = db.open();
    let sys = Message::system("sys");
    let (s, rev0) = create(&engine, std::slice::from_ref(&sys));
    let q = Message::user("2 + 2?");
    let a = Message::assistant("4");
    let t = CommitTurn::new(s, "t1", Expected::Exact(rev0)).message(q.clone()).message(a.clone());
    let receipt = match engine.commit_turn(t).unwrap() {
        TurnOutcome::Committed(r) => r,
        other => panic!("expected a new commit, got {other:?}"),
    };
    assert_eq!(receipt.revision, revision_of(&[sys.clone(), q.clone(), a.clone()]));
    assert_eq!(receipt.revision, rev0.extend(&message_id(&q)).extend(&message_id(&a)));
    assert_eq!(receipt.seq, 2);
    let h = head(&engine, s);
    assert_eq!((h.revision, h.message_count), (receipt.revision, 3));
    let first_event = &all_events(&engine)[0];
    assert!(receipt.committed_at_ms >= first_event.record.committed_at_ms);

    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    let stale = CommitTurn::new(s, "t2", Expected::Exact(rev0)).message(Message::user("again"));
    assert_eq!(
        rejected(engine.commit_turn(stale)),
        Rejection::RevisionConflict { expected: rev0, actual: receipt.revision }
    );
    assert_unchanged(&engine, tip, &digests);

    // `Any` commits on whatever the head is.
    let any = CommitTurn::new(s, "t3", Expected::Any).message(Message::user("any"));
    let r3 = engine.commit_turn(any).unwrap().receipt();
    assert_eq!(r3.revision, receipt.revision.extend(&message_id(&Message::user("any"))));
    assert_eq!(head(&engine, s).message_count, 4);
}

#[test]
fn s2_turn_rejections_not_found_and_invalid() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    let ghost = SessionId([1; 16]);
    assert_eq!(rejected(engine.commit_turn(turn(ghost, "t", rev))), Rejection::NotFound { session: ghost });
    let empty = CommitTurn::new(s, "t", Expected::Exact(rev));
    assert!(matches!(rejected(engine.commit_turn(empty)), Rejection::InvalidRequest { .. }));
    assert!(matches!(rejected(engine.commit_turn(turn(s, "", rev))), Rejection::InvalidRequest { .. }));
    let long_id = "x".repeat(257);
    assert_eq!(
        rejected(engine.commit_turn(turn(s, &long_id, rev))),
        Rejection::LimitExceeded { limit: Limit::IdBytes, actual: 257, max: 256 }
    );
    assert_unchanged(&engine, tip, &digests);
}

// ---------------------------------------------------------------------------- S3

#[test]
fn s3_retry_after_the_head_moved_returns_the_original_receipt() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let t1 = turn(s, "t1", rev0).usage("anthropic", "claude", 10, 2);
    let original = engine.commit_turn(t1.clone()).unwrap().receipt();
    let moved = commit_turns(&engine, s, "later", 2, original.revision);
    assert_ne!(moved, original.revision);
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());

    assert_eq!(engine.commit_turn(t1.clone()).unwrap(), TurnOutcome::AlreadyCommitted(original));
    // The expected revision is not part of the turn's identity.
    let t1_any = CommitTurn { expected: Expected::Any, ..t1.clone() };
    assert_eq!(engine.commit_turn(t1_any).unwrap(), TurnOutcome::AlreadyCommitted(original));
    assert_unchanged(&engine, tip, &digests);
    assert_eq!(engine.usage(s).unwrap()[0].input, 10, "a retry must not count usage twice");

    let other_content = CommitTurn { messages: vec![Message::user("different")], ..t1.clone() };
    assert_eq!(rejected(engine.commit_turn(other_content)), Rejection::TurnConflict { turn_id: "t1".into() });
    let other_usage = t1.clone().usage("anthropic", "claude", 1, 1);
    assert_eq!(rejected(engine.commit_turn(other_usage)), Rejection::TurnConflict { turn_id: "t1".into() });
    assert_unchanged(&engine, tip, &digests);

    // The same turn id in another session is another turn.
    let (other, other_rev) = create(&engine, &[Message::system("sys")]);
    let there = CommitTurn { session: other, expected: Expected::Exact(other_rev), ..t1 };
    assert!(matches!(engine.commit_turn(there).unwrap(), TurnOutcome::Committed(_)));
}

// ---------------------------------------------------------------------------- S4

#[test]
fn s4_compaction_keeps_the_session_advances_the_head_and_the_old_revision_reads() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let before = commit_turns(&engine, s, "t", 10, rev0);
    let original = transcript(&engine, s);
    assert_eq!(original.len(), 21);

    let summary = Message::system("summary of the first seven turns");
    let c = Rewrite {
        note: "context window".into(),
        actor: "compactor".into(),
        ..rewrite(s, before, 0, 15, vec![summary.clone()], RewriteReason::Compaction)
    };
    let receipt = engine.rewrite(c).unwrap();
    let mut expected_ids = vec![message_id(&summary)];
    expected_ids.extend(original[15..].iter().map(|m| m.content_id));
    assert_eq!(receipt.revision, RevisionId::of(&expected_ids));
    let h = head(&engine, s);
    assert_eq!(h.session, s);
    assert_eq!((h.revision, h.message_count), (receipt.revision, 7));
    assert_eq!(transcript_ids(&engine, s), expected_ids);

    let revisions = engine.revisions(s, PageRequest::first(100)).unwrap();
    assert_eq!(revisions.head, receipt.revision);
    assert_eq!(revisions.total, 12);
    let child = revisions.page.items.last().unwrap();
    assert_eq!(child.revision, receipt.revision);
    assert_eq!(child.parents, vec![before]);
    assert_eq!(
        child.origin,
        NodeOrigin::Rewrite { kind: "compaction".into(), note: "context window".into(), actor: "compactor".into() }
    );
    let parent = &revisions.page.items[10];
    assert_eq!((parent.revision, parent.message_count), (before, 21));
    let edge = engine.graph(s).unwrap().edges.pop().unwrap();
    assert_eq!((edge.from, edge.to, edge.seq), (Some(before), receipt.revision, receipt.seq));

    // The compacted-away revision is still readable, page by page.
    let mut read = Vec::new();
    for offset in (0..21).step_by(4) {
        let page = engine.transcript_at(s, before, PageRequest::new(offset, 4)).unwrap();
        assert_eq!((page.revision, page.total, page.offset, page.limit), (before, 21, offset, 4));
        assert_eq!(page.has_more, offset + 4 < 21);
        read.extend(page.messages);
    }
    assert_eq!(read, original);
    let past_end = engine.transcript_at(s, before, PageRequest::new(50, 4)).unwrap();
    assert_eq!((past_end.offset, past_end.messages.len(), past_end.has_more), (21, 0, false));
}

#[test]
fn s4_rewrite_rejections() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let rev = commit_turns(&engine, s, "t", 2, rev0);
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    let edit = |start, end, replacement| rewrite(s, rev, start, end, replacement, RewriteReason::Edit);

    assert_eq!(
        rejected(engine.rewrite(edit(3, 2, vec![Message::user("x")]))),
        Rejection::InvalidRange { start: 3, end: 2, len: 5 }
    );
    assert_eq!(rejected(engine.rewrite(edit(4, 6, vec![]))), Rejection::InvalidRange { start: 4, end: 6, len: 5 });
    let same = transcript(&engine, s)[2].message.clone();
    let same = Message::new(same.role, same.content_type, same.body);
    assert_eq!(rejected(engine.rewrite(edit(2, 3, vec![same]))), Rejection::NoChange);
    assert_eq!(rejected(engine.rewrite(edit(5, 5, vec![]))), Rejection::NoChange);
    let stale = rewrite(s, rev0, 0, 1, vec![Message::user("x")], RewriteReason::Edit);
    assert_eq!(rejected(engine.rewrite(stale)), Rejection::RevisionConflict { expected: rev0, actual: rev });
    let ghost = SessionId([2; 16]);
    let unknown = rewrite(ghost, rev, 0, 1, vec![], RewriteReason::Redaction);
    assert_eq!(rejected(engine.rewrite(unknown)), Rejection::NotFound { session: ghost });
    assert_unchanged(&engine, tip, &digests);

    // Redaction of a range with no replacement deletes it.
    let r = engine.rewrite(rewrite(s, rev, 1, 3, vec![], RewriteReason::Redaction)).unwrap();
    assert_eq!(head(&engine, s).message_count, 3);
    let origin = engine.revisions(s, PageRequest::first(10)).unwrap().page.items.pop().unwrap().origin;
    assert!(matches!(origin, NodeOrigin::Rewrite { ref kind, .. } if kind == "redaction"));
    assert_eq!(r.revision, head(&engine, s).revision);
}

// ---------------------------------------------------------------------------- S5

#[test]
fn s5_restore_gives_the_exact_parent_id_and_every_rejection() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let parent = commit_turns(&engine, s, "t", 2, rev0);
    let parent_ids = transcript_ids(&engine, s);
    let child = engine
        .rewrite(rewrite(s, parent, 1, 2, vec![Message::user("edited question")], RewriteReason::Edit))
        .unwrap()
        .revision;
    let (other, other_rev) = create(&engine, &[Message::system("other")]);
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());

    assert_eq!(rejected(engine.restore(restore(s, child, child))), Rejection::NoChange);
    let unknown = RevisionId([9; 32]);
    assert_eq!(rejected(engine.restore(restore(s, child, unknown))), Rejection::UnknownRevision { revision: unknown });
    assert_eq!(
        rejected(engine.restore(restore(s, parent, rev0))),
        Rejection::RevisionConflict { expected: parent, actual: child }
    );
    // A revision held by another session only is unknown here.
    assert_eq!(
        rejected(engine.restore(restore(s, child, other_rev))),
        Rejection::UnknownRevision { revision: other_rev }
    );
    assert_eq!(head(&engine, other).revision, other_rev);
    let ghost = SessionId([3; 16]);
    assert_eq!(rejected(engine.restore(restore(ghost, child, parent))), Rejection::NotFound { session: ghost });
    assert_unchanged(&engine, tip, &digests);

    let restored = engine.restore(restore(s, child, parent)).unwrap();
    assert_eq!(restored.revision, parent);
    assert_eq!(head(&engine, s).revision, parent);
    assert_eq!(transcript_ids(&engine, s), parent_ids);
    let edge = engine.graph(s).unwrap().edges.pop().unwrap();
    assert_eq!((edge.from, edge.to), (Some(child), parent));
    assert!(matches!(edge.origin, NodeOrigin::Rewrite { ref kind, .. } if kind == "restore"));
    let page = engine.revisions(s, PageRequest::first(10)).unwrap();
    assert_eq!((page.head, page.total), (parent, 4), "a restore adds no new node");

    // Forward again, and all the way back to the first revision.
    assert_eq!(engine.restore(restore(s, parent, child)).unwrap().revision, child);
    assert_eq!(engine.restore(restore(s, child, rev0)).unwrap().revision, rev0);
    assert_eq!(transcript_ids(&engine, s), parent_ids[..1]);
}

// ---------------------------------------------------------------------------- S6

#[test]
fn s6_fork_at_keeps_a_prefix_and_leaves_the_parent_untouched() {
    let db = Db::new();
    let engine = db.open();
    let created = engine
        .create_session(
            CreateSession::new().label("team", "core").metadata(b"m".to_vec()).message(Message::system("s")),
        )
        .unwrap();
    let s = created.session;
    let rev = commit_turns(&engine, s, "t", 3, created.receipt.revision);
    let parent_head = head(&engine, s);
    let parent_ids = transcript_ids(&engine, s);
    let parent_events = session_events(&engine, s).len();

    let fork = engine.fork_at(s, 3).unwrap();
    assert_ne!(fork.session, s);
    let fh = head(&engine, fork.session);
    assert_eq!(fh.message_count, 3);
    assert_eq!(fh.revision, RevisionId::of(&parent_ids[..3]));
    assert_eq!(fork.receipt.revision, fh.revision);
    assert_eq!(transcript_ids(&engine, fork.session), parent_ids[..3]);
    assert_eq!(fh.labels, labels(&[("team", "core")]), "labels are kept when not overridden");
    assert_eq!(fh.forked_from, Some(ForkOrigin { session: s, revision: rev, message_count: 3 }));
    assert_eq!(head(&engine, s), parent_head, "the parent is untouched");
    assert_eq!(transcript_ids(&engine, s), parent_ids);
    assert_eq!(session_events(&engine, s).len(), parent_events);
    let forks = engine.graph(s).unwrap().forks;
    assert_eq!(forks.len(), 1);
    assert_eq!((forks[0].child, forks[0].revision, forks[0].message_count), (fork.session, rev, 3));
    assert_eq!(engine.graph(fork.session).unwrap().forked_from.unwrap().session, s);

    // The fork refers to the parent's content instead of copying it.
    let created_event = &session_events(&engine, fork.session)[0].record.event;
    match created_event {
        Event::SessionCreated(e) => assert!(e.messages.is_empty()),
        other => panic!("expected SessionCreated, got {other:?}"),
    }

    // A fork of the whole transcript, and of nothing.
    let whole = engine.fork_at(s, 7).unwrap();
    assert_eq!(whole.receipt.revision, rev);
    let none = engine.fork_at(s, 0).unwrap();
    assert_eq!(none.receipt.revision, RevisionId::empty());

    // Writing to the fork leaves the parent alone.
    engine.commit_turn(turn(fork.session, "f1", fh.revision)).unwrap();
    assert_eq!(head(&engine, s), parent_head);
}

#[test]
fn s6_fork_with_replacement_and_rejections() {
    let db = Db::new();
    let engine = db.open();
    let created =
        engine.create_session(CreateSession::new().label("team", "core").message(Message::system("s"))).unwrap();
    let s = created.session;
    commit_turns(&engine, s, "t", 2, created.receipt.revision);
    let parent_ids = transcript_ids(&engine, s);

    let replacement = Message::user("a better question");
    let branch = engine.fork_replace(s, 3, replacement.clone()).unwrap();
    let mut expected = parent_ids[..3].to_vec();
    expected.push(message_id(&replacement));
    assert_eq!(transcript_ids(&engine, branch.session), expected);
    assert_eq!(head(&engine, branch.session).message_count, 4);
    assert_eq!(branch.receipt.revision, RevisionId::of(&expected));

    let own = labels(&[("kind", "experiment")]);
    let fork = Fork { parent: s, session: SessionId([5; 16]), index: 1, replacement: None, labels: Some(own.clone()) };
    let labelled = engine.fork(fork.clone()).unwrap();
    assert_eq!(labelled.session, SessionId([5; 16]));
    assert_eq!(head(&engine, labelled.session).labels, own, "labels given to the fork replace the parent's");

    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    assert_eq!(rejected(engine.fork_at(s, 6)), Rejection::IndexOutOfBounds { index: 6, len: 5 });
    assert_eq!(
        rejected(engine.fork_replace(s, 5, Message::user("x"))),
        Rejection::IndexOutOfBounds { index: 5, len: 5 }
    );
    let ghost = SessionId([4; 16]);
    assert_eq!(rejected(engine.fork_at(ghost, 0)), Rejection::NotFound { session: ghost });
    assert_eq!(rejected(engine.fork(fork)), Rejection::AlreadyExists { session: SessionId([5; 16]) });
    assert_unchanged(&engine, tip, &digests);
}

/// A turn with no messages: a failed or cancelled model call still used tokens, and a
/// host may mark context applied or reference tool operations without adding a message.
/// It moves the stream and the ledgers, never the revision; with nothing to do it is
/// `InvalidRequest`; it is idempotent by turn id like any turn.
#[test]
fn s3_turns_without_messages_record_usage_apply_context_or_reference_tools() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let rev = commit_turns(&engine, s, "t", 1, rev0);
    let revisions_before = engine.revisions(s, PageRequest::first(100)).unwrap().total;
    let messages_before = head(&engine, s).message_count;

    // Usage only: the call failed after it used tokens.
    let failed = CommitTurn::new(s, "failed-call", Expected::Exact(rev)).usage("acme", "m1", 120, 0);
    let receipt = match engine.commit_turn(failed.clone()).unwrap() {
        TurnOutcome::Committed(r) => r,
        other => panic!("expected a commit, got {other:?}"),
    };
    assert_eq!(receipt.revision, rev, "usage alone does not move the revision");
    let h = head(&engine, s);
    assert_eq!((h.revision, h.message_count, h.last_seq), (rev, messages_before, receipt.seq));
    let usage = engine.usage(s).unwrap();
    assert_eq!((usage[0].input, usage[0].output, usage[0].turns), (120, 0, 1));
    // Idempotent by turn id; the same id with other content is a conflict.
    assert!(matches!(engine.commit_turn(failed).unwrap(), TurnOutcome::AlreadyCommitted(r) if r == receipt));
    let other = CommitTurn::new(s, "failed-call", Expected::Any).usage("acme", "m1", 121, 0);
    assert_eq!(rejected(engine.commit_turn(other)), Rejection::TurnConflict { turn_id: "failed-call".into() });

    // Context only, and tool references only.
    engine.append_context(context(s, "k", "injected")).unwrap();
    engine.commit_turn(CommitTurn::new(s, "apply", Expected::Exact(rev)).apply_context("k")).unwrap();
    assert!(engine.pending_context(s).unwrap().is_empty());
    engine.record_tool_call(tool_call(s, "op1", "bash", "ls")).unwrap();
    let mut refs = CommitTurn::new(s, "refs", Expected::Exact(rev));
    refs.tool_ops = vec!["op1".into()];
    engine.commit_turn(refs).unwrap();

    // The revision graph did not move, and the transcript is what it was.
    assert_eq!(head(&engine, s).revision, rev);
    assert_eq!(engine.revisions(s, PageRequest::first(100)).unwrap().total, revisions_before);
    assert_eq!(transcript(&engine, s).len() as u64, messages_before);

    // Nothing to do: refused, nothing written.
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    assert!(matches!(
        rejected(engine.commit_turn(CommitTurn::new(s, "empty", Expected::Any))),
        Rejection::InvalidRequest { .. }
    ));
    assert_unchanged(&engine, tip, &digests);
    // The fold agrees with a rebuild.
    let before = engine.projection_digests().unwrap();
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), before);
}

/// `Expected::Version` is a monotonic fence: every event of the session moves it, so a
/// stale expectation fails even after a restore brought the same revision back (where
/// `Exact(revision)` would pass: the ABA case), and after events that do not touch the
/// transcript.
#[test]
fn s3_the_version_fence_sees_every_event_and_never_goes_back() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys"), Message::user("a"), Message::user("b")]);
    let read = head(&engine, s);
    assert_eq!(read.stream_seq, 1);

    // Compact, then restore: the revision is back where the host read it.
    let summary = vec![Message::system("summary")];
    let compacted = engine.rewrite(rewrite(s, rev0, 1, 3, summary, RewriteReason::Compaction)).unwrap().revision;
    engine.restore(restore(s, compacted, rev0)).unwrap();
    assert_eq!(head(&engine, s).revision, read.revision);
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    // The version fence sees both events; the revision check cannot.
    let stale = CommitTurn::new(s, "t1", Expected::Version(read.stream_seq)).message(Message::user("c"));
    assert_eq!(rejected(engine.commit_turn(stale)), Rejection::VersionConflict { expected: 1, actual: 3 });
    assert_unchanged(&engine, tip, &digests);
    let ahead = CommitTurn::new(s, "t1", Expected::Version(4)).message(Message::user("c"));
    assert_eq!(rejected(engine.commit_turn(ahead)), Rejection::VersionConflict { expected: 4, actual: 3 });

    // Events that leave the transcript alone move it too.
    engine.append_context(context(s, "k", "v")).unwrap();
    engine.set_labels(set_labels(s, &[("a", "b")], &[])).unwrap();
    let h = head(&engine, s);
    assert_eq!((h.revision, h.stream_seq), (rev0, 5));
    let stale = CommitTurn::new(s, "t1", Expected::Version(3)).message(Message::user("c"));
    assert_eq!(rejected(engine.commit_turn(stale)), Rejection::VersionConflict { expected: 3, actual: 5 });
    let exact = CommitTurn::new(s, "t1", Expected::Exact(rev0)).message(Message::user("c"));
    let fresh = CommitTurn { expected: Expected::Version(5), ..exact.clone() };
    let committed = engine.commit_turn(fresh.clone()).unwrap();
    assert_eq!(head(&engine, s).stream_seq, 6);
    // An exact retry answers as a retry even though the fence has moved since.
    assert_eq!(engine.commit_turn(fresh).unwrap(), TurnOutcome::AlreadyCommitted(committed.receipt()));
}

/// Mutable metadata: replaced as an event (every version stays in the log), a no-op
/// when unchanged, fenced like any write, bounded, refused when archived.
#[test]
fn s3_metadata_is_replaced_by_events_and_every_version_stays_in_the_log() {
    let db = Db::new();
    let engine = db.open();
    let created = engine.create_session(CreateSession::new().metadata(b"v1".to_vec())).unwrap();
    let s = created.session;
    let set = |bytes: &[u8], expected| SetMetadata { session: s, metadata: bytes.to_vec(), expected };
    let seq = engine.set_metadata(set(b"v2", Expected::Version(1))).unwrap().expect("an event");
    assert_eq!(head(&engine, s).metadata, b"v2");
    assert_eq!(head(&engine, s).revision, created.receipt.revision, "metadata does not move the revision");
    // Unchanged: nothing written, whatever the fence says.
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    assert_eq!(engine.set_metadata(set(b"v2", Expected::Version(99))).unwrap(), None);
    assert_unchanged(&engine, tip, &digests);
    // Fenced, bounded.
    assert_eq!(
        rejected(engine.set_metadata(set(b"v3", Expected::Version(1)))),
        Rejection::VersionConflict { expected: 1, actual: 2 }
    );
    let big = vec![b'm'; 64 * 1024 + 1];
    assert!(matches!(
        rejected(engine.set_metadata(set(&big, Expected::Any))),
        Rejection::LimitExceeded { limit: Limit::MetadataBytes, .. }
    ));
    assert_unchanged(&engine, tip, &digests);
    // Every version is in the log.
    let versions: Vec<Vec<u8>> = session_events(&engine, s)
        .into_iter()
        .filter_map(|e| match e.record.event {
            Event::SessionCreated(c) => Some(c.metadata),
            Event::MetadataSet(m) => Some(m.metadata),
            _ => None,
        })
        .collect();
    assert_eq!(versions, vec![b"v1".to_vec(), b"v2".to_vec()]);
    assert_eq!(session_events(&engine, s).last().unwrap().record.seq, seq);
    // Archived: refused, except the exact retry.
    engine.archive(s, "done").unwrap();
    assert_eq!(engine.set_metadata(set(b"v2", Expected::Any)).unwrap(), None);
    assert_eq!(rejected(engine.set_metadata(set(b"v4", Expected::Any))), Rejection::Archived { session: s });
}

/// Host state: named blobs beside the transcript, set and removed by a turn (atomically
/// with it) or by the dedicated command, shown on the head, readable by name at the head
/// and as of any earlier stream seq, bounded by their own limits.
#[test]
fn s3_host_state_entries_are_versioned_by_stream_seq() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    // Stream seq 2: a turn sets two entries with its messages.
    let t1 = CommitTurn::new(s, "t1", Expected::Exact(rev0))
        .message(Message::user("hi"))
        .set_state("model", b"{\"name\":\"m1\"}".to_vec())
        .set_state("tool.fs", b"cwd=/src".to_vec());
    let rev1 = engine.commit_turn(t1.clone()).unwrap().receipt().revision;
    // Stream seq 3: the command replaces one and removes the other.
    let change =
        SetHostState::new(s, Expected::Version(2)).set("model", b"{\"name\":\"m2\"}".to_vec()).remove("tool.fs");
    assert!(engine.set_host_state(change.clone()).unwrap().is_some());
    // Stream seq 4: a turn with no messages changes state only.
    let t2 = CommitTurn::new(s, "t2", Expected::Exact(rev1)).set_state("plugin", b"on".to_vec());
    assert_eq!(engine.commit_turn(t2).unwrap().receipt().revision, rev1);

    let h = head(&engine, s);
    assert_eq!(h.stream_seq, 4);
    assert_eq!(h.host_state.keys().cloned().collect::<Vec<_>>(), ["model", "plugin"]);
    assert_eq!(engine.host_state(s, "model").unwrap().unwrap(), b"{\"name\":\"m2\"}");
    assert_eq!(engine.host_state(s, "tool.fs").unwrap(), None);
    let at = |name: &str, n: u64| engine.host_state_at(s, name, n).unwrap();
    assert_eq!(at("model", 1), None);
    assert_eq!(at("model", 2).unwrap(), b"{\"name\":\"m1\"}");
    assert_eq!(at("tool.fs", 2).unwrap(), b"cwd=/src");
    assert_eq!(at("tool.fs", 3), None);
    assert_eq!(at("model", 3).unwrap(), b"{\"name\":\"m2\"}");
    assert_eq!(at("plugin", 3), None);
    assert_eq!(at("plugin", 4).unwrap(), b"on");
    assert_eq!(at("plugin", 400).unwrap(), b"on");

    // Retries: the same turn (state included) and the same change answer as retries.
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    assert!(matches!(engine.commit_turn(t1.clone()).unwrap(), TurnOutcome::AlreadyCommitted(_)));
    assert_eq!(engine.set_host_state(change).unwrap(), None);
    assert_unchanged(&engine, tip, &digests);
    // The same turn id with other state is a conflict.
    let other = CommitTurn { state: StateChanges::default(), ..t1 };
    assert_eq!(rejected(engine.commit_turn(other)), Rejection::TurnConflict { turn_id: "t1".into() });

    // Typed errors, nothing written.
    let names_over = SetHostState::new(s, Expected::Any).set("n".repeat(129), b"x".to_vec());
    assert!(matches!(
        rejected(engine.set_host_state(names_over)),
        Rejection::LimitExceeded { limit: Limit::HostStateNameBytes, .. }
    ));
    let empty_name = SetHostState::new(s, Expected::Any).set("", b"x".to_vec());
    assert!(matches!(rejected(engine.set_host_state(empty_name)), Rejection::InvalidRequest { .. }));
    let both = SetHostState::new(s, Expected::Any).set("a", b"x".to_vec()).remove("a");
    assert!(matches!(rejected(engine.set_host_state(both)), Rejection::InvalidRequest { .. }));
    let mut many = SetHostState::new(s, Expected::Any);
    for i in 0..63 {
        many = many.set(format!("k{i}"), vec![b'v'; 3]);
    }
    assert_eq!(
        rejected(engine.set_host_state(many)),
        Rejection::LimitExceeded { limit: Limit::HostStateEntries, actual: 65, max: 64 }
    );
    let stale = SetHostState::new(s, Expected::Version(3)).set("a", b"x".to_vec());
    assert_eq!(rejected(engine.set_host_state(stale)), Rejection::VersionConflict { expected: 3, actual: 4 });
    assert_unchanged(&engine, tip, &digests);
    assert_eq!(
        rejected(engine.host_state(SessionId([7; 16]), "model").map(drop)),
        Rejection::NotFound { session: SessionId([7; 16]) }
    );

    // Archived: refused; the fold agrees with a rebuild, and a reopen reads the same.
    engine.archive(s, "done").unwrap();
    let refused = SetHostState::new(s, Expected::Any).set("a", b"x".to_vec());
    assert_eq!(rejected(engine.set_host_state(refused)), Rejection::Archived { session: s });
    let before = engine.projection_digests().unwrap();
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), before);
    engine.close().unwrap();
    let engine = db.open();
    assert_eq!(engine.host_state_at(s, "tool.fs", 2).unwrap().unwrap(), b"cwd=/src");
    assert_eq!(head(&engine, s).host_state.len(), 2);
}

// ---------------------------------------------------------------------------- S7

/// A lost acknowledgement followed by an archive must not look like a failure: an exact
/// retry answers as a retry whatever the session's state, and anything else is
/// `Archived`.
#[test]
fn s7_exact_retries_after_archive_answer_as_retries() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let t1 = turn(s, "t1", rev0);
    engine.commit_turn(t1.clone()).unwrap();
    engine.append_context(context(s, "k", "v")).unwrap();
    engine.record_tool_call(tool_call(s, "op1", "bash", "ls")).unwrap();
    engine.record_tool_result(tool_result(s, "op1", "ok")).unwrap();
    engine.record_tool_call(tool_call(s, "op2", "bash", "pwd")).unwrap();
    engine.set_labels(set_labels(s, &[("a", "b")], &[])).unwrap();
    assert!(engine.archive(s, "finished").unwrap());
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());

    assert!(matches!(engine.commit_turn(t1).unwrap(), TurnOutcome::AlreadyCommitted(_)));
    assert_eq!(engine.append_context(context(s, "k", "v")).unwrap(), ContextOutcome::Duplicate);
    assert_eq!(
        engine.record_tool_call(tool_call(s, "op1", "bash", "ls")).unwrap(),
        ToolReceipt { created: false, seq: None }
    );
    assert_eq!(
        engine.record_tool_result(tool_result(s, "op1", "ok")).unwrap(),
        ToolReceipt { created: false, seq: None }
    );
    assert_eq!(engine.set_labels(set_labels(s, &[("a", "b")], &[])).unwrap(), None);
    assert_unchanged(&engine, tip, &digests);

    // Not retries: the session's state answers.
    let archived = Rejection::Archived { session: s };
    assert_eq!(rejected(engine.append_context(context(s, "k", "other"))), archived);
    assert_eq!(rejected(engine.record_tool_call(tool_call(s, "op1", "bash", "rm"))), archived);
    assert_eq!(rejected(engine.record_tool_result(tool_result(s, "op1", "other"))), archived);
    assert_eq!(rejected(engine.record_tool_result(tool_result(s, "op2", "ok"))), archived);
    assert_eq!(rejected(engine.record_tool_result(tool_result(s, "op9", "ok"))), archived);
    assert_eq!(rejected(engine.set_labels(set_labels(s, &[("a", "c")], &[]))), archived);
    assert_unchanged(&engine, tip, &digests);

    // Revived, the conflicts are conflicts again.
    engine.revive(s, "back").unwrap();
    let conflict = Rejection::ContextConflict { key: "k".into() };
    assert_eq!(rejected(engine.append_context(context(s, "k", "other"))), conflict);
    let op1 = "op1".to_string();
    assert_eq!(
        rejected(engine.record_tool_result(tool_result(s, "op1", "other"))),
        Rejection::ToolConflict { op_id: op1, field: "result" }
    );
}

#[test]
fn s7_archive_refuses_every_mutation_and_revive_reenables_writes() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let rev = commit_turns(&engine, s, "t", 1, rev0);
    engine.record_tool_call(tool_call(s, "op1", "bash", "ls")).unwrap();
    let (other, _) = create(&engine, &[]);

    assert!(engine.archive(s, "finished").unwrap());
    assert!(head(&engine, s).archived);
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    let archived = Rejection::Archived { session: s };
    assert_eq!(rejected(engine.commit_turn(turn(s, "t9", rev))), archived);
    assert_eq!(rejected(engine.rewrite(rewrite(s, rev, 0, 1, vec![], RewriteReason::Redaction))), archived);
    assert_eq!(rejected(engine.restore(restore(s, rev, rev0))), archived);
    assert_eq!(rejected(engine.append_context(context(s, "k", "v"))), archived);
    assert_eq!(rejected(engine.record_tool_call(tool_call(s, "op2", "bash", "pwd"))), archived);
    assert_eq!(rejected(engine.record_tool_result(tool_result(s, "op1", "ok"))), archived);
    assert_eq!(rejected(engine.set_labels(set_labels(s, &[("a", "b")], &[]))), archived);
    assert_unchanged(&engine, tip, &digests);

    // Archiving again is fine and writes nothing; unknown sessions are NotFound.
    assert!(!engine.archive(s, "again").unwrap());
    assert_unchanged(&engine, tip, &digests);
    let ghost = SessionId([6; 16]);
    assert_eq!(rejected(engine.archive(ghost, "x")), Rejection::NotFound { session: ghost });
    assert_eq!(rejected(engine.revive(ghost, "x")), Rejection::NotFound { session: ghost });
    assert_eq!(rejected(engine.revive(other, "x")), Rejection::NotArchived { session: other });
    assert_unchanged(&engine, tip, &digests);

    // Hidden from the default listing, listed on request, history readable.
    let listed: Vec<SessionId> =
        engine.list_sessions(&ListQuery::new()).unwrap().items.iter().map(|h| h.session).collect();
    assert_eq!(listed, vec![other]);
    let all: Vec<SessionId> =
        engine.list_sessions(&ListQuery::new().include_archived()).unwrap().items.iter().map(|h| h.session).collect();
    assert_eq!(all, vec![s, other]);
    assert_eq!(transcript(&engine, s).len(), 3);
    assert_eq!(engine.transcript_at(s, rev0, PageRequest::first(10)).unwrap().total, 1);
    assert_eq!(engine.revisions(s, PageRequest::first(10)).unwrap().total, 2);
    assert_eq!(session_events(&engine, s).len(), 4);
    assert_eq!(engine.tool_op(s, "op1").unwrap().unwrap().state, ToolState::Prepared);

    let seq = engine.revive(s, "more work").unwrap();
    assert_eq!(seq, tip + 1);
    assert!(!head(&engine, s).archived);
    engine.commit_turn(turn(s, "t9", rev)).unwrap();
    engine.record_tool_result(tool_result(s, "op1", "ok")).unwrap();
    assert_eq!(engine.list_sessions(&ListQuery::new()).unwrap().items.len(), 2);
}

// ---------------------------------------------------------------------------- S8

#[test]
fn s8_context_appends_follow_the_contract() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let staged = match engine.append_context(context(s, "repo", "the repo is a Rust workspace")).unwrap() {
        ContextOutcome::Staged(seq) => seq,
        other => panic!("expected Staged, got {other:?}"),
    };
    assert_eq!(staged, 2);
    let pending = engine.pending_context(s).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].key.as_str(), pending[0].source.as_str(), pending[0].appended_seq),
        ("repo", "memory", staged)
    );
    assert_eq!(pending[0].content, content_id(b"the repo is a Rust workspace"));

    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    let again = AppendContext { source: "another source".into(), ..context(s, "repo", "the repo is a Rust workspace") };
    assert_eq!(engine.append_context(again).unwrap(), ContextOutcome::Duplicate);
    assert_eq!(
        rejected(engine.append_context(context(s, "repo", "something else"))),
        Rejection::ContextConflict { key: "repo".into() }
    );
    assert!(matches!(rejected(engine.append_context(context(s, "blank", " \n\t "))), Rejection::InvalidRequest { .. }));
    assert!(matches!(rejected(engine.append_context(context(s, "empty", ""))), Rejection::InvalidRequest { .. }));
    assert!(matches!(rejected(engine.append_context(context(s, "", "text"))), Rejection::InvalidRequest { .. }));
    let ghost = SessionId([8; 16]);
    assert_eq!(rejected(engine.append_context(context(ghost, "k", "v"))), Rejection::NotFound { session: ghost });
    assert_eq!(engine.head(ghost).unwrap(), None, "NotFound creates no row of any kind");
    assert_unchanged(&engine, tip, &digests);

    // A turn applies it: pending → applied.
    engine.append_context(context(s, "date", "today is Monday")).unwrap();
    let t = turn(s, "t1", rev0).apply_context("repo");
    let receipt = engine.commit_turn(t).unwrap().receipt();
    let entries = engine.context(s).unwrap();
    let repo = entries.iter().find(|e| e.key == "repo").unwrap();
    assert_eq!(repo.state, ContextState::Applied { seq: receipt.seq, turn_id: "t1".into() });
    let pending: Vec<String> = engine.pending_context(s).unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(pending, vec!["date".to_string()]);
    let turn_event = all_events(&engine).pop().unwrap().record.event;
    assert!(matches!(turn_event, Event::TurnCommitted(ref e) if e.applied_context == vec!["repo".to_string()]));

    // Applying it again, or an unknown key, is ContextNotPending.
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    let twice = turn(s, "t2", receipt.revision).apply_context("repo");
    assert_eq!(rejected(engine.commit_turn(twice)), Rejection::ContextNotPending { key: "repo".into() });
    let unknown = turn(s, "t2", receipt.revision).apply_context("date").apply_context("nope");
    assert_eq!(rejected(engine.commit_turn(unknown)), Rejection::ContextNotPending { key: "nope".into() });
    assert_unchanged(&engine, tip, &digests);
    assert_eq!(engine.pending_context(s).unwrap().len(), 1, "a rejected turn applies nothing");

    // Archived sessions take no context.
    engine.archive(s, "done").unwrap();
    assert_eq!(rejected(engine.append_context(context(s, "late", "x"))), Rejection::Archived { session: s });

    // Replay agrees.
    let before = engine.context(s).unwrap();
    let digests = engine.projection_digests().unwrap();
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.context(s).unwrap(), before);
    assert_eq!(engine.projection_digests().unwrap(), digests);
}

// ---------------------------------------------------------------------------- S9

#[test]
fn s9_tool_ledger_prepare_settle_and_retries() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);

    let call = RecordToolCall { turn_id: Some("t1".into()), ..tool_call(s, "op1", "bash", "cargo test") };
    let t1 = engine.record_tool_call(call.clone()).unwrap();
    assert!(t1.created);
    assert_eq!(t1.seq, Some(2));
    let unsettled = engine.unsettled(s).unwrap();
    assert_eq!(unsettled.len(), 1);
    let op = &unsettled[0];
    assert_eq!((op.op_id.as_str(), op.tool_name.as_str(), op.call_seq), ("op1", "bash", 2));
    assert_eq!(op.args, content_id(b"cargo test"));
    assert_eq!(op.turn_id.as_deref(), Some("t1"));
    assert_eq!(op.state, ToolState::Prepared);
    assert_eq!(engine.content(op.args).unwrap().unwrap(), b"cargo test");
    assert_eq!(engine.unsettled_all(PageRequest::first(10)).unwrap().items.len(), 1);

    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    assert_eq!(engine.record_tool_call(call.clone()).unwrap(), ToolReceipt { created: false, seq: None });
    assert_unchanged(&engine, tip, &digests);

    let t2 = engine.record_tool_result(tool_result(s, "op1", "42 passed")).unwrap();
    assert_eq!(t2, ToolReceipt { created: true, seq: Some(tip + 1) });
    assert!(engine.unsettled(s).unwrap().is_empty());
    assert!(engine.unsettled_all(PageRequest::first(10)).unwrap().items.is_empty());
    match engine.tool_op(s, "op1").unwrap().unwrap().state {
        ToolState::Settled { outcome, result, seq, .. } => {
            assert_eq!((outcome, result, seq), (ToolOutcome::Ok, content_id(b"42 passed"), tip + 1));
        }
        other => panic!("expected a settled op, got {other:?}"),
    }

    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    assert!(!engine.record_tool_result(tool_result(s, "op1", "42 passed")).unwrap().created);
    assert!(!engine.record_tool_call(call).unwrap().created, "a call retry after the result");
    assert_unchanged(&engine, tip, &digests);

    // A turn may reference the operation.
    let r = engine.commit_turn(turn(s, "t1", rev0).tool_op("op1")).unwrap().receipt();
    assert!(matches!(all_events(&engine).pop().unwrap().record.event,
        Event::TurnCommitted(ref e) if e.tool_ops == vec!["op1".to_string()]));
    assert_eq!(r.seq, tip + 1);
}

#[test]
fn s9_tool_ledger_drift_orphans_nesting_and_archive() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let call = tool_call(s, "op1", "bash", "ls");
    engine.record_tool_call(call.clone()).unwrap();
    engine.record_tool_result(tool_result(s, "op1", "a.txt")).unwrap();
    engine.record_tool_call(tool_call(s, "op2", "bash", "pwd")).unwrap();
    let (other, _) = create(&engine, &[]);
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());

    let conflict = |field: &'static str| Rejection::ToolConflict { op_id: "op1".into(), field };
    let other_tool = RecordToolCall { tool_name: "zsh".into(), ..call.clone() };
    assert_eq!(rejected(engine.record_tool_call(other_tool)), conflict("tool_name"));
    let other_args = RecordToolCall { args: b"ls -la".to_vec(), ..call.clone() };
    assert_eq!(rejected(engine.record_tool_call(other_args)), conflict("args"));
    let other_parent = RecordToolCall { parent_op: Some("op2".into()), ..call.clone() };
    assert_eq!(rejected(engine.record_tool_call(other_parent)), conflict("parent_op"));
    assert_eq!(rejected(engine.record_tool_result(tool_result(s, "op1", "b.txt"))), conflict("result"));
    let cancelled = RecordToolResult { outcome: ToolOutcome::Cancelled, ..tool_result(s, "op1", "a.txt") };
    assert_eq!(rejected(engine.record_tool_result(cancelled)), conflict("outcome"));
    assert_eq!(
        rejected(engine.record_tool_result(tool_result(s, "ghost", "x"))),
        Rejection::ToolOrphan { op_id: "ghost".into() }
    );
    let orphan_parent = RecordToolCall { parent_op: Some("nope".into()), ..tool_call(s, "op3", "grep", "x") };
    assert_eq!(rejected(engine.record_tool_call(orphan_parent)), Rejection::UnknownToolOp { op_id: "nope".into() });
    let unknown_ref = turn(s, "t1", rev0).tool_op("op1").tool_op("nope");
    assert_eq!(rejected(engine.commit_turn(unknown_ref)), Rejection::UnknownToolOp { op_id: "nope".into() });
    // Op ids are per session.
    assert_eq!(
        rejected(engine.record_tool_result(tool_result(other, "op1", "a.txt"))),
        Rejection::ToolOrphan { op_id: "op1".into() }
    );
    assert_unchanged(&engine, tip, &digests);

    // A nested operation links to its parent.
    let nested = RecordToolCall { parent_op: Some("op2".into()), ..tool_call(s, "op2.1", "grep", "fn main") };
    assert!(engine.record_tool_call(nested).unwrap().created);
    let op = engine.tool_op(s, "op2.1").unwrap().unwrap();
    assert_eq!(op.parent_op.as_deref(), Some("op2"));
    let order: Vec<String> =
        engine.tool_ops(s, PageRequest::first(10)).unwrap().items.into_iter().map(|o| o.op_id).collect();
    assert_eq!(order, vec!["op1", "op2", "op2.1"]);
    let unsettled: Vec<String> = engine.unsettled(s).unwrap().into_iter().map(|o| o.op_id).collect();
    assert_eq!(unsettled, vec!["op2", "op2.1"]);
    let error = RecordToolResult { outcome: ToolOutcome::Error, ..tool_result(s, "op2.1", "no match") };
    engine.record_tool_result(error).unwrap();
    let unsettled: Vec<String> = engine.unsettled(s).unwrap().into_iter().map(|o| o.op_id).collect();
    assert_eq!(unsettled, vec!["op2"]);

    engine.archive(s, "done").unwrap();
    let archived = Rejection::Archived { session: s };
    assert_eq!(rejected(engine.record_tool_call(tool_call(s, "op4", "bash", "x"))), archived);
    assert_eq!(rejected(engine.record_tool_result(tool_result(s, "op2", "x"))), archived);
}

// ---------------------------------------------------------------------------- S10

fn listed(engine: &Engine, q: &ListQuery) -> (Vec<SessionId>, bool) {
    let page = engine.list_sessions(q).unwrap();
    (page.items.iter().map(|h| h.session).collect(), page.has_more)
}

#[test]
fn s10_listing_filters_pages_hides_archived_and_keeps_creation_order() {
    let db = Db::new();
    let engine = db.open();
    // Host ids that sort against creation order: the listing follows creation.
    let ids: Vec<SessionId> = (0..5u8).map(|i| SessionId([200 - i; 16])).collect();
    let tags = [("x", "prod"), ("x", "dev"), ("y", "prod"), ("x", "prod"), ("xy", "prod")];
    for (id, (team, env)) in ids.iter().zip(tags) {
        engine.create_session(CreateSession::with_id(*id).label("team", team).label("env", env)).unwrap();
    }
    let q = ListQuery::new();
    assert_eq!(listed(&engine, &q), (ids.clone(), false));
    assert_eq!(listed(&engine, &q.clone().label("team", "x")), (vec![ids[0], ids[1], ids[3]], false));
    let both = q.clone().label("team", "x").label("env", "prod");
    assert_eq!(listed(&engine, &both), (vec![ids[0], ids[3]], false));
    let reversed = q.clone().label("env", "prod").label("team", "x");
    assert_eq!(listed(&engine, &reversed), (vec![ids[0], ids[3]], false));
    assert_eq!(listed(&engine, &q.clone().label("team", "z")), (vec![], false));
    assert_eq!(listed(&engine, &q.clone().label("tea", "mx")), (vec![], false));

    // Paging.
    assert_eq!(listed(&engine, &q.clone().page(0, 2)), (ids[..2].to_vec(), true));
    assert_eq!(listed(&engine, &q.clone().page(2, 2)), (ids[2..4].to_vec(), true));
    assert_eq!(listed(&engine, &q.clone().page(4, 2)), (ids[4..].to_vec(), false));
    assert_eq!(listed(&engine, &q.clone().page(9, 2)), (vec![], false));
    assert_eq!(listed(&engine, &q.clone().page(0, 5)), (ids.clone(), false));
    assert_eq!(listed(&engine, &q.clone().label("env", "prod").page(1, 2)), (vec![ids[2], ids[3]], true));
    let page = engine.list_sessions(&q.clone().page(3, 2)).unwrap();
    assert_eq!((page.offset, page.limit), (3, 2));

    // Archived sessions are hidden unless asked for, and keep their place.
    engine.archive(ids[1], "old").unwrap();
    assert_eq!(listed(&engine, &q.clone().label("team", "x")), (vec![ids[0], ids[3]], false));
    assert_eq!(
        listed(&engine, &q.clone().label("team", "x").include_archived()),
        (vec![ids[0], ids[1], ids[3]], false)
    );
    assert_eq!(listed(&engine, &q.clone().page(0, 2)), (vec![ids[0], ids[2]], true));

    // Changing labels moves a session between filters, never in the order.
    engine.set_labels(set_labels(ids[4], &[("team", "x")], &["env"])).unwrap();
    engine.set_labels(set_labels(ids[0], &[], &["team"])).unwrap();
    assert_eq!(listed(&engine, &q.clone().label("team", "x")), (vec![ids[3], ids[4]], false));
    assert_eq!(listed(&engine, &q.clone().label("env", "prod")), (vec![ids[0], ids[2], ids[3]], false));
    let newer = engine.create_session(CreateSession::new().label("team", "x")).unwrap().session;
    assert_eq!(listed(&engine, &q.clone().label("team", "x")), (vec![ids[3], ids[4], newer], false));

    // The same answers after a rebuild.
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(listed(&engine, &q.clone().label("team", "x")), (vec![ids[3], ids[4], newer], false));
}

/// Recency listing for resume pickers: newest update first, with the same filters and
/// paging; every event of a session moves it to the front. A label filter on any label
/// is answered from that label's index (the most selective filter drives), whatever the
/// order the filters are given in.
#[test]
fn s10_listing_by_recent_update() {
    let db = Db::new();
    let engine = db.open();
    let mut ids = Vec::new();
    for i in 0..6u8 {
        let team = if i % 2 == 0 { "core" } else { "web" };
        let env = if i == 4 { "staging" } else { "prod" };
        let c = CreateSession::with_id(SessionId([i + 1; 16])).label("team", team).label("env", env);
        ids.push(engine.create_session(c.message(Message::system("sys"))).unwrap().session);
    }
    let recent = ListQuery::new().recently_updated();
    let newest_first: Vec<SessionId> = ids.iter().rev().copied().collect();
    assert_eq!(listed(&engine, &recent), (newest_first, false));

    // Any event moves a session to the front: a turn, context, labels, host state.
    let rev = head(&engine, ids[1]).revision;
    engine.commit_turn(turn(ids[1], "t", rev)).unwrap();
    engine.append_context(context(ids[3], "k", "v")).unwrap();
    engine.set_host_state(SetHostState::new(ids[0], Expected::Any).set("model", b"m".to_vec())).unwrap();
    let order = vec![ids[0], ids[3], ids[1], ids[5], ids[4], ids[2]];
    assert_eq!(listed(&engine, &recent), (order.clone(), false));
    assert_eq!(listed(&engine, &recent.clone().page(1, 2)), (order[1..3].to_vec(), true));
    assert_eq!(listed(&engine, &recent.clone().page(4, 9)), (order[4..].to_vec(), false));

    // Filters, in either order, with paging; archived sessions hidden unless asked for.
    let core = recent.clone().label("team", "core");
    assert_eq!(listed(&engine, &core), (vec![ids[0], ids[4], ids[2]], false));
    let core_prod = recent.clone().label("env", "prod").label("team", "core");
    assert_eq!(listed(&engine, &core_prod), (vec![ids[0], ids[2]], false));
    let prod_core = recent.clone().label("team", "core").label("env", "prod");
    assert_eq!(listed(&engine, &prod_core), (vec![ids[0], ids[2]], false));
    assert_eq!(listed(&engine, &core.clone().page(1, 1)), (vec![ids[4]], true));
    engine.archive(ids[4], "done").unwrap();
    assert_eq!(listed(&engine, &core), (vec![ids[0], ids[2]], false));
    assert_eq!(listed(&engine, &core.clone().include_archived()), (vec![ids[4], ids[0], ids[2]], false));
    assert_eq!(listed(&engine, &recent.clone().label("team", "nobody")), (vec![], false));
    // The creation order still answers the same way for multi-label filters.
    let created = ListQuery::new().label("env", "prod").label("team", "web");
    assert_eq!(listed(&engine, &created), (vec![ids[1], ids[3], ids[5]], false));

    // A rebuild and a reopen give the same answers.
    let before = listed(&engine, &recent.clone().include_archived());
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(listed(&engine, &recent.clone().include_archived()), before);
    engine.close().unwrap();
    let engine = db.open();
    assert_eq!(listed(&engine, &recent.clone().include_archived()), before);
}

#[test]
fn s10_set_labels_contract() {
    let db = Db::new();
    let engine = db.open();
    let s = engine.create_session(CreateSession::new().label("a", "1")).unwrap().session;
    let seq = engine.set_labels(set_labels(s, &[("b", "2")], &["a"])).unwrap();
    assert_eq!(seq, Some(2));
    assert_eq!(head(&engine, s).labels, labels(&[("b", "2")]));
    let (tip, digests) = (tip_seq(&engine), engine.projection_digests().unwrap());
    assert_eq!(engine.set_labels(set_labels(s, &[("b", "2")], &["a"])).unwrap(), None, "no change, no event");
    assert!(matches!(
        rejected(engine.set_labels(set_labels(s, &[("c", "3")], &["c"]))),
        Rejection::InvalidRequest { .. }
    ));
    let key = "k".repeat(129);
    assert_eq!(
        rejected(engine.set_labels(set_labels(s, &[(key.as_str(), "v")], &[]))),
        Rejection::LimitExceeded { limit: Limit::LabelKeyBytes, actual: 129, max: 128 }
    );
    let ghost = SessionId([11; 16]);
    assert_eq!(
        rejected(engine.set_labels(set_labels(ghost, &[("a", "b")], &[]))),
        Rejection::NotFound { session: ghost }
    );
    assert_unchanged(&engine, tip, &digests);
}

// ---------------------------------------------------------------------------- S11

#[test]
fn s11_transcript_paging_clamps_echoes_and_reports_more() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    commit_turns(&engine, s, "t", 5, rev0);
    let all = transcript(&engine, s);
    assert_eq!(all.len(), 11);
    let page = |offset, limit| engine.transcript(s, PageRequest::new(offset, limit)).unwrap();

    let p = page(0, 4);
    assert_eq!((p.offset, p.limit, p.total, p.messages.len(), p.has_more), (0, 4, 11, 4, true));
    let p = page(8, 4);
    assert_eq!((p.offset, p.limit, p.messages.len(), p.has_more), (8, 4, 3, false));
    assert_eq!(p.messages, all[8..]);
    assert_eq!(p.messages.iter().map(|m| m.position).collect::<Vec<_>>(), vec![8, 9, 10]);
    let p = page(7, 4);
    assert_eq!((p.messages.len(), p.has_more), (4, false));
    let p = page(40, 4);
    assert_eq!((p.offset, p.limit, p.messages.len(), p.has_more), (11, 4, 0, false));
    let p = page(3, 0);
    assert_eq!((p.offset, p.limit, p.messages.len(), p.has_more), (3, 0, 0, true));
    let p = page(0, 10_000);
    assert_eq!((p.limit, p.messages.len(), p.has_more), (10_000, 11, false));
    assert_eq!(
        rejected(engine.transcript(s, PageRequest::first(10_001))),
        Rejection::LimitExceeded { limit: Limit::PageItems, actual: 10_001, max: 10_000 }
    );
    assert_eq!(
        rejected(engine.transcript_at(s, rev0, PageRequest::first(10_001))),
        Rejection::LimitExceeded { limit: Limit::PageItems, actual: 10_001, max: 10_000 }
    );
    let ghost = SessionId([12; 16]);
    assert_eq!(rejected(engine.transcript(ghost, PageRequest::first(1))), Rejection::NotFound { session: ghost });

    // Revision pages: oldest first, always with the head.
    let revs = engine.revisions(s, PageRequest::new(4, 4)).unwrap();
    assert_eq!((revs.total, revs.page.offset, revs.page.items.len(), revs.page.has_more), (6, 4, 2, false));
    assert_eq!(revs.head, head(&engine, s).revision);
    assert_eq!(revs.page.items[1].revision, revs.head);
    let revs = engine.revisions(s, PageRequest::new(0, 2)).unwrap();
    assert_eq!((revs.page.items[0].revision, revs.page.has_more), (rev0, true));
    let revs = engine.revisions(s, PageRequest::new(99, 2)).unwrap();
    assert_eq!((revs.page.offset, revs.page.items.len(), revs.head), (6, 0, head(&engine, s).revision));
}

#[test]
fn s11_transcript_pages_respect_the_byte_budget() {
    let db = Db::new();
    // The configured budget must hold the largest message (`Limits::validate`); a request
    // carries a smaller one of its own.
    let engine = db.open();
    let bodies: Vec<Message> = (0..9).map(|i| Message::user(format!("{i}").repeat(40))).collect();
    let (s, rev) = create(&engine, &bodies);
    let mut read = Vec::new();
    let mut offset = 0;
    loop {
        let page = engine.transcript(s, PageRequest::new(offset, 10).with_max_bytes(100)).unwrap();
        assert_eq!(page.limit, 10);
        assert!(!page.messages.is_empty());
        let bytes: usize = page.messages.iter().map(|m| m.message.body.len()).sum();
        assert!(bytes <= 100, "a page of {bytes} bytes is over the budget");
        assert_eq!(page.messages.len(), 2.min(9 - offset as usize));
        offset += page.messages.len() as u64;
        read.extend(page.messages);
        assert_eq!(page.has_more, offset < 9);
        if !page.has_more {
            break;
        }
    }
    assert_eq!(
        read.into_iter().map(|m| m.message.body).collect::<Vec<_>>(),
        bodies.iter().map(|m| m.body.clone()).collect::<Vec<_>>()
    );
    let old = engine.transcript_at(s, rev, PageRequest::new(3, 10).with_max_bytes(100)).unwrap();
    assert_eq!((old.messages.len(), old.has_more), (2, true));
}

#[test]
fn s11_event_pages_byte_budget_and_oversized_records() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    commit_turns(&engine, s, "t", 3, rev0);
    let sizes: Vec<u64> = all_events(&engine).iter().map(|e| e.size).collect();
    assert_eq!(sizes.len(), 4);
    let q = |from_seq, max_events, max_bytes| EventQuery { from_seq, max_events, max_bytes };

    let page = engine.events(q(1, 10, sizes[0])).unwrap();
    assert_eq!((page.events.len(), page.next_seq, page.has_more), (1, 2, true));
    assert_eq!(
        engine.events(q(1, 10, sizes[0] - 1)),
        Err(Error::OversizedRecord { seq: 1, size: sizes[0], max_bytes: sizes[0] - 1 })
    );
    let budget = sizes[0] + sizes[1] + sizes[2] - 1;
    let page = engine.events(q(1, 10, budget)).unwrap();
    assert_eq!((page.events.len(), page.next_seq, page.has_more), (2, 3, true));
    assert_eq!(
        engine.events(q(page.next_seq, 10, sizes[2] - 1)),
        Err(Error::OversizedRecord { seq: 3, size: sizes[2], max_bytes: sizes[2] - 1 })
    );
    let page = engine.events(q(2, 2, 1 << 20)).unwrap();
    assert_eq!(page.events.iter().map(|e| e.record.seq).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!((page.next_seq, page.has_more), (4, true));
    let page = engine.events(q(4, 2, 1 << 20)).unwrap();
    assert_eq!((page.events.len(), page.next_seq, page.has_more), (1, 5, false));
    let page = engine.events(q(9, 2, 1 << 20)).unwrap();
    assert_eq!((page.events.len(), page.has_more), (0, false));
    assert_eq!(
        engine.session_events(s, q(2, 10, sizes[1] - 1)),
        Err(Error::OversizedRecord { seq: 2, size: sizes[1], max_bytes: sizes[1] - 1 })
    );

    assert_eq!(
        rejected(engine.events(q(1, 10_001, 1 << 20))),
        Rejection::LimitExceeded { limit: Limit::PageItems, actual: 10_001, max: 10_000 }
    );
    assert_eq!(
        rejected(engine.events(q(1, 10, (64 << 20) + 1))),
        Rejection::LimitExceeded { limit: Limit::PageBytes, actual: (64 << 20) + 1, max: 64 << 20 }
    );
    assert_eq!(
        rejected(engine.list_sessions(&ListQuery::new().page(0, 10_001))),
        Rejection::LimitExceeded { limit: Limit::PageItems, actual: 10_001, max: 10_000 }
    );
}

// ---------------------------------------------------------------------------- S12

fn next_notice(rx: &crossbeam_channel::Receiver<CommitNotice>) -> CommitNotice {
    rx.recv_timeout(Duration::from_secs(60)).expect("a commit notice")
}

#[test]
fn s12_subscribers_hear_each_durable_commit_once_and_no_rejection() {
    let db = Db::new();
    let engine = db.open_durable();
    let rx = engine.subscribe();
    let second = engine.subscribe();
    let mut expected = Vec::new();
    let single = |seq: u64, s: SessionId| (seq, seq, vec![s]);

    let created = engine.create_session(CreateSession::new().message(Message::system("sys"))).unwrap();
    let s = created.session;
    expected.push(single(created.receipt.seq, s));
    let t1 = turn(s, "t1", created.receipt.revision);
    let r1 = engine.commit_turn(t1.clone()).unwrap().receipt();
    expected.push(single(r1.seq, s));

    // Rejections and no-op retries: nothing to hear.
    rejected(engine.commit_turn(turn(s, "t2", created.receipt.revision)));
    assert!(matches!(engine.commit_turn(t1).unwrap(), TurnOutcome::AlreadyCommitted(_)));
    let ContextOutcome::Staged(seq) = engine.append_context(context(s, "k", "v")).unwrap() else { panic!("staged") };
    expected.push(single(seq, s));
    assert_eq!(engine.append_context(context(s, "k", "v")).unwrap(), ContextOutcome::Duplicate);
    rejected(engine.append_context(context(s, "k", "w")));
    let seq = engine.record_tool_call(tool_call(s, "op", "bash", "ls")).unwrap().seq.unwrap();
    expected.push(single(seq, s));
    assert!(!engine.record_tool_call(tool_call(s, "op", "bash", "ls")).unwrap().created);
    rejected(engine.record_tool_result(tool_result(s, "nope", "x")));
    assert_eq!(engine.set_labels(set_labels(s, &[], &["absent"])).unwrap(), None);
    let seq = engine.execute(Command::Archive { session: s, reason: "x".into() }).unwrap();
    let Outcome::Archived { seq: Some(seq) } = seq else { panic!("archived") };
    expected.push(single(seq, s));
    assert!(!engine.archive(s, "again").unwrap());
    let seq = engine.revive(s, "back").unwrap();
    expected.push(single(seq, s));

    // A rejected batch is silent; an accepted one is one commit.
    let a = SessionId([21; 16]);
    let b = SessionId([22; 16]);
    let bad =
        vec![Command::CreateSession(CreateSession::with_id(a)), Command::CreateSession(CreateSession::with_id(s))];
    assert!(matches!(rejected(engine.batch(bad)), Rejection::Batch { index: 1, .. }));
    let good =
        vec![Command::CreateSession(CreateSession::with_id(a)), Command::CreateSession(CreateSession::with_id(b))];
    let outcomes = engine.batch(good).unwrap();
    let seqs: Vec<u64> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Created { receipt, .. } => receipt.seq,
            other => panic!("expected Created, got {other:?}"),
        })
        .collect();
    expected.push((seqs[0], seqs[1], vec![a, b]));

    // A last commit as a marker: notices arrive in commit order, so once it is heard,
    // everything before it has been heard too.
    let marker = engine.create_session(CreateSession::new()).unwrap();
    expected.push(single(marker.receipt.seq, marker.session));
    for receiver in [&rx, &second] {
        let mut heard = Vec::new();
        loop {
            let n = next_notice(receiver);
            let last = n.last_seq;
            heard.push((n.first_seq, n.last_seq, n.sessions));
            if last == marker.receipt.seq {
                break;
            }
        }
        assert_eq!(heard, expected);
        assert!(receiver.try_recv().is_err(), "no notice after the last commit");
    }
    assert_eq!(tip_seq(&engine), marker.receipt.seq);
    // Every seq is covered exactly once.
    let covered: Vec<u64> = expected.iter().flat_map(|(f, l, _)| *f..=*l).collect();
    assert_eq!(covered, (1..=marker.receipt.seq).collect::<Vec<_>>());
}

/// The sessions of `records` in the order of their first record.
fn sessions_in_order(records: &[Record]) -> Vec<SessionId> {
    let mut sessions = Vec::new();
    for r in records {
        if !sessions.contains(&r.session) {
            sessions.push(r.session);
        }
    }
    sessions
}

#[test]
fn s12_an_import_is_heard_once_per_import_after_it_returns() {
    let source = Db::new().open();
    let sessions = workload(&source);
    // Every session with its content: the whole log.
    let SessionExport { records, content } = source.export_sessions(&sessions, true).unwrap();
    let tip = tip_seq(&source);
    assert!(records.len() > 10 && records.len() as u64 == tip);

    let db = Db::new();
    let engine = db.open_durable();
    let rx = engine.subscribe();
    let mut stream = engine.subscribe_stream();
    // An empty import and a rejected one append nothing: nothing to hear.
    assert_eq!(engine.import(Vec::new(), Vec::new()).unwrap().records, 0);
    assert!(matches!(rejected(engine.import(records[1..].to_vec(), content.clone())), Rejection::InvalidImport { .. }));
    assert!(rx.try_recv().is_err(), "an import that appended nothing notified a subscriber");

    // Two imports, each one durable transaction: one notice each, queued before the
    // import returns, covering exactly its records.
    let (first, second) = records.split_at(records.len() / 2);
    let mut heard = Vec::new();
    for part in [first, second] {
        let stats = engine.import(part.to_vec(), content.clone()).unwrap();
        assert_eq!(stats.records, part.len() as u64);
        let notice = rx.try_recv().expect("a notice queued before the import returned");
        assert!(rx.try_recv().is_err(), "one notice per import");
        let last = part.last().unwrap();
        assert_eq!((notice.first_seq, notice.last_seq), (part[0].seq, last.seq));
        assert_eq!(notice.last_seq, stats.tip_seq);
        assert_eq!(notice.sessions, sessions_in_order(part));
        assert_eq!(notice.committed_at_ms, last.committed_at_ms);
        heard.push(notice);
    }
    // A command after the import is heard next, at the next seq.
    let marker = engine.create_session(CreateSession::new()).unwrap();
    let notice = next_notice(&rx);
    assert_eq!((notice.first_seq, notice.last_seq), (tip + 1, tip + 1));
    assert_eq!(marker.receipt.seq, tip + 1);
    heard.push(notice);
    assert!(rx.try_recv().is_err());
    let covered: Vec<u64> = heard.iter().flat_map(|n| n.first_seq..=n.last_seq).collect();
    assert_eq!(covered, (1..=tip + 1).collect::<Vec<_>>(), "every seq heard exactly once");

    // The commit stream hears the same notices, and ends once the engine is closed.
    engine.close().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let items: Vec<StreamItem> = runtime.block_on(async {
        let mut items = Vec::new();
        while let Some(item) = stream.recv().await {
            items.push(item);
        }
        items
    });
    assert_eq!(items, heard.into_iter().map(StreamItem::Commit).collect::<Vec<_>>());
}

/// A subscription taken on a handle of an engine that another handle closed ends at
/// once: nothing will be committed any more, and a `recv` must not wait for good.
#[test]
fn s12_a_subscription_taken_after_close_ends_at_once() {
    let db = Db::new();
    let engine = db.open_durable();
    let other = engine.clone();
    engine.close().unwrap();
    let rx = other.subscribe();
    assert!(rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap_err().is_disconnected());
}

#[test]
fn s12_a_subscriber_more_than_its_queue_behind_is_disconnected_after_what_it_holds() {
    let db = Db::new();
    let engine = db.open();
    let rx = engine.subscribe();
    let (s, _) = create(&engine, &[]);
    let first = tip_seq(&engine);
    // One commit more than the queue holds, and the receiver reads none of them.
    for i in 0..SUBSCRIBER_QUEUE_MAX {
        engine.append_context(context(s, &format!("k{i}"), "v")).unwrap();
    }
    let last = tip_seq(&engine);
    assert_eq!(last - first + 1, SUBSCRIBER_QUEUE_MAX as u64 + 1);
    // The writer did not wait for the receiver; the receiver still holds the first
    // `SUBSCRIBER_QUEUE_MAX` commits, in order, each once, with no gap.
    assert_eq!(rx.len(), SUBSCRIBER_QUEUE_MAX);
    let mut next = first;
    for _ in 0..SUBSCRIBER_QUEUE_MAX {
        let n = rx.try_recv().expect("a queued notice");
        assert_eq!((n.first_seq, n.last_seq, n.sessions.as_slice()), (next, next, &[s][..]));
        next += 1;
    }
    assert_eq!(next, last, "the receiver holds every commit before the one that overflowed it");
    // Then the end: the receiver is disconnected while the engine is open, and hears
    // nothing of later commits.
    assert_eq!(rx.try_recv(), Err(crossbeam_channel::TryRecvError::Disconnected));
    engine.append_context(context(s, "after", "v")).unwrap();
    assert_eq!(rx.try_recv(), Err(crossbeam_channel::TryRecvError::Disconnected));
    assert!(rx.recv_timeout(Duration::from_secs(1)).is_err());
    // Other subscribers are unaffected: a new one hears the next commit.
    let fresh = engine.subscribe();
    let seq = engine.append_context(context(s, "fresh", "v")).unwrap();
    let ContextOutcome::Staged(seq) = seq else { panic!("staged") };
    assert_eq!(next_notice(&fresh).first_seq, seq);
}

// ---------------------------------------------------------------------------- S13

#[test]
fn s13_rebuild_is_identical_twice() {
    let db = Db::new();
    let engine = db.open();
    workload(&engine);
    let live = engine.projection_digests().unwrap();
    // Every table but the tombstones, which only a purge writes.
    assert!(
        live.iter().all(|d| d.rows > 0 || d.table == Table::Purged.name()),
        "the workload fills every projection table: {live:?}"
    );
    let stats = engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(stats.events, tip_seq(&engine));
    assert_eq!(engine.projection_digests().unwrap(), live);
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), live);
    for p in Projection::ALL {
        engine.rebuild(ProjectionSet::none().with(p)).unwrap();
        assert_eq!(engine.projection_digests().unwrap(), live, "rebuilding {} alone", p.name());
    }
}

#[test]
fn s13_a_bumped_projection_version_rebuilds_at_open() {
    let db = Db::new();
    let engine = db.open();
    let sessions = workload(&engine);
    let live = engine.projection_digests().unwrap();
    let usage = engine.usage(sessions[0]).unwrap();
    engine.close().unwrap();

    // Another projection version on disk, and the projection's rows wiped: only a
    // rebuild at open can bring them back.
    {
        let raw = redb::Database::create(projections_path(&db.path)).unwrap();
        let txn = raw.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            let key = meta_keys::version(Projection::Usage);
            meta.insert(key.as_str(), 99u32.to_le_bytes().as_slice()).unwrap();
            tables::clear_projection_tables(&txn, &[Table::Usage]).unwrap();
        }
        txn.commit().unwrap();
    }
    assert_eq!(meta_u64(&projections_path(&db.path), &meta_keys::version(Projection::Usage)), Some(99));

    let engine = db.open();
    assert_eq!(engine.projection_digests().unwrap(), live);
    assert_eq!(engine.usage(sessions[0]).unwrap(), usage);
    let tip = tip_seq(&engine);
    engine.close().unwrap();
    let projections = projections_path(&db.path);
    assert_eq!(
        meta_u64(&projections, &meta_keys::version(Projection::Usage)),
        Some(Projection::Usage.version() as u64)
    );
    assert_eq!(meta_u64(&projections, &meta_keys::cursor(Projection::Usage)), Some(tip));
}

// ---------------------------------------------------------------------------- S16

/// Gives the record at `seq` schema version `version`, re-sealing the chain after it.
/// Rewrites record `seq` as if a newer binary had written its kind: schema version one
/// past this binary's.
fn bump_schema_version(path: &std::path::Path, seq: u64, kind: EventKind) {
    let version = kind.current_version() + 1;
    edit_log_record(path, seq, |bytes| bytes[6..8].copy_from_slice(&version.to_le_bytes()));
}

#[track_caller]
fn assert_newer_schema(result: Result<impl std::fmt::Debug>, seq: u64, kind: EventKind) {
    let supported = kind.current_version();
    let expected = annal::codec::DecodeError::UnsupportedVersion { kind, found: supported + 1, supported };
    match result {
        Err(Error::Decode { seq: at, source }) => {
            assert_eq!((at, source), (seq, expected));
        }
        other => panic!("expected a decode error at seq {seq}, got {other:?}"),
    }
}

#[test]
fn s16_a_record_from_a_newer_schema_is_a_typed_error_never_a_skip() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    commit_turns(&engine, s, "t", 3, rev0);
    engine.close().unwrap();
    bump_schema_version(&db.path, 3, EventKind::TurnCommitted);

    let engine = db.open();
    // Records before it read; a page that reaches it fails rather than skipping it.
    let page = engine.events(EventQuery { from_seq: 1, max_events: 2, max_bytes: 1 << 20 }).unwrap();
    assert_eq!(page.events.len(), 2);
    assert_newer_schema(
        engine.events(EventQuery { from_seq: 1, max_events: 10, max_bytes: 1 << 20 }),
        3,
        EventKind::TurnCommitted,
    );
    assert_newer_schema(
        engine.events(EventQuery { from_seq: 3, max_events: 1, max_bytes: 1 << 20 }),
        3,
        EventKind::TurnCommitted,
    );
    assert_newer_schema(
        engine.session_events(s, EventQuery { from_seq: 1, max_events: 10, max_bytes: 1 << 20 }),
        3,
        EventKind::TurnCommitted,
    );
    assert_newer_schema(engine.rebuild(ProjectionSet::all()), 3, EventKind::TurnCommitted);
    let message = engine.events(EventQuery { from_seq: 3, max_events: 1, max_bytes: 1 << 20 }).unwrap_err().to_string();
    let (found, supported) =
        (EventKind::TurnCommitted.current_version() + 1, EventKind::TurnCommitted.current_version());
    assert!(
        message.contains("TurnCommitted")
            && message.contains(&found.to_string())
            && message.contains(&supported.to_string()),
        "{message}"
    );
    engine.close().unwrap();

    // A rebuild at open meets it too, and the open fails.
    set_meta(&projections_path(&db.path), &meta_keys::version(Projection::Heads), &0u32.to_le_bytes());
    let opened = Engine::open_with(&db.path, Options { durability: Durability::Relaxed, ..Options::default() });
    assert_newer_schema(opened, 3, EventKind::TurnCommitted);
}

#[test]
fn s16_a_newer_schema_at_the_tip_fails_the_open() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    commit_turns(&engine, s, "t", 1, rev0);
    engine.archive(s, "done").unwrap();
    engine.close().unwrap();
    bump_schema_version(&db.path, 3, EventKind::SessionArchived);
    let opened = Engine::open_with(&db.path, Options { durability: Durability::Relaxed, ..Options::default() });
    match opened {
        Err(e) => assert_newer_schema(Err::<(), _>(e), 3, EventKind::SessionArchived),
        Ok(engine) => {
            assert_newer_schema(
                engine.events(EventQuery { from_seq: 1, max_events: 10, max_bytes: 1 << 20 }),
                3,
                EventKind::SessionArchived,
            );
            assert_newer_schema(engine.rebuild(ProjectionSet::all()), 3, EventKind::SessionArchived);
        }
    }
}

// ---------------------------------------------------------------------------- S17

#[test]
fn s17_usage_accumulates_per_provider_and_model_and_replay_agrees() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let (other, other_rev) = create(&engine, &[Message::system("sys")]);
    let mut rev = rev0;
    let cached = Usage {
        provider: "anthropic".into(),
        model: "claude".into(),
        input: 1,
        output: 2,
        cache_read: 30,
        cache_write: 40,
    };
    let turns = vec![
        turn(s, "t1", rev).usage("anthropic", "claude", 100, 10),
        turn(s, "t2", rev).usage("anthropic", "claude", 200, 20).usage("openai", "gpt", 7, 3),
        turn(s, "t3", rev).usage("openai", "gpt-mini", 5, 1),
        turn(s, "t4", rev),
        CommitTurn { usage: vec![cached], ..turn(s, "t5", rev) },
    ];
    for t in turns {
        let t = CommitTurn { expected: Expected::Exact(rev), ..t };
        rev = engine.commit_turn(t).unwrap().receipt().revision;
    }
    engine.commit_turn(turn(other, "o1", other_rev).usage("anthropic", "claude", 1000, 1000)).unwrap();

    let totals = |provider: &str, model: &str, input, output, cache_read, cache_write, turns| UsageTotals {
        provider: provider.into(),
        model: model.into(),
        input,
        output,
        cache_read,
        cache_write,
        turns,
    };
    let expected = vec![
        totals("anthropic", "claude", 301, 32, 30, 40, 3),
        totals("openai", "gpt", 7, 3, 0, 0, 1),
        totals("openai", "gpt-mini", 5, 1, 0, 0, 1),
    ];
    assert_eq!(engine.usage(s).unwrap(), expected);
    assert_eq!(engine.usage(other).unwrap(), vec![totals("anthropic", "claude", 1000, 1000, 0, 0, 1)]);

    let digests = engine.projection_digests().unwrap();
    engine.rebuild(ProjectionSet::none().with(Projection::Usage)).unwrap();
    assert_eq!(engine.usage(s).unwrap(), expected);
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.usage(s).unwrap(), expected);
    assert_eq!(engine.projection_digests().unwrap(), digests);
    engine.close().unwrap();
    let engine = db.open();
    assert_eq!(engine.usage(s).unwrap(), expected);
    let keys: BTreeSet<(String, String)> =
        engine.usage(s).unwrap().into_iter().map(|u| (u.provider, u.model)).collect();
    assert_eq!(keys.len(), 3);
}

/// `Outcome::seqs` names the events a command wrote, in order, and nothing for a retry.
#[test]
fn outcomes_name_the_events_they_wrote() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let batch = Command::Batch(vec![
        Command::AppendContext(context(s, "k", "v")),
        Command::CommitTurn(turn(s, "t1", rev)),
        Command::RecordToolCall(tool_call(s, "op1", "bash", "ls")),
    ]);
    let outcome = engine.execute(batch.clone()).unwrap();
    assert_eq!(outcome.seqs(), vec![2, 3, 4]);
    assert!(outcome.wrote());
    let again = engine.execute(Command::CommitTurn(turn(s, "t1", rev))).unwrap();
    assert_eq!((again.seqs(), again.wrote()), (vec![], false));
}

/// The stream index keeps 16 stream seqs a row and the revision order 16 seqs a row: a
/// session of many rows pages across their edges, live, from the checkpoint after a
/// reopen, and from a read-only reader.
#[test]
fn a_long_session_pages_its_events_and_revisions_across_index_rows() {
    let db = Db::new();
    let engine = db.open();
    let (s, first) = create(&engine, &[Message::system("be brief")]);
    let (other, other_head) = create(&engine, &[]);
    let mut head = first;
    let mut other_head = other_head;
    for i in 0..100 {
        head = commit_turns(&engine, s, &format!("t{i}-"), 1, head);
        if i % 3 == 0 {
            other_head = commit_turns(&engine, other, &format!("o{i}-"), 1, other_head);
        }
    }
    let check = |reader: &Reader| {
        // 101 events: stream seqs 1 ..= 101, in order, from any start.
        for from in [1u64, 2, 15, 16, 17, 63, 64, 65, 66, 96, 97, 100, 101] {
            for max_events in [1u64, 7, 64, 200] {
                let page =
                    reader.session_events(s, EventQuery { from_seq: from, max_events, max_bytes: 1 << 20 }).unwrap();
                let streams: Vec<u64> = page.events.iter().map(|e| e.record.stream_seq).collect();
                let want: Vec<u64> = (from..=101).take(max_events as usize).collect();
                assert_eq!(streams, want, "from {from}, {max_events} at most");
                assert_eq!(page.has_more, from + max_events <= 101, "from {from}, {max_events} at most");
                assert!(page.events.iter().all(|e| e.record.session == s));
            }
        }
        assert!(reader
            .session_events(s, EventQuery { from_seq: 102, max_events: 10, max_bytes: 1 << 20 })
            .unwrap()
            .events
            .is_empty());
        assert_eq!(session_events(reader, other).len(), 35);
        // 101 revision nodes (the creation and one a turn), ordinals in order.
        for (offset, limit) in [
            (0u64, 101u64),
            (6, 5),
            (7, 1),
            (7, 2),
            (8, 9),
            (15, 1),
            (15, 2),
            (16, 1),
            (30, 5),
            (31, 2),
            (32, 40),
            (95, 10),
            (101, 5),
        ] {
            let page = reader.revisions(s, PageRequest::new(offset, limit)).unwrap();
            assert_eq!(page.total, 101);
            let ordinals: Vec<u64> = page.page.items.iter().map(|n| n.ordinal).collect();
            assert_eq!(ordinals, (offset..101.min(offset + limit)).collect::<Vec<_>>(), "offset {offset}");
        }
        let graph = reader.graph(s).unwrap();
        assert_eq!(graph.nodes.iter().map(|n| n.ordinal).collect::<Vec<_>>(), (0..101).collect::<Vec<_>>());
        assert_eq!(graph.nodes[0].revision, first);
        assert_eq!(graph.nodes[100].revision, head);
        assert_eq!(graph.head, head);
        // The page and the graph read the same nodes.
        assert_eq!(reader.revisions(s, PageRequest::new(0, 101)).unwrap().page.items, graph.nodes);
    };
    check(&engine);
    drop(engine);
    check(&Reader::open(&db.path, Limits::default(), None).unwrap());
    let engine = db.open();
    check(&engine);
    // The stream and the graph go on after the reopen.
    commit_turns(&engine, s, "after-", 1, head);
    assert_eq!(session_events(&engine, s).last().unwrap().record.stream_seq, 102);
    assert_eq!(engine.graph(s).unwrap().nodes.len(), 102);
}

/// Content that several commands bring is stored once: by commands of one batch, by
/// commands committed at once from many threads (one group commit), and by commands of
/// later batches, whose rows the engine reads from the journal or the log file, before
/// and after a reopen.
#[test]
fn content_brought_again_is_stored_once_within_a_batch_and_across_batches() {
    let db = Db::new();
    let engine = db.open();
    let shared = Message::system("the shared prompt");
    let (a, ra) = create(&engine, std::slice::from_ref(&shared));
    let (b, rb) = create(&engine, &[]);
    let same = |session, id: &str, head| {
        CommitTurn::new(session, id, Expected::Exact(head))
            .message(Message::user("the same question"))
            .message(Message::assistant(format!("an answer in {id}")))
    };
    let batch = Command::Batch(vec![
        Command::CommitTurn(same(a, "a1", ra)),
        Command::CommitTurn(same(b, "b1", rb)),
        Command::CreateSession(
            CreateSession::new().message(shared.clone()).message(Message::user("the same question")),
        ),
    ]);
    engine.execute(batch).unwrap();
    let engine = std::sync::Arc::new(engine);
    std::thread::scope(|s| {
        for i in 0..8 {
            let engine = engine.clone();
            s.spawn(move || {
                let c = CreateSession::new()
                    .message(Message::system("the shared prompt"))
                    .message(Message::user(if i % 2 == 0 { "the same question" } else { "another question" }));
                engine.create_session(c).unwrap();
            });
        }
    });
    let engine = std::sync::Arc::into_inner(engine).unwrap();
    engine.close().unwrap();
    let engine = db.open();
    let (c, rc) = create(&engine, std::slice::from_ref(&shared));
    engine.commit_turn(same(c, "c1", rc)).unwrap();
    engine.close().unwrap();

    let raw = redb::Database::create(&db.path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&raw).unwrap();
    let content = annal::pieces::ContentReader::open(&txn).unwrap();
    let mut stored = BTreeMap::new();
    for item in content.iter().unwrap() {
        let (seq, row) = item.unwrap();
        for e in annal::codec::content::entries(&row, u64::MAX) {
            let id = e.unwrap().id;
            assert_eq!(stored.insert(id, seq), None, "{id} is stored twice (again at row {seq})");
        }
    }
    for m in [&shared, &Message::user("the same question"), &Message::user("another question")] {
        assert!(stored.contains_key(&message_id(m)));
    }
}

/// A retried turn answers with its first receipt, which the turns projection finds
/// through the record that committed it: in the same batch (the batch's own records),
/// right after (the journal's rows in memory), and after a reopen (the log file). The
/// same turn id with other content is a conflict in each case.
#[test]
fn a_retried_turn_gets_its_receipt_from_its_record_wherever_the_record_is() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let t1 = turn(s, "t1", rev);
    let other = CommitTurn::new(s, "t1", Expected::Any).message(Message::user("something else"));
    let batch = Command::Batch(vec![Command::CommitTurn(t1.clone()), Command::CommitTurn(t1.clone())]);
    let outcomes = match engine.execute(batch).unwrap() {
        Outcome::Batch(outcomes) => outcomes,
        o => panic!("{o:?}"),
    };
    let first = match &outcomes[..] {
        [Outcome::Committed(first), Outcome::AlreadyCommitted(again)] => {
            assert_eq!(first, again, "the same batch");
            *first
        }
        o => panic!("{o:?}"),
    };
    let conflict =
        Command::Batch(vec![Command::CommitTurn(turn(s, "t2", first.revision)), Command::CommitTurn(other.clone())]);
    assert!(matches!(
        rejected(engine.execute(conflict)),
        Rejection::Batch { index: 1, rejection } if matches!(*rejection, Rejection::TurnConflict { .. })
    ));
    let retry = |engine: &Engine| match engine.execute(Command::CommitTurn(t1.clone())).unwrap() {
        Outcome::AlreadyCommitted(r) => r,
        o => panic!("{o:?}"),
    };
    assert_eq!(retry(&engine), first, "from the journal's rows");
    assert!(matches!(rejected(engine.commit_turn(other.clone())), Rejection::TurnConflict { .. }));
    engine.checkpoint().unwrap();
    engine.close().unwrap();
    let engine = db.open_durable();
    assert_eq!(retry(&engine), first, "from the log file");
    assert!(matches!(rejected(engine.commit_turn(other)), Rejection::TurnConflict { .. }));
    // A rebuild gives the same answer.
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(retry(&engine), first);
}

/// A revision node keeps only what its record does not hold: a restore follows recipes
/// read from the records that first produced each node, wherever those are. In the same
/// batch (the batch's own records), from the journal's rows, from the log file after a
/// reopen, and after a rebuild; the revisions and the graph read the same nodes each time.
#[test]
fn a_restore_reads_its_recipes_from_the_records_wherever_they_are() {
    let db = Db::new();
    let engine = db.open();
    let sys = Message::system("sys");
    let (s, r0) = create(&engine, std::slice::from_ref(&sys));
    let (q, a, x) = (Message::user("question of t1"), Message::assistant("answer of t1"), Message::user("edited"));
    let r1 = revision_of(&[sys.clone(), q.clone(), a.clone()]);
    let r2 = revision_of(&[sys.clone(), x.clone(), a.clone()]);
    let batch = Command::Batch(vec![
        Command::CommitTurn(turn(s, "t1", r0)),
        Command::Rewrite(rewrite(s, r1, 1, 2, vec![x.clone()], RewriteReason::Edit)),
        Command::Restore(restore(s, r2, r1)),
    ]);
    match engine.execute(batch).unwrap() {
        Outcome::Batch(outcomes) => assert_eq!(outcomes.len(), 3),
        o => panic!("{o:?}"),
    }
    assert_eq!(head(&engine, s).revision, r1, "restored within the batch");
    let ids = |ms: &[&Message]| ms.iter().map(|m| message_id(m)).collect::<Vec<_>>();
    assert_eq!(transcript_ids(&engine, s), ids(&[&sys, &q, &a]));
    // From the journal's rows.
    engine.restore(restore(s, r1, r2)).unwrap();
    assert_eq!(transcript_ids(&engine, s), ids(&[&sys, &x, &a]));
    let graph = engine.graph(s).unwrap();
    let nodes: Vec<_> = graph.nodes.iter().map(|n| (n.revision, n.parents.clone(), n.origin.clone())).collect();
    assert_eq!(nodes[0], (r0, vec![], NodeOrigin::Created));
    assert_eq!(nodes[1], (r1, vec![r0, r2], NodeOrigin::Turn { turn_id: "t1".into() }));
    assert_eq!(nodes[2].0, r2);
    assert_eq!(nodes[2].1, vec![r1]);
    assert_eq!(graph.nodes[2].recipe, Recipe::Splice { parent: r1, start: 1, end: 2, replacement: ids(&[&x]) });
    assert_eq!(graph.nodes[1].recipe, Recipe::Splice { parent: r0, start: 1, end: 1, replacement: ids(&[&q, &a]) });
    assert_eq!(graph.nodes[1].created_at_ms, engine.graph(s).unwrap().edges[1].at_ms);
    let revisions = engine.revisions(s, PageRequest::first(10)).unwrap().page.items;
    assert_eq!(revisions, graph.nodes);
    engine.checkpoint().unwrap();
    engine.close().unwrap();
    // From the log file.
    let engine = db.open_durable();
    assert_eq!(engine.graph(s).unwrap(), graph);
    engine.restore(restore(s, r2, r0)).unwrap();
    assert_eq!(transcript_ids(&engine, s), ids(&[&sys]));
    let page = engine.transcript_at(s, r2, PageRequest::first(10)).unwrap();
    assert_eq!(page.messages.iter().map(|m| m.content_id).collect::<Vec<_>>(), ids(&[&sys, &x, &a]));
    // A rebuild folds the same nodes.
    let before = engine.graph(s).unwrap();
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.graph(s).unwrap(), before);
    engine.restore(restore(s, r0, r1)).unwrap();
    assert_eq!(transcript_ids(&engine, s), ids(&[&sys, &q, &a]));
}

/// The transcript names its messages by the records whose lists hold them (transcript
/// projection v4). Rewrites, a restore and a fork past the last checkpoint are folded
/// and read from every place records are: the batch's own, the journal's rows, a
/// read-only opener's fold of the log past the checkpoint, the log file after a reopen,
/// an engine rebuild and an offline one.
#[test]
fn a_transcript_reads_its_messages_from_the_records_wherever_they_are() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, first) = create(&engine, &[Message::system("be brief")]);
    // 301 messages: three chunk rows, two checkpoints.
    let mut head_rev = commit_turns(&engine, s, "t", 150, first);
    engine.checkpoint().unwrap();
    let edited = Message::user("edited");
    let summary = Message::system("summary of 5..200");
    // An edit of the first message keeps the length.
    let edit = engine.execute(Command::Rewrite(rewrite(s, head_rev, 1, 2, vec![edited.clone()], RewriteReason::Edit)));
    head_rev = match edit.unwrap() {
        Outcome::Rewritten(r) => r.revision,
        o => panic!("{o:?}"),
    };
    let edited_rev = head_rev;
    let mut want = transcript_ids(&engine, s);
    assert_eq!(want.len(), 301);
    assert_eq!(want[1], message_id(&edited));
    // A compaction moves every later position, and a turn follows it in one batch.
    let compacted = engine
        .execute(Command::Batch(vec![
            Command::Rewrite(rewrite(s, head_rev, 5, 200, vec![summary.clone()], RewriteReason::Compaction)),
            Command::CommitTurn(turn(s, "after", revision_after_compaction(&want, &summary))),
        ]))
        .unwrap();
    assert!(matches!(compacted, Outcome::Batch(ref o) if o.len() == 2), "{compacted:?}");
    want.splice(5..200, [message_id(&summary)]);
    want.extend([message_id(&Message::user("question of after")), message_id(&Message::assistant("answer of after"))]);
    assert_eq!(transcript_ids(&engine, s), want);
    // A fork at the end names its parent's records.
    let fork = engine.fork_at(s, want.len() as u64).unwrap().session;
    assert_eq!(transcript_ids(&engine, fork), want);
    // A restore to the edited revision splices the middle back from its record.
    let now = head(&engine, s).revision;
    engine.restore(restore(s, now, edited_rev)).unwrap();
    let restored = {
        let mut ids = want.clone();
        ids.truncate(5);
        ids
    };
    let restored_all = transcript_ids(&engine, s);
    assert_eq!(restored_all.len(), 301);
    assert_eq!(restored_all[..5], restored[..]);
    assert_eq!(RevisionId::of(&restored_all), edited_rev);
    let check = |reader: &Reader, what: &str| {
        assert_eq!(transcript_ids(reader, s), restored_all, "{what}: the session");
        assert_eq!(transcript_ids(reader, fork), want, "{what}: the fork");
        let page = reader.transcript(s, PageRequest::new(250, 20)).unwrap();
        let mut chain = RevisionId::of(&restored_all[..250]);
        for (m, id) in page.messages.iter().zip(&restored_all[250..]) {
            chain = chain.extend(id);
            assert_eq!((m.content_id, m.chain), (*id, chain), "{what}: a page");
        }
    };
    check(&engine, "live, from the journal's rows");
    let digests = engine.projection_digests().unwrap();
    // A read-only opener folds the log past the checkpoint, rewrites and fork included.
    check(&Reader::open(&db.path, Limits::default(), None).unwrap(), "a reader beside the engine");
    engine.close().unwrap();
    let engine = db.open_durable();
    check(&engine, "after a reopen");
    assert_eq!(engine.projection_digests().unwrap(), digests);
    engine.rebuild(ProjectionSet::all()).unwrap();
    check(&engine, "after a rebuild");
    assert_eq!(engine.projection_digests().unwrap(), digests);
    engine.close().unwrap();
    annal::rebuild::rebuild_offline(&db.path, &Options::default(), ProjectionSet::all(), &mut |_, _| {}).unwrap();
    let engine = db.open_durable();
    check(&engine, "after an offline rebuild");
    assert_eq!(engine.projection_digests().unwrap(), digests);
}

/// The head a compaction of `5..200` by `summary` leaves, for a turn fenced on it.
fn revision_after_compaction(before: &[ContentId], summary: &Message) -> RevisionId {
    let mut ids = before.to_vec();
    ids.splice(5..200, [message_id(summary)]);
    RevisionId::of(&ids)
}

/// A restore's walk over the revision graph stops at a revision whose list an earlier
/// walk rebuilt (kept in the engine's content cache). Restores of compactions one after
/// another, a restore of a revision older than the last one kept, a restore in a fork
/// (whose walk goes on into its parent's graph), reads of past revisions, and the same
/// after a reopen (an empty cache) give exactly what an engine without the cache gives,
/// whose every walk goes back to the session's creation.
#[test]
fn restores_through_kept_lists_give_what_walks_from_the_creation_give() {
    /// Runs the same commands on `engine`; returns every revision restored to, with the
    /// transcript right after, and the transcripts read at past revisions.
    fn run(db: &Db, engine: Engine, reopen: &dyn Fn(&Db) -> Engine) -> Vec<(RevisionId, Vec<ContentId>)> {
        let mut seen = Vec::new();
        let (s, r0) = create(&engine, &[Message::system("sys")]);
        let mut h = commit_turns(&engine, s, "a", 30, r0);
        let first = h;
        let mut restored = Vec::new();
        for round in 0..4 {
            let len = head(&engine, s).message_count;
            let summary = vec![Message::system(format!("summary {round}"))];
            let compacted =
                engine.rewrite(rewrite(s, h, 1, len - 2, summary, RewriteReason::Compaction)).unwrap().revision;
            h = engine.restore(restore(s, compacted, h)).unwrap().revision;
            restored.push(h);
            seen.push((h, transcript_ids(&engine, s)));
            h = commit_turns(&engine, s, &format!("b{round}-"), 10, h);
        }
        // Older than every kept list.
        h = engine.restore(restore(s, h, first)).unwrap().revision;
        seen.push((h, transcript_ids(&engine, s)));
        h = engine.restore(restore(s, h, restored[2])).unwrap().revision;
        seen.push((h, transcript_ids(&engine, s)));
        // A fork, compacted and restored: the walk goes into the parent's graph.
        let fork = engine.fork_at(s, 20).unwrap();
        let f = commit_turns(&engine, fork.session, "f", 5, fork.receipt.revision);
        let len = head(&engine, fork.session).message_count;
        let summary = vec![Message::system("fork summary")];
        let compacted =
            engine.rewrite(rewrite(fork.session, f, 1, len - 1, summary, RewriteReason::Compaction)).unwrap().revision;
        let back = engine.restore(restore(fork.session, compacted, f)).unwrap().revision;
        seen.push((back, transcript_ids(&engine, fork.session)));
        let past = |engine: &Engine, session, revision| (revision, transcript_ids_at(engine, session, revision));
        for &r in &restored {
            seen.push(past(&engine, s, r));
        }
        engine.close().unwrap();
        let engine = reopen(db);
        h = engine.restore(restore(s, h, restored[3])).unwrap().revision;
        seen.push((h, transcript_ids(&engine, s)));
        h = engine.restore(restore(s, h, restored[1])).unwrap().revision;
        seen.push((h, transcript_ids(&engine, s)));
        seen.push(past(&engine, fork.session, f));
        engine.close().unwrap();
        seen
    }
    let bare_options = || Options { durability: Durability::Relaxed, content_cache_bytes: 0, ..Options::default() };
    let (cached, bare) = (Db::new(), Db::new());
    let with_cache = run(&cached, cached.open(), &|db| db.open());
    let without = run(&bare, Engine::open_with(&bare.path, bare_options()).unwrap(), &|db| {
        Engine::open_with(&db.path, bare_options()).unwrap()
    });
    assert_eq!(with_cache.len(), 14);
    assert_eq!(with_cache, without);
    // Each restored transcript hashes to the revision it was restored to.
    for (revision, ids) in &with_cache {
        assert_eq!(RevisionId::of(ids), *revision);
    }
}

/// An engine keeps the list of every revision a walk over the recipes rebuilt (a
/// restore, a read of a past revision) in its content cache's share, and so does a
/// read-only opener beside it, in a cache of ids alone; the next walk that reaches the
/// revision stops there. An engine opened without a content cache keeps none.
#[test]
fn engines_and_readers_keep_the_revisions_their_walks_rebuilt() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, r0) = create(&engine, &[Message::system("sys")]);
    let middle = commit_turns(&engine, s, "a", 10, r0);
    let head = commit_turns(&engine, s, "b", 10, middle);
    let at = |reader: &Reader, revision| transcript_ids_at(reader, s, revision);
    let kept = |reader: &Reader, revision: RevisionId| reader.snapshot().unwrap().cached_revision(&revision);

    let beside = Reader::open(&db.path, Limits::default(), None).unwrap();
    assert_eq!(kept(&beside, middle), None);
    let ids = at(&beside, middle);
    assert_eq!(ids.len(), 21);
    assert_eq!(kept(&beside, middle).as_deref(), Some(&ids[..]));
    assert_eq!(at(&beside, middle), ids);
    // The engine's own.
    assert_eq!(kept(engine.reader(), middle), None);
    assert_eq!(at(engine.reader(), middle), ids);
    assert_eq!(kept(engine.reader(), middle).as_deref(), Some(&ids[..]));
    // A restore keeps its target's.
    let compacted = engine
        .rewrite(rewrite(s, head, 1, 40, vec![Message::system("summary")], RewriteReason::Compaction))
        .unwrap()
        .revision;
    engine.restore(restore(s, compacted, head)).unwrap();
    let whole = transcript_ids(engine.reader(), s);
    assert_eq!(kept(engine.reader(), head).as_deref(), Some(&whole[..]));
    engine.close().unwrap();

    let engine = Engine::open_with(&db.path, Options { content_cache_bytes: 0, ..Options::default() }).unwrap();
    assert_eq!(at(engine.reader(), middle), ids);
    assert_eq!(kept(engine.reader(), middle), None);
}

/// A page of a session's unsettled tool operations is the slice of them all at its
/// offset, in call order, and says whether more follow; settled ones are not in it.
#[test]
fn unsettled_operations_page_in_call_order() {
    let db = Db::new();
    let engine = db.open();
    let (s, _) = create(&engine, &[Message::system("sys")]);
    for i in 0..6 {
        engine.record_tool_call(tool_call(s, &format!("op{i}"), "bash", "ls")).unwrap();
    }
    engine.record_tool_result(tool_result(s, "op1", "done")).unwrap();
    let all = engine.unsettled(s).unwrap();
    let ids = |ops: &[ToolOp]| ops.iter().map(|o| o.op_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&all), ["op0", "op2", "op3", "op4", "op5"]);
    let page = engine.unsettled_page(s, PageRequest::new(1, 2)).unwrap();
    assert_eq!((ids(&page.items), page.has_more), (ids(&all[1..3]), true));
    let last = engine.unsettled_page(s, PageRequest::new(3, 2)).unwrap();
    assert_eq!((ids(&last.items), last.has_more), (ids(&all[3..]), false));
    assert!(engine.unsettled_page(s, PageRequest::new(9, 2)).unwrap().items.is_empty());
}
