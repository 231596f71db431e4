//! The redb tables, each defined exactly once, and the [`Store`] over a write
//! transaction.
//!
//! Immutable and authoritative: [`LOG`], [`SESSION_LOG`], [`CONTENT`], [`META`].
//! Disposable: one `&[u8] → &[u8]` table per [`Table`], named `p.*`.

use crate::error::{Error, Location, Result};
use crate::projection::Projection;
use crate::store::{Store, Table};
use annal_codec::{ChainHash, ContentId, SessionId};
use redb::{ReadableTable, TableDefinition, WriteTransaction};

/// Global sequence → encoded record.
pub const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// (session id, stream sequence) → global sequence.
pub const SESSION_LOG: TableDefinition<([u8; 16], u64), u64> = TableDefinition::new("session_log");
/// Content id → canonical bytes.
pub const CONTENT: TableDefinition<[u8; 32], &[u8]> = TableDefinition::new("content");
/// Format version, log tip, key check, projection versions and cursors.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// The redb definition of a projection table.
pub fn projection_table(t: Table) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
    TableDefinition::new(t.name())
}

/// The database format version written in `meta`.
pub const FORMAT: u32 = 1;

/// Meta keys.
pub mod meta_keys {
    /// u32 LE: the database format.
    pub const FORMAT: &str = "format";
    /// u64 LE seq ‖ 32-byte chain hash: the log tip.
    pub const TIP: &str = "tip";
    /// 32 bytes: keyed hash recognising the chain key (absent for a plain chain).
    pub const KEY_CHECK: &str = "key_check";

    /// u32 LE: the fold version a projection was built with.
    pub fn version(p: crate::Projection) -> String {
        format!("projection.{}.version", p.name())
    }

    /// u64 LE: the last seq folded into a projection.
    pub fn cursor(p: crate::Projection) -> String {
        format!("projection.{}.cursor", p.name())
    }
}

/// Encodes the meta tip value.
pub fn encode_tip(seq: u64, hash: &ChainHash) -> [u8; 40] {
    let mut v = [0u8; 40];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    v[8..].copy_from_slice(&hash.0);
    v
}

/// Decodes the meta tip value.
pub fn decode_tip(bytes: &[u8]) -> Result<(u64, ChainHash)> {
    if bytes.len() != 40 {
        return Err(Error::corrupt(Location::Meta { key: meta_keys::TIP.into() }, "tip is not 40 bytes"));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&bytes[..8]);
    let mut h = [0u8; 32];
    h.copy_from_slice(&bytes[8..]);
    Ok((u64::from_le_bytes(seq), ChainHash(h)))
}

/// Reads a little-endian integer stored in meta.
pub fn meta_u64(bytes: &[u8]) -> Option<u64> {
    match bytes.len() {
        4 => Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as u64),
        8 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(bytes);
            Some(u64::from_le_bytes(a))
        }
        _ => None,
    }
}

/// Writes the version and cursor of `p`.
pub fn write_projection_meta(meta: &mut redb::Table<&str, &[u8]>, p: Projection, cursor: u64) -> Result<()> {
    meta.insert(meta_keys::version(p).as_str(), p.version().to_le_bytes().as_slice())?;
    meta.insert(meta_keys::cursor(p).as_str(), cursor.to_le_bytes().as_slice())?;
    Ok(())
}

/// Creates every table that does not exist yet.
pub fn create_all(txn: &WriteTransaction) -> Result<()> {
    txn.open_table(LOG)?;
    txn.open_table(SESSION_LOG)?;
    txn.open_table(CONTENT)?;
    txn.open_table(META)?;
    for t in Table::ALL {
        txn.open_table(projection_table(t))?;
    }
    Ok(())
}

/// The fold's [`Store`] over the projection tables of a write transaction.
pub struct RedbStore<'txn> {
    tables: Vec<redb::Table<'txn, &'static [u8], &'static [u8]>>,
}

impl<'txn> RedbStore<'txn> {
    /// Opens every projection table of `txn`.
    pub fn open(txn: &'txn WriteTransaction) -> Result<RedbStore<'txn>> {
        let tables = Table::ALL.iter().map(|t| txn.open_table(projection_table(*t))).collect::<Result<Vec<_>, _>>()?;
        Ok(RedbStore { tables })
    }
}

impl Store for RedbStore<'_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.tables[table.index()].get(key)?.map(|g| g.value().to_vec()))
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        self.tables[table.index()].insert(key, value)?;
        Ok(())
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        self.tables[table.index()].remove(key)?;
        Ok(())
    }
}

/// A read-only [`Store`] over a read transaction; tables open on first use.
pub struct ReadStore<'a> {
    txn: &'a redb::ReadTransaction,
    tables: Vec<std::cell::OnceCell<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>>,
}

impl<'a> ReadStore<'a> {
    /// A store over `txn`.
    pub fn new(txn: &'a redb::ReadTransaction) -> ReadStore<'a> {
        ReadStore { txn, tables: Table::ALL.iter().map(|_| std::cell::OnceCell::new()).collect() }
    }

    /// The opened projection table.
    pub fn table(&self, t: Table) -> Result<&redb::ReadOnlyTable<&'static [u8], &'static [u8]>> {
        let cell = &self.tables[t.index()];
        if let Some(table) = cell.get() {
            return Ok(table);
        }
        let table = self.txn.open_table(projection_table(t))?;
        Ok(cell.get_or_init(|| table))
    }
}

impl Store for ReadStore<'_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.table(table)?.get(key)?.map(|g| g.value().to_vec()))
    }
    fn put(&mut self, _: Table, _: &[u8], _: &[u8]) -> Result<()> {
        Err(Error::Storage("read-only store".into()))
    }
    fn remove(&mut self, _: Table, _: &[u8]) -> Result<()> {
        Err(Error::Storage("read-only store".into()))
    }
}

/// The last stream sequence of `session` in `session_log` (0 if none).
pub fn last_stream_seq(t: &impl ReadableTable<([u8; 16], u64), u64>, session: &SessionId) -> Result<u64> {
    let mut range = t.range((session.0, 0)..=(session.0, u64::MAX))?;
    Ok(match range.next_back() {
        Some(entry) => entry?.0.value().1,
        None => 0,
    })
}

/// Reads and verifies a content object: its bytes must hash to its id.
pub fn read_content(t: &impl ReadableTable<[u8; 32], &'static [u8]>, id: &ContentId) -> Result<Option<Vec<u8>>> {
    let Some(guard) = t.get(id.0)? else {
        return Ok(None);
    };
    let bytes = guard.value().to_vec();
    if annal_codec::content_id(&bytes) != *id {
        return Err(Error::corrupt(Location::Content { id: id.to_hex() }, "bytes do not hash to the id"));
    }
    Ok(Some(bytes))
}
