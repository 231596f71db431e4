//! The per-session input inbox: queued user input, claims fenced by the execution lease,
//! completion by the consuming turn, abandon and cancel, and claims across a power loss.

mod common;

use annal::fault::disk::SimDisk;
use annal::*;
use common::*;
use std::sync::Arc;
use std::time::Duration;

const START_MS: u64 = 1_767_225_600_000;

fn open_at(db: &Db, clock: &ManualClock) -> Engine {
    let options = Options { durability: Durability::Relaxed, clock: Arc::new(clock.clone()), ..Options::default() };
    Engine::open_with(&db.path, options).unwrap()
}

fn claim(session: SessionId, lease: &Lease, target: ClaimTarget, ttl_ms: u64) -> ClaimInputs {
    ClaimInputs { session, token: lease.token, owner: lease.owner.clone(), target, ttl_ms, max: 10 }
}

fn ids(inputs: &[QueuedInput]) -> Vec<&str> {
    inputs.iter().map(|i| i.input_id.as_str()).collect()
}

#[test]
fn enqueue_is_idempotent_by_input_id_and_a_claim_survives_a_power_loss_until_it_expires() {
    let disk = SimDisk::new(3);
    let clock = ManualClock::new(START_MS);
    let options = Options { clock: Arc::new(clock.clone()), ..Options::default() };
    let open = || Engine::open_with_backends(disk.file("log"), disk.file("projections"), options.clone()).unwrap();
    let engine = open();
    let s = engine.create_session(CreateSession::new()).unwrap().session;
    let msg = Message::user("also check the tests");
    let first = engine.enqueue_input(s, "in-1", msg.clone(), InputKind::NextTurn).unwrap();
    assert!(first.is_some());
    assert_eq!(engine.enqueue_input(s, "in-1", msg.clone(), InputKind::NextTurn).unwrap(), None, "an exact retry");
    assert_eq!(
        rejected(engine.enqueue_input(s, "in-1", Message::user("other"), InputKind::NextTurn)),
        Rejection::InputConflict { input_id: "in-1".into() }
    );
    assert_eq!(
        rejected(engine.enqueue_input(s, "in-1", msg.clone(), InputKind::ActiveTurn)),
        Rejection::InputConflict { input_id: "in-1".into() }
    );
    engine.enqueue_input(s, "in-2", Message::user("and the docs"), InputKind::NextTurn).unwrap();
    assert_eq!(ids(&engine.pending_inputs(s).unwrap()), ["in-1", "in-2"]);
    assert_eq!(engine.pending_inputs(s).unwrap()[0].message.body, b"also check the tests");

    let lease = engine.acquire_lease(s, "worker", Duration::from_secs(60)).unwrap();
    let taken = engine.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 1000)).unwrap();
    assert_eq!(taken.inputs, ["in-1", "in-2"]);
    assert_eq!(taken.expires_at_ms, START_MS + 1000);
    assert!(engine.pending_inputs(s).unwrap().is_empty());

    // The power goes; the claim was durable.
    disk.lose_power();
    drop(engine);
    disk.forget_detached();
    let engine = open();
    assert!(engine.pending_inputs(s).unwrap().is_empty(), "the claim is still held");
    assert_eq!(engine.inbox(s).unwrap().len(), 2);
    clock.advance(999);
    assert!(engine.pending_inputs(s).unwrap().is_empty());
    clock.advance(1);
    assert_eq!(ids(&engine.pending_inputs(s).unwrap()), ["in-1", "in-2"], "an expired claim lets its inputs go");
    let again = engine.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 1000)).unwrap();
    assert_eq!(again.inputs, ["in-1", "in-2"]);
    assert_ne!(again.claim, taken.claim);
    let old = engine.claim(s, taken.claim.unwrap()).unwrap().unwrap();
    assert!(!old.open, "a claim whose inputs were all taken again is closed");
}

#[test]
fn a_claim_with_a_stale_fence_is_refused_and_writes_nothing() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, _) = create(&engine, &[]);
    engine.enqueue_input(s, "in-1", Message::user("x"), InputKind::NextTurn).unwrap();
    let old = engine.acquire_lease(s, "a", Duration::from_millis(10)).unwrap();
    clock.advance(20);
    let new = engine.acquire_lease(s, "b", Duration::from_millis(10)).unwrap();
    let tip = tip_seq(&engine);
    assert_eq!(
        rejected(engine.claim_inputs(claim(s, &old, ClaimTarget::NextTurn, 100))),
        Rejection::Fenced { presented: old.token, current: new.token }
    );
    let none = ClaimInputs { token: 0, ..claim(s, &new, ClaimTarget::NextTurn, 100) };
    assert!(matches!(rejected(engine.claim_inputs(none)), Rejection::Fenced { presented: 0, .. }));
    assert_eq!(tip_seq(&engine), tip);
    assert_eq!(engine.claim_inputs(claim(s, &new, ClaimTarget::NextTurn, 100)).unwrap().inputs, ["in-1"]);
}

#[test]
fn a_turn_completes_its_claimed_inputs_atomically() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, rev) = create(&engine, &[]);
    engine.enqueue_input(s, "q1", Message::user("what is 2+2?"), InputKind::NextTurn).unwrap();
    engine.enqueue_input(s, "q2", Message::user("and 3+3?"), InputKind::NextTurn).unwrap();
    let lease = engine.acquire_lease(s, "w", Duration::from_secs(60)).unwrap();
    let worker = engine.fenced(lease.fence());
    let taken = worker.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 5_000)).unwrap();
    assert_eq!(taken.inputs, ["q1", "q2"]);

    // Consuming an input that is not claimed fails the whole turn.
    engine.enqueue_input(s, "q3", Message::user("later"), InputKind::NextTurn).unwrap();
    let bad = turn(s, "t1", rev).message(Message::assistant("4, 6")).consumes("q1").consumes("q3");
    assert_eq!(rejected(worker.commit_turn(bad)), Rejection::InputState { input_id: "q3".into(), state: "pending" });
    let unknown = turn(s, "t1", rev).message(Message::assistant("4, 6")).consumes("nope");
    assert_eq!(rejected(worker.commit_turn(unknown)), Rejection::UnknownInput { input_id: "nope".into() });
    assert_eq!(engine.input(s, "q1").unwrap().unwrap().state.name(), "claimed");

    let t = turn(s, "t1", rev).message(Message::user("what is 2+2? and 3+3?")).message(Message::assistant("4, 6"));
    let t = t.consumes("q1").consumes("q2");
    let receipt = worker.commit_turn(t.clone()).unwrap().receipt();
    for id in ["q1", "q2"] {
        let row = engine.input(s, id).unwrap().unwrap();
        assert_eq!(row.state, InputState::Completed { turn_id: "t1".into(), seq: receipt.seq });
    }
    assert_eq!(ids(&engine.inbox(s).unwrap()), ["q3"]);
    assert!(!engine.claim(s, taken.claim.unwrap()).unwrap().unwrap().open);
    // One event: the turn names the inputs it consumed.
    let last = session_events(&engine, s).pop().unwrap();
    assert!(matches!(last.record.event, Event::TurnCommitted(ref e) if e.inputs == ["q1", "q2"]));
    // A retry answers as one; other inputs with the same turn id are a conflict.
    assert!(matches!(worker.commit_turn(t).unwrap(), TurnOutcome::AlreadyCommitted(_)));
    let other = turn(s, "t1", rev).message(Message::user("what is 2+2? and 3+3?")).message(Message::assistant("4, 6"));
    assert_eq!(rejected(worker.commit_turn(other.consumes("q1"))), Rejection::TurnConflict { turn_id: "t1".into() });
    // Completed inputs cannot be cancelled or claimed.
    assert_eq!(
        rejected(engine.cancel_input(s, "q1")),
        Rejection::InputState { input_id: "q1".into(), state: "completed" }
    );
}

#[test]
fn an_abandoned_claim_is_claimable_again_and_cancel_takes_only_unclaimed_inputs() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, _) = create(&engine, &[]);
    for id in ["a", "b", "c"] {
        engine.enqueue_input(s, id, Message::user(id), InputKind::NextTurn).unwrap();
    }
    let lease = engine.acquire_lease(s, "w", Duration::from_secs(60)).unwrap();
    let taken = engine.claim_inputs(ClaimInputs { max: 2, ..claim(s, &lease, ClaimTarget::NextTurn, 60_000) }).unwrap();
    assert_eq!(taken.inputs, ["a", "b"]);
    assert_eq!(ids(&engine.pending_inputs(s).unwrap()), ["c"]);
    assert_eq!(rejected(engine.cancel_input(s, "a")), Rejection::InputState { input_id: "a".into(), state: "claimed" });
    assert!(engine.cancel_input(s, "c").unwrap());
    assert!(!engine.cancel_input(s, "c").unwrap(), "cancelled already");
    assert!(engine.abandon_claim(s, taken.claim.unwrap()).unwrap());
    assert!(!engine.abandon_claim(s, taken.claim.unwrap()).unwrap(), "abandoned already");
    assert_eq!(rejected(engine.abandon_claim(s, 999)), Rejection::UnknownClaim { claim: 999 });
    assert_eq!(ids(&engine.pending_inputs(s).unwrap()), ["a", "b"]);
    let again = engine.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 60_000)).unwrap();
    assert_eq!(again.inputs, ["a", "b"]);
    // Nothing left to claim: no event.
    let tip = tip_seq(&engine);
    let nothing = engine.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 60_000)).unwrap();
    assert_eq!((nothing.claim, nothing.inputs.len()), (None, 0));
    assert_eq!(tip_seq(&engine), tip);
}

#[test]
fn active_turn_inputs_go_to_the_live_turn_and_next_turn_inputs_wait_until_the_session_is_idle() {
    let db = Db::new();
    let clock = ManualClock::new(START_MS);
    let engine = open_at(&db, &clock);
    let (s, rev) = create(&engine, &[]);
    let lease = engine.acquire_lease(s, "w", Duration::from_secs(60)).unwrap();
    engine.enqueue_input(s, "now", Message::user("stop, use file B"), InputKind::ActiveTurn).unwrap();
    engine.enqueue_input(s, "next", Message::user("then summarise"), InputKind::NextTurn).unwrap();
    // The running turn t1 claims the active-turn input at a checkpoint.
    let live = engine.claim_inputs(claim(s, &lease, ClaimTarget::Turn("t1".into()), 10_000)).unwrap();
    assert_eq!(live.inputs, ["now"]);
    // While t1 holds a live claim, the session is not idle.
    assert_eq!(
        rejected(engine.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 10_000))),
        Rejection::NotIdle { turn_id: "t1".into() }
    );
    engine.commit_turn(turn(s, "t1", rev).message(Message::assistant("used file B")).consumes("now")).unwrap();
    // t1 is committed: no active-turn claim for it any more; the session is idle.
    assert_eq!(
        rejected(engine.claim_inputs(claim(s, &lease, ClaimTarget::Turn("t1".into()), 10_000))),
        Rejection::TurnNotLive { turn_id: "t1".into() }
    );
    let next = engine.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 10_000)).unwrap();
    assert_eq!(next.inputs, ["next"]);
    // A live turn's claim that expired does not keep the session busy.
    engine.enqueue_input(s, "now-2", Message::user("one more"), InputKind::ActiveTurn).unwrap();
    engine.enqueue_input(s, "next-2", Message::user("after"), InputKind::NextTurn).unwrap();
    engine.claim_inputs(claim(s, &lease, ClaimTarget::Turn("t2".into()), 100)).unwrap();
    assert!(matches!(
        rejected(engine.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 100))),
        Rejection::NotIdle { .. }
    ));
    clock.advance(100);
    assert_eq!(engine.claim_inputs(claim(s, &lease, ClaimTarget::NextTurn, 100)).unwrap().inputs, ["next-2"]);
}

#[test]
fn inbox_limits_and_bad_requests_get_typed_errors() {
    let db = Db::new();
    let engine = db.open_limits(Limits { inbox_inputs_max: 2, ..Limits::default() });
    let (s, _) = create(&engine, &[]);
    engine.enqueue_input(s, "a", Message::user("a"), InputKind::NextTurn).unwrap();
    engine.enqueue_input(s, "b", Message::user("b"), InputKind::NextTurn).unwrap();
    assert_eq!(
        rejected(engine.enqueue_input(s, "c", Message::user("c"), InputKind::NextTurn)),
        Rejection::LimitExceeded { limit: Limit::InboxInputs, actual: 3, max: 2 }
    );
    engine.cancel_input(s, "a").unwrap();
    engine.enqueue_input(s, "c", Message::user("c"), InputKind::NextTurn).unwrap();
    assert!(matches!(
        rejected(engine.enqueue_input(s, "", Message::user("x"), InputKind::NextTurn)),
        Rejection::InvalidRequest { .. }
    ));
    let lease = engine.acquire_lease(s, "w", Duration::from_secs(60)).unwrap();
    let zero = ClaimInputs { max: 0, ..claim(s, &lease, ClaimTarget::NextTurn, 100) };
    assert!(matches!(rejected(engine.claim_inputs(zero)), Rejection::InvalidRequest { .. }));
    let no_ttl = claim(s, &lease, ClaimTarget::NextTurn, 0);
    assert!(
        matches!(rejected(engine.claim_inputs(no_ttl)), Rejection::InvalidRequest { reason } if reason.starts_with("claim ttl 0 ms"))
    );
    assert_eq!(rejected(engine.cancel_input(s, "zz")), Rejection::UnknownInput { input_id: "zz".into() });
    engine.archive(s, "done").unwrap();
    assert_eq!(
        rejected(engine.enqueue_input(s, "d", Message::user("d"), InputKind::NextTurn)),
        Rejection::Archived { session: s }
    );
    // An exact retry answers as one on an archived session too.
    assert_eq!(engine.enqueue_input(s, "c", Message::user("c"), InputKind::NextTurn).unwrap(), None);
}
