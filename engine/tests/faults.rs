//! Fault injection (invariant 9): what the engine does when the disk fails.
//!
//! The engine runs on [`FaultyBackend`] over a real file. A commit that hits an injected
//! write or `sync_data` failure returns an error to every caller in its group commit and
//! acknowledges none of them; the engine is then poisoned and refuses every later write
//! with [`Error::Poisoned`]. Failed and short reads are errors, never panics or wrong
//! answers. After the poisoned engine is dropped, a plain [`Engine::open`] on the same
//! file finds a log that verifies: the acknowledged commits, in order, followed by
//! either nothing or the whole failed group commit (an fsync that fails after its writes
//! reached the file leaves the outcome to the disk), never part of one.

use annal::fault::{Faults, FaultyBackend};
use annal::*;
use redb::backends::FileBackend;
use redb::StorageBackend;
use std::collections::BTreeSet;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier, Condvar, Mutex};
use std::time::Duration;

/// Callers racing into one group commit.
const CALLERS: usize = 6;
/// Attempts at landing several callers in the failing group commit (thread scheduling
/// decides how many join it).
const BATCH_ATTEMPTS: usize = 8;

/// Holds `sync_data` calls while closed, so the test can queue commands behind a commit.
#[derive(Debug, Default)]
struct Gate {
    closed: Mutex<bool>,
    changed: Condvar,
    waiting: AtomicU64,
}

impl Gate {
    fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }

    fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.changed.notify_all();
    }

    fn pass(&self) {
        let mut closed = self.closed.lock().unwrap();
        if *closed {
            self.waiting.fetch_add(1, Ordering::AcqRel);
            self.changed.notify_all();
            while *closed {
                closed = self.changed.wait(closed).unwrap();
            }
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Blocks until a sync is held at the gate.
    fn wait_for_holder(&self) {
        let mut closed = self.closed.lock().unwrap();
        while self.waiting.load(Ordering::Acquire) == 0 {
            closed = self.changed.wait(closed).unwrap();
        }
        drop(closed);
    }
}

/// A backend whose `sync_data` waits at a [`Gate`] before reaching the faulty backend.
#[derive(Debug)]
struct Gated<B: StorageBackend> {
    inner: B,
    gate: Arc<Gate>,
}

impl<B: StorageBackend> StorageBackend for Gated<B> {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        self.gate.pass();
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

struct Db {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Db {
    fn new() -> Db {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("faults.redb");
        Db { _dir: dir, path }
    }

    fn backend(&self, faults: &Faults) -> FaultyBackend<FileBackend> {
        FaultyBackend::new(file_backend(&self.path), faults.clone())
    }

    fn open_faulty(&self, faults: &Faults, options: Options) -> Engine {
        Engine::open_with_backend(self.backend(faults), options).expect("open on the faulty backend")
    }

    fn open_gated(&self, faults: &Faults, gate: &Arc<Gate>) -> Engine {
        let backend = Gated { inner: self.backend(faults), gate: gate.clone() };
        Engine::open_with_backend(backend, Options::default()).expect("open on the gated backend")
    }
}

/// What a command wrote, as far as the caller can tell: a session created with a known
/// label, or a turn with a known id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mark {
    Session(String),
    Turn(String),
}

fn mark_of(record: &Record) -> Option<Mark> {
    match &record.event {
        Event::SessionCreated(e) => e.labels.get("mark").map(|m| Mark::Session(m.clone())),
        Event::TurnCommitted(e) => Some(Mark::Turn(e.turn_id.clone())),
        _ => None,
    }
}

fn create(engine: &Engine, mark: &str) -> Result<SessionReceipt> {
    engine.create_session(CreateSession::new().label("mark", mark).message(Message::system(format!("sys {mark}"))))
}

fn turn(engine: &Engine, session: SessionId, id: &str) -> Result<Receipt> {
    let t = CommitTurn::new(session, id, Expected::Any)
        .message(Message::user(format!("q {id}")))
        .message(Message::assistant(format!("a {id}")));
    engine.commit_turn(t).map(|o| o.receipt())
}

/// The acknowledged commits and the ones that failed inside the failing group commit.
#[derive(Default, Debug)]
struct Ledger {
    acked: Vec<(u64, Mark)>,
    failed: BTreeSet<Mark>,
    poisoned: usize,
}

impl Ledger {
    fn record(&mut self, mark: Mark, result: Result<u64>) {
        match result {
            Ok(seq) => self.acked.push((seq, mark)),
            Err(Error::Storage(_)) => {
                self.failed.insert(mark);
            }
            Err(Error::Poisoned) => self.poisoned += 1,
            Err(other) => panic!("unexpected error for {mark:?}: {other:?}"),
        }
    }
}

fn all_events(engine: &Engine) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let page = engine
            .events(EventQuery { from_seq: from, max_events: 1000, max_bytes: 16 << 20 })
            .expect("every event page verifies");
        out.extend(page.events);
        if !page.has_more {
            return out;
        }
        from = page.next_seq;
    }
}

/// Reopens the file with a plain `Engine::open` and checks the log: dense, verified, the
/// acknowledged commits at their seqs, then all or none of the failed group commit.
/// Returns whether the failed group commit is in the log.
fn verify_reopened(path: &Path, ledger: &Ledger) -> bool {
    let engine = Engine::open(path).expect("reopen after the fault");
    let events = all_events(&engine);
    assert_eq!(events.len() as u64, engine.tip().unwrap().0, "the log holds exactly the records up to the tip");
    for (i, ev) in events.iter().enumerate() {
        assert_eq!(ev.record.seq, i as u64 + 1, "dense log");
    }
    let mut acked = ledger.acked.clone();
    acked.sort();
    for (k, (seq, mark)) in acked.iter().enumerate() {
        assert_eq!(*seq, k as u64 + 1, "acknowledged commits are a dense prefix");
        assert_eq!(mark_of(&events[k].record).as_ref(), Some(mark), "acknowledged seq {seq} holds its command");
    }
    let extra: BTreeSet<Mark> = events[acked.len()..].iter().filter_map(|ev| mark_of(&ev.record)).collect();
    assert_eq!(extra.len(), events.len() - acked.len(), "only commands of the failed group commit follow");
    assert!(
        extra.is_empty() || extra == ledger.failed,
        "the failed group commit is all or nothing: found {extra:?} of {:?}",
        ledger.failed
    );
    let digests = engine.projection_digests().unwrap();
    engine.rebuild(ProjectionSet::all()).expect("rebuild after reopen");
    assert_eq!(engine.projection_digests().unwrap(), digests, "rebuild equals the reopened projections");
    engine.close().unwrap();
    !extra.is_empty()
}

#[track_caller]
fn assert_poisoned(engine: &Engine) {
    assert!(engine.is_poisoned());
    assert_eq!(create(engine, "after").unwrap_err(), Error::Poisoned, "every later write is refused");
    let batch = engine.batch(vec![Command::CreateSession(CreateSession::new())]);
    assert_eq!(batch.unwrap_err(), Error::Poisoned);
    assert_eq!(engine.rebuild(ProjectionSet::all()).unwrap_err(), Error::Poisoned);
}

/// `sync_data` calls one commit makes, measured on the faulty backend's counter.
fn syncs_per_commit(engine: &Engine, faults: &Faults, ledger: &mut Ledger, mark: &str) -> u64 {
    let before = faults.syncs();
    let r = create(engine, mark).expect("healthy commit");
    ledger.record(Mark::Session(mark.into()), Ok(r.receipt.seq));
    faults.syncs() - before
}

/// One attempt: a commit is held at the gate while `CALLERS` threads queue commands
/// behind it; the sync of the group commit that follows fails. Returns how many callers
/// got the storage error itself (the size of the failed group commit).
fn sync_failure_attempt(attempt: usize) -> usize {
    let db = Db::new();
    let faults = Faults::new();
    let gate = Arc::new(Gate::default());
    let engine = db.open_gated(&faults, &gate);
    let mut ledger = Ledger::default();
    for i in 0..3 {
        syncs_per_commit(&engine, &faults, &mut ledger, &format!("warm-{i}"));
    }
    let per_commit = (0..3).map(|i| syncs_per_commit(&engine, &faults, &mut ledger, &format!("measure-{i}"))).min();
    let per_commit = per_commit.expect("measured");
    assert!(per_commit >= 1, "a durable commit syncs");

    gate.close();
    let holder = {
        let engine = engine.clone();
        std::thread::spawn(move || create(&engine, "held").map(|r| r.receipt.seq))
    };
    gate.wait_for_holder();
    // The held commit's own syncs succeed; the next group commit's first one fails.
    faults.fail_sync_after(per_commit);
    let start = Arc::new(Barrier::new(CALLERS + 1));
    let (tx, rx) = mpsc::channel();
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (engine, start, tx) = (engine.clone(), start.clone(), tx.clone());
            std::thread::spawn(move || {
                let mark = format!("caller-{c}");
                start.wait();
                let result = create(&engine, &mark).map(|r| r.receipt.seq);
                tx.send((Mark::Session(mark), result)).unwrap();
            })
        })
        .collect();
    start.wait();
    // Give the callers time to queue behind the held commit; how many make it is
    // reported, not asserted.
    std::thread::sleep(Duration::from_millis(50 << attempt.min(4)));
    gate.open();
    ledger.record(Mark::Session("held".into()), holder.join().unwrap());
    callers.into_iter().for_each(|c| c.join().unwrap());
    drop(tx);
    let results: Vec<(Mark, Result<u64>)> = rx.iter().collect();
    assert_eq!(results.len(), CALLERS);
    let acked_before = ledger.acked.len();
    for (mark, result) in results {
        ledger.record(mark, result);
    }
    if ledger.failed.is_empty() {
        // The measured sync count was high for the held commit, and the callers' commit
        // went through before the armed failure: the next commit meets it.
        ledger.record(Mark::Session("trigger".into()), create(&engine, "trigger").map(|r| r.receipt.seq));
    }
    assert!(!ledger.failed.is_empty(), "the failing commit reported the storage error to its callers");
    assert!(
        ledger.acked.len() == acked_before || ledger.failed.len() == 1,
        "callers acknowledged in this round committed before the failure, so the failure is the trigger's"
    );
    assert_poisoned(&engine);
    drop(engine);
    let present = verify_reopened(&db.path, &ledger);
    eprintln!(
        "sync failure attempt {attempt}: {} callers in the failed group commit, {} refused as poisoned; batch {} after reopen",
        ledger.failed.len(),
        ledger.poisoned,
        if present { "present" } else { "absent" }
    );
    ledger.failed.len()
}

#[test]
fn failed_sync_fails_every_caller_in_the_group_commit() {
    let most = (0..BATCH_ATTEMPTS).map(sync_failure_attempt).take_while(|n| *n < 2).count();
    assert!(most < BATCH_ATTEMPTS, "no attempt put two or more callers into the failing group commit");
}

/// Commands from several threads until every thread has seen an error.
fn hammer(engine: &Engine, threads: usize, tag: &str) -> Ledger {
    let (tx, rx) = mpsc::channel();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (engine, tx, tag) = (engine.clone(), tx.clone(), tag.to_string());
            std::thread::spawn(move || {
                let first = format!("{tag}-{t}-s");
                let created = create(&engine, &first);
                let failed = created.is_err();
                let session = created.as_ref().ok().map(|r| r.session);
                tx.send((Mark::Session(first), created.map(|r| r.receipt.seq))).unwrap();
                if failed {
                    return;
                }
                for i in 0.. {
                    let id = format!("{tag}-{t}-{i}");
                    let result = turn(&engine, session.unwrap(), &id).map(|r| r.seq);
                    let failed = result.is_err();
                    tx.send((Mark::Turn(id), result)).unwrap();
                    if failed {
                        return;
                    }
                }
            })
        })
        .collect();
    drop(tx);
    handles.into_iter().for_each(|h| h.join().unwrap());
    let mut ledger = Ledger::default();
    for (mark, result) in rx.iter() {
        ledger.record(mark, result);
    }
    ledger
}

#[test]
fn failed_write_at_every_point_of_a_commit() {
    let mut present = 0;
    let points = [0u64, 1, 2, 3, 4, 5, 6, 8, 11, 16, 23, 32, 45, 64];
    for n in points {
        let db = Db::new();
        let faults = Faults::new();
        let engine = db.open_faulty(&faults, Options::default());
        let mut before = Ledger::default();
        for i in 0..3 {
            let r = create(&engine, &format!("pre-{n}-{i}")).unwrap();
            before.record(Mark::Session(format!("pre-{n}-{i}")), Ok(r.receipt.seq));
        }
        faults.fail_write_after(n);
        let mut ledger = hammer(&engine, 4, &format!("w{n}"));
        assert!(!ledger.failed.is_empty(), "write failure {n}: some caller saw the storage error");
        assert_poisoned(&engine);
        drop(engine);
        ledger.acked.extend(before.acked);
        present += usize::from(verify_reopened(&db.path, &ledger));
    }
    eprintln!("write failures: failed group commit present after reopen in {present} of {} cases", points.len());
}

#[test]
fn failed_sync_at_every_point() {
    let mut present = 0;
    for n in 0..12u64 {
        let db = Db::new();
        let faults = Faults::new();
        let engine = db.open_faulty(&faults, Options::default());
        let r = create(&engine, "pre").unwrap();
        let mut before = Ledger::default();
        before.record(Mark::Session("pre".into()), Ok(r.receipt.seq));
        faults.fail_sync_after(n);
        let mut ledger = hammer(&engine, 3, &format!("s{n}"));
        assert!(!ledger.failed.is_empty(), "sync failure {n}: some caller saw the storage error");
        assert_poisoned(&engine);
        drop(engine);
        ledger.acked.extend(before.acked);
        present += usize::from(verify_reopened(&db.path, &ledger));
    }
    eprintln!("sync failures: failed group commit present after reopen in {present} of 12 cases");
}

/// An all-or-nothing batch whose commit fails leaves none of its commands behind.
#[test]
fn failed_commit_of_a_batch_is_all_or_nothing() {
    let db = Db::new();
    let faults = Faults::new();
    let engine = db.open_faulty(&faults, Options::default());
    let r = create(&engine, "pre").unwrap();
    faults.fail_write_after(0);
    let commands: Vec<Command> =
        (0..5).map(|i| Command::CreateSession(CreateSession::new().label("mark", format!("batch-{i}")))).collect();
    let err = engine.batch(commands).unwrap_err();
    assert!(matches!(err, Error::Storage(_)), "{err:?}");
    assert_poisoned(&engine);
    drop(engine);
    let mut ledger = Ledger::default();
    ledger.record(Mark::Session("pre".into()), Ok(r.receipt.seq));
    ledger.failed = (0..5).map(|i| Mark::Session(format!("batch-{i}"))).collect();
    assert!(!verify_reopened(&db.path, &ledger), "a write that failed never reached the commit slot");
}

/// Queries under read faults return errors (or answers they could serve from cache),
/// never panic; writes either commit or fail and poison; the file then reopens clean.
fn read_fault(short: bool) {
    let db = Db::new();
    let faults = Faults::new();
    let options = Options { cache_bytes: 0, ..Options::default() };
    let engine = db.open_faulty(&faults, options);
    let mut ledger = Ledger::default();
    let c = create(&engine, "pre").unwrap();
    ledger.record(Mark::Session("pre".into()), Ok(c.receipt.seq));
    let s = c.session;
    for i in 0..20 {
        let id = format!("pre-{i}");
        let r = turn(&engine, s, &id).unwrap();
        ledger.record(Mark::Turn(id), Ok(r.seq));
    }
    let expected_head = engine.head(s).unwrap().unwrap();
    if short {
        faults.short_reads(true);
    } else {
        faults.fail_reads(true);
    }
    let mut errors = 0;
    let mut check = |r: std::result::Result<(), Error>| match r {
        Ok(()) => {}
        Err(Error::Storage(_)) => errors += 1,
        Err(other) => panic!("a read fault is a storage error, got {other:?}"),
    };
    check(engine.head(s).map(|h| assert_eq!(h.as_ref(), Some(&expected_head), "a served answer is right")));
    check(engine.transcript(s, PageRequest::first(100)).map(|p| assert_eq!(p.total, expected_head.message_count)));
    check(engine.events(EventQuery { from_seq: 1, max_events: 100, max_bytes: 1 << 20 }).map(|_| ()));
    check(engine.list_sessions(&ListQuery::new()).map(|_| ()));
    check(engine.revisions(s, PageRequest::first(10)).map(|_| ()));
    check(engine.projection_digests().map(|_| ()));
    check(engine.tip().map(|_| ()));
    assert!(errors > 0, "with no page cache, some query reached the faulty reads");
    let write = turn(&engine, s, "during");
    ledger.record(Mark::Turn("during".into()), write.as_ref().map(|r| r.seq).map_err(Clone::clone));
    if write.is_err() {
        assert_poisoned(&engine);
    }
    faults.heal();
    drop(engine);
    verify_reopened(&db.path, &ledger);
}

#[test]
fn failed_reads() {
    read_fault(false);
}

#[test]
fn short_reads() {
    read_fault(true);
}

/// Opening a database on a failing disk is an error, never a panic; the file opens
/// cleanly once the disk is healthy.
#[test]
fn open_fails_closed_on_a_failing_disk() {
    let db = Db::new();
    {
        let engine = Engine::open(&db.path).unwrap();
        let c = create(&engine, "pre").unwrap();
        turn(&engine, c.session, "t").unwrap();
        engine.close().unwrap();
    }
    type Arm = fn(&Faults);
    let setups: [(&str, Arm); 4] = [
        ("failed reads", |f| f.fail_reads(true)),
        ("short reads", |f| f.short_reads(true)),
        ("failed write", |f| f.fail_write_after(0)),
        ("failed sync", |f| f.fail_sync_after(0)),
    ];
    for (name, arm) in setups {
        let faults = Faults::new();
        arm(&faults);
        let result = Engine::open_with_backend(db.backend(&faults), Options::default());
        assert!(result.is_err(), "{name}: open reported success on a failing disk");
        drop(result);
        let ledger =
            Ledger { acked: vec![(1, Mark::Session("pre".into())), (2, Mark::Turn("t".into()))], ..Ledger::default() };
        verify_reopened(&db.path, &ledger);
    }
}

/// A power loss while the log file was first being created can leave its new length on
/// disk without redb's header: zeros only, and nothing was ever committed in it. Such a
/// file opens as a new database. A file with any other bytes is never touched.
#[test]
fn a_log_file_that_was_never_written_opens_as_a_new_database() {
    let dir = tempfile::tempdir().unwrap();
    for (name, len) in [("empty.redb", 0usize), ("zeros.redb", 1 << 20), ("odd.redb", 4097)] {
        let path = dir.path().join(name);
        std::fs::write(&path, vec![0u8; len]).unwrap();
        let engine = Engine::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let created = engine.create_session(CreateSession::new().message(Message::system("hi"))).unwrap();
        engine.close().unwrap();
        let engine = Engine::open(&path).unwrap();
        assert_eq!(engine.head(created.session).unwrap().unwrap().message_count, 1, "{name}");
        engine.close().unwrap();
    }
    // One non-zero byte anywhere: not a file this rule may reset; the open fails and the
    // file keeps every byte.
    let path = dir.path().join("garbage.redb");
    let mut bytes = vec![0u8; 1 << 20];
    bytes[(1 << 20) - 1] = 7;
    std::fs::write(&path, &bytes).unwrap();
    assert!(Engine::open(&path).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

/// A full disk is told apart from other failures: the commit that meets it fails with a
/// storage error of the file system's kind, every later write is `Poisoned`, and the
/// engine names the full disk as the cause of its poisoning. The log file here, the
/// journal and the projections file below.
#[test]
fn a_full_disk_is_a_storage_error_of_its_kind_and_the_cause_of_the_poisoning() {
    let db = Db::new();
    let faults = Faults::new();
    let engine = db.open_faulty(&faults, Options::default());
    create(&engine, "pre").unwrap();
    assert_eq!(engine.poison_cause(), None);
    faults.fail_as(io::ErrorKind::StorageFull);
    faults.fail_write_after(0);
    let err = create(&engine, "full").unwrap_err();
    assert_eq!(err.io_kind(), Some(io::ErrorKind::StorageFull), "{err:?}");
    assert!(matches!(&err, Error::Storage(f) if f.detail().contains("injected write failure")), "{err}");
    assert_poisoned(&engine);
    assert_eq!(engine.poison_cause(), Some(err));
    assert_eq!(Error::Poisoned.io_kind(), None);
}

/// A file backend on `path`, created if it is missing.
fn file_backend(path: &Path) -> FileBackend {
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path);
    FileBackend::new(file.expect("open file")).expect("file backend")
}

/// The journal, where a durable commit's one write goes: a full disk there is the
/// commit's error, with its kind, and the poisoning's cause.
#[test]
fn a_full_disk_under_the_journal_is_the_commits_error_and_the_poisonings_cause() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| file_backend(&dir.path().join(name));
    let faults = Faults::new();
    let journal = [FaultyBackend::new(file("j0"), faults.clone()), FaultyBackend::new(file("j1"), faults.clone())];
    let engine = Engine::open_with_journal(file("log"), file("projections"), journal, Options::default()).unwrap();
    create(&engine, "pre").unwrap();
    faults.fail_as(io::ErrorKind::StorageFull);
    faults.fail_sync_after(0);
    let err = create(&engine, "full").unwrap_err();
    assert_eq!(err.io_kind(), Some(io::ErrorKind::StorageFull), "{err:?}");
    assert!(err.to_string().contains("journal"), "{err}");
    assert_eq!(create(&engine, "after").unwrap_err(), Error::Poisoned);
    assert_eq!(engine.poison_cause(), Some(err));
}

/// The projections file, which the checkpointer writes behind the commits: a full disk
/// there poisons the engine too, and the cause says so with its kind.
#[test]
fn a_full_disk_under_the_projections_file_poisons_the_engine_by_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| file_backend(&dir.path().join(name));
    let faults = Faults::new();
    let projections = FaultyBackend::new(file("projections"), faults.clone());
    let engine = Engine::open_with_backends(file("log"), projections, Options::default()).unwrap();
    create(&engine, "pre").unwrap();
    faults.fail_as(io::ErrorKind::StorageFull);
    faults.fail_write_after(0);
    assert!(engine.checkpoint().is_err());
    assert!(engine.is_poisoned());
    let cause = engine.poison_cause().expect("poisoned");
    assert_eq!(cause.io_kind(), Some(io::ErrorKind::StorageFull), "{cause:?}");
    assert_eq!(create(&engine, "after").unwrap_err(), Error::Poisoned);
}
