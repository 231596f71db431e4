//! Streamed partial drafts: segments in order with budgets, atomic removal by the final
//! turn, the limits, abandoned drafts after a restart, and a SIGKILL mid-stream.
//!
//! The SIGKILL test re-executes this test binary as a child (selected by
//! `ANNAL_DRAFT_CHILD`), which streams a draft into a durable database and says how far
//! it got; the parent kills it and reopens the file.

mod common;

use annal::*;
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command as Process, Stdio};
use std::time::Duration;

fn segments(d: &Draft) -> Vec<String> {
    d.segments.iter().map(|s| String::from_utf8(s.clone()).unwrap()).collect()
}

#[test]
fn segments_read_back_in_order_within_a_byte_budget() {
    let db = Db::new();
    let engine = db.open();
    let (s, _) = create(&engine, &[]);
    for (i, word) in ["The ", "answer ", "is ", "42."].iter().enumerate() {
        assert_eq!(engine.append_draft(s, "reply-1", *word).unwrap(), i as u32);
    }
    engine.append_draft(s, "aside", "hm").unwrap();
    let tip = tip_seq(&engine);
    assert_eq!(tip, 1, "drafts write no event");

    let all = engine.drafts(s, u64::MAX);
    assert_eq!(all.iter().map(|d| d.draft_id.as_str()).collect::<Vec<_>>(), ["aside", "reply-1"]);
    let reply = &all[1];
    assert_eq!(segments(reply), ["The ", "answer ", "is ", "42."]);
    assert!(reply.is_complete());
    assert_eq!((reply.total_segments, reply.total_bytes), (4, 17));

    // A budget of 12 bytes: "hm" (2), then "The " (4) and "answer " would make 13.
    let cut = engine.drafts(s, 12);
    assert_eq!(segments(&cut[0]), ["hm"]);
    assert_eq!(segments(&cut[1]), ["The "]);
    assert!(!cut[1].is_complete());
    // The rest, from where the budget stopped.
    let rest = engine.draft(s, "reply-1", 1, 1 << 20).unwrap();
    assert_eq!((rest.first_segment, segments(&rest)), (1, vec!["answer ".into(), "is ".into(), "42.".into()]));
    assert!(rest.is_complete());
    assert_eq!(engine.draft(s, "nope", 0, 100), None);
    let (other, _) = create(&engine, &[]);
    assert!(engine.drafts(other, u64::MAX).is_empty());
}

#[test]
fn the_final_turn_removes_its_draft_in_its_own_transaction() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, rev) = create(&engine, &[Message::user("question")]);
    engine.append_draft(s, "d1", "partial ").unwrap();
    engine.append_draft(s, "d1", "answer").unwrap();
    engine.flush_drafts().unwrap();
    engine.append_draft(s, "d1", " more").unwrap();
    engine.append_draft(s, "d2", "kept").unwrap();
    let t = turn(s, "t1", rev).message(Message::assistant("partial answer more")).finalizes("d1");
    engine.commit_turn(t.clone()).unwrap();
    assert_eq!(engine.drafts(s, u64::MAX).len(), 1, "d1 is gone, d2 stays");
    // An exact retry naming a draft of that id removes it again, if one came back.
    engine.append_draft(s, "d1", "again").unwrap();
    assert!(matches!(engine.commit_turn(t).unwrap(), TurnOutcome::AlreadyCommitted(_)));
    assert_eq!(engine.drafts(s, u64::MAX).iter().map(|d| d.draft_id.clone()).collect::<Vec<_>>(), ["d2"]);
    // A turn naming a draft that does not exist is no error.
    let head = head(&engine, s).revision;
    engine.commit_turn(turn(s, "t2", head).message(Message::user("next")).finalizes("never")).unwrap();
    engine.close().unwrap();

    // On disk: the draft tables hold d2 only, and they are well formed.
    let db2 = redb::Database::open(&db.path).unwrap();
    let summaries = annal::draft::check_structure(&redb::ReadableDatabase::begin_read(&db2).unwrap()).unwrap();
    assert_eq!(summaries.iter().map(|d| d.draft_id.as_str()).collect::<Vec<_>>(), ["d2"]);
    drop(db2);
    let engine = db.open_durable();
    assert_eq!(engine.abandoned_drafts().len(), 1);
    assert_eq!(engine.abandoned_drafts()[0].draft_id, "d2");
}

#[test]
fn a_turn_in_a_rejected_batch_leaves_its_draft() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev) = create(&engine, &[]);
    engine.append_draft(s, "d", "x").unwrap();
    let good = Command::CommitTurn(turn(s, "t1", rev).message(Message::assistant("x")).finalizes("d"));
    let bad = Command::Revive { session: s, reason: String::new() };
    assert!(matches!(rejected(engine.batch(vec![good, bad])), Rejection::Batch { index: 1, .. }));
    assert_eq!(engine.drafts(s, u64::MAX).len(), 1);
}

#[test]
fn drafts_survive_a_restart_as_abandoned_until_discarded() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, _) = create(&engine, &[]);
    engine.append_draft(s, "stream", "one ").unwrap();
    engine.append_draft(s, "stream", "two").unwrap();
    engine.close().unwrap();
    let engine = db.open_durable();
    let abandoned = engine.abandoned_drafts().to_vec();
    assert_eq!(abandoned.len(), 1);
    assert_eq!((abandoned[0].session, abandoned[0].draft_id.as_str()), (s, "stream"));
    assert_eq!((abandoned[0].segments, abandoned[0].bytes), (2, 7));
    // Resume it, then discard it explicitly.
    assert_eq!(engine.append_draft(s, "stream", " three").unwrap(), 2);
    assert!(engine.discard_draft(s, "stream").unwrap());
    assert!(!engine.discard_draft(s, "stream").unwrap());
    assert!(engine.drafts(s, u64::MAX).is_empty());
    engine.close().unwrap();
    let engine = db.open_durable();
    assert!(engine.abandoned_drafts().is_empty());
}

#[test]
fn draft_limits_and_bad_requests_get_typed_errors_and_change_nothing() {
    let db = Db::new();
    let limits =
        Limits { draft_bytes_max: 10, session_draft_bytes_max: 15, draft_bytes_total_max: 20, ..Limits::default() };
    let engine = db.open_limits(limits);
    let (a, _) = create(&engine, &[]);
    let (b, _) = create(&engine, &[]);
    engine.append_draft(a, "d1", "123456").unwrap();
    assert_eq!(
        rejected(engine.append_draft(a, "d1", "12345")),
        Rejection::LimitExceeded { limit: Limit::DraftBytes, actual: 11, max: 10 }
    );
    engine.append_draft(a, "d2", "12345678").unwrap();
    assert_eq!(
        rejected(engine.append_draft(a, "d3", "12")),
        Rejection::LimitExceeded { limit: Limit::SessionDraftBytes, actual: 16, max: 15 }
    );
    engine.append_draft(b, "d1", "12345").unwrap();
    assert_eq!(
        rejected(engine.append_draft(b, "d2", "12")),
        Rejection::LimitExceeded { limit: Limit::DraftBytesTotal, actual: 21, max: 20 }
    );
    let sizes: Vec<u64> = engine.drafts(a, u64::MAX).iter().map(|d| d.total_bytes).collect();
    assert_eq!(sizes, [6, 8]);
    // Discarding frees room.
    engine.discard_draft(a, "d2").unwrap();
    engine.append_draft(b, "d2", "12").unwrap();

    assert!(matches!(rejected(engine.append_draft(a, "d1", "")), Rejection::InvalidRequest { .. }));
    assert!(matches!(rejected(engine.append_draft(a, "", "x")), Rejection::InvalidRequest { .. }));
    let nobody = new_session_id();
    assert_eq!(rejected(engine.append_draft(nobody, "d", "x")), Rejection::NotFound { session: nobody });
    assert_eq!(rejected(engine.discard_draft(nobody, "d")), Rejection::NotFound { session: nobody });
    let in_batch = engine.batch(vec![Command::AppendDraft(AppendDraft {
        session: a,
        draft_id: "d1".into(),
        segment: b"x".to_vec(),
    })]);
    assert!(matches!(rejected(in_batch), Rejection::Batch { index: 0, .. }));
    engine.archive(a, "done").unwrap();
    assert_eq!(rejected(engine.append_draft(a, "d1", "x")), Rejection::Archived { session: a });
    assert_eq!(engine.drafts(a, u64::MAX).iter().map(|d| d.total_bytes).collect::<Vec<_>>(), [6]);
}

#[test]
fn a_fenced_worker_cannot_write_drafts() {
    let db = Db::new();
    let clock = ManualClock::new(1_767_225_600_000);
    let options =
        Options { durability: Durability::Relaxed, clock: std::sync::Arc::new(clock.clone()), ..Options::default() };
    let engine = Engine::open_with(&db.path, options).unwrap();
    let (s, _) = create(&engine, &[]);
    let a = engine.acquire_lease(s, "a", Duration::from_millis(10)).unwrap();
    engine.fenced(a.fence()).append_draft(s, "d", "from a").unwrap();
    clock.advance(20);
    engine.acquire_lease(s, "b", Duration::from_millis(10)).unwrap();
    assert!(matches!(rejected(engine.fenced(a.fence()).append_draft(s, "d", "late")), Rejection::Fenced { .. }));
    assert_eq!(engine.drafts(s, u64::MAX)[0].total_segments, 1);
}

/// Set in the child: the database path and the phase.
const ENV_CHILD: &str = "ANNAL_DRAFT_CHILD";

/// The child: streams a draft, saying how far it got, and waits to be killed.
fn child(spec: &str) -> ! {
    let (path, phase) = spec.split_once('|').expect("path|phase");
    let interval = match phase {
        "explicit" => Duration::from_secs(3600),
        _ => Duration::from_millis(20),
    };
    let options = Options { draft_flush_interval: interval, ..Options::default() };
    let engine = Engine::open_with(path, options).expect("child opens");
    let s = engine.create_session(CreateSession::with_id(SessionId([7; 16]))).expect("create").session;
    let say = |line: &str| println!("{line}");
    for i in 0..5 {
        engine.append_draft(s, "stream", format!("seg{i};")).expect("append");
    }
    match phase {
        "explicit" => engine.flush_drafts().expect("flush"),
        _ => std::thread::sleep(Duration::from_millis(200)),
    }
    say("FLUSHED 5");
    for i in 5..8 {
        engine.append_draft(s, "stream", format!("seg{i};")).expect("append");
    }
    say("MORE 8");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn kill_mid_stream(phase: &str) -> Vec<String> {
    let db = Db::new();
    let mut child = Process::new(std::env::current_exe().unwrap())
        .args(["--exact", "sigkill_mid_stream_keeps_the_segments_up_to_the_last_flush", "--nocapture"])
        .env(ENV_CHILD, format!("{}|{phase}", db.path.display()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines {
        if line.unwrap().starts_with("MORE") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let engine = db.open_durable();
    let abandoned = engine.abandoned_drafts().to_vec();
    assert_eq!(abandoned.len(), 1, "{phase}: the draft survived");
    let s = abandoned[0].session;
    segments(&engine.draft(s, "stream", 0, u64::MAX).unwrap())
}

/// SIGKILL while a draft streams, then reopen: the segments up to the last flush are
/// there, in order. With a flush interval of an hour only the explicit flush counts;
/// with 20 ms, the segments that waited 200 ms have been written by the interval.
#[test]
fn sigkill_mid_stream_keeps_the_segments_up_to_the_last_flush() {
    if let Ok(spec) = std::env::var(ENV_CHILD) {
        child(&spec);
    }
    let want: Vec<String> = (0..8).map(|i| format!("seg{i};")).collect();
    let got = kill_mid_stream("explicit");
    assert_eq!(got, want[..5], "after an explicit flush: exactly the flushed segments");
    let got = kill_mid_stream("interval");
    assert!(got.len() >= 5 && got[..] == want[..got.len()], "after the interval: a prefix of at least 5: {got:?}");
}

/// A damaged drafts table never blocks an open: the draft keeps the segments that are
/// there, in order, and is written anew.
#[test]
fn a_damaged_draft_is_repaired_at_open() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, _) = create(&engine, &[]);
    for seg in ["a", "b", "c"] {
        engine.append_draft(s, "d", seg).unwrap();
    }
    engine.append_draft(s, "gone", "x").unwrap();
    engine.close().unwrap();
    let file = redb::Database::open(&db.path).unwrap();
    let txn = file.begin_write().unwrap();
    {
        let mut segments = txn.open_table(annal::draft::DRAFTS).unwrap();
        segments.remove(annal::draft::segment_key(&s, "d", 1).as_slice()).unwrap();
        segments.remove(annal::draft::segment_key(&s, "gone", 0).as_slice()).unwrap();
    }
    txn.commit().unwrap();
    drop(file);
    let engine = db.open_durable();
    let drafts = engine.drafts(s, u64::MAX);
    assert_eq!(drafts.len(), 1);
    assert_eq!(segments(&drafts[0]), ["a"]);
    engine.flush_drafts().unwrap();
    engine.close().unwrap();
    let file = redb::Database::open(&db.path).unwrap();
    let summaries = annal::draft::check_structure(&redb::ReadableDatabase::begin_read(&file).unwrap()).unwrap();
    assert_eq!(summaries.iter().map(|d| (d.draft_id.as_str(), d.segments)).collect::<Vec<_>>(), [("d", 1)]);
}
