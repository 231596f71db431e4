//! The log: the only durable, authoritative state, written only by appending.
//!
//! [`append`] is the one appender: the writer's group commit and import both call it.
//! It writes, in one transaction, each record (sealed with its chain hash) under its
//! seq, the content row of the objects the record introduced under the same seq, and
//! the tip in `meta`. Nothing else: every index over the log is a projection.
//! [`open_log`] holds the open checks (format, key, tip against the last record) and
//! [`LogTail`] reads records back, chain-checked, for recovery, rebuild and readers.

use crate::error::{Error, Location, Result};
use crate::pieces::{ContentReader, ContentWriter};
use crate::tables::{self, meta_keys, LOG, META};
use annal_codec::content::{entries, push_stored};
use annal_codec::{decode_record, encode_record, verify_chain, ChainHash, ContentId, LogChain, Record};
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata, WriteTransaction};

/// The log tip as the writer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tip {
    /// Last seq (0 for an empty log).
    pub seq: u64,
    /// `h(seq)`.
    pub hash: ChainHash,
    /// `committed_at` of the last record, so the clock never goes back.
    pub clock_ms: u64,
}

/// A content object as its content row stores it.
#[derive(Clone, Debug)]
pub(crate) struct StoredObject {
    pub id: ContentId,
    /// `annal_codec::content::ENCODING_*`.
    pub encoding: u8,
    pub bytes: Vec<u8>,
}

impl StoredObject {
    /// `canonical` stored as is.
    pub fn raw(id: ContentId, canonical: Vec<u8>) -> StoredObject {
        StoredObject { id, encoding: annal_codec::content::ENCODING_RAW, bytes: canonical }
    }

    /// `canonical` stored the way `compression` makes it (compressed when it pays).
    pub fn encoded(id: ContentId, canonical: &[u8], compression: annal_codec::content::Compression) -> StoredObject {
        let (encoding, bytes) = annal_codec::content::encode_object_as(canonical, compression);
        StoredObject { id, encoding, bytes }
    }
}

/// A record and the content objects it introduces, in content-id order.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub record: Record,
    pub content: Vec<StoredObject>,
}

/// The entries of a batch being decided, which the log does not hold yet: runs of
/// consecutive seqs (the batch's earlier commands', then this command's so far). They
/// answer for their own records and content rows, before any store is asked.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Staged<'a>(pub [&'a [Entry]; 2]);

impl<'a> Staged<'a> {
    /// The entry at `seq`, if a run holds it.
    pub fn entry(&self, seq: u64) -> Option<&'a Entry> {
        self.0.iter().find_map(|run| {
            let first = run.first()?.record.seq;
            let entry = run.get(usize::try_from(seq.checked_sub(first)?).ok()?)?;
            (entry.record.seq == seq).then_some(entry)
        })
    }

    /// The record at `seq`, if a run holds it.
    pub fn record(&self, seq: u64) -> Option<&'a Record> {
        self.entry(seq).map(|e| &e.record)
    }

    /// Whether the content row at `seq` holds `id`; `None` when no run holds `seq` (its
    /// row is a store's to read).
    pub fn holds(&self, seq: u64, id: &ContentId) -> Option<bool> {
        self.entry(seq).map(|e| e.content.iter().any(|o| o.id == *id))
    }
}

impl crate::store::Records for Staged<'_> {
    fn record(&self, seq: u64) -> Result<Option<Record>> {
        Ok(Staged::record(self, seq).cloned())
    }
    fn message_list(&self, seq: u64) -> Result<Option<std::sync::Arc<[ContentId]>>> {
        Ok(Staged::record(self, seq).map(crate::transcript::list_of))
    }
}

/// Lists [`FileRecords`] keeps before it starts again (a rewrite of a long session reads
/// the lists of the records after it, and a catch-up folds many).
const FILE_LISTS_MAX: usize = 16_384;

/// Records read by seq from a log file's snapshot (and, past it, the journal's rows):
/// what a catch-up, a rebuild, a read-only opener or `verify` folds with, when a
/// transcript names a record it folded before. Keeps the message lists it read, up to
/// 16,384, and starts again when full.
pub struct FileRecords<'a> {
    txn: &'a ReadTransaction,
    tail: Option<&'a crate::journal::Tail>,
    /// Journal rows past the log file, in seq order (`over_rows`).
    rows: &'a [crate::journal::JournalRow],
    table: std::cell::OnceCell<redb::ReadOnlyTable<u64, &'static [u8]>>,
    record_bytes_max: u64,
    lists: std::cell::RefCell<std::collections::HashMap<u64, std::sync::Arc<[ContentId]>>>,
}

impl<'a> FileRecords<'a> {
    /// The records of the log file `txn` reads (and of `tail`'s rows past it), none
    /// larger than `record_bytes_max`.
    pub(crate) fn new(txn: &'a ReadTransaction, tail: Option<&'a crate::journal::Tail>, record_bytes_max: u64) -> Self {
        FileRecords {
            txn,
            tail,
            rows: &[],
            table: std::cell::OnceCell::new(),
            record_bytes_max,
            lists: Default::default(),
        }
    }

    /// The records of the log file `txn` reads and, past its last one, of `rows`: the
    /// journal's rows in seq order, as [`crate::journal::rows_after`] gives them. None
    /// larger than `record_bytes_max`.
    pub fn over_rows(txn: &'a ReadTransaction, rows: &'a [crate::journal::JournalRow], record_bytes_max: u64) -> Self {
        FileRecords { rows, ..FileRecords::new(txn, None, record_bytes_max) }
    }
}

/// The stored bytes of record `seq`, unchecked: the journal's row in `tail` if it has
/// one, else the log file's that `txn` reads, through `table` (opened at the first read).
pub(crate) fn record_bytes(
    txn: &ReadTransaction,
    table: &std::cell::OnceCell<redb::ReadOnlyTable<u64, &'static [u8]>>,
    tail: Option<&crate::journal::Tail>,
    seq: u64,
) -> Result<Option<Vec<u8>>> {
    if let Some(row) = tail.and_then(|t| t.get(seq)) {
        return Ok(Some(row.record.clone()));
    }
    let table = match table.get() {
        Some(table) => table,
        None => {
            let opened = txn.open_table(LOG)?;
            table.get_or_init(|| opened)
        }
    };
    Ok(table.get(seq)?.map(|g| g.value().to_vec()))
}

impl crate::store::Records for FileRecords<'_> {
    fn record(&self, seq: u64) -> Result<Option<Record>> {
        let bytes = match self.rows.binary_search_by_key(&seq, |row| row.seq) {
            Ok(i) => Some(self.rows[i].record.clone()),
            Err(_) => record_bytes(self.txn, &self.table, self.tail, seq)?,
        };
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let decoded = decode_record(&bytes, self.record_bytes_max).map_err(|source| Error::Decode { seq, source })?;
        Ok(Some(decoded.record))
    }
    fn message_list(&self, seq: u64) -> Result<Option<std::sync::Arc<[ContentId]>>> {
        if let Some(list) = self.lists.borrow().get(&seq) {
            return Ok(Some(list.clone()));
        }
        let Some(record) = self.record(seq)? else {
            return Ok(None);
        };
        let list = crate::transcript::list_of(&record);
        let mut lists = self.lists.borrow_mut();
        if lists.len() >= FILE_LISTS_MAX {
            lists.clear();
        }
        lists.insert(seq, list.clone());
        Ok(Some(list))
    }
}

/// What [`append`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Appended {
    /// Records.
    pub records: u64,
    /// Record bytes.
    pub record_bytes: u64,
    /// Content row bytes.
    pub content_bytes: u64,
}

/// Seals `entries` after `tip`: each record encoded with its chain hash, each content
/// row built. The entries' seqs must follow `tip` densely (the caller assigned them).
pub(crate) fn seal(
    tip: Tip,
    chain: &LogChain,
    record_bytes_max: u64,
    entries: &[Entry],
) -> Result<(Tip, Vec<crate::journal::Sealed>)> {
    let mut next = tip;
    let mut sealed = Vec::with_capacity(entries.len());
    for entry in entries {
        let record = &entry.record;
        if record.seq != next.seq + 1 {
            return Err(Error::storage(format!("append: seq {} does not follow {}", record.seq, next.seq)));
        }
        let (bytes, hash) = encode_record(record, &next.hash, chain, record_bytes_max)
            .map_err(|e| Error::storage(format!("encode record {}: {e}", record.seq)))?;
        let len = entry.content.iter().map(|o| annal_codec::content::ENTRY_HEADER_LEN + o.bytes.len()).sum();
        let mut row = Vec::with_capacity(len);
        for object in &entry.content {
            push_stored(&mut row, &object.id, object.encoding, &object.bytes);
        }
        sealed.push(crate::journal::Sealed { seq: record.seq, record: bytes, content: row });
        next = Tip { seq: record.seq, hash, clock_ms: record.committed_at_ms.max(next.clock_ms) };
    }
    Ok((next, sealed))
}

/// Appends `entries` after `tip` in `txn`: records, content rows and the tip. The
/// entries' seqs must follow `tip` densely (the caller assigned them).
pub(crate) fn append(
    txn: &WriteTransaction,
    tip: Tip,
    chain: &LogChain,
    record_bytes_max: u64,
    entries: &[Entry],
) -> Result<(Tip, Appended)> {
    let (next, sealed) = seal(tip, chain, record_bytes_max, entries)?;
    let written = append_sealed(txn, tip.seq, sealed.iter(), &next)?;
    Ok((next, written))
}

/// Appends sealed rows after seq `after` in `txn`, and `tip` (the last of them) in
/// `meta`: the one appender, for a group commit, an import and a journal's absorption.
pub(crate) fn append_sealed<'a>(
    txn: &WriteTransaction,
    after: u64,
    rows: impl Iterator<Item = &'a crate::journal::Sealed>,
    tip: &Tip,
) -> Result<Appended> {
    let rows: Vec<&crate::journal::Sealed> = rows.collect();
    let mut written = Appended::default();
    for (expected, row) in (after + 1..).zip(&rows) {
        if row.seq != expected {
            return Err(Error::storage(format!("append: seq {} does not follow {}", row.seq, expected - 1)));
        }
        written.records += 1;
        written.record_bytes += row.record.len() as u64;
        written.content_bytes += row.content.len() as u64;
    }
    let mut log = txn.open_table(LOG)?;
    if let Some(last) = log.last()?.map(|(k, _)| k.value()).filter(|&last| last > after) {
        // The tip the caller read says the log ends at `after`: a record past it would be
        // overwritten, so the file is not what the tip says.
        return Err(Error::corrupt(
            Location::Log { seq: last },
            format!("the log holds seq {last} past its tip {after}"),
        ));
    }
    if !rows.is_empty() {
        // Every seq lies past the log's last one, in order.
        tables::write_at_end(&mut log, |end| {
            for row in &rows {
                end.insert_before(row.seq, row.record.as_slice())?;
            }
            Ok(())
        })?;
    }
    drop(log);
    let mut content = ContentWriter::open(txn)?;
    content.append_run(rows.iter().filter(|r| !r.content.is_empty()).map(|r| (r.seq, r.content.as_slice())))?;
    let mut meta = txn.open_table(META)?;
    meta.insert(meta_keys::TIP, tables::encode_tip(tip.seq, &tip.hash).as_slice())?;
    Ok(written)
}

/// Reads the log tip and last commit time, checking them against `meta`.
pub(crate) fn load_tip(txn: &ReadTransaction, chain: &LogChain) -> Result<Tip> {
    let meta = txn.open_table(META)?;
    let log = txn.open_table(LOG)?;
    let last = log.last()?.map(|(k, v)| (k.value(), v.value().to_vec()));
    let stored = meta.get(meta_keys::TIP)?.map(|g| tables::decode_tip(g.value())).transpose()?;
    let tip_location = || Location::Meta { key: meta_keys::TIP.into() };
    match (last, stored) {
        (None, None) => Ok(Tip { seq: 0, hash: chain.genesis(), clock_ms: 0 }),
        (Some((last_seq, bytes)), Some((seq, hash))) => {
            if last_seq != seq || annal_codec::stored_chain_hash(&bytes) != Some(hash) {
                return Err(Error::corrupt(
                    tip_location(),
                    format!("meta tip {seq} does not match the last record {last_seq}"),
                ));
            }
            let header =
                annal_codec::decode_header(&bytes, u64::MAX).map_err(|source| Error::Decode { seq, source })?;
            Ok(Tip { seq, hash, clock_ms: header.committed_at_ms })
        }
        _ => Err(Error::corrupt(tip_location(), "meta tip and log disagree about emptiness")),
    }
}

/// The chain hash stored in record `seq` (`genesis` for 0).
pub(crate) fn hash_at(log: &impl ReadableTable<u64, &'static [u8]>, chain: &LogChain, seq: u64) -> Result<ChainHash> {
    if seq == 0 {
        return Ok(chain.genesis());
    }
    match log.get(seq)? {
        Some(g) => annal_codec::stored_chain_hash(g.value())
            .ok_or_else(|| Error::corrupt(Location::Log { seq }, "record too short")),
        None => Err(Error::corrupt(Location::Log { seq }, "missing record")),
    }
}

/// The ids of the objects in the content row of record `seq`.
pub(crate) fn ids_in_row(row: &[u8], seq: u64, object_bytes_max: u64) -> Result<Vec<ContentId>> {
    entries(row, object_bytes_max).map(|e| e.map(|e| e.id).map_err(|e| row_damage(seq, e))).collect()
}

/// The error of a content row of record `seq` whose entries do not parse.
fn row_damage(seq: u64, e: annal_codec::DecodeError) -> Error {
    Error::corrupt(Location::Log { seq }, format!("content row: {e}"))
}

/// Object `id` of `row`, the content row of record `seq`, checked against its id; `None`
/// when the row holds no object of that id.
pub(crate) fn find_object(row: &[u8], seq: u64, id: &ContentId, object_bytes_max: u64) -> Result<Option<Vec<u8>>> {
    let location = || Location::Content { id: id.to_hex() };
    let Some(entry) = annal_codec::content::find(row, id, object_bytes_max)
        .map_err(|e| Error::corrupt(location(), format!("content row {seq}: {e}")))?
    else {
        return Ok(None);
    };
    let bytes = entry.canonical(object_bytes_max).map_err(|e| Error::corrupt(location(), e.to_string()))?;
    if annal_codec::content_id(&bytes) != *id {
        return Err(Error::corrupt(location(), "bytes do not hash to the id"));
    }
    Ok(Some(bytes.into_owned()))
}

/// Reads the log after a seq, in order: each record chain-checked against the one
/// before it, decoded, and paired with the ids of the content it introduced. Stops at
/// the first error (a gap, a broken chain, a record that does not decode).
pub struct LogTail {
    log: redb::Range<'static, u64, &'static [u8]>,
    /// The journalled rows past the log file's snapshot.
    journal: crate::journal::Tail,
    content: ContentCursor,
    chain: LogChain,
    prev: ChainHash,
    next_seq: u64,
    last_seq: u64,
    record_bytes_max: u64,
    object_bytes_max: u64,
    failed: bool,
}

/// The content rows of a [`LogTail`]'s log file, read in seq order beside its records:
/// one range scan instead of a lookup from the root a record (about a seventh of a
/// rebuild's time on the comparison's workload). From the seq in
/// `meta_keys::CONTENT_IDS_FROM` on, a row's ids come from its ids row
/// (`tables::CONTENT_IDS`) and the row itself is not read; an ids row that lists none
/// sends the reader to the row. Rows are asked for in increasing seq order. A row the
/// scan cannot read whole (damaged pieces, a row in both tables) is read again by seq,
/// and so is every row after it, so that an error is reported at the seq it belongs to
/// and reads as a lookup's would.
struct ContentCursor {
    reader: ContentReader,
    /// The scan of the rows before the listed ones, until it meets a row it cannot read.
    rows: Option<crate::pieces::RowIds<'static>>,
    /// The next row the scan read and no record asked for yet: its seq and its ids.
    pending: Option<(u64, crate::pieces::IdsOrDamage)>,
    /// The first seq whose ids are listed, and the scan of the ids rows from there.
    listed: Option<(u64, redb::Range<'static, u64, &'static [u8]>)>,
    /// The next ids row the scan read and no record asked for yet.
    pending_listed: Option<(u64, Option<Vec<ContentId>>)>,
    object_bytes_max: u64,
}

impl ContentCursor {
    /// A cursor over the rows of `seqs`, whose ids are listed from `listed_from` on.
    fn new(
        reader: ContentReader,
        seqs: std::ops::RangeInclusive<u64>,
        listed_from: u64,
        object_bytes_max: u64,
    ) -> Result<ContentCursor> {
        let (lo, hi) = (*seqs.start(), *seqs.end());
        let listed = match reader.ids_owned(lo.max(listed_from)..=hi)? {
            Some(range) if listed_from <= hi => Some((listed_from, range)),
            _ => None,
        };
        let before = match &listed {
            Some((from, _)) => lo..=hi.min(from.saturating_sub(1)),
            None => seqs,
        };
        let rows = Some(reader.range_owned(before)?.ids(object_bytes_max));
        Ok(ContentCursor { reader, rows, pending: None, listed, pending_listed: None, object_bytes_max })
    }

    /// The ids of the content row of record `seq`, none if it has no row; `seq` is above
    /// every seq asked for before.
    fn ids(&mut self, seq: u64) -> Result<Vec<ContentId>> {
        match &self.listed {
            Some((from, _)) if seq >= *from => match self.listed_ids(seq)? {
                Some(ids) => Ok(ids),
                None => self.looked_up(seq),
            },
            _ => self.scanned_ids(seq),
        }
    }

    /// The ids row of `seq`: `Ok(Some(ids))`, or `Ok(None)` when the row must be read
    /// (its ids row lists none or is damaged). A seq without an ids row has no row.
    fn listed_ids(&mut self, seq: u64) -> Result<Option<Vec<ContentId>>> {
        loop {
            match self.pending_listed.take() {
                Some((s, ids)) if s == seq => return Ok(ids),
                Some(later) if later.0 > seq => {
                    self.pending_listed = Some(later);
                    return Ok(Some(Vec::new()));
                }
                // An ids row of a seq that no record asked for: passed over.
                Some(_) | None => {}
            }
            let Some((_, range)) = self.listed.as_mut() else { return Ok(None) };
            match range.next() {
                Some(Ok((k, v))) => self.pending_listed = Some((k.value(), crate::pieces::listed_ids(v.value()))),
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(Some(Vec::new())),
            }
        }
    }

    /// The ids of the row of `seq`, read from the row by a lookup.
    fn looked_up(&self, seq: u64) -> Result<Vec<ContentId>> {
        match self.reader.get(seq)? {
            Some(row) => ids_in_row(&row, seq, self.object_bytes_max),
            None => Ok(Vec::new()),
        }
    }

    /// The ids of the row of `seq`, from the scan of the rows. The scan reads the ids
    /// from the row's pieces where they lie; a lookup joins the row and reads them from
    /// it, with the same result.
    fn scanned_ids(&mut self, seq: u64) -> Result<Vec<ContentId>> {
        loop {
            let Some(rows) = self.rows.as_mut() else {
                return self.looked_up(seq);
            };
            if self.pending.is_none() {
                match rows.next() {
                    Some(Ok(row)) => self.pending = Some(row),
                    Some(Err(_)) => self.rows = None,
                    None => return Ok(Vec::new()),
                }
                continue;
            }
            match self.pending.take() {
                Some((s, ids)) if s == seq => return ids.map_err(|e| row_damage(seq, e)),
                Some(later) if later.0 > seq => {
                    self.pending = Some(later);
                    return Ok(Vec::new());
                }
                // A row below the seq asked for: not the order this cursor serves.
                _ => self.rows = None,
            }
        }
    }
}

/// One record read by [`LogTail`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The decoded record.
    pub record: Record,
    /// The content objects stored with it (its content row), in row order.
    pub introduced: Vec<ContentId>,
    /// The record's stored size.
    pub bytes: u64,
}

impl LogTail {
    /// Reads records `after + 1 ..= last` of the log in `txn` and, past it, in `journal`.
    /// The chain hash of the record the walk starts after.
    pub(crate) fn prev(&self) -> ChainHash {
        self.prev
    }

    pub(crate) fn new(
        txn: &ReadTransaction,
        journal: &crate::journal::Tail,
        chain: &LogChain,
        after: u64,
        last: u64,
        record_bytes_max: u64,
        object_bytes_max: u64,
    ) -> Result<LogTail> {
        let log = txn.open_table(LOG)?;
        let prev = match journal.get(after) {
            Some(row) => annal_codec::stored_chain_hash(&row.record)
                .ok_or_else(|| Error::corrupt(Location::Log { seq: after }, "record too short"))?,
            None => hash_at(&log, chain, after)?,
        };
        let file_last = journal.first_seq().map_or(last, |f| last.min(f.saturating_sub(1)));
        Ok(LogTail {
            prev,
            log: log.range(after + 1..=file_last.max(after))?,
            journal: journal.after(after),
            content: ContentCursor::new(
                ContentReader::open(txn)?,
                after + 1..=file_last,
                content_ids_from(txn)?,
                object_bytes_max,
            )?,
            chain: chain.clone(),
            next_seq: after + 1,
            last_seq: last,
            record_bytes_max,
            object_bytes_max,
            failed: false,
        })
    }

    fn read(&mut self, seq: u64, raw: &[u8], row: Option<&[u8]>) -> Result<LogEntry> {
        if seq != self.next_seq {
            return Err(Error::corrupt(Location::Log { seq: self.next_seq }, format!("gap: next record is {seq}")));
        }
        let hash = verify_chain(raw, &self.prev, &self.chain, seq).map_err(|source| Error::Decode { seq, source })?;
        let decoded = decode_record(raw, self.record_bytes_max).map_err(|source| Error::Decode { seq, source })?;
        if decoded.record.seq != seq {
            return Err(Error::corrupt(Location::Log { seq }, "record seq differs from its key"));
        }
        let introduced = match row {
            Some(row) => ids_in_row(row, seq, self.object_bytes_max)?,
            None => self.content.ids(seq)?,
        };
        self.prev = hash;
        self.next_seq += 1;
        Ok(LogEntry { record: decoded.record, introduced, bytes: raw.len() as u64 })
    }
}

impl Iterator for LogTail {
    type Item = Result<LogEntry>;

    fn next(&mut self) -> Option<Result<LogEntry>> {
        if self.failed {
            return None;
        }
        let item = match self.log.next() {
            Some(Ok((k, v))) => self.read(k.value(), v.value(), None),
            Some(Err(e)) => Err(e.into()),
            None if self.next_seq <= self.last_seq && self.journal.get(self.next_seq).is_some() => {
                // The tail shares its batches: a clone is one reference count.
                let tail = self.journal.clone();
                let row = tail.get(self.next_seq).expect("checked above");
                self.read(row.seq, &row.record, Some(&row.content))
            }
            None if self.next_seq <= self.last_seq => {
                Err(Error::corrupt(Location::Log { seq: self.next_seq }, "missing record before the tip"))
            }
            None => return None,
        };
        self.failed = item.is_err();
        Some(item)
    }
}

/// Records a [`read_ahead`] thread hands over at a time, and batches of them it reads
/// ahead of the fold.
const READ_BATCH: usize = 1024;
const READ_AHEAD: usize = 16;

/// Reads the log file of `txn` after `after` up to `last` ([`LogTail`]: chain-checked,
/// decoded, with the ids of the content each record introduced) on a thread of `scope`,
/// in batches, ahead of the caller: a rebuild or catch-up folds on its own thread while
/// the next records are read. Returns the next record, `None` after the last; the first
/// error ends the read. The thread stops when the returned reader is dropped.
pub(crate) fn read_ahead<'scope, 'env: 'scope>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    txn: &'env ReadTransaction,
    chain: &'env LogChain,
    after: u64,
    last: u64,
    record_bytes_max: u64,
    object_bytes_max: u64,
) -> impl FnMut() -> Result<Option<LogEntry>> + 'scope {
    let (to_fold, read) = crossbeam_channel::bounded::<Result<Vec<LogEntry>>>(READ_AHEAD);
    scope.spawn(move || {
        let tail = crate::journal::Tail::default();
        let entries = match LogTail::new(txn, &tail, chain, after, last, record_bytes_max, object_bytes_max) {
            Ok(entries) => entries,
            Err(e) => return drop(to_fold.send(Err(e))),
        };
        let mut batch = Vec::with_capacity(READ_BATCH);
        for entry in entries {
            match entry {
                Ok(entry) => batch.push(entry),
                Err(e) => return drop(to_fold.send(Err(e))),
            }
            if batch.len() == READ_BATCH
                && to_fold.send(Ok(std::mem::replace(&mut batch, Vec::with_capacity(READ_BATCH)))).is_err()
            {
                return;
            }
        }
        if !batch.is_empty() {
            let _ = to_fold.send(Ok(batch));
        }
    });
    let mut batch = Vec::new().into_iter();
    move || loop {
        if let Some(entry) = batch.next() {
            return Ok(Some(entry));
        }
        match read.recv() {
            Ok(next) => batch = next?.into_iter(),
            Err(_) => return Ok(None),
        }
    }
}

/// What the log file's `meta` says about opening it.
pub(crate) enum LogState {
    /// Ready: format and key check out.
    Ready,
    /// A new, empty file: the format (and key check) must be written.
    New,
}

/// Checks the log file's format and key on a read snapshot.
pub(crate) fn check_log(txn: &ReadTransaction, chain: &LogChain) -> Result<LogState> {
    let names = refuse_projections_file(txn)?;
    if !names.iter().any(|n| n == META.name_str()) {
        return if names.is_empty() { Ok(LogState::New) } else { Err(missing_format()) };
    }
    let meta = txn.open_table(META)?;
    let format = meta.get(meta_keys::FORMAT)?.map(|g| tables::meta_u64(g.value()));
    let log_empty = !names.iter().any(|n| n == LOG.name_str()) || txn.open_table(LOG)?.is_empty()?;
    let state = match format {
        None if log_empty => LogState::New,
        None => return Err(missing_format()),
        Some(Some(v)) if tables::readable_format(v) => LogState::Ready,
        Some(Some(1)) => return Err(Error::MigrationRequired { found: 1, supported: tables::FORMAT }),
        Some(found) => {
            return Err(Error::UnsupportedFormat { found: found.unwrap_or(0) as u32, supported: tables::FORMAT })
        }
    };
    if matches!(state, LogState::Ready) {
        check_key(meta.get(meta_keys::KEY_CHECK)?.map(|g| g.value().to_vec()), chain)?;
    }
    Ok(state)
}

/// The names of the file's tables, or `InvalidRequest` if the file is a projections
/// file (a `projections` table and no log), which a path given in place of its log file
/// would otherwise have opened, migrated or written to as a log.
pub(crate) fn refuse_projections_file(txn: &ReadTransaction) -> Result<Vec<String>> {
    let names: Vec<String> = txn.list_tables()?.map(|t| redb::TableHandle::name(&t).to_string()).collect();
    let has = |name: &str| names.iter().any(|n| n == name);
    if has(tables::PROJECTIONS.name_str()) && !has(LOG.name_str()) {
        return Err(Error::Rejected(crate::error::Rejection::InvalidRequest {
            reason: "this is a projections file, not a log file: name the log file beside it".into(),
        }));
    }
    Ok(names)
}

fn missing_format() -> Error {
    Error::corrupt(Location::Meta { key: meta_keys::FORMAT.into() }, "missing format version")
}

fn check_key(stored: Option<Vec<u8>>, chain: &LogChain) -> Result<()> {
    match (stored, chain.key_check()) {
        (Some(_), None) => Err(Error::KeyMismatch { detail: "the database has a keyed chain; supply its key".into() }),
        (None, Some(_)) => {
            Err(Error::KeyMismatch { detail: "the database has a plain chain; open it without a key".into() })
        }
        (Some(s), Some(k)) if s[..] != k[..] => Err(Error::KeyMismatch { detail: "wrong chain key".into() }),
        _ => Ok(()),
    }
}

/// Writes this release's format number into a log file of a format it reads as it is
/// (`tables::FORMAT_APPEND_ONLY_V1`, `tables::FORMAT_BEFORE_JOURNAL`,
/// `tables::FORMAT_WHOLE_CONTENT_ROWS`): from then on it
/// may hold what that release cannot read (records it cannot decode, commits in the
/// journal), and the number tells it so at open.
pub(crate) fn upgrade_format(db: &Database) -> Result<bool> {
    let current = {
        let txn = db.begin_read()?;
        let meta = txn.open_table(META)?;
        let format = meta.get(meta_keys::FORMAT)?.and_then(|g| tables::meta_u64(g.value()));
        format
    };
    if current == Some(tables::FORMAT as u64) {
        return Ok(false);
    }
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    // The rows written from now on have their ids listed; those before are read for them
    // (`annal migrate` lists theirs too).
    let next = match txn.open_table(LOG)?.last()? {
        Some((k, _)) => k.value() + 1,
        None => 1,
    };
    txn.open_table(tables::CONTENT_IDS)?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(meta_keys::FORMAT, tables::FORMAT.to_le_bytes().as_slice())?;
        meta.insert(meta_keys::CONTENT_IDS_FROM, next.to_le_bytes().as_slice())?;
    }
    txn.commit()?;
    Ok(true)
}

/// The first seq from which every content row of the log file in `txn` has its ids
/// listed (`tables::CONTENT_IDS`); `u64::MAX` in a file of an earlier format, or one whose
/// key is unreadable, whose rows are all read for their ids.
pub(crate) fn content_ids_from(txn: &ReadTransaction) -> Result<u64> {
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(u64::MAX),
        Err(e) => return Err(e.into()),
    };
    let from = meta.get(meta_keys::CONTENT_IDS_FROM)?.and_then(|g| tables::meta_u64(g.value()));
    Ok(from.unwrap_or(u64::MAX))
}

/// Opens the log of `db` for writing: checks format and key, writes them into a new
/// file (or this release's format number into a file of the previous append-only format:
/// the only writes an open makes to the log file), and returns the tip.
pub(crate) fn open_log(db: &Database, chain: &LogChain) -> Result<Tip> {
    if let LogState::Ready = check_log(&db.begin_read()?, chain)? {
        upgrade_format(db)?;
    } else {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        tables::create_log_tables(&txn)?;
        {
            let mut meta = txn.open_table(META)?;
            meta.insert(meta_keys::FORMAT, tables::FORMAT.to_le_bytes().as_slice())?;
            meta.insert(meta_keys::CONTENT_IDS_FROM, 1u64.to_le_bytes().as_slice())?;
            if let Some(check) = chain.key_check() {
                meta.insert(meta_keys::KEY_CHECK, check.as_slice())?;
            }
        }
        txn.commit()?;
    }
    load_tip(&db.begin_read()?, chain)
}

/// The name of a table definition, as a `&str`.
trait NameStr {
    fn name_str(&self) -> &str;
}

impl<K: redb::Key, V: redb::Value> NameStr for redb::TableDefinition<'_, K, V> {
    fn name_str(&self) -> &str {
        redb::TableHandle::name(self)
    }
}

/// A read snapshot of `db` and its log tip, checked (a new, empty file has tip 0); for
/// read-only openers.
pub(crate) fn read_tip(db: &dyn ReadableDatabase, chain: &LogChain) -> Result<(ReadTransaction, Tip)> {
    let txn = db.begin_read()?;
    match check_log(&txn, chain)? {
        LogState::Ready => {}
        LogState::New => return Ok((txn, Tip { seq: 0, hash: chain.genesis(), clock_ms: 0 })),
    }
    let tip = load_tip(&txn, chain)?;
    Ok((txn, tip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pieces::PIECES;

    #[test]
    fn a_staged_row_answers_for_its_own_seq_only() {
        let entry = |seq: u64, ids: &[u8]| Entry {
            record: Record {
                seq,
                session: annal_codec::SessionId([1; 16]),
                stream_seq: seq,
                committed_at_ms: seq,
                event: annal_codec::Event::SessionArchived(annal_codec::SessionArchived { reason: String::new() }),
            },
            content: ids.iter().map(|b| StoredObject::raw(ContentId([*b; 32]), vec![*b])).collect(),
        };
        let (earlier, own) = ([entry(10, &[1, 2]), entry(11, &[])], [entry(12, &[3])]);
        let staged = Staged([&earlier, &own]);
        let holds = |seq, b: u8| staged.holds(seq, &ContentId([b; 32]));
        assert_eq!(
            (holds(10, 2), holds(10, 3), holds(11, 1), holds(12, 3)),
            (Some(true), Some(false), Some(false), Some(true))
        );
        assert_eq!(staged.record(12).map(|r| r.seq), Some(12));
        // Rows before the batch or past it are the store's to read.
        assert_eq!((holds(9, 1), holds(13, 3), holds(0, 1)), (None, None, None));
        assert_eq!(Staged::default().holds(10, &ContentId([1; 32])), None);
    }

    /// The appender writes records, content rows and the tip; it refuses a seq that does
    /// not follow, and a log that already holds a record past the tip it was given,
    /// writing nothing.
    #[test]
    fn the_appender_writes_past_the_tip_only() {
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new()).unwrap();
        let sealed = |seq: u64, content: Vec<u8>| crate::journal::Sealed { seq, record: vec![seq as u8; 40], content };
        let tip = |seq| Tip { seq, hash: ChainHash([seq as u8; 32]), clock_ms: 0 };
        let txn = db.begin_write().unwrap();
        let rows = [sealed(1, row(&[b"a", b"b"])), sealed(2, Vec::new()), sealed(3, row(&[&[3u8; 2_500]]))];
        let written = append_sealed(&txn, 0, rows.iter(), &tip(3)).unwrap();
        assert_eq!((written.records, written.record_bytes), (3, 120));
        txn.commit().unwrap();
        let read = db.begin_read().unwrap();
        let log = read.open_table(LOG).unwrap();
        assert_eq!(log.iter().unwrap().map(|e| e.unwrap().0.value()).collect::<Vec<_>>(), [1, 2, 3]);
        let content = ContentReader::open(&read).unwrap();
        assert_eq!(content.get(3).unwrap(), Some(rows[2].content.clone()));
        assert_eq!(content.get(2).unwrap(), None);
        let meta = read.open_table(META).unwrap();
        assert_eq!(meta.get(meta_keys::TIP).unwrap().unwrap().value(), tables::encode_tip(3, &tip(3).hash).as_slice());
        drop((log, content, meta, read));

        let txn = db.begin_write().unwrap();
        let gap = append_sealed(&txn, 3, [sealed(5, Vec::new())].iter(), &tip(5));
        assert!(matches!(gap, Err(Error::Storage(_))), "{gap:?}");
        let behind = append_sealed(&txn, 1, [sealed(2, Vec::new())].iter(), &tip(2));
        assert!(matches!(behind, Err(Error::Corrupt { .. })), "{behind:?}");
        drop(txn);
        let read = db.begin_read().unwrap();
        assert_eq!(read.open_table(LOG).unwrap().len().unwrap(), 3);
    }

    /// A content row of `objects`, each stored raw.
    fn row(objects: &[&[u8]]) -> Vec<u8> {
        let mut row = Vec::new();
        for o in objects {
            annal_codec::content::push_entry(&mut row, &annal_codec::content_id(o), o);
        }
        row
    }

    /// The cursor's ids and errors are those of a lookup by seq, seq after seq: rows in
    /// pieces (entries across the pieces' boundaries) and whole (an older file's), rows
    /// whose entries are cut short or too long, a row with a piece missing, a row stored
    /// both ways, and the rows after them.
    #[test]
    fn a_content_cursor_reads_as_lookups_by_seq_do() {
        let (big, small) = ([7u8; 1_500], [1u8; 20]);
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new()).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut whole = txn.open_table(crate::tables::CONTENT).unwrap();
            whole.insert(3, row(&[&small, b"x"]).as_slice()).unwrap();
            whole.insert(8, [8u8; 30].as_slice()).unwrap();
            drop(whole);
            let mut rows = ContentWriter::open(&txn).unwrap();
            rows.append(2, &row(&[&big, &small, &big, b""])).unwrap();
            rows.append(5, &[5u8; 10]).unwrap();
            rows.append(8, &row(&[&small])).unwrap();
            let long = row(&[&big, &big]);
            rows.append(9, &long[..long.len() - 1]).unwrap();
            rows.append(10, &row(&[&[3u8; 300]])).unwrap();
            rows.append(11, &row(&[small.as_slice(); 27])).unwrap();
            rows.append(12, &[12u8; 3]).unwrap();
            drop(rows);
            // Row 6: pieces 0 and 2, piece 1 missing.
            let mut pieces = txn.open_table(PIECES).unwrap();
            pieces.insert((6, 0), row(&[&big]).get(..1_000).unwrap()).unwrap();
            pieces.insert((6, 2), [6u8; 7].as_slice()).unwrap();
        }
        txn.commit().unwrap();
        let txn = db.begin_read().unwrap();
        let reader = ContentReader::open(&txn).unwrap();
        // Under a limit of 1,000 bytes row 2's objects are too long; under a MiB it is
        // four pieces of whole entries.
        for max in [1_000, 1 << 20] {
            let expected: Vec<std::result::Result<Vec<ContentId>, String>> = (1..=13)
                .map(|seq| match reader.get(seq) {
                    Ok(Some(row)) => ids_in_row(&row, seq, max).map_err(|e| e.to_string()),
                    Ok(None) => Ok(Vec::new()),
                    Err(e) => Err(e.to_string()),
                })
                .collect();
            let row_2 = expected[1].as_ref().map(Vec::len);
            if max == 1_000 {
                assert!(row_2.is_err_and(|e| e.contains("exceeds")), "{row_2:?}");
            } else {
                assert_eq!(row_2, Ok(4));
            }
            assert_eq!(expected[2].as_ref().map(Vec::len), Ok(2), "a whole row of an older file");
            assert!(expected[4].is_err() && expected[5].is_err(), "row 5 is no row of entries, row 6 is damaged");
            assert_eq!(expected[7].as_ref().map(Vec::len), Ok(1), "pieces first, as a lookup");
            assert!(expected[8].is_err(), "row 9 is cut short");
            assert_eq!(expected[10].as_ref().map(Vec::len), Ok(27), "row 11: entries across the pieces");
            // Rows 7 on were all written by the writer, which lists their ids (rows that
            // do not parse as ones to read): listed from there, they read the same
            // under a limit their objects keep to.
            let listed = if max == 1_000 { vec![u64::MAX] } else { vec![u64::MAX, 7] };
            for from in listed {
                let open = || ContentCursor::new(ContentReader::open(&txn).unwrap(), 1..=13, from, max).unwrap();
                let mut cursor = open();
                let got: Vec<std::result::Result<Vec<ContentId>, String>> =
                    (1..=13).map(|seq| cursor.ids(seq).map_err(|e| e.to_string())).collect();
                assert_eq!(got, expected, "limit {max}, listed from {from}");
                // Asked for every other seq, it skips the rows between.
                let mut cursor = open();
                for seq in [2, 4, 10, 11, 12, 13] {
                    assert_eq!(cursor.ids(seq).map_err(|e| e.to_string()), expected[seq as usize - 1], "seq {seq}");
                }
            }
        }
        // The listing is what the cursor reads from its first seq on: the writer's ids
        // for the rows it wrote, none for a row written around it (row 6), and for row 3,
        // a whole row of an older file, none either (such a file lists from its last
        // record on).
        let mut cursor = ContentCursor::new(ContentReader::open(&txn).unwrap(), 1..=13, 1, 1 << 20).unwrap();
        let lens: Vec<_> = (1..=13).map(|seq| cursor.ids(seq).map(|ids| ids.len()).map_err(drop)).collect();
        let err = Err(());
        assert_eq!(lens, [Ok(0), Ok(4), Ok(0), Ok(0), err, Ok(0), Ok(0), Ok(1), err, Ok(1), Ok(27), err, Ok(0)]);
    }

    /// The writer lists the ids of every row it writes, replaces them with the row and
    /// removes them with it; `fill_ids` lists the rows written before the listing.
    #[test]
    fn the_writer_keeps_each_rows_ids_beside_it() {
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new()).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut whole = txn.open_table(crate::tables::CONTENT).unwrap();
            whole.insert(1, row(&[b"old"]).as_slice()).unwrap();
            whole.insert(2, [9u8; 5].as_slice()).unwrap();
            drop(whole);
            let mut rows = ContentWriter::open(&txn).unwrap();
            rows.append(3, &row(&[b"a", b"b"])).unwrap();
            rows.append(4, &row(&[b"c"])).unwrap();
            rows.put(4, &row(&[b"d", b"e", b"f"])).unwrap();
            rows.append(5, &row(&[b"g"])).unwrap();
            rows.remove(5).unwrap();
        }
        let listed = |txn: &redb::WriteTransaction| -> Vec<(u64, usize)> {
            let t = txn.open_table(crate::tables::CONTENT_IDS).unwrap();
            t.iter().unwrap().map(|e| e.unwrap()).map(|(k, v)| (k.value(), v.value().len())).collect()
        };
        assert_eq!(listed(&txn), [(3, 64), (4, 96)]);
        assert_eq!(ContentWriter::open(&txn).unwrap().fill_ids(0..=u64::MAX).unwrap(), 4);
        // Row 2 does not parse: listed as one to read.
        assert_eq!(listed(&txn), [(1, 32), (2, 0), (3, 64), (4, 96)]);
        let t = txn.open_table(crate::tables::CONTENT_IDS).unwrap();
        let ids = crate::pieces::listed_ids(t.get(4).unwrap().unwrap().value()).unwrap();
        let want: Vec<_> = [b"d", b"e", b"f"].iter().map(|o| annal_codec::content_id(*o)).collect();
        assert_eq!(ids, want);
        assert_eq!(crate::pieces::listed_ids(&[1u8; 33]), None, "a damaged ids row sends the reader to the row");
    }
}
