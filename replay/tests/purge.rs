//! `annal purge` and `annal gc` end to end: a session whose every field carries a marker
//! is purged beside a live session that shares a message with it; the marker is in no
//! byte of either file, before and after `annal compact`; `verify` (and `--deep`) is
//! clean and reports the erasure; `export` shows the tombstone and the erased records,
//! and importing that export reproduces the purged state and the chain.

mod common;

use annal::*;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;

const MARK: &str = "ZQXCLIMARK";

fn file_holds(path: &Path, needle: &str) -> bool {
    let bytes = std::fs::read(path).unwrap();
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn db_holds(path: &Path) -> bool {
    file_holds(path, MARK) || (projections_path(path).exists() && file_holds(&projections_path(path), MARK))
}

/// A database with a marked session and a live one sharing its first message; content
/// stored uncompressed so a byte search can see it.
fn marked_db(path: &Path) -> (SessionId, SessionId, Message) {
    let engine =
        Engine::open_with(path, Options { compression: annal::Compression::Off, ..Options::default() }).unwrap();
    let shared = Message::user("the message both sessions hold");
    let s = engine
        .create_session(
            CreateSession::new()
                .label("tenant", format!("{MARK}-label"))
                .metadata(format!("{MARK}-metadata"))
                .message(shared.clone())
                .message(Message::assistant(format!("{MARK}-answer")).with_attachment(format!("{MARK}-attachment"))),
        )
        .unwrap()
        .session;
    engine
        .append_context(AppendContext {
            session: s,
            key: "memory".into(),
            content: format!("{MARK}-context").into_bytes(),
            source: format!("{MARK}-source"),
        })
        .unwrap();
    engine
        .record_tool_call(RecordToolCall {
            session: s,
            op_id: "op-1".into(),
            call_id: "call-1".into(),
            tool_name: format!("{MARK}-tool"),
            args: format!("{MARK}-args").into_bytes(),
            parent_op: None,
            turn_id: None,
            recovery: Recovery::ReplaySafe,
        })
        .unwrap();
    engine
        .record_tool_result(RecordToolResult {
            session: s,
            op_id: "op-1".into(),
            outcome: ToolOutcome::Ok,
            result: format!("{MARK}-result").into_bytes(),
        })
        .unwrap();
    engine
        .set_labels(SetLabels {
            session: s,
            set: BTreeMap::from([("note".into(), format!("{MARK}-note"))]),
            remove: Default::default(),
        })
        .unwrap();
    engine.acquire_lease(s, format!("{MARK}-owner"), std::time::Duration::from_secs(60)).unwrap();
    engine
        .enqueue_input(
            s,
            format!("{MARK}-input-id"),
            Message::user(format!("{MARK}-input")),
            codec::InputKind::NextTurn,
        )
        .unwrap();
    engine.append_draft(s, format!("{MARK}-draft-id"), format!("{MARK}-draft").into_bytes()).unwrap();
    let live = engine.create_session(CreateSession::new().message(shared.clone())).unwrap().session;
    // A draft of the live session stays.
    engine.append_draft(live, "draft-of-the-live-one", b"kept".to_vec()).unwrap();
    engine.close().unwrap();
    (s, live, shared)
}

#[test]
fn purge_gc_verify_export_import_stats() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("purge.redb");
    let (s, live, shared) = marked_db(&db);
    assert!(db_holds(&db), "the marker is in the file before the purge");

    let out = annal(&["purge", p(&db), &s.to_string(), "--reason", "erasure request", "--actor", "dpo"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains(&format!("purged {s}")), "{}", stdout(&out));
    assert!(!db_holds(&db), "a byte of the purged session is left");

    let out = annal(&["verify", p(&db), "--deep"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("1 sessions purged, 7 records erased"), "{}", stdout(&out));

    // A second purge is refused (exit 2); a purge of the live session's shared message
    // never happened, so it reads.
    assert_eq!(code(&annal(&["purge", p(&db), &s.to_string()])), 2);
    let out = annal(&["transcript", p(&db), &live.to_string(), "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains(std::str::from_utf8(&shared.body).unwrap()));
    let out = annal(&["transcript", p(&db), &s.to_string()]);
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("purged"), "{}", stderr(&out));
    let out = annal(&["sessions", p(&db), "--archived"]);
    assert!(!stdout(&out).contains(&s.to_string()), "{}", stdout(&out));

    // Nothing left to collect; stats reports what the purge reclaimed.
    let out = annal(&["gc", p(&db)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("nothing to collect"), "{}", stdout(&out));
    let out = annal(&["stats", p(&db), "--json"]);
    let stats: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(stats["reclaimed"]["sessions_purged"], 1);
    assert_eq!(stats["sessions_purged"], 1);
    assert_eq!(stats["reclaimed"]["records_erased"], 7);
    assert!(stats["reclaimed"]["content_objects"].as_u64().unwrap() >= 6, "{}", stats["reclaimed"]);

    // The export shows the tombstone and the erased records, and holds no marker.
    let out = annal(&["export", p(&db)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let export = stdout(&out);
    assert!(export.contains("\"kind\":\"SessionPurged\"") && export.contains("\"reason\":\"erasure request\""));
    assert_eq!(export.matches("\"kind\":\"Erased\"").count(), 7);
    assert!(!export.contains(MARK));
    let file = dir.path().join("export.jsonl");
    std::fs::write(&file, &export).unwrap();
    let copy = dir.path().join("copy.redb");
    let out = annal(&["import", p(&file), p(&copy)]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("chain reproduced"), "{}", stdout(&out));
    let out = annal(&["verify", p(&copy), "--deep"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert_eq!(stdout(&annal(&["export", p(&copy)])), export, "export, import, export is identical");
    let out = annal(&["inspect", p(&copy), &s.to_string()]);
    assert!(stderr(&out).contains("purged"), "{}", stderr(&out));
    // The copy ran no purge of its own; the log it holds has the tombstone.
    let copied: serde_json::Value = serde_json::from_str(&stdout(&annal(&["stats", p(&copy), "--json"]))).unwrap();
    assert_eq!(
        (copied["sessions_purged"].as_u64(), copied["reclaimed"]["sessions_purged"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(copied["sessions"], stats["sessions"]);

    // The live session's draft survived the rewrite; the purged one's is gone.
    let engine = Engine::open(&db).unwrap();
    assert_eq!(engine.drafts(live, u64::MAX).len(), 1);
    assert!(engine.drafts(s, u64::MAX).is_empty());
    engine.close().unwrap();

    // Compaction leaves no marker either.
    let out = annal(&["compact", p(&db)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!db_holds(&db));
    assert_eq!(code(&annal(&["verify", p(&db)])), 0);
}

#[test]
fn a_fork_parent_needs_descendants() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("forks.redb");
    let engine = Engine::open(&db).unwrap();
    let parent = engine.create_session(CreateSession::new().message(Message::user("hello"))).unwrap().session;
    let child = engine.fork_at(parent, 1).unwrap().session;
    engine.close().unwrap();
    let out = annal(&["purge", p(&db), &parent.to_string()]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("fork descendants"), "{}", stderr(&out));
    let out = annal(&["purge", p(&db), &parent.to_string(), "--descendants"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("purged {child}")), "{}", stdout(&out));
    assert_eq!(code(&annal(&["verify", p(&db), "--deep"])), 0);
}

/// The online collection beside a live engine: leftover objects (as a hand-edited file
/// could hold) are removed between commits, and `annal verify --deep` is clean after it
/// and `annal stats` counts what it reclaimed.
#[test]
fn an_online_collection_leaves_verify_clean() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("gc.redb");
    let engine = Engine::open(&db).unwrap();
    let s = engine.create_session(CreateSession::new().message(Message::user("hello"))).unwrap().session;
    engine.close().unwrap();
    {
        let raw = redb::Database::create(&db).unwrap();
        let txn = raw.begin_write().unwrap();
        {
            let mut content = annal::pieces::ContentWriter::open(&txn).unwrap();
            let mut row = content.get(1).unwrap().unwrap_or_default();
            for i in 0..3 {
                let object = format!("leftover object {i}").into_bytes();
                let (encoding, stored) = codec::content::encode_object(&object);
                codec::content::push_stored(&mut row, &codec::content_id(&object), encoding, &stored);
            }
            content.put(1, &row).unwrap();
        }
        txn.commit().unwrap();
    }
    std::fs::remove_file(projections_path(&db)).unwrap();
    let engine = Engine::open(&db).unwrap();
    let report = engine.collect_garbage(1).unwrap();
    assert_eq!(report.objects_removed, 3, "{report:?}");
    engine.commit_turn(CommitTurn::new(s, "after", Expected::Any).message(Message::user("more"))).unwrap();
    engine.close().unwrap();
    let out = annal(&["verify", p(&db), "--deep"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let out = annal(&["stats", p(&db), "--json"]);
    let stats: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(stats["reclaimed"]["content_objects"], 3, "{}", stats["reclaimed"]);
}
