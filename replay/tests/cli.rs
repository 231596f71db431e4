//! End-to-end tests of the `annal` binary: the demo, verify (clean and against damaged
//! files), rebuild, export/import, graph, exit codes, and verify beside a live writer.

use annal::codec::{content_id, stored_chain_hash, LogChain, HEADER_LEN};
use annal::tables::{meta_keys, LOG, META};
use annal::{
    CommitTurn, Engine, Expected, Limits, ListQuery, Message, Reader, Restore, Rewrite, RewriteReason, SessionId,
};
use redb::{ReadableDatabase, ReadableTable};
use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;

use common::{annal, code, p, stderr, stdout};

/// A demo database with `sessions` top-level sessions.
fn demo_db(dir: &tempfile::TempDir, sessions: u64) -> PathBuf {
    common::demo_db_named(dir, "demo.redb", sessions)
}

fn verify_json(db: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["verify", p(db), "--json"];
    args.extend_from_slice(extra);
    let out = annal(&args);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    (code(&out), json)
}

fn findings(report: &Value) -> Vec<(String, String, String)> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (s("kind"), s("location"), s("detail"))
        })
        .collect()
}

fn export(db: &Path, extra: &[&str]) -> String {
    let mut args = vec!["export", p(db)];
    args.extend_from_slice(extra);
    let out = annal(&args);
    assert_eq!(code(&out), 0, "export failed: {}", stderr(&out));
    stdout(&out)
}

fn sessions(db: &Path) -> Vec<SessionId> {
    let reader = Reader::open(db, Limits::default(), None).unwrap();
    reader.list_sessions(&ListQuery::new().include_archived()).unwrap().items.iter().map(|h| h.session).collect()
}

/// A live session of the demo that is not a fork: the listing's order follows activity,
/// which the demo's threads interleave differently from run to run, so tests that need
/// a session to write to pick it this way.
fn live_session(db: &Path) -> SessionId {
    let reader = Reader::open(db, Limits::default(), None).unwrap();
    let heads = reader.list_sessions(&ListQuery::new()).unwrap().items;
    heads.iter().find(|h| h.forked_from.is_none()).expect("a live session that is not a fork").session
}

/// Rewrites the stored bytes of log record `seq` with `f`.
fn tamper_record(db: &Path, seq: u64, f: impl FnOnce(&mut Vec<u8>)) {
    let database = redb::Database::open(db).unwrap();
    let txn = database.begin_write().unwrap();
    {
        let mut log = txn.open_table(LOG).unwrap();
        let mut bytes = log.get(seq).unwrap().expect("record exists").value().to_vec();
        f(&mut bytes);
        log.insert(seq, bytes.as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

#[test]
fn demo_verifies_clean_and_rebuild_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 6);
    let out = annal(&["verify", p(&db), "--deep"]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(stdout(&out).contains("clean"), "{}", stdout(&out));
    let before = export(&db, &[]);
    let digests_before = Reader::open(&db, Limits::default(), None).unwrap().projection_digests().unwrap();

    let out = annal(&["rebuild", p(&db)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "no progress bar in a pipe: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("events/s") && text.contains("sessions"), "{text}");

    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 0, "{report}");
    assert_eq!(report["deep"]["tables"], annal::Table::ALL.len());
    assert_eq!(export(&db, &[]), before);
    let digests_after = Reader::open(&db, Limits::default(), None).unwrap().projection_digests().unwrap();
    assert_eq!(digests_before, digests_after);

    // One projection alone, and an unknown name.
    assert_eq!(code(&annal(&["rebuild", p(&db), "--projection", "labels", "--projection", "usage"])), 0);
    assert_eq!(code(&annal(&["rebuild", p(&db), "--projection", "nope"])), 2);
    assert_eq!(verify_json(&db, &["--deep"]).0, 0);
}

/// A rebuild after a crash, with the projections file deleted: the commits the journal
/// alone held are taken into the log file and rebuilt, the journal is gone, and the
/// projections are the live engine's.
#[test]
fn rebuild_after_a_crash_without_a_projections_file_takes_in_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.redb");
    let engine = Engine::open(&live).unwrap();
    let session = engine.create_session(annal::CreateSession::new().message(Message::system("sys"))).unwrap().session;
    for i in 0..12 {
        let turn = CommitTurn::new(session, format!("t{i}"), Expected::Any).message(Message::user(format!("turn {i}")));
        engine.commit_turn(turn).unwrap();
    }
    let digests = engine.projection_digests().unwrap();
    let head = engine.head(session).unwrap().unwrap().revision;
    // The files as a SIGKILL leaves them, less the projections file.
    let db = dir.path().join("crashed.redb");
    for (from, to) in annal::database_files(&live).iter().zip(annal::database_files(&db)) {
        if from.exists() {
            std::fs::copy(from, to).unwrap();
        }
    }
    engine.close().unwrap();
    std::fs::remove_file(annal::projections_path(&db)).unwrap();

    let out = annal(&["rebuild", p(&db)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("13 events, 1 sessions"), "{}", stdout(&out));
    assert!(annal::journal_paths(&db).iter().all(|f| !f.exists()), "the journal went into the log file");
    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 0, "{report}");
    let reader = Reader::open(&db, Limits::default(), None).unwrap();
    assert_eq!(reader.projection_digests().unwrap(), digests);
    assert_eq!(reader.head(session).unwrap().unwrap().revision, head);
}

/// The seq of the first record of `kind`.
fn first_of_kind(db: &Path, kind: annal::EventKind) -> u64 {
    let reader = Reader::open(db, Limits::default(), None).unwrap();
    let page = reader.events(annal::EventQuery { from_seq: 1, max_events: 10_000, max_bytes: 1 << 26 }).unwrap();
    page.events.iter().find(|e| e.record.event.kind() == kind).expect("a record of the kind").record.seq
}

#[test]
fn a_flipped_byte_names_its_sequence_number() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    // A flip that still decodes: one letter of a context source changes case.
    let a = first_of_kind(&db, annal::EventKind::ContextAppended);
    tamper_record(&db, a, |b| {
        let at = b.windows(7).position(|w| w == b"indexer").expect("the source is in the record");
        b[at] ^= 0x20;
    });
    let out = annal(&["verify", p(&db)]);
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains(&format!("FINDING log seq {a}: chain hash")), "{}", stdout(&out));
    let (_, report) = verify_json(&db, &[]);
    let f = findings(&report);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].0.as_str(), f[0].1.clone()), ("chain_mismatch", format!("log seq {a}")));

    // A flip that does not decode (the kind byte) is reported at its own seq, and nothing
    // else: the session's later records are still checked against the right position.
    let b = a + 3;
    tamper_record(&db, b, |bytes| bytes[5] = 0xee);
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1);
    let f = findings(&report);
    let at = |seq: u64| format!("log seq {seq}");
    assert!(f.iter().any(|(k, l, _)| k == "undecodable" && *l == at(b)), "{f:?}");
    assert!(f.iter().all(|(_, l, _)| *l == at(a) || *l == at(b)), "{f:?}");
    assert_eq!(f.len(), 3, "{f:?}");
}

/// verify checks a log of at most 512 records on one thread and a longer one with a fold
/// thread, a chain thread and a content thread: both ways find the same damage, and
/// nothing else.
#[test]
fn a_flipped_byte_is_found_on_one_thread_and_on_four() {
    let dir = tempfile::tempdir().unwrap();
    for (name, sessions) in [("short.redb", 2), ("long.redb", 40)] {
        let db = common::demo_db_named(&dir, name, sessions);
        let (rc, clean) = verify_json(&db, &["--deep"]);
        assert_eq!(rc, 0, "{clean}");
        let records = clean["records"].as_u64().expect("records");
        assert_eq!(records > 512, name == "long.redb", "{name} holds {records} records");
        let a = first_of_kind(&db, annal::EventKind::ContextAppended);
        tamper_record(&db, a, |b| {
            let at = b.windows(7).position(|w| w == b"indexer").expect("the source is in the record");
            b[at] ^= 0x20;
        });
        let (rc, report) = verify_json(&db, &[]);
        assert_eq!(rc, 1, "{name}");
        let f = findings(&report);
        assert_eq!(f.len(), 1, "{name}: {f:?}");
        assert_eq!((f[0].0.as_str(), f[0].1.clone()), ("chain_mismatch", format!("log seq {a}")), "{name}");
    }
}

#[test]
fn a_deleted_record_is_reported_as_a_gap_and_verify_keeps_going() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    {
        let database = redb::Database::open(&db).unwrap();
        let txn = database.begin_write().unwrap();
        txn.open_table(LOG).unwrap().remove(9).unwrap();
        txn.commit().unwrap();
    }
    // A second, independent problem later in the log.
    tamper_record(&db, 20, |b| b[HEADER_LEN + 2] ^= 0x40);
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1);
    let f = findings(&report);
    assert!(f.iter().any(|(k, l, d)| k == "gap" && l == "log seq 9" && d.contains("record 9 is missing")), "{f:?}");
    assert!(f.iter().any(|(k, l, _)| k == "chain_mismatch" && l == "log seq 20"), "{f:?}");
    assert_eq!(report["records"], report["tip"]["seq"].as_u64().unwrap() - 1);
}

/// A content row whose record is gone, and one before the first record, are stray rows
/// wherever they sit in the log, with or without `deep` (which reads the rows beside the
/// log; without it, the content scan's rows are matched to the records walked).
#[test]
fn content_rows_with_no_record_inside_the_log_are_stray() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let tip = records(&db).len() as u64;
    // A record in the middle of the log that introduced content: its row stays.
    let orphan = edit_content_rows(&db, |rows| {
        let (&seq, first) = rows.iter().find(|(seq, _)| **seq > 2 && **seq < tip - 2).expect("a row inside the log");
        rows.insert(0, vec![first[0].clone()]);
        seq
    });
    {
        let database = redb::Database::open(&db).unwrap();
        let txn = database.begin_write().unwrap();
        txn.open_table(LOG).unwrap().remove(orphan).unwrap();
        txn.commit().unwrap();
    }
    for deep in [false, true] {
        let (rc, report) = verify_json(&db, if deep { &["--deep"] } else { &[] });
        assert_eq!(rc, 1);
        let f = findings(&report);
        let stray: Vec<&str> =
            f.iter().filter(|(k, _, _)| k == "stray_content_row").map(|(_, l, _)| l.as_str()).collect();
        assert_eq!(stray, ["content row 0".to_string(), format!("content row {orphan}")], "deep {deep}: {f:?}");
        let gap = format!("log seq {orphan}");
        assert!(f.iter().any(|(k, l, _)| k == "gap" && *l == gap), "deep {deep}: {f:?}");
    }
}

/// A message object taken out of its row, and a tool result introduced after the record
/// that refers to it, are found the same way on one thread and on four (where the
/// content references are gathered beside the chain check).
#[test]
fn content_reference_findings_on_one_thread_and_on_four() {
    let dir = tempfile::tempdir().unwrap();
    for (name, sessions) in [("short.redb", 2), ("long.redb", 40)] {
        let db = common::demo_db_named(&dir, name, sessions);
        let records = records(&db);
        let tip = records.len() as u64;
        assert_eq!(tip > 512, name == "long.redb", "{name} holds {tip} records");
        let turn = records.iter().rev().find(|r| matches!(r.event, annal::Event::TurnCommitted(_))).unwrap();
        let message = turn.event.content_refs()[0];
        let result = records.iter().find_map(|r| match &r.event {
            annal::Event::ToolResultRecorded(e) if r.seq < tip => Some((r.seq, e.result)),
            _ => None,
        });
        let (result_seq, result) = result.expect("the demo records a tool result");
        edit_content_rows(&db, |rows| {
            let mut moved = None;
            for objects in rows.values_mut() {
                objects.retain(|(id, _)| *id != message);
                if let Some(at) = objects.iter().position(|(id, _)| *id == result) {
                    moved = Some(objects.remove(at));
                }
            }
            // Introduced by the last record's row instead of its own.
            rows.entry(tip).or_default().push(moved.expect("the result is stored"));
        });
        let (rc, report) = verify_json(&db, &[]);
        assert_eq!(rc, 1, "{name}");
        let f = findings(&report);
        let missing = (
            "missing_content".to_string(),
            format!("content {}", message.to_hex()),
            format!("missing, referred to by log seq {}", turn.seq),
        );
        assert!(f.contains(&missing), "{name}: {f:?}");
        let late = f.iter().any(|(k, l, d)| {
            k == "content_after_reference"
                && *l == format!("content {}", result.to_hex())
                && d.contains(&format!("log seq {result_seq}"))
        });
        assert!(late, "{name}: {f:?}");
        assert_eq!(f.len(), 2, "{name}: {f:?}");
    }
}

/// The content rows of a log file: seq → the objects of its row (id, stored bytes).
type ContentRows = std::collections::BTreeMap<u64, Vec<(annal::ContentId, Vec<u8>)>>;

/// Rewrites the content rows of `db` through `f` (a row left empty is removed) and
/// returns what `f` returns.
fn edit_content_rows<T>(db: &Path, f: impl FnOnce(&mut ContentRows) -> T) -> T {
    let database = redb::Database::open(db).unwrap();
    let txn = database.begin_write().unwrap();
    let out = {
        let mut table = annal::pieces::ContentWriter::open(&txn).unwrap();
        let mut rows = ContentRows::new();
        for entry in table.iter().unwrap() {
            let (seq, row) = entry.unwrap();
            // Canonical bytes: edited rows are written back with every object raw.
            let objects = annal::codec::content::entries(&row, u64::MAX)
                .map(|e| e.map(|e| (e.id, e.canonical(u64::MAX).unwrap().into_owned())).unwrap())
                .collect();
            rows.insert(seq, objects);
        }
        let before = rows.clone();
        let out = f(&mut rows);
        for seq in before.keys().filter(|seq| rows.get(seq).is_none_or(Vec::is_empty)) {
            table.remove(*seq).unwrap();
        }
        for (seq, objects) in rows.iter().filter(|(seq, o)| !o.is_empty() && before.get(seq) != Some(o)) {
            let mut row = Vec::new();
            for (id, bytes) in objects {
                annal::codec::content::push_entry(&mut row, id, bytes);
            }
            table.put(*seq, &row).unwrap();
        }
        out
    };
    txn.commit().unwrap();
    out
}

/// Every record of `db`, through a reader (so before any damage).
fn records(db: &Path) -> Vec<annal::Record> {
    let reader = Reader::open(db, Limits::default(), None).unwrap();
    let page = reader.events(annal::EventQuery { from_seq: 1, max_events: 10_000, max_bytes: 1 << 26 }).unwrap();
    page.events.into_iter().map(|e| e.record).collect()
}

/// A compressed object with one flipped byte in its stored (compressed) bytes is named at
/// its id, and reading it fails closed: an lz4 object.
#[test]
fn a_damaged_compressed_object_is_named_at_its_id() {
    a_damaged_object_is_named(annal::Compression::Lz4, annal::codec::content::ENCODING_LZ4);
}

/// The same for a zstd object.
#[test]
fn a_damaged_zstd_object_is_named_at_its_id() {
    a_damaged_object_is_named(annal::Compression::Zstd, annal::codec::content::ENCODING_ZSTD);
}

/// Commits a long message under `compression` and flips a byte in the middle of the
/// first object stored as `encoding`.
fn a_damaged_object_is_named(compression: annal::Compression, encoding: u8) {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 1);
    let engine = Engine::open_with(&db, annal::Options { compression, ..annal::Options::default() }).unwrap();
    let session = live_session(&db);
    let long = "the agent reads the file, runs the tests and writes the diff\n".repeat(50);
    let turn = CommitTurn::new(session, "long", Expected::Any).message(Message::assistant(long));
    engine.commit_turn(turn).unwrap();
    engine.close().unwrap();
    let (row, damaged) = {
        let database = redb::Database::open(&db).unwrap();
        let txn = database.begin_write().unwrap();
        let found = {
            let mut table = annal::pieces::ContentWriter::open(&txn).unwrap();
            let mut found = None;
            let rows: Vec<(u64, Vec<u8>)> = table.iter().unwrap().map(|e| e.unwrap()).collect();
            'rows: for (seq, mut bytes) in rows {
                let mut at = 0;
                for entry in annal::codec::content::entries(&bytes.clone(), u64::MAX) {
                    let entry = entry.unwrap();
                    let header = annal::codec::content::ENTRY_HEADER_LEN;
                    if entry.encoding == encoding {
                        // Past the declared length: a byte of the lz4 block or the zstd frame.
                        bytes[at + header + 4 + entry.stored.len() / 2] ^= 0x5a;
                        table.put(seq, &bytes).unwrap();
                        found = Some((seq, entry.id));
                        break 'rows;
                    }
                    at += header + entry.stored.len();
                }
            }
            found.expect("the demo stores compressible objects compressed")
        };
        txn.commit().unwrap();
        found
    };
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1, "{report}");
    let f = findings(&report);
    let location = format!("content {}", damaged.to_hex());
    assert!(
        f.iter().any(|(k, l, d)| k == "content_hash" && *l == location && d.contains(&format!("content row {row}"))),
        "{f:?}"
    );
    let reader = Reader::open(&db, Limits::default(), None).unwrap();
    assert!(matches!(reader.content(damaged), Err(annal::Error::Corrupt { .. })), "reads fail closed");
}

#[test]
fn a_damaged_content_object_is_named_with_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let (row, damaged) = edit_content_rows(&db, |rows| {
        let (seq, objects) = rows.iter_mut().next().expect("some content");
        let object = objects.iter_mut().find(|(_, bytes)| !bytes.is_empty()).expect("an object with bytes");
        object.1[0] ^= 0xff;
        (*seq, object.0)
    });
    for deep in [false, true] {
        let (rc, report) = verify_json(&db, if deep { &["--deep"] } else { &[] });
        assert_eq!(rc, 1);
        let f = findings(&report);
        let location = format!("content {}", damaged.to_hex());
        let row = format!("(content row {row}, referred to by log seq {row})");
        assert!(f.iter().any(|(k, l, d)| k == "content_hash" && *l == location && d.contains(&row)), "{f:?}");
        assert!(f.iter().all(|(k, _, _)| k == "content_hash"), "{f:?}");
        if deep {
            // The ids still fold: the projections are compared, and agree.
            assert_eq!(report["deep"]["tables"], annal::Table::ALL.len(), "{report}");
        }
    }
}

#[test]
fn a_damaged_content_row_a_stray_row_and_a_second_copy_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let tip = records(&db).len() as u64;
    // A row at a seq with no record, holding a second copy of a stored object.
    let (copied, first_row) = edit_content_rows(&db, |rows| {
        let (&first_row, first) = rows.iter().next().unwrap();
        let copy = first[0].clone();
        rows.insert(tip + 3, vec![copy.clone()]);
        (copy.0, first_row)
    });
    // A row of several objects loses its last byte: its last object no longer parses.
    let (cut_row, lost) = edit_content_rows(&db, |rows| {
        let found = rows.iter().find(|(seq, o)| **seq <= tip && o.len() > 1 && !o[o.len() - 1].1.is_empty());
        let (seq, objects) = found.expect("a row of several objects");
        (*seq, objects[objects.len() - 1].0)
    });
    {
        let database = redb::Database::open(&db).unwrap();
        let txn = database.begin_write().unwrap();
        {
            let mut table = annal::pieces::ContentWriter::open(&txn).unwrap();
            let mut row = table.get(cut_row).unwrap().unwrap();
            row.pop();
            table.put(cut_row, &row).unwrap();
        }
        txn.commit().unwrap();
    }
    for deep in [false, true] {
        let (rc, report) = verify_json(&db, if deep { &["--deep"] } else { &[] });
        assert_eq!(rc, 1);
        let f = findings(&report);
        let has = |kind: &str, location: String, detail: &str| {
            f.iter().any(|(k, l, d)| k == kind && *l == location && d.contains(detail))
        };
        assert!(has("content_row", format!("content row {cut_row}"), "does not parse after"), "{f:?}");
        assert!(
            has("missing_content", format!("content {}", lost.to_hex()), "missing, referred to by log seq"),
            "{f:?}"
        );
        assert!(has("stray_content_row", format!("content row {}", tip + 3), "no log record has this seq"), "{f:?}");
        let again = format!("stored again in content row {} (first stored in content row {first_row})", tip + 3);
        assert!(has("duplicate_content", format!("content {}", copied.to_hex()), &again), "{f:?}");
        let expected = ["content_row", "missing_content", "stray_content_row", "duplicate_content"];
        assert!(f.iter().all(|(k, _, _)| expected.contains(&k.as_str())), "{f:?}");
        if deep {
            assert!(report["deep"]["skipped"].is_string(), "{report}");
        }
    }
}

/// A reference answered by its own record's row (the content scan notes it on that
/// object) is still checked against the first copy of its id: when an earlier row holds
/// a damaged copy of a message, the reference is reported at that row, on one thread and
/// on four.
#[test]
fn a_reference_answered_by_a_later_copy_is_checked_against_the_first() {
    let dir = tempfile::tempdir().unwrap();
    for (name, sessions) in [("short.redb", 2), ("long.redb", 40)] {
        let db = common::demo_db_named(&dir, name, sessions);
        let records = records(&db);
        let turn = records.iter().rev().find(|r| matches!(r.event, annal::Event::TurnCommitted(_))).unwrap();
        let message = turn.event.content_refs()[0];
        let first_row = edit_content_rows(&db, |rows| {
            assert!(rows[&turn.seq].iter().any(|(id, _)| *id == message), "{name}: the turn introduced it");
            // A damaged copy in the first row, long before the turn.
            let (&first_row, objects) = rows.iter_mut().next().unwrap();
            assert!(first_row < turn.seq);
            objects.push((message, b"not the message".to_vec()));
            first_row
        });
        let (rc, report) = verify_json(&db, &[]);
        assert_eq!(rc, 1, "{name}");
        let f = findings(&report);
        let location = format!("content {}", message.to_hex());
        let damaged = format!("(content row {first_row}, referred to by log seq {})", turn.seq);
        assert!(
            f.iter().any(|(k, l, d)| k == "content_hash" && *l == location && d.contains(&damaged)),
            "{name}: {f:?}"
        );
        let again = format!("stored again in content row {} (first stored in content row {first_row})", turn.seq);
        assert!(
            f.iter().any(|(k, l, d)| k == "duplicate_content" && *l == location && d.contains(&again)),
            "{name}: {f:?}"
        );
        assert_eq!(f.len(), 2, "{name}: {f:?}");
    }
}

#[test]
fn content_introduced_after_its_first_reference_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let records = records(&db);
    let tip = records.len() as u64;
    let (moved, attachment, message, plain_row, message_row) = edit_content_rows(&db, |rows| {
        // Context text, introduced by the record that appends it: moved to the tip's row.
        let (plain_row, id) = records
            .iter()
            .filter(|r| r.seq < tip)
            .find_map(|r| match &r.event {
                annal::Event::ContextAppended(c) => rows
                    .get(&r.seq)
                    .filter(|objects| objects.iter().any(|(id, _)| *id == c.content))
                    .map(|_| (r.seq, c.content)),
                _ => None,
            })
            .expect("a context append that introduces its text");
        // A message's attachment, introduced with it: moved to the tip's row too.
        let (message_row, message, attachment) = rows
            .iter()
            .filter(|(seq, _)| **seq < tip)
            .find_map(|(seq, objects)| {
                objects.iter().find_map(|(id, bytes)| {
                    let m = annal::codec::decode_message(bytes, 1 << 26).ok()?;
                    let a = *m.attachments.first()?;
                    objects.iter().any(|(o, _)| *o == a).then_some((*seq, *id, a))
                })
            })
            .expect("a message stored with its attachment");
        let mut take = |row: u64, id: annal::ContentId| {
            let objects = rows.get_mut(&row).unwrap();
            let at = objects.iter().position(|(o, _)| *o == id).unwrap();
            objects.remove(at)
        };
        let (a, b) = (take(plain_row, id), take(message_row, attachment));
        rows.entry(tip).or_default().extend([a, b]);
        (id, attachment, message, plain_row, message_row)
    });
    for deep in [false, true] {
        let (rc, report) = verify_json(&db, if deep { &["--deep"] } else { &[] });
        assert_eq!(rc, 1, "{report}");
        let mut f = findings(&report);
        f.sort();
        let mut expected = vec![
            (
                "content_after_reference".to_string(),
                format!("content {}", moved.to_hex()),
                format!("introduced by content row {tip}, after log seq {plain_row} refers to it"),
            ),
            (
                "content_after_reference".to_string(),
                format!("content {}", attachment.to_hex()),
                format!(
                    "attachment introduced by content row {tip}, after its message {} (content row {message_row})",
                    message.to_hex()
                ),
            ),
        ];
        expected.sort();
        assert_eq!(f, expected);
        if deep {
            // The engine's own fold refuses the reference, so there is nothing to compare.
            assert!(report["deep"]["skipped"].as_str().unwrap().contains("does not fold cleanly"), "{report}");
        }
    }
}

#[test]
fn a_damaged_object_nothing_refers_to_is_found_without_deep() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let stray = b"bytes no event refers to".to_vec();
    let id = content_id(&stray);
    let row = edit_content_rows(&db, |rows| {
        let (seq, objects) = rows.iter_mut().next_back().expect("some content");
        let mut damaged = stray.clone();
        damaged[0] ^= 1;
        objects.push((id, damaged));
        *seq
    });
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1);
    let f = findings(&report);
    let detail = format!("bytes do not hash to the id (content row {row})");
    assert_eq!(f, vec![("content_hash".into(), format!("content {}", id.to_hex()), detail)]);
}

#[test]
fn a_missing_attachment_is_named_with_the_record_that_refers_to_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let records = records(&db);
    let (message, attachment) = edit_content_rows(&db, |rows| {
        let found = rows.values().flatten().find_map(|(id, bytes)| {
            let m = annal::codec::decode_message(bytes, 1 << 26).ok()?;
            m.attachments.first().map(|a| (*id, *a))
        });
        let (message, attachment) = found.expect("the demo stores a message with an attachment");
        for objects in rows.values_mut() {
            objects.retain(|(id, _)| *id != attachment);
        }
        (message, attachment)
    });
    let seq = records.iter().find(|r| r.event.content_refs().contains(&message)).unwrap().seq;
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1);
    let f = findings(&report);
    let expected = (
        "missing_content".to_string(),
        format!("content {}", attachment.to_hex()),
        format!("missing, referred to by log seq {seq}"),
    );
    assert_eq!(f, vec![expected]);
}

/// Rewrites projection rows in the projections file of `db` through `f`.
fn edit_projections<T>(db: &Path, f: impl FnOnce(&mut redb::Table<&'static [u8], &'static [u8]>) -> T) -> T {
    let database = redb::Database::open(annal::projections_path(db)).unwrap();
    let txn = database.begin_write().unwrap();
    let out = f(&mut txn.open_table(annal::tables::PROJECTIONS).unwrap());
    txn.commit().unwrap();
    out
}

#[test]
fn deep_names_a_stored_projection_row_that_differs_from_the_fold() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let first = edit_projections(&db, |rows| {
        let (k, mut v) = {
            let row = rows.first().unwrap().expect("a projection row");
            (row.0.value().to_vec(), row.1.value().to_vec())
        };
        v.push(0);
        rows.insert(k.as_slice(), v.as_slice()).unwrap();
        annal::tables::logical_key(&k)
    });
    let (table, key) = first.expect("a well-formed key");
    assert_eq!(verify_json(&db, &[]).0, 0, "without --deep the projections are not read");
    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 1);
    let location = format!("projection {} key {}", table.name(), annal::codec::hex(&key));
    let expected = ("projection".to_string(), location, "stored value differs from the fold".to_string());
    assert_eq!(findings(&report), vec![expected]);
    // A row the engine cannot place: the stored projections cannot be read.
    edit_projections(&db, |rows| rows.insert([0xffu8].as_slice(), [].as_slice()).map(|_| ()).unwrap());
    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 1);
    let f = findings(&report);
    assert!(f.len() == 1 && f[0].0 == "storage" && f[0].1 == "projections", "{f:?}");
    assert!(f[0].2.starts_with("cannot be read: "), "{f:?}");
}

#[test]
fn a_message_reference_to_plain_bytes_is_not_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let reader = Reader::open(&db, Limits::default(), None).unwrap();
    let page = reader.events(annal::EventQuery { from_seq: 1, max_events: 10_000, max_bytes: 1 << 26 }).unwrap();
    drop(reader);
    // Context text is stored as plain bytes. A later turn is rewritten to name it as its
    // first message, and the record re-sealed onto the chain as a forger would.
    let (context_seq, bytes_id) = page
        .events
        .iter()
        .find_map(|e| match &e.record.event {
            annal::Event::ContextAppended(c) => Some((e.record.seq, c.content)),
            _ => None,
        })
        .expect("a context append");
    let mut turn = page
        .events
        .iter()
        .find(|e| e.record.seq > context_seq && matches!(e.record.event, annal::Event::TurnCommitted(_)))
        .expect("a later turn")
        .record
        .clone();
    let seq = turn.seq;
    if let annal::Event::TurnCommitted(t) = &mut turn.event {
        t.messages[0] = bytes_id;
    }
    let prev = {
        let database = redb::Database::open(&db).unwrap();
        let txn = database.begin_read().unwrap();
        let log = txn.open_table(LOG).unwrap();
        let bytes = log.get(seq - 1).unwrap().unwrap().value().to_vec();
        stored_chain_hash(&bytes).unwrap()
    };
    let (sealed, _) = annal::codec::encode_record(&turn, &prev, &LogChain::plain(), 1 << 27).unwrap();
    tamper_record(&db, seq, |b| *b = sealed);
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1);
    let f = findings(&report);
    let location = format!("content {}", bytes_id.to_hex());
    assert!(
        f.iter().any(|(k, l, d)| k == "not_a_message" && *l == location && d.contains(&format!("log seq {seq}"))),
        "{f:?}"
    );
    // The forged record also fails its commit hash; the chain link of the next record breaks.
    assert!(f.iter().any(|(k, l, _)| k == "commit_hash" && *l == format!("log seq {seq}")), "{f:?}");
}

#[test]
fn verify_of_a_damaged_page_reports_and_never_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let pristine = std::fs::read(&db).unwrap();
    let copy = dir.path().join("damaged.redb");
    let mut codes = std::collections::BTreeMap::new();
    for page in 0..pristine.len() / 4096 {
        for offset in [0, 64, 2048] {
            let mut bytes = pristine.clone();
            bytes[page * 4096 + offset] ^= 0xff;
            std::fs::write(&copy, &bytes).unwrap();
            let out = annal(&["verify", p(&copy), "--deep", "--json"]);
            let rc = out.status.code().unwrap_or_else(|| panic!("page {page} offset {offset}: killed by a signal"));
            assert!(rc <= 2, "page {page} offset {offset}: exit {rc}: {}", stderr(&out));
            if rc == 1 {
                // A finding comes with a whole report.
                let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
                assert!(!report["findings"].as_array().unwrap().is_empty());
            }
            *codes.entry(rc).or_insert(0) += 1;
        }
    }
    assert!(codes.get(&1).copied().unwrap_or(0) > 0, "some damage is found: {codes:?}");
}

#[test]
fn read_commands_on_a_damaged_page_fail_with_a_finding_and_never_crash() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let session = live_session(&db).to_string();
    let projections = dir.path().join("demo.redb.projections");
    let copy = dir.path().join("damaged.redb");
    let copy_projections = dir.path().join("damaged.redb.projections");
    let mut codes = std::collections::BTreeMap::new();
    for (file, target) in [(&db, &copy), (&projections, &copy_projections)] {
        let pristine = std::fs::read(file).unwrap();
        for page in 0..pristine.len() / 4096 {
            for offset in [0, 16] {
                let mut bytes = pristine.clone();
                bytes[page * 4096 + offset] ^= 0xff;
                std::fs::copy(&db, &copy).unwrap();
                std::fs::copy(&projections, &copy_projections).unwrap();
                std::fs::write(target, &bytes).unwrap();
                for args in [vec!["sessions", p(&copy)], vec!["inspect", p(&copy), &session], vec!["stats", p(&copy)]] {
                    let out = annal(&args);
                    let at = format!("{} page {page} offset {offset}: {args:?}", file.display());
                    let rc = out.status.code().unwrap_or_else(|| panic!("{at}: killed by a signal"));
                    assert!(rc <= 2, "{at}: exit {rc}: {}", stderr(&out));
                    assert!(!stderr(&out).contains("panicked"), "{at}: {}", stderr(&out));
                    *codes.entry(rc).or_insert(0) += 1;
                }
            }
        }
    }
    assert!(codes.get(&0).copied().unwrap_or(0) > 0, "damage where nothing is read changes nothing: {codes:?}");
}

/// A log file cut short is reported with the read that failed (a read past its end),
/// not with redb's "a previous I/O error occurred" that every read after it gives:
/// `verify` as a finding, a read command as a file it cannot open.
#[test]
fn a_log_file_cut_short_is_reported_as_cut_short() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let bytes = std::fs::read(&db).unwrap();
    std::fs::write(&db, &bytes[..bytes.len() / 2 / 4096 * 4096]).unwrap();
    let out = annal(&["verify", p(&db)]);
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("it was cut short"), "{}", stdout(&out));
    for args in [vec!["sessions", p(&db)], vec!["stats", p(&db)]] {
        let out = annal(&args);
        assert_ne!(code(&out), 0, "{args:?}");
        assert!(stderr(&out).contains("it was cut short"), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("Previous I/O error"), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn a_projections_file_named_in_place_of_its_log_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 1);
    let export_file = dir.path().join("export.jsonl");
    std::fs::write(&export_file, export(&db, &[])).unwrap();
    let projections = std::fs::read(dir.path().join("demo.redb.projections")).unwrap();
    let named = dir.path().join("named.redb");
    let files = || {
        let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    };
    std::fs::write(&named, &projections).unwrap();
    let before = files();
    let session = live_session(&db).to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["sessions", p(&named)],
        vec!["inspect", p(&named), &session],
        vec!["log", p(&named)],
        vec!["stats", p(&named)],
        vec!["export", p(&named)],
        vec!["verify", p(&named)],
        vec!["rebuild", p(&named)],
        vec!["migrate", p(&named)],
        vec!["compact", p(&named)],
        vec!["gc", p(&named)],
        vec!["import", p(&export_file), p(&named)],
    ];
    for args in commands {
        let out = annal(&args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("projections file"), "{args:?}: {}", stderr(&out));
        assert!(std::fs::read(&named).unwrap() == projections, "{args:?} changed the file");
        assert_eq!(files(), before, "{args:?} made or removed a file");
    }
}

#[test]
fn an_unsupported_schema_version_is_a_typed_finding() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    // Rewrite record 3 with schema version 99 and re-seal its chain link, as a newer
    // binary would have written it.
    let prev = {
        let database = redb::Database::open(&db).unwrap();
        let txn = database.begin_read().unwrap();
        let log = txn.open_table(LOG).unwrap();
        let bytes = log.get(2).unwrap().unwrap().value().to_vec();
        stored_chain_hash(&bytes).unwrap()
    };
    tamper_record(&db, 3, |b| {
        b[6..8].copy_from_slice(&99u16.to_le_bytes());
        let split = b.len() - 32;
        let hash = annal::codec::chain_link(&b[..split], &prev, &LogChain::plain());
        b[split..].copy_from_slice(&hash.0);
    });
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1);
    let f = findings(&report);
    let schema = f.iter().find(|(k, _, _)| k == "unsupported_schema").expect("a schema finding");
    assert_eq!(schema.1, "log seq 3");
    assert!(schema.2.contains("unsupported schema version 99"), "{}", schema.2);
    assert!(!f.iter().any(|(k, l, _)| k == "chain_mismatch" && l == "log seq 3"), "{f:?}");
}

#[test]
fn export_import_export_is_identical() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 6);
    let first = export(&db, &[]);
    assert!(first.contains("{\"base64\":"), "binary attachments are base64");
    assert!(first.contains("\"kind\":\"TranscriptRewritten\""));
    let file = dir.path().join("export.jsonl");
    std::fs::write(&file, &first).unwrap();
    let copy = dir.path().join("copy.redb");
    let out = annal(&["import", p(&file), p(&copy)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("chain reproduced exactly"), "{}", stdout(&out));
    assert_eq!(export(&copy, &[]), first);
    let (rc, original) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 0);
    let (rc, copied) = verify_json(&copy, &["--deep"]);
    assert_eq!(rc, 0, "{copied}");
    assert_eq!(original["tip"], copied["tip"]);
    // Importing the same export again does not follow the tip: refused, nothing written.
    let out = annal(&["import", p(&file), p(&copy)]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("line 1"), "{}", stderr(&out));
    assert_eq!(verify_json(&copy, &[]).1["tip"], original["tip"]);
}

#[test]
fn a_malformed_line_names_its_number_and_imports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let text = export(&db, &[]);
    let target = dir.path().join("target.redb");
    let write = |name: &str, lines: Vec<String>| {
        let f = dir.path().join(name);
        std::fs::write(&f, lines.join("\n") + "\n").unwrap();
        f
    };
    let lines: Vec<String> = text.lines().map(str::to_string).collect();

    let mut broken = lines.clone();
    broken[4] = "{\"seq\": 5, \"oops\"".into();
    let out = annal(&["import", p(&write("syntax.jsonl", broken)), p(&target)]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("line 5:"), "{}", stderr(&out));
    assert!(!target.exists(), "nothing may be imported");

    // Well-formed JSON whose inlined content no longer matches its id.
    let mut edited = lines.clone();
    let at = edited.iter().position(|l| l.contains("\"kind\":\"ContextAppended\"")).unwrap();
    edited[at] = edited[at].replacen("src/", "lib/", 1);
    let out = annal(&["import", p(&write("content.jsonl", edited)), p(&target)]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains(&format!("line {}:", at + 1)), "{}", stderr(&out));
    assert!(stderr(&out).contains("does not match its bytes"), "{}", stderr(&out));
    assert!(!target.exists());

    // A full export cut in the middle has gaps in its sequence numbers.
    let out =
        annal(&["import", p(&write("gap.jsonl", lines[..2].iter().chain(&lines[3..]).cloned().collect())), p(&target)]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("line 3: seq 4 does not follow seq 2"), "{}", stderr(&out));
    assert!(stderr(&out).contains("only a full export imports"), "{}", stderr(&out));
    assert!(!target.exists());

    // A session export cut short no longer matches its header.
    let session = sessions(&db)[1];
    let partial = export(&db, &["--session", &session.to_string()]);
    assert!(partial.lines().skip(1).all(|l| l.contains(&session.to_string())));
    let mut cut: Vec<String> = partial.lines().map(str::to_string).collect();
    cut.pop();
    let out = annal(&["import", p(&write("cut.jsonl", cut)), p(&target)]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("cut short"), "{}", stderr(&out));
    assert!(!target.exists());
}

/// The read commands beside a live host see commits past the last checkpoint: they
/// fold the log tail past the projections file's checkpoint themselves.
#[test]
fn read_commands_beside_a_live_writer_see_commits_past_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 1);
    let never = annal::CheckpointPolicy {
        events: u64::MAX,
        delta_bytes: u64::MAX,
        interval: std::time::Duration::from_secs(3600),
        delta_bytes_max: u64::MAX,
    };
    let engine = Engine::open_with(&db, annal::Options { checkpoint: never, ..annal::Options::default() }).unwrap();
    let session = live_session(&db);
    let turn = CommitTurn::new(session, "past-checkpoint", Expected::Any).message(Message::user("unflushed"));
    let receipt = engine.commit_turn(turn).unwrap().receipt();
    assert_eq!(engine.stats().checkpoints, 0, "the commit is only in the log and the engine's delta");
    let out = annal(&["inspect", p(&db), &session.to_string(), "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["head"]["last_seq"].as_u64(), Some(receipt.seq), "{json}");
    let out = annal(&["log", p(&db), "--from", &receipt.seq.to_string(), "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("unflushed") || stdout(&out).contains(&receipt.seq.to_string()));
    let out = annal(&["transcript", p(&db), &session.to_string(), "--limit", "10000", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(page["revision"].as_str().unwrap(), receipt.revision.to_hex());
    engine.close().unwrap();
}

#[test]
fn verify_runs_beside_a_live_writer() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let engine = Engine::open(&db).unwrap();
    let session = live_session(&db);
    let before = engine.tip().unwrap().0;
    let turn = CommitTurn::new(session, "live-1", Expected::Any).message(Message::user("still here"));
    engine.commit_turn(turn).unwrap();
    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 0, "{report}");
    assert_eq!(report["tip"]["seq"], before + 1);
    // The writer is unaffected and keeps committing.
    let turn = CommitTurn::new(session, "live-2", Expected::Any).message(Message::user("and again"));
    engine.commit_turn(turn).unwrap();
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 0, "{report}");
    assert_eq!(report["tip"]["seq"], before + 2);
    let out = annal(&["sessions", p(&db), "--archived", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Writing commands need the file to themselves: refused, nothing changed.
    let out = annal(&["rebuild", p(&db)]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let file = dir.path().join("export.jsonl");
    std::fs::write(&file, export(&db, &[])).unwrap();
    assert_eq!(code(&annal(&["import", p(&file), p(&db)])), 2);
    let size = std::fs::metadata(&db).unwrap().len();
    let out = annal(&["compact", p(&db)]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(std::fs::metadata(&db).unwrap().len(), size);
    assert_eq!(engine.tip().unwrap().0, before + 2);
    engine.close().unwrap();
}

/// verify's fold reads the message lists of earlier records from the log when a rewrite
/// or a restore needs them: here from records that are still only in the journal,
/// past the log file's last record, and from records of the log file.
#[test]
fn verify_folds_rewrites_that_name_records_in_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let engine = Engine::open(&db).unwrap();
    let session = live_session(&db);
    let in_file = engine.head(session).unwrap().unwrap();
    let turn = |key: &str, texts: &[&str]| {
        let mut turn = CommitTurn::new(session, key, Expected::Any);
        for text in texts {
            turn = turn.message(Message::user(*text));
        }
        engine.commit_turn(turn).unwrap().receipt()
    };
    let first = turn("journal-1", &["one", "two", "three"]);
    turn("journal-2", &["four", "five"]);
    let head = engine.head(session).unwrap().unwrap();
    let rewrite = |expected, start, end, message, reason| Rewrite {
        session,
        expected,
        start,
        end,
        replacement: vec![message],
        reason,
        note: "test".into(),
        actor: "test".into(),
    };
    // An edit inside the first new turn: what follows it is named by its records' lists.
    let (start, end) = (in_file.message_count + 1, in_file.message_count + 2);
    let edit = rewrite(head.revision, start, end, Message::user("two, edited"), RewriteReason::Edit);
    let edited = engine.rewrite(edit).unwrap();
    // A compaction of messages of the log file's records and the journal's.
    let end = in_file.message_count + 1;
    let compaction = rewrite(edited.revision, 1, end, Message::system("summary"), RewriteReason::Compaction);
    let compacted = engine.rewrite(compaction).unwrap();
    let restore = Restore {
        session,
        expected: compacted.revision,
        target: head.revision,
        note: "back".into(),
        actor: "test".into(),
    };
    let restored = engine.restore(restore).unwrap();
    let file_tip = {
        // A reader beside the writer, as verify opens it.
        let mut builder = redb::Builder::new();
        builder.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
        let log = builder.open_read_only(&db).unwrap();
        let txn = log.begin_read().unwrap();
        let table = txn.open_table(LOG).unwrap();
        let last = table.last().unwrap().map(|(k, _)| k.value());
        last.unwrap_or(0)
    };
    assert!(file_tip < first.seq, "the new records are in the journal (file tip {file_tip}, first {})", first.seq);
    for extra in [&[][..], &["--deep"][..]] {
        let (rc, report) = verify_json(&db, extra);
        assert_eq!(rc, 0, "{report}");
        assert_eq!(report["tip"]["seq"], restored.seq, "{report}");
    }
    engine.close().unwrap();
    // And once the journal is absorbed into the log file.
    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 0, "{report}");
    assert_eq!(report["tip"]["seq"], restored.seq, "{report}");
}

#[test]
fn compact_shrinks_a_rebuilt_file_and_changes_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 8);
    let before = export(&db, &[]);
    let digests = Reader::open(&db, Limits::default(), None).unwrap().projection_digests().unwrap();
    assert_eq!(code(&annal(&["rebuild", p(&db)])), 0);
    let rebuilt = std::fs::metadata(&db).unwrap().len();
    let out = annal(&["compact", p(&db)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).starts_with("compacted "), "{}", stdout(&out));
    let compacted = std::fs::metadata(&db).unwrap().len();
    assert!(compacted < rebuilt, "{compacted} < {rebuilt}");
    assert_eq!(export(&db, &[]), before);
    assert_eq!(Reader::open(&db, Limits::default(), None).unwrap().projection_digests().unwrap(), digests);
    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 0, "{report}");
    // Not a database: a usage error, the file untouched.
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"not a database").unwrap();
    assert_eq!(code(&annal(&["compact", p(&junk)])), 2);
    assert_eq!(std::fs::read(&junk).unwrap(), b"not a database");
}

/// `annal compact --compression zstd` stores the content as zstd and changes nothing
/// else: the export, the projections and `verify --deep` are as before; `stats` counts the
/// zstd objects; an unknown compression is a usage error.
#[test]
fn compact_with_a_compression_recompresses_the_content_and_changes_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 3);
    {
        let engine = Engine::open(&db).unwrap();
        let session = live_session(&db);
        for t in 0..4 {
            let long = format!("tool result {t}: line of a file the agent read, with its number\n").repeat(30);
            let turn = CommitTurn::new(session, format!("long {t}"), Expected::Any).message(Message::tool(long));
            engine.commit_turn(turn).unwrap();
        }
        engine.close().unwrap();
    }
    let before = export(&db, &[]);
    let digests = Reader::open(&db, Limits::default(), None).unwrap().projection_digests().unwrap();
    let out = annal(&["compact", p(&db), "--compression", "zstd"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("recompressed 4 of ") && text.contains("\ncompacted "), "{text}");
    assert_eq!(export(&db, &[]), before);
    assert_eq!(Reader::open(&db, Limits::default(), None).unwrap().projection_digests().unwrap(), digests);
    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 0, "{report}");
    let out = annal(&["stats", p(&db), "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["compression"]["all"]["zstd_objects"].as_u64(), Some(4), "{json}");
    // Back to lz4: no zstd object is left.
    assert_eq!(code(&annal(&["compact", p(&db), "--compression", "lz4"])), 0);
    let json: Value = serde_json::from_slice(&annal(&["stats", p(&db), "--json"]).stdout).unwrap();
    assert_eq!(json["compression"]["all"]["zstd_objects"].as_u64(), Some(0), "{json}");
    assert_eq!(export(&db, &[]), before);
    assert_eq!(code(&annal(&["compact", p(&db), "--compression", "brotli"])), 2);
}

/// Node and edge statements of a DOT file written one statement per line.
fn dot_counts(dot: &str) -> (usize, usize, Vec<String>, Vec<(String, String)>) {
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for line in dot.lines().map(str::trim) {
        if !line.starts_with('"') {
            continue;
        }
        let quoted: Vec<&str> = line.split('"').collect();
        if line.contains("\" -> \"") {
            edges.push((quoted[1].to_string(), quoted[3].to_string()));
        } else {
            nodes.push(quoted[1].to_string());
        }
    }
    (nodes.len(), edges.len(), nodes, edges)
}

#[test]
fn graph_dot_matches_the_engine_graph() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 4);
    let reader = Reader::open(&db, Limits::default(), None).unwrap();
    let all = sessions(&db);
    let mut saw_fork_out = false;
    let mut saw_fork_in = false;
    let mut saw_restore = false;
    for session in &all {
        let g = reader.graph(*session).unwrap();
        let out = annal(&["graph", p(&db), &session.to_string()]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let dot = stdout(&out);
        assert!(dot.starts_with("digraph") && dot.trim_end().ends_with('}'));
        let (nodes, edges, names, links) = dot_counts(&dot);
        let transitions = g.edges.iter().filter(|e| e.from.is_some()).count();
        let fork_in = usize::from(g.forked_from.is_some());
        assert_eq!(nodes, g.nodes.len() + g.forks.len() + fork_in, "{dot}");
        assert_eq!(edges, transitions + g.forks.len() + fork_in, "{dot}");
        assert_eq!(annal_replay::graph::dot_counts(&g), (nodes, edges));
        for (a, b) in &links {
            assert!(names.contains(a) && names.contains(b), "edge {a} -> {b} to an undeclared node");
        }
        saw_fork_out |= !g.forks.is_empty();
        saw_fork_in |= g.forked_from.is_some();
        saw_restore |= dot.contains("restore (seq");
    }
    assert!(saw_fork_out && saw_fork_in && saw_restore, "the demo has forks and restores");
    // A session that was forked (the listing's order follows the demo threads' activity).
    let parent = all.iter().find(|s| !reader.graph(**s).unwrap().forks.is_empty()).expect("a forked session");
    let out = annal(&["graph", p(&db), &parent.to_string(), "--format", "svg"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("<svg") && stdout(&out).contains("</svg>"));
    let out = annal(&["graph", p(&db), &parent.to_string(), "--format", "text"]);
    assert!(stdout(&out).contains("⑂ fork"), "{}", stdout(&out));
}

#[test]
fn expect_tip_catches_a_truncated_tail() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let (_, report) = verify_json(&db, &[]);
    let tip = report["tip"]["chain_hash"].as_str().unwrap().to_string();
    let last = report["tip"]["seq"].as_u64().unwrap();
    assert_eq!(verify_json(&db, &["--expect-tip", &tip]).0, 0);
    // Cut the last record and make the meta tip agree: invisible without a key...
    {
        let database = redb::Database::open(&db).unwrap();
        let txn = database.begin_write().unwrap();
        {
            let mut log = txn.open_table(LOG).unwrap();
            log.remove(last).unwrap();
            annal::pieces::ContentWriter::open(&txn).unwrap().remove(last).unwrap();
            let hash = stored_chain_hash(log.get(last - 1).unwrap().unwrap().value()).unwrap();
            let mut meta = txn.open_table(META).unwrap();
            meta.insert(meta_keys::TIP, annal::tables::encode_tip(last - 1, &hash).as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    assert_eq!(verify_json(&db, &[]).0, 0);
    // ...but not to a remembered tip.
    let (rc, report) = verify_json(&db, &["--expect-tip", &tip]);
    assert_eq!(rc, 1);
    assert!(findings(&report).iter().any(|(k, _, _)| k == "expected_tip"));
    assert_eq!(code(&annal(&["verify", p(&db), "--expect-tip", "xyz"])), 2);
}

#[test]
fn a_keyed_chain_needs_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let (db, hex, _) = keyed_db(&dir);
    // The same key as 32 raw bytes.
    let raw = dir.path().join("key.bin");
    std::fs::write(&raw, [0x5a; 32]).unwrap();
    let wrong = dir.path().join("wrong.bin");
    std::fs::write(&wrong, [1u8; 32]).unwrap();
    assert_eq!(code(&annal(&["verify", p(&db), "--deep", "--key-file", p(&raw)])), 0);
    assert_eq!(code(&annal(&["verify", p(&db), "--key-file", p(&hex)])), 0);
    let out = annal(&["verify", p(&db)]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("keyed chain"), "{}", stderr(&out));
    assert_eq!(code(&annal(&["verify", p(&db), "--key-file", p(&wrong)])), 2);
    // Export and re-import under the same key reproduces the keyed chain.
    let text = export(&db, &["--key-file", p(&raw)]);
    let file = dir.path().join("keyed.jsonl");
    std::fs::write(&file, &text).unwrap();
    let copy = dir.path().join("copy.redb");
    let out = annal(&["import", p(&file), p(&copy)]);
    assert_eq!(code(&out), 1, "a plain target cannot reproduce a keyed chain");
    assert!(!copy.exists());
    assert_eq!(code(&annal(&["import", p(&file), p(&copy), "--key-file", p(&raw)])), 0);
    assert_eq!(export(&copy, &["--key-file", p(&raw)]), text);
    let plain = dir.path().join("plain.redb");
    let out = annal(&["import", p(&file), p(&plain), "--rechain"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(code(&annal(&["verify", p(&plain), "--deep"])), 0);
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 1);
    let missing = dir.path().join("missing.redb");
    assert_eq!(code(&annal(&["verify", p(&missing)])), 2);
    assert_eq!(code(&annal(&["rebuild", p(&missing)])), 2);
    assert!(!missing.exists(), "rebuild must not create a database");
    assert_eq!(code(&annal(&["inspect", p(&db), "not-a-session"])), 2);
    let unknown = SessionId([7; 16]).to_string();
    assert_eq!(code(&annal(&["inspect", p(&db), &unknown])), 2);
    assert_eq!(code(&annal(&["transcript", p(&db), &unknown])), 2);
    assert_eq!(code(&annal(&["export", p(&db), "--session", &unknown])), 2);
    assert_eq!(code(&annal(&["sessions", p(&db), "--label", "novalue"])), 2);
    assert_eq!(code(&annal(&["frobnicate"])), 2);
    assert_eq!(code(&annal(&["demo", "--db", p(&db)])), 2, "the demo refuses to overwrite");
}

#[test]
fn read_views_show_the_demo() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    // The demo's first agent session (not its fork): the listing's order follows
    // activity, which the demo's threads interleave differently from run to run.
    let reader = Reader::open(&db, Limits::default(), None).unwrap();
    let heads = reader.list_sessions(&ListQuery::new().label("project", "annal")).unwrap().items;
    let session = heads.iter().find(|h| h.forked_from.is_none()).expect("the demo's agent session").session.to_string();
    drop(reader);

    let out = annal(&["sessions", p(&db), "--label", "project=annal"]);
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains(&session) && !stdout(&out).contains("billing-api"), "{}", stdout(&out));

    let out = annal(&["inspect", p(&db), &session, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["unsettled"][0]["op_id"], "op-3", "{json}");
    assert_eq!(json["head"]["session"], session.as_str());
    assert!(json["usage"].as_array().unwrap().iter().all(|u| u["turns"].as_u64().unwrap() > 0));

    let out = annal(&["transcript", p(&db), &session, "--offset", "1", "--limit", "2", "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["offset"], 1);
    assert_eq!(json["messages"].as_array().unwrap().len(), 2);
    assert_eq!(json["has_more"], true);
    // An older revision: the first node of the graph.
    let g = Reader::open(&db, Limits::default(), None).unwrap().graph(session.parse().unwrap()).unwrap();
    let first = g.nodes[0].revision.to_hex();
    let out = annal(&["transcript", p(&db), &session, "--revision", &first, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["total"], 1);
    assert_eq!(json["revision"], first.as_str());

    let out = annal(&["log", p(&db), "--session", &session, "--limit", "3"]);
    assert_eq!(stdout(&out).lines().count(), 4, "{}", stdout(&out));
    let out = annal(&["log", p(&db), "--from", "5", "--limit", "2", "--json"]);
    let seqs: Vec<u64> =
        stdout(&out).lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![5, 6]);

    let out = annal(&["stats", p(&db), "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tip = Reader::open(&db, Limits::default(), None).unwrap().tip().unwrap().0;
    let by_kind: u64 = json["by_kind"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(by_kind, tip);
    assert!(json["dedup_saved_bytes"].as_u64().unwrap() > 0, "the demo repeats its system prompt");
    assert!(json["file_bytes"].as_u64().unwrap() > 0);
    assert!(json["allocated_bytes"].as_u64().unwrap() > 0, "the files take room on disk");
    assert_eq!(json["content_objects"].as_u64().unwrap() as usize, count_content(&db));
    let tables = json["tables"].as_array().unwrap();
    let names: Vec<&str> = tables.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["log", "content_pieces", "content_ids", "meta", "projections"]);
    assert_eq!(tables[0]["entries"].as_u64().unwrap(), tip);
    let pieces = tables[1]["entries"].as_u64().unwrap();
    let rows = annal::pieces::ContentReader::open(&redb::Database::open(&db).unwrap().begin_read().unwrap())
        .unwrap()
        .iter()
        .unwrap()
        .count();
    assert!(rows > 0 && rows <= count_content(&db), "one row per record that brought content");
    assert!(pieces >= rows as u64, "{pieces} pieces for {rows} rows");
    assert_eq!(tables[2]["entries"].as_u64().unwrap(), rows as u64, "every row's ids listed");
    assert!(tables.iter().all(|t| t["leaf_pages"].as_u64().unwrap() > 0 && t["stored_bytes"].as_u64().unwrap() > 0));
    let rows: u64 = json["projections"].as_object().unwrap().values().map(|t| t["rows"].as_u64().unwrap()).sum();
    assert_eq!(rows, tables[4]["entries"].as_u64().unwrap(), "every projection row is counted under its table");
    assert_eq!(json["projections"]["p.heads"]["rows"], json["sessions"]);
    let out = annal(&["stats", p(&db)]);
    assert!(stdout(&out).contains("projections"), "{}", stdout(&out));
}

fn count_content(db: &Path) -> usize {
    let database = redb::Database::open(db).unwrap();
    let txn = database.begin_read().unwrap();
    let table = annal::pieces::ContentReader::open(&txn).unwrap();
    let mut n = 0;
    for entry in table.iter().unwrap() {
        let (_, row) = entry.unwrap();
        for object in annal::codec::content::entries(&row, u64::MAX) {
            let object = object.unwrap();
            assert_eq!(content_id(object.stored), object.id);
            n += 1;
        }
    }
    n
}

/// `annal inspect` shows a session's execution lease, as text and as JSON.
#[test]
fn inspect_shows_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 1);
    let session = live_session(&db);
    let engine = Engine::open(&db).unwrap();
    let lease = engine.acquire_lease(session, "worker-7", std::time::Duration::from_secs(60)).unwrap();
    engine.close().unwrap();
    let out = annal(&["inspect", p(&db), &session.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("lease      worker-7 token {} until", lease.token)), "{}", stdout(&out));
    let out = annal(&["inspect", p(&db), &session.to_string(), "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["head"]["lease"]["owner"].as_str(), Some("worker-7"), "{json}");
    assert_eq!(json["head"]["lease"]["token"].as_u64(), Some(lease.token));
    assert_eq!(json["head"]["lease"]["expires_at_ms"].as_u64(), Some(lease.expires_at_ms));
}

/// The demo shows a stalled worker being fenced, and a draft surviving a power loss.
#[test]
fn demo_shows_a_stalled_worker_fenced_and_a_draft_surviving_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hosts.redb");
    let out = annal(&["demo", "--db", p(&db), "--sessions", "1"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("worker-b took over with token 2"), "{text}");
    assert!(text.contains("late commit was fenced (token 1 < 2), nothing written"), "{text}");
    assert!(text.contains("as abandoned with 3 segments (\"The migration takes three steps: \")"), "{text}");
    assert!(text.contains("finalizes it: 0 drafts left"), "{text}");
    assert!(text.contains("inbox: 2 inputs queued while the session was idle; worker-b claimed 2"), "{text}");
    assert!(text.contains("consumed them in its own commit: 0 left open"), "{text}");
}

/// Drafts are not exported, and `verify` checks only their structure: a clean file
/// verifies clean with drafts in it, and a draft segment without its summary is a
/// `drafts` finding.
#[test]
fn drafts_are_not_exported_and_verify_checks_their_structure() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 1);
    let session = live_session(&db);
    let engine = Engine::open(&db).unwrap();
    engine.append_draft(session, "stream", "PARTIAL-DRAFT-MARKER").unwrap();
    engine.close().unwrap();
    assert!(!export(&db, &[]).contains("PARTIAL-DRAFT-MARKER"));
    let (rc, report) = verify_json(&db, &["--deep"]);
    assert_eq!(rc, 0, "{report}");

    let file = redb::Database::open(&db).unwrap();
    let txn = file.begin_write().unwrap();
    {
        let mut index = txn.open_table(annal::draft::DRAFT_INDEX).unwrap();
        index.remove(annal::draft::draft_key(&session, "stream").as_slice()).unwrap();
    }
    txn.commit().unwrap();
    drop(file);
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1, "{report}");
    assert_eq!(report["findings"][0]["kind"], "drafts", "{report}");
}

/// `annal stats` reports how the content objects are stored, per content type: text
/// compresses, random bytes stay raw, objects written under `Compression::Zstd` are
/// counted as zstd, and objects that are not messages (here an attachment) have a line
/// of their own. The attachment of a compressed message is
/// found as a reference (its message is decompressed to read it).
#[test]
fn stats_reports_compression_per_content_type() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let text = "the quick brown fox jumps over the lazy dog; ".repeat(200);
    let mut noise = Vec::with_capacity(4096);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.push(x as u8);
    }
    {
        let engine = Engine::open(&db).unwrap();
        let create = annal::CreateSession::new()
            .message(Message::new(annal::Role::User, "text/plain", text.clone()).with_attachment(text.repeat(2)))
            .message(Message::new(annal::Role::Tool, "application/octet-stream", noise.clone()));
        engine.create_session(create).unwrap();
        engine.close().unwrap();
        // Reopened under zstd: a new object of its own content type is a zstd frame.
        let options = annal::Options { compression: annal::Compression::Zstd, ..annal::Options::default() };
        let engine = Engine::open_with(&db, options).unwrap();
        let create =
            annal::CreateSession::new().message(Message::new(annal::Role::User, "text/markdown", text.repeat(3)));
        engine.create_session(create).unwrap();
        engine.close().unwrap();
    }
    let out = annal(&["stats", p(&db), "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let by = &json["compression"]["by_content_type"];
    let plain = &by["text/plain"];
    assert_eq!((plain["objects"].as_u64(), plain["compressed_objects"].as_u64()), (Some(1), Some(1)), "{json}");
    assert!(plain["canonical_bytes"].as_u64().unwrap() > text.len() as u64, "{json}");
    assert!(plain["ratio"].as_f64().unwrap() < 0.2, "{json}");
    let raw = &by["application/octet-stream"];
    assert_eq!((raw["objects"].as_u64(), raw["compressed_objects"].as_u64()), (Some(1), Some(0)), "{json}");
    assert_eq!(raw["stored_bytes"], raw["canonical_bytes"], "{json}");
    assert!(raw["canonical_bytes"].as_u64().unwrap() > noise.len() as u64, "{json}");
    let other = &by["(other objects)"];
    assert_eq!((other["objects"].as_u64(), other["compressed_objects"].as_u64()), (Some(1), Some(1)), "{json}");
    assert_eq!(other["canonical_bytes"].as_u64(), Some(2 * text.len() as u64), "the attachment's bytes: {json}");
    assert_eq!(plain["zstd_objects"].as_u64(), Some(0), "written under lz4: {json}");
    let markdown = &by["text/markdown"];
    assert_eq!(
        (markdown["compressed_objects"].as_u64(), markdown["zstd_objects"].as_u64()),
        (Some(1), Some(1)),
        "{json}"
    );
    let all = &json["compression"]["all"];
    assert_eq!(all["zstd_objects"].as_u64(), Some(1), "{json}");
    assert_eq!(all["objects"], json["content_objects"], "{json}");
    assert_eq!(all["stored_bytes"], json["content_bytes"], "{json}");
    assert_eq!(json["content_refs"], 4, "three messages and the attachment of the compressed one: {json}");
    let out = annal(&["stats", p(&db)]);
    let text_out = stdout(&out);
    assert!(text_out.contains("compression") && text_out.contains("text/plain"), "{text_out}");
    assert!(text_out.contains("objects compressed, 1 of them zstd"), "{text_out}");
}

/// A content row whose pieces are out of order (a piece missing before a later one) is
/// reported at that row by verify, with the other rows still checked, and reads of it
/// fail closed.
#[test]
fn a_content_row_with_a_missing_piece_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let row = {
        let database = redb::Database::open(&db).unwrap();
        let txn = database.begin_write().unwrap();
        let row = {
            let mut pieces = txn.open_table(annal::pieces::PIECES).unwrap();
            let (seq, last) = {
                let (k, _) = pieces.last().unwrap().unwrap();
                k.value()
            };
            // A piece two past the row's last: the one between is missing.
            pieces.insert((seq, last + 2), b"stray".as_slice()).unwrap();
            seq
        };
        txn.commit().unwrap();
        row
    };
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1, "{report}");
    let f = findings(&report);
    assert!(
        f.iter().any(|(k, l, d)| k == "content_row" && *l == format!("content row {row}") && d.contains("missing")),
        "{f:?}"
    );
    let database = redb::Database::open(&db).unwrap();
    let txn = database.begin_read().unwrap();
    let rows = annal::pieces::ContentReader::open(&txn).unwrap();
    assert!(matches!(rows.get(row), Err(annal::Error::Corrupt { .. })));
}

/// The ids listed beside each content row (`annal::tables::CONTENT_IDS`) are checked
/// against the rows: a listing of other ids, one emptied for a row that parses, a row
/// whose listing is gone, a listing of a seq with no row and a listing that is no list of
/// ids are each named at their seq, and a file of this format without the meta key that
/// says where the listing starts is a meta finding.
#[test]
fn listed_content_ids_that_differ_from_their_rows_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    assert_eq!(verify_json(&db, &[]).0, 0);
    let database = redb::Database::open(&db).unwrap();
    let txn = database.begin_write().unwrap();
    let (other, emptied, gone, stray, short) = {
        let mut ids = txn.open_table(annal::tables::CONTENT_IDS).unwrap();
        let seqs: Vec<u64> = ids.iter().unwrap().map(|e| e.unwrap().0.value()).collect();
        assert!(seqs.len() >= 4, "{seqs:?}");
        let last = *seqs.last().unwrap();
        let (other, emptied, gone, short) = (seqs[0], seqs[1], seqs[2], seqs[3]);
        let mut value = ids.get(other).unwrap().unwrap().value().to_vec();
        value[5] ^= 1;
        ids.insert(other, value.as_slice()).unwrap();
        ids.insert(emptied, [].as_slice()).unwrap();
        ids.remove(gone).unwrap();
        ids.insert(short, [7u8; 31].as_slice()).unwrap();
        // Past the last row: no content row has it.
        ids.insert(last + 1_000, [7u8; 32].as_slice()).unwrap();
        (other, emptied, gone, last + 1_000, short)
    };
    txn.open_table(annal::tables::META).unwrap().remove(annal::tables::meta_keys::CONTENT_IDS_FROM).unwrap();
    txn.commit().unwrap();
    drop(database);
    let (rc, report) = verify_json(&db, &[]);
    assert_eq!(rc, 1, "{report}");
    let f = findings(&report);
    let at = |seq: u64, what: &str| {
        f.iter().any(|(k, l, d)| k == "content_ids" && *l == format!("content ids {seq}") && d.contains(what))
    };
    assert!(at(other, "other ids"), "{f:?}");
    assert!(at(emptied, "no ids for a content row that parses"), "{f:?}");
    assert!(at(stray, "no content row"), "{f:?}");
    assert!(at(short, "no list of 32-byte ids"), "{f:?}");
    assert!(f.iter().any(|(k, l, d)| k == "meta" && l.contains("content_ids_from") && d == "missing"), "{f:?}");
    // Without the meta key no row is required to be listed: the row whose listing is
    // gone is no finding, and is read for its ids.
    assert!(!f.iter().any(|(_, l, _)| *l == format!("content ids {gone}")), "{f:?}");
    assert_eq!(f.len(), 5, "{f:?}");

    // With the key back, listing from the first seq, the row whose listing is gone is
    // named too.
    let database = redb::Database::open(&db).unwrap();
    let txn = database.begin_write().unwrap();
    txn.open_table(annal::tables::META)
        .unwrap()
        .insert(annal::tables::meta_keys::CONTENT_IDS_FROM, 1u64.to_le_bytes().as_slice())
        .unwrap();
    txn.commit().unwrap();
    drop(database);
    let f = findings(&verify_json(&db, &[]).1);
    assert!(
        f.iter()
            .any(|(k, l, d)| k == "content_ids" && *l == format!("content ids {gone}") && d.contains("no ids listed")),
        "{f:?}"
    );
    assert_eq!(f.len(), 5, "{f:?}");
}

/// The files of the database at `db` that exist.
fn existing_files(db: &Path) -> Vec<PathBuf> {
    annal::database_files(db).into_iter().filter(|f| f.exists()).collect()
}

/// An import that fails into a database that did not exist leaves none of its files
/// behind: not the log file, not its projections file, not its journal.
#[test]
fn a_failed_import_into_a_new_database_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let lines: Vec<String> = export(&db, &[]).lines().map(str::to_string).collect();
    let write = |name: &str, lines: &[String]| {
        let f = dir.path().join(name);
        std::fs::write(&f, lines.join("\n") + "\n").unwrap();
        f
    };
    let target = dir.path().join("target.redb");

    // A chain that does not reproduce: the first record claims another chain hash.
    let mut edited = lines.clone();
    let hash = serde_json::from_str::<Value>(&edited[0]).unwrap()["chain_hash"].as_str().unwrap().to_string();
    edited[0] = edited[0].replace(&hash, &"0".repeat(64));
    let out = annal(&["import", p(&write("chain.jsonl", &edited)), p(&target)]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("do not reproduce"), "{}", stderr(&out));
    assert_eq!(existing_files(&target), Vec::<PathBuf>::new());

    // A gap in the sequence numbers.
    let gap: Vec<String> = lines[..2].iter().chain(&lines[3..]).cloned().collect();
    let out = annal(&["import", p(&write("gap.jsonl", &gap)), p(&target)]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(existing_files(&target), Vec::<PathBuf>::new());

    // A fork whose parent is neither in the target nor in the file.
    let reader = Reader::open(&db, Limits::default(), None).unwrap();
    let heads = reader.list_sessions(&ListQuery::new().include_archived()).unwrap().items;
    let fork = heads.iter().find(|h| h.forked_from.is_some()).expect("the demo forks").session;
    drop(reader);
    let file = write("fork.jsonl", &[export(&db, &["--session", &fork.to_string()]).trim_end().to_string()]);
    let out = annal(&["import", p(&file), p(&target)]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("fork"), "{}", stderr(&out));
    assert_eq!(existing_files(&target), Vec::<PathBuf>::new());

    // Into a database that exists, a failed import removes nothing.
    let full = write("full.jsonl", &lines);
    assert_eq!(code(&annal(&["import", p(&full), p(&target)])), 0);
    let files = existing_files(&target);
    assert_eq!(code(&annal(&["import", p(&full), p(&target)])), 1, "the records do not follow the tip");
    assert_eq!(existing_files(&target), files);
    assert_eq!(verify_json(&target, &["--deep"]).0, 0);
}

/// The commands that write refuse an empty file, as the read commands do: exit 2, and
/// the file stays empty, with no other file beside it.
#[test]
fn writing_commands_refuse_an_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.redb");
    let session = SessionId([7; 16]).to_string();
    let commands: [&[&str]; 9] = [
        &["rebuild"],
        &["rebuild", "--projection", "usage"],
        &["compact"],
        &["compact", "--compression", "zstd"],
        &["gc"],
        &["purge", "SESSION"],
        &["migrate"],
        &["verify"],
        &["sessions"],
    ];
    for command in commands {
        std::fs::write(&empty, b"").unwrap();
        let mut args = vec![command[0], p(&empty)];
        args.extend(command[1..].iter().map(|a| if *a == "SESSION" { session.as_str() } else { a }));
        let out = annal(&args);
        assert_eq!(code(&out), 2, "{command:?}: {}{}", stdout(&out), stderr(&out));
        assert!(stderr(&out).contains("is empty: not an annal database"), "{command:?}: {}", stderr(&out));
        assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "{command:?} left the file as it was");
        assert_eq!(existing_files(&empty), vec![empty.clone()], "{command:?} wrote no other file");
    }
    // An import into it, of a log that would make a database anywhere else.
    let input = dir.path().join("export.jsonl");
    std::fs::write(&input, export(&demo_db(&dir, 1), &[])).unwrap();
    std::fs::write(&empty, b"").unwrap();
    let out = annal(&["import", p(&input), p(&empty)]);
    assert_eq!(code(&out), 2, "import: {}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("is empty: not an annal database"), "import: {}", stderr(&out));
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "import left the file as it was");
    assert_eq!(existing_files(&empty), vec![empty.clone()], "import wrote no other file");
}

/// A database with a keyed chain (key 32 bytes of 0x5a) and one session, and a file
/// holding its key in hex.
fn keyed_db(dir: &tempfile::TempDir) -> (PathBuf, PathBuf, SessionId) {
    let db = dir.path().join("keyed.redb");
    let key = [0x5a; 32];
    let engine = Engine::open_with(&db, annal::Options { chain_key: Some(key), ..Default::default() }).unwrap();
    let created = engine.create_session(annal::CreateSession::new().message(Message::system("hi"))).unwrap();
    engine.commit_turn(CommitTurn::new(created.session, "t1", Expected::Any).message(Message::user("hello"))).unwrap();
    engine.close().unwrap();
    let key_file = dir.path().join("key.hex");
    std::fs::write(&key_file, format!("{}\n", "5a".repeat(32))).unwrap();
    (db, key_file, created.session)
}

/// sessions, inspect, transcript and graph read a keyed database with its --key-file,
/// and refuse it without the key or with another one, as log does.
#[test]
fn read_views_take_the_key_of_a_keyed_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key, session) = keyed_db(&dir);
    let wrong = dir.path().join("wrong.bin");
    std::fs::write(&wrong, [1u8; 32]).unwrap();
    let missing = dir.path().join("missing.key");
    let session = session.to_string();
    let commands: [(&[&str], &str); 5] = [
        (&["sessions"], &session),
        (&["inspect", &session], &session),
        (&["transcript", &session], "hello"),
        (&["graph", &session, "--format", "text"], "t1"),
        (&["log"], "t1"),
    ];
    for (command, shows) in commands {
        let with = |extra: &[&str]| {
            let mut args = vec![command[0], p(&db)];
            args.extend_from_slice(&command[1..]);
            args.extend_from_slice(extra);
            annal(&args)
        };
        let out = with(&["--key-file", p(&key)]);
        assert_eq!(code(&out), 0, "{command:?}: {}", stderr(&out));
        assert!(stdout(&out).contains(shows), "{command:?}: {}", stdout(&out));
        let out = with(&[]);
        assert_eq!(code(&out), 2, "{command:?} without the key: {}", stdout(&out));
        assert!(stderr(&out).contains("keyed chain"), "{command:?}: {}", stderr(&out));
        assert_eq!(code(&with(&["--key-file", p(&wrong)])), 2, "{command:?} with another key");
        let out = with(&["--key-file", p(&missing)]);
        assert_eq!(code(&out), 2, "{command:?} with no key file");
        assert!(stderr(&out).contains(&format!("key file {}", p(&missing))), "{command:?}: {}", stderr(&out));
    }
}

/// Runs the `annal` binary with `args`, its standard output a pipe whose reader is
/// already gone, and returns the exit code.
fn annal_into_a_closed_pipe(args: &[&str]) -> i32 {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_annal"))
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run the annal binary");
    status.code().expect("exit code")
}

/// A reader that goes away early does not hide a finding: verify of a damaged file
/// still exits 1, while a clean verify and a command that only prints (log, export)
/// exit 0.
#[test]
fn a_closed_output_pipe_keeps_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    assert_eq!(annal_into_a_closed_pipe(&["verify", p(&db)]), 0);
    assert_eq!(annal_into_a_closed_pipe(&["log", p(&db)]), 0);
    assert_eq!(annal_into_a_closed_pipe(&["export", p(&db)]), 0);
    let a = first_of_kind(&db, annal::EventKind::ContextAppended);
    tamper_record(&db, a, |b| {
        let at = b.windows(7).position(|w| w == b"indexer").expect("the source is in the record");
        b[at] ^= 0x20;
    });
    assert_eq!(code(&annal(&["verify", p(&db)])), 1);
    assert_eq!(annal_into_a_closed_pipe(&["verify", p(&db)]), 1);
    assert_eq!(annal_into_a_closed_pipe(&["verify", p(&db), "--json"]), 1);
    assert_eq!(annal_into_a_closed_pipe(&["verify", p(&db), "--deep"]), 1);
}

/// compact reports the space it freed, measured before the engine opens the files: a
/// second compaction of a compacted database frees nothing.
#[test]
fn compacting_a_compacted_database_frees_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    assert_eq!(code(&annal(&["rebuild", p(&db)])), 0);
    let out = annal(&["compact", p(&db)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let files = |db: &Path| existing_files(db).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum::<u64>();
    let compacted = files(&db);
    for _ in 0..2 {
        let out = annal(&["compact", p(&db)]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let size = annal_replay::human_bytes(compacted);
        let expected = format!("compacted {size} → {size} (0 B freed) in ");
        assert!(stdout(&out).starts_with(&expected), "{}", stdout(&out));
        assert_eq!(files(&db), compacted);
    }
    let out = annal(&["compact", p(&db), "--compression", "lz4"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("(0 B freed)"), "{}", stdout(&out));
}

/// stats, like every read command, works without a usable projections file: it counts
/// the projections it folds from the log and names the file it could not read.
#[test]
fn stats_names_an_unusable_projections_file_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let projections = annal::projections_path(&db);
    let good: Value = serde_json::from_slice(&annal(&["stats", p(&db), "--json"]).stdout).unwrap();
    assert_eq!(good["projections_file_unusable"], Value::Null, "{good}");
    let bytes = std::fs::read(&projections).unwrap();
    let garbage: Vec<u8> = (0..bytes.len()).map(|i| (i * 7 + 3) as u8).collect();
    for (what, damaged) in [("truncated", bytes[..5000].to_vec()), ("garbage", garbage), ("empty", Vec::new())] {
        std::fs::write(&projections, &damaged).unwrap();
        let out = annal(&["sessions", p(&db), "--archived"]);
        assert_eq!(code(&out), 0, "{what}: {}", stderr(&out));
        let out = annal(&["stats", p(&db)]);
        assert_eq!(code(&out), 0, "{what}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.contains(&format!("projections file unusable, not counted above ({}:", p(&projections))),
            "{text}"
        );
        let out = annal(&["stats", p(&db), "--json"]);
        assert_eq!(code(&out), 0, "{what}: {}", stderr(&out));
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        let why = json["projections_file_unusable"].as_str().unwrap_or_else(|| panic!("{what}: {json}"));
        assert!(why.starts_with(p(&projections)), "{why}");
        assert_eq!(json["sessions"], good["sessions"], "{what}");
        assert_eq!(json["projections"], good["projections"], "{what}: the rows come from the log's fold");
        assert_eq!(std::fs::read(&projections).unwrap(), damaged, "{what}: stats writes nothing");
    }
}

/// An input with no records is a usage error, and nothing is created: an empty file,
/// and an empty standard input (`annal export missing.redb | annal import - new.redb`).
#[test]
fn an_import_of_no_records_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.redb");
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, b"").unwrap();
    let out = annal(&["import", p(&empty), p(&target)]);
    assert_eq!(code(&out), 2, "{}", stdout(&out));
    assert!(stderr(&out).contains("no records to import"), "{}", stderr(&out));
    assert_eq!(existing_files(&target), Vec::<PathBuf>::new());

    let missing = dir.path().join("missing.redb");
    let mut exporting = std::process::Command::new(env!("CARGO_BIN_EXE_annal"))
        .args(["export", p(&missing)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_annal"))
        .args(["import", "-", p(&target)])
        .stdin(exporting.stdout.take().unwrap())
        .output()
        .unwrap();
    assert_eq!(exporting.wait().unwrap().code(), Some(2), "the export of a missing file fails");
    assert_eq!(code(&out), 2, "{}", stdout(&out));
    assert!(stderr(&out).contains("no records to import"), "{}", stderr(&out));
    assert_eq!(existing_files(&target), Vec::<PathBuf>::new());
    assert!(!missing.exists());

    // Into a database that exists: refused the same way, the database unchanged.
    let db = demo_db(&dir, 1);
    let before = export(&db, &[]);
    let out = annal(&["import", p(&empty), p(&db)]);
    assert_eq!(code(&out), 2, "{}", stdout(&out));
    assert_eq!(export(&db, &[]), before);
}

/// log names an unknown session before it writes anything; its summaries leave out
/// empty lists; transcript refuses --limit 0.
#[test]
fn log_and_transcript_print_nothing_empty() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(&dir, 2);
    let unknown = SessionId([7; 16]).to_string();
    let out = annal(&["log", p(&db), "--session", &unknown]);
    assert_eq!(code(&out), 2);
    assert_eq!(stdout(&out), "", "no header before the error");
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));

    let out = annal(&["log", p(&db)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("state set model="), "{text}");
    for line in text.lines() {
        for empty in ["remove  ", "remove →", "set  ", "set →", "labels  ", "labels →"] {
            assert!(!line.contains(empty), "{line}");
        }
        assert!(!line.trim_end().ends_with(" remove"), "{line}");
    }

    let session = live_session(&db).to_string();
    let out = annal(&["transcript", p(&db), &session, "--limit", "0"]);
    assert_eq!(code(&out), 2, "{}", stdout(&out));
    assert!(!stdout(&out).contains("more from offset"), "{}", stdout(&out));
    let out = annal(&["transcript", p(&db), &session, "--limit", "10001"]);
    assert_eq!(code(&out), 2, "{}", stdout(&out));
    assert!(stderr(&out).contains("--limit 10001: a page holds at most 10000 messages"), "{}", stderr(&out));
    let out = annal(&["transcript", p(&db), &session, "--limit", "1"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("… more from offset 1"), "{}", stdout(&out));
}

/// rebuild --help says how each kind of rebuild writes, and names every projection.
#[test]
fn rebuild_help_names_every_projection() {
    let out = annal(&["rebuild", "--help"]);
    assert_eq!(code(&out), 0);
    let help = stdout(&out).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(!help.starts_with("Drop projections and fold them again from the log, in one durable"), "{help}");
    assert!(help.contains("renamed over DB.projections"), "{help}");
    let listed = help.split("A projection to rebuild (repeatable): ").nth(1).expect("the flag's help");
    let listed = listed.split(". All of them").next().unwrap();
    let names: Vec<&str> = listed.split(", ").collect();
    let all: Vec<&str> = annal::Projection::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(names, all, "{help}");
}

#[test]
fn the_read_commands_read_a_database_whose_host_was_killed_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.redb");
    let engine = Engine::open(&live).unwrap();
    let created = engine.create_session(annal::CreateSession::new().message(Message::system("hi"))).unwrap();
    engine.commit_turn(CommitTurn::new(created.session, "t1", Expected::Any).message(Message::user("one"))).unwrap();
    engine.checkpoint().unwrap();
    engine.commit_turn(CommitTurn::new(created.session, "t2", Expected::Any).message(Message::user("two"))).unwrap();
    // Every file as a SIGKILL of the host leaves it: copied while the engine runs.
    let db = dir.path().join("killed.redb");
    for (from, to) in annal::database_files(&live).iter().zip(annal::database_files(&db)) {
        if from.exists() {
            std::fs::copy(from, to).unwrap();
        }
    }
    engine.close().unwrap();
    let bytes = || annal::database_files(&db).map(|f| std::fs::read(f).ok());
    let before = bytes();
    let session = created.session.to_string();
    for args in [
        vec!["verify", p(&db), "--deep"],
        vec!["stats", p(&db)],
        vec!["sessions", p(&db)],
        vec!["log", p(&db)],
        vec!["inspect", p(&db), &session],
        vec!["export", p(&db)],
    ] {
        let out = annal(&args);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        assert!(!stdout(&out).contains("unusable"), "{args:?}: {}", stdout(&out));
    }
    assert!(stdout(&annal(&["log", p(&db)])).contains("TurnCommitted"), "the journal's commits are read");
    assert!(bytes() == before, "no read command writes to the files");
}

/// Ctrl-C during the demo removes its scratch directory: the process ends as `SIGINT`
/// ends it, and the temporary directory it ran in holds nothing after.
#[test]
fn an_interrupted_demo_leaves_no_scratch_directory_behind() {
    use std::os::unix::process::ExitStatusExt;
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_annal"))
        .args(["demo", "--sessions", "5000"])
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The demo has started once its scratch directory holds its database.
    let holds_a_file = |dir: &Path| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_dir(tmp.path()).unwrap().flatten().any(|e| e.path().is_dir() && holds_a_file(&e.path())) {
        assert!(child.try_wait().unwrap().is_none(), "the demo ended before it was interrupted");
        assert!(Instant::now() < deadline, "the demo did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    let kill = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(2), "ends as SIGINT ends a process: {status:?}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
