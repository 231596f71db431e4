//! Execution leases with fencing tokens: grants, takeovers, renewals, releases, fenced
//! commands, restarts, and a race of sixteen workers.

mod common;

use annal::codec::Event;
use annal::*;
use common::*;
use std::sync::Arc;
use std::time::Duration;

const START_MS: u64 = 1_767_225_600_000;

fn open_at(db: &Db, clock: &ManualClock) -> Engine {
    let options = Options { durability: Durability::Relaxed, clock: Arc::new(clock.clone()), ..Options::default() };
    Engine::open_with(&db.path, options).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_live_lease_excludes_others_and_a_takeover_after_expiry_issues_a_larger_token() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, _) = create(&engine, &[]);
    assert_eq!(engine.lease(s).unwrap(), None);

    let a = engine.acquire_lease(s, "worker-a", ms(1000)).unwrap();
    assert_eq!((a.token, a.expires_at_ms, a.owner.as_str()), (1, START_MS + 1000, "worker-a"));
    assert_eq!(
        rejected(engine.acquire_lease(s, "worker-b", ms(1000))),
        Rejection::Busy { holder: "worker-a".into(), expires_at_ms: START_MS + 1000 }
    );
    clock.advance(999);
    assert!(matches!(rejected(engine.acquire_lease(s, "worker-b", ms(1000))), Rejection::Busy { .. }));
    clock.advance(1);
    let b = engine.acquire_lease(s, "worker-b", ms(1000)).unwrap();
    assert_eq!(b.token, 2, "a takeover issues a larger token");
    assert_eq!(engine.lease(s).unwrap().unwrap().owner, "worker-b");

    // The old holder is fenced: its command writes nothing.
    let tip = tip_seq(&engine);
    let late = engine.fenced(a.fence()).commit_turn(turn(s, "late", head(&engine, s).revision));
    assert_eq!(rejected(late), Rejection::Fenced { presented: 1, current: 2 });
    assert_eq!(tip_seq(&engine), tip);
    // The new holder's commands land.
    engine.fenced(b.fence()).commit_turn(turn(s, "t1", head(&engine, s).revision)).unwrap();
    // A token never issued is refused too.
    let never = Fence::new(s, 3);
    assert_eq!(rejected(engine.fenced(never).archive(s, "x")), Rejection::Fenced { presented: 3, current: 2 });
    // Without a fence a command is accepted as before.
    engine.append_context(context(s, "k", "ctx")).unwrap();

    let kinds: Vec<_> = session_events(&engine, s).iter().map(|e| e.record.event.kind()).collect();
    assert_eq!(
        kinds,
        [
            codec::EventKind::SessionCreated,
            codec::EventKind::LeaseAcquired,
            codec::EventKind::LeaseAcquired,
            codec::EventKind::TurnCommitted,
            codec::EventKind::ContextAppended
        ]
    );
}

#[test]
fn a_stale_token_is_fenced_after_a_restart_and_tokens_never_repeat() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, _) = create(&engine, &[]);
    let first = engine.acquire_lease(s, "a", ms(50)).unwrap();
    clock.advance(60);
    let second = engine.acquire_lease(s, "b", ms(50)).unwrap();
    engine.close().unwrap();

    // Reopen (the projections file deleted too: the tokens come back from the log).
    std::fs::remove_file(projections_path(&db.path)).unwrap();
    let engine = open_at(&db, &clock);
    assert_eq!(engine.lease(s).unwrap().unwrap().token, second.token);
    let stale = engine.fenced(first.fence()).set_labels(SetLabels {
        session: s,
        set: [("k".to_string(), "v".to_string())].into(),
        remove: Default::default(),
    });
    assert_eq!(rejected(stale), Rejection::Fenced { presented: 1, current: 2 });
    clock.advance(60);
    let third = engine.acquire_lease(s, "a", ms(50)).unwrap();
    assert_eq!(third.token, 3, "tokens keep growing across restarts");
    assert_eq!(
        rejected(engine.fenced(second.fence()).archive(s, "stalled")),
        Rejection::Fenced { presented: 2, current: 3 }
    );
}

#[test]
fn renewals_extend_a_lease_in_memory_and_a_restart_forgets_them() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, _) = create(&engine, &[]);
    let lease = engine.acquire_lease(s, "a", ms(100)).unwrap();
    let tip = tip_seq(&engine);
    clock.advance(80);
    let renewed = engine.renew_lease(&lease, ms(100)).unwrap();
    assert_eq!((renewed.token, renewed.expires_at_ms), (1, START_MS + 180));
    assert_eq!(tip_seq(&engine), tip, "a renewal writes nothing");
    assert_eq!(engine.lease(s).unwrap().unwrap().expires_at_ms, START_MS + 180);
    // The holder asking again renews too, keeping its token.
    clock.advance(50);
    let again = engine.acquire_lease(s, "a", ms(100)).unwrap();
    assert_eq!((again.token, again.expires_at_ms), (1, START_MS + 230));
    assert_eq!(tip_seq(&engine), tip);
    clock.advance(60);
    assert!(matches!(rejected(engine.acquire_lease(s, "b", ms(100))), Rejection::Busy { .. }));
    // A head read shows the grant as the log records it.
    assert_eq!(head(&engine, s).lease.unwrap().expires_at_ms, START_MS + 100);

    // After a restart the lease expires when its grant said.
    engine.close().unwrap();
    let engine = open_at(&db, &clock);
    assert_eq!(engine.lease(s).unwrap().unwrap().expires_at_ms, START_MS + 100);
    let b = engine.acquire_lease(s, "b", ms(100)).unwrap();
    assert_eq!(b.token, 2);
    assert_eq!(rejected(engine.renew_lease(&lease, ms(100))), Rejection::Fenced { presented: 1, current: 2 });
}

#[test]
fn release_lets_another_owner_in_at_once() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, _) = create(&engine, &[]);
    let a = engine.acquire_lease(s, "a", ms(10_000)).unwrap();
    assert!(engine.release_lease(&a).unwrap());
    assert!(!engine.release_lease(&a).unwrap(), "a second release writes nothing");
    assert!(engine.lease(s).unwrap().unwrap().released);
    let released = rejected(engine.renew_lease(&a, ms(10)));
    assert_eq!(released, Rejection::Fenced { presented: 1, current: 1 });
    assert_eq!(released.to_string(), "fenced: lease token 1 was released");
    let b = engine.acquire_lease(s, "b", ms(10_000)).unwrap();
    assert_eq!(b.token, 2);
    let stale = rejected(engine.release_lease(&a));
    assert_eq!(stale, Rejection::Fenced { presented: 1, current: 2 });
    assert_eq!(stale.to_string(), "fenced: token 1 is not the session's current lease token 2");
    let events = session_events(&engine, s);
    assert!(matches!(events[2].record.event, Event::LeaseReleased(ref e) if e.token == 1));
}

#[test]
fn bad_lease_requests_get_typed_errors_and_write_nothing() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, _) = create(&engine, &[]);
    let tip = tip_seq(&engine);
    assert!(matches!(rejected(engine.acquire_lease(s, "a", ms(0))), Rejection::InvalidRequest { .. }));
    let too_long = Duration::from_millis(LEASE_TTL_MS_MAX + 1);
    assert!(matches!(rejected(engine.acquire_lease(s, "a", too_long)), Rejection::InvalidRequest { .. }));
    assert!(matches!(rejected(engine.acquire_lease(s, "", ms(10))), Rejection::InvalidRequest { .. }));
    assert!(matches!(
        rejected(engine.acquire_lease(s, "x".repeat(300), ms(10))),
        Rejection::LimitExceeded { limit: Limit::IdBytes, .. }
    ));
    let nobody = new_session_id();
    assert_eq!(rejected(engine.acquire_lease(nobody, "a", ms(10))), Rejection::NotFound { session: nobody });
    assert_eq!(rejected(engine.fenced(Fence::new(nobody, 1)).archive(s, "x")), Rejection::NotFound { session: nobody });
    // Acquisitions and renewals run alone, not in a batch.
    let in_batch =
        engine.batch(vec![Command::AcquireLease(AcquireLease { session: s, owner: "a".into(), ttl_ms: 10 })]);
    assert!(matches!(rejected(in_batch), Rejection::Batch { index: 0, .. }));
    engine.archive(s, "done").unwrap();
    assert_eq!(tip_seq(&engine), tip + 1);
    assert_eq!(rejected(engine.acquire_lease(s, "a", ms(10))), Rejection::Archived { session: s });
}

#[test]
fn a_fenced_batch_and_a_fenced_fork_check_the_fence_once_for_all() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, rev) = create(&engine, &[Message::user("hi")]);
    let lease = engine.acquire_lease(s, "a", ms(1000)).unwrap();
    let fenced = engine.fenced(lease.fence());
    assert_eq!(fenced.fence(), Some(lease.fence()));
    let outcomes = fenced
        .batch(vec![
            Command::CommitTurn(turn(s, "t1", rev).message(Message::assistant("a"))),
            Command::AppendContext(context(s, "k", "ctx")),
        ])
        .unwrap();
    assert_eq!(outcomes.len(), 2);
    // A fork is fenced on its parent's lease.
    let child = fenced.fork_at(s, 1).unwrap().session;
    assert_eq!(head(&engine, child).message_count, 1);
    clock.advance(2000);
    engine.acquire_lease(s, "b", ms(1000)).unwrap();
    let tip = tip_seq(&engine);
    assert!(matches!(rejected(fenced.fork_at(s, 1)), Rejection::Fenced { presented: 1, current: 2 }));
    assert!(matches!(
        rejected(fenced.batch(vec![Command::AppendContext(context(s, "k2", "more"))])),
        Rejection::Fenced { .. }
    ));
    assert_eq!(tip_seq(&engine), tip);
}

/// Sixteen workers race for one session's lease on the system clock, each committing
/// turns fenced with its token, and some stalling past their lease. In the log, every
/// turn lies between the grant of its token and the next grant: no command of a fenced
/// worker landed after a takeover.
#[test]
fn sixteen_workers_race_and_no_fenced_command_lands() {
    let db = Db::new();
    let engine = db.open();
    let (s, _) = create(&engine, &[]);
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut landed = 0u32;
                let mut fenced = 0u32;
                for round in 0..6 {
                    let lease = loop {
                        match engine.acquire_lease(s, format!("w{w}"), ms(15)) {
                            Ok(lease) => break lease,
                            Err(Error::Rejected(Rejection::Busy { .. })) => std::thread::sleep(ms(1)),
                            Err(e) => panic!("acquire: {e}"),
                        }
                    };
                    let handle = engine.fenced(lease.fence());
                    for n in 0..4 {
                        if (w + round + n) % 7 == 0 {
                            // Stall past the lease: another worker may take over.
                            std::thread::sleep(ms(20));
                        }
                        let id = format!("w{w}-k{}-r{round}-n{n}", lease.token);
                        let t = CommitTurn::new(s, id, Expected::Any).message(Message::assistant("x"));
                        match handle.commit_turn(t) {
                            Ok(_) => landed += 1,
                            Err(Error::Rejected(Rejection::Fenced { presented, current })) => {
                                assert!(presented < current);
                                fenced += 1;
                                break;
                            }
                            Err(e) => panic!("commit: {e}"),
                        }
                    }
                    let _ = engine.release_lease(&lease);
                }
                (landed, fenced)
            })
        })
        .collect();
    let (mut landed, mut fenced) = (0, 0);
    for w in workers {
        let (l, f) = w.join().unwrap();
        landed += l;
        fenced += f;
    }
    assert!(landed > 0);
    let mut current = 0u64;
    let mut turns = 0;
    for e in session_events(&engine, s) {
        match &e.record.event {
            Event::LeaseAcquired(g) => {
                assert_eq!(g.token, current + 1, "tokens grow by one");
                current = g.token;
            }
            Event::TurnCommitted(t) => {
                let token: u64 = t.turn_id.split('-').nth(1).unwrap()[1..].parse().unwrap();
                assert_eq!(token, current, "turn {} landed under token {current}", t.turn_id);
                turns += 1;
            }
            _ => {}
        }
    }
    assert_eq!(turns, landed);
    println!("16 workers: {landed} turns landed, {fenced} fenced, {current} grants");
}

/// A fenced handle fences the async twins too.
#[test]
fn a_fenced_handle_fences_the_async_twins() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, _) = create(&engine, &[]);
    let old = engine.acquire_lease(s, "a", ms(10)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let worker = engine.fenced(old.fence());
        let first = CommitTurn::new(s, "t1", Expected::Any).message(Message::user("hi"));
        worker.commit_turn_async(first).await.unwrap();
        clock.advance(20);
        let new = engine.acquire_lease_async(s, "b", ms(10)).await.unwrap();
        assert_eq!(new.token, 2);
        let tip = tip_seq(&engine);
        let late = CommitTurn::new(s, "t2", Expected::Any).message(Message::user("late"));
        assert!(matches!(
            worker.commit_turn_async(late).await,
            Err(Error::Rejected(Rejection::Fenced { presented: 1, current: 2 }))
        ));
        assert!(matches!(worker.append_draft_async(s, "d", "x").await, Err(Error::Rejected(Rejection::Fenced { .. }))));
        assert_eq!(tip_seq(&engine), tip);
    });
}
