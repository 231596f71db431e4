//! Content rows on disk, cut into pieces.
//!
//! A record's content row (the objects it introduced, `annal_codec::content`) is stored
//! in [`PIECES`] as pieces of at most [`PIECE_BYTES`] bytes under the keys
//! `(seq, 0)`, `(seq, 1)`, …; reading the row concatenates them. redb gives a value
//! larger than a page a leaf of its own, sized in powers of two pages, so whole rows of a
//! few KiB left a third of the content table's pages empty; pieces under a quarter page
//! fill the leaves (`docs/design.md` §5, `docs/benchmarks.md`).
//!
//! Files of formats 2 to 4 keep their rows whole in [`crate::tables::CONTENT`]. They are
//! read as they are: a seq's row is its pieces if it has any, else its whole row. A row
//! that is rewritten (an erasure, a content collection, a purge's scrub) moves to pieces,
//! so a seq's row is only ever in one of the two tables.
//!
//! The writer lists the ids of each row it writes beside it, in
//! [`crate::tables::CONTENT_IDS`], in the same transaction, and replaces and removes the
//! listing with the row: a fold reads a row's ids from there instead of the row.
//!
//! The engine reads and writes content rows only through [`ContentRows`]; the writer is
//! public, like the table definitions in [`crate::tables`], for offline tools and tamper
//! tests.

use crate::error::{Error, Location, Result};
use crate::tables::{write_at_end, CONTENT, CONTENT_IDS};
use annal_codec::content::IdScan;
use annal_codec::{ContentId, DecodeError};
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, Table, TableDefinition, TableHandle, WriteTransaction};
use std::ops::RangeInclusive;

/// (seq, piece) → up to [`PIECE_BYTES`] bytes of the content row of record `seq`.
pub const PIECES: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("content_pieces");

/// The size of every piece but a row's last. Four pieces and their keys fill a 4 KiB
/// leaf: redb spends 8 bytes of offsets and 12 of key on each entry.
pub const PIECE_BYTES: usize = 1000;

/// The content rows of a log file: its pieces and, in a file that has them, its whole
/// rows of an earlier format, with the ids of each row ([`CONTENT_IDS`]). `P` is the
/// pieces' table and `W` the whole rows' and the ids', read-only or writable.
pub struct ContentRows<P, W> {
    pieces: Option<P>,
    whole: Option<W>,
    ids: Option<W>,
}

/// The content rows of a read snapshot.
pub type ContentReader = ContentRows<ReadOnlyTable<(u64, u32), &'static [u8]>, ReadOnlyTable<u64, &'static [u8]>>;

/// The content rows of a write transaction.
pub type ContentWriter<'txn> = ContentRows<Table<'txn, (u64, u32), &'static [u8]>, Table<'txn, u64, &'static [u8]>>;

/// The first and last seq of `seqs`, if it holds any.
fn bounds(seqs: &RangeInclusive<u64>) -> Option<(u64, u64)> {
    (seqs.start() <= seqs.end()).then(|| (*seqs.start(), *seqs.end()))
}

fn has_table(mut names: impl Iterator<Item = String>, name: &str) -> bool {
    names.any(|n| n == name)
}

/// `table` of a read snapshot, or `None` if the file has no such table.
fn open_if_present<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<ReadOnlyTable<K, V>>> {
    match txn.open_table(table) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl ContentReader {
    /// Opens the content rows of `txn` (a file with neither table has no rows).
    pub fn open(txn: &ReadTransaction) -> Result<ContentReader> {
        Ok(ContentRows {
            pieces: open_if_present(txn, PIECES)?,
            whole: open_if_present(txn, CONTENT)?,
            ids: open_if_present(txn, CONTENT_IDS)?,
        })
    }

    /// The ids rows of the seqs in `seqs`, in seq order, as an iterator that owns its
    /// snapshot's pages; `None` in a file without [`CONTENT_IDS`].
    pub(crate) fn ids_owned(
        &self,
        seqs: RangeInclusive<u64>,
    ) -> Result<Option<redb::Range<'static, u64, &'static [u8]>>> {
        let Some((lo, hi)) = bounds(&seqs) else { return Ok(None) };
        Ok(self.ids.as_ref().map(|t| t.range(lo..=hi)).transpose()?)
    }

    /// [`ContentRows::range`], as an iterator that owns its snapshot's pages (it may
    /// outlive this reader).
    pub fn range_owned(&self, seqs: RangeInclusive<u64>) -> Result<Rows<'static>> {
        let Some((lo, hi)) = bounds(&seqs) else { return Ok(Rows::new(None, None)) };
        let pieces = self.pieces.as_ref().map(|p| p.range((lo, 0)..=(hi, u32::MAX))).transpose()?;
        Ok(Rows::new(pieces, self.whole.as_ref().map(|w| w.range(lo..=hi)).transpose()?))
    }
}

impl<'txn> ContentWriter<'txn> {
    /// Opens the content rows of `txn` for writing, creating [`PIECES`] if need be. The
    /// whole rows' table is looked for in the file's table list: opening a table in a
    /// write transaction creates it, and a file that never had whole rows keeps none.
    pub fn open(txn: &'txn WriteTransaction) -> Result<ContentWriter<'txn>> {
        let whole = if has_table(txn.list_tables()?.map(|t| t.name().to_string()), CONTENT.name()) {
            Some(txn.open_table(CONTENT)?)
        } else {
            None
        };
        Ok(ContentRows { pieces: Some(txn.open_table(PIECES)?), whole, ids: Some(txn.open_table(CONTENT_IDS)?) })
    }

    /// Writes the row of a new record `seq` (one that has no row yet), and its ids.
    pub fn append(&mut self, seq: u64, row: &[u8]) -> Result<()> {
        let pieces = self.pieces.as_mut().expect("a writer opens its pieces");
        for piece in pieces_of(seq, row) {
            let (key, bytes) = piece?;
            pieces.insert(key, bytes)?;
        }
        if !row.is_empty() {
            let ids = self.ids.as_mut().expect("a writer opens the ids");
            ids.insert(seq, ids_value(Some(row)).as_slice())?;
        }
        Ok(())
    }

    /// Writes the rows of new records, in seq order, and their ids: [`Self::append`] for
    /// each, but through one cursor at each table's end
    /// (`tables::write_at_end`) when every seq lies past the rows there, as a
    /// log's append always does.
    pub fn append_run<'r>(&mut self, rows: impl Iterator<Item = (u64, &'r [u8])>) -> Result<()> {
        let rows: Vec<(u64, &[u8])> = rows.collect();
        let Some(&(first, _)) = rows.first() else { return Ok(()) };
        let ordered = rows.windows(2).all(|w| w[0].0 < w[1].0);
        let pieces = self.pieces.as_mut().expect("a writer opens its pieces");
        let ids = self.ids.as_mut().expect("a writer opens the ids");
        let past_pieces = pieces.last()?.is_none_or(|(k, _)| k.value().0 < first);
        let past_ids = ids.last()?.is_none_or(|(k, _)| k.value() < first);
        if !(ordered && past_pieces && past_ids) {
            return rows.into_iter().try_for_each(|(seq, row)| self.append(seq, row));
        }
        write_at_end(pieces, |end| {
            for &(seq, row) in &rows {
                for piece in pieces_of(seq, row) {
                    let (key, bytes) = piece?;
                    end.insert_before(key, bytes)?;
                }
            }
            Ok(())
        })?;
        write_at_end(ids, |end| {
            for &(seq, row) in rows.iter().filter(|(_, row)| !row.is_empty()) {
                end.insert_before(seq, ids_value(Some(row)).as_slice())?;
            }
            Ok(())
        })
    }

    /// Writes the ids row of every content row of the seqs in `seqs` (an ids row already
    /// there is replaced): for the rows of a file written before [`CONTENT_IDS`]. Returns
    /// how many rows it read.
    pub fn fill_ids(&mut self, seqs: RangeInclusive<u64>) -> Result<u64> {
        let Some((lo, hi)) = bounds(&seqs) else { return Ok(0) };
        let pieces = self.pieces.as_ref().map(|p| p.range((lo, 0)..=(hi, u32::MAX))).transpose()?;
        let whole = self.whole.as_ref().map(|w| w.range(lo..=hi)).transpose()?;
        let ids = self.ids.as_mut().expect("a writer opens the ids");
        let mut rows = Rows::new(pieces, whole).lenient();
        let mut n = 0;
        while let Some(row) = rows.next() {
            let (seq, row) = row?;
            // A damaged row is listed as one to read.
            let damaged = rows.take_damage().is_some();
            ids.insert(seq, ids_value((!damaged).then_some(row.as_slice())).as_slice())?;
            n += 1;
        }
        Ok(n)
    }

    /// Replaces the row of `seq` (an empty `row` removes it).
    pub fn put(&mut self, seq: u64, row: &[u8]) -> Result<()> {
        self.remove(seq)?;
        self.append(seq, row)
    }

    /// Removes the row of `seq`, wherever it is.
    pub fn remove(&mut self, seq: u64) -> Result<()> {
        if let Some(pieces) = self.pieces.as_mut() {
            pieces.retain_in((seq, 0)..=(seq, u32::MAX), |_, _| false)?;
        }
        if let Some(whole) = self.whole.as_mut() {
            whole.remove(seq)?;
        }
        if let Some(ids) = self.ids.as_mut() {
            ids.remove(seq)?;
        }
        Ok(())
    }
}

/// The pieces of the content row of `seq`, keys and bytes, in key order.
fn pieces_of(seq: u64, row: &[u8]) -> impl Iterator<Item = Result<((u64, u32), &[u8])>> + '_ {
    row.chunks(PIECE_BYTES).enumerate().map(move |(i, piece)| {
        let i = u32::try_from(i).map_err(|_| Error::storage(format!("content row {seq} is too long")))?;
        Ok(((seq, i), piece))
    })
}

/// The value of the ids row of content row `row`: its ids, 32 bytes each in row order,
/// or empty when the row does not parse (`None`, or bytes whose entries do not), which
/// tells a reader to read the row itself.
fn ids_value(row: Option<&[u8]>) -> Vec<u8> {
    let Some(row) = row else { return Vec::new() };
    let mut scan = IdScan::new(u64::MAX);
    scan.feed(row);
    match scan.finish() {
        Ok(ids) => annal_codec::ids::id_list::pack(&ids),
        Err(_) => Vec::new(),
    }
}

/// The ids an ids row lists ([`CONTENT_IDS`]): `None` when it lists none (the row is to
/// be read), or when its length is not a multiple of 32 (a damaged ids row, which a
/// reader treats the same way).
pub(crate) fn listed_ids(value: &[u8]) -> Option<Vec<ContentId>> {
    annal_codec::ids::id_list::unpack(value).filter(|ids| !ids.is_empty())
}

/// A value read in place, in its page.
type Bytes<'a> = redb::AccessGuard<'a, &'static [u8]>;

/// The next entry of `range`, its key decoded by `key` and its value in place; `None`
/// once the range is done (and dropped).
fn next_entry<'a, K: redb::Key + 'static, T>(
    range: &mut Option<redb::Range<'a, K, &'static [u8]>>,
    key: impl FnOnce(&redb::AccessGuard<'a, K>) -> T,
) -> Result<Option<(T, Bytes<'a>)>> {
    let Some(iter) = range.as_mut() else { return Ok(None) };
    match iter.next() {
        Some(item) => {
            let (k, v) = item?;
            Ok(Some((key(&k), v)))
        }
        None => {
            *range = None;
            Ok(None)
        }
    }
}

/// A row's pieces out of order: a missing, repeated or empty piece.
fn bad_piece(seq: u64, detail: impl std::fmt::Display) -> Error {
    Error::corrupt(Location::Log { seq }, format!("content row: {detail}"))
}

impl<P, W> ContentRows<P, W>
where
    P: ReadableTable<(u64, u32), &'static [u8]>,
    W: ReadableTable<u64, &'static [u8]>,
{
    /// The content row of record `seq`, if it has one.
    pub fn get(&self, seq: u64) -> Result<Option<Vec<u8>>> {
        if let Some(pieces) = &self.pieces {
            let mut row: Option<Vec<u8>> = None;
            for (expected, item) in (0u32..).zip(pieces.range((seq, 0)..=(seq, u32::MAX))?) {
                let (k, v) = item?;
                let (_, i) = k.value();
                if i != expected || v.value().is_empty() {
                    return Err(bad_piece(seq, format!("piece {expected} is missing or empty")));
                }
                row.get_or_insert_with(Vec::new).extend_from_slice(v.value());
            }
            if row.is_some() {
                return Ok(row);
            }
        }
        match &self.whole {
            Some(whole) => Ok(whole.get(seq)?.map(|g| g.value().to_vec())),
            None => Ok(None),
        }
    }

    /// The rows of the seqs in `seqs`, in seq order.
    pub fn range(&self, seqs: RangeInclusive<u64>) -> Result<Rows<'_>> {
        let Some((lo, hi)) = bounds(&seqs) else { return Ok(Rows::new(None, None)) };
        let pieces = self.pieces.as_ref().map(|p| p.range((lo, 0)..=(hi, u32::MAX))).transpose()?;
        Ok(Rows::new(pieces, self.whole.as_ref().map(|w| w.range(lo..=hi)).transpose()?))
    }

    /// Every row, in seq order.
    pub fn iter(&self) -> Result<Rows<'_>> {
        self.range(0..=u64::MAX)
    }
}

/// Content rows in seq order, each whole: from [`ContentRows::range`].
pub struct Rows<'a> {
    pieces: Option<redb::Range<'a, (u64, u32), &'static [u8]>>,
    whole: Option<redb::Range<'a, u64, &'static [u8]>>,
    /// The next piece read and not yet taken (key, bytes in place).
    next_piece: Option<((u64, u32), Bytes<'a>)>,
    /// The next whole row read and not yet taken.
    next_whole: Option<(u64, Bytes<'a>)>,
    failed: bool,
    lenient: bool,
    damage: Option<(u64, String)>,
}

impl<'a> Rows<'a> {
    fn new(
        pieces: Option<redb::Range<'a, (u64, u32), &'static [u8]>>,
        whole: Option<redb::Range<'a, u64, &'static [u8]>>,
    ) -> Rows<'a> {
        Rows { pieces, whole, next_piece: None, next_whole: None, failed: false, lenient: false, damage: None }
    }

    /// Yields a damaged row too, as far as it reads (its pieces in key order, the pieces
    /// of a row stored both ways), and keeps what was wrong with it for
    /// [`Rows::take_damage`]: for `annal verify`, which reports the damage and checks the
    /// objects it can still read.
    pub fn lenient(mut self) -> Self {
        self.lenient = true;
        self
    }

    /// What was wrong with the row a lenient iterator yielded last: its seq and why.
    pub fn take_damage(&mut self) -> Option<(u64, String)> {
        self.damage.take()
    }

    /// A damaged row: an error, or in lenient mode the row, with the damage kept.
    fn damaged<S>(&mut self, seq: u64, row: S, detail: String) -> Result<Option<(u64, S)>> {
        if self.lenient {
            self.damage = Some((seq, detail));
            Ok(Some((seq, row)))
        } else {
            Err(bad_piece(seq, detail))
        }
    }

    fn peek_piece(&mut self) -> Result<Option<u64>> {
        if self.next_piece.is_none() {
            self.next_piece = next_entry(&mut self.pieces, |k| k.value())?;
        }
        Ok(self.next_piece.as_ref().map(|((seq, _), _)| *seq))
    }

    fn peek_whole(&mut self) -> Result<Option<u64>> {
        if self.next_whole.is_none() {
            self.next_whole = next_entry(&mut self.whole, |k| k.value())?;
        }
        Ok(self.next_whole.as_ref().map(|(seq, _)| *seq))
    }

    /// The next whole row, read out of its page into `row`.
    fn take_whole<S: Sink>(&mut self, mut row: S) -> Option<(u64, S)> {
        self.next_whole.take().map(|(seq, bytes)| {
            row.take(bytes.value(), true);
            (seq, row)
        })
    }

    /// The pieces of the row at `seq`, the next one, read into `row`: a row out of order
    /// is reported once, its remaining pieces skipped, and the rows after it still read.
    fn take_pieces<S: Sink>(&mut self, seq: u64, mut row: S) -> Result<Option<(u64, S)>> {
        let mut bad = None;
        let mut expected = 0u32;
        loop {
            match self.next_piece.take() {
                Some(((s, i), bytes)) if s == seq => {
                    let bytes = bytes.value();
                    if bad.is_none() && (i != expected || bytes.is_empty()) {
                        bad = Some(expected);
                    }
                    row.take(bytes, expected == 0 && bytes.len() < PIECE_BYTES);
                    expected = expected.saturating_add(1);
                }
                other => {
                    self.next_piece = other;
                    break;
                }
            }
            self.peek_piece()?;
        }
        match bad {
            Some(i) => self.damaged(seq, row, format!("piece {i} is missing or empty")),
            None => Ok(Some((seq, row))),
        }
    }

    /// The next row, read into a sink from `sink`.
    fn step<S: Sink>(&mut self, sink: impl Fn() -> S) -> Result<Option<(u64, S)>> {
        let (piece, whole) = (self.peek_piece()?, self.peek_whole()?);
        match (piece, whole) {
            (None, None) => Ok(None),
            (Some(p), Some(w)) if w < p => Ok(self.take_whole(sink())),
            (Some(p), Some(w)) if w == p => {
                self.next_whole = None;
                let lenient = std::mem::replace(&mut self.lenient, true);
                let row = self.take_pieces(p, sink());
                self.lenient = lenient;
                let (_, bytes) = row?.unwrap_or_else(|| (p, sink()));
                self.damaged(p, bytes, "the row is stored whole and in pieces".into())
            }
            (Some(p), _) => self.take_pieces(p, sink()),
            (None, Some(_)) => Ok(self.take_whole(sink())),
        }
    }

    /// The next row, or the error that kept it from being read (as [`Rows::next`]).
    fn next_with<S: Sink>(&mut self, sink: impl Fn() -> S) -> Option<Result<(u64, S)>> {
        if self.failed {
            return None;
        }
        match self.step(sink) {
            Ok(row) => row.map(Ok),
            Err(e @ Error::Corrupt { .. }) => Some(Err(e)),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }

    /// The rows' content ids instead of their bytes: each row's pieces are read where
    /// they lie, never joined. Each item is a row's seq and its ids or what was wrong with
    /// its entries (`annal_codec::content::IdScan`), or, as from [`Rows::next`], the error
    /// that kept the row from being read.
    pub(crate) fn ids(self, object_bytes_max: u64) -> RowIds<'a> {
        RowIds { rows: self, max: object_bytes_max }
    }
}

/// Where a row's bytes go as they are read: the row joined, or its ids.
trait Sink {
    /// The row's next bytes; `whole` when they are the whole row.
    fn take(&mut self, bytes: &[u8], whole: bool);
}

impl Sink for Vec<u8> {
    fn take(&mut self, bytes: &[u8], whole: bool) {
        if self.is_empty() && !whole {
            // A full first piece: more follow; room for a row of four.
            self.reserve_exact(4 * PIECE_BYTES);
        }
        self.extend_from_slice(bytes);
    }
}

impl Sink for IdScan {
    fn take(&mut self, bytes: &[u8], _whole: bool) {
        self.feed(bytes);
    }
}

/// The ids of content rows in seq order: from [`Rows::ids`].
pub(crate) struct RowIds<'a> {
    rows: Rows<'a>,
    max: u64,
}

/// A row's content ids, or what is wrong with its entries.
pub(crate) type IdsOrDamage = std::result::Result<Vec<ContentId>, DecodeError>;

impl Iterator for RowIds<'_> {
    type Item = Result<(u64, IdsOrDamage)>;

    fn next(&mut self) -> Option<Self::Item> {
        let max = self.max;
        self.rows.next_with(|| IdScan::new(max)).map(|r| r.map(|(seq, scan)| (seq, scan.finish())))
    }
}

impl Iterator for Rows<'_> {
    type Item = Result<(u64, Vec<u8>)>;

    /// The next row, or the error that kept it from being read. A damaged row (pieces
    /// out of order, a row in both tables) is an error for that row only; a storage
    /// error ends the iteration.
    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(Vec::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, ReadableTableMetadata};

    fn db() -> redb::Database {
        redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new()).unwrap()
    }

    fn rows(db: &redb::Database) -> Vec<(u64, Vec<u8>)> {
        let txn = db.begin_read().unwrap();
        ContentReader::open(&txn).unwrap().iter().unwrap().map(Result::unwrap).collect()
    }

    #[test]
    fn rows_round_trip_in_pieces() {
        let db = db();
        let row = |seq: u64, len: usize| (seq, (0..len).map(|i| (i as u64 * 7 + seq) as u8).collect::<Vec<u8>>());
        let written = vec![row(1, 1), row(2, PIECE_BYTES), row(4, PIECE_BYTES + 1), row(9, 5 * PIECE_BYTES - 3)];
        let txn = db.begin_write().unwrap();
        {
            let mut w = ContentWriter::open(&txn).unwrap();
            for (seq, bytes) in &written {
                w.append(*seq, bytes).unwrap();
            }
        }
        txn.commit().unwrap();
        assert_eq!(rows(&db), written);
        let txn = db.begin_read().unwrap();
        let r = ContentReader::open(&txn).unwrap();
        assert_eq!(r.get(4).unwrap().as_deref(), Some(written[2].1.as_slice()));
        assert_eq!(r.get(3).unwrap(), None);
        assert_eq!(r.range(2..=4).unwrap().map(|r| r.unwrap().0).collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(txn.open_table(PIECES).unwrap().len().unwrap(), 1 + 1 + 2 + 5);
    }

    /// The rows of the pieces and of the ids, in key order.
    type Tables = (Vec<((u64, u32), Vec<u8>)>, Vec<(u64, Vec<u8>)>);

    /// Every table of `db` that content rows are written to, row by row.
    fn tables(db: &redb::Database) -> Tables {
        let txn = db.begin_read().unwrap();
        let pieces = txn.open_table(PIECES).unwrap();
        let ids = txn.open_table(CONTENT_IDS).unwrap();
        (
            pieces.iter().unwrap().map(|e| e.unwrap()).map(|(k, v)| (k.value(), v.value().to_vec())).collect(),
            ids.iter().unwrap().map(|e| e.unwrap()).map(|(k, v)| (k.value(), v.value().to_vec())).collect(),
        )
    }

    /// A content row of `objects` whole objects (so that its ids parse), or `len` bytes
    /// that do not parse when `objects` is 0.
    fn content_row(seq: u64, objects: u8, len: usize) -> Vec<u8> {
        let fill = |n: usize| (0..n).map(|i| (i as u64 * 31 + seq) as u8).collect::<Vec<u8>>();
        if objects == 0 {
            return fill(len);
        }
        let mut row = Vec::new();
        for o in 0..objects {
            let id = annal_codec::ContentId([o ^ seq as u8; 32]);
            annal_codec::content::push_stored(&mut row, &id, 0, &fill(len / usize::from(objects)));
        }
        row
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// `append_run` leaves the tables as `append` a row at a time does: through the
        /// cursors when the run lies past every row and is in order, row by row when it
        /// does not.
        #[test]
        fn a_run_appends_as_rows_appended_one_by_one(
            before in proptest::collection::btree_map(0u64..60, (0u8..3, 0usize..2600), 0..12),
            run in proptest::collection::vec((0u64..90, 0u8..3, 0usize..4200), 0..12),
            sorted: bool,
            stray in proptest::option::of(0u64..90),
        ) {
            // A log's append never repeats a seq that has a row.
            let mut run: Vec<_> = run.into_iter().filter(|r| !before.contains_key(&r.0)).collect();
            if sorted {
                run.sort_by_key(|r| r.0);
                run.dedup_by_key(|r| r.0);
            } else {
                let mut seen = std::collections::BTreeSet::new();
                run.retain(|r| seen.insert(r.0));
            }
            let (by_run, one_by_one) = (db(), db());
            for (db, whole) in [(&by_run, true), (&one_by_one, false)] {
                let txn = db.begin_write().unwrap();
                {
                    let mut w = ContentWriter::open(&txn).unwrap();
                    for (&seq, &(objects, len)) in &before {
                        w.append(seq, &content_row(seq, objects, len)).unwrap();
                    }
                    // An ids row with no content row (a damaged file): a run at or
                    // below it goes row by row.
                    if let Some(seq) = stray {
                        w.ids.as_mut().unwrap().insert(seq, [7u8; 32].as_slice()).unwrap();
                    }
                }
                txn.commit().unwrap();
                let rows: Vec<(u64, Vec<u8>)> = run.iter().map(|&(seq, o, len)| (seq, content_row(seq, o, len))).collect();
                let txn = db.begin_write().unwrap();
                {
                    let mut w = ContentWriter::open(&txn).unwrap();
                    if whole {
                        w.append_run(rows.iter().map(|(seq, row)| (*seq, row.as_slice()))).unwrap();
                    } else {
                        for (seq, row) in &rows {
                            w.append(*seq, row).unwrap();
                        }
                    }
                }
                txn.commit().unwrap();
            }
            proptest::prop_assert_eq!(tables(&by_run), tables(&one_by_one));
        }
    }

    #[test]
    fn whole_rows_of_an_older_file_are_read_and_move_to_pieces_when_rewritten() {
        let db = db();
        let txn = db.begin_write().unwrap();
        {
            let mut whole = txn.open_table(CONTENT).unwrap();
            whole.insert(1, [1u8; 10].as_slice()).unwrap();
            whole.insert(3, [3u8; 2500].as_slice()).unwrap();
        }
        txn.commit().unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut w = ContentWriter::open(&txn).unwrap();
            w.append(5, &[5u8; 20]).unwrap();
            w.put(3, &[4u8; 1200]).unwrap();
            w.remove(1).unwrap();
        }
        txn.commit().unwrap();
        assert_eq!(rows(&db), vec![(3, vec![4u8; 1200]), (5, vec![5u8; 20])]);
        let txn = db.begin_read().unwrap();
        assert!(txn.open_table(CONTENT).unwrap().is_empty().unwrap());
    }

    #[test]
    fn damaged_pieces_are_reported_for_their_row_only() {
        let db = db();
        let txn = db.begin_write().unwrap();
        {
            let mut w = ContentWriter::open(&txn).unwrap();
            w.append(1, &[1u8; 2 * PIECE_BYTES + 1]).unwrap();
            w.append(2, &[2u8; 10]).unwrap();
            w.append(3, &[3u8; 10]).unwrap();
            w.pieces.as_mut().unwrap().remove((1, 1)).unwrap();
            let mut whole = txn.open_table(CONTENT).unwrap();
            whole.insert(2, [9u8; 3].as_slice()).unwrap();
        }
        txn.commit().unwrap();
        let txn = db.begin_read().unwrap();
        let r = ContentReader::open(&txn).unwrap();
        let got: Vec<_> = r.iter().unwrap().collect();
        assert_eq!(got.len(), 3);
        assert!(matches!(&got[0], Err(Error::Corrupt { .. })), "{:?}", got[0]);
        assert!(matches!(&got[1], Err(Error::Corrupt { .. })), "{:?}", got[1]);
        assert_eq!(got[2].as_ref().unwrap(), &(3, vec![3u8; 10]));
        assert!(matches!(r.get(1), Err(Error::Corrupt { .. })));
        let mut lenient = r.iter().unwrap().lenient();
        let first = lenient.next().unwrap().unwrap();
        assert_eq!((first.0, first.1.len()), (1, PIECE_BYTES + 1));
        assert_eq!(lenient.take_damage().map(|d| d.0), Some(1));
        assert_eq!(lenient.next().unwrap().unwrap(), (2, vec![2u8; 10]));
        assert_eq!(lenient.take_damage().map(|d| d.0), Some(2));
        assert_eq!(lenient.next().unwrap().unwrap(), (3, vec![3u8; 10]));
        assert_eq!(lenient.take_damage(), None);
        assert!(lenient.next().is_none());
    }

    /// What a seq holds in the reference model: a whole row, pieces (by index, any
    /// indexes, possibly empty), or both.
    #[derive(Clone, Debug)]
    struct Stored {
        whole: Option<Vec<u8>>,
        pieces: std::collections::BTreeMap<u32, Vec<u8>>,
    }

    /// What the model says a seq reads as: `None` (no row), `Some(Ok(row))`, or
    /// `Some(Err(row as far as it reads))` for damage.
    type Expected = Option<Result<Vec<u8>, Vec<u8>>>;

    fn expected(stored: &Stored) -> Expected {
        if stored.pieces.is_empty() {
            return stored.whole.clone().map(Ok);
        }
        let row: Vec<u8> = stored.pieces.values().flatten().copied().collect();
        let dense = stored.pieces.keys().copied().eq(0..stored.pieces.len() as u32);
        let ok = dense && stored.pieces.values().all(|p| !p.is_empty()) && stored.whole.is_none();
        Some(if ok { Ok(row) } else { Err(row) })
    }

    fn stored_strategy() -> impl proptest::strategy::Strategy<Value = Stored> {
        use proptest::prelude::*;
        let bytes = proptest::collection::vec(any::<u8>(), 0..40);
        (
            proptest::option::of(proptest::collection::vec(any::<u8>(), 1..40)),
            proptest::collection::btree_map(0u32..5, bytes, 0..4),
        )
            .prop_map(|(whole, pieces)| Stored { whole, pieces })
    }

    proptest::proptest! {
        /// Rows read, by `get`, by `range` and leniently, as the model says: pieces
        /// concatenated in key order, a whole row where there are no pieces, and damage
        /// (a gap, an empty piece, a row both ways) an error for that row alone.
        #[test]
        fn rows_read_as_the_model_says(
            layout in proptest::collection::btree_map(1u64..30, stored_strategy(), 0..12),
            from in 0u64..32,
            len in 0u64..32,
        ) {
            let db = db();
            let txn = db.begin_write().unwrap();
            {
                let mut pieces = txn.open_table(PIECES).unwrap();
                let mut whole = txn.open_table(CONTENT).unwrap();
                for (seq, stored) in &layout {
                    if let Some(w) = &stored.whole {
                        whole.insert(*seq, w.as_slice()).unwrap();
                    }
                    for (i, p) in &stored.pieces {
                        pieces.insert((*seq, *i), p.as_slice()).unwrap();
                    }
                }
            }
            txn.commit().unwrap();
            let txn = db.begin_read().unwrap();
            let rows = ContentReader::open(&txn).unwrap();
            for seq in 0..32u64 {
                let want = layout.get(&seq).and_then(expected);
                match (rows.get(seq), want) {
                    (Ok(None), None) => {}
                    (Ok(Some(row)), Some(Ok(w))) => proptest::prop_assert_eq!(row, w),
                    // `get` reads the pieces when there are any, and does not look for a
                    // whole row beside them (a reader trusts the pieces; verify reports).
                    (Ok(Some(row)), Some(Err(w))) => {
                        let stored = &layout[&seq];
                        let dense = stored.pieces.keys().copied().eq(0..stored.pieces.len() as u32);
                        proptest::prop_assert!(dense && stored.pieces.values().all(|p| !p.is_empty()));
                        proptest::prop_assert_eq!(row, w);
                    }
                    (Err(Error::Corrupt { .. }), Some(Err(_))) => {}
                    (got, want) => proptest::prop_assert!(false, "seq {}: {:?} against {:?}", seq, got, want),
                }
            }
            let through = from.saturating_add(len);
            let in_range: Vec<(u64, Expected)> =
                layout.iter().filter(|(s, _)| (from..=through).contains(*s)).map(|(s, st)| (*s, expected(st))).filter(|(_, w)| w.is_some()).collect();
            let strict: Vec<_> = rows.range(from..=through).unwrap().collect();
            proptest::prop_assert_eq!(strict.len(), in_range.len());
            for (got, (seq, want)) in strict.iter().zip(&in_range) {
                match (got, want) {
                    (Ok((s, row)), Some(Ok(w))) => proptest::prop_assert!(s == seq && row == w),
                    (Err(Error::Corrupt { .. }), Some(Err(_))) => {}
                    (got, want) => proptest::prop_assert!(false, "seq {}: {:?} against {:?}", seq, got, want),
                }
            }
            let mut lenient = rows.range(from..=through).unwrap().lenient();
            for (seq, want) in &in_range {
                let (s, row) = lenient.next().unwrap().unwrap();
                proptest::prop_assert_eq!(s, *seq);
                match want {
                    Some(Ok(w)) => proptest::prop_assert!(row == *w && lenient.take_damage().is_none()),
                    Some(Err(w)) => {
                        proptest::prop_assert_eq!(&row, w);
                        proptest::prop_assert_eq!(lenient.take_damage().map(|d| d.0), Some(*seq));
                    }
                    None => proptest::prop_assert!(false, "a seq in the layout has no row"),
                }
            }
            proptest::prop_assert!(lenient.next().is_none());
        }
    }
}
