//! Durable turn commits per second at 1, 4 and 16 concurrent committers, and the
//! machine's ceiling measured in the same run: a bare redb database committing one insert
//! per durable transaction, and 64 inserts per durable transaction. A third redb baseline
//! writes, in each durable transaction, what one turn commit appends in annal's log file
//! (SPEC §2: the record, the content row of its message, the meta tip) with no engine
//! around it: the floor the append-only layout itself sets for a turn commit.
//!
//! annal runs as [`Engine::open`] lays it out: the log file, the projections file and the
//! two journal files. Every database sits on redb's `FileBackend` wrapped in [`FaultyBackend`] with no fault
//! switched on, so the benchmark can count the fsyncs (`sync_data` calls) each variant
//! issues and the bytes it writes. The wrapper adds a few atomic increments per I/O call.
//! After each benchmark the commits per fsync are printed (for annal that is the mean
//! group-commit batch size divided by the fsyncs one redb commit takes), with the bytes
//! and write calls per commit and per fsync.
//!
//! One criterion iteration is a fixed number of commits ([`COMMITS_PER_ITER`]) spread
//! evenly over the committer threads, so the reported throughput is commits per second.

use annal::fault::{Faults, FaultyBackend};
use annal::{CommitNotice, CommitTurn, CreateSession, Durability, Engine, Expected, Message, Options, SessionId};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_channel::Receiver;
use redb::backends::FileBackend;
use redb::{ConcurrencyMode, Database, TableDefinition};
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// Commits per criterion iteration; divisible by every committer count.
const COMMITS_PER_ITER: u64 = 48;
/// Committer thread counts measured.
const COMMITTERS: [u64; 3] = [1, 4, 16];
/// Inserts per transaction in the batched raw redb ceiling.
const RAW_BATCH_INSERTS: u64 = 64;
/// Bytes of each raw redb value: about the size of an encoded turn record.
const RAW_VALUE_BYTES: usize = 256;

const RAW: TableDefinition<u64, &[u8]> = TableDefinition::new("raw");

/// Bytes of the encoded turn record of this benchmark (one user message, no usage) and
/// of its content row (one message object and the row's 37-byte entry header).
const TURN_RECORD_BYTES: usize = 200;
const TURN_CONTENT_ROW_BYTES: usize = 107;

fn create_file(path: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).expect("create database file")
}

fn counted_backend(path: &Path, faults: &Faults) -> FaultyBackend<FileBackend> {
    FaultyBackend::new(FileBackend::new(create_file(path)).expect("file backend"), faults.clone())
}

/// (fsyncs, write calls, bytes written) so far.
fn counters(faults: &Faults) -> (u64, u64, u64) {
    (faults.syncs(), faults.writes(), faults.bytes_written())
}

/// Commits and fsyncs seen by one benchmark, for the commits-per-fsync figure.
#[derive(Default)]
struct Tally {
    commits: AtomicU64,
    syncs: AtomicU64,
    writes: AtomicU64,
    bytes: AtomicU64,
    /// Commands per write transaction, when known.
    batches: Mutex<Vec<u64>>,
}

impl Tally {
    fn add(&self, commits: u64, before: (u64, u64, u64), faults: &Faults) {
        self.commits.fetch_add(commits, Ordering::Relaxed);
        self.syncs.fetch_add(faults.syncs() - before.0, Ordering::Relaxed);
        self.writes.fetch_add(faults.writes() - before.1, Ordering::Relaxed);
        self.bytes.fetch_add(faults.bytes_written() - before.2, Ordering::Relaxed);
    }

    fn report(&self, name: &str) {
        let commits = self.commits.load(Ordering::Relaxed);
        if commits == 0 {
            // Filtered out on the command line.
            return;
        }
        let syncs = self.syncs.load(Ordering::Relaxed).max(1);
        println!(
            "{name}: {commits} commits, {syncs} fsyncs, {:.2} commits per fsync, {:.2} fsyncs per commit",
            commits as f64 / syncs as f64,
            syncs as f64 / commits.max(1) as f64
        );
        let (writes, bytes) = (self.writes.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed));
        println!(
            "{name}: {:.1} KiB in {:.1} write calls per commit, {:.1} KiB per fsync",
            bytes as f64 / 1024.0 / commits as f64,
            writes as f64 / commits as f64,
            bytes as f64 / 1024.0 / syncs as f64
        );
        let mut batches = self.batches.lock().expect("batches").clone();
        if !batches.is_empty() {
            batches.sort_unstable();
            let mean = batches.iter().sum::<u64>() as f64 / batches.len() as f64;
            let at = |q: usize| batches[(batches.len() - 1) * q / 100];
            println!(
                "{name}: commits per write transaction (by timestamp): mean {mean:.2}, p10 {}, p50 {}, p90 {}, max {}",
                at(10),
                at(50),
                at(90),
                at(100)
            );
        }
    }

    /// Groups the commit notices of one run into transactions by their commit timestamp
    /// (one clock reading per transaction; two transactions in the same millisecond
    /// count as one, so this errs towards larger batches).
    fn add_batches(&self, notices: &Receiver<CommitNotice>) {
        let mut batches = self.batches.lock().expect("batches");
        let mut current: Option<(u64, u64)> = None;
        for notice in notices.try_iter() {
            current = match current {
                Some((at, n)) if at == notice.committed_at_ms => Some((at, n + 1)),
                Some((_, n)) => {
                    batches.push(n);
                    Some((notice.committed_at_ms, 1))
                }
                None => Some((notice.committed_at_ms, 1)),
            };
        }
        batches.extend(current.map(|(_, n)| n));
    }
}

/// An annal database on a counted backend with one session per committer.
struct AnnalFixture {
    engine: Engine,
    faults: Faults,
    notices: Receiver<CommitNotice>,
    sessions: Vec<SessionId>,
    turn_counter: Arc<AtomicU64>,
    _dir: tempfile::TempDir,
}

impl AnnalFixture {
    fn new(committers: u64, multi_process_readers: bool) -> AnnalFixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let faults = Faults::new();
        let path = dir.path().join("annal.redb");
        let log = counted_backend(&path, &faults);
        let projections = counted_backend(&annal::projections_path(&path), &faults);
        let journal = annal::journal_paths(&path).map(|p| counted_backend(&p, &faults));
        let options = Options { durability: Durability::Durable, multi_process_readers, ..Options::default() };
        let engine = Engine::open_with_journal(log, projections, journal, options).expect("open engine");
        let sessions = (0..committers)
            .map(|i| {
                let c = CreateSession::new().label("committer", i.to_string()).message(Message::system("bench"));
                engine.create_session(c).expect("create session").session
            })
            .collect();
        let notices = engine.subscribe();
        AnnalFixture { engine, faults, notices, sessions, turn_counter: Arc::new(AtomicU64::new(0)), _dir: dir }
    }

    /// Commits `total` turns spread over the committers; returns the wall time.
    fn run(&self, total: u64, tally: &Tally) -> Duration {
        let committers = self.sessions.len() as u64;
        let per_thread = total / committers;
        let barrier = Arc::new(Barrier::new(self.sessions.len() + 1));
        let before = counters(&self.faults);
        let handles: Vec<_> = self
            .sessions
            .iter()
            .map(|&session| {
                let engine = self.engine.clone();
                let barrier = barrier.clone();
                let counter = self.turn_counter.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    for _ in 0..per_thread {
                        let n = counter.fetch_add(1, Ordering::Relaxed);
                        let turn = CommitTurn::new(session, format!("turn-{n}"), Expected::Any)
                            .message(Message::user(format!("message {n}: please run the next step")));
                        engine.commit_turn(turn).expect("commit turn");
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for h in handles {
            h.join().expect("committer thread");
        }
        let elapsed = start.elapsed();
        tally.add(per_thread * committers, before, &self.faults);
        tally.add_batches(&self.notices);
        elapsed
    }
}

fn annal_commits(c: &mut Criterion) {
    let mut group = c.benchmark_group("annal_durable_turn_commit");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(6));
    group.throughput(Throughput::Elements(COMMITS_PER_ITER));
    for committers in COMMITTERS {
        let fixture = AnnalFixture::new(committers, true);
        let tally = Tally::default();
        group.bench_with_input(BenchmarkId::new("committers", committers), &committers, |b, _| {
            b.iter_custom(|iters| fixture.run(iters * COMMITS_PER_ITER, &tally))
        });
        tally.report(&format!("annal, {committers} committers"));
    }
    // The same single committer with the file held exclusively (one fsync per commit),
    // to compare with bare redb in its default mode.
    let fixture = AnnalFixture::new(1, false);
    let tally = Tally::default();
    group.bench_function("committers/1_exclusive", |b| {
        b.iter_custom(|iters| fixture.run(iters * COMMITS_PER_ITER, &tally))
    });
    tally.report("annal, 1 committer, exclusive file (multi_process_readers = false)");
    group.finish();
}

/// A bare redb database on a counted backend.
struct RawFixture {
    db: Database,
    faults: Faults,
    next_key: u64,
    value: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl RawFixture {
    fn new(mode: ConcurrencyMode) -> RawFixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let faults = Faults::new();
        let backend = counted_backend(&dir.path().join("raw.redb"), &faults);
        let db = redb::Builder::new().set_concurrency_mode(mode).create_with_backend(backend).expect("open redb");
        let value = (0..RAW_VALUE_BYTES).map(|i| b'a' + (i % 26) as u8).collect();
        RawFixture { db, faults, next_key: 0, value, _dir: dir }
    }

    /// Runs `transactions` durable transactions, each appending what `turns` turn
    /// commits append to annal's log file: a record, a content row and the tip.
    fn run_turn_shaped(&mut self, transactions: u64, turns: u64, tally: &Tally) -> Duration {
        use annal::pieces::ContentWriter;
        use annal::tables::{LOG, META};
        // Everything that is not a write is prepared before the clock starts, so the
        // baseline times redb alone.
        let record = vec![b'r'; TURN_RECORD_BYTES];
        let row = vec![b'm'; TURN_CONTENT_ROW_BYTES];
        let before = counters(&self.faults);
        let start = Instant::now();
        for _ in 0..transactions {
            let mut txn = self.db.begin_write().expect("begin write");
            txn.set_durability(redb::Durability::Immediate).expect("durability");
            {
                let mut log = txn.open_table(LOG).expect("log");
                let mut content = ContentWriter::open(&txn).expect("content");
                for _ in 0..turns {
                    self.next_key += 1;
                    log.insert(self.next_key, record.as_slice()).expect("insert");
                    content.append(self.next_key, &row).expect("insert");
                }
                let mut meta = txn.open_table(META).expect("meta");
                meta.insert("tip", [1u8; 40].as_slice()).expect("insert");
            }
            txn.commit().expect("commit");
        }
        let elapsed = start.elapsed();
        tally.add(transactions * turns, before, &self.faults);
        elapsed
    }

    /// Runs `transactions` durable transactions of `inserts` inserts each.
    fn run(&mut self, transactions: u64, inserts: u64, tally: &Tally) -> Duration {
        let before = counters(&self.faults);
        let start = Instant::now();
        for _ in 0..transactions {
            let mut txn = self.db.begin_write().expect("begin write");
            txn.set_durability(redb::Durability::Immediate).expect("durability");
            {
                let mut table = txn.open_table(RAW).expect("open table");
                for _ in 0..inserts {
                    self.next_key += 1;
                    table.insert(self.next_key, self.value.as_slice()).expect("insert");
                }
            }
            txn.commit().expect("commit");
        }
        let elapsed = start.elapsed();
        tally.add(transactions, before, &self.faults);
        elapsed
    }
}

fn raw_redb(c: &mut Criterion) {
    let mut group = c.benchmark_group("raw_redb_durable");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    let variants = [
        ("1_insert_per_txn", 1, ConcurrencyMode::ExclusiveWriter),
        ("64_inserts_per_txn", RAW_BATCH_INSERTS, ConcurrencyMode::ExclusiveWriter),
        // The concurrency mode annal's durable engine opens with (readers in other
        // processes allowed), which makes redb commit in two phases.
        ("1_insert_per_txn_single_writer_mode", 1, ConcurrencyMode::SingleWriter),
    ];
    for (name, inserts, mode) in variants {
        let mut fixture = RawFixture::new(mode);
        let tally = Tally::default();
        // One iteration is COMMITS_PER_ITER transactions, as for annal; throughput counts
        // inserts, which for one insert per transaction is transactions.
        group.throughput(Throughput::Elements(COMMITS_PER_ITER * inserts));
        group.bench_function(name, |b| b.iter_custom(|iters| fixture.run(iters * COMMITS_PER_ITER, inserts, &tally)));
        tally.report(&format!("raw redb, {name} (a commit is a transaction)"));
    }
    // What one turn commit appends, per durable transaction, with the file held
    // exclusively: compare with annal's `committers/1_exclusive`. Then 16 turns per
    // transaction: the best group commit can do with this layout on this disk, with no
    // engine work at all.
    for (name, turns) in [("1_turn_rows_per_txn", 1), ("16_turn_rows_per_txn", 16)] {
        let mut fixture = RawFixture::new(ConcurrencyMode::ExclusiveWriter);
        let tally = Tally::default();
        group.throughput(Throughput::Elements(COMMITS_PER_ITER));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| fixture.run_turn_shaped(iters * COMMITS_PER_ITER / turns, turns, &tally))
        });
        tally.report(&format!("raw redb, {name} (a commit is what one turn appends to annal's log)"));
    }
    group.finish();
}

criterion_group!(benches, annal_commits, raw_redb);
criterion_main!(benches);
