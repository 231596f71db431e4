//! Files written by the previous release (format 1) keep working: `annal migrate` upgrades
//! them in place, the records survive byte for byte (so the chain still verifies and every
//! chain hash is the same), and every query gives the same answer before and after.
//!
//! `tests/fixtures/format1/v1.redb` was written by the previous release's `annal demo
//! --sessions 2` (then compacted). `expected/` holds what that release's `annal` printed
//! for it: `export`, `sessions --archived --json`, and for every session `inspect --json`,
//! `transcript --limit 10000 --json` and `graph --format dot`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn annal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_annal")).args(args).output().expect("run the annal binary")
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format1")
}

fn stdout_of(args: &[&str]) -> String {
    let out = annal(args);
    assert_eq!(out.status.code(), Some(0), "annal {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn expected(name: &str) -> String {
    std::fs::read_to_string(fixture().join("expected").join(name)).expect("expected output")
}

fn copy_fixture(dir: &Path) -> PathBuf {
    let db = dir.join("v1.redb");
    std::fs::copy(fixture().join("v1.redb"), &db).expect("copy fixture");
    db
}

/// Session heads gained fields after the fixture was written (`metadata` and
/// `host_state` in the JSON of `sessions` and `inspect`). Every field the previous
/// release printed must be printed the same; the new ones are taken out before the
/// comparison, everywhere in the document.
fn without_new_head_fields(json: &str) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                if map.contains_key("session") && map.contains_key("revision") && map.contains_key("host_state") {
                    map.remove("metadata");
                    map.remove("host_state");
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v: serde_json::Value = serde_json::from_str(json).expect("JSON output");
    strip(&mut v);
    v
}

#[test]
fn a_format_1_file_is_refused_with_the_command_that_migrates_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = copy_fixture(dir.path());
    let before = std::fs::read(&db).unwrap();
    let out = annal(&["sessions", db.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("annal migrate"), "the error names the command");
    match annal::Engine::open(&db) {
        Err(annal::Error::MigrationRequired { found: 1, supported }) => assert_eq!(supported, annal::tables::FORMAT),
        other => panic!("expected MigrationRequired, got {other:?}"),
    }
    assert_eq!(std::fs::read(&db).unwrap(), before, "a refused open changes no byte");
}

#[test]
fn migration_keeps_every_record_and_every_answer() {
    let dir = tempfile::tempdir().unwrap();
    let db = copy_fixture(dir.path());
    let path = db.to_str().unwrap();
    let migrated = stdout_of(&["migrate", path]);
    assert!(migrated.contains("from format 1 to 2"), "{migrated}");

    // The chain verifies end to end, content included, with a deep fold.
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));

    // Every answer is what the previous release gave, byte for byte: the export carries
    // every record with its chain hash and its content inlined.
    assert_eq!(stdout_of(&["export", path]), expected("export.jsonl"));
    let sessions = stdout_of(&["sessions", path, "--archived", "--json"]);
    let old: serde_json::Value = serde_json::from_str(&expected("sessions.json")).unwrap();
    assert_eq!(without_new_head_fields(&sessions), old);
    let listed: serde_json::Value = serde_json::from_str(&sessions).unwrap();
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|h| h["session"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 3, "two sessions and a fork");
    for id in ids {
        let inspected = stdout_of(&["inspect", path, id, "--json"]);
        let old: serde_json::Value = serde_json::from_str(&expected(&format!("inspect-{id}.json"))).unwrap();
        assert_eq!(without_new_head_fields(&inspected), old, "{id}");
        assert_eq!(
            stdout_of(&["transcript", path, id, "--limit", "10000", "--json"]),
            expected(&format!("transcript-{id}.json")),
            "{id}"
        );
        assert_eq!(stdout_of(&["graph", path, id, "--format", "dot"]), expected(&format!("graph-{id}.dot")), "{id}");
    }

    // A second migration is a no-op.
    let stats = annal::migrate(&db, None).unwrap();
    assert_eq!((stats.from_format, stats.records), (annal::tables::FORMAT, 0));

    // And the engine writes on: a new turn lands after the migrated history.
    let engine = annal::Engine::open(&db).unwrap();
    let tip = engine.tip().unwrap().0;
    let first = engine.list_sessions(&annal::ListQuery::new().include_archived()).unwrap().items[0].clone();
    let turn = annal::CommitTurn::new(first.session, "after-migration", annal::Expected::Any)
        .message(annal::Message::user("still here"));
    let receipt = engine.commit_turn(turn).unwrap().receipt();
    assert_eq!(receipt.seq, tip + 1);
    engine.close().unwrap();
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
}
