//! The bare redb commit: what one durable commit costs redb alone, in the concurrency
//! mode annal opens its files in by default, measured beside the real stores so that
//! annal's one-committer latency can be judged against it in the same run.
//!
//! What one commit does: one write transaction (`Durability::Immediate`) that inserts one
//! row into one table, keyed by a `u64` sequence number, whose value is the content bytes
//! the op carries ([`Op::content`], concatenated). The database is opened with
//! `ConcurrencyMode::SingleWriter`, the mode annal's default options (durable, readers in
//! other processes allowed) choose, in which redb commits in two phases. Concurrent
//! committers queue on redb's single write transaction: there is no group commit, so a
//! commit is the bare per-commit cost.
//!
//! Like annal, the database sits on redb's file backend wrapped in [`FaultyBackend`] with
//! no faults switched on, which counts `sync_data` calls and the bytes written. It is a
//! probe, not a store: it keeps no session state, answers no reads and has nothing to
//! rebuild, so only the commit phase of the comparison runs it.

use super::{Cursor, Head, SessionStore, StoreKind};
use crate::workload::{Msg, Op};
use crate::Result;
use annal::fault::{Faults, FaultyBackend};
use redb::backends::FileBackend;
use redb::{ConcurrencyMode, Database, Durability, TableDefinition};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The database file inside the store's directory.
pub const FILE: &str = "insert.redb";

const ROWS: TableDefinition<u64, &[u8]> = TableDefinition::new("rows");

/// The bare redb commit behind the [`SessionStore`] trait (the commit phase only).
pub struct RedbInsertStore {
    db: Database,
    faults: Faults,
    next: AtomicU64,
}

impl RedbInsertStore {
    /// Creates `dir/insert.redb` (truncating an old one) in `ConcurrencyMode::SingleWriter`
    /// on a counted backend, and its table.
    pub fn open(dir: &Path) -> Result<RedbInsertStore> {
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(dir.join(FILE))?;
        let faults = Faults::new();
        let backend = FaultyBackend::new(FileBackend::new(file)?, faults.clone());
        let db =
            redb::Builder::new().set_concurrency_mode(ConcurrencyMode::SingleWriter).create_with_backend(backend)?;
        let txn = db.begin_write()?;
        txn.open_table(ROWS)?;
        txn.commit()?;
        Ok(RedbInsertStore { db, faults, next: AtomicU64::new(0) })
    }

    /// Inserts `value` under the next sequence number in one durable transaction.
    fn insert(&self, value: &[u8]) -> Result<()> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut rows = txn.open_table(ROWS)?;
            rows.insert(self.next.fetch_add(1, Ordering::Relaxed), value)?;
        }
        txn.commit()?;
        Ok(())
    }
}

impl SessionStore for RedbInsertStore {
    fn kind(&self) -> StoreKind {
        StoreKind::RedbInsert
    }

    fn create(&self, id: [u8; 16], system: &Msg) -> Result<Cursor> {
        self.insert(&system.body)?;
        Ok(Cursor::new(id))
    }

    fn apply(&self, _: &mut Cursor, op: &Op) -> Result<()> {
        self.insert(&op.content().concat())
    }

    fn head(&self, _: [u8; 16]) -> Result<Head> {
        Err("the bare redb commit keeps no session state".into())
    }

    fn page(&self, _: [u8; 16], _: u64, _: u64) -> Result<u64> {
        Err("the bare redb commit keeps no transcript to read".into())
    }

    fn rebuild(&self) -> Result<u64> {
        Err("the bare redb commit keeps no projection to rebuild".into())
    }

    fn syncs(&self) -> Option<u64> {
        Some(self.faults.syncs())
    }

    fn written_bytes(&self) -> Option<u64> {
        Some(self.faults.bytes_written())
    }

    fn close(self: Box<Self>) -> Result<()> {
        drop(self.db);
        Ok(())
    }
}
