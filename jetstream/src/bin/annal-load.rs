//! `annal-load`: one host of a shared log under load, for the multi-host tests and the
//! benchmarks. It opens a host (`Engine::open_shared` on a JetStream URL, or an
//! embedded engine with `--embedded`, the baseline), and runs committer threads that
//! each commit a fixed script of turns to shared sessions: thread `t` commits turns
//! `t<t>-r<r>` for every round `r` to session `t mod sessions`, each against the head
//! it reads, and retries the same turn after a conflict until it is in, so that every
//! host running the same script commits the same turns, each exactly once over all of
//! them (`--offset` gives a host sessions of its own instead). It writes one line per
//! attempt to `--report`, then a summary.
//!
//! Report lines (space-separated):
//! - `committed <turn> <session> <parent revision> <seq> <latency µs>`
//! - `already <turn> <session> <seq>`: the turn was in already (another host's)
//! - `conflict <turn> <session> <parent revision>`
//! - `unavailable <turn> <error>`: the backend failed; the turn is retried
//! - `ready`: the sessions are in, and it waits for `--go`
//! - `summary <key>=<value> ...` (with `cpu_ms`, the CPU time the process used while its
//!   committers ran)

use annal::{
    CommitTurn, CreateSession, Durability, Engine, Error, Expected, Message, Options, Rejection, SessionId, TurnOutcome,
};
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs one host of a shared log under a scripted load.
#[derive(Parser, Debug)]
#[command(name = "annal-load")]
struct Args {
    /// The JetStream URL (see `annal_jetstream::Options::from_url`).
    #[arg(long, required_unless_present = "embedded")]
    url: Option<String>,
    /// Run an embedded, durable engine instead: the baseline.
    #[arg(long)]
    embedded: bool,
    /// The directory of this host's files.
    #[arg(long)]
    dir: PathBuf,
    /// The chain key, 64 hex digits (every host must use the same).
    #[arg(long)]
    key: Option<String>,
    /// Shared sessions (created if missing).
    #[arg(long, default_value_t = 4)]
    sessions: u64,
    /// The script's first session: hosts with offsets `sessions` apart commit to
    /// sessions of their own.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Committer threads.
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// Turns each thread commits.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// The body size of each of a turn's two messages, in bytes.
    #[arg(long, default_value_t = 200)]
    body: usize,
    /// Where to write the report.
    #[arg(long)]
    report: PathBuf,
    /// Once the sessions are in, write `ready` to the report and wait for this file to
    /// exist before committing (so that several hosts start together).
    #[arg(long)]
    go: Option<PathBuf>,
    /// After the run, wait until this host has folded the whole stream, up to this
    /// many seconds.
    #[arg(long, default_value_t = 0)]
    settle_secs: u64,
}

/// Session `i` of the script.
fn session(i: u64) -> SessionId {
    let mut id = [0xA5u8; 16];
    id[8..].copy_from_slice(&i.to_be_bytes());
    SessionId(id)
}

fn key(hex: &str) -> Result<[u8; 32], String> {
    if hex.len() != 64 {
        return Err("the key is 64 hex digits".into());
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(key)
}

fn open(args: &Args) -> Result<Engine, String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let path = args.dir.join("host.redb");
    let chain_key = args.key.as_deref().map(key).transpose()?;
    let options = Options { chain_key, ..Options::default() };
    if args.embedded {
        return Engine::open_with(&path, Options { durability: Durability::Durable, ..options })
            .map_err(|e| e.to_string());
    }
    let url = args.url.as_deref().ok_or("--url or --embedded")?;
    let client_options = annal_jetstream::Options::from_url(url).map_err(|e| e.to_string())?;
    // The servers may be electing leaders (a cluster just started, or one lost a node):
    // connecting is retried for a while.
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        match annal_jetstream::JetStreamLog::connect(&client_options) {
            Ok(client) => break client,
            Err(e @ (annal_jetstream::Error::Refused(_) | annal_jetstream::Error::StreamMismatch { .. })) => {
                return Err(e.to_string())
            }
            Err(e) if Instant::now() > deadline => return Err(e.to_string()),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    Engine::open_shared(&path, options, Arc::new(client)).map_err(|e| e.to_string())
}

/// The CPU time this process has used, in milliseconds (Linux: `/proc/self/stat`, user
/// and system, in clock ticks of 10 ms); 0 where that file is not there.
fn cpu_ms() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0 };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) * 10
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("annal-load: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let engine = open(args)?;
    let report = Mutex::new(std::io::LineWriter::new(std::fs::File::create(&args.report).map_err(|e| e.to_string())?));
    let line = |s: String| {
        let mut r = report.lock().unwrap();
        let _ = writeln!(r, "{s}");
    };
    for i in args.offset..args.offset + args.sessions {
        let c = CreateSession::with_id(session(i)).message(Message::system("a shared session"));
        loop {
            match engine.create_session(c.clone()) {
                Ok(_) | Err(Error::Rejected(Rejection::AlreadyExists { .. })) => break,
                Err(Error::Backend(e)) => {
                    line(format!("unavailable create-{i} {}", e.to_string().replace(' ', "_")));
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(format!("create session {i}: {e}")),
            }
        }
    }
    // Every host waits for every session before it starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    while (args.offset..args.offset + args.sessions).any(|i| !matches!(engine.head(session(i)), Ok(Some(_)))) {
        if Instant::now() > deadline {
            return Err("the sessions did not arrive".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(go) = &args.go {
        line("ready".into());
        while !go.exists() {
            if Instant::now() > deadline + Duration::from_secs(60) {
                return Err(format!("{} did not appear", go.display()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let cpu_before = cpu_ms();
    let done = AtomicBool::new(false);
    let max_lag = AtomicU64::new(0);
    let latencies = Mutex::new(Vec::new());
    let counts: [AtomicU64; 4] = Default::default();
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<(), String> {
        scope.spawn(|| {
            while !done.load(Ordering::Acquire) {
                if let Some(status) = engine.host_status() {
                    max_lag.fetch_max(status.lag(), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let mut threads = Vec::new();
        for t in 0..args.threads {
            let (engine, line, latencies, counts) = (&engine, &line, &latencies, &counts);
            threads.push(scope.spawn(move || -> Result<(), String> {
                let s = session(args.offset + t as u64 % args.sessions);
                let body = |what: &str, r: usize| {
                    let mut text = format!("{what} of thread {t} round {r} ");
                    while text.len() < args.body {
                        text.push_str("lorem ipsum ");
                    }
                    text.truncate(args.body.max(1));
                    text
                };
                for r in 0..args.rounds {
                    let turn = format!("t{t}-r{r}");
                    loop {
                        let parent = engine.head(s).map_err(|e| e.to_string())?.ok_or("no session")?.revision;
                        let c = CommitTurn::new(s, turn.clone(), Expected::Exact(parent))
                            .message(Message::user(body("question", r)))
                            .message(Message::assistant(body("answer", r)));
                        let at = Instant::now();
                        match engine.commit_turn(c) {
                            Ok(TurnOutcome::Committed(receipt)) => {
                                let us = at.elapsed().as_micros() as u64;
                                latencies.lock().unwrap().push(us);
                                counts[0].fetch_add(1, Ordering::Relaxed);
                                line(format!("committed {turn} {s} {} {} {us}", hex(&parent.0), receipt.seq));
                                break;
                            }
                            Ok(TurnOutcome::AlreadyCommitted(receipt)) => {
                                counts[1].fetch_add(1, Ordering::Relaxed);
                                line(format!("already {turn} {s} {}", receipt.seq));
                                break;
                            }
                            Err(Error::Rejected(Rejection::RevisionConflict { .. })) => {
                                counts[2].fetch_add(1, Ordering::Relaxed);
                                line(format!("conflict {turn} {s} {}", hex(&parent.0)));
                            }
                            Err(Error::Backend(e)) => {
                                counts[3].fetch_add(1, Ordering::Relaxed);
                                line(format!("unavailable {turn} {}", e.to_string().replace(' ', "_")));
                                std::thread::sleep(Duration::from_millis(50));
                            }
                            Err(e) => return Err(format!("{turn}: {e}")),
                        }
                    }
                }
                Ok(())
            }));
        }
        let results: Vec<_> =
            threads.into_iter().map(|t| t.join().map_err(|_| "a committer panicked".to_string())).collect();
        done.store(true, Ordering::Release);
        for r in results {
            r??;
        }
        Ok(())
    })?;
    let elapsed = started.elapsed();
    let cpu = cpu_ms().saturating_sub(cpu_before);
    let settled = match (args.settle_secs, engine.host_status()) {
        (0, _) | (_, None) => true,
        (secs, Some(status)) => engine.wait_for_stream(status.stream_tip, Duration::from_secs(secs)),
    };
    let mut latencies = latencies.into_inner().unwrap();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let committed = counts[0].load(Ordering::Relaxed);
    let position = engine.host_status().map_or(0, |s| s.position);
    line(format!(
        "summary committed={committed} already={} conflicts={} unavailable={} elapsed_ms={} commits_per_s={:.0} p50_us={} p99_us={} max_lag={} settled={settled} position={position} cpu_ms={cpu}",
        counts[1].load(Ordering::Relaxed),
        counts[2].load(Ordering::Relaxed),
        counts[3].load(Ordering::Relaxed),
        elapsed.as_millis(),
        committed as f64 / elapsed.as_secs_f64(),
        pct(0.5),
        pct(0.99),
        max_lag.load(Ordering::Relaxed),
    ));
    report.lock().unwrap().flush().map_err(|e| e.to_string())?;
    engine.close().map_err(|e| e.to_string())
}
