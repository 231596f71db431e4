//! The delta and the view.
//!
//! The delta holds every projection row `evolve` wrote since the last checkpoint, in
//! memory, as layers of versioned rows: each row keeps one version per batch that wrote
//! it, tagged with the batch's last seq. The newest layer is active (the writer applies
//! each durable batch to it); older layers are frozen and wait for the checkpointer,
//! which writes a frozen layer's newest rows into the projections file and then drops
//! the layer.
//!
//! A [`View`] is what `decide` and every query read: the layers and a snapshot of the
//! projections file, taken together under the delta's lock, read at one seq (the last
//! published batch). A row is the newest version at or below that seq in the newest
//! layer that has one, else the checkpoint's row. Versions above the view's seq are
//! invisible to it, so a batch applied while a query runs does not show up half-way; a
//! checkpoint committed while a query runs holds only rows that the query's layers also
//! hold, so which snapshot of the projections file a view got does not change what it
//! reads.

use crate::buckets::ContentAdds;
use crate::cache::{ContentCache, RevisionCache};
use crate::error::{Error, Location, Result};
use crate::filter::ContentFilter;
use crate::journal::{SealedBatch, Tail};
use crate::projection::SessionHead;
use crate::store::{decode_row, Store, StoreExt, Table, Writes};
use crate::tables::{self, logical_key, physical_key, PROJECTIONS};
use annal_codec::{ChainHash, ContentId};
use parking_lot::{Condvar, Mutex, RwLock};
use redb::ReadTransaction;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// A callback over (key, value) rows; returning false stops the scan.
pub(crate) type RowVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'a;

pub(crate) use crate::store::Value;

/// The layers' and the head cache's hasher: keys are physical keys and session ids,
/// which no outside party chooses to collide.
type Hasher = crate::store::RowHasher;

/// Bytes a row version costs beyond its key and value (map node, version entry).
const VERSION_OVERHEAD_BYTES: u64 = 48;

/// Bytes a content-id index addition held in a layer costs (its key and seq, and the
/// map's slot).
const CONTENT_ADD_BYTES: u64 = 32;

/// Projection rows folded from a contiguous range of the log.
#[derive(Debug)]
pub(crate) struct Layer {
    /// Physical key → versions, oldest first: point reads are one hash lookup.
    rows: HashMap<Arc<[u8]>, Versions, Hasher>,
    /// The same keys in physical order, for scans and checkpoints.
    order: BTreeSet<OrderKey>,
    /// The content-id index's additions the writer folded into this layer, not in the
    /// index's rows: the checkpoint that writes the layer merges them.
    content: ContentAdds,
    /// The last seq folded into this layer.
    pub last_seq: u64,
    /// `h(last_seq)`.
    pub last_hash: ChainHash,
    /// Events folded into this layer.
    pub events: u64,
    /// Approximate memory held.
    pub bytes: u64,
    /// When the first batch arrived.
    pub started: Option<Instant>,
}

impl Layer {
    fn new(last_seq: u64, last_hash: ChainHash) -> Layer {
        Layer {
            rows: HashMap::default(),
            order: BTreeSet::new(),
            content: ContentAdds::default(),
            last_seq,
            last_hash,
            events: 0,
            bytes: 0,
            started: None,
        }
    }

    /// The version of `key` visible at `seq`, if this layer has one.
    fn get_at(&self, key: &[u8], seq: u64) -> Option<&Value> {
        self.rows.get(key)?.at(seq)
    }

    /// Adds the writes of a batch that ends at `seq`, keeping their key and value buffers.
    /// A key's versions that no view can read any more go: those followed by a version at
    /// or below `oldest_reader`, the seq of the oldest live view (every later view reads
    /// at the last published seq or above).
    fn apply(&mut self, mut writes: Writes, seq: u64, hash: ChainHash, events: u64, oldest_reader: u64) {
        let content = std::mem::take(&mut writes.content);
        self.bytes += CONTENT_ADD_BYTES * content.len() as u64;
        self.content.extend(&content);
        for (physical, value) in writes.into_rows() {
            self.bytes += VERSION_OVERHEAD_BYTES + value.as_ref().map_or(0, |v| v.len() as u64);
            match self.rows.entry(physical) {
                Entry::Occupied(mut versions) => {
                    let versions = versions.get_mut();
                    self.bytes -= versions.prune(oldest_reader);
                    versions.push((seq, value));
                }
                Entry::Vacant(slot) => {
                    self.bytes += 2 * slot.key().len() as u64;
                    self.order.insert(OrderKey::new(slot.key().clone()));
                    slot.insert(Versions { first: (seq, value), rest: Vec::new() });
                }
            }
        }
        self.started.get_or_insert_with(Instant::now);
        self.last_seq = seq;
        self.last_hash = hash;
        self.events += events;
    }

    /// Every row's newest version, in physical key order: what a checkpoint writes.
    pub fn newest(&self) -> impl Iterator<Item = (&[u8], &Value)> {
        self.order.iter().filter_map(|k| self.rows.get(&k.key).map(|v| (&*k.key, &v.last().1)))
    }

    /// Rows in this layer.
    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// The content-id index's additions held in this layer, not in the index's rows.
    pub fn content_adds(&self) -> &ContentAdds {
        &self.content
    }
}

/// A physical key in a layer's ordered set. Its first 32 bytes, zero-padded, are held as
/// two big-endian integers compared before the bytes: keys of one table and session
/// differ within them, so most comparisons of an insert are two integer compares instead
/// of a `memcmp` call. The order is the keys' byte order: zero padding ties only a key
/// with the same key extended by zero bytes, and the full comparison then puts the
/// shorter first.
#[derive(Debug)]
struct OrderKey {
    head: (u128, u128),
    key: Arc<[u8]>,
}

impl OrderKey {
    fn new(key: Arc<[u8]>) -> OrderKey {
        let part = |from: usize| {
            let mut bytes = [0u8; 16];
            let rest = key.get(from..).unwrap_or(&[]);
            let n = rest.len().min(16);
            bytes[..n].copy_from_slice(&rest[..n]);
            u128::from_be_bytes(bytes)
        };
        OrderKey { head: (part(0), part(16)), key }
    }
}

impl PartialEq for OrderKey {
    fn eq(&self, other: &OrderKey) -> bool {
        self.head == other.head && self.key == other.key
    }
}

impl Eq for OrderKey {}

impl PartialOrd for OrderKey {
    fn partial_cmp(&self, other: &OrderKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderKey {
    fn cmp(&self, other: &OrderKey) -> std::cmp::Ordering {
        self.head.cmp(&other.head).then_with(|| self.key.cmp(&other.key))
    }
}

/// A key's versions in a layer, oldest first. The first is held inline: most keys of a
/// layer get one version, and this saves an allocation a row.
#[derive(Debug)]
struct Versions {
    first: (u64, Value),
    rest: Vec<(u64, Value)>,
}

impl Versions {
    fn push(&mut self, version: (u64, Value)) {
        self.rest.push(version);
    }

    /// Drops the versions that a view at `oldest_reader` or later cannot read (each one
    /// followed by a version at or below it); returns the bytes they held.
    fn prune(&mut self, oldest_reader: u64) -> u64 {
        let invisible = self.rest.iter().take_while(|(s, _)| *s <= oldest_reader).count();
        if invisible == 0 {
            return 0;
        }
        let mut freed = 0;
        let mut dropped = self.rest.drain(..invisible);
        let newest_dropped = dropped.next_back();
        for (_, v) in std::iter::once(std::mem::take(&mut self.first)).chain(dropped) {
            freed += VERSION_OVERHEAD_BYTES + v.as_ref().map_or(0, |v| v.len() as u64);
        }
        if let Some(newest) = newest_dropped {
            self.first = newest;
        }
        freed
    }

    fn last(&self) -> &(u64, Value) {
        self.rest.last().unwrap_or(&self.first)
    }

    /// The newest version at or before `seq`.
    fn at(&self, seq: u64) -> Option<&Value> {
        self.rest.iter().rev().chain(std::iter::once(&self.first)).find(|(s, _)| *s <= seq).map(|(_, v)| v)
    }
}

/// A layer, shared between the delta and the views that captured it.
pub(crate) type LayerRef = Arc<RwLock<Layer>>;

struct State {
    /// Oldest first; the last one is active.
    layers: Vec<LayerRef>,
    /// The seq every new view reads at: the last batch applied.
    visible: u64,
    /// `h(visible)`.
    visible_hash: ChainHash,
    /// The projections file as of the last published checkpoint, and its projections
    /// table opened once (a view reads it without opening anything).
    checkpoint: Arc<Checkpoint>,
    /// The log as of the last applied batch (or later): a snapshot of the log file and
    /// the journalled batches past it.
    log: LogSnap,
    /// The heads rows as of `visible`, for the sessions read or written lately: a head
    /// read is a map lookup. Updated with every batch under this lock, so it always
    /// agrees with the views taken at `visible`.
    heads: HashMap<[u8; 16], Arc<SessionHead>, Hasher>,
}

/// What a view reads of the log: a snapshot of the log file and the journalled batches
/// it does not hold yet (see [`crate::journal`]).
#[derive(Clone)]
pub(crate) struct LogSnap {
    txn: Arc<ReadTransaction>,
    tail: Tail,
}

impl LogSnap {
    /// A snapshot of the log file with nothing journalled past it.
    pub fn file(txn: ReadTransaction) -> LogSnap {
        LogSnap { txn: Arc::new(txn), tail: Tail::default() }
    }

    /// A snapshot of the log file and the journalled batches past it.
    pub fn with_tail(txn: ReadTransaction, tail: Tail) -> LogSnap {
        LogSnap { txn: Arc::new(txn), tail }
    }
}

/// How a published batch changes what views read of the log.
pub(crate) enum LogUpdate {
    /// The batch is in the log file: views read this snapshot of it.
    File(ReadTransaction),
    /// The batch is in the journal: views read it from memory, past the same snapshot.
    Journalled(Arc<SealedBatch>),
    /// A new snapshot and tail (a read-only opener following a live writer).
    Snap(LogSnap),
}

/// Sessions whose head row the delta keeps in memory at most; past it the map starts
/// over (the rows stay readable through views).
pub const HEAD_CACHE_ENTRIES_MAX: usize = 65_536;

/// A snapshot of the projections file with its projections table open.
pub(crate) struct Checkpoint {
    /// `None` when the file has no projections table yet (it reads as empty).
    table: Option<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>,
    /// Keeps the snapshot the table reads.
    _txn: ReadTransaction,
}

impl Checkpoint {
    pub(crate) fn new(txn: ReadTransaction) -> Result<Checkpoint> {
        let table = match txn.open_table(PROJECTIONS) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(Checkpoint { table, _txn: txn })
    }

    /// Calls `f` with the row of physical key `physical` in this snapshot.
    pub(crate) fn read(&self, physical: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        match &self.table {
            Some(table) => match table.get(physical)? {
                Some(guard) => f(Some(guard.value())),
                None => f(None),
            },
            None => f(None),
        }
    }
}

/// The in-memory delta over the last checkpoint, and the source of [`View`]s.
///
/// The snapshots views read (of the projections file and of the log file) are taken
/// when a checkpoint is published and when a batch is applied, not per query, so a
/// query opens no transaction, and an engine poisoned by an I/O error keeps answering
/// from what it had.
pub(crate) struct Delta {
    state: RwLock<State>,
    /// Verified content objects every view of this delta reads first (the engine's own;
    /// read-only openers have none).
    content_cache: Option<Arc<ContentCache>>,
    revision_cache: Option<Arc<RevisionCache>>,
    /// The content-key filter its views answer from and tell (the engine's own delta;
    /// read-only openers have none).
    filter: Option<Arc<ContentFilter>>,
    /// Signalled whenever a layer is checkpointed (backpressure and drains wait on it).
    progress: (Mutex<()>, Condvar),
    /// The seqs live views read at.
    readers: Arc<Readers>,
    /// What every view keeps alive: the databases a read-only opener's snapshots are of,
    /// when they are not a writer's (a database opened over a repaired view of a crashed
    /// file closes its transactions when it is dropped).
    anchor: Option<Anchor>,
}

/// Something a view keeps alive as long as it lives.
pub(crate) type Anchor = Arc<dyn std::any::Any + Send + Sync>;

/// The seqs that live views read at, each with its number of views: a version of a row
/// that none of them can read is dropped when the next batch rewrites the row, so a row
/// rewritten by many batches (a tip, a bucket of a hashed map) does not keep a copy per
/// batch until the checkpoint.
#[derive(Debug, Default)]
pub(crate) struct Readers(Mutex<BTreeMap<u64, usize>>);

impl Readers {
    /// The oldest seq a live view reads at, if any view is live.
    fn oldest(&self) -> Option<u64> {
        self.0.lock().keys().next().copied()
    }
}

/// A view's place in [`Readers`], given back when the view is dropped.
#[derive(Debug)]
struct ReaderPin {
    readers: Arc<Readers>,
    seq: u64,
}

impl ReaderPin {
    fn new(readers: &Arc<Readers>, seq: u64) -> ReaderPin {
        *readers.0.lock().entry(seq).or_default() += 1;
        ReaderPin { readers: readers.clone(), seq }
    }
}

impl Drop for ReaderPin {
    fn drop(&mut self) {
        let mut live = self.readers.0.lock();
        if let std::collections::btree_map::Entry::Occupied(mut n) = live.entry(self.seq) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }
}

impl Delta {
    /// A delta with no rows over a checkpoint at `seq` (`checkpoint` is a snapshot of
    /// the projections file there, `log` one of the log file at `seq` or later).
    pub fn new(checkpoint: ReadTransaction, log: ReadTransaction, seq: u64, hash: ChainHash) -> Result<Delta> {
        Ok(Delta {
            state: RwLock::new(State {
                layers: vec![Arc::new(RwLock::new(Layer::new(seq, hash)))],
                visible: seq,
                visible_hash: hash,
                checkpoint: Arc::new(Checkpoint::new(checkpoint)?),
                log: LogSnap::file(log),
                heads: HashMap::default(),
            }),
            progress: (Mutex::new(()), Condvar::new()),
            content_cache: None,
            revision_cache: None,
            filter: None,
            readers: Arc::default(),
            anchor: None,
        })
    }

    /// This delta with the content cache and the revision cache of an engine whose
    /// [`crate::Options::content_cache_bytes`] is `bytes` (none for 0), which its views
    /// read first.
    pub fn with_content_cache(mut self, bytes: u64) -> Delta {
        self.content_cache = ContentCache::new(bytes).map(Arc::new);
        self.revision_cache = RevisionCache::of_content_cache(bytes).map(Arc::new);
        self
    }

    /// This delta with a revision cache of `bytes` (none for 0) alone, for a read-only
    /// opener: revisions' lists never go stale, content may (a host's purge).
    pub fn with_revision_cache(mut self, bytes: u64) -> Delta {
        self.revision_cache = RevisionCache::new(bytes).map(Arc::new);
        self
    }

    /// This delta with a content-key filter of at most `bytes_max` bytes
    /// ([`crate::filter`]): the writer's.
    pub fn with_content_filter(mut self, bytes_max: u64) -> Delta {
        self.filter = Some(Arc::new(ContentFilter::new(bytes_max)));
        self
    }

    /// At a batch boundary: starts building the content-key filter when it is due
    /// ([`ContentFilter::maintain`]).
    pub fn maintain_filter(&self) {
        if let Some(filter) = &self.filter {
            filter.maintain(|| self.view());
        }
    }

    /// Bytes the content-key filter that answers takes (0 for none).
    pub fn filter_bytes(&self) -> u64 {
        self.filter.as_ref().map_or(0, |f| f.bytes())
    }

    /// At close: stops building the content-key filter, and waits for its thread.
    pub fn stop_filter(&self) {
        if let Some(filter) = &self.filter {
            filter.stop();
        }
    }

    /// This delta with `anchor` kept alive by every view of it.
    pub fn with_anchor(mut self, anchor: Anchor) -> Delta {
        self.anchor = Some(anchor);
        self
    }

    /// Forgets `ids` from the content cache (a content collection removed them).
    pub fn forget_content(&self, ids: &[ContentId]) {
        if let Some(cache) = &self.content_cache {
            cache.forget(ids);
        }
    }

    /// A consistent view at the last published batch.
    pub fn view(&self) -> View {
        let state = self.state.read();
        View {
            // Registered under the state lock, so no batch is applied between reading
            // `visible` and pinning it.
            _pin: ReaderPin::new(&self.readers, state.visible),
            seq: state.visible,
            hash: state.visible_hash,
            layers: state.layers.clone(),
            ckpt: state.checkpoint.clone(),
            log: state.log.clone(),
            cache: self.content_cache.clone(),
            collections: self.content_cache.as_ref().map_or(0, |c| c.collections()),
            revisions: self.revision_cache.clone(),
            content: std::cell::OnceCell::new(),
            records: std::cell::OnceCell::new(),
            content_index_size: std::cell::OnceCell::new(),
            filter: self.filter.clone(),
            merged_content_index: std::cell::OnceCell::new(),
            _anchor: self.anchor.clone(),
        }
    }

    /// Applies a durable batch ending at `seq` to the active layer and publishes it: new
    /// views read it from now on, with the log as `log` says.
    pub fn apply(&self, writes: Writes, seq: u64, hash: ChainHash, events: u64, log: LogUpdate) {
        // Decoded before the lock is taken; a row that does not decode is not cached (a
        // read meets it in the view).
        let heads_tag = Table::Heads.tag();
        let heads: Vec<([u8; 16], Option<Arc<SessionHead>>)> = writes
            .rows()
            .filter(|(physical, _)| physical.len() == 18 && physical[0] == 0 && physical[17] == heads_tag)
            .filter_map(|(physical, row)| {
                let session = <[u8; 16]>::try_from(&physical[1..17]).ok()?;
                let head = row.as_ref().and_then(|row| decode_row::<SessionHead>(Table::Heads, &session, row).ok());
                Some((session, head.map(Arc::new)))
            })
            .collect();
        let mut state = self.state.write();
        // Views taken later read at `state.visible` or above.
        let oldest_reader = self.readers.oldest().unwrap_or(state.visible).min(state.visible);
        if let Some(active) = state.layers.last() {
            active.write().apply(writes, seq, hash, events, oldest_reader);
        }
        for (session, head) in heads {
            match head {
                Some(head) => cache_head(&mut state.heads, session, head),
                None => drop(state.heads.remove(&session)),
            }
        }
        state.visible = seq;
        state.visible_hash = hash;
        state.log = match log {
            LogUpdate::File(txn) => LogSnap::file(txn),
            LogUpdate::Journalled(batch) => LogSnap { txn: state.log.txn.clone(), tail: state.log.tail.with(batch) },
            LogUpdate::Snap(snap) => snap,
        };
    }

    /// The log file now holds every journalled record up to `seq`: new views read them
    /// from `txn`, a snapshot of it.
    pub fn absorbed(&self, txn: ReadTransaction, seq: u64) {
        let mut state = self.state.write();
        let tail = state.log.tail.after(seq);
        state.log = LogSnap { txn: Arc::new(txn), tail };
    }

    /// The journalled batches no snapshot of the log file holds yet.
    pub fn tail(&self) -> Tail {
        self.state.read().log.tail.clone()
    }

    /// The head of `session` at the last published batch, from memory when it is there;
    /// otherwise read through a view and remembered, unless a batch was published
    /// meanwhile. A purged session is `Rejection::Purged`.
    pub fn head(&self, session: &[u8; 16]) -> Result<Option<Arc<SessionHead>>> {
        if let Some(head) = self.state.read().heads.get(session) {
            return Ok(Some(head.clone()));
        }
        let view = self.view();
        let Some(head) = view.row::<SessionHead>(Table::Heads, session)? else {
            crate::query::purged_check(&view, &annal_codec::SessionId(*session))?;
            return Ok(None);
        };
        let head = Arc::new(head);
        let mut state = self.state.write();
        if state.visible == view.seq() {
            cache_head(&mut state.heads, *session, head.clone());
        }
        Ok(Some(head))
    }

    /// (events, bytes, age) of the active layer.
    pub fn active_stats(&self) -> (u64, u64, Option<std::time::Duration>) {
        let state = self.state.read();
        let active = state.layers.last().map(|l| {
            let l = l.read();
            (l.events, l.bytes, l.started.map(|s| s.elapsed()))
        });
        active.unwrap_or((0, 0, None))
    }

    /// Bytes held by every layer.
    pub fn bytes(&self) -> u64 {
        self.state.read().layers.iter().map(|l| l.read().bytes).sum()
    }

    /// Freezes the active layer if it holds anything, and starts a new one. Returns
    /// whether a layer was frozen. A layer of writes that no event made (a content
    /// collection's removals from the content-id index) holds something too.
    pub fn freeze(&self) -> bool {
        let mut state = self.state.write();
        let (seq, hash) = (state.visible, state.visible_hash);
        let empty = state.layers.last().is_none_or(|l| {
            let l = l.read();
            l.events == 0 && l.rows() == 0 && l.content.is_empty()
        });
        if empty {
            return false;
        }
        state.layers.push(Arc::new(RwLock::new(Layer::new(seq, hash))));
        true
    }

    /// The oldest frozen layer, if any waits for a checkpoint.
    pub fn oldest_frozen(&self) -> Option<LayerRef> {
        let state = self.state.read();
        (state.layers.len() > 1).then(|| state.layers[0].clone())
    }

    /// Frozen layers waiting for a checkpoint.
    pub fn frozen(&self) -> usize {
        self.state.read().layers.len().saturating_sub(1)
    }

    /// Drops `layer` after its checkpoint committed (`checkpoint` is a snapshot of the
    /// projections file that holds it), and wakes whoever waits on progress.
    pub fn publish(&self, layer: &LayerRef, checkpoint: ReadTransaction) -> Result<()> {
        let checkpoint = Arc::new(Checkpoint::new(checkpoint)?);
        {
            let mut state = self.state.write();
            state.layers.retain(|l| !Arc::ptr_eq(l, layer));
            state.checkpoint = checkpoint;
        }
        self.notify();
        Ok(())
    }

    /// Replaces the checkpoint snapshot after a rebuild rewrote the projections file (the
    /// delta is empty then).
    pub fn set_checkpoint(&self, checkpoint: ReadTransaction) -> Result<()> {
        let mut state = self.state.write();
        state.checkpoint = Arc::new(Checkpoint::new(checkpoint)?);
        state.heads.clear();
        Ok(())
    }

    /// Wakes everyone waiting for progress (also on failure, so they can give up).
    pub fn notify(&self) {
        let _guard = self.progress.0.lock();
        self.progress.1.notify_all();
    }

    /// Waits until `done()` holds, re-checking at each checkpoint.
    pub fn wait_until(&self, mut done: impl FnMut(&Delta) -> bool) {
        let mut guard = self.progress.0.lock();
        while !done(self) {
            self.progress.1.wait_for(&mut guard, std::time::Duration::from_millis(50));
        }
    }
}

fn cache_head(heads: &mut HashMap<[u8; 16], Arc<SessionHead>, Hasher>, session: [u8; 16], row: Arc<SessionHead>) {
    if heads.len() >= HEAD_CACHE_ENTRIES_MAX && !heads.contains_key(&session) {
        heads.clear();
    }
    heads.insert(session, row);
}

/// A consistent read of the projections (checkpoint plus delta) and the log, at one seq.
/// Implements [`Store`] for `decide` and the queries. Writes through it are refused.
pub struct View {
    /// Keeps the versions this view reads from being dropped.
    _pin: ReaderPin,
    seq: u64,
    hash: ChainHash,
    layers: Vec<LayerRef>,
    ckpt: Arc<Checkpoint>,
    log: LogSnap,
    /// The engine's content cache, if it has one.
    cache: Option<Arc<ContentCache>>,
    /// The content collections the cache had seen when this view was taken
    /// ([`ContentCache::put`]).
    collections: u64,
    /// The revisions' lists a walk over the recipes stops at ([`RevisionCache`]).
    revisions: Option<Arc<RevisionCache>>,
    /// The log file's content table, opened at the first content read of this view.
    content: std::cell::OnceCell<crate::pieces::ContentReader>,
    /// The log file's record table, opened at the first record read of this view.
    records: std::cell::OnceCell<redb::ReadOnlyTable<u64, &'static [u8]>>,
    /// The size of the content-id index at this view's seq (`Buckets::size`), read at the
    /// view's first content lookup: a page of messages reads it once.
    content_index_size: std::cell::OnceCell<u64>,
    /// The content-id index's rows with the layers' additions merged, for scans
    /// ([`View::merged_content_index`]).
    merged_content_index: std::cell::OnceCell<Writes>,
    /// The databases this view's snapshots are of, for a read-only opener's view.
    _anchor: Option<Anchor>,
    /// The engine's content-key filter, if it has one.
    filter: Option<Arc<ContentFilter>>,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl View {
    /// The seq this view reads at: every commit up to it, nothing after.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// `h(seq)`.
    pub fn hash(&self) -> ChainHash {
        self.hash
    }

    /// The log file's raw snapshot, for offline tools that read its tables
    /// ([`crate::tables::LOG`], [`crate::pieces::PIECES`], [`crate::tables::META`])
    /// directly. It may hold commits past [`View::seq`], and it lacks those still in
    /// the journal (see [`View::journalled_rows`]).
    pub fn log(&self) -> &ReadTransaction {
        &self.log.txn
    }

    /// Every journalled (seq, record bytes, content row bytes) this view reads, in order.
    pub fn journalled_rows(&self) -> impl Iterator<Item = (u64, &[u8], &[u8])> {
        let seq = self.seq;
        self.log
            .tail
            .batches()
            .flat_map(|b| b.rows.iter())
            .filter(move |r| r.seq <= seq)
            .map(|r| (r.seq, r.record.as_slice(), r.content.as_slice()))
    }

    /// The records after `after` up to this view's seq, in order, each chain-checked
    /// and paired with the content it introduced: what an offline fold reads.
    pub fn log_entries(
        &self,
        after: u64,
        limits: &crate::Limits,
        chain: &annal_codec::LogChain,
    ) -> Result<crate::log::LogTail> {
        crate::log::LogTail::new(
            &self.log.txn,
            &self.log.tail,
            chain,
            after,
            self.seq,
            limits.record_bytes_max,
            limits.message_object_bytes_max(),
        )
    }

    /// The stored bytes of record `seq`, unchecked, if it is at or below this view's seq.
    pub fn raw_record(&self, seq: u64) -> Result<Option<Vec<u8>>> {
        if seq > self.seq {
            return Ok(None);
        }
        crate::log::record_bytes(&self.log.txn, &self.records, Some(&self.log.tail), seq)
    }

    /// The delta's version of a physical key, if a layer has one at this view's seq.
    fn delta_get(&self, physical: &[u8]) -> Option<Value> {
        self.layers.iter().rev().find_map(|l| l.read().get_at(physical, self.seq).cloned())
    }

    /// Calls `f(logical key, value)` for the rows of `t` whose logical key starts with
    /// `prefix`, in key order, until it returns false.
    pub fn scan(&self, t: Table, prefix: &[u8], mut f: impl FnMut(&[u8], &[u8]) -> Result<bool>) -> Result<()> {
        let start = if t.session_scoped() && prefix.len() < 16 { vec![0u8] } else { physical_key(t, prefix) };
        self.scan_physical(&start, &mut |physical, value| match logical_key(physical) {
            Some((lt, logical)) if lt == t && logical.starts_with(prefix) => f(&logical, value),
            Some(_) => Ok(true),
            None => Err(tables::bad_physical(physical)),
        })
    }

    /// Calls `f(logical key, value)` for the rows of `t` whose logical key starts with
    /// `prefix`, from the first at or after `from` (which starts with `prefix`), in key
    /// order, until it returns false.
    pub fn scan_from(
        &self,
        t: Table,
        prefix: &[u8],
        from: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let (physical_prefix, start) = (physical_key(t, prefix), physical_key(t, from));
        self.scan_range(&physical_prefix, &start, &mut |physical, value| match logical_key(physical) {
            Some((lt, logical)) if lt == t && logical.starts_with(prefix) => f(&logical, value),
            Some(_) => Ok(true),
            None => Err(tables::bad_physical(physical)),
        })
    }

    /// Every row whose physical key starts with `start`, checkpoint and delta merged, in
    /// physical key order, until `f` returns false.
    pub(crate) fn scan_physical(&self, start: &[u8], f: &mut RowVisitor<'_>) -> Result<()> {
        self.scan_range(start, start, f)
    }

    /// Every row whose physical key starts with `prefix`, from the first at or after
    /// `start`, checkpoint and delta merged, in physical key order, until `f` returns
    /// false.
    fn scan_range(&self, prefix: &[u8], start: &[u8], f: &mut RowVisitor<'_>) -> Result<()> {
        let mut delta: BTreeMap<Vec<u8>, Value> = BTreeMap::new();
        let from = OrderKey::new(Arc::from(start));
        for layer in &self.layers {
            let layer = layer.read();
            for k in layer.order.range(&from..) {
                let k = &k.key;
                if !k.starts_with(prefix) {
                    break;
                }
                if let Some(v) = layer.get_at(k, self.seq) {
                    delta.insert(k.to_vec(), v.clone());
                }
            }
        }
        // The content-id index's additions the layers hold, as the rows a checkpoint
        // would write for them.
        let index = physical_key(Table::ContentIndex, &[]);
        if index.starts_with(prefix) || prefix.starts_with(&index) {
            for (k, v) in self.merged_content_index()?.rows() {
                if k.starts_with(prefix) && **k >= *start {
                    delta.insert(k.to_vec(), v.clone());
                }
            }
        }
        let mut delta = delta.into_iter().peekable();
        let mut base = match &self.ckpt.table {
            Some(table) => Some(table.range(start..)?),
            None => None,
        };
        let mut next_base = move || -> Result<Option<(Vec<u8>, Vec<u8>)>> {
            match base.as_mut().and_then(|b| b.next()) {
                Some(entry) => {
                    let (k, v) = entry?;
                    let k = k.value();
                    Ok(k.starts_with(prefix).then(|| (k.to_vec(), v.value().to_vec())))
                }
                None => Ok(None),
            }
        };
        let mut b = next_base()?;
        loop {
            let take_delta = match (&b, delta.peek()) {
                (None, None) => return Ok(()),
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some((bk, _)), Some((dk, _))) => dk <= bk,
            };
            let keep_going = if take_delta {
                let (dk, dv) = delta.next().unwrap_or_default();
                if matches!(&b, Some((bk, _)) if *bk == dk) {
                    b = next_base()?;
                }
                match dv {
                    Some(v) => f(&dk, &v)?,
                    None => true,
                }
            } else {
                let (bk, bv) = b.take().unwrap_or_default();
                b = next_base()?;
                f(&bk, &bv)?
            };
            if !keep_going {
                return Ok(());
            }
        }
    }

    /// A content object, verified against its id, if it is stored at this view's seq:
    /// from the engine's content cache when it holds it, else read (and then cached).
    pub fn content(&self, id: &ContentId, object_bytes_max: u64) -> Result<Option<Vec<u8>>> {
        self.with_content(id, object_bytes_max, |bytes| Ok(bytes.to_vec()))
    }

    /// Calls `f` with the bytes of content object `id` (verified against its id) if it is
    /// stored at this view's seq, borrowed from the content cache when it holds them.
    pub(crate) fn with_content<T>(
        &self,
        id: &ContentId,
        object_bytes_max: u64,
        f: impl FnOnce(&[u8]) -> Result<T>,
    ) -> Result<Option<T>> {
        if let Some(bytes) = self.cache.as_ref().and_then(|c| c.get(id, self.seq)) {
            return f(&bytes).map(Some);
        }
        let size = self.content_index_size()?;
        let mut found = self.find_content(id, size, object_bytes_max)?;
        if found.is_none() {
            // A content collection applies its changes at the tip's seq, which views at
            // that seq see: one that shrank the index since this view read its size moved
            // the entries to other buckets. It removed unreachable objects alone, so the
            // index's size read now finds the rest.
            let now = crate::buckets::CONTENT.size(self, &[])?;
            if now != size {
                found = self.find_content(id, now, object_bytes_max)?;
            }
        }
        let Some((seq, bytes)) = found else {
            return Ok(None);
        };
        if let Some(cache) = &self.cache {
            cache.put(*id, seq, &bytes, self.collections);
        }
        f(&bytes).map(Some)
    }

    /// Content object `id` and the seq of the row that holds it, looked for in the rows
    /// the content-id index of `size` entries names under the id's key (nearly always
    /// one, the one that holds it).
    fn find_content(&self, id: &ContentId, size: u64, object_bytes_max: u64) -> Result<Option<(u64, Vec<u8>)>> {
        for seq in self.content_rows(id, size)? {
            let found = self.with_content_row(seq, |row| crate::log::find_object(row, seq, id, object_bytes_max))?;
            if let Some(bytes) = found {
                return Ok(Some((seq, bytes)));
            }
        }
        Ok(None)
    }

    /// Calls `f` with the content row of seq `seq` (a journalled one from memory, else the
    /// log file's); a row the log lacks is corrupt, since the content-id index named it.
    fn with_content_row<T>(&self, seq: u64, f: impl FnOnce(&[u8]) -> Result<T>) -> Result<T> {
        if let Some(row) = self.log.tail.get(seq) {
            return f(&row.content);
        }
        let content = match self.content.get() {
            Some(table) => table,
            None => {
                let table = crate::pieces::ContentReader::open(&self.log.txn)?;
                self.content.get_or_init(|| table)
            }
        };
        let location = Location::Projection { table: Table::ContentIndex.name(), key: seq.to_string() };
        let row = content.get(seq)?.ok_or_else(|| Error::corrupt(location, format!("content row {seq} is missing")))?;
        f(&row)
    }

    /// The rows of the content-id index that change when the additions the layers hold
    /// (at or below this view's seq) are merged into it: what the checkpoints that write
    /// those layers will write. Computed once a view, for scans of the index's rows.
    fn merged_content_index(&self) -> Result<&Writes> {
        if let Some(writes) = self.merged_content_index.get() {
            return Ok(writes);
        }
        let mut adds = crate::buckets::DeferredContent::default();
        for layer in &self.layers {
            layer.read().content.upto_into(self.seq, &mut adds);
        }
        let mut merged = crate::store::Overlay::new(self);
        crate::buckets::content_merge(&mut merged, adds)?;
        Ok(self.merged_content_index.get_or_init(|| merged.into_writes()))
    }

    /// The content-id index's additions the layers hold typed, whatever their seq (to
    /// size the content-key filter).
    pub(crate) fn content_adds_len(&self) -> usize {
        self.layers.iter().map(|l| l.read().content.len()).sum()
    }

    /// Calls `f` with the key of each content-id index addition the layers hold typed at
    /// or below this view's seq.
    pub(crate) fn each_content_add(&self, f: &mut dyn FnMut(u64)) {
        for layer in &self.layers {
            layer.read().content.keys_upto(self.seq, &mut |key, _| f(key));
        }
    }

    /// The size of the content-id index, read once a view.
    fn content_index_size(&self) -> Result<u64> {
        match self.content_index_size.get() {
            Some(size) => Ok(*size),
            None => {
                let size = crate::buckets::CONTENT.size(self, &[])?;
                Ok(*self.content_index_size.get_or_init(|| size))
            }
        }
    }

    /// The seqs of the content rows that may hold `id`, from the content-id index of
    /// `size` entries ([`crate::buckets::content_rows`]).
    fn content_rows(&self, id: &ContentId, size: u64) -> Result<Vec<u64>> {
        let rows = crate::buckets::content_rows_sized(self, size, id)?;
        match rows.last() {
            Some(seq) if *seq > self.seq => Err(Error::corrupt(
                Location::Projection { table: Table::ContentIndex.name(), key: id.to_hex() },
                format!("content indexed at seq {seq}, past the view's {}", self.seq),
            )),
            _ => Ok(rows),
        }
    }
}

impl crate::store::Records for View {
    fn record(&self, seq: u64) -> Result<Option<annal_codec::Record>> {
        self.record_at(seq)
    }
    fn message_list(&self, seq: u64) -> Result<Option<Arc<[ContentId]>>> {
        Store::message_list(self, seq)
    }
}

impl Store for View {
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        crate::store::with_physical(table, key, |physical| {
            if let Some(v) = self.delta_get(physical) {
                return f(v.as_deref().map(Vec::as_slice));
            }
            self.ckpt.read(physical, f)
        })
    }
    fn put(&mut self, _: Table, _: &[u8], _: &[u8]) -> Result<()> {
        Err(Error::storage("a view is read-only"))
    }
    fn remove(&mut self, _: Table, _: &[u8]) -> Result<()> {
        Err(Error::storage("a view is read-only"))
    }
    fn record_at(&self, seq: u64) -> Result<Option<annal_codec::Record>> {
        let Some(bytes) = self.raw_record(seq)? else {
            return Ok(None);
        };
        let decoded =
            annal_codec::decode_record(&bytes, bytes.len() as u64).map_err(|source| Error::Decode { seq, source })?;
        Ok(Some(decoded.record))
    }
    fn message_list(&self, seq: u64) -> Result<Option<Arc<[ContentId]>>> {
        if seq > self.seq {
            return Ok(None);
        }
        if let Some(list) = self.cache.as_ref().and_then(|c| c.list(seq)) {
            return Ok(Some(list));
        }
        let Some(record) = self.record_at(seq)? else {
            return Ok(None);
        };
        let list = crate::transcript::list_of(&record);
        if let Some(cache) = &self.cache {
            cache.put_list(seq, &list);
        }
        Ok(Some(list))
    }
    fn cached_revision(&self, revision: &annal_codec::RevisionId) -> Option<Arc<[ContentId]>> {
        self.revisions.as_ref()?.get(revision)
    }
    fn keep_revision(&self, revision: &annal_codec::RevisionId, list: &[ContentId]) {
        if let Some(cache) = &self.revisions {
            cache.put(*revision, list);
        }
    }
    fn deferred_content_seqs(&self, id: &ContentId, out: &mut Vec<u64>) {
        for layer in &self.layers {
            layer.read().content.seqs_into(id, self.seq, out);
        }
    }
    fn deferred_content_holds(&self, id: &ContentId) -> bool {
        self.layers.iter().any(|layer| layer.read().content.holds(id, self.seq))
    }
    fn content_key_absent(&self, key: u64) -> bool {
        self.filter.as_ref().is_some_and(|f| f.absent(key))
    }
    fn note_content_key(&self, key: u64) {
        if let Some(filter) = &self.filter {
            filter.note(key);
        }
    }
    fn content_row_holds(&self, seq: u64, id: &ContentId) -> Result<Option<bool>> {
        if seq > self.seq {
            // The batch being decided answers for its own rows: a row past the view that
            // it does not hold is no row at all.
            return Err(Error::storage(format!("content row {seq} is past the view's seq {}", self.seq)));
        }
        self.with_content_row(seq, |row| {
            let found = annal_codec::content::find(row, id, u64::MAX).map_err(|e| {
                Error::corrupt(Location::Content { id: id.to_hex() }, format!("content row {seq}: {e}"))
            })?;
            Ok(Some(found.is_some()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Row<'a> = (Table, &'a [u8], Option<&'a [u8]>);

    fn writes(rows: &[Row<'_>]) -> Writes {
        let base = crate::store::MemStore::default();
        let mut o = crate::store::Overlay::new(&base);
        for (t, k, v) in rows {
            match v {
                Some(v) => o.put(*t, k, v).unwrap(),
                None => o.remove(*t, k).unwrap(),
            }
        }
        o.into_writes()
    }

    fn newest(layer: &Layer) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        layer.newest().map(|(k, v)| (k.to_vec(), v.as_ref().map(|v| v.to_vec()))).collect()
    }

    #[test]
    fn a_layer_keeps_its_keys_in_physical_order_and_every_version() {
        let s1 = [1u8; 16];
        let s2 = [2u8; 16];
        let mut layer = Layer::new(0, ChainHash([0; 32]));
        layer.apply(
            writes(&[
                (Table::Heads, &s2, Some(b"h2")),
                (Table::Heads, &s1, Some(b"h1")),
                (Table::Turns, &s2, Some(b"t")),
            ]),
            1,
            ChainHash([0; 32]),
            1,
            0,
        );
        let first: Vec<Vec<u8>> = newest(&layer).into_iter().map(|(k, _)| k).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(first, sorted);
        assert_eq!(first.len(), 3);
        // A later batch adds keys and new versions of old ones.
        layer.apply(
            writes(&[
                (Table::Heads, &s1, None),
                (Table::CreationOrder, &s1, Some(b"l")),
                (Table::Heads, &[0u8; 16], Some(b"h0")),
            ]),
            2,
            ChainHash([0; 32]),
            1,
            0,
        );
        let rows = newest(&layer);
        let keys: Vec<Vec<u8>> = rows.iter().map(|(k, _)| k.clone()).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert_eq!(rows.len(), 5);
        let h1 = physical_key(Table::Heads, &s1);
        assert_eq!(rows.iter().find(|(k, _)| *k == h1).map(|(_, v)| v.clone()), Some(None));
        // Point reads see each version at its seq.
        assert_eq!(layer.get_at(&h1, 1).cloned().flatten().map(|v| v.to_vec()), Some(b"h1".to_vec()));
        assert_eq!(layer.get_at(&h1, 2).cloned(), Some(None));
        assert_eq!(layer.rows(), 5);
    }

    #[test]
    fn versions_no_view_can_read_are_dropped_as_the_row_is_rewritten() {
        let s1 = [1u8; 16];
        let h1 = physical_key(Table::Heads, &s1);
        let mut layer = Layer::new(0, ChainHash([0; 32]));
        let value = |i: u8| vec![i; 100];
        let batch = |i: u8| writes(&[(Table::Heads, &s1, Some(&value(i)))]);
        let read = |layer: &Layer, seq: u64| layer.get_at(&h1, seq).cloned().flatten().map(|v| v.to_vec());
        // A view reads at 1 while batches 2 to 4 rewrite the row: it keeps reading 1.
        for seq in 1..=4u64 {
            layer.apply(batch(seq as u8), seq, ChainHash([0; 32]), 1, 1);
        }
        assert_eq!(read(&layer, 1), Some(value(1)));
        assert_eq!(read(&layer, 3), Some(value(3)));
        let held = layer.bytes;
        // The oldest view now reads at 4: versions 1 to 3 go when batch 5 comes.
        layer.apply(batch(5), 5, ChainHash([0; 32]), 1, 4);
        assert_eq!(read(&layer, 4), Some(value(4)));
        assert_eq!(read(&layer, 5), Some(value(5)));
        assert_eq!(read(&layer, 3), None, "nothing reads at 3 any more");
        assert_eq!(layer.bytes, held - 2 * (VERSION_OVERHEAD_BYTES + 100));
        assert_eq!(newest(&layer), vec![(h1.clone(), Some(value(5)))]);
    }

    #[test]
    fn readers_know_the_oldest_live_view() {
        let readers = Arc::new(Readers::default());
        assert_eq!(readers.oldest(), None);
        let a = ReaderPin::new(&readers, 7);
        let b = ReaderPin::new(&readers, 3);
        let c = ReaderPin::new(&readers, 3);
        assert_eq!(readers.oldest(), Some(3));
        drop(b);
        assert_eq!(readers.oldest(), Some(3), "a second view still reads at 3");
        drop(c);
        assert_eq!(readers.oldest(), Some(7));
        drop(a);
        assert_eq!(readers.oldest(), None);
    }

    /// Keys of up to 40 bytes, rich in zeros and ones, so that zero padding and shared
    /// prefixes come up.
    fn order_key_bytes() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::strategy::Just;
        proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1u8), proptest::num::u8::ANY], 0..40)
    }

    proptest::proptest! {
        /// The ordered set's keys compare as their bytes do, whatever their length and
        /// however many zero bytes they end with.
        #[test]
        fn order_keys_compare_as_their_bytes(a in order_key_bytes(), b in order_key_bytes(), shared in 0usize..40) {
            // Half the pairs share a prefix, so that the comparison reaches past the
            // integers.
            let b = if shared % 2 == 0 { a.iter().take(shared).chain(b.iter()).copied().collect() } else { b };
            let (x, y) = (OrderKey::new(Arc::from(&a[..])), OrderKey::new(Arc::from(&b[..])));
            proptest::prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            proptest::prop_assert_eq!(x == y, a == b);
        }
    }

    #[test]
    fn order_keys_padded_with_zeros_sort_shorter_first() {
        let keys: Vec<Vec<u8>> = vec![vec![], vec![0], vec![0, 0], vec![1], vec![1; 31], vec![1; 32], vec![1; 33], {
            let mut k = vec![1; 32];
            k.push(0);
            k
        }];
        let mut ours: Vec<OrderKey> = keys.iter().rev().map(|k| OrderKey::new(Arc::from(&k[..]))).collect();
        ours.sort();
        let mut bytes = keys.clone();
        bytes.sort();
        assert_eq!(ours.iter().map(|k| k.key.to_vec()).collect::<Vec<_>>(), bytes);
    }
}
