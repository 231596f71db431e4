//! Hosts of a shared log under load: commits a second, latency and the fold lag between
//! hosts, with one and two host processes (`annal-load`) on a three-node JetStream
//! cluster on loopback (TLS and authorization on, as in the tests), against the embedded
//! engine (durable, its journal and group commit) running the same load in the same run.
//!
//! `cargo bench -p annal-jetstream --bench hosts` (needs `nats-server`:
//! `bash jetstream/install-server.sh`). `ANNAL_HOSTS_ROUNDS` sets the turns each
//! committer commits (default 150), `ANNAL_HOSTS_BODY` the size of each of a turn's two
//! messages (default 2,000 bytes), `ANNAL_HOSTS_REPEATS` the rounds of the three modes,
//! alternating (default 2).
//!
//! Each host runs 16 committer threads, each on a session of its own (two hosts use
//! sixteen sessions each), so the figures are throughput, not contention. The fold lag
//! is what each host's `host_status().lag()` showed at most, sampled every 5 ms: the
//! messages the stream held that its fold had not taken in.

#[path = "../tests/cluster/mod.rs"]
mod cluster;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const THREADS: usize = 16;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The summary line of a report, as key → value.
fn summary(report: &Path) -> std::collections::BTreeMap<String, String> {
    let text = std::fs::read_to_string(report).unwrap();
    let line = text.lines().find(|l| l.starts_with("summary ")).expect("a summary");
    line.split(' ').skip(1).filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn spawn(args: &[String], dir: &Path, report: &Path, go: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_annal-load"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .arg("--report")
        .arg(report)
        .arg("--go")
        .arg(go)
        .spawn()
        .expect("annal-load starts")
}

fn ready(report: &Path) -> bool {
    std::fs::read_to_string(report).map(|t| t.lines().any(|l| l == "ready")).unwrap_or(false)
}

/// Runs one host per argument list, started together; returns their summaries.
fn run(work: &Path, name: &str, hosts: Vec<Vec<String>>) -> Vec<std::collections::BTreeMap<String, String>> {
    let go = work.join(format!("{name}.go"));
    let mut children = Vec::new();
    let mut reports = Vec::new();
    for (i, args) in hosts.iter().enumerate() {
        let report = work.join(format!("{name}-{i}.txt"));
        children.push(spawn(args, &work.join(format!("{name}-{i}")), &report, &go));
        reports.push(report);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !reports.iter().all(|r| ready(r)) {
        assert!(Instant::now() < deadline, "hosts not ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(&go, b"go").unwrap();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a host failed");
    }
    reports.iter().map(|r| summary(r)).collect()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds = env("ANNAL_HOSTS_ROUNDS", 150);
    let body = env("ANNAL_HOSTS_BODY", 2000);
    let repeats = env("ANNAL_HOSTS_REPEATS", 2);
    let cluster = cluster::Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let common = |offset: usize| -> Vec<String> {
        let mut args = vec!["--threads".to_string(), THREADS.to_string(), "--sessions".into(), THREADS.to_string()];
        args.extend(["--offset".into(), offset.to_string(), "--rounds".into(), rounds.to_string()]);
        args.extend(["--body".into(), body.to_string(), "--settle-secs".into(), "120".into()]);
        args
    };
    println!("{THREADS} committers a host, {rounds} turns each, two messages of {body} bytes a turn");
    println!(
        "{:<26} {:>10} {:>9} {:>9} {:>12} {:>9}",
        "mode", "commits/s", "p50 ms", "p99 ms", "max lag", "vs embedded"
    );
    let ms = |s: &std::collections::BTreeMap<String, String>, k: &str| s[k].parse::<f64>().unwrap() / 1000.0;
    for round in 0..repeats {
        let embedded = {
            let mut args = common(0);
            args.push("--embedded".into());
            run(work.path(), &format!("embedded{round}"), vec![args]).remove(0)
        };
        let base: f64 = embedded["commits_per_s"].parse().unwrap();
        let print = |mode: &str, s: &std::collections::BTreeMap<String, String>, per_s: f64| {
            println!(
                "{mode:<26} {per_s:>10.0} {:>9.2} {:>9.2} {:>12} {:>9.2}x",
                ms(s, "p50_us"),
                ms(s, "p99_us"),
                s["max_lag"],
                per_s / base
            );
        };
        print("embedded, durable", &embedded, base);
        let stream = format!("ONE{round}");
        let mut args = common(0);
        args.extend(["--url".into(), cluster.stream_url(&stream)]);
        let one = run(work.path(), &format!("one{round}"), vec![args]).remove(0);
        print("1 host", &one, one["commits_per_s"].parse().unwrap());
        let stream = format!("TWO{round}");
        let hosts: Vec<Vec<String>> = (0..2)
            .map(|h| {
                let mut args = common(h * THREADS);
                args.extend(["--url".into(), cluster.stream_url(&stream)]);
                args
            })
            .collect();
        let two = run(work.path(), &format!("two{round}"), hosts);
        let total: f64 = two.iter().map(|s| s["commits_per_s"].parse::<f64>().unwrap()).sum();
        for (h, s) in two.iter().enumerate() {
            print(&format!("2 hosts: host {h}"), s, s["commits_per_s"].parse().unwrap());
        }
        println!("{:<26} {total:>10.0} {:>9} {:>9} {:>12} {:>9.2}x", "2 hosts: together", "", "", "", total / base);
    }
}
