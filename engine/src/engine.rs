//! The [`Engine`]: open a database, send commands, read projections.

use crate::checkpoint::{self, CheckpointPolicy, Checkpointer};
use crate::command::*;
use crate::compact::{FileLength, Measured};
use crate::copy::{CopyOutcome, SessionExport};
use crate::delta::Delta;
use crate::error::{fail_closed, Error, Result};
use crate::import::ImportStats;
use crate::journal::Journal;
use crate::limits::Limits;
use crate::projection::*;
use crate::reader::Reader;
use crate::rebuild::RebuildStats;
use crate::reply::convert;
use crate::writer::{self, CommitNotice, ReplyTo, Request, Shared, Subscriber, SUBSCRIBER_QUEUE_MAX};
use annal_codec::content::Compression;
use annal_codec::{LogChain, SessionId};
use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::{Mutex, RwLock};
use redb::{ConcurrencyMode, Database, ReadableDatabase};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How commits reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Every group commit is durable before any of its callers is acknowledged: it is
    /// one frame written to the journal and one `fdatasync` ([`crate::journal`]), or,
    /// on a database without a journal ([`Engine::open_with_backend`],
    /// [`Engine::open_with_backends`]), one redb transaction committed with
    /// `redb::Durability::Immediate`. Checkpoints and absorptions commit durably too. The
    /// default.
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
    /// Bytes of content objects (message bodies, context, tool payloads) kept in memory
    /// once read and verified, so that reading them again (the recent messages of a
    /// session, at every turn) skips the content index, the read, decompression and
    /// hashing; of records' message lists, which a transcript's rows name its messages
    /// by, so that reading a page again decodes no record; and of the message lists of
    /// revisions that a restore (or a read of a past revision) rebuilt from the revision
    /// graph, so that the next restore of the session walks back only to there. Default
    /// 64 MiB: three quarters for the objects, three sixteenths for the records' lists, a
    /// sixteenth for the revisions'; 0 turns all three off. An object larger than a
    /// sixteenth of its share, a record's list larger than a quarter of its share, or a
    /// revision's list larger than half its share (65,536 ids by default), is not kept.
    pub content_cache_bytes: usize,
    /// Verify every page of the file at open (redb's integrity check: checksums of the
    /// committed trees, allocator state rebuilt). Costs a read of the whole file and a
    /// commit. Off by default; an open that fails on damaged data is retried with the
    /// check either way, and a failure inside the storage layer is reported as
    /// [`Error::Corrupt`] rather than a panic.
    pub check_integrity_on_open: bool,
    /// Let other processes open the files read-only while this engine writes (redb's
    /// single-writer / multi-reader mode), so `annal verify` can run beside the host.
    /// The default. redb then commits in two phases (two fsyncs), but only the absorber
    /// and the checkpointer commit redb transactions, behind the commit path: a commit is
    /// one journal frame and one fsync in either mode. Turned off, the engine holds the
    /// files exclusively. Relaxed durability is always exclusive.
    pub multi_process_readers: bool,
    /// When the delta is checkpointed into the projections file, and its bound.
    pub checkpoint: CheckpointPolicy,
    /// How the content objects that commits introduce are stored: lz4 by default
    /// ([`Compression::Lz4`]), zstd for a quarter to a third fewer bytes at more CPU
    /// ([`Compression::Zstd`]), or raw ([`Compression::Off`]). An object is stored
    /// compressed only when that saves at least an eighth of its size (small and
    /// incompressible objects stay raw). Ids are always over the canonical bytes; every
    /// reader decodes every encoding, so a file may mix them and the option may change
    /// from one open to the next ([`crate::recompress()`] converts what was written
    /// before). Under zstd each thread that compresses keeps a zstd context (about
    /// 300 KB after objects of 64 KiB), and each that decompresses one of about 100 KB.
    pub compression: Compression,
    /// The writer's clock: commit times and lease expiries. The system clock by
    /// default; tests pass a [`crate::ManualClock`]. The writer never lets time go back.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// How long an appended draft segment may wait in memory before it is written to
    /// the file on its own (it goes sooner with any commit): a crash loses at most this
    /// much of a draft. Default 50 ms.
    pub draft_flush_interval: Duration,
    /// Bytes of written zeros each journal file is extended with at a durable open
    /// ([`crate::journal::JOURNAL_PREALLOC_BYTES`] by default). A frame then lands in
    /// place, and its `fdatasync` writes no file size: on the reference disk a growing
    /// file's `fdatasync` took 1.5× an in-place one. The open writes and syncs the zeros
    /// (about 12 ms for the default on the reference machine); a clean close removes the
    /// files, as without them. 0 turns it off.
    pub journal_preallocate_bytes: u64,
    /// At [`Engine::close`], the log file and the projections file are each compacted
    /// (their free pages given back, [`crate::compact()`]) when at least an eighth of the
    /// file and 1 MiB are free and the file is at most this long (64 MiB by default).
    /// redb grows a small file by doubling it, so without this a file at rest keeps up
    /// to half of its length unused. Compaction costs about 2.5 ms a MiB of file; a
    /// larger file is left to `annal compact`. It is skipped while another handle or
    /// process has the file open for reading. 0 turns it off.
    pub compact_on_close_bytes_max: u64,
    /// The most memory the content-key filter takes: a Bloom filter over the content-id
    /// index's keys, about 3 bytes a content object, that tells the writer that an
    /// object a command brings is new without a read of the index
    /// ([`crate::filter`]). Default [`crate::filter::FILTER_BYTES_MAX`] (256 MiB, a
    /// database of about 89 million objects); a database that needs more is read
    /// without one (or with the one built before it grew). 0 turns it off. [`StatsSnapshot::content_filter_bytes`] is its size.
    pub content_filter_bytes_max: u64,
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
            content_cache_bytes: CONTENT_CACHE_BYTES,
            multi_process_readers: true,
            check_integrity_on_open: false,
            checkpoint: CheckpointPolicy::default(),
            compression: Compression::default(),
            clock: Arc::new(crate::clock::SystemClock),
            draft_flush_interval: DRAFT_FLUSH_INTERVAL,
            journal_preallocate_bytes: crate::journal::JOURNAL_PREALLOC_BYTES,
            compact_on_close_bytes_max: crate::compact::COMPACT_ON_CLOSE_BYTES_MAX,
            content_filter_bytes_max: crate::filter::FILTER_BYTES_MAX,
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
    /// The group-commit state, shared by the writer thread and lone committers.
    core: Arc<writer::Core>,
    writer: Mutex<Option<crate::pool::Task<()>>>,
    checkpointer: Mutex<Option<crate::pool::Task<()>>>,
    closed: AtomicBool,
    recovery: RebuildStats,
    /// The drafts the file held at open.
    abandoned: Vec<crate::draft::DraftSummary>,
    /// The log file, when the engine runs on files (a purge reopens it).
    path: Option<PathBuf>,
    /// The options it was opened with.
    options: Options,
    /// On a shared log ([`Engine::open_shared`]): the backend and the fold's position.
    host: Option<Arc<crate::shared::HostShared>>,
    /// On a shared log: the thread that reads the stream.
    pump: Mutex<Option<crate::pool::Task<()>>>,
    /// The lengths of the log file and the projections file, for compaction at close.
    lengths: [FileLength; 2],
}

impl Inner {
    /// Stops the writer (which tells the checkpointer to checkpoint the whole delta and
    /// stop), then waits for both.
    fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.sender.write().take();
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
        if let Some(handle) = self.checkpointer.lock().take() {
            let _ = handle.join();
        }
        if let Some(host) = &self.host {
            host.stop.store(true, Ordering::Release);
        }
        if let Some(handle) = self.pump.lock().take() {
            let _ = handle.join();
        }
    }
}

/// Counters of the engine's durable work since it opened.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Log transactions committed (one per group commit or import).
    pub log_commits: AtomicU64,
    /// Events appended.
    pub events: AtomicU64,
    /// Record and content-row bytes appended.
    pub appended_bytes: AtomicU64,
    /// Journal bytes written (frames).
    pub journal_bytes: AtomicU64,
    /// Times the journal was absorbed into the log file.
    pub absorptions: AtomicU64,
    /// Checkpoints committed.
    pub checkpoints: AtomicU64,
    /// Projection rows written by checkpoints.
    pub checkpoint_rows: AtomicU64,
    /// Times the writer waited for the checkpointer because the delta was at its bound.
    pub backpressure_waits: AtomicU64,
    /// Group commits that a lone committer ran on its own thread (the state was free
    /// and nothing was queued), with no hand-off to the writer thread.
    pub caller_commits: AtomicU64,
}

/// A snapshot of [`EngineStats`] and the delta.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Log transactions committed.
    pub log_commits: u64,
    /// Events appended.
    pub events: u64,
    /// Record and content-row bytes appended.
    pub appended_bytes: u64,
    /// Journal bytes written (frames).
    pub journal_bytes: u64,
    /// Times the journal was absorbed into the log file.
    pub absorptions: u64,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Projection rows written by checkpoints.
    pub checkpoint_rows: u64,
    /// Times the writer waited on the delta bound.
    pub backpressure_waits: u64,
    /// Group commits a lone committer ran on its own thread.
    pub caller_commits: u64,
    /// Bytes the delta holds now.
    pub delta_bytes: u64,
    /// Bytes the content-key filter takes now (0 while none answers yet, and for an
    /// engine over a shared log): it tells the writer that a new object is not stored
    /// without a read of the content-id index ([`crate::filter`]).
    pub content_filter_bytes: u64,
    /// Events folded at open to bring the projections up to the log (recovery).
    pub recovered_events: u64,
    /// How long that fold took, in microseconds.
    pub recovery_us: u64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// An open annal database. `Send + Sync` and cheap to clone; every clone commits
/// through the same writer (its thread, or a lone caller's own thread under the same
/// lock). Dropping the last clone, or [`Engine::close`], flushes and joins the writer.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
    /// Set on a handle from [`Engine::fenced`]: every command it sends is fenced.
    fence: Option<crate::command::Fence>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

/// The default of [`Options::content_cache_bytes`]: 64 MiB.
pub const CONTENT_CACHE_BYTES: usize = 64 << 20;

/// The default of [`Options::draft_flush_interval`].
pub const DRAFT_FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// The zeros a journal opened with `options` is extended with: none for a relaxed
/// open, which only takes in what a crash left and removes the files.
fn preallocate_bytes(options: &Options) -> u64 {
    match options.durability {
        Durability::Durable => options.journal_preallocate_bytes,
        Durability::Relaxed => 0,
    }
}

/// A duration in whole ms, saturating.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().min(u64::MAX as u128) as u64
}

impl Engine {
    /// Opens (or creates) the database at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Engine> {
        Engine::open_with(path, Options::default())
    }

    /// Opens (or creates) the database at `path`: the log file itself, and its
    /// projections file beside it ([`projections_path`]), created or brought up to the
    /// log as needed.
    pub fn open_with(path: impl AsRef<Path>, options: Options) -> Result<Engine> {
        // redb panics on some damaged pages: wherever the open meets one, it is an error.
        fail_closed("open", || Engine::open_path(path.as_ref(), options))
    }

    /// [`Engine::open_with`], unguarded.
    fn open_path(path: &Path, options: Options) -> Result<Engine> {
        options.limits.validate()?;
        refuse_unreadable_format(path, &options)?;
        let mut folded = RebuildStats::default();
        if path.is_file() && !projections_path(path).exists() {
            // Every projection is folded from the log: the way an offline rebuild does it
            // (into a new file, written in physical key order on a thread of its own), not
            // by the catch-up below, which would write the same rows in place.
            if recover_log(path, &options)?.tip_seq > 0 {
                folded = crate::rebuild::rebuild_offline(path, &options, ProjectionSet::all(), &mut |_, _| {})?;
            }
        }
        let log = open_log_file(path, &options)?;
        let projections = open_projections(&projections_path(path), &options)?;
        // A durable database commits into its journal (`crate::journal`); a relaxed open
        // still takes in what a journal left by a crash holds.
        let journal = match options.durability == Durability::Durable
            || crate::journal::journal_paths(path).iter().any(|p| p.exists())
        {
            true => Some(Journal::open(path, preallocate_bytes(&options))?),
            false => None,
        };
        let lengths = [FileLength::Path(path.to_path_buf()), FileLength::Path(projections_path(path))];
        fail_closed("open", || {
            Engine::start(log, projections, journal, options, Some(path.to_path_buf()), None, lengths, folded)
        })
    }

    /// Opens (or creates) a database on a custom redb storage backend for the log, for
    /// example the fault-injecting one in [`crate::fault`]. The projections live in
    /// memory and are folded from the log at every open.
    pub fn open_with_backend(backend: impl redb::StorageBackend, options: Options) -> Result<Engine> {
        options.limits.validate()?;
        let (backend, log_length) = Measured::new(backend);
        let log = fail_closed("open", || Ok(builder(&options).create_with_backend(backend)?))?;
        // Memory is private to this process: it needs no multi-process locking.
        let mut b = builder(&options);
        b.set_concurrency_mode(ConcurrencyMode::ExclusiveWriter);
        let projections = b.create_with_backend(redb::backends::InMemoryBackend::new())?;
        let lengths = [log_length, FileLength::Unknown];
        fail_closed("open", || Engine::start(log, projections, None, options, None, None, lengths, Default::default()))
    }

    /// Opens (or creates) a database with the log on one storage backend and the
    /// projections on another.
    pub fn open_with_backends(
        log: impl redb::StorageBackend,
        projections: impl redb::StorageBackend,
        options: Options,
    ) -> Result<Engine> {
        options.limits.validate()?;
        let ((log, log_length), (projections, projections_length)) = (Measured::new(log), Measured::new(projections));
        let log = fail_closed("open", || Ok(builder(&options).create_with_backend(log)?))?;
        let projections = fail_closed("open", || Ok(builder(&options).create_with_backend(projections)?))?;
        let lengths = [log_length, projections_length];
        fail_closed("open", || Engine::start(log, projections, None, options, None, None, lengths, Default::default()))
    }

    /// Opens (or creates) a database with the log, the projections and the two journal
    /// files each on a storage backend of their own: the layout [`Engine::open`] gives a durable
    /// database in files, where a group commit writes one frame to the journal and one
    /// `fdatasync` (`docs/design.md` §7). With [`Durability::Relaxed`] the journal is
    /// not written: what a crash left in it goes into the log file, and it is cut to
    /// nothing.
    pub fn open_with_journal(
        log: impl redb::StorageBackend,
        projections: impl redb::StorageBackend,
        journal: [impl redb::StorageBackend; 2],
        options: Options,
    ) -> Result<Engine> {
        options.limits.validate()?;
        let ((log, log_length), (projections, projections_length)) = (Measured::new(log), Measured::new(projections));
        let log = fail_closed("open", || Ok(builder(&options).create_with_backend(log)?))?;
        let projections = fail_closed("open", || Ok(builder(&options).create_with_backend(projections)?))?;
        let [first, second] = journal;
        let journal = Some(Journal::on_backends(first, second, preallocate_bytes(&options))?);
        let lengths = [log_length, projections_length];
        fail_closed("open", || {
            Engine::start(log, projections, journal, options, None, None, lengths, Default::default())
        })
    }

    /// Opens (or creates) a host of a shared log at `path`: the engine's files hold
    /// this host's fold of the log on `backend`, which every host appends to
    /// (`docs/design.md` §13, [`crate::backend`]). Commands are decided here, published
    /// to the backend, and answered once this host's fold has taken them in, with the
    /// fold's verdict, so every query on this host sees a command once it returns.
    /// Other hosts' commands arrive through the fold ([`Engine::host_status`],
    /// [`Engine::wait_for_stream`]).
    ///
    /// The backend is the durable copy: the host's files are written without an fsync
    /// on the commit path (`options.durability` is taken as
    /// [`Durability::Relaxed`]), and after a crash the host folds the stream again past
    /// what its file kept. Every host must use the same chain key: a message is
    /// authenticated with it. Import, session copy and content collection are refused
    /// on a host, since they would write the log other than through the stream.
    pub fn open_shared(
        path: impl AsRef<Path>,
        mut options: Options,
        backend: Arc<dyn crate::backend::LogBackend>,
    ) -> Result<Engine> {
        let path = path.as_ref();
        options.limits.validate()?;
        options.durability = Durability::Relaxed;
        if crate::journal::journal_paths(path).iter().any(|p| p.exists()) {
            return Err(Error::Rejected(crate::Rejection::InvalidRequest {
                reason: format!("{} has a journal: it is an embedded database, not a host's", path.display()),
            }));
        }
        refuse_unreadable_format(path, &options)?;
        let log = open_file(path, &options)?;
        let projections = open_projections(&projections_path(path), &options)?;
        let lengths = [FileLength::Path(path.to_path_buf()), FileLength::Path(projections_path(path))];
        fail_closed("open", || {
            let (path, folded) = (Some(path.to_path_buf()), Default::default());
            Engine::start(log, projections, None, options, path, Some(backend), lengths, folded)
        })
    }

    /// On a host of a shared log, how far its fold has come through the stream.
    pub fn host_status(&self) -> Option<crate::shared::HostStatus> {
        let host = self.inner.host.as_ref()?;
        let position = *host.position.lock();
        let stream_tip = host.seen.load(Ordering::Relaxed).max(position);
        Some(crate::shared::HostStatus { position, stream_tip })
    }

    /// On a host of a shared log, waits until its fold has taken in stream sequence
    /// `seq` (a sequence another host's caller carried here, for example), at most
    /// `timeout`. Returns whether it has; always true on an embedded engine.
    pub fn wait_for_stream(&self, seq: u64, timeout: std::time::Duration) -> bool {
        let Some(host) = self.inner.host.as_ref() else {
            return true;
        };
        let deadline = std::time::Instant::now() + timeout;
        let mut position = host.position.lock();
        while *position < seq {
            if host.moved.wait_until(&mut position, deadline).timed_out() {
                return *position >= seq;
            }
        }
        true
    }

    /// Starts an engine on its opened files. `folded` is what was folded into the
    /// projections file before (a rebuild of a missing one), counted as recovery.
    #[allow(clippy::too_many_arguments)]
    fn start(
        log: Database,
        projections: Database,
        mut journal: Option<Journal>,
        options: Options,
        path: Option<PathBuf>,
        backend: Option<Arc<dyn crate::backend::LogBackend>>,
        lengths: [FileLength; 2],
        folded: RebuildStats,
    ) -> Result<Engine> {
        let chain = match options.chain_key {
            Some(k) => LogChain::keyed(k),
            None => LogChain::plain(),
        };
        let durability = match options.durability {
            Durability::Durable => redb::Durability::Immediate,
            Durability::Relaxed => redb::Durability::None,
        };
        let tip = crate::log::open_log(&log, &chain)?;
        // What the journal holds past the log file's tip (a crash) goes into the log first.
        let tip = match journal.as_mut() {
            Some(journal) => crate::journal::recover(&log, journal, tip, &chain)?,
            None => tip,
        };
        let journal = match (journal, options.durability) {
            (Some(journal), Durability::Relaxed) => {
                journal.shred()?;
                None
            }
            (journal, _) => journal,
        };
        let (recovery, collecting) = {
            let log_txn = log.begin_read()?;
            // A content collection a crash interrupted: its removals from the content-id
            // index may be missing from the projections file, so that projection is
            // folded again from the log, whose rows no longer hold what was removed.
            let collecting = crate::collect::collecting_in(&log_txn);
            let (cursors, current) = {
                let txn = projections.begin_read()?;
                let mut cursors = checkpoint::read_cursors(&txn, &log_txn, &Default::default(), &chain, &tip)?;
                if collecting {
                    cursors = cursors.reset(ProjectionSet::none().with(crate::Projection::Content));
                }
                let current = !collecting
                    && match tip.seq {
                        0 => checkpoint::caught_up_empty(&txn, &tip)?,
                        seq => cursors.behind(seq) == ProjectionSet::none(),
                    };
                (cursors, current)
            };
            let recovery = if current {
                folded
            } else {
                let limits = &options.limits;
                let caught_up = checkpoint::catch_up(
                    &projections,
                    &log_txn,
                    &chain,
                    limits,
                    &tip,
                    &cursors,
                    durability,
                    &mut |_, _| {},
                    checkpoint::Folding::default(),
                )?;
                RebuildStats {
                    events: folded.events + caught_up.events,
                    bytes: folded.bytes + caught_up.bytes,
                    elapsed: folded.elapsed + caught_up.elapsed,
                }
            };
            (recovery, collecting)
        };
        if collecting {
            crate::collect::sync_projections(&projections)?;
            crate::collect::clear_mark(&log)?;
        }
        let log = Arc::new(Db::new(log));
        let projections = Arc::new(Db::new(projections));
        let delta = Delta::new(projections.begin_read()?, log.begin_read()?, tip.seq, tip.hash)?;
        let delta = delta.with_content_cache(options.content_cache_bytes as u64);
        // Over a shared log, other hosts' records are folded too: the filter is the
        // own log's alone (`crate::filter`).
        let delta = Arc::new(match backend.is_none() && options.content_filter_bytes_max > 0 {
            true => delta.with_content_filter(options.content_filter_bytes_max),
            false => delta,
        });
        let poisoned = Arc::new(crate::error::Poison::default());
        let stats = Arc::new(EngineStats::default());
        let renewals = Arc::new(Mutex::new(crate::decide::Renewals::new()));
        let drafts = crate::draft::DraftState::load(&log.begin_read()?)?;
        let abandoned = drafts.summaries();
        let drafts = Arc::new(Mutex::new(drafts));
        let shared = Arc::new(Shared {
            log_db: log.clone(),
            projections: projections.clone(),
            delta: delta.clone(),
            limits: options.limits.clone(),
            chain: chain.clone(),
            durability,
            policy: options.checkpoint.clone(),
            poisoned: poisoned.clone(),
            subscribers: Mutex::new(Vec::new()),
            batch_commands_max: options.batch_commands_max.max(1),
            stats: stats.clone(),
            tip: Mutex::new(tip),
            compression: options.compression,
            clock: options.clock.clone(),
            renewals: renewals.clone(),
            drafts,
            draft_flush_interval: options.draft_flush_interval,
        });
        let (ckpt_tx, ckpt_rx) = bounded(64);
        let checkpointer = Checkpointer {
            delta: delta.clone(),
            projections,
            durability,
            policy: options.checkpoint.clone(),
            poisoned,
            stats,
        };
        let checkpointer = crate::pool::spawn(move || checkpointer.run(ckpt_rx))?;
        let (tx, rx) = bounded(options.queue_depth.max(1));
        let writer_shared = shared.clone();
        let (host, pump, handle, core) = match backend {
            None => {
                let core = Arc::new(writer::Core::new(&shared, tip, ckpt_tx, journal));
                let writer_core = core.clone();
                let handle = crate::pool::spawn(move || writer::run(writer_shared, rx, writer_core))?;
                (None, None, handle, core)
            }
            Some(backend) => {
                let position = crate::shared::read_position(&log.begin_read()?)?;
                if position == 0 && tip.seq > 0 {
                    return Err(Error::Rejected(crate::Rejection::InvalidRequest {
                        reason: "the file holds records that did not come from a shared log".into(),
                    }));
                }
                let host = Arc::new(crate::shared::HostShared {
                    backend,
                    position: parking_lot::Mutex::new(position),
                    moved: parking_lot::Condvar::new(),
                    seen: std::sync::atomic::AtomicU64::new(position),
                    stop: AtomicBool::new(false),
                    queued: crate::shared::QueueBytes::new(crate::shared::FOLD_QUEUE_BYTES_MAX),
                });
                let (fold_tx, fold_rx) = bounded(crate::shared::FOLD_QUEUE_MESSAGES_MAX);
                let pump_host = host.clone();
                let pump = crate::pool::spawn(move || crate::shared::pump(pump_host, position, fold_tx))?;
                // A host's commands always go through the writer thread.
                let core = Arc::new(writer::Core::new(&shared, tip, ckpt_tx.clone(), None));
                let state = crate::shared::HostState {
                    position,
                    subject_last: Default::default(),
                    last_durable: std::time::Instant::now(),
                    nonce: crate::command::new_session_id().0,
                };
                let writer_host = host.clone();
                let handle = crate::pool::spawn(move || {
                    crate::shared::run(writer_shared, rx, fold_rx, writer_host, state, ckpt_tx)
                })?;
                (Some(host), Some(pump), handle, core)
            }
        };
        Ok(Engine {
            fence: None,
            inner: Arc::new(Inner {
                reader: Reader::live(delta, options.limits.clone(), chain, Some(renewals)),
                shared,
                sender: RwLock::new(Some(tx)),
                core,
                writer: Mutex::new(Some(handle)),
                checkpointer: Mutex::new(Some(checkpointer)),
                closed: AtomicBool::new(false),
                recovery,
                abandoned,
                path,
                options,
                host,
                pump: Mutex::new(pump),
                lengths,
            }),
        })
    }

    /// What the engine has written since it opened, and how much the delta holds.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.inner.shared.stats;
        StatsSnapshot {
            log_commits: s.log_commits.load(Ordering::Relaxed),
            events: s.events.load(Ordering::Relaxed),
            appended_bytes: s.appended_bytes.load(Ordering::Relaxed),
            journal_bytes: s.journal_bytes.load(Ordering::Relaxed),
            absorptions: s.absorptions.load(Ordering::Relaxed),
            checkpoints: s.checkpoints.load(Ordering::Relaxed),
            checkpoint_rows: s.checkpoint_rows.load(Ordering::Relaxed),
            backpressure_waits: s.backpressure_waits.load(Ordering::Relaxed),
            caller_commits: s.caller_commits.load(Ordering::Relaxed),
            delta_bytes: self.inner.shared.delta.bytes(),
            content_filter_bytes: self.inner.shared.delta.filter_bytes(),
            recovered_events: self.inner.recovery.events,
            recovery_us: self.inner.recovery.elapsed.as_micros() as u64,
        }
    }

    /// Whether an I/O failure has poisoned the engine.
    pub fn is_poisoned(&self) -> bool {
        self.inner.shared.poisoned.load(Ordering::Acquire)
    }

    /// The failure that poisoned the engine, if it is poisoned: what every later
    /// [`Error::Poisoned`] stands for. A full disk is an [`Error::Storage`] whose
    /// [`Error::io_kind`] is [`std::io::ErrorKind::StorageFull`]: free space, then open
    /// the database again.
    pub fn poison_cause(&self) -> Option<Error> {
        self.inner.shared.poisoned.cause()
    }

    /// Queues `request` for the writer; blocks while the queue holds
    /// [`Options::queue_depth`] requests.
    pub(crate) fn send(&self, request: Request) -> Result<()> {
        self.dispatch(request, false)
    }

    /// Queues `request` for the writer thread, or with `here` (a synchronous caller's
    /// command) first offers it to [`writer::Core::commit_here`], which commits a lone
    /// command on this thread.
    fn dispatch(&self, request: Request, here: bool) -> Result<()> {
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        let guard = self.inner.sender.read();
        let sender = guard.as_ref().ok_or(Error::Closed)?;
        let request = match here && self.inner.host.is_none() {
            true => match self.inner.core.commit_here(&self.inner.shared, request) {
                Ok(()) => return Ok(()),
                Err(request) => request,
            },
            false => request,
        };
        self.inner.core.queue(sender, request)
    }

    /// A handle to the same engine whose every command carries `fence`
    /// ([`Command::Fenced`]): it is accepted only while `fence.token` is the current lease
    /// token of `fence.session`, and refused with [`Rejection::Fenced`] otherwise, writing
    /// nothing. Queries are not fenced.
    ///
    /// [`Rejection::Fenced`]: crate::Rejection::Fenced
    pub fn fenced(&self, fence: crate::command::Fence) -> Engine {
        Engine { inner: self.inner.clone(), fence: Some(fence) }
    }

    /// The fence this handle puts on its commands, if it is a [`Engine::fenced`] handle.
    pub fn fence(&self) -> Option<crate::command::Fence> {
        self.fence
    }

    /// Runs any command and waits for its durable outcome (fenced, on a
    /// [`Engine::fenced`] handle).
    pub fn execute(&self, command: Command) -> Result<Outcome> {
        let (reply, rx) = oneshot::channel();
        // Alone, it commits here; otherwise it joins the writer's next group.
        self.dispatch(self.command_request(command, reply), true)?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// The writer's request for `command` (fenced, on a [`Engine::fenced`] handle), with
    /// its content compressed.
    pub(crate) fn command_request(&self, command: Command, reply: ReplyTo<Outcome>) -> Request {
        let command = match self.fence {
            Some(fence) => Command::Fenced { fence, command: Box::new(command) },
            None => command,
        };
        // Content is hashed (and compressed) here, on the caller's thread, so callers do it
        // in parallel and the writer does not. `prepared` finds each object by its buffer
        // in this very command, which the request carries along with it.
        let shared = &self.inner.shared;
        let prepared = Box::new(crate::decide::Prepared::new(&command, &shared.limits, shared.compression));
        Request::Command { command: Box::new(command), reply, prepared }
    }

    /// Runs several commands in order, all or nothing. The first rejection is returned as
    /// [`crate::Rejection::Batch`] with its index.
    pub fn batch(&self, commands: Vec<Command>) -> Result<Vec<Outcome>> {
        self.execute(Command::Batch(commands)).and_then(convert::batch)
    }

    /// Creates a session.
    pub fn create_session(&self, c: CreateSession) -> Result<SessionReceipt> {
        self.execute(Command::CreateSession(c)).and_then(convert::created)
    }

    /// Commits a turn. An exact retry returns [`TurnOutcome::AlreadyCommitted`] with the
    /// original receipt, even if the head has moved since.
    pub fn commit_turn(&self, c: CommitTurn) -> Result<TurnOutcome> {
        self.execute(Command::CommitTurn(c)).and_then(convert::turn)
    }

    /// Rewrites a range of the head (edit, compaction, redaction).
    pub fn rewrite(&self, c: Rewrite) -> Result<Receipt> {
        self.execute(Command::Rewrite(c)).and_then(convert::rewritten)
    }

    /// Restores a revision the session held before; the new head id equals `target`.
    pub fn restore(&self, c: Restore) -> Result<Receipt> {
        self.execute(Command::Restore(c)).and_then(convert::rewritten)
    }

    /// Forks a session.
    pub fn fork(&self, c: Fork) -> Result<SessionReceipt> {
        self.execute(Command::Fork(c)).and_then(convert::created)
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
        self.execute(Command::Archive { session, reason: reason.into() }).and_then(convert::archived)
    }

    /// Revives an archived session. Returns the event's seq.
    pub fn revive(&self, session: SessionId, reason: impl Into<String>) -> Result<u64> {
        self.execute(Command::Revive { session, reason: reason.into() }).and_then(convert::revived)
    }

    /// Stages context for a later turn.
    pub fn append_context(&self, c: AppendContext) -> Result<ContextOutcome> {
        self.execute(Command::AppendContext(c)).and_then(convert::context)
    }

    /// T1: records a tool call before it is dispatched.
    pub fn record_tool_call(&self, c: RecordToolCall) -> Result<ToolReceipt> {
        self.execute(Command::RecordToolCall(c)).and_then(convert::tool)
    }

    /// T2: records a tool call's result.
    pub fn record_tool_result(&self, c: RecordToolResult) -> Result<ToolReceipt> {
        self.execute(Command::RecordToolResult(c)).and_then(convert::tool)
    }

    /// Sets and removes labels. Returns the event's seq, or `None` if nothing changed.
    pub fn set_labels(&self, c: SetLabels) -> Result<Option<u64>> {
        self.execute(Command::SetLabels(c)).and_then(convert::labels)
    }

    /// Replaces the session's metadata blob (`MetadataSet`; the log keeps every
    /// version). Returns the event's seq, or `None` if the metadata already was this.
    pub fn set_metadata(&self, c: SetMetadata) -> Result<Option<u64>> {
        self.execute(Command::SetMetadata(c)).and_then(convert::metadata)
    }

    /// Sets and removes host state entries (`HostStateChanged`, holding only what
    /// changes). Returns the event's seq, or `None` if nothing changed.
    pub fn set_host_state(&self, c: SetHostState) -> Result<Option<u64>> {
        self.execute(Command::SetHostState(c)).and_then(convert::host_state)
    }

    /// Takes the execution lease of `session` for `owner`, for `ttl` (writer clock;
    /// 1 ms ..= [`crate::LEASE_TTL_MS_MAX`]). Granted, with a token one larger than any
    /// the session had (the grant is a `LeaseAcquired` event, so tokens survive
    /// restarts), when nobody holds a live lease; [`Rejection::Busy`] while another owner
    /// does. The holder asking again renews its lease and keeps its token. A lease on an
    /// archived session is refused (`Archived`).
    ///
    /// [`Rejection::Busy`]: crate::Rejection::Busy
    pub fn acquire_lease(&self, session: SessionId, owner: impl Into<String>, ttl: Duration) -> Result<Lease> {
        let c = AcquireLease { session, owner: owner.into(), ttl_ms: ttl_ms(ttl) };
        self.execute(Command::AcquireLease(c)).and_then(convert::lease)
    }

    /// Renews a held lease for `ttl` from now. Renewals are kept in the writer's memory,
    /// not in the log: they cost no write, and after a restart the lease expires when
    /// its grant said, after which a takeover fences the old holder. A token that is not
    /// the session's current one, or a released lease, gets [`Rejection::Fenced`].
    ///
    /// [`Rejection::Fenced`]: crate::Rejection::Fenced
    pub fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let c = RenewLease { session: lease.session, token: lease.token, ttl_ms: ttl_ms(ttl) };
        self.execute(Command::RenewLease(c)).and_then(convert::lease)
    }

    /// Releases a held lease (a `LeaseReleased` event), so another owner may take it at
    /// once. Returns false if it was released already; a token that is not the session's
    /// current one gets [`Rejection::Fenced`].
    ///
    /// [`Rejection::Fenced`]: crate::Rejection::Fenced
    pub fn release_lease(&self, lease: &Lease) -> Result<bool> {
        self.execute(Command::ReleaseLease { session: lease.session, token: lease.token })
            .and_then(convert::lease_released)
    }

    /// Appends `segment` to draft `draft_id` of `session` (creating the draft), and
    /// returns the segment's index. Drafts hold a model's partial output while it
    /// streams: readers see a segment at once, and it reaches the file with the next
    /// commit or within [`Options::draft_flush_interval`] (a crash loses at most that),
    /// outside the log's chain. The turn that carries the final message names the draft
    /// ([`CommitTurn::finalizes`]) and removes it atomically. Bounded per draft, per
    /// session and in total (`LimitExceeded` with `DraftBytes`, `SessionDraftBytes`,
    /// `DraftBytesTotal`); an archived session refuses drafts.
    pub fn append_draft(
        &self,
        session: SessionId,
        draft_id: impl Into<String>,
        segment: impl Into<Vec<u8>>,
    ) -> Result<u32> {
        let c = AppendDraft { session, draft_id: draft_id.into(), segment: segment.into() };
        self.execute(Command::AppendDraft(c)).and_then(convert::draft_appended)
    }

    /// Discards a draft and its segments (written at once). Returns false if there was
    /// none.
    pub fn discard_draft(&self, session: SessionId, draft_id: impl Into<String>) -> Result<bool> {
        self.execute(Command::DiscardDraft { session, draft_id: draft_id.into() }).and_then(convert::draft_discarded)
    }

    /// The drafts of `session`, in draft id order, each with its segments in order, as
    /// far as `max_bytes` of segments allows (see [`crate::Draft::is_complete`]; read the
    /// rest with [`Engine::draft`]).
    pub fn drafts(&self, session: SessionId, max_bytes: u64) -> Vec<crate::draft::Draft> {
        self.inner.shared.drafts.lock().read(&session, max_bytes)
    }

    /// One draft, from segment `from`, as far as `max_bytes` allows.
    pub fn draft(&self, session: SessionId, draft_id: &str, from: u32, max_bytes: u64) -> Option<crate::draft::Draft> {
        self.inner.shared.drafts.lock().read_one(&session, draft_id, from, max_bytes)
    }

    /// The drafts the file held when this engine opened: partial output of turns that
    /// never committed before the last shutdown or crash. Resume them (append more,
    /// then commit the turn that finalizes them) or discard them; nothing removes them
    /// by itself.
    pub fn abandoned_drafts(&self) -> &[crate::draft::DraftSummary] {
        &self.inner.abandoned
    }

    /// Writes every draft change still in memory now, on its own: one journal frame and
    /// its fsync, or, without a journal, one transaction of the log file (synced unless
    /// durability is [`Durability::Relaxed`]). Writes nothing when there is none.
    pub fn flush_drafts(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::FlushDrafts { reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Queues `message` in `session`'s inbox as input `input_id`, for the live turn or
    /// the next one. Returns the event's seq, or `None` for an exact retry (the same id
    /// with another message or kind is `InputConflict`). At most `inbox_inputs_max` open
    /// inputs per session.
    pub fn enqueue_input(
        &self,
        session: SessionId,
        input_id: impl Into<String>,
        message: Message,
        kind: annal_codec::InputKind,
    ) -> Result<Option<u64>> {
        let c = EnqueueInput { session, input_id: input_id.into(), message, kind };
        self.execute(Command::EnqueueInput(c)).and_then(convert::enqueued)
    }

    /// The inputs of `session` that a claim may take now: queued, and held by no live
    /// claim (a claim that expired, by the writer's clock, lets its inputs go), in queue
    /// order.
    pub fn pending_inputs(&self, session: SessionId) -> Result<Vec<crate::query::QueuedInput>> {
        self.inbox_claimable(session, self.inner.shared.clock.now_ms())
    }

    /// Claims up to `c.max` inputs for `c.owner`, fenced by the session's current lease
    /// token (`Fenced` otherwise): active-turn inputs for a live turn (one not committed
    /// yet; `TurnNotLive` otherwise), or next-turn inputs while the session is idle (no
    /// live claim for a running turn; `NotIdle` otherwise). The claim holds for
    /// `c.ttl_ms`; after that its inputs are claimable again. Claiming nothing writes
    /// nothing (`claim: None`).
    pub fn claim_inputs(&self, c: ClaimInputs) -> Result<crate::query::Claim> {
        self.execute(Command::ClaimInputs(c)).and_then(convert::claimed)
    }

    /// Gives a claim up (named by the stream seq of its `InputsClaimed`): its inputs
    /// that no turn consumed are queued again. Returns
    /// false if the claim was closed already; an unknown claim is `UnknownClaim`.
    pub fn abandon_claim(&self, session: SessionId, claim: u64) -> Result<bool> {
        self.execute(Command::AbandonClaim { session, claim }).and_then(convert::claim_abandoned)
    }

    /// Withdraws an input that no live claim holds. Returns false if it was cancelled
    /// already; a consumed or live-claimed input is `InputState`.
    pub fn cancel_input(&self, session: SessionId, input_id: impl Into<String>) -> Result<bool> {
        self.execute(Command::CancelInput { session, input_id: input_id.into() }).and_then(convert::input_cancelled)
    }

    /// A receiver that hears about every durable commit once, in commit order. A
    /// receiver more than [`SUBSCRIBER_QUEUE_MAX`] notices behind is disconnected: it
    /// still yields the notices queued before that, with no gap between them, and then
    /// reports the disconnection, never a later notice ([`Engine::subscribe_stream`]
    /// tells its consumer where to resume instead).
    ///
    /// On a closed engine the receiver reports the disconnection at once.
    pub fn subscribe(&self) -> Receiver<CommitNotice> {
        let (tx, rx) = bounded(SUBSCRIBER_QUEUE_MAX);
        self.add_subscriber(Subscriber::Channel(tx));
        rx
    }

    /// Adds a subscriber; one added after the engine closed is dropped at once (its
    /// receiving end sees the end), since nothing will be committed any more.
    pub(crate) fn add_subscriber(&self, subscriber: Subscriber) {
        let mut subscribers = self.inner.shared.subscribers.lock();
        // Under the lock: the writer clears the subscribers under it when it stops, which
        // is after `closed` is set.
        if !self.inner.closed.load(Ordering::Acquire) {
            subscribers.push(subscriber);
        }
    }

    /// Drops the projections in `set` and folds them again from the log, in one
    /// transaction, through the writer (so no commit interleaves).
    pub fn rebuild(&self, set: ProjectionSet) -> Result<RebuildStats> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Rebuild { set, reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Removes, beside the running host, every content object that no record of a
    /// session that is not purged reaches (archived sessions count as live), reading at
    /// most `rows_per_batch` content rows per writer request so commits go on between
    /// batches. Objects introduced after the collection started are not looked at. On a
    /// database written by this engine it finds nothing unless content was left
    /// unreachable by other means (a purge collects as it goes); the space it frees is
    /// reused by redb, and the file does not shrink (`annal compact` does that offline).
    /// See `docs/design.md` §7f.
    pub fn collect_garbage(&self, rows_per_batch: usize) -> Result<crate::collect::CollectReport> {
        let limits = &self.inner.shared.limits;
        let (record_max, object_max) = (limits.record_bytes_max, limits.message_object_bytes_max());
        let view = self.reader().snapshot()?;
        let through = view.seq();
        let mut marks = Box::<crate::collect::Marks>::default();
        fail_closed("collect", || marks.read(&view, through, record_max, object_max))?;
        drop(view);
        let mut report = crate::collect::CollectReport { through_seq: through, ..Default::default() };
        let mut from = Some(1);
        while let Some(start) = from {
            let sweep = crate::collect::Sweep { from: start, through, rows: rows_per_batch.max(1) };
            let (reply, rx) = oneshot::channel();
            self.send(Request::Sweep { marks, sweep, reply })?;
            let (back, swept) = rx.recv().map_err(|_| Error::Closed)??;
            marks = back;
            report.batches += 1;
            report.rows_swept += swept.rows_read;
            report.rows_rewritten += swept.rows_rewritten;
            report.objects_removed += swept.removed.len() as u64;
            report.bytes_removed += swept.bytes;
            from = swept.next;
        }
        report.reachable = marks.len();
        if report.objects_removed > 0 {
            let (reply, rx) = oneshot::channel();
            self.send(Request::CollectDone { reply })?;
            rx.recv().map_err(|_| Error::Closed)??;
        }
        Ok(report)
    }

    /// Purges a session ([`crate::purge()`]) from this engine's database, and gives the
    /// engine back with the purge's answer. The request is first decided on the running
    /// engine: a rejection (`NotFound`, `Purged`, `HasForks`, a limit) comes back with
    /// this engine, untouched. Otherwise the engine is closed, the purge runs (it needs the
    /// files to itself: it rewrites them), and the database is opened again with the same
    /// options. Every other handle of this engine (clones, fenced handles) must be dropped
    /// first; otherwise the answer is `InvalidRequest` and the others keep working. The
    /// outer error is one that left no engine to give back (the reopen failed).
    pub fn purge(self, request: &crate::purge::PurgeRequest) -> Result<(Engine, Result<crate::purge::ErasureReport>)> {
        let Some(path) = self.inner.path.clone() else {
            return Err(Error::Rejected(crate::error::Rejection::InvalidRequest {
                reason: "purge needs a database in a file".into(),
            }));
        };
        let others = Arc::strong_count(&self.inner) - 1;
        if others > 0 {
            return Err(Error::Rejected(crate::error::Rejection::InvalidRequest {
                reason: format!("purge needs the engine to itself: {others} other handle(s) are open"),
            }));
        }
        let options = self.inner.options.clone();
        let decided = match crate::purge::check(&self, &options, request) {
            Ok(decided) => decided,
            Err(e) => return Ok((self, Err(e))),
        };
        // Decided on this engine's last handle; once it is closed nothing else writes the
        // file before the erasure takes it.
        self.close()?;
        let purged = crate::purge::erase(&path, &options, &decided, request);
        let engine = Engine::open_with(&path, options)?;
        Ok((engine, purged))
    }

    /// Checkpoints the whole delta now and waits until it is in the projections file
    /// (commits queued before it are included). Never needed for correctness: queries
    /// read the delta, and an open folds whatever the last checkpoint missed.
    pub fn checkpoint(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Checkpoint { reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Appends records exported from another database (for example by `annal export`)
    /// exactly as they are: same sequence numbers, stream sequences and timestamps, so
    /// revision ids and, under the same key, chain hashes are reproduced. `content` holds
    /// the canonical bytes of every content object the records refer to that this
    /// database does not hold yet. The first record must follow the current tip. Runs in
    /// one transaction: on any error nothing is appended
    /// ([`crate::Rejection::InvalidImport`] names the record). Subscribers hear one
    /// notice for the records appended, before this returns.
    pub fn import(&self, records: Vec<annal_codec::Record>, content: Vec<Vec<u8>>) -> Result<ImportStats> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Import { records, content, reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Copies whole sessions exported from another database (by
    /// [`Reader::export_sessions`], or `annal export --session`) into this one, which may
    /// hold other sessions. Each copied record gets the next global sequence number here
    /// and keeps its session id, stream sequence number and event byte for byte, so the
    /// fold recomputes the same revision ids; its `committed_at` is the original, or this
    /// database's clock where the original would go back in time. Content objects this
    /// database holds already are not stored again.
    ///
    /// A session held here with exactly the same events is skipped and reported in
    /// [`CopyOutcome::already_present`], so copying the same export twice writes nothing
    /// the second time. A session held here with any other history is
    /// [`Rejection::SessionConflict`]; a fork whose parent is neither here nor in the
    /// export is [`Rejection::ForkParentMissing`], and one whose parent here has moved
    /// past the fork's revision [`Rejection::ForkParentMoved`]; a record that does not
    /// fold is [`Rejection::InvalidImport`] at its seq in the export. The copy runs on
    /// the writer in one transaction and one fsync: on any error nothing is written.
    /// Subscribers hear one notice for the records appended.
    ///
    /// [`Rejection::SessionConflict`]: crate::Rejection::SessionConflict
    /// [`Rejection::ForkParentMissing`]: crate::Rejection::ForkParentMissing
    /// [`Rejection::ForkParentMoved`]: crate::Rejection::ForkParentMoved
    /// [`Rejection::InvalidImport`]: crate::Rejection::InvalidImport
    pub fn copy_in(&self, export: SessionExport) -> Result<CopyOutcome> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Copy { export, reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// The read side of this engine (the same as dereferencing it).
    pub fn reader(&self) -> &Reader {
        &self.inner.reader
    }

    /// Flushes and stops the writer. Later calls on any clone return `Closed`.
    ///
    /// When this is the last handle, each file that is small and at least an eighth free
    /// is then compacted ([`Options::compact_on_close_bytes_max`]); an I/O error of that
    /// compaction is returned, with every commit already durable. Damage that the
    /// compaction meets in the projections file is not an error: that file is a cache of
    /// folds of the log, and is removed (the next open folds the log again).
    pub fn close(self) -> Result<()> {
        self.inner.shutdown();
        let max = self.inner.options.compact_on_close_bytes_max;
        if max == 0 || self.inner.shared.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        let shared = &self.inner.shared;
        let [log_length, projections_length] = self.inner.lengths.clone();
        // Each file with whether it is a cache of folds of the log (the projections file).
        let files =
            [(shared.log_db.clone(), log_length, false), (shared.projections.clone(), projections_length, true)];
        // The files are this engine's alone once every other holder is gone: the last
        // handle drops the engine's threads, views and caches here.
        drop(self);
        // The projections file first, while the log file (and its lock) is still held: no
        // other engine can have opened the database meanwhile.
        for (db, length, cache) in files.into_iter().rev() {
            let Some(mut db) = Arc::try_unwrap(db).ok().and_then(Db::into_database) else {
                continue;
            };
            let compacted = fail_closed("compact at close", || crate::compact::compact_at_close(&mut db, &length, max));
            drop(Db::new(db));
            match (cache, compacted) {
                // Damage that only the compaction met in the projections file, a cache of
                // folds of the log: the file goes, and the next open folds the log again.
                (true, Err(Error::Corrupt { .. })) => {
                    if let crate::compact::FileLength::Path(path) = &length {
                        std::fs::remove_file(path)?;
                        crate::purge::sync_dir(path)?;
                    }
                }
                (_, compacted) => drop(compacted?),
            }
        }
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

    /// The database, taken out (its drop is then the caller's).
    fn into_database(mut self) -> Option<Database> {
        self.0.take()
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

/// Opens the log file at `path` for writing, and first finishes an erasure a crash
/// interrupted (the check needs the file open for writing: after a crash only such an
/// open recovers it).
fn open_log_file(path: &Path, options: &Options) -> Result<Database> {
    let log = open_file(path, options)?;
    if !log.begin_read().map(|txn| crate::purge::unfinished_in(&txn)).unwrap_or(false) {
        return Ok(log);
    }
    drop(log);
    crate::purge::finish(path)?;
    open_file(path, options)
}

/// Opens (or creates) one file. A damaged file can make a plain open fail; redb's
/// integrity check reads every page, verifies its checksum and rebuilds the allocator
/// state, or reports the damage.
fn open_file(path: &Path, options: &Options) -> Result<Database> {
    match fail_closed("open", || Ok(builder(options).create(path)?)) {
        Ok(db) => Ok(db),
        // A power loss while the file was first being created can leave its new length
        // on disk without redb's header: zeros only. Nothing was ever committed in such a
        // file, so it starts again as a new database.
        Err(e) if never_written(path).unwrap_or(false) => {
            reset_unwritten(path).map_err(|io| Error::storage(format!("{e}; and resetting the empty file: {io}")))?;
            fail_closed("open", || Ok(builder(options).create(path)?))
        }
        Err(Error::Corrupt { .. }) => fail_closed("open with integrity check", || {
            let mut b = builder(options);
            b.set_check_integrity_on_open(true);
            Ok(b.create(path)?)
        }),
        Err(e) => Err(e),
    }
}

/// Whether the file at `path` holds zeros only (or nothing): no redb header, so no commit
/// was ever made in it. Reads until the first non-zero byte, which for a real database
/// is its first.
fn never_written(path: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(true);
        }
        if buf[..n].iter().any(|b| *b != 0) {
            return Ok(false);
        }
    }
}

/// Truncates a never-written file to nothing, under the same exclusive lock redb takes,
/// and only if it still holds zeros only once the lock is held (another process may have
/// created the database meanwhile).
fn reset_unwritten(path: &Path) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    file.try_lock().map_err(std::io::Error::other)?;
    if never_written(path)? {
        file.set_len(0)?;
        file.sync_all()?;
    }
    file.unlock()
}

/// Opens the projections file, or, if it is damaged (it does not open, or its metadata
/// does not read), deletes it and starts a new one: it is only a cache of folds of the
/// log, which the open then folds again. Called with the log file already open for
/// writing, so no other writer can hold the projections file (a read-only opener that
/// has it open keeps reading its unlinked copy).
fn open_projections(path: &Path, options: &Options) -> Result<Database> {
    let readable = |db: &Database| -> Result<()> {
        fail_closed("open projections", || {
            let txn = db.begin_read()?;
            if let Ok(meta) = txn.open_table(crate::tables::META) {
                for key in [crate::tables::meta_keys::FORMAT, crate::tables::meta_keys::CHECKPOINT] {
                    meta.get(key)?;
                }
            }
            Ok(())
        })
    };
    match open_file(path, options) {
        Ok(db) if readable(&db).is_ok() => Ok(db),
        Ok(db) => {
            drop(Db::new(db));
            std::fs::remove_file(path)?;
            open_file(path, options)
        }
        Err(Error::Corrupt { .. }) | Err(Error::Storage(_)) if path.exists() => {
            std::fs::remove_file(path)?;
            open_file(path, options)
        }
        Err(e) => Err(e),
    }
}

/// Refuses, before anything is opened for writing, a file whose format or chain key this
/// engine cannot use (a format-1 file names `annal migrate`), or a projections file named
/// in place of its log file, so that such an open changes no byte and creates no
/// projections file. A file that cannot be opened read-only here (held exclusively, or
/// not a database) is left to the normal open.
fn refuse_unreadable_format(path: &Path, options: &Options) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let chain = options.chain_key.map_or_else(LogChain::plain, LogChain::keyed);
    let mut b = redb::Builder::new();
    b.set_concurrency_mode(ConcurrencyMode::SingleWriter);
    let Ok(Ok(db)) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.open_read_only(path))) else {
        return Ok(());
    };
    let txn = match db.begin_read() {
        Ok(txn) => txn,
        Err(_) => return Ok(()),
    };
    match fail_closed("open", || crate::log::check_log(&txn, &chain)) {
        Err(
            e @ (Error::MigrationRequired { .. }
            | Error::UnsupportedFormat { .. }
            | Error::KeyMismatch { .. }
            | Error::Rejected(_)),
        ) => Err(e),
        _ => Ok(()),
    }
}

/// What [`recover_log`] did to a database's log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecovery {
    /// The log's last seq, counting what the journal held.
    pub tip_seq: u64,
    /// Records the journal held past the log file (a crash), now appended to it.
    pub records_taken_in: u64,
    /// A content collection was interrupted: the projections file may still list ids
    /// whose content is gone, and the next open folds the content-id index again.
    pub collection_interrupted: bool,
}

/// Brings the log file of the database at `path` to where an open for writing brings
/// it, and no further: it finishes an erasure a crash interrupted, upgrades a file of an
/// older readable format, checks the chain key, appends what the journal holds past the
/// log file (a crash) and removes the journal, as a clean close leaves it. The
/// projections file is not opened, so nothing is folded.
///
/// This is the first step of an offline rebuild of every projection (`annal rebuild`):
/// an open would first fold the projections up to the log (all of them, when the
/// projections file is missing), only for the rebuild to fold them again. The file must
/// exist (it is never created) and no other process may have it open for writing.
pub fn recover_log(path: impl AsRef<Path>, options: &Options) -> Result<LogRecovery> {
    let path = path.as_ref();
    options.limits.validate()?;
    if !path.is_file() {
        return Err(Error::storage(format!("{} is not a file", path.display())));
    }
    refuse_unreadable_format(path, options)?;
    fail_closed("recover", || {
        let log = open_log_file(path, options)?;
        let chain = options.chain_key.map_or_else(LogChain::plain, LogChain::keyed);
        let before = crate::log::open_log(&log, &chain)?;
        let tip = match crate::journal::journal_paths(path).iter().any(|p| p.exists()) {
            true => {
                let mut journal = Journal::open(path, 0)?;
                let tip = crate::journal::recover(&log, &mut journal, before, &chain)?;
                journal.shred()?;
                tip
            }
            false => before,
        };
        let collection_interrupted = crate::collect::collecting_in(&log.begin_read()?);
        Ok(LogRecovery { tip_seq: tip.seq, records_taken_in: tip.seq - before.seq, collection_interrupted })
    })
}

/// Every file of the database at `path`, whether it exists or not: the log file, its
/// projections file and its two journal files (`crate::journal`). A copy of all four,
/// taken while no engine has them open (or as a SIGKILL leaves them), is the database.
pub fn database_files(path: &Path) -> [PathBuf; 4] {
    let [first, second] = crate::journal::journal_paths(path);
    [path.to_path_buf(), projections_path(path), first, second]
}

/// The projections file of the database at `path`: the same name with
/// `.projections` appended. Deleting it loses nothing; the next open rebuilds it.
pub fn projections_path(path: impl AsRef<Path>) -> PathBuf {
    let mut name = path.as_ref().as_os_str().to_owned();
    name.push(".projections");
    PathBuf::from(name)
}
