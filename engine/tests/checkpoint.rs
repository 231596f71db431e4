//! The delta and its checkpoints (SPEC §1, §2, §9, invariants 3, 4, 9, 11, 12): every
//! query sees every acknowledged commit whatever the checkpoint lag, queries of every
//! kind read one view, a checkpoint that fails poisons the engine and leaves the files
//! consistent, the delta stays under its bound, close checkpoints everything, and an
//! open after a crash folds the log past the last checkpoint.

mod common;

use annal::fault::{Faults, FaultyBackend};
use annal::*;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Checkpoints as often as possible: after every few events and every millisecond.
fn eager() -> CheckpointPolicy {
    CheckpointPolicy { events: 4, delta_bytes: 1 << 20, interval: Duration::from_millis(1), delta_bytes_max: 64 << 20 }
}

/// Never checkpoints before close.
fn never() -> CheckpointPolicy {
    CheckpointPolicy {
        events: u64::MAX,
        delta_bytes: u64::MAX,
        interval: Duration::from_secs(3600),
        delta_bytes_max: u64::MAX,
    }
}

fn open_with(db: &Db, checkpoint: CheckpointPolicy) -> Engine {
    Engine::open_with(&db.path, Options { checkpoint, ..Options::default() }).unwrap()
}

/// Rebuilds every projection and checks the rows did not change.
fn assert_projections_equal_a_rebuild(engine: &Engine) {
    let live = engine.projection_digests().unwrap();
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), live, "the projections equal a rebuild from the log");
}

/// 16 committers run while checkpoints run constantly; right after each reply, another
/// thread's queries (head, transcript, session events, tip) see that commit.
#[test]
fn read_your_writes_across_threads_while_checkpoints_run() {
    let db = Db::new();
    let engine = open_with(&db, eager());
    let (tx, rx) = crossbeam_channel::unbounded::<(SessionId, Receipt, u64)>();
    let checker = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let mut checked = 0u64;
            for (session, receipt, count) in rx {
                let head = engine.head(session).unwrap().expect("an acknowledged session has a head");
                assert!(head.last_seq >= receipt.seq, "head {} is older than receipt {}", head.last_seq, receipt.seq);
                assert!(head.message_count >= count);
                assert!(engine.tip().unwrap().0 >= receipt.seq, "tip older than an acknowledged commit");
                let page = engine.transcript(session, PageRequest::new(count - 1, 1)).unwrap();
                assert_eq!(page.messages.len(), 1, "the acknowledged message reads");
                let q = EventQuery { from_seq: head.stream_seq, max_events: 1, max_bytes: 1 << 20 };
                assert_eq!(engine.session_events(session, q).unwrap().events.len(), 1);
                checked += 1;
            }
            checked
        })
    };
    let committers: Vec<_> = (0..16)
        .map(|t| {
            let engine = engine.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let (s, mut head) = create(&engine, &[Message::system("sys")]);
                for i in 0..25u64 {
                    let c = CommitTurn::new(s, format!("t{t}-{i}"), Expected::Exact(head))
                        .message(Message::user(format!("hello {t} {i}")));
                    let receipt = engine.commit_turn(c).unwrap().receipt();
                    head = receipt.revision;
                    tx.send((s, receipt, i + 2)).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    for c in committers {
        c.join().unwrap();
    }
    assert_eq!(checker.join().unwrap(), 16 * 25);
    assert!(engine.stats().checkpoints > 0, "checkpoints ran during the commits");
    assert_projections_equal_a_rebuild(&engine);
    engine.close().unwrap();
}

/// Reads of different kinds never go back: each read is at least as new as every read
/// before it (tip, then head, then transcript, then an event page, then the tip again),
/// whatever the writer and the checkpointer do meanwhile.
#[test]
fn query_kinds_read_one_monotonic_view() {
    let db = Db::new();
    let engine = open_with(&db, eager());
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let stop = Arc::new(AtomicBool::new(false));
    // Every commit is one event of `s` adding one message, so in any view the tip, the
    // head's last seq and its message count are one number (the main thread checks it):
    // reads of different kinds compare through it.
    let reader = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            let mut newest = 0;
            while !stop.load(Ordering::Relaxed) {
                let (tip, _) = engine.tip().unwrap();
                assert!(tip >= newest, "a tip read at {tip} after a read at {newest}");
                let head = engine.head(s).unwrap().unwrap();
                assert!(head.last_seq >= tip, "a head read at {} after a tip read at {tip}", head.last_seq);
                let transcript = engine.transcript(s, PageRequest::first(1)).unwrap();
                assert!(
                    transcript.total >= head.message_count,
                    "a transcript of {} messages read after a head of {}",
                    transcript.total,
                    head.message_count
                );
                let q = EventQuery { from_seq: transcript.total, max_events: 1000, max_bytes: 64 << 20 };
                let events = engine.events(q).unwrap();
                let seqs: Vec<u64> = events.events.iter().map(|e| e.record.seq).collect();
                let latest = *seqs.last().expect("an event page from a seq read before holds it");
                assert_eq!(
                    seqs,
                    (transcript.total..=latest).collect::<Vec<_>>(),
                    "an event page read after the transcript"
                );
                let (again, _) = engine.tip().unwrap();
                assert!(again >= latest, "a tip read at {again} after an event page up to {latest}");
                let view = engine.snapshot().unwrap();
                assert!(view.seq() >= again, "a view at {} after a tip read at {again}", view.seq());
                newest = view.seq();
                let seen = query::head(&view, &s).unwrap().unwrap();
                assert!(seen.last_seq <= view.seq(), "a view never shows a commit past its seq");
                let page = query::transcript(&view, engine.limits(), &s, PageRequest::first(1000)).unwrap();
                assert_eq!(page.total, seen.message_count, "the transcript and the head of one view agree");
                reads += 1;
            }
            reads
        })
    };
    let mut head = rev;
    for i in 0..200 {
        let c = CommitTurn::new(s, format!("t{i}"), Expected::Exact(head)).message(Message::user(format!("m{i}")));
        let receipt = engine.commit_turn(c).unwrap().receipt();
        head = receipt.revision;
        // Right after the reply, this thread reads the commit too; the commit is the
        // tip's one event and its session's last message.
        let read = engine.head(s).unwrap().unwrap();
        assert_eq!((read.last_seq, read.message_count), (receipt.seq, receipt.seq));
        assert_eq!(engine.tip().unwrap().0, receipt.seq);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    engine.close().unwrap();
}

/// Close checkpoints the whole delta: the next open folds nothing.
#[test]
fn close_checkpoints_everything() {
    let db = Db::new();
    let engine = open_with(&db, never());
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    commit_turns(&engine, s, "t", 30, rev);
    assert_eq!(engine.stats().checkpoints, 0, "no checkpoint before close under this policy");
    let live = engine.projection_digests().unwrap();
    engine.close().unwrap();
    let engine = open_with(&db, never());
    assert_eq!(engine.stats().recovered_events, 0, "nothing left to fold at open");
    assert_eq!(engine.projection_digests().unwrap(), live);
    engine.close().unwrap();
}

/// Copies the database's files while the engine has them open, which is what SIGKILL
/// leaves on disk; returns the copy's path.
fn copy_of_open_files(db: &Db) -> std::path::PathBuf {
    let copy = db.dir.path().join("copy.redb");
    for (from, to) in annal::database_files(&db.path).iter().zip(annal::database_files(&copy)) {
        if from.exists() {
            std::fs::copy(from, to).unwrap();
        }
    }
    copy
}

/// A crash with the whole delta unflushed (the files copied while the engine is open,
/// which is what SIGKILL leaves on disk): the open folds the log past the checkpoint and
/// every acknowledged commit is there.
#[test]
fn open_after_a_crash_folds_the_log_past_the_checkpoint() {
    let db = Db::new();
    let engine = open_with(&db, never());
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    let head = commit_turns(&engine, s, "t", 40, rev);
    let live = engine.projection_digests().unwrap();
    let copy = copy_of_open_files(&db);
    engine.close().unwrap();
    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.stats().recovered_events, 41, "the open folded every event past the last checkpoint");
    assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
    assert_eq!(engine.projection_digests().unwrap(), live);
    assert_projections_equal_a_rebuild(&engine);
    engine.close().unwrap();
}

/// The same with a tail long enough to fold on two threads at open
/// (`FOLD_SECOND_THREAD_EVENTS`, 2,048): four sessions whose turns repeat one another's
/// messages (the content-id index deduplicates them), one of them restored and one
/// forked (the graph).
#[test]
fn open_after_a_crash_folds_a_long_tail_on_two_threads() {
    let db = Db::new();
    let engine = open_with(&db, never());
    let mut heads = Vec::new();
    for i in 0..4 {
        let (s, rev) = create(&engine, &[Message::system("sys")]);
        let early = commit_turns(&engine, s, &format!("s{i}-"), 10, rev);
        heads.push((s, early, commit_turns(&engine, s, &format!("s{i}+"), 510, early)));
    }
    let (s0, early, head0) = heads[0];
    let restore = Restore { session: s0, expected: head0, target: early, note: "undo".into(), actor: "host".into() };
    assert_eq!(engine.restore(restore).unwrap().revision, early);
    let fork = Fork { parent: heads[1].0, session: new_session_id(), index: 100, replacement: None, labels: None };
    let forked = engine.fork(fork).unwrap();
    let events = engine.tip().unwrap().0;
    assert!(events > 2_048, "{events} events past the checkpoint");
    let live = engine.projection_digests().unwrap();
    let copy = copy_of_open_files(&db);
    engine.close().unwrap();
    let engine = Engine::open(&copy).unwrap();
    assert_eq!(engine.stats().recovered_events, events, "the open folded every event past the last checkpoint");
    assert_eq!(engine.head(forked.session).unwrap().unwrap().revision, forked.receipt.revision);
    assert_eq!(engine.projection_digests().unwrap(), live);
    assert_projections_equal_a_rebuild(&engine);
    engine.close().unwrap();
}

/// A closed database of one session with ten turns, and its projections' digests.
fn closed_database_of_ten_turns() -> (Db, Vec<TableDigest>) {
    let db = Db::new();
    let engine = db.open();
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    commit_turns(&engine, s, "t", 10, rev);
    let live = engine.projection_digests().unwrap();
    engine.close().unwrap();
    (db, live)
}

/// Deleting the projections file loses nothing: the next open rebuilds it.
#[test]
fn a_deleted_projections_file_is_rebuilt_at_open() {
    let (db, live) = closed_database_of_ten_turns();
    std::fs::remove_file(projections_path(&db.path)).unwrap();
    let engine = db.open();
    assert_eq!(engine.projection_digests().unwrap(), live);
    engine.close().unwrap();
}

/// The delta never grows past its bound: at it, commits wait for the checkpointer.
#[test]
fn the_delta_bound_holds_with_backpressure() {
    let db = Db::new();
    let bound = 64 << 10;
    let policy = CheckpointPolicy {
        events: u64::MAX,
        delta_bytes: u64::MAX,
        interval: Duration::from_secs(3600),
        delta_bytes_max: bound,
    };
    let engine = open_with(&db, policy);
    let (s, mut head) = create(&engine, &[Message::system("sys")]);
    let mut largest = 0;
    for i in 0..300 {
        let c = CommitTurn::new(s, format!("t{i}"), Expected::Exact(head)).message(Message::user("x".repeat(500)));
        head = engine.commit_turn(c).unwrap().receipt().revision;
        largest = largest.max(engine.stats().delta_bytes);
    }
    let stats = engine.stats();
    assert!(stats.backpressure_waits > 0, "the bound was reached and the writer waited");
    assert!(stats.checkpoints > 0);
    // Between two checks the writer applies at most one batch past the bound.
    assert!(largest < bound + (16 << 10), "delta reached {largest} bytes, bound {bound}");
    assert_projections_equal_a_rebuild(&engine);
    engine.close().unwrap();
}

fn file_backend(path: &std::path::Path, faults: &Faults) -> FaultyBackend<redb::backends::FileBackend> {
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
    FaultyBackend::new(redb::backends::FileBackend::new(file).unwrap(), faults.clone())
}

/// A failed write or fsync inside a checkpoint poisons the engine: later commits get
/// `Poisoned`, reads still see every acknowledged commit, and after a reopen the files
/// are consistent (every acknowledged commit, projections equal to a rebuild).
#[test]
fn a_fault_inside_a_checkpoint_poisons_and_the_reopened_files_are_consistent() {
    // A checkpoint commits with two fsyncs (two-phase) and a few page writes.
    for (sync, after) in [(false, 0), (false, 1), (false, 3), (true, 0), (true, 1)] {
        {
            let db = Db::new();
            let (log_faults, projection_faults) = (Faults::new(), Faults::new());
            let options = Options { checkpoint: never(), ..Options::default() };
            let engine = Engine::open_with_backends(
                file_backend(&db.path, &log_faults),
                file_backend(&projections_path(&db.path), &projection_faults),
                options.clone(),
            )
            .unwrap();
            let (s, rev) = create(&engine, &[Message::system("sys")]);
            let head = commit_turns(&engine, s, "t", 12, rev);
            let count = engine.head(s).unwrap().unwrap().message_count;
            if sync {
                projection_faults.fail_sync_after(after);
            } else {
                projection_faults.fail_write_after(after);
            }
            let failed = engine.checkpoint();
            assert!(failed.is_err(), "sync {sync} after {after}: the checkpoint failed");
            assert!(engine.is_poisoned());
            let turn = CommitTurn::new(s, "late", Expected::Exact(head)).message(Message::user("late"));
            assert_eq!(engine.commit_turn(turn).unwrap_err(), Error::Poisoned);
            assert_eq!(engine.head(s).unwrap().unwrap().revision, head, "reads still see every commit");
            drop(engine);
            projection_faults.heal();
            let engine = Engine::open_with(&db.path, options).unwrap();
            assert_eq!(engine.head(s).unwrap().unwrap().revision, head);
            assert_eq!(engine.head(s).unwrap().unwrap().message_count, count);
            assert_projections_equal_a_rebuild(&engine);
            engine.close().unwrap();
        }
    }
}

/// A read-only opener beside a live engine (another handle, as another process would
/// open it) sees commits past the last checkpoint: it folds the tail itself.
#[test]
fn a_read_only_opener_sees_commits_past_the_checkpoint() {
    let db = Db::new();
    let engine = open_with(&db, never());
    let (s, rev) = create(&engine, &[Message::system("sys")]);
    engine.checkpoint().unwrap();
    let head = commit_turns(&engine, s, "t", 5, rev);
    let reader = Reader::open(&db.path, Limits::default(), None).unwrap();
    assert_eq!(reader.head(s).unwrap().unwrap().revision, head, "the tail past the checkpoint is folded");
    assert_eq!(reader.tip().unwrap(), engine.tip().unwrap());
    // Commits after the reader opened show up at its next query.
    let head = commit_turns(&engine, s, "u", 3, head);
    assert_eq!(reader.head(s).unwrap().unwrap().revision, head);
    assert_eq!(reader.projection_digests().unwrap(), engine.projection_digests().unwrap());
    engine.close().unwrap();
}

/// A damaged projections file is a cache miss, not a failure: the open replaces it and
/// folds the log again.
#[test]
fn a_damaged_projections_file_is_replaced_at_open() {
    let (db, live) = closed_database_of_ten_turns();
    let path = projections_path(&db.path);
    let pristine = std::fs::read(&path).unwrap();
    for at in [0, 1, 64, 4096, 4100, pristine.len() / 2, pristine.len() - 1] {
        let mut bytes = pristine.clone();
        for b in bytes.iter_mut().skip(at).take(64) {
            *b ^= 0xa5;
        }
        std::fs::write(&path, &bytes).unwrap();
        let engine = db.open();
        assert_eq!(engine.projection_digests().unwrap(), live, "damage at {at}");
        // Damage that only the compaction at close meets (a page no fold reads) removes
        // the file instead of failing the close.
        engine.close().unwrap();
        let engine = db.open();
        assert_eq!(engine.projection_digests().unwrap(), live, "the open after the damage at {at}");
        engine.close().unwrap();
    }
}

/// An open that finds an empty log and a projections file already caught up to it (what
/// the first open and close leave) commits nothing to the projections file, as the open of
/// any caught-up database does: the catch-up would write the same cursors again. A
/// projections file caught up to an empty log is still caught up once the log is not.
#[test]
fn an_empty_caught_up_database_opens_without_a_catch_up() {
    use annal::fault::disk::SimDisk;
    let disk = SimDisk::new(1);
    let options = Options { cache_bytes: 1 << 20, ..Options::default() };
    let open = |faults: &Faults| {
        let projections = FaultyBackend::new(disk.file("projections"), faults.clone());
        Engine::open_with_backends(disk.file("log"), projections, options.clone()).unwrap()
    };
    // The projections file's fsyncs in an open and a close with nothing between.
    let syncs = || {
        let faults = Faults::new();
        open(&faults).close().unwrap();
        faults.syncs()
    };
    open(&Faults::new()).close().unwrap();
    let empty_image = disk.image("projections").unwrap();
    let empty = syncs();
    let engine = open(&Faults::new());
    let session = engine.create_session(CreateSession::new().message(Message::system("hi"))).unwrap().session;
    engine.close().unwrap();
    let one = syncs();
    assert_eq!(empty, one, "the open of an empty database committed to its caught-up projections file");
    disk.set_image("projections", empty_image);
    let engine = open(&Faults::new());
    assert_eq!(engine.stats().recovered_events, 1);
    assert!(engine.head(session).unwrap().is_some());
    assert_projections_equal_a_rebuild(&engine);
}

/// Text of `n` bytes that does not compress: a content object's stored size is its size.
fn incompressible(seed: u64, n: usize) -> String {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'!' + (x % 90) as u8)
        })
        .collect()
}

/// Commits `body` as a turn of one user message on `session` after `revision` (moved to
/// the new head), and returns the bytes it appended to the log.
fn appended_by_turn(engine: &Engine, session: SessionId, revision: &mut RevisionId, turn_id: &str, body: &str) -> u64 {
    let before = engine.stats().appended_bytes;
    let turn = CommitTurn::new(session, turn_id, Expected::Exact(*revision)).message(Message::user(body.to_string()));
    *revision = engine.commit_turn(turn).unwrap().receipt().revision;
    engine.stats().appended_bytes - before
}

/// Waits until the engine's content-key filter answers (it is built on a thread of its
/// own, from the first commit after open on).
fn wait_for_the_content_filter(engine: &Engine) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while engine.stats().content_filter_bytes == 0 {
        assert!(std::time::Instant::now() < deadline, "the content-key filter was never built");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `Options::content_filter_bytes_max` bounds the filter: 0 turns it off, and a bound
/// below the least filter's size makes none; either way content is deduplicated by
/// reading the index.
#[test]
fn the_content_key_filter_is_bounded_by_its_option() {
    for bytes_max in [0, 64 << 10] {
        let db = Db::new();
        let options = Options { content_filter_bytes_max: bytes_max, ..Options::default() };
        let engine = Engine::open_with(&db.path, options).unwrap();
        let body = incompressible(11, 4_096);
        let mut stored = Vec::new();
        for i in 0..3 {
            let (session, mut revision) = create(&engine, &[Message::system("sys")]);
            stored.push(appended_by_turn(&engine, session, &mut revision, &format!("t{i}"), &body));
            engine.checkpoint().unwrap();
        }
        assert!(stored[0] > 4_096 && stored[1] < 1_024 && stored[2] < 1_024, "{bytes_max}: {stored:?}");
        assert_eq!(engine.stats().content_filter_bytes, 0, "{bytes_max}: no filter");
        engine.close().unwrap();
    }
    let db = Db::new();
    let engine = Engine::open_with(&db.path, Options::default()).unwrap();
    create(&engine, &[Message::system("sys")]);
    assert_eq!(engine.stats().content_filter_bytes, 128 << 10, "the least filter, built at the first commit");
    engine.close().unwrap();
}

/// With the content-key filter answering (built on its own thread, the index being
/// large enough), a new object is stored, and an object that the index holds is found
/// and not stored again, whether the index's rows hold it (from
/// before the open), the delta holds it typed (a turn's), or a copy folded it into rows
/// after the filter was built; and the projections equal a rebuild's.
#[test]
fn the_content_key_filter_finds_new_objects_and_never_hides_a_stored_one() {
    let db = Db::new();
    let engine = open_with(&db, never());
    let (session, mut revision) = create(&engine, &[Message::system("sys")]);
    // More keys than the writer reads at once: the filter is built on a thread of its own.
    for t in 0..42 {
        let turn = (0..100).fold(CommitTurn::new(session, format!("s{t}"), Expected::Exact(revision)), |turn, m| {
            turn.message(Message::user(format!("small {t}.{m}")))
        });
        revision = engine.commit_turn(turn).unwrap().receipt().revision;
    }
    let bodies: Vec<String> = (0..40).map(|i| incompressible(100 + i, 2_048)).collect();
    for (i, body) in bodies.iter().enumerate() {
        appended_by_turn(&engine, session, &mut revision, &format!("t{i}"), body);
    }
    engine.checkpoint().unwrap();
    engine.close().unwrap();

    // Reopened: the index's rows hold the forty objects, and the filter is built from them.
    let engine = open_with(&db, never());
    let source = open_with(&Db::new(), never());
    let mut turn_no = 0;
    let mut appended = |engine: &Engine, revision: &mut RevisionId, body: &str| {
        turn_no += 1;
        appended_by_turn(engine, session, revision, &format!("again{turn_no}"), body)
    };
    let fresh = incompressible(7, 4_096);
    assert!(appended(&engine, &mut revision, &fresh) > 4_096, "a new object is stored");
    wait_for_the_content_filter(&engine);
    for body in &bodies {
        assert!(appended(&engine, &mut revision, body) < 1_024, "in the index's rows: not stored again");
    }
    assert!(appended(&engine, &mut revision, &fresh) < 1_024, "in the delta, typed: not stored again");
    let newer = incompressible(8, 4_096);
    assert!(appended(&engine, &mut revision, &newer) > 4_096, "a new object is stored");

    // A copy folds its objects into the index through an overlay of the engine's view,
    // after the filter was built: a turn that brings one of them finds it.
    let (copied, mut copied_revision) = create(&source, &[Message::system("copied")]);
    let shipped = incompressible(9, 4_096);
    appended_by_turn(&source, copied, &mut copied_revision, "c", &shipped);
    engine.copy_in(source.export_sessions(&[copied], false).unwrap()).unwrap();
    assert!(appended(&engine, &mut revision, &shipped) < 1_024, "copied in: not stored again");
    // Checkpointed, the objects added since the filter was built are in the index's rows
    // alone: each fold that added one told the filter.
    engine.checkpoint().unwrap();
    for body in [&fresh, &newer, &shipped] {
        assert!(appended(&engine, &mut revision, body) < 1_024, "in the index's rows: not stored again");
    }
    assert!(engine.stats().content_filter_bytes > 0);
    assert_projections_equal_a_rebuild(&engine);
    engine.close().unwrap();
}

/// The content-id index's additions wait in the delta for a checkpoint: an object stored
/// by a commit is found there, before and after the checkpoint that merges it into the
/// index's rows, so it is stored once; views read the index's rows as the checkpoint
/// writes them; and the rows equal a rebuild's.
#[test]
fn content_is_deduplicated_from_the_delta_and_after_its_checkpoint() {
    let db = Db::new();
    let engine = open_with(&db, never());
    let body = incompressible(7, 8_192);
    let sessions: Vec<(SessionId, RevisionId)> = (0..3).map(|_| create(&engine, &[Message::system("sys")])).collect();
    let appended = |i: usize| {
        let (session, mut revision) = sessions[i];
        appended_by_turn(&engine, session, &mut revision, "t", &body)
    };
    let first = appended(0);
    assert!(first > 8_192, "the first commit stores the object: {first} bytes");
    let second = appended(1);
    assert!(second < 1_024, "found in the delta, not stored again: {second} bytes");
    let before = engine.projection_digests().unwrap();
    engine.checkpoint().unwrap();
    assert_eq!(engine.projection_digests().unwrap(), before, "the checkpoint writes the rows views read");
    let third = appended(2);
    assert!(third < 1_024, "found in the index's rows, not stored again: {third} bytes");
    assert_projections_equal_a_rebuild(&engine);
    engine.close().unwrap();
}
