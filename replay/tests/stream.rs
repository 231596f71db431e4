//! The `annal` binary on a shared log's JetStream stream, on a real three-node cluster
//! (Debian's `nats-server`, TLS and passwords on; `bash jetstream/install-server.sh`
//! installs it): verify, export and stats take the stream's URL, rebuild --from makes a
//! host's files again from it, a message written without the chain key is a finding
//! named by its stream sequence, and a wrong password fails at once.
#![cfg(feature = "jetstream")]

#[path = "../../jetstream/tests/cluster/mod.rs"]
mod cluster;

use annal::backend::{Expected as Expect, LogBackend, Publish, Target};
use annal::codec::{Event, LogChain, Record, SessionArchived};
use annal::{CommitTurn, CreateSession, Engine, Expected, Limits, Message, Options, StoredEvent};
use cluster::Cluster;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY_HEX: &str = "4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b";

fn key() -> [u8; 32] {
    [0x4b; 32]
}

fn annal(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_annal")).args(args).output().expect("the annal binary runs")
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn text(out: &Output) -> String {
    format!("--- stdout\n{}--- stderr\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn events(path: &Path) -> (Vec<StoredEvent>, Vec<annal::TableDigest>) {
    cluster::host_files(path, key())
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// A host in this process writes two sessions of three turns each; returns the host's
/// file, a session and the stream's tip.
fn workload(url: &str, dir: &Path) -> (PathBuf, annal::SessionId, u64) {
    let options = annal_jetstream::Options::from_url(url).unwrap();
    let client = Arc::new(annal_jetstream::JetStreamLog::connect(&options).unwrap());
    let path = dir.join("host.redb");
    let engine =
        Engine::open_shared(&path, Options { chain_key: Some(key()), ..Options::default() }, client.clone()).unwrap();
    let mut first = None;
    for s in ["a", "b"] {
        let created = engine.create_session(CreateSession::new().message(Message::system(s))).unwrap();
        let mut head = created.receipt.revision;
        for i in 0..3 {
            let turn = CommitTurn::new(created.session, format!("turn-{s}-{i}"), Expected::Exact(head))
                .message(Message::user(format!("question {s}{i}")))
                .message(Message::assistant(format!("answer {s}{i}")));
            head = engine.commit_turn(turn).unwrap().receipt().revision;
        }
        first.get_or_insert(created.session);
    }
    let tip = LogBackend::tip(&*client).unwrap();
    assert!(engine.wait_for_stream(tip, Duration::from_secs(60)), "the host folds to {tip}");
    engine.close().unwrap();
    (path, first.unwrap(), tip)
}

#[test]
fn verify_export_stats_and_rebuild_take_a_stream() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("chain.key");
    std::fs::write(&key_file, KEY_HEX).unwrap();
    let kf = p(&key_file);
    let url = cluster.stream_url("REPLAY");
    let hosts = dir.path().join("hosts");
    std::fs::create_dir(&hosts).unwrap();
    let (host, session, tip) = workload(&url, &hosts);
    let before = events(&host);
    assert!(before.0.len() >= 8, "two sessions of three turns: {} events", before.0.len());

    // verify: the stream's walk, then the folded files, deep.
    let out = annal(&["verify", &url, "--key-file", kf, "--deep"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(shown.contains(&format!("{tip} messages")) && shown.contains(&format!("tip {tip}")), "{shown}");
    assert!(shown.contains("projection tables compared"), "deep applies to the folded files: {shown}");
    assert!(!shown.contains(&cluster.user().1), "the password is never shown: {shown}");

    // export: the records every host holds.
    let out = annal(&["export", &url, "--key-file", kf]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let exported = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(exported.lines().count(), before.0.len(), "one line per event");
    assert!(exported.contains("turn-b-2"), "{exported}");

    // stats: the stream's tip first.
    let out = annal(&["stats", &url, "--key-file", kf]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("tip {tip}")), "{}", text(&out));
    let out = annal(&["stats", &url, "--key-file", kf, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(json["stream"]["tip"], tip);
    assert_eq!(json["stream"]["records"], before.0.len() as u64);

    // rebuild --from: a host whose projections are garbage gets its whole files again.
    std::fs::write(annal::projections_path(&host), b"not a redb file").unwrap();
    let files = listing(&hosts);
    let out = annal(&["rebuild", p(&host), "--from", &url, "--key-file", kf]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(events(&host), before, "the same events and projections as the host had");
    assert_eq!(listing(&hosts), files, "no temporary file is left");

    // A stream that does not exist: nothing changes, and it is not created.
    let host_bytes = std::fs::read(&host).unwrap();
    let out = annal(&["rebuild", p(&host), "--from", &cluster.stream_url_with("NOPE", &cluster.user().1)]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"), "{}", text(&out));
    assert_eq!(std::fs::read(&host).unwrap(), host_bytes);
    assert_eq!(listing(&hosts), files);

    // A message written without the chain key: void on every host, and a finding.
    let records = before.0.iter().filter(|e| e.record.session == session).count() as u64;
    let record = Record {
        seq: 0,
        session,
        stream_seq: records + 1,
        committed_at_ms: 1,
        event: Event::SessionArchived(SessionArchived { reason: "intruder".into() }),
    };
    let forged =
        annal::shared::encode_message(&[(record, vec![])], &LogChain::plain(), Limits::default().record_bytes_max)
            .unwrap();
    let client = annal_jetstream::JetStreamLog::connect(&annal_jetstream::Options::from_url(&url).unwrap()).unwrap();
    let publish = Publish { target: Target::Session(session), payload: forged, expected: Expect::Any, msg_id: None };
    LogBackend::append(&client, vec![publish]).unwrap();
    let forged_seq = LogBackend::tip(&client).unwrap();
    let out = annal(&["verify", &url, "--key-file", kf]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("stream seq {forged_seq}: forged")),
        "{}",
        text(&out)
    );
    let out = annal(&["verify", &url, "--key-file", kf, "--json"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(json["stream"]["forged"], serde_json::json!([forged_seq]));
    assert_eq!(json["stream"]["messages"], forged_seq);
    assert_eq!(json["file"]["clean"], true, "the fold voided it: {json}");
    assert_eq!(json["file"]["records"], before.0.len() as u64);

    // A wrong password: refused at once, with the servers' word for it.
    let started = Instant::now();
    let out = annal(&["stats", &cluster.stream_url_with("REPLAY", "wrong"), "--key-file", kf]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(err.contains("refused") && err.contains("authorization"), "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
}
