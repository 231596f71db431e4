//! The journal (SPEC §1, §2, §9, invariants 4, 9, 11, 12): a durable commit is one frame
//! and one fsync in the journal; the log file takes the rows behind the commits; an open
//! after a crash appends what the journal holds; a torn last frame is dropped, a damaged
//! acknowledged frame fails closed; a fault in the journal fails every caller of its group
//! commit, poisons the engine and is never retried; a reader in another process sees
//! journalled commits; a clean close leaves no journal.

mod common;

use annal::fault::{Faults, FaultyBackend};
use annal::journal::JOURNAL_PREALLOC_BYTES;
use annal::*;
use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// Every byte of every file of the database at `path` (absent files as `None`).
fn file_bytes(path: &Path) -> Vec<Option<Vec<u8>>> {
    database_files(path).iter().map(|f| std::fs::read(f).ok()).collect()
}

#[test]
fn a_read_only_opener_reads_a_crashed_database_and_writes_nothing() {
    let (_db, copy, crashed) = crashed();
    // The copy's log file and projections file were open for writing when it was taken:
    // redb refuses to open them read-only without a repair.
    let mut builder = redb::Builder::new();
    builder.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
    assert!(
        matches!(builder.open_read_only(&copy), Err(redb::DatabaseError::RepairAborted)),
        "the crashed copy needs redb's repair"
    );
    let before = file_bytes(&copy);
    let reader = Reader::open(&copy, Limits::default(), None).expect("a crashed database opens read-only");
    assert_eq!(tip_seq(&reader), 31, "the journal's commits are read past the log file");
    assert_eq!(reader.head(crashed.session).unwrap().unwrap().revision, crashed.head);
    assert_eq!(reader.projection_digests().unwrap(), crashed.digests);
    // A view outlives the reader that took it, as over a clean file.
    let view = reader.snapshot().unwrap();
    drop(reader);
    assert_eq!(query::head(&view, &crashed.session).unwrap().unwrap().revision, crashed.head);
    drop(view);
    assert!(file_bytes(&copy) == before, "reading a crashed database changes no byte of it");
    // An open for writing then recovers the same state.
    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), crashed.digests);
    engine.close().unwrap();
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

/// A reader that folded a journalled record the log then lost (read before the writer's
/// fsync, which failed; the writer reopened and wrote another record at that seq) does
/// not chain the records after it onto that fold: it refuses, and a reader opened again
/// reads the log as it is.
#[test]
fn a_reader_refuses_a_journal_that_no_longer_holds_what_it_folded() {
    let db = Db::new();
    let engine = Engine::open(&db.path).unwrap();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    engine.close().unwrap();
    let at = |name: &str| db.dir.path().join(name);
    // Two histories after the creation, each left as a SIGKILL leaves it: the journal
    // holds their turns.
    let mut heads = Vec::new();
    for (name, turns) in [("one", 1), ("other", 2)] {
        copy_database(&db.path, &at(&format!("{name}.redb")));
        let engine = Engine::open(at(&format!("{name}.redb"))).unwrap();
        heads.push(commit_turns(&engine, s, name, turns, rev));
        copy_database(&at(&format!("{name}.redb")), &at(&format!("{name}-killed.redb")));
        engine.close().unwrap();
    }
    let reader_path = at("read.redb");
    copy_database(&db.path, &reader_path);
    let journal_of = |name: &str| {
        for (from, to) in journal_paths(&at(name)).iter().zip(journal_paths(&reader_path)) {
            std::fs::copy(from, to).unwrap();
        }
    };
    journal_of("one-killed.redb");
    let reader = Reader::open(&reader_path, Limits::default(), None).unwrap();
    assert_eq!(reader.head(s).unwrap().unwrap().revision, heads[0]);
    journal_of("other-killed.redb");
    match reader.head(s) {
        Err(Error::Corrupt { detail, .. }) => assert!(detail.contains("no longer holds"), "{detail}"),
        other => panic!("the reader folded onto a record the log lost: {other:?}"),
    }
    let again = Reader::open(&reader_path, Limits::default(), None).unwrap();
    assert_eq!(again.head(s).unwrap().unwrap().revision, heads[1]);
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

/// Committer threads of [`a_failed_journal_write_or_fsync_fails_its_whole_group_commit`].
const COMMITTERS: usize = 8;

/// Invariant 9 on the default path (a durable database in files, whose commits go to the
/// journal), with committers on several threads, so that the failing group commit
/// carries several callers. The journal's write (then, in a second run, its
/// `sync_data`) fails while they commit: every caller of the failing group commit gets
/// its error, and none an `Ok`; every later command is `Poisoned`; the journal is not
/// written or synced again, not even by the close; and after a reopen every
/// acknowledged turn is there, the failing group commit is all there or not at all (not
/// at all when its write failed: nothing reached the file), and no other turn is.
#[test]
fn a_failed_journal_write_or_fsync_fails_its_whole_group_commit() {
    for fail_sync in [false, true] {
        // Now and then the committers' timing leaves the failing group commit one caller:
        // run again until it has several.
        let mut tries = 0;
        while fault_under_committers(fail_sync) < 2 {
            tries += 1;
            assert!(tries < 10, "the failing group commit never had several callers");
        }
    }
}

/// One run of [`a_failed_journal_write_or_fsync_fails_its_whole_group_commit`], the
/// journal's `sync_data` failing if `fail_sync`, else its write. Returns the callers of
/// the failing group commit.
fn fault_under_committers(fail_sync: bool) -> usize {
    let db = Db::new();
    let (ok, journal) = (Faults::new(), Faults::new());
    let files = journal_paths(&db.path).map(|p| faulty(&p, &journal));
    let (log, projections) = (faulty(&db.path, &ok), faulty(&projections_path(&db.path), &ok));
    let engine = Engine::open_with_journal(log, projections, files, Options::default()).unwrap();
    let sessions: Vec<(SessionId, RevisionId)> =
        (0..COMMITTERS).map(|t| create(&engine, &[Message::system(format!("session {t}"))])).collect();

    // Each committer commits turns to its own session until it has seen three errors.
    let acknowledged = AtomicU64::new(0);
    let runs: Vec<Vec<(String, Result<Receipt>)>> = std::thread::scope(|scope| {
        let committers: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(t, &(session, mut head))| {
                let (engine, acknowledged) = (engine.clone(), &acknowledged);
                scope.spawn(move || {
                    let mut run = Vec::new();
                    for i in 0..10_000 {
                        let id = format!("c{t}-{i}");
                        let result = engine.commit_turn(turn(session, &id, head)).map(|o| o.receipt());
                        if let Ok(receipt) = &result {
                            head = receipt.revision;
                            acknowledged.fetch_add(1, Ordering::SeqCst);
                        }
                        run.push((id, result));
                        if run.iter().filter(|(_, r)| r.is_err()).count() == 3 {
                            break;
                        }
                    }
                    run
                })
            })
            .collect();
        // The fault comes while every committer is busy.
        let deadline = Instant::now() + Duration::from_secs(60);
        while acknowledged.load(Ordering::SeqCst) < 10 * COMMITTERS as u64
            && !committers.iter().any(|c| c.is_finished())
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!committers.iter().any(|c| c.is_finished()), "a committer stopped before the fault");
        match fail_sync {
            true => journal.fail_sync_after(0),
            false => journal.fail_write_after(0),
        }
        committers.into_iter().map(|c| c.join().unwrap()).collect()
    });

    // Each committer: acknowledged turns, then one error (the failing group commit's,
    // or `Poisoned` for a command that came after it), then `Poisoned` only.
    let (mut acked, mut failed, mut refused) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let mut failure = None;
    for run in &runs {
        let first_err = run.iter().position(|(_, r)| r.is_err()).expect("every committer saw the fault");
        acked.extend(run[..first_err].iter().map(|(id, _)| id.clone()));
        assert_eq!(run.len(), first_err + 3, "no Ok after an error");
        for (id, result) in &run[first_err + 1..] {
            assert!(matches!(result, Err(Error::Poisoned)), "{id} after an error: {result:?}");
            refused.insert(id.clone());
        }
        let (id, result) = &run[first_err];
        match result {
            Err(Error::Poisoned) => {
                refused.insert(id.clone());
            }
            Err(Error::Rejected(r)) => panic!("{id} was rejected: {r:?}"),
            Err(e) => {
                // The one error of the failing group commit, given to each of its callers.
                assert_eq!(failure.get_or_insert_with(|| e.clone()), e, "{id}");
                failed.insert(id.clone());
            }
            Ok(_) => unreachable!(),
        }
    }
    assert!(!failed.is_empty(), "the failing group commit's callers got its error: {runs:?}");
    eprintln!(
        "fail_sync {fail_sync}: {} acknowledged, {} in the failing group commit, {} refused as poisoned",
        acked.len(),
        failed.len(),
        refused.len()
    );
    assert!(engine.is_poisoned());
    let (s, created) = sessions[0];
    assert!(matches!(engine.commit_turn(turn(s, "later", created)), Err(Error::Poisoned)));
    assert_eq!(journal.failures(), 1, "one call failed, and was not tried again");
    drop(engine);
    assert_eq!(journal.calls_after_failure(), (0, 0), "journal writes and syncs after the failure, close included");
    assert!(journal.syncs() > 0, "the acknowledged turns were synced");

    journal.heal();
    let engine = Engine::open(&db.path).unwrap();
    let mut present = BTreeSet::new();
    let mut events = COMMITTERS as u64;
    for &(s, _) in &sessions {
        let turns: Vec<String> = transcript(engine.reader(), s)
            .iter()
            .skip(1)
            .step_by(2)
            .map(|m| String::from_utf8(m.message.body.clone()).unwrap())
            .map(|body| body.strip_prefix("question of ").expect("a turn's question").to_string())
            .collect();
        events += turns.len() as u64;
        present.extend(turns);
        assert_eq!(present.len() as u64 + COMMITTERS as u64, events, "a turn is there once, in {s}");
    }
    assert_eq!(tip_seq(&engine), events, "the log holds the sessions and their turns, nothing else");
    assert!(acked.is_subset(&present), "acknowledged turns lost: {:?}", acked.difference(&present).collect::<Vec<_>>());
    assert!(
        refused.is_disjoint(&present),
        "refused turns written: {:?}",
        refused.intersection(&present).collect::<Vec<_>>()
    );
    let landed: BTreeSet<String> = present.difference(&acked).cloned().collect();
    assert!(landed.is_empty() || landed == failed, "the failing group commit is whole or absent: {landed:?}");
    if !fail_sync {
        assert!(landed.is_empty(), "a frame whose write failed reached the file: {landed:?}");
    }
    eprintln!("fail_sync {fail_sync}: {} turns of the failing group commit after the reopen", landed.len());
    assert!(engine.commit_turn(turn(s, "after-reopen", head(&engine, s).revision)).is_ok());
    engine.close().unwrap();
    failed.len()
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
