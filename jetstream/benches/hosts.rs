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
//! messages the stream held that its fold had not taken in. The CPU columns are the CPU
//! time, per commit, that the host process (its own `/proc/self/stat`) and the three
//! servers together used while the committers ran: against the machine's two cores,
//! they say whether a mode was bound by the CPU or by waiting.

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

/// The CPU time all `nats-server` processes have used, in milliseconds (Linux).
fn servers_cpu_ms() -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() != "nats-server" {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        total += (ticks(11) + ticks(12)) * 10;
    }
    total
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
    let servers_before = servers_cpu_ms();
    std::fs::write(&go, b"go").unwrap();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a host failed");
    }
    let servers = servers_cpu_ms() - servers_before;
    let mut summaries: Vec<_> = reports.iter().map(|r| summary(r)).collect();
    summaries[0].insert("servers_cpu_ms".into(), servers.to_string());
    summaries
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
        "{:<26} {:>10} {:>9} {:>9} {:>8} {:>11} {:>10} {:>11}",
        "mode", "commits/s", "p50 ms", "p99 ms", "max lag", "vs embedded", "host µs/c", "servers µs/c"
    );
    let ms = |s: &std::collections::BTreeMap<String, String>, k: &str| s[k].parse::<f64>().unwrap() / 1000.0;
    for round in 0..repeats {
        let embedded = {
            let mut args = common(0);
            args.push("--embedded".into());
            run(work.path(), &format!("embedded{round}"), vec![args]).remove(0)
        };
        let base: f64 = embedded["commits_per_s"].parse().unwrap();
        let per_commit = |s: &std::collections::BTreeMap<String, String>, k: &str, commits: f64| {
            s.get(k).map_or(String::new(), |v| format!("{:.0}", v.parse::<f64>().unwrap() * 1000.0 / commits))
        };
        let print = |mode: &str, s: &std::collections::BTreeMap<String, String>, per_s: f64, commits: f64| {
            println!(
                "{mode:<26} {per_s:>10.0} {:>9.2} {:>9.2} {:>8} {:>10.2}x {:>10} {:>11}",
                ms(s, "p50_us"),
                ms(s, "p99_us"),
                s["max_lag"],
                per_s / base,
                per_commit(s, "cpu_ms", commits),
                per_commit(s, "servers_cpu_ms", commits),
            );
        };
        let commits = |s: &std::collections::BTreeMap<String, String>| s["committed"].parse::<f64>().unwrap();
        print("embedded, durable", &embedded, base, commits(&embedded));
        let stream = format!("ONE{round}");
        let mut args = common(0);
        args.extend(["--url".into(), cluster.stream_url(&stream)]);
        let one = run(work.path(), &format!("one{round}"), vec![args]).remove(0);
        print("1 host", &one, one["commits_per_s"].parse().unwrap(), commits(&one));
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
        let all: f64 = two.iter().map(commits).sum();
        for (h, s) in two.iter().enumerate() {
            print(&format!("2 hosts: host {h}"), s, s["commits_per_s"].parse().unwrap(), commits(s));
        }
        println!(
            "{:<26} {total:>10.0} {:>9} {:>9} {:>8} {:>10.2}x {:>10} {:>11}",
            "2 hosts: together",
            "",
            "",
            "",
            total / base,
            "",
            per_commit(&two[0], "servers_cpu_ms", all)
        );
    }
}
