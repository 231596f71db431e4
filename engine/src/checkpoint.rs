//! Checkpoints: the delta's rows written into the projections file, behind the commit
//! path, and the folds that bring the projections file up to the log (recovery at open,
//! rebuild, read-only openers).
//!
//! The checkpointer is a thread of its own with its own redb database (the projections
//! file), so its transactions never wait for, or hold up, a log commit. It takes the
//! oldest frozen layer, writes the layer's newest rows in physical key order and moves
//! every projection's cursor to the layer's last seq, in one transaction, then drops the
//! layer from the delta. A crash at any point leaves the projections file at its last
//! committed checkpoint, and the next open folds the log past it.

use crate::delta::Delta;
use crate::delta::{LogSnap, LogUpdate};
use crate::error::{Error, Result};
use crate::evolve::evolve;
use crate::limits::Limits;
use crate::log::{hash_at, LogTail, Tip};
use crate::projection::{Projection, ProjectionSet};
use crate::rebuild::{Progress, RebuildStats};
use crate::store::WithRecords;
use crate::store::{Held, HeldRows, Overlay, Store, TypedOverlay, Written, WRITTEN_KEYS_MAX};
use crate::tables::{self, meta_keys, RedbStore, LOG, META, PROJECTIONS};
use annal_codec::{ChainHash, LogChain};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, WriteTransaction};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When the delta is checkpointed. A checkpoint starts when the active layer reaches
/// `events` events or `delta_bytes` bytes, when it is `interval` old, and at close.
/// `delta_bytes_max` bounds the whole delta: at it, the writer waits for the
/// checkpointer before it accepts more work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Events in the active layer that start a checkpoint. Default 16,384.
    pub events: u64,
    /// Bytes in the active layer that start a checkpoint. Default 32 MiB.
    pub delta_bytes: u64,
    /// Age of the oldest unflushed batch that starts a checkpoint. Default 1 s.
    pub interval: Duration,
    /// Bytes the whole delta may hold; past it commits wait for the checkpointer.
    /// Default 256 MiB.
    pub delta_bytes_max: u64,
}

impl Default for CheckpointPolicy {
    fn default() -> CheckpointPolicy {
        CheckpointPolicy {
            events: 16_384,
            delta_bytes: 32 << 20,
            interval: Duration::from_secs(1),
            delta_bytes_max: 256 << 20,
        }
    }
}

/// What the writer tells the checkpointer.
pub(crate) enum Signal {
    /// A layer was frozen.
    Work,
    /// Close: checkpoint everything, then stop.
    Stop,
}

/// Everything the checkpointer needs.
pub(crate) struct Checkpointer {
    pub delta: Arc<Delta>,
    pub projections: Arc<crate::engine::Db>,
    pub durability: redb::Durability,
    pub policy: CheckpointPolicy,
    pub poisoned: Arc<crate::error::Poison>,
    pub stats: Arc<crate::engine::EngineStats>,
}

impl Checkpointer {
    /// The checkpointer thread: checkpoints frozen layers as they come, freezes the
    /// active layer when it is `interval` old, and drains everything at close.
    pub fn run(self, rx: Receiver<Signal>) {
        let tick = self.policy.interval.min(Duration::from_millis(250)).max(Duration::from_millis(1));
        loop {
            let stop = match rx.recv_timeout(tick) {
                Ok(Signal::Work) | Err(RecvTimeoutError::Timeout) => false,
                Ok(Signal::Stop) | Err(RecvTimeoutError::Disconnected) => true,
            };
            let (_, _, age) = self.delta.active_stats();
            if stop || age.is_some_and(|a| a >= self.policy.interval) {
                self.delta.freeze();
            }
            if let Err(e) = crate::error::fail_closed("checkpoint", || self.drain()) {
                if !matches!(e, Error::Poisoned) {
                    self.poisoned.set(&e);
                }
                self.delta.notify();
                return;
            }
            if stop {
                return;
            }
        }
    }

    /// Checkpoints every frozen layer, oldest first.
    fn drain(&self) -> Result<()> {
        while let Some(layer) = self.delta.oldest_frozen() {
            if self.poisoned.load(Ordering::Acquire) {
                return Err(Error::Poisoned);
            }
            let rows = write_layer(&self.projections, &layer.read(), self.durability)?;
            self.delta.publish(&layer, self.projections.begin_read()?)?;
            self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
            self.stats.checkpoint_rows.fetch_add(rows, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Writes a layer's newest rows, merges its content-id index additions into the index's
/// rows, and moves every cursor to its last seq, in one transaction. Returns the rows
/// written.
pub(crate) fn write_layer(db: &Database, layer: &crate::delta::Layer, durability: redb::Durability) -> Result<u64> {
    let mut txn = db.begin_write()?;
    txn.set_durability(durability)?;
    let mut rows = layer.rows() as u64;
    {
        let mut table = txn.open_table(PROJECTIONS)?;
        for (key, value) in layer.newest() {
            match value {
                Some(v) => {
                    table.insert(key, v.as_slice())?;
                }
                None => {
                    table.remove(key)?;
                }
            }
        }
    }
    // After the layer's rows: the additions were folded after any row of the index the
    // layer holds (a collection, which removes entries, starts on an empty delta), and
    // a merge gives the rows the additions one by one would have.
    if !layer.content_adds().is_empty() {
        let mut store = crate::tables::RedbStore::open(&txn)?;
        let mut merged = crate::store::Overlay::new(&store);
        crate::buckets::content_merge(&mut merged, layer.content_adds().to_deferred())?;
        let writes = merged.into_writes();
        rows += writes.len() as u64;
        store.apply(&writes, None)?;
    }
    write_cursors(&txn, ProjectionSet::all(), layer.last_seq, &layer.last_hash)?;
    txn.commit()?;
    Ok(rows)
}

/// Writes the format, the versions and cursors of `set` and the checkpoint mark.
pub(crate) fn write_cursors(txn: &WriteTransaction, set: ProjectionSet, seq: u64, hash: &ChainHash) -> Result<()> {
    let mut meta = txn.open_table(META)?;
    meta.insert(meta_keys::FORMAT, tables::PROJECTIONS_FORMAT.to_le_bytes().as_slice())?;
    for p in set.iter() {
        tables::write_projection_meta(&mut meta, p, seq)?;
    }
    meta.insert(meta_keys::CHECKPOINT, tables::encode_tip(seq, hash).as_slice())?;
    Ok(())
}

/// Where each projection of a projections file stands against a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cursors {
    /// Per projection (in [`Projection::ALL`] order): the last seq folded, 0 for one that
    /// must be folded from the start.
    pub seqs: [u64; Projection::ALL.len()],
}

impl Cursors {
    fn all(seq: u64) -> Cursors {
        Cursors { seqs: [seq; Projection::ALL.len()] }
    }

    /// The smallest cursor.
    pub fn min(&self) -> u64 {
        self.seqs.iter().copied().min().unwrap_or(0)
    }

    /// The first seq of a chunk that starts at `first` from which the rows its fold
    /// writes are in no file and no chunk before it: past every cursor, so that no
    /// projection's rows in the base are from it ([`TypedOverlay::fresh_from`]).
    pub fn fresh_from(&self, first: u64) -> u64 {
        let max = self.seqs.iter().copied().max().unwrap_or(0);
        first.max(max.saturating_add(1))
    }

    /// The projections whose cursor is below `seq`.
    pub fn behind(&self, seq: u64) -> ProjectionSet {
        Projection::ALL.iter().zip(self.seqs).filter(|(_, c)| *c < seq).map(|(p, _)| *p).collect()
    }

    /// These cursors with the projections of `set` reset to 0.
    pub fn reset(mut self, set: ProjectionSet) -> Cursors {
        for (i, p) in Projection::ALL.iter().enumerate() {
            if set.contains(*p) {
                self.seqs[i] = 0;
            }
        }
        self
    }
}

/// Reads the cursors of a projections file snapshot and checks them against the log: a
/// projection with another version, a cursor that is not the checkpoint's, or a
/// checkpoint that is not on this log (past its tip, or another chain hash at that seq)
/// starts from 0.
pub(crate) fn read_cursors(
    proj: &ReadTransaction,
    log: &ReadTransaction,
    journal: &crate::journal::Tail,
    chain: &LogChain,
    tip: &Tip,
) -> Result<Cursors> {
    let Ok(meta) = proj.open_table(META) else {
        return Ok(Cursors::all(0));
    };
    let format = meta.get(meta_keys::FORMAT)?.and_then(|g| tables::meta_u64(g.value()));
    let mark = meta.get(meta_keys::CHECKPOINT)?.map(|g| tables::decode_tip(g.value())).transpose();
    let (seq, hash) = match (format, mark) {
        (Some(f), Ok(Some(mark))) if f == tables::PROJECTIONS_FORMAT as u64 => mark,
        _ => return Ok(Cursors::all(0)),
    };
    let stored = match journal.get(seq) {
        Some(row) => annal_codec::stored_chain_hash(&row.record),
        None if seq <= tip.seq => Some(hash_at(&log.open_table(LOG)?, chain, seq)?),
        None => None,
    };
    if stored != Some(hash) {
        return Ok(Cursors::all(0));
    }
    let mut cursors = Cursors::all(0);
    for (i, p) in Projection::ALL.iter().enumerate() {
        let version = meta.get(meta_keys::version(*p).as_str())?.and_then(|g| tables::meta_u64(g.value()));
        let cursor = meta.get(meta_keys::cursor(*p).as_str())?.and_then(|g| tables::meta_u64(g.value()));
        if version == Some(p.version() as u64) && cursor == Some(seq) {
            cursors.seqs[i] = seq;
        }
    }
    Ok(cursors)
}

/// Whether a projections file is exactly what a catch-up to the empty log `tip` leaves:
/// the current format, a checkpoint mark at seq 0 with the log's genesis hash, every
/// projection at its version with its cursor at 0, and no projection row. The open of an
/// empty log skips its catch-up then: it would write the same file again, in one more
/// durable commit.
pub(crate) fn caught_up_empty(proj: &ReadTransaction, tip: &Tip) -> Result<bool> {
    if tip.seq != 0 {
        return Ok(false);
    }
    let (Ok(meta), Ok(rows)) = (proj.open_table(META), proj.open_table(PROJECTIONS)) else {
        return Ok(false);
    };
    if rows.first()?.is_some() {
        return Ok(false);
    }
    let format = meta.get(meta_keys::FORMAT)?.and_then(|g| tables::meta_u64(g.value()));
    let mark = meta.get(meta_keys::CHECKPOINT)?.map(|g| tables::decode_tip(g.value())).transpose();
    if format != Some(tables::PROJECTIONS_FORMAT as u64) || !matches!(mark, Ok(Some((0, hash))) if hash == tip.hash) {
        return Ok(false);
    }
    for p in Projection::ALL {
        let version = meta.get(meta_keys::version(p).as_str())?.and_then(|g| tables::meta_u64(g.value()));
        let cursor = meta.get(meta_keys::cursor(p).as_str())?.and_then(|g| tables::meta_u64(g.value()));
        if version != Some(p.version() as u64) || cursor != Some(0) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Events folded between flushes of a catch-up or rebuild's write-back overlay.
pub const FOLD_CHUNK_EVENTS: u64 = 65_536;

/// The most bytes of content-id index rows (keys and values) a catch-up or rebuild holds
/// across its chunks (`store::Held`) before it flushes them with a chunk: 64 MiB,
/// the index of about 1.5 million objects.
pub const FOLD_HELD_BYTES: usize = 64 << 20;

/// A catch-up (the recovery at open, [`crate::Engine::rebuild`], a rebuild of some of the
/// projections) of at least this many events folds on two threads (`docs/design.md`
/// §7c); a shorter one, such as the tail an open folds after a crash, on one: a second
/// thread costs about 55 µs to start on the reference machine, which the fold of a few
/// hundred events does not repay.
pub const FOLD_SECOND_THREAD_EVENTS: u64 = 2_048;

/// The projections a catch-up or a full rebuild folds on its second folding thread
/// ([`fold_chunk_on_two`]): the content-id index, the graph and the turns, the hashed
/// maps, and the labels and the recency order. With the index's additions deferred and
/// merged at once in a fold from 0 ([`crate::store::Held::defer_if_empty`]), the second
/// thread took 21% of a catch-up's samples on the comparison's workload and the first,
/// with the chunk's writes, 45%; the turns (about 4%) fold here again. The labels moved
/// here when the first thread was seen folding alone for the last quarter of an online
/// rebuild, after the second had finished (`docs/benchmarks.md`, "The labels on the
/// second folding thread"). Each projection's fold reads and writes only its own tables
/// (design §5), so the two threads never read each other's rows.
pub(crate) const SECOND_FOLD: [Projection; 4] =
    [Projection::Content, Projection::Graph, Projection::Turns, Projection::Labels];

/// Records a message to the second folding thread carries.
pub(crate) const SECOND_BATCH: usize = 256;

/// Messages in flight to the second folding thread.
pub(crate) const SECOND_QUEUE: usize = 16;

/// How a catch-up folds: events between flushes of its overlay, and from how many events
/// on it folds on two threads. The engine always folds by `Folding::default()`
/// ([`FOLD_CHUNK_EVENTS`], [`FOLD_SECOND_THREAD_EVENTS`]); tests fold in other chunks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Folding {
    pub chunk_events: u64,
    pub second_thread_events: u64,
}

impl Default for Folding {
    fn default() -> Folding {
        Folding { chunk_events: FOLD_CHUNK_EVENTS, second_thread_events: FOLD_SECOND_THREAD_EVENTS }
    }
}

/// Brings the projections file up to the log tip: the projections at cursor 0 are
/// dropped, then every record past the smallest cursor is chain-checked, decoded and
/// folded into the projections behind it, through a write-back overlay flushed in
/// physical key order every [`FOLD_CHUNK_EVENTS`] events (bounded memory), and the
/// cursors move to the tip, all in one durable transaction. This is the checkpointer run
/// from the cursors: recovery at open runs it from the last checkpoint, a rebuild from 0.
///
/// The log is read and decoded on a thread of its own, ahead of the fold. A catch-up of
/// [`FOLD_SECOND_THREAD_EVENTS`] or more folds on two threads, as the offline rebuild
/// does: the content-id index, the graph, the turns and the labels ([`SECOND_FOLD`])
/// on a second thread, from the same records, into an overlay of its own over the same
/// transaction, which both threads only read while a chunk folds. Each projection's fold
/// reads and writes only its own tables (design §5), so the two never read each other's
/// rows, and their writes, disjoint, are applied together at the end of each chunk.
#[allow(clippy::too_many_arguments)]
pub(crate) fn catch_up(
    proj: &Database,
    log: &ReadTransaction,
    chain: &LogChain,
    limits: &Limits,
    tip: &Tip,
    cursors: &Cursors,
    durability: redb::Durability,
    progress: Progress<'_>,
    fold: Folding,
) -> Result<RebuildStats> {
    let started = Instant::now();
    let mut txn = proj.begin_write()?;
    txn.set_durability(durability)?;
    tables::create_projection_tables(&txn)?;
    let fresh = cursors.behind(1);
    if fresh == ProjectionSet::all() {
        txn.delete_table(PROJECTIONS)?;
        tables::create_projection_tables(&txn)?;
    } else if fresh != ProjectionSet::none() {
        let doomed: Vec<crate::Table> = fresh.iter().flat_map(|p| p.tables().iter().copied()).collect();
        tables::clear_projection_tables(&txn, &doomed)?;
    }
    let (mut events, mut bytes) = (0u64, 0u64);
    {
        let mut store = RedbStore::open(&txn)?;
        let from = cursors.min();
        let total = tip.seq.saturating_sub(from);
        let two_threads = total >= fold.second_thread_events;
        std::thread::scope(|scope| -> Result<()> {
            // The content-id index is held across the chunks, up to a bound.
            let mut held = HeldRows::new(crate::Table::ContentIndex);
            // Every projection from 0, over an emptied table: a removal of a row this
            // catch-up never wrote has nothing to remove.
            let mut written = (fresh == ProjectionSet::all()).then(|| Written::new(WRITTEN_KEYS_MAX));
            // The log is read and decoded on a thread of its own, ahead of the fold.
            let mut next_entry = crate::log::read_ahead(
                scope,
                log,
                chain,
                from,
                tip.seq,
                limits.record_bytes_max,
                limits.message_object_bytes_max(),
            );
            // A rewrite's fold reads the lists of records folded before it.
            let records = crate::log::FileRecords::new(log, None, limits.record_bytes_max);
            loop {
                let limits =
                    ChunkLimits { events: fold.chunk_events, held_bytes: FOLD_HELD_BYTES, left: total - events };
                let folded = match two_threads {
                    true => fold_chunk_on_two(&store, &mut held, &records, cursors, &mut next_entry, limits)?,
                    false => fold_chunk(&store, &mut held, &records, cursors, &mut next_entry, limits)?,
                };
                events += folded.events;
                bytes += folded.bytes;
                let last = folded.events < fold.chunk_events;
                store.apply(&folded.writes, written.as_mut())?;
                progress(events, total);
                if last {
                    return Ok(());
                }
            }
        })?;
    }
    write_cursors(&txn, ProjectionSet::all(), tip.seq, &tip.hash)?;
    txn.commit()?;
    Ok(RebuildStats { events, bytes, elapsed: started.elapsed() })
}

/// What one chunk of a catch-up folded: its writes (the content-id index's rows held
/// apart), events, and bytes of records.
pub(crate) struct FoldedChunk {
    pub writes: crate::store::Writes,
    pub events: u64,
    pub bytes: u64,
}

/// Where a chunk of a long fold ends, and how it sizes and hands over what it holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkLimits {
    /// The events of a chunk.
    pub events: u64,
    /// The bound of the held rows ([`HeldRows::hand_over`]).
    pub held_bytes: usize,
    /// The events left to fold: the chunk's overlay makes room for no more.
    pub left: u64,
}

impl ChunkLimits {
    /// The rows a chunk's overlay makes room for at first: the events it folds at most
    /// (a chunk's, or those left if fewer) times `quarters_per_event` / 4, at most a
    /// million, so that its map is not rehashed as it grows: the replay bench's chunks
    /// write about 0.49 rows an event on the first thread, 0.13 on the second.
    fn rows(&self, quarters_per_event: u64) -> usize {
        let events = self.events.min(self.left);
        usize::try_from(events.saturating_mul(quarters_per_event) / 4).unwrap_or(usize::MAX).min(1 << 20)
    }
}

/// Folds up to `chunk_events` records from `next_entry` on this thread, every projection
/// behind each record, over `store`; then hands the held rows over with the chunk's
/// writes ([`HeldRows::hand_over`]) if the log ended in it or they take more than
/// `held_bytes`.
fn fold_chunk(
    store: &RedbStore<'_>,
    held: &mut HeldRows,
    records: &crate::log::FileRecords<'_>,
    cursors: &Cursors,
    next_entry: &mut dyn FnMut() -> Result<Option<crate::log::LogEntry>>,
    limits: ChunkLimits,
) -> Result<FoldedChunk> {
    let ChunkLimits { events: chunk_events, held_bytes, .. } = limits;
    let mut overlay = TypedOverlay::with_capacity(store, limits.rows(2));
    let (mut events, mut bytes) = (0u64, 0u64);
    Held { held: &mut *held, rest: &mut overlay }.defer_if_empty()?;
    while events < chunk_events {
        let Some(entry) = next_entry()? else { break };
        if events == 0 {
            overlay.fresh_from(cursors.fresh_from(entry.record.seq));
        }
        let mut folding = Held { held: &mut *held, rest: &mut overlay };
        let mut folding = WithRecords::write(&mut folding, records);
        evolve(&mut folding, &entry.record, &entry.introduced, cursors.behind(entry.record.seq))?;
        events += 1;
        bytes += entry.bytes;
    }
    let mut writes = overlay.finish()?;
    held.hand_over(store, &mut writes, events < chunk_events, held_bytes)?;
    Ok(FoldedChunk { writes, events, bytes })
}

/// Batches of records that the first folding thread of [`fold_chunk_on_two`] passes on
/// before it folds them itself: the second thread, which folds less, runs that far
/// ahead, and at the chunk's end merges the content-id index's deferred additions while
/// the first still folds.
const SECOND_AHEAD: usize = 32;

/// [`fold_chunk`] on two threads: the projections of [`SECOND_FOLD`] (with the held
/// content-id index) on a thread of its own, from the records this one passes on in
/// batches of `SECOND_BATCH` (at most `SECOND_QUEUE` in flight, and [`SECOND_AHEAD`] ahead
/// of this thread's own fold), the others here, each through an overlay of its own over
/// `store`, which both only read. The second thread hands the held rows over
/// ([`HeldRows::hand_over`]) when the records end: the chunk's, or the log's, which this
/// thread tells it. The catch-up folds each chunk so, and so does the offline rebuild of
/// every projection over the chunks it has handed to its writing thread.
pub(crate) fn fold_chunk_on_two<S: Store + Sync + ?Sized>(
    store: &S,
    held: &mut HeldRows,
    records: &crate::log::FileRecords<'_>,
    cursors: &Cursors,
    next_entry: &mut dyn FnMut() -> Result<Option<crate::log::LogEntry>>,
    limits: ChunkLimits,
) -> Result<FoldedChunk> {
    let ChunkLimits { events: chunk_events, held_bytes, .. } = limits;
    let second: ProjectionSet = SECOND_FOLD.into_iter().collect();
    let (to_second, batches) = crossbeam_channel::bounded::<Arc<Vec<crate::log::LogEntry>>>(SECOND_QUEUE);
    // Set before the channel closes when the log ended within the chunk.
    let log_ended = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let log_ended = &log_ended;
        let other = scope.spawn(move || -> Result<crate::store::Writes> {
            let mut overlay = TypedOverlay::with_capacity(store, limits.rows(1));
            let mut batches = batches.into_iter().peekable();
            if let Some(first) = batches.peek().and_then(|b| b.first()) {
                overlay.fresh_from(cursors.fresh_from(first.record.seq));
            }
            {
                let mut folding = Held { held: &mut *held, rest: &mut overlay };
                folding.defer_if_empty()?;
                for batch in batches {
                    for entry in batch.iter() {
                        let set = cursors.behind(entry.record.seq).and(second);
                        evolve(&mut folding, &entry.record, &entry.introduced, set)?;
                    }
                }
            }
            let mut writes = overlay.finish()?;
            held.hand_over(store, &mut writes, log_ended.load(Ordering::Acquire), held_bytes)?;
            Ok(writes)
        });
        let mut overlay = TypedOverlay::with_capacity(store, limits.rows(2));
        let (mut events, mut bytes) = (0u64, 0u64);
        let mut to_second = Some(to_second);
        let here = (|| -> Result<()> {
            // Sent to the second thread, not folded here yet.
            let mut ahead = std::collections::VecDeque::with_capacity(SECOND_AHEAD);
            let mut read = 0u64;
            loop {
                while let Some(tx) = to_second.as_ref().filter(|_| ahead.len() < SECOND_AHEAD) {
                    let mut batch = Vec::with_capacity(SECOND_BATCH);
                    let mut ended = false;
                    while batch.len() < SECOND_BATCH && read + (batch.len() as u64) < chunk_events {
                        match next_entry()? {
                            Some(entry) => batch.push(entry),
                            None => {
                                ended = true;
                                break;
                            }
                        }
                    }
                    if let (0, Some(first)) = (read, batch.first()) {
                        overlay.fresh_from(cursors.fresh_from(first.record.seq));
                    }
                    read += batch.len() as u64;
                    if ended {
                        log_ended.store(true, Ordering::Release);
                    }
                    if !batch.is_empty() {
                        let batch = Arc::new(batch);
                        if tx.send(batch.clone()).is_err() {
                            // The second fold stopped: its failure is reported below.
                            return Ok(());
                        }
                        ahead.push_back(batch);
                    }
                    if ended || read >= chunk_events {
                        // Every record of the chunk is sent: the second thread may end.
                        to_second = None;
                    }
                }
                let Some(batch) = ahead.pop_front() else { break };
                for entry in batch.iter() {
                    let mut folding = WithRecords::write(&mut overlay, records);
                    let set = cursors.behind(entry.record.seq).without(second);
                    evolve(&mut folding, &entry.record, &entry.introduced, set)?;
                    events += 1;
                    bytes += entry.bytes;
                }
            }
            Ok(())
        })();
        drop(to_second);
        let theirs = other.join().unwrap_or_else(|_| Err(Error::storage("the catch-up's second fold panicked")));
        here?;
        let mut writes = overlay.finish()?;
        writes.extend(theirs?);
        Ok(FoldedChunk { writes, events, bytes })
    })
}

/// Folds the log past the delta's seq into the delta, in memory (read-only openers):
/// the log file's records and, past them, the journal's (`journal`, the journal files
/// beside it, if it has them).
pub(crate) fn fold_tail(
    delta: &Delta,
    log: &dyn ReadableDatabase,
    journal: &crate::journal::Follower,
    chain: &LogChain,
    limits: &Limits,
) -> Result<u64> {
    let (txn, tip, tail) = read_with_journal(log, journal, chain)?;
    let (last, last_hash) = match tail.batches().rev().find_map(|b| b.rows.last()) {
        Some(row) => (row.seq, annal_codec::stored_chain_hash(&row.record).unwrap_or(tip.hash)),
        None => (tip.seq, tip.hash),
    };
    let view = delta.view();
    if last <= view.seq() {
        return Ok(0);
    }
    let mut overlay = Overlay::new(&view);
    let mut events = 0;
    let (record_max, object_max) = (limits.record_bytes_max, limits.message_object_bytes_max());
    let records = crate::log::FileRecords::new(&txn, Some(&tail), record_max);
    let entries = LogTail::new(&txn, &tail, chain, view.seq(), last, record_max, object_max)?;
    // What this reader folded must be what the log holds: a journalled record it read
    // before the writer's fsync, which then failed, and a new one at its seq after the
    // writer reopened, would otherwise chain the new records onto the lost one's fold.
    if entries.prev() != view.hash() {
        return Err(Error::corrupt(
            crate::Location::Log { seq: view.seq() },
            "the log no longer holds the record this reader folded at this seq; open it again",
        ));
    }
    for entry in entries {
        let entry = entry?;
        evolve(
            &mut WithRecords::write(&mut overlay, &records),
            &entry.record,
            &entry.introduced,
            ProjectionSet::all(),
        )?;
        events += 1;
    }
    let writes = overlay.into_writes();
    drop(view);
    delta.apply(writes, last, last_hash, events, LogUpdate::Snap(LogSnap::with_tail(txn, tail)));
    Ok(events)
}

/// A snapshot of the log file, its tip, and the journalled batches past it.
fn read_with_journal(
    log: &dyn ReadableDatabase,
    journal: &crate::journal::Follower,
    chain: &LogChain,
) -> Result<(redb::ReadTransaction, crate::log::Tip, crate::journal::Tail)> {
    let mut tries = 1;
    loop {
        let (txn, tip) = crate::log::read_tip(log, chain)?;
        match journal.tail_after(tip.seq, &tip.hash, chain) {
            Ok(tail) => return Ok((txn, tip, tail)),
            Err(_) if tries < crate::journal::JOURNAL_READ_TRIES_MAX => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// An empty projections database in memory, for a read-only opener that finds no usable
/// projections file (it then folds the whole log).
pub(crate) fn empty_projections() -> Result<Database> {
    let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
    let txn = db.begin_write()?;
    tables::create_projection_tables(&txn)?;
    txn.commit()?;
    Ok(db)
}

/// A read-only delta over a pinned checkpoint snapshot, caught up with the log.
pub(crate) fn read_only_delta(
    log: Arc<dyn ReadableDatabase + Send + Sync>,
    proj: &dyn ReadableDatabase,
    fallback: &Database,
    journal: &crate::journal::Follower,
    chain: &LogChain,
    limits: &Limits,
) -> Result<Delta> {
    let (log_txn, tip, tail) = read_with_journal(&*log, journal, chain)?;
    // A projections file that cannot be read is treated as absent: fold from nothing.
    let pinned = proj.begin_read().ok();
    let cursors = match &pinned {
        Some(txn) => crate::error::fail_closed("read projections", || read_cursors(txn, &log_txn, &tail, chain, &tip))
            .unwrap_or(Cursors::all(0)),
        None => Cursors::all(0),
    };
    let pinned = match pinned {
        Some(txn) => txn,
        None => fallback.begin_read()?,
    };
    let (pinned, base) = if cursors.min() > 0 && cursors.behind(cursors.min() + 1) == ProjectionSet::all() {
        (pinned, cursors.min())
    } else {
        (fallback.begin_read()?, 0)
    };
    let hash = match tail.get(base) {
        Some(row) => annal_codec::stored_chain_hash(&row.record).ok_or_else(|| {
            crate::error::Error::corrupt(crate::error::Location::Log { seq: base }, "record too short")
        })?,
        None if base == 0 => chain.genesis(),
        None => hash_at(&log_txn.open_table(LOG)?, chain, base)?,
    };
    let delta = Delta::new(pinned, log_txn, base, hash)?;
    fold_tail(&delta, &*log, journal, chain, limits)?;
    Ok(delta)
}
