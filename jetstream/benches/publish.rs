//! What the stream takes: appends a second, and their latency, on a three-node JetStream
//! cluster on loopback (TLS and authorization on, as in the tests), against the embedded
//! engine's durable commits of the same payload in the same run.
//!
//! `cargo bench -p annal-jetstream --bench publish` (needs `nats-server`:
//! `bash jetstream/install-server.sh`). `ANNAL_PUBLISH_MESSAGES` sets the messages each
//! mode sends (default 6,000), `ANNAL_PUBLISH_BYTES` their size (default 5,000: about a
//! turn of the comparison's workload, compressed).
//!
//! Modes, each at 1 and 16 threads, each thread on its own session:
//! - `jetstream, 1 client`: one `JetStreamLog` that every thread shares; each thread
//!   appends one message at a time under its session's last message (`Expected::Last`),
//!   with a `msg_id`, and waits for the acknowledgement;
//! - `jetstream, 2 clients`: the threads split over two clients, as two hosts would be;
//! - `annal, embedded`: `Engine::commit_turn` of one message of the same size, durable.

#[path = "../tests/cluster/mod.rs"]
mod cluster;

use annal::{CommitTurn, CreateSession, Engine, Expected as Rev, Message};
use annal_codec::SessionId;
use annal_jetstream::{Append, Credentials, Expected, JetStreamLog, Options, Outcome, Target, Tls};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Run {
    per_s: f64,
    p50: Duration,
    p99: Duration,
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// Runs `threads` threads, each calling `one(thread, i)` for its share of `messages`.
fn measure(threads: usize, messages: usize, one: impl Fn(usize, usize) + Sync) -> Run {
    let per_thread = messages / threads;
    let started = Instant::now();
    let mut latencies: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let one = &one;
                scope.spawn(move || {
                    (0..per_thread)
                        .map(|i| {
                            let at = Instant::now();
                            one(t, i);
                            at.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let elapsed = started.elapsed();
    latencies.sort();
    Run {
        per_s: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: quantile(&latencies, 0.5),
        p99: quantile(&latencies, 0.99),
    }
}

fn jetstream(cluster: &cluster::Cluster, clients: usize, threads: usize, messages: usize, payload: &[u8]) -> Run {
    let (user, password) = cluster.user();
    let stream = format!("BENCH{clients}X{threads}");
    let options = Options {
        servers: cluster.urls(),
        credentials: Credentials::UserPassword { user, password },
        tls: Tls { required: true, ca_file: Some(cluster.ca_file()), client_cert: None },
        subject_prefix: stream.to_lowercase(),
        stream,
        ..Options::default()
    };
    let logs: Vec<JetStreamLog> = (0..clients).map(|_| JetStreamLog::connect(&options).unwrap()).collect();
    let last: Vec<std::sync::Mutex<Option<u64>>> = (0..threads).map(|_| std::sync::Mutex::new(None)).collect();
    measure(threads, messages, |t, i| {
        let session = SessionId([t as u8 + 1; 16]);
        let mut last = last[t].lock().unwrap();
        let append = Append {
            target: Target::Session(session),
            payload: payload.to_vec(),
            expected: last.map_or(Expected::NoMessage, Expected::Last),
            msg_id: Some(format!("{t}:{i}")),
        };
        match logs[t % clients].append(vec![append]).unwrap()[0] {
            Outcome::Stored { seq, .. } => *last = Some(seq),
            Outcome::Conflict => panic!("thread {t} conflicted on its own session"),
        }
    })
}

fn embedded(threads: usize, messages: usize, payload: &str) -> Run {
    let dir = tempfile::tempdir_in(std::env::var_os("ANNAL_BENCH_DIR").unwrap_or_else(|| ".".into())).unwrap();
    let engine = Engine::open(dir.path().join("bench.redb")).unwrap();
    let sessions: Vec<std::sync::Mutex<(annal::codec::SessionId, annal::codec::RevisionId)>> = (0..threads)
        .map(|_| {
            let created = engine.create_session(CreateSession::new()).unwrap();
            std::sync::Mutex::new((created.session, created.receipt.revision))
        })
        .collect();
    let engine = Arc::new(engine);
    let run = measure(threads, messages, |t, i| {
        let mut s = sessions[t].lock().unwrap();
        // Each message differs, so that none is deduplicated.
        let turn = CommitTurn::new(s.0, format!("turn-{i}"), Rev::Exact(s.1))
            .message(Message::assistant(format!("{i} {payload}")));
        s.1 = engine.commit_turn(turn).unwrap().receipt().revision;
    });
    Arc::try_unwrap(engine).ok().unwrap().close().unwrap();
    run
}

fn main() {
    let messages = env("ANNAL_PUBLISH_MESSAGES", 6_000);
    let bytes = env("ANNAL_PUBLISH_BYTES", 5_000);
    // Text that compresses about as the workload's does is not needed: the stream does
    // not compress, and the engine's content is this one string per message.
    let text: String = (0..bytes).map(|i| (b'a' + ((i * 7919) % 26) as u8) as char).collect();
    let cluster = cluster::Cluster::start();
    println!("{messages} messages of {bytes} bytes a mode; three nats-server nodes on loopback, TLS, R3");
    println!("| mode | threads | per second | p50 (ms) | p99 (ms) | ÷ annal embedded |");
    println!("|---|---:|---:|---:|---:|---:|");
    for threads in [1, 16] {
        let base = embedded(threads, messages, &text);
        let modes = [
            ("annal, embedded", &base),
            ("jetstream, 1 client", &jetstream(&cluster, 1, threads, messages, text.as_bytes())),
            ("jetstream, 2 clients", &jetstream(&cluster, 2, threads, messages, text.as_bytes())),
        ];
        for (name, run) in modes {
            println!(
                "| {name} | {threads} | {:.0} | {:.2} | {:.2} | {:.2}× |",
                run.per_s,
                run.p50.as_secs_f64() * 1e3,
                run.p99.as_secs_f64() * 1e3,
                run.per_s / base.per_s
            );
        }
    }
}
