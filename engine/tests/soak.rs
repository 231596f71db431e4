//! Soak: 64 threads across 10,000 sessions for five minutes with the default, durable
//! options. Every thread reads a random session's head and commits a turn against it;
//! some also record tool calls and results, or compact. The only error allowed is the
//! `RevisionConflict` a lost race produces. At the end the log verifies page by page,
//! `rebuild(ProjectionSet::all())` reproduces the live projections, and the test prints
//! throughput, latency percentiles and peak memory (VmHWM).
//!
//! Ignored by default: `ANNAL_SOAK_SECS=60 cargo test -p annal --release --test soak --
//! --ignored --nocapture` (the duration defaults to 300 seconds).

use annal::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: u64 = 64;
const SESSIONS: u64 = 10_000;
const SECS_DEFAULT: u64 = 300;
const SECS_ENV: &str = "ANNAL_SOAK_SECS";

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Counters {
    turns: AtomicU64,
    tool_events: AtomicU64,
    compactions: AtomicU64,
    conflicts: AtomicU64,
}

/// Resident set size of this process now, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS value")
}

/// Peak resident set size of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM line");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmHWM value")
}

fn create_sessions(engine: &Engine) -> Vec<SessionId> {
    let mut sessions = Vec::with_capacity(SESSIONS as usize);
    let chunk = engine.limits().batch_commands_max.min(1000);
    while (sessions.len() as u64) < SESSIONS {
        let n = chunk.min(SESSIONS - sessions.len() as u64);
        let commands = (0..n)
            .map(|i| {
                let c = CreateSession::new()
                    .label("soak", "1")
                    .label("shard", (i % 16).to_string())
                    .message(Message::system("You are a soak test."));
                Command::CreateSession(c)
            })
            .collect();
        for outcome in engine.batch(commands).expect("create sessions") {
            match outcome {
                Outcome::Created { session, .. } => sessions.push(session),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    sessions
}

/// A conflict is the expected outcome of a lost race; anything else fails the soak.
fn conflict_or_panic<T: std::fmt::Debug>(result: Result<T>, counters: &Counters) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(Error::Rejected(Rejection::RevisionConflict { .. })) => {
            counters.conflicts.fetch_add(1, Ordering::Relaxed);
            None
        }
        Err(e) => panic!("soak: unexpected error {e:?}"),
    }
}

fn worker(engine: Engine, sessions: Arc<Vec<SessionId>>, counters: Arc<Counters>, t: u64, until: Instant) -> Vec<u32> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let mut latencies_us = Vec::new();
    let mut i = 0u64;
    while Instant::now() < until {
        i += 1;
        let s = sessions[rng.below(sessions.len() as u64) as usize];
        let head = engine.head(s).expect("head").expect("session exists");
        let started = Instant::now();
        match rng.below(20) {
            0 => {
                let op = format!("op-{t}-{i}");
                let call = RecordToolCall {
                    session: s,
                    op_id: op.clone(),
                    call_id: format!("call-{i}"),
                    tool_name: "bash".into(),
                    args: format!("echo {i}").into_bytes(),
                    parent_op: None,
                    turn_id: None,
                    recovery: Recovery::ReplaySafe,
                };
                engine.record_tool_call(call).expect("T1");
                let result = RecordToolResult {
                    session: s,
                    op_id: op,
                    outcome: ToolOutcome::Ok,
                    result: i.to_le_bytes().to_vec(),
                };
                engine.record_tool_result(result).expect("T2");
                counters.tool_events.fetch_add(2, Ordering::Relaxed);
            }
            1 if head.message_count >= 6 => {
                let rewrite = Rewrite {
                    session: s,
                    expected: head.revision,
                    start: 0,
                    end: head.message_count - 2,
                    replacement: vec![Message::system(format!("summary {t}-{i}"))],
                    reason: RewriteReason::Compaction,
                    note: "soak".into(),
                    actor: "soak".into(),
                };
                if conflict_or_panic(engine.rewrite(rewrite), &counters).is_some() {
                    counters.compactions.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                let turn = CommitTurn::new(s, format!("turn-{t}-{i}"), Expected::Exact(head.revision))
                    .message(Message::user(format!("question {i} from thread {t}")))
                    .message(Message::assistant(format!("answer {}", rng.next())))
                    .usage("anthropic", "claude", 1000 + rng.below(1000), rng.below(500));
                if conflict_or_panic(engine.commit_turn(turn), &counters).is_some() {
                    counters.turns.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        latencies_us.push(started.elapsed().as_micros().min(u32::MAX as u128) as u32);
    }
    latencies_us
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
#[ignore = "soak: minutes long; run with --ignored (ANNAL_SOAK_SECS sets the duration)"]
fn soak_64_threads_10k_sessions() {
    let secs: u64 = std::env::var(SECS_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(SECS_DEFAULT);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("soak.redb");
    let engine = Engine::open(&path).expect("open");
    let setup = Instant::now();
    let sessions = Arc::new(create_sessions(&engine));
    eprintln!("soak: {} sessions created in {:.1?}", sessions.len(), setup.elapsed());

    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    // Every second: the resident set and the delta's size, which must stay under its bound.
    let monitor = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while Instant::now() < until {
                std::thread::sleep(Duration::from_secs(1));
                samples.push((rss_kib(), engine.stats().delta_bytes));
            }
            samples
        })
    };
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (engine, sessions, counters) = (engine.clone(), sessions.clone(), counters.clone());
            std::thread::spawn(move || worker(engine, sessions, counters, t, until))
        })
        .collect();
    let mut latencies: Vec<u32> = handles.into_iter().flat_map(|h| h.join().expect("worker")).collect();
    let elapsed = started.elapsed();
    let samples = monitor.join().expect("monitor");
    let bound = Options::default().checkpoint.delta_bytes_max;
    let delta_max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    assert!(delta_max <= bound + (16 << 20), "the delta reached {delta_max} bytes, bound {bound}");
    let rss = |at: usize| samples.get(at.min(samples.len().saturating_sub(1))).map_or(0, |s| s.0);
    let (third, end) = (rss(samples.len() / 3), rss(samples.len()));
    // Flat: after the first third (caches warm, delta at its working size), the resident
    // set grows by at most half.
    assert!(end <= third + third / 2 + (64 << 10), "RSS grew from {third} KiB to {end} KiB");
    latencies.sort_unstable();

    let turns = counters.turns.load(Ordering::Relaxed);
    let tools = counters.tool_events.load(Ordering::Relaxed);
    let compactions = counters.compactions.load(Ordering::Relaxed);
    let conflicts = counters.conflicts.load(Ordering::Relaxed);
    let events = turns + tools + compactions;
    let (tip, _) = engine.tip().expect("tip");
    assert_eq!(tip, SESSIONS + events, "every acknowledged event is in the log, and nothing else");

    let verify = Instant::now();
    let mut from = 1;
    let mut read = 0;
    loop {
        let page = engine.events(EventQuery { from_seq: from, max_events: 10_000, max_bytes: 64 << 20 }).expect("page");
        for (k, ev) in page.events.iter().enumerate() {
            assert_eq!(ev.record.seq, from + k as u64, "dense log");
        }
        read += page.events.len() as u64;
        if !page.has_more {
            break;
        }
        from = page.next_seq;
    }
    assert_eq!(read, tip, "the whole log reads and verifies");
    let live = engine.projection_digests().expect("digests");
    let stats = engine.rebuild(ProjectionSet::all()).expect("rebuild");
    assert_eq!(engine.projection_digests().expect("digests"), live, "rebuild reproduces the live projections");
    let verify_elapsed = verify.elapsed();
    engine.close().expect("close");
    let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);

    let secs_f = elapsed.as_secs_f64();
    println!("soak: {THREADS} threads, {SESSIONS} sessions, {secs_f:.1} s");
    println!(
        "soak: {events} events ({turns} turns, {tools} tool events, {compactions} compactions), {conflicts} conflicts"
    );
    println!(
        "soak: {:.0} events/s, {:.0} commands/s (conflicts included)",
        events as f64 / secs_f,
        latencies.len() as f64 / secs_f
    );
    println!(
        "soak: latency p50 {} us, p99 {} us, max {} us",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(0)
    );
    println!(
        "soak: verify + rebuild of {tip} records in {verify_elapsed:.1?} (rebuild {:.1?}), file {} MiB",
        stats.elapsed,
        file_bytes >> 20
    );
    println!("soak: peak RSS (VmHWM) {} MiB", peak_rss_kib() >> 10);
    let quarters: Vec<String> = (1..=4).map(|q| format!("{} MiB", rss(samples.len() * q / 4) >> 10)).collect();
    println!(
        "soak: RSS at each quarter of the run {}; delta at most {} MiB (bound {} MiB)",
        quarters.join(", "),
        delta_max >> 20,
        bound >> 20
    );
}
