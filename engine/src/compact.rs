//! Compaction: giving a file's free pages back to the file system, offline.
//!
//! redb keeps the pages a transaction frees for later transactions and never shrinks the
//! file by itself. A rebuild (which writes every projection anew), a bulk import or a
//! load in relaxed durability can leave much of a file free. Compaction moves the live
//! pages towards the start of the file and truncates it; no row changes.
//!
//! A closing engine also compacts a file of its own that is small enough
//! ([`Options::compact_on_close_bytes_max`]) and at least an eighth free
//! (`worth_compacting`): redb grows a small file by doubling it, so a file at rest would
//! otherwise keep up to half of its length unused.

use crate::engine::{Engine, Options};
use crate::error::{fail_closed, Error, Result};
use redb::{Database, StorageBackend};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Compaction passes at most; each can free the pages the previous one moved.
const PASSES_MAX: usize = 8;

/// What a compaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactStats {
    /// The file's size before.
    pub bytes_before: u64,
    /// The file's size after.
    pub bytes_after: u64,
    /// Wall time of the compaction itself.
    pub elapsed: Duration,
}

/// Compacts the database at `path`: the log file and its projections file. It is first
/// opened as an [`Engine`] with `options` (which checks the format and the chain key,
/// brings the projections up to the log and checkpoints them at close); then redb
/// compacts each file with it held exclusively, so no other process may have it open,
/// not even for reading (that is an [`Error::Storage`], and the file is left as it was).
/// The sizes reported are of both files together, the size before taken before the
/// engine opens them (an open and a close can grow them, which the compaction then
/// gives back: that is not space the compaction freed). A `path` that is not a file is
/// an [`Error::Storage`]: no database is made there.
pub fn compact(path: impl AsRef<Path>, options: Options) -> Result<CompactStats> {
    let path = path.as_ref();
    require_database_file(path)?;
    let bytes_before = database_len(path);
    Engine::open_with(path, options)?.close()?;
    compact_closed(path, bytes_before)
}

/// redb's compaction of the closed database at `path`, each of its two files held
/// exclusively in turn; `bytes_before` is both files' size before whatever the caller
/// did first, and the size after is of both files together.
fn compact_closed(path: &Path, bytes_before: u64) -> Result<CompactStats> {
    let files = database_files(path);
    let started = Instant::now();
    for file in &files {
        fail_closed("compact", || {
            let mut db = redb::Database::open(file).map_err(|e| Error::storage_in("open exclusively", e))?;
            compact_passes(&mut db).map_err(|e| Error::storage_in("compaction", e))
        })?;
    }
    Ok(CompactStats { bytes_before, bytes_after: database_len(path), elapsed: started.elapsed() })
}

/// The log file at `path` and its projections file.
fn database_files(path: &Path) -> [std::path::PathBuf; 2] {
    [path.to_path_buf(), crate::engine::projections_path(path)]
}

/// Refuses a `path` that is not a file: compacting or recompressing an existing database
/// must not make a new one where there was none.
fn require_database_file(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(Error::storage(format!("{} is not a file", path.display()))),
        Err(e) => Err(Error::storage_in(format_args!("{}", path.display()), e)),
    }
}

/// The length of the log file at `path` and its projections file together: a file that
/// does not exist (yet) counts as empty.
fn database_len(path: &Path) -> u64 {
    database_files(path).iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum()
}

/// Free space below which a closing engine leaves a file as it is: whatever its share of
/// the file, compacting less than this is not worth the work.
pub const CLOSE_SLACK_MIN_BYTES: u64 = 1 << 20;

/// The default of [`Options::compact_on_close_bytes_max`]: 64 MiB.
pub const COMPACT_ON_CLOSE_BYTES_MAX: u64 = 64 << 20;

/// Where a closing engine reads one of its files' length.
#[derive(Clone)]
pub(crate) enum FileLength {
    /// A file opened by path.
    Path(std::path::PathBuf),
    /// A storage backend's, as [`Measured`] last saw it.
    Measured(Arc<AtomicU64>),
    /// Memory, or a file the engine does not own: never compacted.
    Unknown,
}

impl FileLength {
    fn get(&self) -> Option<u64> {
        match self {
            FileLength::Path(path) => std::fs::metadata(path).ok().map(|m| m.len()),
            FileLength::Measured(len) => Some(len.load(Ordering::Acquire)),
            FileLength::Unknown => None,
        }
    }
}

/// A storage backend that keeps its current length where the engine can read it at
/// close, after redb owns the backend. Every call goes to `inner` unchanged.
#[derive(Debug)]
pub(crate) struct Measured<B> {
    inner: B,
    len: Arc<AtomicU64>,
}

impl<B: StorageBackend> Measured<B> {
    /// Wraps `inner`; the returned length follows it.
    pub(crate) fn new(inner: B) -> (Measured<B>, FileLength) {
        let len = Arc::new(AtomicU64::new(inner.len().unwrap_or(0)));
        (Measured { inner, len: len.clone() }, FileLength::Measured(len))
    }
}

impl<B: StorageBackend> StorageBackend for Measured<B> {
    fn len(&self) -> std::result::Result<u64, std::io::Error> {
        let len = self.inner.len()?;
        self.len.store(len, Ordering::Release);
        Ok(len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::result::Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> std::result::Result<(), std::io::Error> {
        self.inner.set_len(len)?;
        self.len.store(len, Ordering::Release);
        Ok(())
    }

    fn sync_data(&self) -> std::result::Result<(), std::io::Error> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::result::Result<(), std::io::Error> {
        self.inner.write(offset, data)?;
        self.len.fetch_max(offset.saturating_add(data.len() as u64), Ordering::AcqRel);
        Ok(())
    }

    fn close(&self) -> std::result::Result<(), std::io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> std::result::Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> std::result::Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> std::result::Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> std::result::Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> std::result::Result<bool, redb::BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

/// redb's compaction of `db`, repeated until a pass frees nothing (at most
/// [`PASSES_MAX`] passes): each can free the pages the previous one moved.
fn compact_passes(db: &mut Database) -> std::result::Result<(), redb::CompactionError> {
    for _ in 0..PASSES_MAX {
        if !db.compact()? {
            break;
        }
    }
    Ok(())
}

/// Whether a file of `len` bytes, of which `used` are allocated to redb's pages, is worth
/// compacting at close under the bound `max`: at most `max` long, and at least an eighth
/// of it (and [`CLOSE_SLACK_MIN_BYTES`]) free.
pub(crate) fn worth_compacting(len: u64, used: u64, max: u64) -> bool {
    let free = len.saturating_sub(used);
    len <= max && free >= CLOSE_SLACK_MIN_BYTES && free >= len / 8
}

/// Compacts `db` at close when [`worth_compacting`] says so, its length read from
/// `length`; returns whether it did. A transaction still open on it (another handle's
/// reader, or another process's) leaves it as it was; an I/O error is returned.
pub(crate) fn compact_at_close(db: &mut Database, length: &FileLength, max: u64) -> Result<bool> {
    let Some(len) = length.get().filter(|len| *len <= max) else {
        return Ok(false);
    };
    let used = {
        let txn = db.begin_write()?;
        let stats = txn.stats()?;
        txn.abort()?;
        stats.allocated_pages().saturating_mul(stats.page_size() as u64)
    };
    if !worth_compacting(len, used, max) {
        return Ok(false);
    }
    match compact_passes(db) {
        Ok(()) => Ok(true),
        Err(redb::CompactionError::Storage(e)) => Err(e.into()),
        Err(_) => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_worth_compacting_at_close_when_an_eighth_and_a_mib_are_free_under_the_bound() {
        const MIB: u64 = 1 << 20;
        let max = COMPACT_ON_CLOSE_BYTES_MAX;
        assert!(worth_compacting(9 * MIB, 7 * MIB, max), "2 of 9 MiB free");
        assert!(!worth_compacting(9 * MIB, 8 * MIB + MIB / 2, max), "under an eighth free");
        assert!(!worth_compacting(4 * MIB, 3 * MIB + MIB / 2, max), "an eighth, but under 1 MiB");
        assert!(worth_compacting(8 * MIB, 7 * MIB, max), "exactly an eighth and 1 MiB");
        assert!(!worth_compacting(max + 1, 0, max), "over the bound");
        assert!(worth_compacting(max, max / 2, max), "at the bound");
        assert!(!worth_compacting(9 * MIB, 10 * MIB, max), "more allocated than the length");
        assert!(!worth_compacting(9 * MIB, 0, 0), "turned off");
    }
}

/// Stored bytes of content rows rewritten in one transaction of [`recompress`] at most
/// (a row longer than this goes alone): the memory a recompression holds, and the work a
/// crash can lose.
pub const RECOMPRESS_TXN_BYTES: usize = 16 << 20;

/// What a recompression did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecompressStats {
    /// Content rows read.
    pub rows: u64,
    /// Of them, rewritten: some object of theirs is now stored differently.
    pub rows_rewritten: u64,
    /// Content objects read.
    pub objects: u64,
    /// Of them, stored differently now.
    pub objects_changed: u64,
    /// Objects left as they were because their stored bytes do not decode to bytes that
    /// hash to their id (`annal verify` names each of them).
    pub objects_damaged: u64,
    /// Stored bytes of every object before.
    pub stored_bytes_before: u64,
    /// Stored bytes of every object after.
    pub stored_bytes_after: u64,
    /// Both files' sizes before the recompression (before the engine opened them) and
    /// after the compaction that followed it, and the time of both.
    pub compact: CompactStats,
}

/// Stores every content object of the database at `path` the way `compression` stores
/// new ones (`annal_codec::content::encode_object_as`), then compacts both files as
/// [`compact()`] does. A host that turns on [`annal_codec::content::Compression::Zstd`]
/// shrinks what it wrote before with this; `Off` stores everything raw.
///
/// The engine is first opened with `options` and closed (which checks the format and the
/// chain key and moves the journal into the log file); the log file is then opened
/// exclusively, so no other process may have it open. Content rows are rewritten in seq
/// order, in transactions of at most [`RECOMPRESS_TXN_BYTES`]: ids, records, the chain
/// and the projections do not change (the content-id index names rows by seq, and each
/// row keeps its objects in their order), so a crash leaves a valid file whose rows are
/// partly in one encoding and partly in the other, and running it again finishes the
/// work. An object whose bytes do not hash to its id is left as it is and counted; a row
/// that does not parse is left whole. `progress` is called after each transaction with
/// the seq of the last row rewritten and the log's tip. A `path` that is not a file is
/// an [`Error::Storage`], as for [`compact`].
pub fn recompress(
    path: impl AsRef<Path>,
    compression: annal_codec::content::Compression,
    options: Options,
    progress: crate::rebuild::Progress<'_>,
) -> Result<RecompressStats> {
    let path = path.as_ref();
    require_database_file(path)?;
    let max = options.limits.message_object_bytes_max();
    let bytes_before = database_len(path);
    let engine = Engine::open_with(path, options)?;
    let tip = engine.tip()?.0;
    engine.close()?;
    let started = Instant::now();
    let mut stats = RecompressStats {
        rows: 0,
        rows_rewritten: 0,
        objects: 0,
        objects_changed: 0,
        objects_damaged: 0,
        stored_bytes_before: 0,
        stored_bytes_after: 0,
        compact: CompactStats { bytes_before: 0, bytes_after: 0, elapsed: Duration::ZERO },
    };
    fail_closed("recompress", || {
        let db = redb::Database::open(path).map_err(|e| Error::storage_in("open exclusively", e))?;
        let mut from = 0u64;
        loop {
            let txn = db.begin_write()?;
            let last = {
                let mut rows = crate::pieces::ContentWriter::open(&txn)?;
                let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
                let mut bytes = 0usize;
                for row in rows.range(from..=u64::MAX)? {
                    let (seq, row) = row?;
                    bytes += row.len();
                    batch.push((seq, row));
                    if bytes >= RECOMPRESS_TXN_BYTES {
                        break;
                    }
                }
                for (seq, row) in &batch {
                    if let Some(rewritten) = recompress_row(row, compression, max, &mut stats) {
                        rows.put(*seq, &rewritten)?;
                        stats.rows_rewritten += 1;
                    }
                }
                batch.last().map(|(seq, _)| *seq)
            };
            txn.commit()?;
            match last {
                Some(seq) if seq < u64::MAX => {
                    progress(seq, tip);
                    from = seq + 1;
                }
                _ => return Ok(()),
            }
        }
    })?;
    let compacted = compact_closed(path, bytes_before)?;
    stats.compact = CompactStats { elapsed: started.elapsed(), ..compacted };
    Ok(stats)
}

/// `row` with every object stored as `compression` stores it (objects at most `max`
/// bytes long), or `None` when that changes nothing; counts into `stats`.
fn recompress_row(
    row: &[u8],
    compression: annal_codec::content::Compression,
    max: u64,
    stats: &mut RecompressStats,
) -> Option<Vec<u8>> {
    use annal_codec::content::{encode_object_as, entries, push_stored};
    stats.rows += 1;
    let parsed: std::result::Result<Vec<_>, _> = entries(row, max).collect();
    let Ok(parsed) = parsed else {
        // A row that does not parse is left whole; its objects are uncounted.
        stats.stored_bytes_before += row.len() as u64;
        stats.stored_bytes_after += row.len() as u64;
        return None;
    };
    let mut rewritten = Vec::with_capacity(row.len());
    let mut changed = false;
    for entry in parsed {
        stats.objects += 1;
        stats.stored_bytes_before += entry.stored.len() as u64;
        match entry.verify(max) {
            Some(canonical) => {
                let (encoding, stored) = encode_object_as(&canonical, compression);
                if encoding != entry.encoding || stored != entry.stored {
                    stats.objects_changed += 1;
                    changed = true;
                }
                stats.stored_bytes_after += stored.len() as u64;
                push_stored(&mut rewritten, &entry.id, encoding, &stored);
            }
            None => {
                stats.objects_damaged += 1;
                stats.stored_bytes_after += entry.stored.len() as u64;
                push_stored(&mut rewritten, &entry.id, entry.encoding, entry.stored);
            }
        }
    }
    changed.then_some(rewritten)
}
