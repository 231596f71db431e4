//! S18 and SPEC §9: many threads calling one engine. Concurrent commits to one head are
//! serialized by the writer, so exactly one wins each revision and the others get
//! `RevisionConflict` with the actual head; nothing is lost or duplicated.

mod common;

use annal::*;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Barrier, Mutex};

const THREADS: usize = 16;

/// A committed turn as its caller saw it.
#[derive(Clone, Debug)]
struct Win {
    session: SessionId,
    turn_id: String,
    parent: RevisionId,
    receipt: Receipt,
}

/// Every receipt is in the log at its seq, in the right session, with its turn and
/// revision; the log is dense; and nothing else is in it beyond `other_events`.
fn assert_receipts_in_log(engine: &Engine, wins: &[Win], other_events: usize) {
    let events = all_events(engine);
    let seqs: Vec<u64> = events.iter().map(|e| e.record.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "the log is dense");
    assert_eq!(events.len(), wins.len() + other_events, "no commit lost or duplicated");
    let by_seq: BTreeMap<u64, &StoredEvent> = events.iter().map(|e| (e.record.seq, e)).collect();
    let distinct: BTreeSet<u64> = wins.iter().map(|w| w.receipt.seq).collect();
    assert_eq!(distinct.len(), wins.len(), "two receipts share a seq");
    for w in wins {
        let record = &by_seq[&w.receipt.seq].record;
        assert_eq!(record.session, w.session);
        assert_eq!(record.committed_at_ms, w.receipt.committed_at_ms);
        match &record.event {
            Event::TurnCommitted(e) => {
                assert_eq!((e.turn_id.as_str(), e.revision_after), (w.turn_id.as_str(), w.receipt.revision));
            }
            other => panic!("seq {} holds {other:?}", w.receipt.seq),
        }
    }
    for session in wins.iter().map(|w| w.session).collect::<BTreeSet<_>>() {
        let streams: Vec<u64> = session_events(engine, session).iter().map(|e| e.record.stream_seq).collect();
        assert_eq!(streams, (1..=streams.len() as u64).collect::<Vec<_>>(), "stream of {session}");
    }
}

/// (round, expected revision, outcome, turn id) of one commit attempt.
type Attempt = (usize, RevisionId, Result<TurnOutcome>, String);

#[test]
fn s18_sixteen_threads_race_on_one_head_and_exactly_one_wins_each_round() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    const ROUNDS: usize = 10;
    let barrier = Barrier::new(THREADS);
    let results: Mutex<Vec<Attempt>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, barrier, results) = (&engine, &barrier, &results);
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    // Everyone reads the head of this round before anyone commits.
                    barrier.wait();
                    let expected = head(engine, s).revision;
                    barrier.wait();
                    let turn_id = format!("r{round}-t{t}");
                    let outcome = engine.commit_turn(turn(s, &turn_id, expected));
                    results.lock().unwrap().push((round, expected, outcome, turn_id));
                    barrier.wait();
                }
            });
        }
    });

    let results = results.into_inner().unwrap();
    assert_eq!(results.len(), THREADS * ROUNDS);
    let mut wins = Vec::new();
    let mut parent = rev0;
    for round in 0..ROUNDS {
        let this: Vec<_> = results.iter().filter(|r| r.0 == round).collect();
        assert!(this.iter().all(|r| r.1 == parent), "round {round} read a stale head");
        let won: Vec<Win> = this
            .iter()
            .filter_map(|(_, expected, outcome, turn_id)| match outcome {
                Ok(TurnOutcome::Committed(receipt)) => {
                    Some(Win { session: s, turn_id: turn_id.clone(), parent: *expected, receipt: *receipt })
                }
                _ => None,
            })
            .collect();
        assert_eq!(won.len(), 1, "round {round}: exactly one winner");
        let winner = won[0].receipt.revision;
        for (_, expected, outcome, _) in this.iter().filter(|r| r.3 != won[0].turn_id) {
            match outcome {
                Err(Error::Rejected(Rejection::RevisionConflict { expected: e, actual })) => {
                    assert_eq!((*e, *actual), (*expected, winner), "round {round}: the loser sees the actual head");
                }
                other => panic!("round {round}: a loser got {other:?}"),
            }
        }
        parent = winner;
        wins.extend(won);
    }
    let h = head(&engine, s);
    assert_eq!((h.revision, h.message_count), (parent, 1 + 2 * ROUNDS as u64));
    assert_eq!(engine.revisions(s, PageRequest::first(100)).unwrap().total, 1 + ROUNDS as u64);
    assert_receipts_in_log(&engine, &wins, 1);
}

#[test]
fn s18_free_running_race_on_one_head_builds_one_chain() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    const WINS_MAX: usize = 64;
    let wins: Mutex<Vec<Win>> = Mutex::new(Vec::new());
    let conflicts: Mutex<Vec<(RevisionId, RevisionId)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, wins, conflicts) = (&engine, &wins, &conflicts);
            scope.spawn(move || {
                for attempt in 0.. {
                    if wins.lock().unwrap().len() >= WINS_MAX {
                        return;
                    }
                    let expected = head(engine, s).revision;
                    let turn_id = format!("t{t}-{attempt}");
                    match engine.commit_turn(turn(s, &turn_id, expected)) {
                        Ok(TurnOutcome::Committed(receipt)) => {
                            wins.lock().unwrap().push(Win { session: s, turn_id, parent: expected, receipt });
                        }
                        Err(Error::Rejected(Rejection::RevisionConflict { expected: e, actual })) => {
                            assert_eq!(e, expected);
                            assert_ne!(actual, expected);
                            conflicts.lock().unwrap().push((e, actual));
                        }
                        other => panic!("thread {t}: {other:?}"),
                    }
                }
            });
        }
    });

    let mut wins = wins.into_inner().unwrap();
    wins.sort_by_key(|w| w.receipt.seq);
    assert!(wins.len() >= WINS_MAX);
    // One chain: each winner extends the previous one, so no revision had two winners.
    let mut order = vec![rev0];
    for w in &wins {
        assert_eq!(w.parent, *order.last().unwrap(), "{} did not extend the head", w.turn_id);
        order.push(w.receipt.revision);
    }
    let position: BTreeMap<RevisionId, usize> = order.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    assert_eq!(position.len(), order.len(), "a revision repeated");
    // A loser's `actual` is a later head of the same chain.
    for (expected, actual) in conflicts.into_inner().unwrap() {
        assert!(position[&actual] > position[&expected], "conflict reported a head that was not newer");
    }
    let h = head(&engine, s);
    assert_eq!((h.revision, h.message_count), (*order.last().unwrap(), 1 + 2 * wins.len() as u64));
    assert_receipts_in_log(&engine, &wins, 1);
}

#[test]
fn s18_sixteen_threads_on_their_own_sessions_lose_nothing() {
    let db = Db::new();
    let engine = db.open();
    const TURNS: usize = 15;
    let per_thread: Vec<Vec<Win>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let engine = &engine;
                scope.spawn(move || {
                    let (s, mut rev) = create(engine, &[Message::system(format!("thread {t}"))]);
                    let mut wins = Vec::new();
                    for i in 0..TURNS {
                        let turn_id = format!("t{i}");
                        let outcome = engine.commit_turn(turn(s, &turn_id, rev)).unwrap();
                        let TurnOutcome::Committed(receipt) = outcome else { panic!("{outcome:?}") };
                        wins.push(Win { session: s, turn_id, parent: rev, receipt });
                        rev = receipt.revision;
                    }
                    wins
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    for wins in &per_thread {
        // A thread's commands are applied in its order.
        assert!(wins.windows(2).all(|w| w[0].receipt.seq < w[1].receipt.seq));
        let s = wins[0].session;
        let h = head(&engine, s);
        assert_eq!((h.revision, h.message_count), (wins.last().unwrap().receipt.revision, 1 + 2 * TURNS as u64));
    }
    let all: Vec<Win> = per_thread.into_iter().flatten().collect();
    assert_eq!(all.len(), THREADS * TURNS);
    assert_receipts_in_log(&engine, &all, THREADS);
    assert_eq!(engine.list_sessions(&ListQuery::new()).unwrap().items.len(), THREADS);
}

#[test]
fn s18_sixteen_threads_appending_with_any_all_land() {
    let db = Db::new();
    let engine = db.open();
    let (s, _) = create(&engine, &[]);
    const TURNS: usize = 8;
    let wins: Mutex<Vec<Win>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, wins) = (&engine, &wins);
            scope.spawn(move || {
                for i in 0..TURNS {
                    let turn_id = format!("t{t}-{i}");
                    let c = CommitTurn::new(s, turn_id.as_str(), Expected::Any).message(Message::user(turn_id.clone()));
                    let receipt = engine.commit_turn(c).unwrap().receipt();
                    wins.lock().unwrap().push(Win { session: s, turn_id, parent: RevisionId::empty(), receipt });
                }
            });
        }
    });
    let wins = wins.into_inner().unwrap();
    assert_eq!(head(&engine, s).message_count, (THREADS * TURNS) as u64);
    assert_receipts_in_log(&engine, &wins, 1);
    // The transcript holds every message once, in commit order.
    let mut by_seq = wins.clone();
    by_seq.sort_by_key(|w| w.receipt.seq);
    let bodies: Vec<Vec<u8>> = transcript(&engine, s).into_iter().map(|m| m.message.body).collect();
    assert_eq!(bodies, by_seq.iter().map(|w| w.turn_id.clone().into_bytes()).collect::<Vec<_>>());
}

/// Concurrent rewrites of one head (each a different edit of message 0) and restores to
/// the original: exactly one rewrite wins each round and every other caller gets
/// `RevisionConflict` with the winner's revision; nothing else is written.
#[test]
fn concurrent_rewrites_on_one_head_produce_one_winner() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys"), Message::user("original")]);
    const ROUNDS: usize = 5;
    let barrier = Barrier::new(THREADS);
    let results: Mutex<Vec<(usize, RevisionId, Result<Receipt>)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, barrier, results) = (&engine, &barrier, &results);
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    barrier.wait();
                    let expected = head(engine, s).revision;
                    barrier.wait();
                    let outcome = engine.rewrite(Rewrite {
                        session: s,
                        expected,
                        start: 1,
                        end: 2,
                        replacement: vec![Message::user(format!("edit {round} by {t}"))],
                        reason: RewriteReason::Edit,
                        note: format!("thread {t}"),
                        actor: "racer".into(),
                    });
                    results.lock().unwrap().push((round, expected, outcome));
                    barrier.wait();
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    let mut parent = rev0;
    for round in 0..ROUNDS {
        let this: Vec<_> = results.iter().filter(|r| r.0 == round).collect();
        assert!(this.iter().all(|r| r.1 == parent), "round {round} read a stale head");
        let winners: Vec<Receipt> = this.iter().filter_map(|r| r.2.as_ref().ok().copied()).collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one rewrite wins");
        for r in this.iter().filter(|r| r.2.is_err()) {
            match &r.2 {
                Err(Error::Rejected(Rejection::RevisionConflict { expected, actual })) => {
                    assert_eq!((*expected, *actual), (parent, winners[0].revision));
                }
                other => panic!("round {round}: a loser got {other:?}"),
            }
        }
        parent = winners[0].revision;
    }
    let h = head(&engine, s);
    assert_eq!((h.revision, h.message_count, h.stream_seq), (parent, 2, 1 + ROUNDS as u64));
    // The original is still readable and restorable.
    let restored = engine
        .restore(Restore { session: s, expected: parent, target: rev0, note: "undo".into(), actor: "host".into() })
        .unwrap();
    assert_eq!(restored.revision, rev0);
}

/// A lone committer commits on its own thread (no hand-off to the writer thread); under
/// contention the writer's group commit takes over, and either way every reply is the
/// one the writer would give, and every query on another thread sees it at once.
#[test]
fn a_lone_committer_commits_on_its_own_thread_and_a_crowd_goes_to_the_group_commit() {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let before = engine.stats();
    let mut last = rev;
    for i in 0..20 {
        last = engine.commit_turn(turn(s, &format!("alone-{i}"), last)).unwrap().receipt().revision;
        // Read-your-writes on another thread, right after the reply.
        let seen = std::thread::scope(|sc| sc.spawn(|| engine.head(s).unwrap().unwrap().revision).join().unwrap());
        assert_eq!(seen, last);
    }
    // A retry and a conflict decided on the caller's thread get the writer's answers.
    let retry = engine.commit_turn(turn(s, "alone-19", rev)).unwrap();
    assert!(matches!(retry, TurnOutcome::AlreadyCommitted(_)), "{retry:?}");
    match engine.commit_turn(turn(s, "stale", rev)) {
        Err(Error::Rejected(Rejection::RevisionConflict { actual, .. })) => assert_eq!(actual, last),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let alone = engine.stats();
    let commits = alone.log_commits - before.log_commits;
    assert_eq!(commits, 20, "one group commit per turn");
    assert!(alone.caller_commits - before.caller_commits >= 15, "{alone:?}");

    // Sixteen committers at once: the writer thread groups them.
    let barrier = Barrier::new(THREADS);
    let sessions: Vec<SessionId> = (0..THREADS).map(|_| create(&engine, &[]).0).collect();
    let crowd = engine.stats();
    std::thread::scope(|sc| {
        for &session in &sessions {
            let (engine, barrier) = (&engine, &barrier);
            sc.spawn(move || {
                barrier.wait();
                let mut head = engine.head(session).unwrap().unwrap().revision;
                for i in 0..30 {
                    let r = engine.commit_turn(turn(session, &format!("crowd-{i}"), head)).unwrap();
                    head = r.receipt().revision;
                    assert_eq!(engine.head(session).unwrap().unwrap().revision, head, "read-your-writes");
                }
            });
        }
    });
    let after = engine.stats();
    let (commits, events) = (after.log_commits - crowd.log_commits, after.events - crowd.events);
    assert_eq!(events, (THREADS * 30) as u64, "nothing lost or duplicated");
    assert!(commits < events, "the crowd shared group commits: {commits} for {events} events");
    for &session in &sessions {
        assert_eq!(head(&engine, session).stream_seq, 31);
    }
    engine.close().unwrap();
}
