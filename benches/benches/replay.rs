//! Replay throughput: `rebuild` and `verify` against reading and decoding the same log,
//! measured in one run on one database of `ANNAL_REPLAY_EVENTS` events (default
//! 1,000,000). Read-and-decode and verify run `ANNAL_REPLAY_REPEATS` times (default 3),
//! interleaved, and their medians are reported; rebuild runs once. Prints events per
//! second, MB per second and the two ratios: rebuild / read-and-decode (target ≤ 3) and
//! verify / read-and-decode (target ≤ 1.5). `ANNAL_REPLAY_DB=PATH` keeps the database.
//!
//! `cargo bench -p annal-benches --bench replay`

use annal::codec::decode_record;
use annal::tables::LOG;
use annal::*;
use redb::ReadableTable;
use std::path::Path;
use std::time::{Duration, Instant};

const EVENTS_DEFAULT: u64 = 1_000_000;
const EVENTS_PER_SESSION: u64 = 100;
const BATCH_COMMANDS: usize = 1000;

fn body(tag: &str, n: u64, len: usize) -> String {
    let mut s = format!("{tag} {n}: ");
    let words = ["the", "build", "failed", "because", "cargo", "could", "not", "find", "a", "lockfile", "so", "we"];
    let mut i = n as usize;
    while s.len() < len {
        s.push_str(words[i % words.len()]);
        s.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    s
}

/// Commands of one session: a create and `EVENTS_PER_SESSION - 1` more events, with
/// turns, context appended and applied, tool calls settled, and a compaction.
fn session_commands(n: u64) -> Vec<Command> {
    let session = SessionId((n as u128 + 1).to_be_bytes());
    let mut out = vec![Command::CreateSession(
        CreateSession::with_id(session).label("bench", "replay").message(Message::system(body("system", n, 400))),
    )];
    let mut turn = 0;
    while (out.len() as u64) < EVENTS_PER_SESSION {
        let k = out.len() as u64;
        match k % 10 {
            3 => out.push(Command::AppendContext(AppendContext {
                session,
                key: format!("ctx-{k}"),
                content: body("context", k, 200).into_bytes(),
                source: "memory".into(),
            })),
            5 => out.push(Command::RecordToolCall(RecordToolCall {
                session,
                op_id: format!("op-{k}"),
                call_id: format!("call-{k}"),
                tool_name: "bash".into(),
                args: body("args", k, 120).into_bytes(),
                parent_op: None,
                turn_id: None,
                recovery: Recovery::ReplaySafe,
            })),
            6 => out.push(Command::RecordToolResult(RecordToolResult {
                session,
                op_id: format!("op-{}", k - 1),
                outcome: ToolOutcome::Ok,
                result: body("result", k, 600).into_bytes(),
            })),
            _ => {
                let mut t = CommitTurn::new(session, format!("turn-{turn}"), Expected::Any)
                    .message(Message::user(body("user", n * 1000 + k, 150)))
                    .message(Message::assistant(body("assistant", n * 1000 + k, 300)))
                    .usage("anthropic", "claude", 1200 + k, 300);
                if k % 10 == 4 {
                    t = t.apply_context(format!("ctx-{}", k - 1));
                }
                turn += 1;
                out.push(Command::CommitTurn(t));
            }
        }
    }
    out
}

fn build(path: &Path, events: u64) -> Duration {
    let started = Instant::now();
    let options = Options { durability: Durability::Relaxed, ..Options::default() };
    let engine = Engine::open_with(path, options).expect("open");
    let mut batch = Vec::with_capacity(BATCH_COMMANDS);
    for n in 0..events / EVENTS_PER_SESSION {
        for c in session_commands(n) {
            batch.push(c);
            if batch.len() == BATCH_COMMANDS {
                engine.batch(std::mem::take(&mut batch)).expect("batch");
            }
        }
    }
    if !batch.is_empty() {
        engine.batch(batch).expect("batch");
    }
    engine.close().expect("close");
    started.elapsed()
}

/// Reads and decodes every record: the floor every replay pays.
fn read_decode(path: &Path) -> (u64, u64) {
    let reader = Reader::open(path, Limits::default(), None).expect("reader");
    let txn = reader.snapshot().expect("snapshot");
    let log = txn.open_table(LOG).expect("log");
    let (mut events, mut bytes) = (0u64, 0u64);
    for entry in log.iter().expect("iter") {
        let (_, v) = entry.expect("row");
        let decoded = decode_record(v.value(), Limits::default().record_bytes_max).expect("decode");
        std::hint::black_box(&decoded);
        events += 1;
        bytes += v.value().len() as u64;
    }
    (events, bytes)
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let out = f();
    (out, started.elapsed())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn line(what: &str, events: u64, bytes: u64, t: Duration, base: Duration) {
    let s = t.as_secs_f64();
    println!(
        "{what:<22} {:>8.2} s {:>12.0} events/s {:>9.1} MB/s {:>6.2}x read+decode",
        s,
        events as f64 / s,
        bytes as f64 / s / 1e6,
        s / base.as_secs_f64()
    );
}

fn main() {
    // Criterion passes its own flags to harness = false benches; they are not ours.
    let events = std::env::var("ANNAL_REPLAY_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(EVENTS_DEFAULT);
    // `ANNAL_REPLAY_DB=PATH` keeps the database at PATH and reuses it when it exists.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = std::env::var_os("ANNAL_REPLAY_DB").map_or_else(|| dir.path().join("replay.redb"), Into::into);
    if !path.exists() {
        let built = build(&path, events);
        println!("built {events} events in {:.1} s", built.as_secs_f64());
    }
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!("database: {:.0} MiB", size as f64 / (1 << 20) as f64);

    let repeats = std::env::var("ANNAL_REPLAY_REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize).max(1);
    let (mut reads, mut verifies) = (Vec::new(), Vec::new());
    let (mut n, mut bytes) = (0, 0);
    for _ in 0..repeats {
        let ((read_events, read_bytes), t) = timed(|| read_decode(&path));
        assert_eq!(read_events, events, "the log holds every event");
        (n, bytes) = (read_events, read_bytes);
        reads.push(t);
        let (report, t) = timed(|| {
            annal_replay::verify::verify(&path, &annal_replay::verify::VerifyOptions::default()).expect("verify")
        });
        assert!(report.findings.is_empty(), "verify is clean");
        verifies.push(t);
    }
    let (t_read, t_verify) = (median(reads), median(verifies));
    let opts = annal_replay::rebuild::RebuildOptions { projections: Vec::new(), key: None, progress: false };
    let (rebuilt, t_rebuild) = timed(|| annal_replay::rebuild::rebuild(&path, &opts).expect("rebuild"));
    assert_eq!(rebuilt.events, events);

    println!("log: {n} records, {:.1} MB of records", bytes as f64 / 1e6);
    line("read + decode", n, bytes, t_read, t_read);
    line("verify", n, bytes, t_verify, t_read);
    line("rebuild (all)", n, bytes, t_rebuild, t_read);
    let verify_ratio = t_verify.as_secs_f64() / t_read.as_secs_f64();
    let rebuild_ratio = t_rebuild.as_secs_f64() / t_read.as_secs_f64();
    println!(
        "targets: verify ≤ 1.5x read+decode: {} ({verify_ratio:.2}x); rebuild ≤ 3x: {} ({rebuild_ratio:.2}x)",
        if verify_ratio <= 1.5 { "met" } else { "missed" },
        if rebuild_ratio <= 3.0 { "met" } else { "missed" }
    );
}
