//! SIGKILL during purges: a purge is all or nothing, and after a reopen `annal verify
//! --deep` is clean and no byte of a purged session is left in either file.
//!
//! The test re-executes its own binary as a child (selected by `ANNAL_PURGE_CRASH_DB`).
//! The child loops: it creates a session whose every field carries a marker unique to
//! it, plus a turn against a message every session shares, prints `CREATED <id> <mark>`,
//! purges it (with the database closed, as a purge requires) and prints `PURGED <id>`.
//! The parent kills it with SIGKILL after a seeded random delay, so kills land in the
//! steps of a purge (the erasing transaction, the shredding of the projections file, the
//! rewrite of the log file, the refold) or between purges; most land after the erasing
//! transaction, which is the short part. Then it reopens the database (which finishes
//! an erasure the kill interrupted) and checks every session the child created:
//!
//! - one it reported purged is purged; one whose purge was in flight is either whole
//!   (no record erased, no tombstone, its head answers) or purged (every record erased,
//!   the tombstone last);
//! - the marker of every purged session is in no byte of either file;
//! - `annal verify --deep` is clean, and the message every session shares still reads.

mod common;

use annal::*;
use common::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::time::Duration;

const ENV_DB: &str = "ANNAL_PURGE_CRASH_DB";
const ENV_SEED: &str = "ANNAL_PURGE_CRASH_SEED";
const KILLS: u64 = 16;
const KILL_DELAY_MS_MAX: u64 = 400;

fn options() -> Options {
    Options { compression: annal::Compression::Off, ..Options::default() }
}

fn shared() -> Message {
    Message::system("the system prompt every session shares")
}

/// The child: create and purge marked sessions until killed.
fn child(path: &Path, seed: u64) {
    let mut n = 0u64;
    loop {
        let mark = format!("CRASHMARK{seed:x}X{n}Y");
        n += 1;
        let engine = Engine::open_with(path, options()).unwrap();
        let created = engine
            .create_session(
                CreateSession::new()
                    .label("who", format!("{mark}-label"))
                    .metadata(format!("{mark}-metadata"))
                    .message(shared())
                    .message(Message::user(format!("{mark}-question")).with_attachment(format!("{mark}-file"))),
            )
            .unwrap();
        let s = created.session;
        engine
            .append_context(AppendContext {
                session: s,
                key: format!("{mark}-key"),
                content: format!("{mark}-context").into_bytes(),
                source: format!("{mark}-source"),
            })
            .unwrap();
        let turn = CommitTurn::new(s, format!("{mark}-turn"), Expected::Exact(created.receipt.revision))
            .message(Message::assistant(format!("{mark}-answer")))
            .apply_context(format!("{mark}-key"));
        engine.commit_turn(turn).unwrap();
        engine.close().unwrap();
        println!("CREATED {s} {mark}");
        purge(path, options(), &PurgeRequest::new(s, "crash test", "test")).unwrap();
        println!("PURGED {s}");
    }
}

fn file_holds(path: &Path, needle: &str) -> bool {
    std::fs::read(path).map(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())).unwrap_or(false)
}

#[test]
fn kill_during_purges() {
    if let Ok(db) = std::env::var(ENV_DB) {
        let seed = std::env::var(ENV_SEED).ok().and_then(|s| s.parse().ok()).unwrap_or(1);
        child(Path::new(&db), seed);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.redb");
    // One live session holds the shared message throughout.
    let engine = Engine::open_with(&db, options()).unwrap();
    let live = engine.create_session(CreateSession::new().message(shared())).unwrap().session;
    engine.close().unwrap();

    let mut sessions: BTreeMap<SessionId, (String, bool)> = BTreeMap::new();
    let (mut purged_whole, mut in_flight_purged, mut in_flight_whole) = (0, 0, 0);
    for kill in 0..KILLS {
        let mut child = Process::new(std::env::current_exe().unwrap())
            .args(["--exact", "kill_during_purges", "--nocapture", "--test-threads=1"])
            .env(ENV_DB, &db)
            .env(ENV_SEED, (kill + 1).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pipe = child.stdout.take().unwrap();
        let reader =
            std::thread::spawn(move || BufReader::new(pipe).lines().map_while(|l| l.ok()).collect::<Vec<String>>());
        let delay = 150 + (kill * 7919 + 13) % KILL_DELAY_MS_MAX;
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().unwrap();
        child.wait().unwrap();
        for line in reader.join().unwrap() {
            // The test harness may print its own text on the line before the first one.
            let line = ["CREATED ", "PURGED "].iter().find_map(|w| line.find(w).map(|i| &line[i..])).unwrap_or("");
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["CREATED", id, mark] => {
                    sessions.insert(id.parse().unwrap(), (mark.to_string(), false));
                }
                ["PURGED", id] => sessions.get_mut(&id.parse().unwrap()).unwrap().1 = true,
                _ => {}
            }
        }
        // The reopen finishes an erasure the kill interrupted.
        let engine = Engine::open_with(&db, options()).unwrap();
        let page = engine.transcript(live, PageRequest::first(10)).unwrap();
        assert_eq!(page.messages[0].message.body, shared().body);
        let mut purged_marks = Vec::new();
        for (s, (mark, acknowledged)) in sessions.iter_mut() {
            let records = annal::purge::session_records(&db, s);
            let head = engine.head(*s);
            match head {
                Err(Error::Rejected(Rejection::Purged { seq, .. })) => {
                    let records = records.unwrap();
                    assert_eq!(records.iter().next_back(), Some((&seq, &false)), "the tombstone is last");
                    assert!(records.iter().filter(|(k, _)| **k != seq).all(|(_, e)| *e), "all erased");
                    purged_marks.push(mark.clone());
                    if !*acknowledged {
                        in_flight_purged += 1;
                        *acknowledged = true;
                    }
                }
                Ok(Some(_)) => {
                    assert!(!*acknowledged, "an acknowledged purge of {s} is not there");
                    assert!(records.unwrap().values().all(|e| !e), "a session that is not purged has no erased record");
                    in_flight_whole += 1;
                }
                other => panic!("session {s}: {other:?}"),
            }
        }
        engine.close().unwrap();
        for mark in &purged_marks {
            for file in [db.clone(), projections_path(&db)] {
                assert!(!file_holds(&file, mark), "kill {kill}: {mark} left in {}", file.display());
            }
        }
        purged_whole = purged_marks.len();
        let out = annal(&["verify", p(&db), "--deep"]);
        assert_eq!(code(&out), 0, "kill {kill}: {}{}", stdout(&out), stderr(&out));
        // Purge the sessions a kill left whole, so every marked session ends purged.
        for (s, (_, acknowledged)) in sessions.iter_mut() {
            let engine_head = {
                let e = Engine::open_with(&db, options()).unwrap();
                let h = e.head(*s);
                e.close().unwrap();
                h
            };
            if let Ok(Some(_)) = engine_head {
                purge(&db, options(), &PurgeRequest::new(*s, "cleanup", "test")).unwrap();
                *acknowledged = true;
            }
        }
    }
    eprintln!(
        "{} sessions, {purged_whole} purged; kills left {in_flight_purged} in-flight purges done, {in_flight_whole} not",
        sessions.len()
    );
    assert!(sessions.len() as u64 >= KILLS, "the children created too few sessions to test anything");
}
