//! Files written by earlier releases keep working, and every query gives the same answer.
//!
//! - `tests/fixtures/format1/v1.redb` was written by the format-1 release's `annal demo
//!   --sessions 2` (then compacted): `annal migrate` upgrades it in place, and the records
//!   survive byte for byte (so the chain still verifies and every chain hash is the same).
//! - `tests/fixtures/format2-before-host-state/` holds a format-2 log and its projections
//!   file written by the release before host state, metadata events and the recency
//!   order (its turns are `TurnCommitted` schema 1, its heads and labels projections
//!   version 1): it opens as it is, its projections rebuild, and it takes new writes.
//!
//! - `tests/fixtures/format4-whole-content-rows/` holds a format-4 log and its
//!   projections file, written by `annal demo --sessions 2` of the release before content
//!   pieces: its content rows are whole (`annal::tables::CONTENT`). It opens as it is, its
//!   rows are read where they are, and new rows go to pieces beside them.
//!
//! Each `expected/` holds what the release that wrote the file printed for it: `export`,
//! `sessions --archived --json`, and for every session `inspect --json`, `transcript
//! --limit 10000 --json` and `graph --format dot`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn annal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_annal")).args(args).output().expect("run the annal binary")
}

fn fixture() -> PathBuf {
    fixture_dir("format1")
}

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn stdout_of(args: &[&str]) -> String {
    let out = annal(args);
    assert_eq!(out.status.code(), Some(0), "annal {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn expected_in(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join("expected").join(name)).expect("expected output")
}

/// Every answer the release that wrote `dir`'s fixture printed for it, printed again for
/// the database at `path`: the export byte for byte, the session list and each session's
/// inspection, transcript and graph (head fields added after the oldest fixture are left
/// out on both sides).
fn every_answer_is_the_same(dir: &Path, path: &str) {
    assert_eq!(stdout_of(&["export", path]), expected_in(dir, "export.jsonl"));
    let sessions = stdout_of(&["sessions", path, "--archived", "--json"]);
    let old = without_new_head_fields(&expected_in(dir, "sessions.json"));
    assert_eq!(without_new_head_fields(&sessions), old);
    let listed: serde_json::Value = serde_json::from_str(&sessions).unwrap();
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|h| h["session"].as_str().unwrap()).collect();
    assert!(!ids.is_empty());
    for id in ids {
        let inspected = stdout_of(&["inspect", path, id, "--json"]);
        let old = without_new_head_fields(&expected_in(dir, &format!("inspect-{id}.json")));
        assert_eq!(without_new_head_fields(&inspected), old, "{id}");
        assert_eq!(
            stdout_of(&["transcript", path, id, "--limit", "10000", "--json"]),
            expected_in(dir, &format!("transcript-{id}.json")),
            "{id}"
        );
        let graph = stdout_of(&["graph", path, id, "--format", "dot"]);
        assert_eq!(graph, expected_in(dir, &format!("graph-{id}.dot")), "{id}");
    }
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
                if map.contains_key("session") && map.contains_key("revision") {
                    map.remove("lease");
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
    assert!(migrated.contains(&format!("from format 1 to {}", annal::tables::FORMAT)), "{migrated}");

    // The chain verifies end to end, content included, with a deep fold.
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));

    // Every answer is what the previous release gave, byte for byte: the export carries
    // every record with its chain hash and its content inlined.
    every_answer_is_the_same(&fixture(), path);

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

/// A format-2 file from before host state: schema-1 turns are read as schema 2 with no
/// state change, the heads and labels projections (version 1 on disk) rebuild at open,
/// every answer stays the same, and the file takes commits with host state, metadata and
/// a version fence.
#[test]
fn a_file_from_before_host_state_opens_rebuilds_and_writes_on() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture_dir("format2-before-host-state");
    let db = dir.path().join("v2.redb");
    std::fs::copy(src.join("v2-before.redb"), &db).expect("copy the log");
    std::fs::copy(src.join("v2-before.redb.projections"), annal::projections_path(&db)).expect("copy projections");
    let path = db.to_str().unwrap();

    // Read-only, beside nothing: the old projections are not used, the log is folded.
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    every_answer_is_the_same(&src, path);
    assert_eq!(format_of(&db), 2, "a read-only open leaves the format number as it is");

    // Opened for writing: the format number is upgraded (the file may now hold records
    // that release cannot decode), the projections rebuild, then new kinds of writes land.
    let engine = annal::Engine::open(&db).unwrap();
    assert_eq!(format_of_open(&engine), annal::tables::FORMAT as u64);
    let heads = engine.list_sessions(&annal::ListQuery::new().include_archived().recently_updated()).unwrap().items;
    assert_eq!(heads.len(), 3);
    assert!(heads.windows(2).all(|w| w[0].last_seq > w[1].last_seq), "most recent first");
    let h = heads[0].clone();
    assert!(h.host_state.is_empty());
    let turn = annal::CommitTurn::new(h.session, "after-upgrade", annal::Expected::Version(h.stream_seq))
        .message(annal::Message::user("still here"))
        .set_state("model", b"m2".to_vec());
    engine.commit_turn(turn).unwrap();
    let meta = annal::SetMetadata { session: h.session, metadata: b"v2".to_vec(), expected: annal::Expected::Any };
    assert!(engine.set_metadata(meta).unwrap().is_some());
    assert_eq!(engine.host_state(h.session, "model").unwrap().unwrap(), b"m2");
    let digests = engine.projection_digests().unwrap();
    engine.rebuild(annal::ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), digests, "a rebuild gives the same projections");
    engine.close().unwrap();
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    let rebuilt = annal(&["rebuild", path]);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", String::from_utf8_lossy(&rebuilt.stderr));
}

/// The format number in a closed log file's `meta`.
fn format_of(db: &Path) -> u64 {
    use redb::ReadableDatabase;
    let raw = redb::Database::open(db).unwrap();
    let txn = raw.begin_read().unwrap();
    let meta = txn.open_table(annal::tables::META).unwrap();
    let v = meta.get(annal::tables::meta_keys::FORMAT).unwrap().unwrap().value().to_vec();
    annal::tables::meta_u64(&v).unwrap()
}

/// The format number the open engine's log file holds.
fn format_of_open(engine: &annal::Engine) -> u64 {
    let view = engine.snapshot().unwrap();
    let meta = view.log().open_table(annal::tables::META).unwrap();
    let v = meta.get(annal::tables::meta_keys::FORMAT).unwrap().unwrap().value().to_vec();
    annal::tables::meta_u64(&v).unwrap()
}

/// `annal migrate` on a file of the previous append-only format rewrites its format
/// number and nothing else; a second run has nothing to do.
#[test]
fn migrate_upgrades_the_format_number_of_a_format_2_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v2.redb");
    std::fs::copy(fixture_dir("format2-before-host-state").join("v2-before.redb"), &db).unwrap();
    let path = db.to_str().unwrap();
    let out = stdout_of(&["migrate", path]);
    let format = annal::tables::FORMAT;
    assert!(out.contains(&format!("from format 2 to {format}")), "{out}");
    assert_eq!(format_of(&db), format as u64);
    assert!(stdout_of(&["migrate", path]).contains(&format!("already in format {format}")));
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
}

/// A purge of a session written in record format 1 (its chain link covers the payload, so
/// it cannot be erased in place): the records from the first one the purge erases on are
/// sealed again in format 2, in the same transaction. The chain verifies end to end, the
/// other sessions answer as before, and records already in format 2 after them only get
/// a new chain hash.
#[test]
fn a_session_of_record_format_1_is_purged_and_the_chain_sealed_again() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture_dir("format2-before-host-state");
    let db = dir.path().join("v2.redb");
    std::fs::copy(src.join("v2-before.redb"), &db).expect("copy the log");
    let engine = annal::Engine::open(&db).unwrap();
    let heads = engine.list_sessions(&annal::ListQuery::new().include_archived()).unwrap().items;
    // The fork goes; its parent, which shares the fork's prefix, stays.
    let doomed = heads.iter().find(|h| h.forked_from.is_some()).expect("the fixture has a fork").clone();
    let parent = doomed.forked_from.as_ref().unwrap().session;
    let kept = heads.iter().find(|h| h.session == parent).unwrap().clone();
    let turn =
        annal::CommitTurn::new(kept.session, "format-2", annal::Expected::Any).message(annal::Message::user("new"));
    engine.commit_turn(turn).unwrap();
    let kept_before = engine.transcript(kept.session, annal::PageRequest::first(100)).unwrap();
    engine.close().unwrap();

    let report =
        annal::purge(&db, annal::Options::default(), &annal::PurgeRequest::new(doomed.session, "", "ops")).unwrap();
    assert!(report.records_resealed > 0 && report.records_erased > 0, "{report:?}");
    let verify = annal(&["verify", db.to_str().unwrap(), "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    let engine = annal::Engine::open(&db).unwrap();
    assert!(matches!(engine.head(doomed.session), Err(annal::Error::Rejected(annal::Rejection::Purged { .. }))));
    assert_eq!(engine.transcript(kept.session, annal::PageRequest::first(100)).unwrap(), kept_before);
    engine.close().unwrap();
}

/// A format-4 file keeps its whole content rows: read-only openers and verify read them
/// where they are, every answer stays the same, and once opened for writing (format 5)
/// new rows go to pieces beside them. A purge's rewrite of an old row would move it to
/// pieces (`annal::pieces`); here the old rows stay whole and the new ones are in pieces.
#[test]
fn a_file_with_whole_content_rows_opens_reads_and_writes_on() {
    use redb::{ReadableDatabase, ReadableTableMetadata};
    let dir = tempfile::tempdir().unwrap();
    let src = fixture_dir("format4-whole-content-rows");
    let db = dir.path().join("v4.redb");
    std::fs::copy(src.join("v4.redb"), &db).expect("copy the log");
    std::fs::copy(src.join("v4.redb.projections"), annal::projections_path(&db)).expect("copy projections");
    let path = db.to_str().unwrap();
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    every_answer_is_the_same(&src, path);
    assert_eq!(format_of(&db), 4, "a read-only open leaves the format number as it is");
    let rows_in = |db: &Path| {
        let raw = redb::Database::open(db).unwrap();
        let txn = raw.begin_read().unwrap();
        let whole = txn.open_table(annal::tables::CONTENT).map(|t| t.len().unwrap()).unwrap_or(0);
        let pieces = txn.open_table(annal::pieces::PIECES).map(|t| t.len().unwrap()).unwrap_or(0);
        (whole, pieces)
    };
    let (whole, pieces) = rows_in(&db);
    assert!(whole > 0 && pieces == 0, "{whole} whole rows, {pieces} pieces");

    // Written on: a message whose content row takes several pieces (hex of a
    // pseudo-random stream, which lz4 leaves at about its size).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let body: String = (0..3 * annal::pieces::PIECE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x % 16) as u32, 16).unwrap()
        })
        .collect();
    let engine = annal::Engine::open(&db).unwrap();
    assert_eq!(format_of_open(&engine), annal::tables::FORMAT as u64);
    let created =
        engine.create_session(annal::CreateSession::new().message(annal::Message::user(body.clone()))).unwrap();
    let page = engine.transcript(created.session, annal::PageRequest::new(0, 10)).unwrap();
    assert_eq!(page.messages[0].message.body, body.as_bytes());
    let digests = engine.projection_digests().unwrap();
    engine.rebuild(annal::ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), digests, "a rebuild gives the same projections");
    engine.close().unwrap();
    let (still_whole, pieces) = rows_in(&db);
    assert_eq!(still_whole, whole, "the old rows stay where they are");
    assert!(pieces >= 3, "the new row is in pieces: {pieces}");

    // The old sessions answer as before; the whole file verifies and rebuilds.
    let old: serde_json::Value = serde_json::from_str(&expected_in(&src, "sessions.json")).unwrap();
    for head in old.as_array().unwrap() {
        let id = head["session"].as_str().unwrap();
        assert_eq!(
            stdout_of(&["transcript", path, id, "--limit", "10000", "--json"]),
            expected_in(&src, &format!("transcript-{id}.json")),
            "{id}"
        );
    }
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    let rebuilt = annal(&["rebuild", path]);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", String::from_utf8_lossy(&rebuilt.stderr));
}

/// The format-4 fixture's directory, and a copy of its log file (without its projections
/// file) in `dir`.
fn copy_v4_log(dir: &Path) -> (PathBuf, PathBuf) {
    let src = fixture_dir("format4-whole-content-rows");
    let db = dir.join("v4.redb");
    std::fs::copy(src.join("v4.redb"), &db).expect("copy the log");
    (src, db)
}

/// In a format-4 file, a content collection rewrites the whole rows it touches in pieces
/// (a row is never in both tables) and leaves the others where they are; a purge's scrub
/// then copies every row into the new file in pieces. The other sessions answer as
/// before and the file verifies at each step.
#[test]
fn a_collection_and_a_purge_move_whole_content_rows_to_pieces() {
    use annal::codec::content::{encode_object, push_stored};
    use redb::{ReadableDatabase, ReadableTable};
    let dir = tempfile::tempdir().unwrap();
    let (src, db) = copy_v4_log(dir.path());
    let path = db.to_str().unwrap();
    let layout = |db: &Path| {
        let raw = redb::Database::open(db).unwrap();
        let txn = raw.begin_read().unwrap();
        let whole: Vec<u64> = match txn.open_table(annal::tables::CONTENT) {
            Ok(t) => t.iter().unwrap().map(|e| e.unwrap().0.value()).collect(),
            Err(_) => Vec::new(),
        };
        let mut pieced: Vec<u64> = match txn.open_table(annal::pieces::PIECES) {
            Ok(t) => t.iter().unwrap().map(|e| e.unwrap().0.value().0).collect(),
            Err(_) => Vec::new(),
        };
        pieced.dedup();
        (whole, pieced)
    };
    let (whole, pieced) = layout(&db);
    assert!(pieced.is_empty());
    // Objects nothing refers to in the first whole row, as an interrupted tool of the
    // release that wrote the file could have left them.
    let first = whole[0];
    {
        let raw = redb::Database::open(&db).unwrap();
        let txn = raw.begin_write().unwrap();
        {
            let mut rows = txn.open_table(annal::tables::CONTENT).unwrap();
            let mut row = rows.get(first).unwrap().unwrap().value().to_vec();
            for i in 0..3 {
                let object = format!("leftover {i}").into_bytes();
                let (encoding, stored) = encode_object(&object);
                push_stored(&mut row, &annal::codec::content_id(&object), encoding, &stored);
            }
            rows.insert(first, row.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let engine = annal::Engine::open(&db).unwrap();
    assert_eq!(engine.collect_garbage(1_000).unwrap().objects_removed, 3);
    engine.close().unwrap();
    let (whole_after, pieced) = layout(&db);
    assert_eq!(pieced, vec![first], "the rewritten row moved to pieces");
    assert_eq!(whole_after, whole[1..].to_vec(), "the other rows stayed whole");
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));

    // The session the demo's workers shared: no fork of it, its own content rows.
    let purged = "01a23b3e-3a3d-7293-a8d8-2a72ee31fa18";
    let out = annal(&["purge", path, purged, "--reason", "test", "--actor", "ops"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (whole_after, pieced) = layout(&db);
    assert!(whole_after.is_empty(), "the scrub copied every row in pieces: {whole_after:?}");
    assert!(!pieced.is_empty() && pieced.len() < whole.len(), "{pieced:?}");
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    let old: serde_json::Value = serde_json::from_str(&expected_in(&src, "sessions.json")).unwrap();
    for head in old.as_array().unwrap().iter().filter(|h| h["session"] != purged) {
        let id = head["session"].as_str().unwrap();
        assert_eq!(
            stdout_of(&["transcript", path, id, "--limit", "10000", "--json"]),
            expected_in(&src, &format!("transcript-{id}.json")),
            "{id}"
        );
    }
}

/// A file of an earlier format lists the ids of the content rows written after its
/// upgrade at open, and only those; `annal migrate` lists the rows before it. The file
/// verifies, and rebuilds to the same projections, at each step.
#[test]
fn migrate_lists_the_content_ids_of_the_rows_before_the_upgrade() {
    use redb::{ReadableDatabase, ReadableTable};
    let dir = tempfile::tempdir().unwrap();
    let (_, db) = copy_v4_log(dir.path());
    let path = db.to_str().unwrap();
    // (the seq the listing starts at, the seqs listed, the seqs with a content row)
    let listing = |db: &Path| {
        let raw = redb::Database::open(db).unwrap();
        let txn = raw.begin_read().unwrap();
        let meta = txn.open_table(annal::tables::META).unwrap();
        let from = meta
            .get(annal::tables::meta_keys::CONTENT_IDS_FROM)
            .unwrap()
            .and_then(|g| annal::tables::meta_u64(g.value()));
        let listed: Vec<u64> = match txn.open_table(annal::tables::CONTENT_IDS) {
            Ok(t) => t.iter().unwrap().map(|e| e.unwrap().0.value()).collect(),
            Err(_) => Vec::new(),
        };
        let rows = annal::pieces::ContentReader::open(&txn).unwrap();
        let rows: Vec<u64> = rows.iter().unwrap().map(|r| r.unwrap().0).collect();
        let last = txn.open_table(annal::tables::LOG).unwrap().last().unwrap().map_or(0, |(k, _)| k.value());
        (from, listed, rows, last)
    };
    let (from, listed, rows_before, last_before) = listing(&db);
    assert_eq!((from, listed.len()), (None, 0), "format 4 lists nothing");

    let engine = annal::Engine::open(&db).unwrap();
    engine.create_session(annal::CreateSession::new().message(annal::Message::user("listed"))).unwrap();
    let digests = engine.projection_digests().unwrap();
    engine.close().unwrap();
    let (from, listed, rows, _) = listing(&db);
    assert_eq!(from, Some(last_before + 1), "listed from the first record after the upgrade");
    let after: Vec<u64> = rows.iter().copied().filter(|&s| s > last_before).collect();
    assert!(!after.is_empty());
    assert_eq!(listed, after, "the new rows and only those");
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));

    // A listing cut short (as an interrupted migration leaves it: the first rows listed,
    // the listing not marked whole) reads and verifies as before.
    let half = rows_before[rows_before.len() / 2];
    {
        let raw = redb::Database::open(&db).unwrap();
        let txn = raw.begin_write().unwrap();
        annal::pieces::ContentWriter::open(&txn).unwrap().fill_ids(0..=half).unwrap();
        txn.commit().unwrap();
    }
    let (from_cut, listed, _, _) = listing(&db);
    assert_eq!(from_cut, from);
    assert_eq!(listed.iter().filter(|&&s| s <= half).count(), rows_before.len() / 2 + 1);
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    let engine = annal::Engine::open(&db).unwrap();
    engine.rebuild(annal::ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), digests);
    engine.close().unwrap();

    let migrated = stdout_of(&["migrate", path]);
    assert!(migrated.contains(&format!("the ids of {} earlier content rows listed", rows_before.len())), "{migrated}");
    let (from, listed, rows, _) = listing(&db);
    assert_eq!((from, &listed), (Some(1), &rows), "every row listed");
    let verify = annal(&["verify", path, "--deep"]);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    let engine = annal::Engine::open(&db).unwrap();
    engine.rebuild(annal::ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), digests, "a rebuild from the listing gives the same projections");
    engine.close().unwrap();
    assert!(stdout_of(&["migrate", path]).contains("nothing to do"));
}
