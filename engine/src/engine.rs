//! The [`Engine`]: open a database, send commands, read projections.

use crate::command::*;
use crate::error::{fail_closed, Error, Location, Result};
use crate::limits::Limits;
use crate::projection::*;
use crate::reader::Reader;
use crate::rebuild::RebuildStats;
use crate::tables::{self, meta_keys, META};
use crate::writer::{self, CommitNotice, ImportStats, Request, Shared, SUBSCRIBER_QUEUE_MAX};
use annal_codec::{LogChain, SessionId};
use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::{Mutex, RwLock};
use redb::{ConcurrencyMode, Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableHandle};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How commits reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Every acknowledged commit is fsynced (redb `Durability::Immediate`). The default.
    Durable,
    /// Commits are not fsynced; a crash can lose recent acknowledged commits (never
    /// half of one). For tests and bulk import only. The database is opened exclusively:
    /// other processes cannot read it while it is open.
    Relaxed,
}

/// How to open a database.
#[derive(Clone, Debug)]
pub struct Options {
    /// Size limits.
    pub limits: Limits,
    /// Durability of commits.
    pub durability: Durability,
    /// 32-byte key for the keyed record chain. A database created with a key must be
    /// opened with the same key.
    pub chain_key: Option<[u8; 32]>,
    /// Commands drained into one transaction at most.
    pub batch_commands_max: usize,
    /// Requests queued for the writer at most; callers block beyond it.
    pub queue_depth: usize,
    /// redb page cache in bytes.
    pub cache_bytes: usize,
    /// Verify every page of the file at open (redb's integrity check: checksums of the
    /// committed trees, allocator state rebuilt). Costs a read of the whole file and a
    /// commit. Off by default; an open that fails on damaged data is retried with the
    /// check either way, and a failure inside the storage layer is reported as
    /// [`Error::Corrupt`] rather than a panic.
    pub check_integrity_on_open: bool,
    /// Let other processes open the file read-only while this engine writes (redb's
    /// single-writer / multi-reader mode), so `annal verify` can run beside the host.
    /// The default. redb then commits in two phases, which costs a second fsync per
    /// commit; a host that never reads from another process can turn this off to commit
    /// with one fsync and hold the file exclusively. Relaxed durability is always
    /// exclusive.
    pub multi_process_readers: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            limits: Limits::default(),
            durability: Durability::Durable,
            chain_key: None,
            batch_commands_max: 1024,
            queue_depth: 4096,
            cache_bytes: 256 << 20,
            multi_process_readers: true,
            check_integrity_on_open: false,
        }
    }
}

/// A created (or forked) session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionReceipt {
    /// The session.
    pub session: SessionId,
    /// Where its creation landed.
    pub receipt: Receipt,
}

/// The result of committing a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnOutcome {
    /// Committed now.
    Committed(Receipt),
    /// Committed earlier with the same content; the original receipt.
    AlreadyCommitted(Receipt),
}

impl TurnOutcome {
    /// The receipt, either way.
    pub fn receipt(&self) -> Receipt {
        match self {
            TurnOutcome::Committed(r) | TurnOutcome::AlreadyCommitted(r) => *r,
        }
    }
}

/// The result of appending context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextOutcome {
    /// Staged as pending by the event at `seq`.
    Staged(u64),
    /// The same key and content were staged before; nothing written.
    Duplicate,
}

/// The result of recording a tool call or result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolReceipt {
    /// False for an exact retry, which writes nothing.
    pub created: bool,
    /// The event, when one was written.
    pub seq: Option<u64>,
}

struct Inner {
    reader: Reader,
    shared: Arc<Shared>,
    sender: RwLock<Option<Sender<Request>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
}

impl Inner {
    fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.sender.write().take();
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// An open annal database. `Send + Sync` and cheap to clone; every clone talks to the
/// same writer thread. Dropping the last clone, or [`Engine::close`], flushes and joins
/// the writer.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

fn unexpected(outcome: Outcome) -> Error {
    Error::Storage(format!("unexpected outcome {outcome:?}"))
}

impl Engine {
    /// Opens (or creates) the database at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Engine> {
        Engine::open_with(path, Options::default())
    }

    /// Opens (or creates) the database at `path`.
    pub fn open_with(path: impl AsRef<Path>, options: Options) -> Result<Engine> {
        let path = path.as_ref();
        let db = match fail_closed("open", || Ok(builder(&options).create(path)?)) {
            Ok(db) => db,
            // A damaged file can make a plain open fail; redb's integrity check reads
            // every page, verifies its checksum and rebuilds the allocator state, or
            // reports the damage.
            Err(Error::Corrupt { .. }) => fail_closed("open with integrity check", || {
                let mut b = builder(&options);
                b.set_check_integrity_on_open(true);
                Ok(b.create(path)?)
            })?,
            Err(e) => return Err(e),
        };
        fail_closed("open", || Engine::start(db, options))
    }

    /// Opens (or creates) a database on a custom redb storage backend, for example the
    /// fault-injecting one in [`crate::fault`].
    pub fn open_with_backend(backend: impl redb::StorageBackend, options: Options) -> Result<Engine> {
        let db = fail_closed("open", || Ok(builder(&options).create_with_backend(backend)?))?;
        fail_closed("open", || Engine::start(db, options))
    }

    fn start(db: Database, options: Options) -> Result<Engine> {
        let chain = match options.chain_key {
            Some(k) => LogChain::keyed(k),
            None => LogChain::plain(),
        };
        let stale = initialize(&db, &chain)?;
        if stale != ProjectionSet::none() {
            crate::rebuild::rebuild_db(&db, &chain, options.limits.record_bytes_max, stale, &mut |_, _| {})?;
        }
        let tip = writer::load_tip(&db, &chain)?;
        let db = Arc::new(Db::new(db));
        let limits = options.limits.clone();
        let chain_for_reader = chain.clone();
        let heads = Arc::new(crate::cache::HeadCache::default());
        let shared = Arc::new(Shared {
            heads: heads.clone(),
            db: db.clone(),
            limits: options.limits.clone(),
            chain,
            durability: match options.durability {
                Durability::Durable => redb::Durability::Immediate,
                Durability::Relaxed => redb::Durability::None,
            },
            poisoned: AtomicBool::new(false),
            subscribers: Mutex::new(Vec::new()),
            batch_commands_max: options.batch_commands_max.max(1),
        });
        let (tx, rx) = bounded(options.queue_depth.max(1));
        let writer_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("annal-writer".into())
            .spawn(move || writer::run(writer_shared, rx, tip))?;
        Ok(Engine {
            inner: Arc::new(Inner {
                reader: Reader::new(db, Some(heads), limits, chain_for_reader),
                shared,
                sender: RwLock::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Whether an I/O failure has poisoned the engine.
    pub fn is_poisoned(&self) -> bool {
        self.inner.shared.poisoned.load(Ordering::Acquire)
    }

    fn send(&self, request: Request) -> Result<()> {
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        let guard = self.inner.sender.read();
        let sender = guard.as_ref().ok_or(Error::Closed)?;
        sender.send(request).map_err(|_| Error::Closed)
    }

    /// Runs any command and waits for its durable outcome.
    pub fn execute(&self, command: Command) -> Result<Outcome> {
        let (reply, rx) = bounded(1);
        self.send(Request::Command { command, reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Runs several commands in order, all or nothing. The first rejection is returned as
    /// [`Rejection::Batch`] with its index.
    pub fn batch(&self, commands: Vec<Command>) -> Result<Vec<Outcome>> {
        match self.execute(Command::Batch(commands))? {
            Outcome::Batch(outcomes) => Ok(outcomes),
            other => Err(unexpected(other)),
        }
    }

    /// Creates a session.
    pub fn create_session(&self, c: CreateSession) -> Result<SessionReceipt> {
        match self.execute(Command::CreateSession(c))? {
            Outcome::Created { session, receipt } => Ok(SessionReceipt { session, receipt }),
            other => Err(unexpected(other)),
        }
    }

    /// Commits a turn. An exact retry returns [`TurnOutcome::AlreadyCommitted`] with the
    /// original receipt, even if the head has moved since.
    pub fn commit_turn(&self, c: CommitTurn) -> Result<TurnOutcome> {
        match self.execute(Command::CommitTurn(c))? {
            Outcome::Committed(r) => Ok(TurnOutcome::Committed(r)),
            Outcome::AlreadyCommitted(r) => Ok(TurnOutcome::AlreadyCommitted(r)),
            other => Err(unexpected(other)),
        }
    }

    /// Rewrites a range of the head (edit, compaction, redaction).
    pub fn rewrite(&self, c: Rewrite) -> Result<Receipt> {
        match self.execute(Command::Rewrite(c))? {
            Outcome::Rewritten(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Restores a revision the session held before; the new head id equals `target`.
    pub fn restore(&self, c: Restore) -> Result<Receipt> {
        match self.execute(Command::Restore(c))? {
            Outcome::Rewritten(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Forks a session.
    pub fn fork(&self, c: Fork) -> Result<SessionReceipt> {
        match self.execute(Command::Fork(c))? {
            Outcome::Created { session, receipt } => Ok(SessionReceipt { session, receipt }),
            other => Err(unexpected(other)),
        }
    }

    /// Forks `parent` keeping its first `index` messages, into a new session.
    pub fn fork_at(&self, parent: SessionId, index: u64) -> Result<SessionReceipt> {
        self.fork(Fork { parent, session: new_session_id(), index, replacement: None, labels: None })
    }

    /// Forks `parent` keeping its first `index` messages followed by `message`.
    pub fn fork_replace(&self, parent: SessionId, index: u64, message: Message) -> Result<SessionReceipt> {
        self.fork(Fork { parent, session: new_session_id(), index, replacement: Some(message), labels: None })
    }

    /// Archives a session. Returns false if it already was archived (nothing written).
    pub fn archive(&self, session: SessionId, reason: impl Into<String>) -> Result<bool> {
        match self.execute(Command::Archive { session, reason: reason.into() })? {
            Outcome::Archived { seq } => Ok(seq.is_some()),
            other => Err(unexpected(other)),
        }
    }

    /// Revives an archived session. Returns the event's seq.
    pub fn revive(&self, session: SessionId, reason: impl Into<String>) -> Result<u64> {
        match self.execute(Command::Revive { session, reason: reason.into() })? {
            Outcome::Revived { seq } => Ok(seq),
            other => Err(unexpected(other)),
        }
    }

    /// Stages context for a later turn.
    pub fn append_context(&self, c: AppendContext) -> Result<ContextOutcome> {
        match self.execute(Command::AppendContext(c))? {
            Outcome::Staged { seq } => Ok(ContextOutcome::Staged(seq)),
            Outcome::Duplicate => Ok(ContextOutcome::Duplicate),
            other => Err(unexpected(other)),
        }
    }

    /// T1: records a tool call before it is dispatched.
    pub fn record_tool_call(&self, c: RecordToolCall) -> Result<ToolReceipt> {
        match self.execute(Command::RecordToolCall(c))? {
            Outcome::Tool { created, seq } => Ok(ToolReceipt { created, seq }),
            other => Err(unexpected(other)),
        }
    }

    /// T2: records a tool call's result.
    pub fn record_tool_result(&self, c: RecordToolResult) -> Result<ToolReceipt> {
        match self.execute(Command::RecordToolResult(c))? {
            Outcome::Tool { created, seq } => Ok(ToolReceipt { created, seq }),
            other => Err(unexpected(other)),
        }
    }

    /// Sets and removes labels. Returns the event's seq, or `None` if nothing changed.
    pub fn set_labels(&self, c: SetLabels) -> Result<Option<u64>> {
        match self.execute(Command::SetLabels(c))? {
            Outcome::Labels { seq } => Ok(seq),
            other => Err(unexpected(other)),
        }
    }

    /// A receiver that hears about every durable commit once, in commit order. A
    /// receiver more than [`SUBSCRIBER_QUEUE_MAX`] notices behind is disconnected.
    pub fn subscribe(&self) -> Receiver<CommitNotice> {
        let (tx, rx) = bounded(SUBSCRIBER_QUEUE_MAX);
        self.inner.shared.subscribers.lock().push(tx);
        rx
    }

    /// Drops the projections in `set` and folds them again from the log, in one
    /// transaction, through the writer (so no commit interleaves).
    pub fn rebuild(&self, set: ProjectionSet) -> Result<RebuildStats> {
        let (reply, rx) = bounded(1);
        self.send(Request::Rebuild { set, reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Appends records exported from another database (for example by `annal export`)
    /// exactly as they are: same sequence numbers, stream sequences and timestamps, so
    /// revision ids and, under the same key, chain hashes are reproduced. `content` holds
    /// the canonical bytes of every content object the records refer to that this
    /// database does not hold yet. The first record must follow the current tip. Runs in
    /// one transaction: on any error nothing is appended
    /// ([`Rejection::InvalidImport`] names the record).
    pub fn import(&self, records: Vec<annal_codec::Record>, content: Vec<Vec<u8>>) -> Result<ImportStats> {
        let (reply, rx) = bounded(1);
        self.send(Request::Import { records, content, reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// The read side of this engine (the same as dereferencing it).
    pub fn reader(&self) -> &Reader {
        &self.inner.reader
    }

    /// Flushes and stops the writer. Later calls on any clone return `Closed`.
    pub fn close(self) -> Result<()> {
        self.inner.shutdown();
        Ok(())
    }
}

/// The redb database of an engine. redb may panic on damaged pages, and a panic inside
/// redb can leave its internal locks poisoned so that dropping the database panics too;
/// this wrapper drops it inside `catch_unwind`, so closing an engine never unwinds into
/// the host.
pub(crate) struct Db(Option<Database>);

impl Db {
    fn new(db: Database) -> Db {
        Db(Some(db))
    }
}

impl std::ops::Deref for Db {
    type Target = Database;
    fn deref(&self) -> &Database {
        match &self.0 {
            Some(db) => db,
            // Only `drop` takes the database out, and nothing runs after it.
            None => unreachable!("the database is present until the engine is dropped"),
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
        }
    }
}

impl redb::ReadableDatabase for Db {
    fn begin_read(&self) -> std::result::Result<redb::ReadTransaction, redb::TransactionError> {
        (**self).begin_read()
    }
    fn cache_stats(&self) -> redb::CacheStats {
        (**self).cache_stats()
    }
}

impl std::ops::Deref for Engine {
    type Target = Reader;
    /// Queries are methods of [`Reader`]; an engine reads through its own.
    fn deref(&self) -> &Reader {
        &self.inner.reader
    }
}

fn builder(options: &Options) -> redb::Builder {
    let mut b = redb::Builder::new();
    b.set_cache_size(options.cache_bytes);
    b.set_check_integrity_on_open(options.check_integrity_on_open);
    b.set_concurrency_mode(match (options.durability, options.multi_process_readers) {
        (Durability::Durable, true) => ConcurrencyMode::SingleWriter,
        _ => ConcurrencyMode::ExclusiveWriter,
    });
    b
}

/// What an open must do before the writer starts.
struct OpenPlan {
    /// Write the format version (and key check) of a new database.
    init_format: bool,
    /// Projections whose stored version or cursor is off.
    stale: ProjectionSet,
}

/// Checks the format, the key and every projection's version and cursor against `meta`.
fn plan_open(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
    log_empty: bool,
    chain: &LogChain,
) -> Result<OpenPlan> {
    let format = meta.get(meta_keys::FORMAT)?.map(|g| tables::meta_u64(g.value()));
    let init_format = match format {
        None if log_empty => true,
        None => return Err(Error::corrupt(Location::Meta { key: meta_keys::FORMAT.into() }, "missing format version")),
        Some(Some(v)) if v == tables::FORMAT as u64 => false,
        Some(found) => {
            return Err(Error::UnsupportedFormat { found: found.unwrap_or(0) as u32, supported: tables::FORMAT })
        }
    };
    let stored = meta.get(meta_keys::KEY_CHECK)?.map(|g| g.value().to_vec());
    match (stored, chain.key_check()) {
        (Some(_), None) => {
            return Err(Error::KeyMismatch { detail: "the database has a keyed chain; supply its key".into() })
        }
        (None, Some(_)) if !init_format => {
            return Err(Error::KeyMismatch { detail: "the database has a plain chain; open it without a key".into() })
        }
        (Some(s), Some(k)) if s[..] != k[..] => return Err(Error::KeyMismatch { detail: "wrong chain key".into() }),
        _ => {}
    }
    let tip_seq = match meta.get(meta_keys::TIP)? {
        Some(g) => tables::decode_tip(g.value())?.0,
        None => 0,
    };
    let mut stale = ProjectionSet::none();
    for p in Projection::ALL {
        let version = meta.get(meta_keys::version(p).as_str())?.and_then(|g| tables::meta_u64(g.value()));
        let cursor = meta.get(meta_keys::cursor(p).as_str())?.and_then(|g| tables::meta_u64(g.value()));
        if version != Some(p.version() as u64) || cursor != Some(tip_seq) {
            stale = stale.with(p);
        }
    }
    Ok(OpenPlan { init_format, stale })
}

/// Whether an existing database needs no change at open: checked on a read snapshot, so
/// that opening and closing a healthy database writes nothing.
fn ready_without_writing(db: &Database, chain: &LogChain) -> Result<bool> {
    let txn = db.begin_read()?;
    let names: Vec<String> = txn.list_tables()?.map(|t| t.name().to_string()).collect();
    let all = [
        tables::LOG.name(),
        tables::SESSION_LOG.name(),
        tables::CONTENT.name(),
        tables::META.name(),
        tables::PROJECTIONS.name(),
    ]
    .into_iter()
    .map(str::to_string);
    if !all.into_iter().all(|n| names.contains(&n)) {
        return Ok(false);
    }
    let log_empty = txn.open_table(tables::LOG)?.is_empty()?;
    let plan = plan_open(&txn.open_table(META)?, log_empty, chain)?;
    Ok(!plan.init_format && plan.stale == ProjectionSet::none())
}

/// Creates tables, checks the format and the key, and returns the projections that
/// must be rebuilt (version or cursor mismatch). Writes only when something must change.
fn initialize(db: &Database, chain: &LogChain) -> Result<ProjectionSet> {
    if ready_without_writing(db, chain)? {
        return Ok(ProjectionSet::none());
    }
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    tables::create_all(&txn)?;
    let mut stale = ProjectionSet::none();
    {
        let mut meta = txn.open_table(META)?;
        let log_empty = txn.open_table(tables::LOG)?.is_empty()?;
        let plan = plan_open(&meta, log_empty, chain)?;
        if plan.init_format {
            meta.insert(meta_keys::FORMAT, tables::FORMAT.to_le_bytes().as_slice())?;
            if let Some(check) = chain.key_check() {
                meta.insert(meta_keys::KEY_CHECK, check.as_slice())?;
            }
        }
        for p in plan.stale.iter() {
            if log_empty {
                tables::write_projection_meta(&mut meta, p, 0)?;
            } else {
                stale = stale.with(p);
            }
        }
    }
    txn.commit()?;
    Ok(stale)
}
