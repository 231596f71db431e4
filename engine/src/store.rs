//! The abstract store that `decide` reads and `evolve` writes: point reads and writes
//! over named projection tables. The live writer and the offline rebuild run the fold on
//! a redb transaction (`tables::RedbStore`); unit tests run it on [`MemStore`];
//! the writer stages each command in an [`Overlay`] so that a rejection writes nothing.

use crate::error::{Error, Location, Result};
use annal_codec::wire;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Every projection table. Each is defined once, in [`crate::tables`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// session → [`crate::SessionHead`]
    Heads,
    /// (session, chunk) → content ids of the transcript, 128 positions a row
    Transcript,
    /// session → transcript length and revision
    TranscriptTip,
    /// (session, revision) → revision node
    Revisions,
    /// (session, ordinal) → revision id
    RevisionOrder,
    /// (session, seq) → revision edge
    RevisionEdges,
    /// (parent, child) → fork edge
    Forks,
    /// session → graph head marker
    GraphTip,
    /// (session, key) → context entry
    Context,
    /// (session, turn id) → turn record
    Turns,
    /// (session, provider, model) → usage totals
    Usage,
    /// session → labels and creation seq
    LabelSessions,
    /// (key, value, created seq, session) → ()
    LabelIndex,
    /// created seq → session
    CreationOrder,
    /// (session, op id) → tool operation
    ToolOps,
    /// (session, ordinal) → op id
    ToolOrder,
    /// (session, call seq) → op id, unsettled only
    Unsettled,
    /// call seq → (session, op id), unsettled only
    UnsettledAll,
    /// session → tool op count
    ToolTip,
    /// (session, stream seq) → global seq
    StreamIndex,
    /// content id → seq of the content row that holds the object
    ContentIndex,
    /// (session, name, !stream seq) → the entry's value from that event on (or its removal)
    HostStateLog,
    /// !last seq ‖ session → (): every session, most recently updated first
    RecencyOrder,
    /// (key, value) → sessions holding the label
    LabelCounts,
    /// session → seq of its latest event (its place in the recency order), u64 BE
    RecencyTip,
    /// (session, input id) → queued input
    Inputs,
    /// (session, claim seq) → input claim
    Claims,
    /// session → the inbox's open inputs (queue order) and open claims
    InboxTip,
    /// (session, block) → the transcript's chain values every 128 positions
    TranscriptChains,
    /// session → the tombstone of a purged session
    Purged,
}

/// The tag of [`Table::Purged`].
const PURGED_TAG: u8 = 40;

impl Table {
    /// Every projection table.
    pub const ALL: [Table; 30] = [
        Table::Heads,
        Table::Transcript,
        Table::TranscriptTip,
        Table::Revisions,
        Table::RevisionOrder,
        Table::RevisionEdges,
        Table::Forks,
        Table::GraphTip,
        Table::Context,
        Table::Turns,
        Table::Usage,
        Table::LabelSessions,
        Table::LabelIndex,
        Table::CreationOrder,
        Table::ToolOps,
        Table::ToolOrder,
        Table::Unsettled,
        Table::UnsettledAll,
        Table::ToolTip,
        Table::StreamIndex,
        Table::ContentIndex,
        Table::HostStateLog,
        Table::RecencyOrder,
        Table::LabelCounts,
        Table::RecencyTip,
        Table::Inputs,
        Table::Claims,
        Table::InboxTip,
        Table::TranscriptChains,
        Table::Purged,
    ];

    /// The redb table name.
    pub fn name(self) -> &'static str {
        match self {
            Table::Heads => "p.heads",
            Table::Transcript => "p.transcript",
            Table::TranscriptTip => "p.transcript_tip",
            Table::Revisions => "p.revisions",
            Table::RevisionOrder => "p.revision_order",
            Table::RevisionEdges => "p.revision_edges",
            Table::Forks => "p.forks",
            Table::GraphTip => "p.graph_tip",
            Table::Context => "p.context",
            Table::Turns => "p.turns",
            Table::Usage => "p.usage",
            Table::LabelSessions => "p.label_sessions",
            Table::LabelIndex => "p.label_index",
            Table::CreationOrder => "p.creation_order",
            Table::ToolOps => "p.tool_ops",
            Table::ToolOrder => "p.tool_order",
            Table::Unsettled => "p.unsettled",
            Table::UnsettledAll => "p.unsettled_all",
            Table::ToolTip => "p.tool_tip",
            Table::StreamIndex => "p.stream_index",
            Table::ContentIndex => "p.content_index",
            Table::HostStateLog => "p.host_state_log",
            Table::RecencyOrder => "p.recency_order",
            Table::LabelCounts => "p.label_counts",
            Table::RecencyTip => "p.recency_tip",
            Table::Inputs => "p.inputs",
            Table::Claims => "p.claims",
            Table::InboxTip => "p.inbox_tip",
            Table::TranscriptChains => "p.transcript_chains",
            Table::Purged => "p.purged",
        }
    }

    /// Position in [`Table::ALL`].
    pub fn index(self) -> usize {
        Table::ALL.iter().position(|t| *t == self).unwrap_or(0)
    }

    /// The table's tag byte in the physical key (1 to 29, then 40 for [`Table::Purged`];
    /// stable on disk).
    pub fn tag(self) -> u8 {
        match self {
            Table::Purged => PURGED_TAG,
            t => t.index() as u8 + 1,
        }
    }

    /// The table with this tag.
    pub fn from_tag(tag: u8) -> Option<Table> {
        match tag {
            PURGED_TAG => Some(Table::Purged),
            _ => Table::ALL.get((tag as usize).wrapping_sub(1)).copied().filter(|t| *t != Table::Purged),
        }
    }

    /// Whether every key of the table starts with a 16-byte session id. Such rows are
    /// stored session-major, so one commit's rows for a session sit together.
    pub fn session_scoped(self) -> bool {
        !matches!(
            self,
            Table::LabelIndex
                | Table::CreationOrder
                | Table::UnsettledAll
                | Table::ContentIndex
                | Table::RecencyOrder
                | Table::LabelCounts
        )
    }
}

/// Point access to projection tables plus the per-session stream tip.
pub trait Store {
    /// Calls `f` with the value at `key` (or `None`), borrowed where the store holds it,
    /// so that a reader that decodes the row copies nothing first. The one lookup a
    /// store implements; [`Store::get`] copies from it.
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()>;
    /// The value at `key`, if any (a copy).
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut value = None;
        self.read(table, key, &mut |v| {
            value = v.map(<[u8]>::to_vec);
            Ok(())
        })?;
        Ok(value)
    }
    /// Sets `key` to `value`.
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()>;
    /// Removes `key`.
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()>;
    /// Sets `key` to `value`, handing the buffer over (a store that keeps values in
    /// memory keeps this one instead of copying it).
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.put(table, key, &value)
    }
    /// Whether the content row of seq `seq` holds object `id`, where the store sees the
    /// log's content rows (a view of an engine, and an overlay over one): the content-id
    /// index names the rows that may hold an id ([`crate::buckets::content_rows`]), and
    /// only a row says which id it holds. `None` where the store holds projection rows
    /// alone (the default).
    fn content_row_holds(&self, seq: u64, id: &annal_codec::ContentId) -> Result<Option<bool>> {
        let _ = (seq, id);
        Ok(None)
    }
    /// The record at seq `seq`, where the store sees the log (a view of an engine, and an
    /// overlay over one): a projection that names a record (a committed turn's entry)
    /// leaves the rest to it. `None` where the store holds projection rows alone (the
    /// default), or the log holds no record at `seq`.
    fn record_at(&self, seq: u64) -> Result<Option<annal_codec::Record>> {
        let _ = seq;
        Ok(None)
    }
    /// The message list ([`crate::transcript::message_list`]) of the record at seq `seq`,
    /// where the store sees the log, as [`Store::record_at`]: the transcript names its
    /// messages by the records whose lists hold their ids. Empty for a record whose
    /// event has no list; `None` where [`Store::record_at`] is. The default decodes the
    /// record; a view keeps the lists it read in the engine's cache.
    fn message_list(&self, seq: u64) -> Result<Option<std::sync::Arc<[annal_codec::ContentId]>>> {
        Ok(self.record_at(seq)?.as_ref().map(crate::transcript::list_of))
    }
    /// The message list of revision `revision` if the engine's content cache holds it,
    /// where the store reads through an engine's view (an overlay over one too):
    /// [`crate::decide::materialize`]'s walk over a revision's recipes stops at a
    /// revision whose list it holds. `None` elsewhere (the default).
    fn cached_revision(&self, revision: &annal_codec::RevisionId) -> Option<Arc<[annal_codec::ContentId]>> {
        let _ = revision;
        None
    }
    /// Keeps `list`, which the caller hashed to `revision`, in the engine's content cache,
    /// where [`Store::cached_revision`] reads one; nothing elsewhere (the default).
    fn keep_revision(&self, revision: &annal_codec::RevisionId, list: &[annal_codec::ContentId]) {
        let _ = (revision, list);
    }
    /// Lets `f` change the value at `key` in place, where the store holds it in a buffer
    /// of its own that no reader shares and that nothing needs to restore; `f` returns
    /// whether it changed it. Returns false, without calling `f`, where the store holds
    /// no such buffer (the caller then writes the row as usual): the default.
    fn update_in_place(
        &mut self,
        table: Table,
        key: &[u8],
        f: &mut dyn FnMut(&mut Vec<u8>) -> Result<bool>,
    ) -> Result<bool> {
        let _ = (table, key, f);
        Ok(false)
    }

    /// The content-id index's additions this store defers, to merge them into the
    /// index's rows at once; `None`, the default, when each is written as it comes. A
    /// fold from sequence 0 (a catch-up's or a rebuild's store) defers them while the
    /// index is empty, and merges them after its last chunk or at its memory bound; the
    /// writer's overlay defers a batch's, which the delta keeps until a checkpoint.
    fn deferred_content(&mut self) -> Option<&mut crate::buckets::DeferredContent> {
        None
    }

    /// Appends to `out` the seqs of the content rows this store (or a store under it)
    /// holds deferred under `id`'s key in the content-id index, not in the index's rows:
    /// lookups of the index see them.
    fn deferred_content_seqs(&self, id: &annal_codec::ContentId, out: &mut Vec<u64>) {
        let _ = (id, out);
    }

    /// Whether this store (or a store under it) holds an addition deferred under `id`'s
    /// key ([`Store::deferred_content_seqs`]).
    fn deferred_content_holds(&self, id: &annal_codec::ContentId) -> bool {
        let _ = id;
        false
    }

    /// Whether the content-key filter of the engine this store reads says that the
    /// content-id index's rows hold no entry under `key` (a content id's first 8 bytes,
    /// read big-endian); `false`, the default, when it cannot tell ([`crate::filter`]).
    fn content_key_absent(&self, key: u64) -> bool {
        let _ = key;
        false
    }

    /// Tells the content-key filter of the engine this store reads (if any) that a fold
    /// added an entry under `key` to the content-id index.
    fn note_content_key(&self, key: u64) {
        let _ = key;
    }

    /// Calls `f` with the value at `key` and returns true where the store holds that row
    /// as a typed value not encoded yet ([`Store::put_typed`]); returns false without
    /// calling `f` otherwise (the default).
    fn read_typed(&self, table: Table, key: &[u8], f: &mut dyn FnMut(&dyn std::any::Any)) -> Result<bool> {
        let _ = (table, key, f);
        Ok(false)
    }

    /// Removes `key`, a row that the fold of the record at seq `seq` wrote (a session's
    /// former place in the recency order, an unsettled tool call). A store that folds a
    /// run of records over rows that cannot hold a row written at `seq` (a chunk's
    /// overlay, from the chunk's first seq) forgets its own version of the row outright
    /// instead of keeping a removal to apply; the default removes it.
    fn remove_fresh(&mut self, table: Table, key: &[u8], seq: u64) -> Result<()> {
        let _ = seq;
        self.remove(table, key)
    }

    /// Whether the store keeps rows typed ([`Store::put_typed`]); false, the default,
    /// when it would only encode them at once.
    fn keeps_typed(&self) -> bool {
        false
    }

    /// The hashed map `map` of `prefix` held whole in memory, where this store holds such
    /// maps so (a fold's [`Typed`] store holds the committed turns and the revision nodes),
    /// loaded from the map's rows on first use. `None`, the default, where the map's rows
    /// are read and written one by one ([`crate::buckets::Buckets`]).
    fn held_map(
        &mut self,
        map: &crate::buckets::Buckets,
        prefix: &[u8],
    ) -> Result<Option<&mut crate::buckets::HeldMap>> {
        let _ = (map, prefix);
        Ok(None)
    }

    /// The map of `table` and `prefix` if this store holds it in memory now
    /// ([`Store::held_map`]); `None` where its rows say what it holds.
    fn held_map_ref(&self, table: Table, prefix: &[u8]) -> Option<&crate::buckets::HeldMap> {
        let _ = (table, prefix);
        None
    }

    /// Sets `key` to `value`. A store that folds long runs of records (a chunk of a
    /// rebuild or a catch-up) keeps the value typed and encodes it once, when it hands
    /// its writes over; the default encodes it now.
    fn put_typed(&mut self, table: Table, key: &[u8], value: Box<dyn TypedRow>) -> Result<()> {
        let bytes = value.encode()?;
        self.put_vec(table, key, bytes)
    }
}

/// A row value that a store may hold typed and encode later ([`Store::put_typed`]).
pub trait TypedRow: std::any::Any + Send + Sync {
    /// The row's bytes ([`encode_row`]).
    fn encode(&self) -> Result<Vec<u8>>;
    /// The value, to downcast.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: Serialize + std::any::Any + Send + Sync> TypedRow for T {
    fn encode(&self) -> Result<Vec<u8>> {
        encode_row(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Typed helpers over any [`Store`].
pub trait StoreExt: Store {
    /// Reads and decodes a row; a row that does not decode is `Corrupt`.
    fn row<T: DeserializeOwned>(&self, table: Table, key: &[u8]) -> Result<Option<T>> {
        let mut row = None;
        self.read(table, key, &mut |bytes| {
            if let Some(bytes) = bytes {
                row = Some(decode_row(table, key, bytes)?);
            }
            Ok(())
        })?;
        Ok(row)
    }

    /// Whether `key` holds a value (read without copying it).
    fn contains(&self, table: Table, key: &[u8]) -> Result<bool> {
        let mut found = false;
        self.read(table, key, &mut |bytes| {
            found = bytes.is_some();
            Ok(())
        })?;
        Ok(found)
    }

    /// Encodes and writes a row.
    fn put_row<T: Serialize>(&mut self, table: Table, key: &[u8], value: &T) -> Result<()> {
        let bytes = encode_row(value)?;
        self.put_vec(table, key, bytes)
    }

    /// [`StoreExt::row`] of a row that a fold rewrites at nearly every record of its
    /// session (its head, its tips): a copy of the typed value where the store holds
    /// one ([`Store::read_typed`]), else decoded from its bytes.
    fn tip_row<T: DeserializeOwned + Clone + 'static>(&self, table: Table, key: &[u8]) -> Result<Option<T>> {
        let mut found = None;
        if self.read_typed(table, key, &mut |value| found = value.downcast_ref::<T>().cloned())? {
            if let Some(value) = found {
                return Ok(Some(value));
            }
        }
        // Held as bytes, or typed as another type: its bytes say what it is.
        self.row(table, key)
    }

    /// Writes a row that [`StoreExt::tip_row`] reads: typed where the store keeps it so
    /// ([`Store::put_typed`]), else encoded now.
    fn put_tip_row<T: Serialize + Send + Sync + 'static>(&mut self, table: Table, key: &[u8], value: T) -> Result<()> {
        if self.keeps_typed() {
            self.put_typed(table, key, Box::new(value))
        } else {
            self.put_row(table, key, &value)
        }
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// The size limit for projection rows; rows are small, this only bounds decoding.
pub(crate) const ROW_BYTES_MAX: u64 = 256 << 20;

/// Encodes a projection row with the canonical wire options.
pub fn encode_row<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    wire::to_bytes(value, ROW_BYTES_MAX).map_err(|e| Error::storage(format!("encode row: {e}")))
}

/// Decodes a projection row; failure is corruption at that row.
pub fn decode_row<T: DeserializeOwned>(table: Table, key: &[u8], bytes: &[u8]) -> Result<T> {
    wire::from_bytes(bytes, ROW_BYTES_MAX)
        .map_err(|e| Error::corrupt(Location::Projection { table: table.name(), key: hex(key) }, e.to_string()))
}

pub(crate) use annal_codec::hex;

/// The rows of one table held in memory, by key: the map a [`Rows`] store keeps per table.
pub trait RowMap: Default {
    /// The row at `key`.
    fn row(&self, key: &[u8]) -> Option<&Vec<u8>>;
    /// The row at `key`, to change in place.
    fn row_mut(&mut self, key: &[u8]) -> Option<&mut Vec<u8>>;
    /// Sets the row at `key`.
    fn set_row(&mut self, key: Vec<u8>, value: Vec<u8>);
    /// Removes the row at `key`, if there is one.
    fn remove_row(&mut self, key: &[u8]);
    /// Whether the table holds no row.
    fn is_empty(&self) -> bool;
}

impl RowMap for BTreeMap<Vec<u8>, Vec<u8>> {
    fn row(&self, key: &[u8]) -> Option<&Vec<u8>> {
        self.get(key)
    }
    fn row_mut(&mut self, key: &[u8]) -> Option<&mut Vec<u8>> {
        self.get_mut(key)
    }
    fn set_row(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.insert(key, value);
    }
    fn remove_row(&mut self, key: &[u8]) {
        self.remove(key);
    }
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

impl<H: std::hash::BuildHasher + Default> RowMap for HashMap<Vec<u8>, Vec<u8>, H> {
    fn row(&self, key: &[u8]) -> Option<&Vec<u8>> {
        self.get(key)
    }
    fn row_mut(&mut self, key: &[u8]) -> Option<&mut Vec<u8>> {
        self.get_mut(key)
    }
    fn set_row(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.insert(key, value);
    }
    fn remove_row(&mut self, key: &[u8]) {
        self.remove(key);
    }
    fn is_empty(&self) -> bool {
        HashMap::is_empty(self)
    }
}

/// An in-memory store: a map of rows per table ([`MemStore`], [`HashStore`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rows<M> {
    /// The rows, per table.
    pub tables: BTreeMap<Table, M>,
}

/// An in-memory store whose tables keep their rows in key order. Used by unit tests and
/// by `verify --deep`'s comparison.
pub type MemStore = Rows<BTreeMap<Vec<u8>, Vec<u8>>>;

/// An in-memory store whose tables keep their rows in no order: `evolve` reads and writes
/// rows by key and never scans, so a fold into scratch state (`verify`'s) needs no order.
pub type HashStore = Rows<HashMap<Vec<u8>, Vec<u8>, foldhash::fast::RandomState>>;

impl HashStore {
    /// The same rows, in key order.
    pub fn into_ordered(self) -> MemStore {
        Rows { tables: self.tables.into_iter().map(|(t, rows)| (t, rows.into_iter().collect())).collect() }
    }
}

impl<M: RowMap> Store for Rows<M> {
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        f(self.tables.get(&table).and_then(|t| t.row(key)).map(Vec::as_slice))
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        let rows = self.tables.entry(table).or_default();
        match rows.row_mut(key) {
            // A rewritten row (a tip, a head, the last chunk) keeps its buffer.
            Some(row) => {
                row.clear();
                row.extend_from_slice(value);
            }
            None => rows.set_row(key.to_vec(), value.to_vec()),
        }
        Ok(())
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        if let Some(t) = self.tables.get_mut(&table) {
            t.remove_row(key);
            if t.is_empty() {
                self.tables.remove(&table);
            }
        }
        Ok(())
    }
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.tables.entry(table).or_default().set_row(key.to_vec(), value);
        Ok(())
    }
}

/// A row version held in memory: the value, or `None` for a removal. Shared, so the
/// delta keeps the very buffer a fold wrote.
pub(crate) type Value = Option<Arc<Vec<u8>>>;

/// The hasher of in-memory row maps: keys are physical keys, which no outside party
/// chooses to collide (foldhash's fast, seeded hasher).
pub(crate) type RowHasher = foldhash::fast::RandomState;

/// Calls `f` with the physical key of `key` in `table`, built on the stack when it is
/// short (every key but a long label's or input id's).
pub(crate) fn with_physical<T>(table: Table, key: &[u8], f: impl FnOnce(&[u8]) -> T) -> T {
    const STACK_KEY_BYTES: usize = 96;
    if key.len() + 2 <= STACK_KEY_BYTES {
        let mut buf = [0u8; STACK_KEY_BYTES];
        let n = crate::tables::physical_key_into_slice(table, key, &mut buf);
        f(&buf[..n])
    } else {
        f(&crate::tables::physical_key(table, key))
    }
}

/// Sets `key` to `value` in the buffer the store holds the row in, where it holds one of
/// its own ([`Store::update_in_place`]), else as a new buffer ([`Store::put_vec`]).
fn overwrite_or_put<S: Store + ?Sized>(store: &mut S, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
    let overwritten = store.update_in_place(table, key, &mut |buffer| {
        buffer.clear();
        buffer.extend_from_slice(value);
        Ok(true)
    })?;
    if !overwritten {
        store.put_vec(table, key, value.to_vec())?;
    }
    Ok(())
}

/// Buffers writes on top of a base store. Reads see the buffer first. [`Overlay::into_writes`]
/// hands the writes over to be applied; dropping the overlay discards them.
///
/// Rows are held under their physical keys in one hash map. A command is staged in the
/// same map ([`Overlay::stage`]): each row it changes first records what the row was, so
/// a rejected command is undone in place ([`Overlay::discard`]) and an accepted one costs
/// nothing more ([`Overlay::keep`]).
pub struct Overlay<'a, S: Store + ?Sized> {
    base: &'a S,
    writes: Writes,
    /// While a command is staged: each row it changed, with what the row held before.
    undo: Option<Undo>,
    /// Whether the content-id index's additions are deferred ([`Overlay::deferring`]),
    /// and how many were when the staged command began.
    defer: bool,
    staged_content: usize,
    /// Its rows from the fold of records at seqs from here on are its own: the base holds
    /// none ([`Overlay::fresh_from`]).
    fresh_from: u64,
}

/// The rows a staged command changed, oldest first, each with what the overlay held for
/// it before (`None`: nothing).
type Undo = Vec<(Arc<[u8]>, Option<Value>)>;

impl<'a, S: Store + ?Sized> Overlay<'a, S> {
    /// An empty overlay over `base`.
    pub fn new(base: &'a S) -> Self {
        Overlay { base, writes: Writes::default(), undo: None, defer: false, staged_content: 0, fresh_from: u64::MAX }
    }

    /// An empty overlay over `base` that defers the content-id index's additions: they
    /// go with its writes ([`Writes::content`]) instead of into the index's rows, for the
    /// delta to keep until a checkpoint merges them.
    pub(crate) fn deferring(base: &'a S) -> Self {
        Overlay { defer: true, ..Overlay::new(base) }
    }

    /// Says that the base holds no row written by the fold of a record at `seq` or
    /// after: the first seq this overlay folds, when every projection's rows in the base
    /// are from records before it. Until then every removal is kept; from then on, a
    /// removal of a row written from `seq` on ([`Store::remove_fresh`]) drops the
    /// overlay's entry instead of keeping a removal that the chunk would hand over and the
    /// file apply. For an overlay that never stages a command.
    pub(crate) fn fresh_from(&mut self, seq: u64) {
        self.fresh_from = seq;
    }

    /// The buffered writes; `None` is a removal.
    pub fn into_writes(self) -> Writes {
        self.writes
    }

    /// Starts staging a command: what it writes can be undone by [`Overlay::discard`].
    pub fn stage(&mut self) {
        self.undo = Some(Vec::new());
        self.staged_content = self.writes.content.len();
    }

    /// Keeps what the staged command wrote.
    pub fn keep(&mut self) {
        self.undo = None;
    }

    /// Undoes what the staged command wrote: every row is as it was at [`Overlay::stage`].
    pub fn discard(&mut self) {
        self.writes.content.truncate(self.staged_content);
        for (key, before) in self.undo.take().unwrap_or_default().into_iter().rev() {
            match before {
                Some(value) => self.writes.rows.insert(key, value),
                None => self.writes.rows.remove(&key),
            };
        }
    }

    fn set(&mut self, table: Table, key: &[u8], value: Value) {
        with_physical(table, key, |k| {
            let (physical, before) = self.writes.set(k, value);
            if let Some(undo) = self.undo.as_mut() {
                undo.push((physical, before));
            }
        })
    }

    /// The buffer of a row these writes hold alone, while no command is staged.
    fn own_buffer(&mut self, table: Table, key: &[u8], f: impl FnOnce(&mut Vec<u8>) -> Result<bool>) -> Result<bool> {
        if self.undo.is_some() {
            return Ok(false);
        }
        match with_physical(table, key, |k| self.writes.rows.get_mut(k).and_then(|v| v.as_mut()).and_then(Arc::get_mut))
        {
            Some(buffer) => f(buffer),
            None => Ok(false),
        }
    }
}

/// Methods of [`Store`] that a wrapper answers from the store it wraps, each as that store
/// answers it: `delegate_reads!(base: record_at, ...)` for a field, or
/// `delegate_reads!(rows(): ...)` for a method that lends the wrapped store. Only methods
/// that take `&self` and add nothing of the wrapper's own are delegated this way.
macro_rules! delegate_reads {
    ($to:ident: $($method:ident),+ $(,)?) => {
        $(delegate_reads!(@one $to [] $method);)+
    };
    ($to:ident(): $($method:ident),+ $(,)?) => {
        $(delegate_reads!(@one $to [()] $method);)+
    };
    (@one $to:ident [$($call:tt)*] content_row_holds) => {
        fn content_row_holds(&self, seq: u64, id: &annal_codec::ContentId) -> Result<Option<bool>> {
            self.$to$($call)*.content_row_holds(seq, id)
        }
    };
    (@one $to:ident [$($call:tt)*] record_at) => {
        fn record_at(&self, seq: u64) -> Result<Option<annal_codec::Record>> {
            self.$to$($call)*.record_at(seq)
        }
    };
    (@one $to:ident [$($call:tt)*] message_list) => {
        fn message_list(&self, seq: u64) -> Result<Option<Arc<[annal_codec::ContentId]>>> {
            self.$to$($call)*.message_list(seq)
        }
    };
    (@one $to:ident [$($call:tt)*] cached_revision) => {
        fn cached_revision(&self, revision: &annal_codec::RevisionId) -> Option<Arc<[annal_codec::ContentId]>> {
            self.$to$($call)*.cached_revision(revision)
        }
    };
    (@one $to:ident [$($call:tt)*] keep_revision) => {
        fn keep_revision(&self, revision: &annal_codec::RevisionId, list: &[annal_codec::ContentId]) {
            self.$to$($call)*.keep_revision(revision, list)
        }
    };
    (@one $to:ident [$($call:tt)*] content_key_absent) => {
        fn content_key_absent(&self, key: u64) -> bool {
            self.$to$($call)*.content_key_absent(key)
        }
    };
    (@one $to:ident [$($call:tt)*] note_content_key) => {
        fn note_content_key(&self, key: u64) {
            self.$to$($call)*.note_content_key(key)
        }
    };
    (@one $to:ident [$($call:tt)*] keeps_typed) => {
        fn keeps_typed(&self) -> bool {
            self.$to$($call)*.keeps_typed()
        }
    };
    (@one $to:ident [$($call:tt)*] deferred_content_seqs) => {
        fn deferred_content_seqs(&self, id: &annal_codec::ContentId, out: &mut Vec<u64>) {
            self.$to$($call)*.deferred_content_seqs(id, out)
        }
    };
    (@one $to:ident [$($call:tt)*] deferred_content_holds) => {
        fn deferred_content_holds(&self, id: &annal_codec::ContentId) -> bool {
            self.$to$($call)*.deferred_content_holds(id)
        }
    };
    (@one $to:ident [$($call:tt)*] read_typed) => {
        fn read_typed(&self, table: Table, key: &[u8], f: &mut dyn FnMut(&dyn std::any::Any)) -> Result<bool> {
            self.$to$($call)*.read_typed(table, key, f)
        }
    };
    (@one $to:ident [$($call:tt)*] read) => {
        fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
            self.$to$($call)*.read(table, key, f)
        }
    };
}

impl<S: Store + ?Sized> Store for Overlay<'_, S> {
    delegate_reads!(
        base:
        content_row_holds, content_key_absent, note_content_key, record_at, message_list,
        cached_revision, keep_revision,
    );
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        match with_physical(table, key, |physical| self.writes.rows.get(physical).cloned()) {
            Some(v) => f(v.as_deref().map(Vec::as_slice)),
            None => self.base.read(table, key, f),
        }
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        overwrite_or_put(self, table, key, value)
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        self.set(table, key, None);
        Ok(())
    }
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.set(table, key, Some(Arc::new(value)));
        Ok(())
    }
    fn remove_fresh(&mut self, table: Table, key: &[u8], seq: u64) -> Result<()> {
        if seq < self.fresh_from {
            return self.remove(table, key);
        }
        with_physical(table, key, |physical| self.writes.rows.remove(physical));
        Ok(())
    }
    fn update_in_place(
        &mut self,
        table: Table,
        key: &[u8],
        f: &mut dyn FnMut(&mut Vec<u8>) -> Result<bool>,
    ) -> Result<bool> {
        self.own_buffer(table, key, f)
    }
    fn deferred_content(&mut self) -> Option<&mut crate::buckets::DeferredContent> {
        self.defer.then_some(&mut self.writes.content)
    }
    fn deferred_content_seqs(&self, id: &annal_codec::ContentId, out: &mut Vec<u64>) {
        self.writes.content.seqs_into(id, out);
        self.base.deferred_content_seqs(id, out);
    }
    fn deferred_content_holds(&self, id: &annal_codec::ContentId) -> bool {
        self.writes.content.holds(id) || self.base.deferred_content_holds(id)
    }
}

/// A store for a fold of a long run of records (a chunk of a rebuild or a catch-up, and
/// `annal verify`'s scratch state), which never stages a command: the rows a fold
/// rewrites at nearly every record of a session ([`StoreExt::put_tip_row`]: its head, its
/// tips) are held as typed values, read back by copy ([`StoreExt::tip_row`]) and encoded
/// once, by [`Typed::into_inner`], instead of decoded and encoded again at every record.
/// A read of such a row's bytes encodes it; a write of its bytes, or its removal, drops
/// the typed value. Every other row, and every other call, goes to the store inside.
pub struct Typed<S: Store> {
    inner: S,
    /// The typed rows, a map a table ([`Table::index`]). A table with none (most of
    /// them) is skipped without hashing the key.
    typed: Vec<HashMap<Vec<u8>, Box<dyn TypedRow>, RowHasher>>,
    /// The hashed maps of [`HELD_MAP_TABLES`] a fold has written to ([`Store::held_map`]),
    /// a map of them a table, by prefix: the map held whole, or `None` for one found too
    /// large to hold ([`HELD_MAP_BYTES_MAX`]), whose size is then read once.
    maps: Vec<HashMap<Vec<u8>, Option<crate::buckets::HeldMap>, RowHasher>>,
}

/// The tables whose hashed maps a [`Typed`] store holds whole ([`Store::held_map`]): the
/// committed turns and the revision nodes, which a fold inserts into at nearly every turn.
/// Their keys are a session's prefix (16 bytes) and what follows it.
pub const HELD_MAP_TABLES: [Table; 2] = [Table::Turns, Table::Revisions];

/// The bytes of a session's prefix, which begins every key of [`HELD_MAP_TABLES`].
const HELD_MAP_PREFIX: usize = 16;

/// The largest map, in bytes of entries, that a [`Typed`] store starts to hold whole: it
/// reads all of the map when the fold first writes to it, and writes all of it back, so a
/// short fold (the tail an open folds after a crash) over a session of a very long
/// history changes such a map row by row instead. A fold from sequence 0 starts every map
/// empty.
pub const HELD_MAP_BYTES_MAX: u64 = 64 << 10;

impl<S: Store> Typed<S> {
    /// `inner`, holding no typed row yet.
    pub fn new(inner: S) -> Self {
        let maps = Table::ALL.iter().map(|_| HashMap::default()).collect();
        Typed { inner, typed: Table::ALL.iter().map(|_| HashMap::default()).collect(), maps }
    }

    /// The store inside, with every typed row encoded into it.
    pub fn into_inner(self) -> Result<S> {
        let Typed { mut inner, typed, maps } = self;
        for (table, rows) in Table::ALL.into_iter().zip(typed) {
            for (key, value) in rows {
                inner.put_vec(table, &key, value.encode()?)?;
            }
        }
        for held in maps {
            for (prefix, map) in held.into_iter().filter_map(|(prefix, map)| Some((prefix, map?))) {
                map.write(&mut inner, &prefix)?;
            }
        }
        Ok(inner)
    }

    /// The typed value of `key`, if it is held typed.
    fn typed(&self, table: Table, key: &[u8]) -> Option<&dyn TypedRow> {
        let rows = &self.typed[table.index()];
        if rows.is_empty() {
            return None;
        }
        rows.get(key).map(|value| &**value)
    }

    /// Refuses a read or a write of the rows of a map held whole: they are stale until
    /// the map is written back ([`Typed::into_inner`]), and only
    /// [`crate::buckets::Buckets`] reads and writes a map, through [`Store::held_map`].
    fn check_not_held(&self, table: Table, key: &[u8]) -> Result<()> {
        match key.len() >= HELD_MAP_PREFIX && self.held_map_ref(table, &key[..HELD_MAP_PREFIX]).is_some() {
            true => Err(Error::storage(format!("a row of a {} map held in memory was read or written", table.name()))),
            false => Ok(()),
        }
    }

    /// Drops the typed value of `key`, whose bytes are written or removed.
    fn forget(&mut self, table: Table, key: &[u8]) {
        let rows = &mut self.typed[table.index()];
        if !rows.is_empty() {
            rows.remove(key);
        }
    }
}

/// A [`Typed`] [`Overlay`]: the store of a chunk of a rebuild or a catch-up.
pub(crate) type TypedOverlay<'a, S> = Typed<Overlay<'a, S>>;

impl<'a, S: Store + ?Sized> Typed<Overlay<'a, S>> {
    /// An empty overlay over `base`, with room for `rows` rows before its map grows.
    pub(crate) fn with_capacity(base: &'a S, rows: usize) -> Self {
        let mut overlay = Overlay::new(base);
        overlay.writes.rows.reserve(rows);
        Typed::new(overlay)
    }

    /// [`Overlay::fresh_from`].
    pub(crate) fn fresh_from(&mut self, seq: u64) {
        self.inner.fresh_from(seq);
    }

    /// The buffered writes, the typed rows encoded.
    pub(crate) fn finish(self) -> Result<Writes> {
        Ok(self.into_inner()?.into_writes())
    }
}

impl<S: Store> Store for Typed<S> {
    delegate_reads!(
        inner:
        content_row_holds, deferred_content_seqs, deferred_content_holds, content_key_absent,
        note_content_key, record_at, message_list, cached_revision, keep_revision,
    );
    fn keeps_typed(&self) -> bool {
        true
    }
    fn held_map(
        &mut self,
        map: &crate::buckets::Buckets,
        prefix: &[u8],
    ) -> Result<Option<&mut crate::buckets::HeldMap>> {
        if !HELD_MAP_TABLES.contains(&map.table) || prefix.len() != HELD_MAP_PREFIX {
            return Ok(None);
        }
        let maps = &mut self.maps[map.table.index()];
        if !maps.contains_key(prefix) {
            let held = match map.size(&self.inner, prefix)? > HELD_MAP_BYTES_MAX {
                true => None,
                false => Some(map.load(&self.inner, prefix)?),
            };
            maps.insert(prefix.to_vec(), held);
        }
        Ok(maps.get_mut(prefix).and_then(Option::as_mut))
    }
    fn held_map_ref(&self, table: Table, prefix: &[u8]) -> Option<&crate::buckets::HeldMap> {
        let maps = &self.maps[table.index()];
        if maps.is_empty() {
            return None;
        }
        maps.get(prefix)?.as_ref()
    }
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        self.check_not_held(table, key)?;
        match self.typed(table, key) {
            Some(value) => f(Some(&value.encode()?)),
            None => self.inner.read(table, key, f),
        }
    }
    fn read_typed(&self, table: Table, key: &[u8], f: &mut dyn FnMut(&dyn std::any::Any)) -> Result<bool> {
        Ok(self.typed(table, key).map(|value| f(value.as_any())).is_some())
    }
    fn put_typed(&mut self, table: Table, key: &[u8], value: Box<dyn TypedRow>) -> Result<()> {
        let rows = &mut self.typed[table.index()];
        match rows.get_mut(key) {
            Some(slot) => *slot = value,
            None => {
                rows.insert(key.to_vec(), value);
            }
        }
        Ok(())
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        self.check_not_held(table, key)?;
        self.forget(table, key);
        self.inner.put(table, key, value)
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        self.check_not_held(table, key)?;
        self.forget(table, key);
        self.inner.remove(table, key)
    }
    fn remove_fresh(&mut self, table: Table, key: &[u8], seq: u64) -> Result<()> {
        self.check_not_held(table, key)?;
        self.forget(table, key);
        self.inner.remove_fresh(table, key, seq)
    }
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.check_not_held(table, key)?;
        self.forget(table, key);
        self.inner.put_vec(table, key, value)
    }
    fn update_in_place(
        &mut self,
        table: Table,
        key: &[u8],
        f: &mut dyn FnMut(&mut Vec<u8>) -> Result<bool>,
    ) -> Result<bool> {
        self.check_not_held(table, key)?;
        // A typed row's bytes are not held: the caller writes it anew.
        if self.typed(table, key).is_some() {
            return Ok(false);
        }
        self.inner.update_in_place(table, key, f)
    }
    fn deferred_content(&mut self) -> Option<&mut crate::buckets::DeferredContent> {
        self.inner.deferred_content()
    }
}

/// Writes buffered by an [`Overlay`]: physical key ([`crate::tables::physical_key`]) →
/// value, `None` for a removal.
#[derive(Debug, Default)]
pub struct Writes {
    /// hashbrown's map, whose `entry_ref` finds a row by a borrowed key, hashing it once.
    rows: hashbrown::HashMap<Arc<[u8]>, Value, RowHasher>,
    /// The content-id index's additions an overlay that defers them folded
    /// ([`Overlay::deferring`]); empty otherwise.
    pub(crate) content: crate::buckets::DeferredContent,
}

impl Writes {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it holds no row and no deferred addition.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.content.is_empty()
    }

    /// The row of physical key `physical`, if these writes hold one (`Some(None)`: a
    /// removal).
    pub(crate) fn get(&self, physical: &[u8]) -> Option<&Value> {
        self.rows.get(physical)
    }

    /// Every row, in no particular order.
    pub(crate) fn rows(&self) -> impl Iterator<Item = (&Arc<[u8]>, &Value)> {
        self.rows.iter()
    }

    /// Every row, in no particular order.
    pub(crate) fn into_rows(self) -> impl Iterator<Item = (Arc<[u8]>, Value)> {
        self.rows.into_iter()
    }

    /// Every row, in physical key order.
    pub(crate) fn into_sorted(self) -> Vec<(Arc<[u8]>, Value)> {
        let mut rows: Vec<(Arc<[u8]>, Value)> = self.rows.into_iter().collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        rows
    }

    /// The rows of `table`, by logical key, in key order.
    pub fn table(&self, table: Table) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        self.rows
            .iter()
            .filter_map(|(physical, value)| match crate::tables::logical_key(physical) {
                Some((t, key)) if t == table => Some((key, value.as_ref().map(|v| v.to_vec()))),
                _ => None,
            })
            .collect()
    }
}

impl Writes {
    /// Sets physical key `physical` to `value`; returns the key and what the row held
    /// before. A row written before keeps its key: no key is allocated for it again.
    fn set(&mut self, physical: &[u8], value: Value) -> (Arc<[u8]>, Option<Value>) {
        match self.rows.entry_ref(physical) {
            hashbrown::hash_map::EntryRef::Occupied(mut held) => {
                let key = held.key().clone();
                (key, Some(std::mem::replace(held.get_mut(), value)))
            }
            hashbrown::hash_map::EntryRef::Vacant(vacant) => {
                let key: Arc<[u8]> = Arc::from(physical);
                vacant.insert_with_key(key.clone(), value);
                (key, None)
            }
        }
    }

    /// Adds `other`'s rows, which replace any of these for the same key.
    pub(crate) fn extend(&mut self, other: Writes) {
        self.rows.extend(other.rows);
        self.content.extend(&other.content);
    }
}

/// The rows of one table held in memory across the chunks of a long fold (a rebuild, a
/// catch-up), in front of the chunks: see [`Held`].
#[derive(Debug)]
pub(crate) struct HeldRows {
    table: Table,
    writes: Writes,
    /// Whether the content-id index's additions are deferred in this chunk
    /// ([`Held::defer_if_empty`]), and those not merged into its rows yet
    /// ([`HeldRows::hand_over`], [`Held::settle`]).
    defer: bool,
    deferred: crate::buckets::DeferredContent,
    /// The bytes of the rows held, keys and values.
    bytes: usize,
}

impl HeldRows {
    /// Holds nothing yet, for rows of `table`.
    pub(crate) fn new(table: Table) -> HeldRows {
        HeldRows { table, writes: Writes::default(), defer: false, deferred: Default::default(), bytes: 0 }
    }

    /// Hands the rows over and holds nothing.
    fn take(&mut self) -> Writes {
        self.bytes = 0;
        std::mem::take(&mut self.writes)
    }

    /// Adds the rows held to a chunk's `writes` if the chunk is the `last`, or if they
    /// take more than `bound` bytes; else keeps holding them. The content-id index's
    /// deferred additions are merged into the rows first, over `store` (what the chunks
    /// before wrote), if the chunk is the last or they take more than `bound` bytes;
    /// else they stay deferred into the next chunk.
    pub(crate) fn hand_over<S: Store + ?Sized>(
        &mut self,
        store: &S,
        writes: &mut Writes,
        last: bool,
        bound: usize,
    ) -> Result<()> {
        if !self.deferred.is_empty() && (last || self.deferred.bytes() > bound) {
            // The merge reads and writes the held table alone: nothing lands in `rest`.
            let mut rest = Overlay::new(store);
            Held { held: &mut *self, rest: &mut rest }.settle()?;
            debug_assert!(rest.into_writes().is_empty(), "a merge writes only the held table");
        }
        if last || self.bytes > bound {
            writes.extend(self.take());
        }
        Ok(())
    }

    fn row_bytes(key: &[u8], value: &Value) -> usize {
        key.len() + value.as_ref().map_or(0, |v| v.len())
    }

    fn set(&mut self, physical: &[u8], value: Value) {
        let added = Self::row_bytes(physical, &value);
        let (_, before) = self.writes.set(physical, value);
        let removed = before.map_or(0, |v| Self::row_bytes(physical, &v));
        self.bytes = (self.bytes + added).saturating_sub(removed);
    }
}

/// A store for a long fold that holds the rows of one table in [`HeldRows`] and sends
/// every other row to `rest` (the chunk's overlay). A chunk of a rebuild or a catch-up is
/// flushed every [`crate::checkpoint::FOLD_CHUNK_EVENTS`] events, which bounds what it
/// holds; but the content-id index is one map hashed over the whole log, so every chunk
/// rewrote nearly all of its buckets, each read back from the chunk before and written
/// again: at 1,000,000 events, sixteen times. Held across the chunks, each bucket is
/// written once. Reads of the held table see the held rows first, then `rest`.
pub(crate) struct Held<'h, S: Store + ?Sized> {
    pub(crate) held: &'h mut HeldRows,
    pub(crate) rest: &'h mut S,
}

impl<S: Store + ?Sized> Held<'_, S> {
    /// The start of a chunk's fold: when the held table is the content-id index and the
    /// index is empty (a fold from sequence 0, up to the first merge), its additions are
    /// deferred, across chunks, until [`HeldRows::hand_over`] merges them at once (after
    /// the last chunk, or when they take more than its bound). Inserted one by one, the
    /// additions were most of the second folding thread's time (about a sixth of a
    /// catch-up's CPU on the comparison's workload); at once, they are a sort and one
    /// write of each bucket. Into an index that holds entries already, each addition
    /// is inserted as it comes: a merge there reads each key's entry and rewrites
    /// nearly every bucket, which costs more than the inserts it replaces.
    pub(crate) fn defer_if_empty(&mut self) -> Result<()> {
        self.held.defer = self.held.table == Table::ContentIndex && crate::buckets::CONTENT.size(&*self, &[])? == 0;
        Ok(())
    }

    /// Merges the content-id index's deferred additions into the held rows, and stops
    /// deferring them.
    pub(crate) fn settle(&mut self) -> Result<()> {
        self.held.defer = false;
        let deferred = std::mem::take(&mut self.held.deferred);
        crate::buckets::content_merge(self, deferred)
    }
}

impl<S: Store + ?Sized> Store for Held<'_, S> {
    delegate_reads!(
        rest:
        keeps_typed, content_key_absent, note_content_key, record_at, message_list,
        cached_revision, keep_revision, content_row_holds,
    );
    fn remove_fresh(&mut self, table: Table, key: &[u8], seq: u64) -> Result<()> {
        if table == self.held.table {
            return self.remove(table, key);
        }
        self.rest.remove_fresh(table, key, seq)
    }
    fn read_typed(&self, table: Table, key: &[u8], f: &mut dyn FnMut(&dyn std::any::Any)) -> Result<bool> {
        if table == self.held.table {
            return Ok(false);
        }
        self.rest.read_typed(table, key, f)
    }
    fn put_typed(&mut self, table: Table, key: &[u8], value: Box<dyn TypedRow>) -> Result<()> {
        if table == self.held.table {
            let bytes = value.encode()?;
            return self.put_vec(table, key, bytes);
        }
        self.rest.put_typed(table, key, value)
    }
    fn deferred_content(&mut self) -> Option<&mut crate::buckets::DeferredContent> {
        self.held.defer.then_some(&mut self.held.deferred)
    }
    fn held_map(
        &mut self,
        map: &crate::buckets::Buckets,
        prefix: &[u8],
    ) -> Result<Option<&mut crate::buckets::HeldMap>> {
        if map.table == self.held.table {
            return Ok(None);
        }
        self.rest.held_map(map, prefix)
    }
    fn held_map_ref(&self, table: Table, prefix: &[u8]) -> Option<&crate::buckets::HeldMap> {
        if table == self.held.table {
            return None;
        }
        self.rest.held_map_ref(table, prefix)
    }
    fn deferred_content_seqs(&self, id: &annal_codec::ContentId, out: &mut Vec<u64>) {
        self.held.deferred.seqs_into(id, out);
        self.rest.deferred_content_seqs(id, out);
    }
    fn deferred_content_holds(&self, id: &annal_codec::ContentId) -> bool {
        self.held.deferred.holds(id) || self.rest.deferred_content_holds(id)
    }
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        if table != self.held.table {
            return self.rest.read(table, key, f);
        }
        match with_physical(table, key, |physical| self.held.writes.get(physical).cloned()) {
            Some(v) => f(v.as_deref().map(Vec::as_slice)),
            None => self.rest.read(table, key, f),
        }
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        if table != self.held.table {
            return self.rest.put(table, key, value);
        }
        overwrite_or_put(self, table, key, value)
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        if table != self.held.table {
            return self.rest.remove(table, key);
        }
        with_physical(table, key, |physical| self.held.set(physical, None));
        Ok(())
    }
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> Result<()> {
        if table != self.held.table {
            return self.rest.put_vec(table, key, value);
        }
        with_physical(table, key, |physical| self.held.set(physical, Some(Arc::new(value))));
        Ok(())
    }
    fn update_in_place(
        &mut self,
        table: Table,
        key: &[u8],
        f: &mut dyn FnMut(&mut Vec<u8>) -> Result<bool>,
    ) -> Result<bool> {
        if table != self.held.table {
            return self.rest.update_in_place(table, key, f);
        }
        let held = &mut *self.held;
        with_physical(table, key, |physical| {
            let Some(buffer) = held.writes.rows.get_mut(physical).and_then(|v| v.as_mut()).and_then(Arc::get_mut)
            else {
                return Ok(false);
            };
            let before = buffer.len();
            let changed = f(buffer)?;
            held.bytes = (held.bytes + buffer.len()).saturating_sub(before);
            Ok(changed)
        })
    }
}

/// The keys a fold from sequence 0 wrote into a file that held none of its rows (a full
/// rebuild's new file, a catch-up of every projection), as 64-bit hashes, while there are
/// at most a bound of them: a removal of a key it never wrote has nothing to remove, and
/// most removals a chunk hands over are of rows written and removed within it (a
/// session's former place in the recency order, a settled tool call). Past the bound
/// every removal is made.
pub(crate) struct Written {
    hashes: std::collections::HashSet<u64>,
    hasher: RowHasher,
    /// The most keys remembered.
    max: usize,
    overflowed: bool,
}

/// Keys [`Written`] remembers by default (about 10 bytes each).
pub(crate) const WRITTEN_KEYS_MAX: usize = 1 << 22;

impl Written {
    /// Remembers at most `max` keys.
    pub(crate) fn new(max: usize) -> Written {
        Written { hashes: Default::default(), hasher: Default::default(), max, overflowed: false }
    }

    /// Notes that `key` was written.
    pub(crate) fn insert(&mut self, key: &[u8]) {
        if self.overflowed {
            return;
        }
        if self.hashes.len() == self.max {
            self.overflowed = true;
            self.hashes = Default::default();
            return;
        }
        self.hashes.insert(std::hash::BuildHasher::hash_one(&self.hasher, key));
    }

    /// Whether the file may hold `key` (a hash shared with a key written is a yes).
    pub(crate) fn may_hold(&self, key: &[u8]) -> bool {
        self.overflowed || self.hashes.contains(&std::hash::BuildHasher::hash_one(&self.hasher, key))
    }
}

/// Applies an overlay's writes to `store`, in physical key order.
pub fn apply_writes<S: Store + ?Sized>(store: &mut S, writes: Writes) -> Result<()> {
    for (physical, value) in writes.into_sorted() {
        let Some((table, key)) = crate::tables::logical_key(&physical) else {
            return Err(crate::tables::bad_physical(&physical));
        };
        match value {
            Some(v) => store.put(table, &key, &v)?,
            None => store.remove(table, &key)?,
        }
    }
    Ok(())
}

/// Key encodings. Integers are big-endian so byte order is numeric order; a variable
/// component that is not last carries a u16 big-endian length prefix.
pub mod keys {
    use annal_codec::{RevisionId, SessionId};

    /// `session`
    pub fn session(s: &SessionId) -> Vec<u8> {
        s.0.to_vec()
    }

    /// `session ‖ n`
    pub fn session_u64(s: &SessionId, n: u64) -> Vec<u8> {
        let mut k = Vec::with_capacity(24);
        k.extend_from_slice(&s.0);
        k.extend_from_slice(&n.to_be_bytes());
        k
    }

    /// `session ‖ text`
    pub fn session_str(s: &SessionId, text: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(16 + text.len());
        k.extend_from_slice(&s.0);
        k.extend_from_slice(text.as_bytes());
        k
    }

    /// `session ‖ revision`
    pub fn session_rev(s: &SessionId, r: &RevisionId) -> Vec<u8> {
        let mut k = Vec::with_capacity(48);
        k.extend_from_slice(&s.0);
        k.extend_from_slice(&r.0);
        k
    }

    /// `a ‖ b`
    pub fn session_pair(a: &SessionId, b: &SessionId) -> Vec<u8> {
        let mut k = Vec::with_capacity(32);
        k.extend_from_slice(&a.0);
        k.extend_from_slice(&b.0);
        k
    }

    fn push_str(k: &mut Vec<u8>, s: &str) {
        let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
        k.extend_from_slice(&len.to_be_bytes());
        k.extend_from_slice(&s.as_bytes()[..len as usize]);
    }

    /// `session ‖ len ‖ provider ‖ model`
    pub fn usage(s: &SessionId, provider: &str, model: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(18 + provider.len() + model.len());
        k.extend_from_slice(&s.0);
        push_str(&mut k, provider);
        k.extend_from_slice(model.as_bytes());
        k
    }

    /// `session ‖ len ‖ name`: the prefix of every history row of one host state entry.
    pub fn host_state_name(s: &SessionId, name: &str) -> Vec<u8> {
        // Room for the stream seq of a history row's key too.
        let mut k = Vec::with_capacity(26 + name.len());
        k.extend_from_slice(&s.0);
        push_str(&mut k, name);
        k
    }

    /// `session ‖ len ‖ name ‖ !stream_seq`: newest first, so the first row at or after
    /// `host_state_log(s, name, n)` is the entry as of stream seq `n`.
    pub fn host_state_log(s: &SessionId, name: &str, stream_seq: u64) -> Vec<u8> {
        let mut k = host_state_name(s, name);
        k.extend_from_slice(&(!stream_seq).to_be_bytes());
        k
    }

    /// `!last_seq ‖ session`: ascending key order is most recent first.
    pub fn recency(last_seq: u64, s: &SessionId) -> Vec<u8> {
        let mut k = Vec::with_capacity(24);
        k.extend_from_slice(&(!last_seq).to_be_bytes());
        k.extend_from_slice(&s.0);
        k
    }

    /// `len ‖ key ‖ len ‖ value`: the prefix of every index row for one label.
    pub fn label_prefix(key: &str, value: &str) -> Vec<u8> {
        // Room for an index row's created seq and session too.
        let mut k = Vec::with_capacity(28 + key.len() + value.len());
        push_str(&mut k, key);
        push_str(&mut k, value);
        k
    }

    /// `len ‖ key ‖ len ‖ value ‖ created_seq ‖ session`
    pub fn label_index(key: &str, value: &str, created_seq: u64, s: &SessionId) -> Vec<u8> {
        let mut k = label_prefix(key, value);
        k.extend_from_slice(&created_seq.to_be_bytes());
        k.extend_from_slice(&s.0);
        k
    }

    /// `n`
    pub fn u64(n: u64) -> Vec<u8> {
        n.to_be_bytes().to_vec()
    }
}

/// Where a store of projection rows alone reads records: the batch being decided (its
/// records are not in any view yet), the log file a catch-up or a rebuild folds, or a
/// [`crate::View`] of an engine, for a fold of its log into a store of one's own
/// ([`WithRecords`]): the transcript names its messages by the records that hold their
/// ids, so a rewrite's or a fork's fold reads the lists of records before it.
pub trait Records {
    /// The record at `seq`, if this source holds it.
    fn record(&self, seq: u64) -> Result<Option<annal_codec::Record>>;
    /// The message list of the record at `seq` ([`Store::message_list`]), if this source
    /// holds it.
    fn message_list(&self, seq: u64) -> Result<Option<Arc<[annal_codec::ContentId]>>> {
        Ok(self.record(seq)?.as_ref().map(crate::transcript::list_of))
    }
}

/// How [`WithRecords`] holds its store: to read only (`decide`), or to write too (`evolve`).
pub enum Access<'a, S: ?Sized> {
    /// Reads only; a write is an error.
    Read(&'a S),
    /// Reads and writes.
    Write(&'a mut S),
}

/// A store that reads records from `records` first, then from its store: a fold or a
/// decision over rows that do not see every record the transcript names.
pub struct WithRecords<'a, S: Store + ?Sized> {
    /// The rows.
    pub store: Access<'a, S>,
    /// The records the store does not see.
    pub records: &'a dyn Records,
}

impl<'a, S: Store + ?Sized> WithRecords<'a, S> {
    /// `store`, to read only, with `records`.
    pub fn read(store: &'a S, records: &'a dyn Records) -> Self {
        WithRecords { store: Access::Read(store), records }
    }

    /// `store`, to read and write, with `records`.
    pub fn write(store: &'a mut S, records: &'a dyn Records) -> Self {
        WithRecords { store: Access::Write(store), records }
    }

    fn rows(&self) -> &S {
        match &self.store {
            Access::Read(s) => s,
            Access::Write(s) => s,
        }
    }

    fn rows_mut(&mut self) -> Result<&mut S> {
        match &mut self.store {
            Access::Read(_) => Err(Error::storage("a store to read cannot be written")),
            Access::Write(s) => Ok(s),
        }
    }
}

impl<S: Store + ?Sized> Store for WithRecords<'_, S> {
    delegate_reads!(
        rows():
        keeps_typed, read_typed, deferred_content_seqs, deferred_content_holds, content_key_absent,
        note_content_key, read, content_row_holds, cached_revision, keep_revision,
    );
    fn remove_fresh(&mut self, table: Table, key: &[u8], seq: u64) -> Result<()> {
        self.rows_mut()?.remove_fresh(table, key, seq)
    }
    fn put_typed(&mut self, table: Table, key: &[u8], value: Box<dyn TypedRow>) -> Result<()> {
        self.rows_mut()?.put_typed(table, key, value)
    }
    fn deferred_content(&mut self) -> Option<&mut crate::buckets::DeferredContent> {
        self.rows_mut().ok()?.deferred_content()
    }
    fn held_map(
        &mut self,
        map: &crate::buckets::Buckets,
        prefix: &[u8],
    ) -> Result<Option<&mut crate::buckets::HeldMap>> {
        match &mut self.store {
            Access::Write(s) => s.held_map(map, prefix),
            Access::Read(_) => Ok(None),
        }
    }
    fn held_map_ref(&self, table: Table, prefix: &[u8]) -> Option<&crate::buckets::HeldMap> {
        self.rows().held_map_ref(table, prefix)
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        self.rows_mut()?.put(table, key, value)
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        self.rows_mut()?.remove(table, key)
    }
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.rows_mut()?.put_vec(table, key, value)
    }
    fn update_in_place(
        &mut self,
        table: Table,
        key: &[u8],
        f: &mut dyn FnMut(&mut Vec<u8>) -> Result<bool>,
    ) -> Result<bool> {
        self.rows_mut()?.update_in_place(table, key, f)
    }
    fn record_at(&self, seq: u64) -> Result<Option<annal_codec::Record>> {
        match self.records.record(seq)? {
            Some(record) => Ok(Some(record)),
            None => self.rows().record_at(seq),
        }
    }
    fn message_list(&self, seq: u64) -> Result<Option<Arc<[annal_codec::ContentId]>>> {
        match self.records.message_list(seq)? {
            Some(list) => Ok(Some(list)),
            None => self.rows().message_list(seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_reads_its_own_writes_and_leaves_base_alone() {
        let mut base = MemStore::default();
        base.put(Table::Heads, b"a", b"1").unwrap();
        let mut o = Overlay::new(&base);
        o.put(Table::Heads, b"b", b"2").unwrap();
        o.remove(Table::Heads, b"a").unwrap();
        assert_eq!(o.get(Table::Heads, b"a").unwrap(), None);
        assert_eq!(o.get(Table::Heads, b"b").unwrap(), Some(b"2".to_vec()));
        let writes = o.into_writes();
        assert_eq!(writes.table(Table::Heads).len(), 2);
        assert_eq!(base.get(Table::Heads, b"a").unwrap(), Some(b"1".to_vec()));
    }

    /// One step of a fold through [`Held`], or the end of a chunk.
    #[derive(Debug, Clone)]
    enum Step {
        Put(bool, u8, Vec<u8>),
        PutVec(bool, u8, Vec<u8>),
        Remove(bool, u8),
        /// Appends a byte in place where the store holds the row in a buffer of its own,
        /// else writes the row with it appended.
        Append(bool, u8, u8),
        /// The chunk's rows are written to the base, and the held rows too when they
        /// hold more than this many bytes.
        Flush(usize),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let value = proptest::collection::vec(any::<u8>(), 0..6);
        prop_oneof![
            (any::<bool>(), 0..4u8, value.clone()).prop_map(|(h, k, v)| Step::Put(h, k, v)),
            (any::<bool>(), 0..4u8, value).prop_map(|(h, k, v)| Step::PutVec(h, k, v)),
            (any::<bool>(), 0..4u8).prop_map(|(h, k)| Step::Remove(h, k)),
            (any::<bool>(), 0..4u8, any::<u8>()).prop_map(|(h, k, b)| Step::Append(h, k, b)),
            (0..24usize).prop_map(Step::Flush),
        ]
    }

    fn every_row(store: &dyn Store) -> Vec<Option<Vec<u8>>> {
        [Table::ContentIndex, Table::Heads]
            .into_iter()
            .flat_map(|t| (0..4u8).map(move |k| (t, k)))
            .map(|(t, k)| store.get(t, &[k]).unwrap())
            .collect()
    }

    proptest::proptest! {
        /// A fold through [`Held`] reads and leaves what the same writes made straight
        /// into one store, wherever its chunks end and whenever the held rows go with one.
        #[test]
        fn held_rows_read_and_land_as_if_written_straight(steps in proptest::collection::vec(step(), 0..60)) {
            let mut reference = MemStore::default();
            let mut base = MemStore::default();
            let mut held = HeldRows::new(Table::ContentIndex);
            let mut chunk = Writes::default();
            let table = |h: bool| if h { Table::ContentIndex } else { Table::Heads };
            for s in steps {
                if let Step::Flush(bound) = s {
                    held.hand_over(&base, &mut chunk, false, bound).unwrap();
                    apply_writes(&mut base, std::mem::take(&mut chunk)).unwrap();
                    continue;
                }
                let mut overlay = Overlay { writes: std::mem::take(&mut chunk), ..Overlay::new(&base) };
                let mut folding = Held { held: &mut held, rest: &mut overlay };
                for store in [&mut folding as &mut dyn Store, &mut reference] {
                    match &s {
                        Step::Put(h, k, v) => store.put(table(*h), &[*k], v).unwrap(),
                        Step::PutVec(h, k, v) => store.put_vec(table(*h), &[*k], v.clone()).unwrap(),
                        Step::Remove(h, k) => store.remove(table(*h), &[*k]).unwrap(),
                        Step::Append(h, k, b) => {
                            let appended = store.update_in_place(table(*h), &[*k], &mut |row| {
                                row.push(*b);
                                Ok(true)
                            }).unwrap();
                            if !appended {
                                let mut row = store.get(table(*h), &[*k]).unwrap().unwrap_or_default();
                                row.push(*b);
                                store.put(table(*h), &[*k], &row).unwrap();
                            }
                        }
                        Step::Flush(_) => unreachable!(),
                    }
                }
                proptest::prop_assert_eq!(every_row(&folding), every_row(&reference));
                chunk = overlay.into_writes();
                let counted: usize = held.writes.rows().map(|(k, v)| HeldRows::row_bytes(k, v)).sum();
                proptest::prop_assert_eq!(held.bytes, counted);
            }
            held.hand_over(&base, &mut chunk, true, usize::MAX).unwrap();
            apply_writes(&mut base, chunk).unwrap();
            proptest::prop_assert_eq!(every_row(&base), every_row(&reference));
        }
    }

    /// A step of a fold through a [`TypedOverlay`]: a typed write, a write of bytes, a
    /// removal, a change in place, of one of six keys of one table, and a removal of a
    /// row written by the fold of a record before the overlay's fresh seq (any key) or
    /// from it on (keys 4 and 5, which the base never holds).
    #[derive(Clone, Debug)]
    enum TypedStep {
        PutTyped(u8, u64),
        PutBytes(u8, u64),
        Remove(u8),
        InPlace(u8, u64),
        RemoveFresh(u8, bool),
    }

    /// The seq from which the overlays of the property below hold their own rows.
    const FRESH_FROM: u64 = 100;

    fn typed_step() -> impl proptest::strategy::Strategy<Value = TypedStep> {
        use proptest::prelude::*;
        prop_oneof![
            (0..6u8, any::<u64>()).prop_map(|(k, v)| TypedStep::PutTyped(k, v)),
            (0..6u8, any::<u64>()).prop_map(|(k, v)| TypedStep::PutBytes(k, v)),
            (0..6u8).prop_map(TypedStep::Remove),
            (0..6u8, any::<u64>()).prop_map(|(k, v)| TypedStep::InPlace(k, v)),
            (0..6u8, any::<bool>()).prop_map(|(k, fresh)| TypedStep::RemoveFresh(k, fresh && k >= 4)),
        ]
    }

    /// Runs `step` on `store` as a fold would: a change in place falls back to a write.
    fn run_typed_step<S: Store + ?Sized>(store: &mut S, step: &TypedStep) {
        let key = |k: &u8| [*k];
        match step {
            TypedStep::PutTyped(k, v) => store.put_tip_row(Table::Heads, &key(k), *v).unwrap(),
            TypedStep::PutBytes(k, v) => store.put_row(Table::Heads, &key(k), v).unwrap(),
            TypedStep::Remove(k) => store.remove(Table::Heads, &key(k)).unwrap(),
            TypedStep::RemoveFresh(k, fresh) => {
                let seq = if *fresh { FRESH_FROM } else { FRESH_FROM - 1 };
                store.remove_fresh(Table::Heads, &key(k), seq).unwrap()
            }
            TypedStep::InPlace(k, v) => {
                let bytes = encode_row(v).unwrap();
                let changed = store
                    .update_in_place(Table::Heads, &key(k), &mut |buffer| {
                        buffer.clear();
                        buffer.extend_from_slice(&bytes);
                        Ok(true)
                    })
                    .unwrap();
                if !changed {
                    store.put(Table::Heads, &key(k), &bytes).unwrap();
                }
            }
        }
    }

    #[test]
    fn a_typed_overlay_reads_a_typed_row_as_typed_and_as_bytes() {
        let mut base = MemStore::default();
        base.put_row(Table::Heads, b"a", &1u64).unwrap();
        let mut o = TypedOverlay::with_capacity(&base, 4);
        assert!(o.keeps_typed());
        assert_eq!(o.tip_row::<u64>(Table::Heads, b"a").unwrap(), Some(1));
        o.put_tip_row(Table::Heads, b"a", 7u64).unwrap();
        assert!(o.read_typed(Table::Heads, b"a", &mut |_| {}).unwrap());
        assert_eq!(o.tip_row::<u64>(Table::Heads, b"a").unwrap(), Some(7));
        assert_eq!(o.get(Table::Heads, b"a").unwrap(), Some(encode_row(&7u64).unwrap()));
        // Typed as another type: its bytes decide.
        assert_eq!(o.tip_row::<u32>(Table::Heads, b"a").unwrap(), Some(7));
        // Its bytes are not held, so nothing changes them in place.
        assert!(!o.update_in_place(Table::Heads, b"a", &mut |_| Ok(true)).unwrap());
        // A write of bytes replaces the typed value.
        o.put_row(Table::Heads, b"a", &9u64).unwrap();
        assert!(!o.read_typed(Table::Heads, b"a", &mut |_| {}).unwrap());
        assert_eq!(o.tip_row::<u64>(Table::Heads, b"a").unwrap(), Some(9));
        o.put_tip_row(Table::Heads, b"b", 3u64).unwrap();
        let writes = o.finish().unwrap();
        assert_eq!(writes.table(Table::Heads).get(b"b".as_slice()), Some(&Some(encode_row(&3u64).unwrap())));
        assert_eq!(base.tip_row::<u64>(Table::Heads, b"b").unwrap(), None, "the base is left alone");
        // A row of the fold's own from its fresh seq on goes without a trace; one from
        // before leaves a removal.
        let mut o = TypedOverlay::with_capacity(&base, 4);
        o.fresh_from(10);
        o.put_row(Table::Heads, b"c", &1u64).unwrap();
        o.put_row(Table::Heads, b"d", &1u64).unwrap();
        o.remove_fresh(Table::Heads, b"c", 10).unwrap();
        o.remove_fresh(Table::Heads, b"d", 9).unwrap();
        o.remove_fresh(Table::Heads, b"a", 9).unwrap();
        assert_eq!(o.get(Table::Heads, b"c").unwrap(), None);
        assert_eq!(o.get(Table::Heads, b"a").unwrap(), None);
        let removed = o.finish().unwrap().table(Table::Heads);
        assert_eq!(removed.keys().map(Vec::as_slice).collect::<Vec<_>>(), [b"a".as_slice(), b"d"]);
        assert!(removed.values().all(Option::is_none));
        // A store that keeps nothing typed writes the row's bytes at once.
        let mut plain = MemStore::default();
        assert!(!plain.keeps_typed());
        plain.put_tip_row(Table::Heads, b"a", 5u64).unwrap();
        assert_eq!(plain.get(Table::Heads, b"a").unwrap(), Some(encode_row(&5u64).unwrap()));
    }

    proptest::proptest! {
        /// A fold through a [`TypedOverlay`] reads what a fold through an [`Overlay`]
        /// reads at every step, and hands over the same writes.
        #[test]
        fn a_typed_overlay_reads_and_writes_what_an_overlay_does(
            before in proptest::collection::vec((0..4u8, proptest::prelude::any::<u64>()), 0..4),
            steps in proptest::collection::vec(typed_step(), 0..40),
        ) {
            let mut base = MemStore::default();
            for (k, v) in &before {
                base.put_row(Table::Heads, &[*k], v).unwrap();
            }
            let mut typed = TypedOverlay::with_capacity(&base, 0);
            typed.fresh_from(FRESH_FROM);
            let mut plain = Overlay::new(&base);
            for step in &steps {
                run_typed_step(&mut typed, step);
                run_typed_step(&mut plain, step);
                for k in 0..6u8 {
                    proptest::prop_assert_eq!(typed.get(Table::Heads, &[k]).unwrap(), plain.get(Table::Heads, &[k]).unwrap());
                    proptest::prop_assert_eq!(
                        typed.tip_row::<u64>(Table::Heads, &[k]).unwrap(),
                        plain.tip_row::<u64>(Table::Heads, &[k]).unwrap()
                    );
                }
            }
            let (typed, plain) = (typed.finish().unwrap(), plain.into_writes());
            // The typed overlay keeps no removal of a row of its own.
            let removals = |w: &Writes| w.table(Table::Heads).values().filter(|v| v.is_none()).count();
            proptest::prop_assert!(removals(&typed) <= removals(&plain));
            let (mut from_typed, mut from_plain) = (MemStore::default(), MemStore::default());
            for store in [&mut from_typed, &mut from_plain] {
                for (k, v) in &before {
                    store.put_row(Table::Heads, &[*k], v).unwrap();
                }
            }
            apply_writes(&mut from_typed, typed).unwrap();
            apply_writes(&mut from_plain, plain).unwrap();
            for k in 0..6u8 {
                proptest::prop_assert_eq!(from_typed.get(Table::Heads, &[k]).unwrap(), from_plain.get(Table::Heads, &[k]).unwrap());
            }
        }
    }

    #[test]
    fn table_names_are_unique() {
        let mut names: Vec<_> = Table::ALL.iter().map(|t| t.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Table::ALL.len());
    }
}
