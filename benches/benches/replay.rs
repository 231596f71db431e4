//! Replay throughput: `rebuild` and `verify` against reading and decoding the same log,
//! measured in one run on one database of `ANNAL_REPLAY_EVENTS` events (default
//! 1,000,000). Read-and-decode and verify run `ANNAL_REPLAY_REPEATS` times (default 3),
//! interleaved, and their medians are reported; rebuild runs once. Prints events per
//! second, MB per second and the two ratios: rebuild / read-and-decode (target ≤ 3) and
//! verify / read-and-decode (target ≤ 2). `ANNAL_REPLAY_DB=PATH` keeps the database.
//!
//! Beside them, the floors of the work each pass must do, in the same run:
//! - the log read with every record's chain hash checked (part of verify's work);
//! - the content rows read, every entry parsed, decoded (decompressed if it is stored
//!   compressed) and hashed (verify must check that every object hashes to its id);
//! - the rebuild's output alone: every projection row the rebuild wrote, read through a
//!   view and copied in physical key order into the projection table of an empty redb
//!   file in one durable transaction, with no fold at all (the best order redb can be
//!   given; the projections file a rebuild writes has the same layout).
//!
//! Verify must decode and hash every record and hash every content object; with two
//! cores its floor in wall time is (read-and-decode + chain hashing + content) / 2 before
//! any fold. The rebuild's floor is read-and-decode plus writing its rows.
//!
//! The database is two files: the log and, beside it, the projections file
//! ([`annal::projections_path`]); both sizes are printed.
//!
//! The bench takes its memory from mimalloc, as the `annal` command does, so that
//! `verify` and `rebuild` here cost what they cost an operator.
//!
//! `cargo bench -p annal-benches --bench replay`

use annal::codec::{decode_record, verify_chain, LogChain};
use annal::pieces::ContentReader;
use annal::tables::{physical_key, projection_rows, LOG, PROJECTIONS};
use annal::*;
use redb::ReadableTable;
use std::path::Path;
use std::time::{Duration, Instant};

/// The `annal` command's allocator.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// Runs `f` on one view of `path`, opened the way the offline tools open it.
fn with_view<T>(path: &Path, f: impl FnOnce(&View) -> T) -> T {
    let reader = Reader::open(path, Limits::default(), None).expect("reader");
    let view = reader.snapshot().expect("snapshot");
    f(&view)
}

/// Runs `f` on the raw snapshot of the log file of one view of `path`.
fn with_log<T>(path: &Path, f: impl FnOnce(&redb::ReadTransaction) -> T) -> T {
    with_view(path, |view| f(view.log()))
}

/// Reads and decodes every record: the floor every replay pays.
fn read_decode(path: &Path) -> (u64, u64) {
    with_log(path, |txn| {
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
    })
}

/// Reads every record, and with `chain` checks its chain hash (one part of verify's
/// work); without, only touches its first byte, so the difference is the hashing.
fn read_chain(path: &Path, chain: bool) -> u64 {
    with_log(path, |txn| {
        let log = txn.open_table(LOG).expect("log");
        let plain = LogChain::plain();
        let mut prev = plain.genesis();
        let mut events = 0;
        for entry in log.iter().expect("iter") {
            let (k, v) = entry.expect("row");
            if chain {
                prev = verify_chain(v.value(), &prev, &plain, k.value()).expect("chain");
            } else {
                std::hint::black_box(v.value().first());
            }
            events += 1;
        }
        events
    })
}

/// Reads every content row, parses its entries, decodes every object (decompressing the
/// compressed ones) and hashes it against its id: another part of verify's work.
/// Returns (objects, canonical bytes of the objects).
fn read_hash_content(path: &Path) -> (u64, u64) {
    let max = Limits::default().content_bytes_max;
    with_log(path, |txn| {
        let content = ContentReader::open(txn).expect("content");
        let (mut objects, mut bytes, mut buffer) = (0u64, 0u64, Vec::new());
        for row in content.iter().expect("iter") {
            let (seq, row) = row.expect("row");
            for entry in annal::codec::content::entries(&row, max) {
                let entry = entry.unwrap_or_else(|e| panic!("content row {seq}: {e}"));
                // Into one reused buffer, as verify decompresses.
                let canonical = entry.verify_into(max, &mut buffer);
                let canonical = canonical.unwrap_or_else(|| panic!("content in row {seq} hashes to its id"));
                objects += 1;
                bytes += canonical.len() as u64;
            }
        }
        (objects, bytes)
    })
}

/// Copies every projection row of `path`, read through a view and sorted in physical key
/// order, into an empty redb file in one durable transaction: the cost of writing the
/// rebuild's output with no fold. Returns (rows, bytes, time spent writing and
/// committing).
fn write_rows_floor(path: &Path, scratch: &Path) -> (u64, u64, Duration) {
    let mut rows: Vec<(Vec<u8>, Vec<u8>)> = with_view(path, |view| {
        let mut rows = Vec::new();
        for t in Table::ALL {
            let table = projection_rows(view, t).expect("projection rows");
            rows.extend(table.into_iter().map(|(k, v)| (physical_key(t, &k), v)));
        }
        rows
    });
    rows.sort_unstable();
    let bytes = rows.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
    let db = redb::Database::create(scratch).expect("scratch database");
    let started = Instant::now();
    let write = db.begin_write().expect("begin write");
    {
        let mut table = write.open_table(PROJECTIONS).expect("table");
        for (k, v) in &rows {
            table.insert(k.as_slice(), v.as_slice()).expect("insert");
        }
    }
    write.commit().expect("commit");
    (rows.len() as u64, bytes, started.elapsed())
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
    let mib = |p: &Path| std::fs::metadata(p).map_or(0.0, |m| m.len() as f64 / (1 << 20) as f64);
    println!("database: log {:.0} MiB, projections {:.0} MiB", mib(&path), mib(&projections_path(&path)));

    let repeats = std::env::var("ANNAL_REPLAY_REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize).max(1);
    let (mut reads, mut verifies) = (Vec::new(), Vec::new());
    let (mut n, mut bytes, mut verified_objects) = (0, 0, 0);
    for _ in 0..repeats {
        let ((read_events, read_bytes), t) = timed(|| read_decode(&path));
        assert_eq!(read_events, events, "the log holds every event");
        (n, bytes) = (read_events, read_bytes);
        reads.push(t);
        let (report, t) = timed(|| {
            annal_replay::verify::verify(&path, &annal_replay::verify::VerifyOptions::default()).expect("verify")
        });
        assert!(report.findings.is_empty(), "verify is clean");
        verified_objects = report.content_objects;
        verifies.push(t);
    }
    let (t_read, t_verify) = (median(reads), median(verifies));
    let (chained, t_chain) = timed(|| read_chain(&path, true));
    let (raw, t_raw) = timed(|| read_chain(&path, false));
    assert_eq!((chained, raw), (events, events));
    let ((objects, content_bytes), t_content) = timed(|| read_hash_content(&path));
    assert_eq!(objects, verified_objects, "the floor hashes every object verify checks");
    let opts = annal_replay::rebuild::RebuildOptions { projections: Vec::new(), key: None, progress: false };
    let (rebuilt, t_rebuild) = timed(|| annal_replay::rebuild::rebuild(&path, &opts).expect("rebuild"));
    assert_eq!(rebuilt.events, events);
    let (rows, row_bytes, t_rows) = write_rows_floor(&path, &dir.path().join("rows.redb"));

    println!("log: {n} records, {:.1} MB of records", bytes as f64 / 1e6);
    line("read + decode", n, bytes, t_read, t_read);
    line("verify", n, bytes, t_verify, t_read);
    line("rebuild (all)", n, bytes, t_rebuild, t_read);
    println!("floors, measured in the same run:");
    line("log read only", n, bytes, t_raw, t_read);
    line("log read + chain", n, bytes, t_chain, t_read);
    println!(
        "{:<22} {:>8.2} s ({objects} objects, {:.1} MB) {:>6.2}x read+decode",
        "content read + hash",
        t_content.as_secs_f64(),
        content_bytes as f64 / 1e6,
        t_content.as_secs_f64() / t_read.as_secs_f64()
    );
    println!(
        "{:<22} {:>8.2} s ({rows} rows, {:.1} MB, {:.2} rows per event) {:>6.2}x read+decode",
        "write rebuilt rows",
        t_rows.as_secs_f64(),
        row_bytes as f64 / 1e6,
        rows as f64 / n.max(1) as f64,
        t_rows.as_secs_f64() / t_read.as_secs_f64()
    );
    // Verify must decode every record, hash every record and every content object; on
    // two cores the best it can do is share that work evenly.
    let verify_floor = (t_read + t_chain.saturating_sub(t_raw) + t_content).as_secs_f64() / 2.0;
    let rebuild_floor = (t_read + t_rows).as_secs_f64();
    println!(
        "floor of verify on two cores (read+decode + chain hashing + content) / 2, before its fold: \
         {:.2}x read+decode; \
         floor of rebuild (read+decode + write rows): {:.2}x",
        verify_floor / t_read.as_secs_f64(),
        rebuild_floor / t_read.as_secs_f64()
    );
    let verify_ratio = t_verify.as_secs_f64() / t_read.as_secs_f64();
    let rebuild_ratio = t_rebuild.as_secs_f64() / t_read.as_secs_f64();
    println!(
        "targets: verify ≤ 2x read+decode: {} ({verify_ratio:.2}x); rebuild ≤ 3x: {} ({rebuild_ratio:.2}x)",
        if verify_ratio <= 2.0 { "met" } else { "missed" },
        if rebuild_ratio <= 3.0 { "met" } else { "missed" }
    );
}
