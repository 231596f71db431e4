//! The redb tables, each defined exactly once: annal's on-disk format. The definitions,
//! the meta keys and the key and tip encodings are public so that offline tools and
//! tests can read (and, for tamper tests, damage) the files the way `docs/design.md` §5
//! describes them; writing goes through the engine (the appender in the log module, the
//! checkpointer, rebuild and migrate), whose storage internals are private.
//!
//! The log file holds what is authoritative, written only by appending: [`LOG`],
//! [`crate::pieces::PIECES`] (and, in files of earlier formats, [`CONTENT`]), the ids of
//! each content row in [`CONTENT_IDS`], and [`META`]. The projections file beside it holds what is disposable:
//! every projection row in [`PROJECTIONS`], under a physical key that names its logical
//! [`Table`] (see [`physical_key`]), and the projections' versions and cursors in its own
//! [`META`].

use crate::error::{Error, Location, Result};
use crate::projection::Projection;
use crate::store::{Store, Table};
use annal_codec::ChainHash;
use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};

/// Global sequence → encoded record.
pub const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Global sequence → the content row of the objects that record introduced
/// (`annal_codec::content`), whole: files of formats 2 to 4. This format keeps rows in
/// pieces ([`crate::pieces::PIECES`]) and reads these as they are
/// ([`crate::pieces::ContentRows`]).
pub const CONTENT: TableDefinition<u64, &[u8]> = TableDefinition::new("content_rows");
/// Global sequence → the ids of the objects in that record's content row, 32 bytes each,
/// in row order: what a fold needs of a content row (the objects the record introduced)
/// without reading the row. Kept in step with the rows by [`crate::pieces::ContentWriter`].
/// An empty value stands for a row that did not parse when it was written: a reader reads
/// the row itself. It covers every row at or after the seq in
/// [`meta_keys::CONTENT_IDS_FROM`]; rows before that (written by a release of format 5 or
/// earlier) are read for their ids.
pub const CONTENT_IDS: TableDefinition<u64, &[u8]> = TableDefinition::new("content_ids");
/// Log file: format version, log tip, key check. Projections file: format version,
/// projection versions and cursors, and the chain hash at the checkpoint.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// Every projection row (projections file). Session-scoped tables are stored
/// session-major (`0x00 ‖ session ‖ tag ‖ rest`), the global ones table-major
/// (`tag ‖ key`), so the rows of one session share a few B-tree pages.
pub const PROJECTIONS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("projections");

/// The tables of format 1 files, read only by the migration.
pub(crate) mod legacy {
    use redb::TableDefinition;
    /// (session id, stream sequence) → global sequence.
    pub const SESSION_LOG: TableDefinition<([u8; 16], u64), u64> = TableDefinition::new("session_log");
    /// Content id → canonical bytes.
    pub const CONTENT: TableDefinition<[u8; 32], &[u8]> = TableDefinition::new("content");
    /// Projection rows kept in the log file.
    pub const PROJECTIONS: redb::TableDefinition<&[u8], &[u8]> = TableDefinition::new("projections");
}

/// The physical key in [`PROJECTIONS`] of `key` in logical table `t`.
pub fn physical_key(t: Table, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 2);
    physical_key_into(t, key, &mut k);
    k
}

/// [`physical_key`], appended to `out`.
pub(crate) fn physical_key_into(t: Table, key: &[u8], out: &mut Vec<u8>) {
    if t.session_scoped() && key.len() >= 16 {
        out.push(0);
        out.extend_from_slice(&key[..16]);
        out.push(t.tag());
        out.extend_from_slice(&key[16..]);
    } else {
        out.push(t.tag());
        out.extend_from_slice(key);
    }
}

/// [`physical_key`], written at the start of `out` (which holds at least `key.len() + 2`
/// bytes); returns its length.
pub(crate) fn physical_key_into_slice(t: Table, key: &[u8], out: &mut [u8]) -> usize {
    if t.session_scoped() && key.len() >= 16 {
        out[0] = 0;
        out[1..17].copy_from_slice(&key[..16]);
        out[17] = t.tag();
        out[18..key.len() + 2].copy_from_slice(&key[16..]);
    } else {
        out[0] = t.tag();
        out[1..key.len() + 1].copy_from_slice(key);
        return key.len() + 1;
    }
    key.len() + 2
}

/// The logical table and key of a physical key, if it is well formed.
pub fn logical_key(physical: &[u8]) -> Option<(Table, Vec<u8>)> {
    match physical.split_first()? {
        (0, rest) if rest.len() >= 17 => {
            let t = Table::from_tag(rest[16]).filter(|t| t.session_scoped())?;
            let mut k = rest[..16].to_vec();
            k.extend_from_slice(&rest[17..]);
            Some((t, k))
        }
        // A session-scoped table's key shorter than a session id is stored as a global
        // one's (see `physical_key_into`).
        (tag, rest) => {
            Table::from_tag(*tag).filter(|t| !t.session_scoped() || rest.len() < 16).map(|t| (t, rest.to_vec()))
        }
    }
}

pub(crate) fn bad_physical(physical: &[u8]) -> Error {
    Error::corrupt(
        Location::Projection { table: PROJECTIONS.name(), key: crate::store::hex(physical) },
        "not a projection key",
    )
}

/// Every row of logical table `t` at a view, in key order (for tools and tests).
pub fn projection_rows(view: &crate::View, t: Table) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut rows = Vec::new();
    view.scan(t, &[], |k, v| {
        rows.push((k.to_vec(), v.to_vec()));
        Ok(true)
    })?;
    Ok(rows)
}

/// Writes a run of rows through one redb cursor at `table`'s end: `fill` inserts them
/// with `insert_before`, each key above the table's last one and above the key before
/// it. redb buffers such a run and builds its leaves from it, and the branches above
/// them once, where an insert a row searches the tree and rebuilds the rightmost branch
/// at every new leaf (design §7, step 3, and §7c). The callers check that their keys lie
/// past the table's last one.
pub(crate) fn write_at_end<K: redb::Key + 'static, V: redb::Value + 'static>(
    table: &mut redb::Table<'_, K, V>,
    fill: impl FnOnce(&mut redb::CursorMut<'_, K, V>) -> Result<()>,
) -> Result<()> {
    let mut end = table.upper_bound_mut(std::ops::Bound::<K::SelfType<'static>>::Unbounded)?;
    fill(&mut end)?;
    end.close()?;
    Ok(())
}

/// Sessions at a view, live and archived (a purged session has none): the rows of the
/// creation order, one a session, which lie together in the file. The heads, one a
/// session too, each lie with the rest of their session's rows, so counting them reads
/// every projection row.
pub fn session_count(view: &crate::View) -> Result<u64> {
    projection_len(view, Table::CreationOrder)
}

/// Rows in logical table `t` at a view. For a table whose rows lie with their session's
/// ([`Table::session_scoped`]), this reads every projection row.
pub fn projection_len(view: &crate::View, t: Table) -> Result<u64> {
    let mut n = 0;
    view.scan(t, &[], |_, _| {
        n += 1;
        Ok(true)
    })?;
    Ok(n)
}

/// Removes every row of the logical tables in `tables` (for rebuilds).
pub fn clear_projection_tables(txn: &WriteTransaction, tables: &[Table]) -> Result<()> {
    let mut table = txn.open_table(PROJECTIONS)?;
    table.retain(|k, _| match logical_key(k) {
        Some((t, _)) => !tables.contains(&t),
        None => false,
    })?;
    Ok(())
}

/// The log file's format version, written in its `meta`. Format 1 kept the projections,
/// a per-session index and content by id in the log file; `annal migrate` upgrades it.
/// Format 2 is the append-only layout with every record in record format 1. Format 3
/// may also hold records of record format 2 and erased records, which a release that
/// reads format 2 cannot decode. Format 4 (this release) commits through the journal
/// beside the log file (`crate::journal`): after a crash the journal holds acknowledged
/// commits that a release reading format 3 would not look for. Format 5 (this release)
/// keeps content rows in pieces ([`crate::pieces`]), which a release reading format 4
/// would not find. Format 6 (this release) keeps the ids of each content row in
/// [`CONTENT_IDS`], which a release reading format 5 would not keep in step. A file of
/// format 2 to 5 is read as it is (its whole content rows stay where they are until a
/// rewrite moves one to pieces, and its rows have no ids rows), and the first open for
/// writing rewrites its format number and sets [`meta_keys::CONTENT_IDS_FROM`] past its
/// last record; `annal migrate` fills in the ids of the rows before it.
pub const FORMAT: u32 = 6;

/// Content rows in pieces, without their ids beside them: read as it is, upgraded in place.
pub const FORMAT_BEFORE_CONTENT_IDS: u32 = 5;

/// The journal's layout before content pieces: read as it is, upgraded in place.
pub const FORMAT_WHOLE_CONTENT_ROWS: u32 = 4;

/// The append-only layout before record format 2: read as it is, upgraded in place.
pub const FORMAT_APPEND_ONLY_V1: u32 = 2;

/// The append-only layout before the journal: read as it is, upgraded in place.
pub const FORMAT_BEFORE_JOURNAL: u32 = 3;

/// Whether this release reads a log file of format `f` without a migration.
pub fn readable_format(f: u64) -> bool {
    f == FORMAT as u64
        || f == FORMAT_BEFORE_CONTENT_IDS as u64
        || f == FORMAT_WHOLE_CONTENT_ROWS as u64
        || f == FORMAT_BEFORE_JOURNAL as u64
        || f == FORMAT_APPEND_ONLY_V1 as u64
}

/// The projections file's format version.
pub const PROJECTIONS_FORMAT: u32 = 1;

/// Meta keys.
pub mod meta_keys {
    /// u32 LE: the database format.
    pub const FORMAT: &str = "format";
    /// u64 LE seq ‖ 32-byte chain hash: the log tip.
    pub const TIP: &str = "tip";
    /// 32 bytes: keyed hash recognising the chain key (absent for a plain chain).
    pub const KEY_CHECK: &str = "key_check";
    /// 4 × u64 LE: sessions purged, records erased, content objects removed and their
    /// stored bytes, over the database's life (`annal::purge::Reclaimed`).
    pub const ERASED: &str = "erased";
    /// Present (one byte) while an erasure's scrub is unfinished: the next open for
    /// writing shreds the projections file and rewrites the log file first.
    pub const ERASURE_UNFINISHED: &str = "erasure_unfinished";
    /// Present (one byte) while an online content collection has removed objects whose
    /// removal from the content-id index may not be in the projections file yet: the next
    /// open folds the content projection again.
    pub const CONTENT_COLLECTING: &str = "content_collecting";
    /// u64 LE: every content row at or after this seq has its ids in
    /// [`super::CONTENT_IDS`] (1 in a file created by format 6 or migrated; past its last
    /// record in a file of an earlier format upgraded at open). Absent in files of earlier
    /// formats: no row has.
    pub const CONTENT_IDS_FROM: &str = "content_ids_from";
    /// u64 LE, in the log file of a host of a shared log: the last stream sequence its
    /// fold has taken in, written with the records it applied.
    pub const STREAM_POSITION: &str = "stream_position";

    /// u32 LE: the fold version a projection was built with.
    pub fn version(p: crate::Projection) -> String {
        format!("projection.{}.version", p.name())
    }

    /// u64 LE: the last seq folded into a projection.
    pub fn cursor(p: crate::Projection) -> String {
        format!("projection.{}.cursor", p.name())
    }

    /// Projections file: u64 LE seq ‖ 32-byte chain hash of the log at the checkpoint,
    /// so a projections file is only ever used with the log it was folded from.
    pub const CHECKPOINT: &str = "checkpoint";
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
pub(crate) fn write_projection_meta(meta: &mut redb::Table<&str, &[u8]>, p: Projection, cursor: u64) -> Result<()> {
    meta.insert(meta_keys::version(p).as_str(), p.version().to_le_bytes().as_slice())?;
    meta.insert(meta_keys::cursor(p).as_str(), cursor.to_le_bytes().as_slice())?;
    Ok(())
}

/// Creates every table of the log file that does not exist yet.
pub(crate) fn create_log_tables(txn: &WriteTransaction) -> Result<()> {
    txn.open_table(LOG)?;
    txn.open_table(crate::pieces::PIECES)?;
    txn.open_table(CONTENT_IDS)?;
    txn.open_table(META)?;
    Ok(())
}

/// Creates every table of the projections file that does not exist yet.
pub(crate) fn create_projection_tables(txn: &WriteTransaction) -> Result<()> {
    txn.open_table(PROJECTIONS)?;
    txn.open_table(META)?;
    Ok(())
}

/// The fold's [`Store`] over the projection rows of a write transaction.
pub(crate) struct RedbStore<'txn> {
    table: redb::Table<'txn, &'static [u8], &'static [u8]>,
}

impl<'txn> RedbStore<'txn> {
    /// Opens the projection table of `txn`.
    pub fn open(txn: &'txn WriteTransaction) -> Result<RedbStore<'txn>> {
        Ok(RedbStore { table: txn.open_table(PROJECTIONS)? })
    }

    /// Applies an overlay's writes in physical key order, which visits each leaf of the
    /// B-tree once. With `written` (a fold from 0 into a table that held none of its rows),
    /// the keys written are noted there, and a removal of a key never written is skipped.
    ///
    /// The rows past the table's last key (all of them, into an empty table: a rebuild's
    /// or a catch-up's first chunk) go in through one cursor at the table's end, which
    /// builds its leaves in order instead of searching the tree for each row.
    pub(crate) fn apply(
        &mut self,
        writes: &crate::store::Writes,
        mut written: Option<&mut crate::store::Written>,
    ) -> Result<()> {
        let mut rows: Vec<_> = writes.rows().collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if let Some(written) = written.as_deref_mut() {
            rows.iter().filter(|(_, value)| value.is_some()).for_each(|(key, _)| written.insert(key));
        }
        let past = match self.table.last()? {
            Some((last, _)) => rows.partition_point(|(key, _)| ***key <= *last.value()),
            None => 0,
        };
        let appended = rows.split_off(past);
        if appended.iter().any(|(_, value)| value.is_some()) {
            // Every key here is above the table's last one (the rows before them are at or
            // below it), so each goes at the end, in order; a removal has nothing to remove.
            write_at_end(&mut self.table, |end| {
                for (key, value) in appended {
                    if let Some(v) = value {
                        end.insert_before(&**key, v.as_slice())?;
                    }
                }
                Ok(())
            })?;
        }
        for (key, value) in rows {
            match value {
                Some(v) => {
                    self.table.insert(&**key, v.as_slice())?;
                }
                None if written.as_deref().is_none_or(|w| w.may_hold(key)) => {
                    self.table.remove(&**key)?;
                }
                None => {}
            }
        }
        Ok(())
    }
}

impl Store for RedbStore<'_> {
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        match self.table.get(physical_key(table, key).as_slice())? {
            Some(guard) => f(Some(guard.value())),
            None => f(None),
        }
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        self.table.insert(physical_key(table, key).as_slice(), value)?;
        Ok(())
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        self.table.remove(physical_key(table, key).as_slice())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Overlay, StoreExt, Written};

    /// With the keys written noted, a removal of a row an earlier chunk wrote is still
    /// made, and a row written and removed within one chunk never lands.
    #[test]
    fn a_fold_from_zero_removes_what_it_wrote_before() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("p.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        create_projection_tables(&txn).unwrap();
        let mut written = Written::new(16);
        {
            let mut store = RedbStore::open(&txn).unwrap();
            let mut chunk = Overlay::new(&store);
            chunk.put(Table::Heads, b"a", b"1").unwrap();
            chunk.put(Table::Heads, b"b", b"2").unwrap();
            let writes = chunk.into_writes();
            store.apply(&writes, Some(&mut written)).unwrap();
            let mut chunk = Overlay::new(&store);
            chunk.remove(Table::Heads, b"a").unwrap();
            chunk.put(Table::Heads, b"c", b"3").unwrap();
            chunk.remove(Table::Heads, b"c").unwrap();
            let writes = chunk.into_writes();
            store.apply(&writes, Some(&mut written)).unwrap();
            assert!(!store.contains(Table::Heads, b"a").unwrap(), "written by the first chunk, removed by the second");
            assert_eq!(store.get(Table::Heads, b"b").unwrap(), Some(b"2".to_vec()));
            assert!(!store.contains(Table::Heads, b"c").unwrap());
        }
        txn.commit().unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Writes applied over rows already in the table (puts that insert or replace,
        /// removals of rows there or not, keys below, among and above the table's last
        /// one, which go in through the cursor at its end) leave what applying each
        /// write in turn to a map leaves.
        #[test]
        fn applied_writes_agree_with_a_map(
            before in proptest::collection::vec((0u8..40, 0u8..255), 0..40),
            writes in proptest::collection::vec((0u8..64, proptest::option::of(0u8..255)), 0..80),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let db = redb::Database::create(dir.path().join("p.redb")).unwrap();
            let txn = db.begin_write().unwrap();
            create_projection_tables(&txn).unwrap();
            let mut model = std::collections::BTreeMap::new();
            {
                let mut store = RedbStore::open(&txn).unwrap();
                for (k, v) in &before {
                    store.put(Table::Heads, &[*k], &[*v]).unwrap();
                    model.insert(*k, *v);
                }
                let mut chunk = Overlay::new(&store);
                for (k, v) in &writes {
                    match v {
                        Some(v) => {
                            chunk.put(Table::Heads, &[*k], &[*v]).unwrap();
                            model.insert(*k, *v);
                        }
                        None => {
                            chunk.remove(Table::Heads, &[*k]).unwrap();
                            model.remove(k);
                        }
                    }
                }
                let writes = chunk.into_writes();
                store.apply(&writes, None).unwrap();
                for k in 0u8..64 {
                    proptest::prop_assert_eq!(store.get(Table::Heads, &[k]).unwrap(), model.get(&k).map(|v| vec![*v]));
                }
            }
            let rows = redb::ReadableTableMetadata::len(&txn.open_table(PROJECTIONS).unwrap()).unwrap();
            proptest::prop_assert_eq!(rows, model.len() as u64);
        }
    }
}
