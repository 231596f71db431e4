//! Hosts of one shared log on a real three-node JetStream cluster (Debian's
//! `nats-server`, TLS and authorization on): engine processes (`annal-load`) commit to
//! shared sessions with sixteen threads each while servers and hosts are killed, and
//! every host, old or new, ends with the same log and the same projections.

mod cluster;

use annal::{Options, StoredEvent};
use cluster::Cluster;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &str = "4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b";
const THREADS: usize = 16;
const SESSIONS: u64 = 4;

fn key() -> [u8; 32] {
    [0x4b; 32]
}

/// An `annal-load` process, killed if the test ends before it does.
struct Load(Child);

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `annal-load` on `dir`.
fn load(url: &str, dir: &Path, rounds: usize, report: &Path) -> Load {
    let go = report.parent().unwrap().join("go");
    let child = Command::new(env!("CARGO_BIN_EXE_annal-load"))
        .arg("--go")
        .arg(&go)
        .args(["--url", url, "--key", KEY, "--threads", &THREADS.to_string(), "--sessions", &SESSIONS.to_string()])
        .args(["--rounds", &rounds.to_string(), "--settle-secs", "60"])
        .arg("--dir")
        .arg(dir)
        .arg("--report")
        .arg(report)
        .spawn()
        .expect("annal-load starts");
    Load(child)
}

fn finish(child: &mut Load, what: &str, report: &Path) {
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{what} exited with {status}");
    let summary = lines(report).into_iter().find(|l| l[0] == "summary").expect("a summary");
    eprintln!("{what}: {}", summary[1..].join(" "));
}

/// One test at a time: each starts three servers and two hosts on the machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A report's lines, split into words.
fn lines(report: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(report).unwrap_or_default();
    // A host killed mid-line leaves its last line short: it is skipped.
    let whole = |l: &Vec<String>| match l[0].as_str() {
        "committed" => l.len() == 6,
        "conflict" => l.len() == 4,
        _ => true,
    };
    text.lines().map(|l| l.split(' ').map(str::to_string).collect()).filter(whole).collect()
}

/// Lets the hosts started with `load` go once each is ready.
fn go(reports: &[&Path]) {
    wait_until("the hosts to be ready", Duration::from_secs(120), || {
        reports.iter().all(|r| lines(r).iter().any(|l| l[0] == "ready"))
    });
    std::fs::write(reports[0].parent().unwrap().join("go"), b"go").unwrap();
}

fn committed_count(report: &Path) -> usize {
    lines(report).iter().filter(|l| l[0] == "committed").count()
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn events(path: &Path) -> (Vec<StoredEvent>, Vec<annal::TableDigest>) {
    cluster::host_files(path, key())
}

/// A new host, in this process, folds the whole stream; returns its file.
fn new_host(cluster: &Cluster, stream: &str, dir: &Path) -> PathBuf {
    let client = annal_jetstream::JetStreamLog::connect(
        &annal_jetstream::Options::from_url(&cluster.stream_url(stream)).unwrap(),
    )
    .unwrap();
    let tip = client.tip().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("host.redb");
    let engine =
        annal::Engine::open_shared(&path, Options { chain_key: Some(key()), ..Options::default() }, Arc::new(client))
            .unwrap();
    assert!(engine.wait_for_stream(tip, Duration::from_secs(60)), "the new host folds to {tip}");
    engine.close().unwrap();
    path
}

/// What the reports say, checked against the log: each turn of the script was
/// committed exactly once over all hosts, each at the seq its receipt gave and on the
/// parent its caller read; each (session, parent revision) was won by one turn; every
/// other attempt on a taken revision was a conflict or a retry answered as such.
fn check_reports(reports: &[PathBuf], events: &[StoredEvent], rounds: usize) {
    let by_seq: BTreeMap<u64, &StoredEvent> = events.iter().map(|e| (e.record.seq, e)).collect();
    let mut committed: BTreeMap<String, u64> = BTreeMap::new();
    let mut parents: BTreeSet<(String, String)> = BTreeSet::new();
    let mut conflicts = 0;
    for report in reports {
        for l in lines(report) {
            match l[0].as_str() {
                "committed" => {
                    let (turn, session, parent, seq) = (&l[1], &l[2], &l[3], l[4].parse::<u64>().unwrap());
                    assert!(committed.insert(turn.clone(), seq).is_none(), "{turn} committed twice");
                    assert!(parents.insert((session.clone(), parent.clone())), "two turns won {session} at {parent}");
                    let e = by_seq.get(&seq).unwrap_or_else(|| panic!("{turn}'s seq {seq} is not in the log"));
                    match &e.record.event {
                        annal::Event::TurnCommitted(t) => assert_eq!(&t.turn_id, turn, "seq {seq}"),
                        other => panic!("seq {seq} holds {other:?}, not {turn}"),
                    }
                }
                "conflict" => conflicts += 1,
                _ => {}
            }
        }
    }
    let turns: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.record.event {
            annal::Event::TurnCommitted(t) => Some(t.turn_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(turns.len(), THREADS * rounds, "every turn of the script, once");
    assert_eq!(turns.iter().collect::<BTreeSet<_>>().len(), turns.len(), "no turn twice in the log");
    assert!(conflicts > 0, "the hosts raced");
}

#[test]
fn two_host_processes_race_while_a_server_dies_and_a_new_host_folds_the_same_log() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let url = cluster.stream_url("RACE");
    const ROUNDS: usize = 40;
    let (ra, rb) = (work.path().join("a.txt"), work.path().join("b.txt"));
    let mut a = load(&url, &work.path().join("a"), ROUNDS, &ra);
    let mut b = load(&url, &work.path().join("b"), ROUNDS, &rb);
    go(&[&ra, &rb]);
    // Once both have committed, one server dies; the hosts write on.
    wait_until("commits on both hosts", Duration::from_secs(120), || committed_count(&ra) + committed_count(&rb) >= 40);
    let before = committed_count(&ra) + committed_count(&rb);
    cluster.kill(1);
    finish(&mut a, "host a", &ra);
    finish(&mut b, "host b", &rb);
    let after = committed_count(&ra) + committed_count(&rb);
    assert!(after > before, "writes continued after the server died ({before} then {after})");
    cluster.restart(1);
    let (ea, da) = events(&work.path().join("a/host.redb"));
    let (eb, db) = events(&work.path().join("b/host.redb"));
    assert_eq!(ea, eb, "both hosts hold the same records, byte for byte (the chain)");
    assert_eq!(da, db, "and the same projections");
    check_reports(&[ra, rb], &ea, ROUNDS);
    let (ec, dc) = events(&new_host(&cluster, "RACE", &work.path().join("c")));
    assert_eq!((ec, dc), (ea, da), "a new host folds the same log from the stream");
}

#[test]
fn a_host_killed_mid_run_catches_up_and_matches_the_other_byte_for_byte() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let url = cluster.stream_url("KILL");
    const ROUNDS: usize = 40;
    let (ra, rb, rb2) = (work.path().join("a.txt"), work.path().join("b.txt"), work.path().join("b2.txt"));
    let mut a = load(&url, &work.path().join("a"), ROUNDS, &ra);
    let mut b = load(&url, &work.path().join("b"), ROUNDS, &rb);
    go(&[&ra, &rb]);
    wait_until("host b commits", Duration::from_secs(120), || committed_count(&rb) >= 20);
    b.0.kill().unwrap(); // SIGKILL
    let _ = b.0.wait();
    finish(&mut a, "host a, after host b died", &ra);
    // Host b again, on its files: the same script finds its turns in, and it folds on.
    let mut b = load(&url, &work.path().join("b"), ROUNDS, &rb2);
    go(&[&rb2]);
    finish(&mut b, "host b, restarted", &rb2);
    let (ea, da) = events(&work.path().join("a/host.redb"));
    let (eb, db) = events(&work.path().join("b/host.redb"));
    assert_eq!(ea, eb, "the restarted host holds the same records");
    assert_eq!(da, db, "and the same projections");
    // Host b's first run may have lost the answer to a turn that was stored: its report
    // then has no line for it, and the restarted run finds it in.
    check_reports(&[ra, rb, rb2], &ea, ROUNDS);
    let (ec, dc) = events(&new_host(&cluster, "KILL", &work.path().join("c")));
    assert_eq!((ec, dc), (ea, da), "a new host folds the same log from the stream");
}
