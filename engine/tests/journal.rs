//! The journal (SPEC §1, §2, §9, invariants 4, 9, 11, 12): a durable commit is one frame
//! and one fsync in the journal; the log file takes the rows behind the commits; an open
//! after a crash appends what the journal holds; a torn last frame is dropped, a damaged
//! acknowledged frame fails closed; a fault in the journal poisons the engine; a reader
//! in another process sees journalled commits; a clean close leaves no journal.

mod common;

use annal::fault::{Faults, FaultyBackend};
use annal::journal::JOURNAL_PREALLOC_BYTES;
use annal::*;
use common::*;
use std::path::{Path, PathBuf};

/// Copies every file of the database at `from` to `to`, as a SIGKILL leaves them.
fn copy_database(from: &Path, to: &Path) {
    for (a, b) in database_files(from).iter().zip(database_files(to)) {
        if a.exists() {
            std::fs::copy(a, b).unwrap();
        }
    }
}

/// Records in the log file itself (of a database no engine holds, closed cleanly).
fn log_records(path: &Path) -> u64 {
    let mut builder = redb::Builder::new();
    builder.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
    let db = builder.open_read_only(path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    let table = txn.open_table(tables::LOG).unwrap();
    redb::ReadableTableMetadata::len(&table).unwrap()
}

fn big_turn(session: SessionId, i: usize, expected: RevisionId) -> CommitTurn {
    // About 64 KiB of content that does not compress, so the journal fills quickly.
    let mut body = Vec::with_capacity(64 << 10);
    let mut x = i as u64 + 1;
    while body.len() < 64 << 10 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        body.extend_from_slice(&x.to_le_bytes());
    }
    CommitTurn::new(session, format!("big-{i}"), Expected::Exact(expected)).message(Message::new(
        Role::Tool,
        "application/octet-stream",
        body,
    ))
}

#[test]
fn commits_are_journalled_and_a_clean_close_leaves_them_in_the_log_file_alone() {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let head = commit_turns(&engine, s, "t", 20, rev);
    let stats = engine.stats();
    assert!(stats.journal_bytes > 0, "commits went to the journal");
    assert_eq!(stats.absorptions, 0, "nothing was absorbed yet");
    assert!(journal_paths(&db.path).iter().all(|p| p.exists()));
    // Queries read the journalled rows from memory.
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
    assert_eq!(transcript(engine.reader(), s).len(), 41);
    assert_eq!(all_events(engine.reader()).len(), 21);
    engine.close().unwrap();
    assert!(journal_paths(&db.path).iter().all(|p| !p.exists()), "a clean close removes the journal");
    assert_eq!(log_records(&db.path), 21, "the log file holds every record");
    let engine = Engine::open(&db.path).unwrap();
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
    assert_eq!(engine.stats().recovered_events, 0);
    engine.close().unwrap();
}

/// Frames land in the zeros the journal files were created with: no commit changes a
/// file's length, so no `fdatasync` writes one. A crash leaves frames and zeros, and
/// the open reads the frames alone.
#[test]
fn frames_land_in_place_in_the_preallocated_journal() {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let lengths = || journal_paths(&db.path).map(|p| std::fs::metadata(p).unwrap().len());
    assert_eq!(lengths(), [JOURNAL_PREALLOC_BYTES; 2], "both files are preallocated at open");
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let head = commit_turns(&engine, s, "t", 40, rev);
    assert_eq!(lengths(), [JOURNAL_PREALLOC_BYTES; 2], "the commits did not grow the files");
    let (_, bytes) = journal_bytes(&db.path, 0);
    let end = frames_end(&bytes);
    assert!(end > 0 && bytes[end..].iter().all(|&b| b == 0), "frames, then the zeros");
    let copy = db.dir.path().join("crashed.redb");
    copy_database(&db.path, &copy);
    engine.close().unwrap();
    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
    engine.close().unwrap();
    assert!(journal_paths(&copy).iter().all(|p| !p.exists()), "a clean close removes the journal");

    // Without preallocation the files grow to their frames' end.
    let bare = db.dir.path().join("bare.redb");
    let options = Options { journal_preallocate_bytes: 0, ..Options::default() };
    let engine = Engine::open_with(&bare, options).unwrap();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    commit_turns(&engine, s, "t", 3, rev);
    let (_, bytes) = journal_bytes(&bare, 0);
    assert_eq!(frames_end(&bytes), bytes.len());
    engine.close().unwrap();
}

/// What a live engine had when [`crashed`] copied its files.
struct Crashed {
    session: SessionId,
    head: RevisionId,
    digests: Vec<TableDigest>,
}

/// A database of one session and 30 turns, all in the journal (the log file holds no
/// record), copied as a SIGKILL leaves it: `crashed.redb` beside the original.
fn crashed() -> (Db, PathBuf, Crashed) {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let (session, rev) = create(&engine, &[Message::system("sys")]);
    let head = commit_turns(&engine, session, "t", 30, rev);
    let digests = engine.projection_digests().unwrap();
    let copy = db.dir.path().join("crashed.redb");
    copy_database(&db.path, &copy);
    assert_eq!(log_records(&db.path), 0, "the journal alone holds the commits");
    engine.close().unwrap();
    (db, copy, Crashed { session, head, digests })
}

/// [`crashed`], less the copy's projections file.
fn crashed_without_projections() -> (Db, PathBuf, Crashed) {
    let (db, copy, crashed) = crashed();
    std::fs::remove_file(projections_path(&copy)).unwrap();
    (db, copy, crashed)
}

#[test]
fn an_open_after_a_crash_appends_the_journal_to_the_log_file() {
    let (_db, copy, crashed) = crashed();
    let (s, head, live) = (crashed.session, crashed.head, crashed.digests);
    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head, "every acknowledged commit is there");
    assert_eq!(engine.projection_digests().unwrap(), live);
    engine.close().unwrap();
    assert_eq!(log_records(&copy), 31);
    let report = Reader::open(&copy, Limits::default(), None).unwrap();
    assert_eq!(tip_seq(&report), 31);
}

#[test]
fn the_journal_switches_files_and_is_absorbed_behind_the_commits() {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let (s, mut rev) = create(&engine, &[Message::system("sys")]);
    let reader = Reader::open(&db.path, Limits::default(), None).unwrap();
    // Two and a half journal files' worth: two switches, and turns past the last one.
    let turns = (5 * JOURNAL_SWITCH_BYTES / 2 / (64 << 10)) as usize;
    for i in 0..turns {
        rev = engine.commit_turn(big_turn(s, i, rev)).unwrap().receipt().revision;
        if i % 16 == 0 {
            // Another process follows, across switches and absorptions.
            assert_eq!(reader.head(s).unwrap().unwrap().revision, rev, "turn {i}");
        }
    }
    assert_eq!(reader.head(s).unwrap().unwrap().revision, rev);
    let stats = engine.stats();
    assert!(stats.absorptions >= 1, "the absorber ran: {stats:?}");
    assert!(stats.journal_bytes >= 5 * JOURNAL_SWITCH_BYTES / 2);
    // A crash now: part of the log is in the log file, the rest in the journal.
    let copy = db.dir.path().join("crashed.redb");
    copy_database(&db.path, &copy);
    let in_file = log_records(&db.path);
    assert!(in_file > 1 && in_file < turns as u64 + 1, "{in_file} records in the log file");
    let page = engine.transcript(s, PageRequest::new(0, 10_000)).unwrap();
    assert_eq!(page.messages.len(), turns + 1);
    engine.close().unwrap();
    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.head(s).unwrap().unwrap().revision, rev);
    assert_eq!(engine.transcript(s, PageRequest::new(0, 10_000)).unwrap().messages, page.messages);
    engine.close().unwrap();
}

/// The journal file `index` of the database at `path`, read.
fn journal_bytes(path: &Path, index: usize) -> (PathBuf, Vec<u8>) {
    let p = journal_paths(path)[index].clone();
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes)
}

/// Where the frames at the start of a journal file end (their headers name their lengths;
/// the file goes on with zeros).
fn frames_end(bytes: &[u8]) -> usize {
    let mut at = 0;
    while bytes.get(at..at + 4) == Some(b"ANJ1".as_slice()) {
        at += 92 + u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    }
    at
}

#[test]
fn a_torn_last_frame_is_dropped_and_a_damaged_acknowledged_frame_fails_closed() {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let after_five = commit_turns(&engine, s, "t", 5, rev);
    let five_end = frames_end(&journal_bytes(&db.path, 0).1);
    commit_turns(&engine, s, "u", 1, after_five);
    let six_end = frames_end(&journal_bytes(&db.path, 0).1);
    assert!(six_end > five_end);
    let torn = db.dir.path().join("torn.redb");
    copy_database(&db.path, &torn);
    let damaged = db.dir.path().join("damaged.redb");
    copy_database(&db.path, &damaged);
    engine.close().unwrap();

    // Power lost while the sixth turn's frame was being written: half of it reached the
    // disk. That turn was never acknowledged; the five before it were.
    let (p, mut bytes) = journal_bytes(&torn, 0);
    bytes[five_end + (six_end - five_end) / 2..six_end].fill(0);
    std::fs::write(&p, &bytes).unwrap();
    let engine = Engine::open(&torn).unwrap();
    assert_eq!(engine.head(s).unwrap().unwrap().revision, after_five);
    engine.close().unwrap();

    // A flipped byte inside an acknowledged frame, with a frame after it: fail closed.
    let (p, mut bytes) = journal_bytes(&damaged, 0);
    bytes[five_end - 10] ^= 0x01;
    std::fs::write(&p, &bytes).unwrap();
    match Engine::open(&damaged) {
        Err(Error::Corrupt { .. }) => {}
        other => panic!("a damaged acknowledged frame must fail the open, got {:?}", other.map(|_| ())),
    }
    assert!(std::fs::read(&p).unwrap() == bytes, "a failed open leaves the journal as it was");
    match Engine::open(&damaged) {
        Err(Error::Corrupt { .. }) => {}
        other => panic!("and fails it again, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_reader_in_another_process_sees_journalled_commits() {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let reader = Reader::open(&db.path, Limits::default(), None).unwrap();
    assert_eq!(reader.head(s).unwrap().unwrap().revision, rev);
    let head = commit_turns(&engine, s, "t", 3, rev);
    assert_eq!(log_records(&db.path), 0, "the log file holds nothing yet");
    assert_eq!(reader.head(s).unwrap().unwrap().revision, head, "the reader folds the journal");
    assert_eq!(transcript(&reader, s).len(), 7);
    assert_eq!(all_events(&reader).len(), 4);
    engine.close().unwrap();
    assert_eq!(reader.head(s).unwrap().unwrap().revision, head, "and then the log file");
}

fn faulty(path: &Path, faults: &Faults) -> FaultyBackend<redb::backends::FileBackend> {
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
    FaultyBackend::new(redb::backends::FileBackend::new(file).unwrap(), faults.clone())
}

#[test]
fn a_failed_journal_write_or_fsync_poisons_the_engine_and_loses_nothing_acknowledged() {
    for fail_sync in [false, true] {
        let db = Db::new();
        let (ok, journal) = (Faults::new(), Faults::new());
        let [first, second] = journal_paths(&db.path);
        let open = |journal: &Faults| {
            let files = [faulty(&first, journal), faulty(&second, journal)];
            let (log, projections) = (faulty(&db.path, &ok), faulty(&projections_path(&db.path), &ok));
            Engine::open_with_journal(log, projections, files, Options::default()).unwrap()
        };
        let engine = open(&journal);
        let (s, rev) = create(&engine, &[Message::system("sys")]);
        let head = commit_turns(&engine, s, "t", 4, rev);
        match fail_sync {
            true => journal.fail_sync_after(0),
            false => journal.fail_write_after(0),
        }
        let err = engine.commit_turn(turn(s, "lost", head)).unwrap_err();
        assert!(!matches!(err, Error::Rejected(_)), "{err:?}");
        assert!(engine.is_poisoned());
        assert!(matches!(engine.commit_turn(turn(s, "after", head)), Err(Error::Poisoned)));
        assert_eq!(engine.head(s).unwrap().unwrap().revision, head, "reads still answer");
        drop(engine);
        journal.heal();
        let engine = open(&journal);
        let reopened = engine.head(s).unwrap().unwrap();
        // The failed batch is all or nothing after the reopen, never half.
        assert!(reopened.revision == head || reopened.message_count == 11, "{reopened:?}");
        let retry = engine.commit_turn(turn(s, "lost", head));
        assert!(retry.is_ok() || matches!(retry, Err(Error::Rejected(Rejection::RevisionConflict { .. }))));
        engine.close().unwrap();
    }
}

#[test]
fn a_relaxed_open_takes_in_a_journal_a_crash_left() {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let head = commit_turns(&engine, s, "t", 3, rev);
    let copy = db.dir.path().join("crashed.redb");
    copy_database(&db.path, &copy);
    engine.close().unwrap();
    let relaxed = Options { durability: Durability::Relaxed, ..Options::default() };
    let engine = Engine::open_with(&copy, relaxed).unwrap();
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
    assert!(journal_paths(&copy).iter().all(|p| !p.exists()), "a relaxed engine keeps no journal");
    engine.close().unwrap();
}

/// `recover_log`, the first step of an offline rebuild: what a crash left in the journal
/// goes into the log file, the journal is removed as a clean close removes it, and the
/// projections file is neither opened nor created. A rebuild then gives the projections
/// the live engine had, and an open has nothing left to fold.
#[test]
fn recovering_the_log_takes_in_the_journal_and_folds_nothing() {
    let (db, copy, crashed) = crashed_without_projections();
    let (s, head, live) = (crashed.session, crashed.head, crashed.digests);

    let recovered = recover_log(&copy, &Options::default()).unwrap();
    assert_eq!(recovered, LogRecovery { tip_seq: 31, records_taken_in: 31, collection_interrupted: false });
    assert_eq!(log_records(&copy), 31);
    assert!(journal_paths(&copy).iter().all(|p| !p.exists()), "the journal is removed");
    assert!(!projections_path(&copy).exists(), "the projections file is not created");
    // Once more: nothing left to take in.
    let again = recover_log(&copy, &Options::default()).unwrap();
    assert_eq!(again, LogRecovery { tip_seq: 31, records_taken_in: 0, collection_interrupted: false });

    let stats = rebuild_offline(&copy, &Options::default(), ProjectionSet::all(), &mut |_, _| {}).unwrap();
    assert_eq!(stats.events, 31);
    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.stats().recovered_events, 0, "the rebuild left nothing to fold");
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
    assert_eq!(engine.projection_digests().unwrap(), live);
    engine.close().unwrap();

    // A missing file is an error and is not created; a wrong chain key changes nothing.
    let missing = db.dir.path().join("missing.redb");
    assert!(matches!(recover_log(&missing, &Options::default()), Err(Error::Storage(_))));
    assert!(database_files(&missing).iter().all(|p| !p.exists()));
    let keyed = Options { chain_key: Some([7; 32]), ..Options::default() };
    let before = std::fs::read(&copy).unwrap();
    assert!(matches!(recover_log(&copy, &keyed), Err(Error::KeyMismatch { .. })));
    assert_eq!(std::fs::read(&copy).unwrap(), before);
}

/// An open after a crash whose projections file is gone: the journal goes into the log
/// file and every projection is rebuilt into a new file before the open proper, which
/// then has nothing left to fold; the events are counted as the open's recovery.
#[test]
fn an_open_without_a_projections_file_after_a_crash_rebuilds_them_from_the_journal_too() {
    let (_db, copy, crashed) = crashed_without_projections();
    let (s, head, live) = (crashed.session, crashed.head, crashed.digests);

    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.stats().recovered_events, 31);
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
    assert_eq!(engine.projection_digests().unwrap(), live);
    assert!(!annal::rebuild::rebuild_path(&projections_path(&copy)).exists(), "no rebuild file is left");
    let head = commit_turns(&engine, s, "after", 2, head);
    engine.close().unwrap();
    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.stats().recovered_events, 0);
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
    engine.close().unwrap();
}
