//! The four session stores the harness compares, and two probes that take part in the
//! commit phase only, behind one trait.
//!
//! Every store commits each op durably before it returns: annal through its group
//! commit, SQLite with `synchronous=FULL` in WAL mode, JSON Lines with `sync_data` per
//! append, and the naive redb store with `Durability::Immediate`. The probes do too: the
//! floor with one `fdatasync` per group, the bare redb insert with `Durability::Immediate`.

pub mod annal_store;
pub mod floor;
pub mod jsonl;
pub mod naive_redb;
pub mod redb_insert;
pub mod sqlite;

use crate::workload::{Msg, Op, Turn};
use crate::Result;
use std::path::{Path, PathBuf};

/// Which store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreKind {
    /// annal, default options.
    Annal,
    /// annal with the other concurrency mode than the default (multi-process readers
    /// on or off), to measure what the choice costs.
    AnnalOtherMode,
    /// annal storing content under `Compression::Zstd` instead of the default lz4, to
    /// measure what the smaller content costs.
    AnnalZstd,
    /// SQLite event table plus projection tables.
    Sqlite,
    /// One JSON Lines file per session.
    Jsonl,
    /// redb with JSON events and a JSON snapshot rewritten every turn.
    NaiveRedb,
    /// The floor: a group-committed, hash-chained log with its state kept as typed values
    /// in memory (`floor.rs`), with what [`floor::Behind`] says behind its commit path
    /// ([`floor::Behind::NOTHING`] in the default comparison: no projection written);
    /// the commit phase only.
    Floor(floor::Behind),
    /// The bare redb commit: one row inserted in one durable transaction, in annal's
    /// default concurrency mode (`redb_insert.rs`); the commit phase only.
    RedbInsert,
}

impl StoreKind {
    /// Every store, annal first.
    pub const ALL: [StoreKind; 8] = [
        StoreKind::Annal,
        StoreKind::AnnalOtherMode,
        StoreKind::AnnalZstd,
        StoreKind::Sqlite,
        StoreKind::Jsonl,
        StoreKind::NaiveRedb,
        StoreKind::Floor(floor::Behind::NOTHING),
        StoreKind::RedbInsert,
    ];

    /// The probes run only when `--stores` names them.
    pub const PROBES: [StoreKind; 3] = [
        StoreKind::Floor(floor::Behind { log: true, checkpoint: false }),
        StoreKind::Floor(floor::Behind { log: false, checkpoint: true }),
        StoreKind::Floor(floor::Behind { log: true, checkpoint: true }),
    ];

    /// Every store `--stores` names: [`StoreKind::ALL`], then [`StoreKind::PROBES`].
    pub fn known() -> impl Iterator<Item = StoreKind> {
        StoreKind::ALL.into_iter().chain(StoreKind::PROBES)
    }

    /// The name used in results.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Annal => "annal",
            StoreKind::AnnalOtherMode => "annal_other_mode",
            StoreKind::AnnalZstd => "annal_zstd",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Jsonl => "jsonl",
            StoreKind::NaiveRedb => "naive_redb",
            StoreKind::Floor(floor::Behind { log: false, checkpoint: false }) => "floor",
            StoreKind::Floor(floor::Behind { log: true, checkpoint: false }) => "floor_log",
            StoreKind::Floor(floor::Behind { log: false, checkpoint: true }) => "floor_checkpoint",
            StoreKind::Floor(floor::Behind { log: true, checkpoint: true }) => "floor_log_checkpoint",
            StoreKind::RedbInsert => "redb_insert",
        }
    }

    /// Whether the store takes part in the commit phase only (the floor and the bare
    /// redb insert, which read nothing back and keep nothing to rebuild).
    pub fn commits_only(self) -> bool {
        matches!(self, StoreKind::Floor(_) | StoreKind::RedbInsert)
    }

    /// Opens (or creates) the store in directory `dir`.
    pub fn open(self, dir: &Path) -> Result<Box<dyn SessionStore>> {
        std::fs::create_dir_all(dir)?;
        Ok(match self {
            StoreKind::Annal => Box::new(annal_store::AnnalStore::open(dir)?),
            StoreKind::AnnalOtherMode => {
                let default = annal::Options::default();
                let options = annal::Options { multi_process_readers: !default.multi_process_readers, ..default };
                Box::new(annal_store::AnnalStore::open_with(dir, options)?)
            }
            StoreKind::AnnalZstd => {
                let options = annal::Options { compression: annal::Compression::Zstd, ..annal::Options::default() };
                Box::new(annal_store::AnnalStore::open_with(dir, options)?)
            }
            StoreKind::Sqlite => Box::new(sqlite::SqliteStore::open(dir)?),
            StoreKind::Jsonl => Box::new(jsonl::JsonlStore::open(dir)?),
            StoreKind::NaiveRedb => Box::new(naive_redb::NaiveRedbStore::open(dir)?),
            StoreKind::Floor(behind) => Box::new(floor::FloorStore::open(dir, behind)?),
            StoreKind::RedbInsert => Box::new(redb_insert::RedbInsertStore::open(dir)?),
        })
    }

    /// Gives the free space inside the closed store's files back, the way its own tools
    /// do: redb's compaction (`annal compact` for annal), SQLite's `VACUUM` and a WAL
    /// checkpoint; JSON Lines files and the commit-phase-only probes have none.
    pub fn compact(self, dir: &Path) -> Result<()> {
        match self {
            StoreKind::Annal | StoreKind::AnnalOtherMode | StoreKind::AnnalZstd => {
                annal::compact(dir.join(annal_store::FILE), annal::Options::default())?;
                Ok(())
            }
            StoreKind::NaiveRedb => compact_redb(&dir.join(naive_redb::FILE)),
            StoreKind::Sqlite => sqlite::vacuum(dir),
            StoreKind::Jsonl | StoreKind::Floor(_) | StoreKind::RedbInsert => Ok(()),
        }
    }

    /// Creates the store in the empty directory `dir` holding `ids.len()` sessions, fast
    /// (large transactions, durable at the end), for the open-time benchmark. Session
    /// `i` gets id `ids[i]`, the system prompt, then `turns[i]`. The store is closed
    /// afterwards.
    pub fn bulk_load(self, dir: &Path, ids: &[[u8; 16]], system: &Msg, turns: &[Vec<Turn>]) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        match self {
            StoreKind::Annal | StoreKind::AnnalOtherMode => {
                annal_store::bulk_load(dir, ids, system, turns, annal::Compression::default())
            }
            StoreKind::AnnalZstd => annal_store::bulk_load(dir, ids, system, turns, annal::Compression::Zstd),
            StoreKind::Sqlite => sqlite::bulk_load(dir, ids, system, turns),
            StoreKind::Jsonl => jsonl::bulk_load(dir, ids, system, turns),
            StoreKind::NaiveRedb => naive_redb::bulk_load(dir, ids, system, turns),
            StoreKind::Floor(_) => Err("the floor takes part in the commit phase only".into()),
            StoreKind::RedbInsert => Err("the bare redb insert takes part in the commit phase only".into()),
        }
    }
}

/// A session as its committer sees it. The revision fields are used by annal, whose
/// writes name the head they expect, as a host's would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The session id.
    pub id: [u8; 16],
    /// The current head revision (annal).
    pub revision: [u8; 32],
    /// The revision before the last compaction (annal).
    pub before_compaction: [u8; 32],
}

impl Cursor {
    /// A cursor for a new session.
    pub fn new(id: [u8; 16]) -> Cursor {
        Cursor { id, revision: [0; 32], before_compaction: [0; 32] }
    }
}

/// The head of a session, as every store can report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Messages in the current transcript.
    pub message_count: u64,
    /// Events in the session.
    pub events: u64,
}

/// A session store under test.
pub trait SessionStore: Send + Sync {
    /// Which store this is.
    fn kind(&self) -> StoreKind;

    /// Creates a session whose transcript starts with `system`, durably.
    fn create(&self, id: [u8; 16], system: &Msg) -> Result<Cursor>;

    /// Applies one op durably. A fork creates a session with a fresh id.
    fn apply(&self, cursor: &mut Cursor, op: &Op) -> Result<()>;

    /// The session's head.
    fn head(&self, id: [u8; 16]) -> Result<Head>;

    /// Reads messages `offset..offset+limit` of the current transcript; returns the body
    /// bytes read.
    fn page(&self, id: [u8; 16], offset: u64, limit: u64) -> Result<u64>;

    /// Drops every projection and folds it again from the log; returns events folded.
    fn rebuild(&self) -> Result<u64>;

    /// fsyncs this store asked for so far, when it can count them.
    fn syncs(&self) -> Option<u64> {
        None
    }

    /// Bytes this store wrote to its files so far, when it can count them.
    fn written_bytes(&self) -> Option<u64> {
        None
    }

    /// [`SessionStore::written_bytes`] by file (a name for each), when the store
    /// counts its files apart; empty otherwise.
    fn written_bytes_by_file(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// Finishes background work the commits left behind (annal: checkpoints the delta),
    /// so that the bytes it writes are counted with the commits that caused them.
    fn quiesce(&self) -> Result<()> {
        Ok(())
    }

    /// Flushes and closes.
    fn close(self: Box<Self>) -> Result<()>;
}

/// Compacts a plain redb file (not an annal database) until a pass frees nothing.
fn compact_redb(path: &Path) -> Result<()> {
    let mut db = redb::Database::open(path)?;
    for _ in 0..8 {
        if !db.compact()? {
            break;
        }
    }
    Ok(())
}

/// Total bytes of the files under `dir`.
pub fn disk_bytes(dir: &Path) -> Result<u64> {
    files_bytes(dir, |meta| meta.len())
}

/// Bytes the file system allocated to every file under `dir` (`du`: 512-byte blocks),
/// which leaves out the holes of a file grown with `set_len` and never written there.
pub fn allocated_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    files_bytes(dir, |meta| meta.blocks() * 512)
}

fn files_bytes(dir: &Path, size: impl Fn(&std::fs::Metadata) -> u64) -> Result<u64> {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += size(&meta);
            }
        }
    }
    Ok(total)
}

/// A session id as lower-case hex.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh session id for the `counter`-th fork a store makes. Harness sessions never
/// start with 0xF0, so fork ids never collide with them.
pub fn fork_id(counter: u64) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[0] = 0xF0;
    id[8..].copy_from_slice(&counter.to_be_bytes());
    id
}
