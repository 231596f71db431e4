//! The abstract store that `decide` reads and `evolve` writes: point reads and writes
//! over named projection tables. The live writer and the offline rebuild run the fold on
//! a redb transaction ([`crate::tables::RedbStore`]); unit tests run it on [`MemStore`];
//! the writer stages each command in an [`Overlay`] so that a rejection writes nothing.

use crate::error::{Error, Location, Result};
use annal_codec::{wire, SessionId};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;

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
}

impl<S: Store + ?Sized> StoreExt for S {}

/// The size limit for projection rows; rows are small, this only bounds decoding.
pub(crate) const ROW_BYTES_MAX: u64 = 256 << 20;

/// Encodes a projection row with the canonical wire options.
pub fn encode_row<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    wire::to_bytes(value, ROW_BYTES_MAX).map_err(|e| Error::Storage(format!("encode row: {e}")))
}

/// Decodes a projection row; failure is corruption at that row.
pub fn decode_row<T: DeserializeOwned>(table: Table, key: &[u8], bytes: &[u8]) -> Result<T> {
    wire::from_bytes(bytes, ROW_BYTES_MAX)
        .map_err(|e| Error::corrupt(Location::Projection { table: table.name(), key: hex(key) }, e.to_string()))
}

pub(crate) use annal_codec::hex;

/// An in-memory store: a map per table. Used by unit tests and by `verify --deep`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemStore {
    /// The rows, per table, in key order.
    pub tables: BTreeMap<Table, BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl Store for MemStore {
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        f(self.tables.get(&table).and_then(|t| t.get(key)).map(Vec::as_slice))
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        // One search per put: the key is copied whether or not the row exists (most puts
        // of a fold add rows), and a rewritten row (a tip, a head) reuses its buffer.
        match self.tables.entry(table).or_default().entry(key.to_vec()) {
            std::collections::btree_map::Entry::Occupied(mut row) => {
                let row = row.get_mut();
                row.clear();
                row.extend_from_slice(value);
            }
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(value.to_vec());
            }
        }
        Ok(())
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        if let Some(t) = self.tables.get_mut(&table) {
            t.remove(key);
            if t.is_empty() {
                self.tables.remove(&table);
            }
        }
        Ok(())
    }
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.tables.entry(table).or_default().insert(key.to_vec(), value);
        Ok(())
    }
}

/// Buffers writes on top of a base store. Reads see the buffer first. [`Overlay::into_writes`]
/// hands the writes over to be applied; dropping the overlay discards them.
pub struct Overlay<'a, S: Store + ?Sized> {
    base: &'a S,
    writes: Writes,
    streams: BTreeMap<SessionId, u64>,
}

impl<'a, S: Store + ?Sized> Overlay<'a, S> {
    /// An empty overlay over `base`.
    pub fn new(base: &'a S) -> Self {
        Overlay { base, writes: BTreeMap::new(), streams: BTreeMap::new() }
    }

    /// The buffered writes, in (table, key) order; `None` is a removal.
    pub fn into_writes(self) -> Writes {
        self.writes
    }

    /// Takes `writes` (another overlay's, staged on top of this one) as its own, moving
    /// their rows rather than copying them.
    pub fn absorb(&mut self, writes: Writes) {
        for (table, rows) in writes {
            let mine = self.writes.entry(table).or_default();
            if mine.is_empty() {
                *mine = rows;
            } else {
                mine.extend(rows);
            }
        }
    }

    /// The stream tip this overlay has assigned for `session`, if any.
    pub fn stream_tip(&self, session: &SessionId) -> Option<u64> {
        self.streams.get(session).copied()
    }

    /// Records that `session`'s stream reached `seq` in this overlay.
    pub fn set_stream_tip(&mut self, session: SessionId, seq: u64) {
        self.streams.insert(session, seq);
    }
}

impl<S: Store + ?Sized> Store for Overlay<'_, S> {
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        match self.writes.get(&table).and_then(|rows| rows.get(key)) {
            Some(v) => f(v.as_deref()),
            None => self.base.read(table, key, f),
        }
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        // One search per put; a rewritten buffered row (a tip, a head) reuses its buffer.
        match self.writes.entry(table).or_default().entry(key.to_vec()) {
            std::collections::btree_map::Entry::Occupied(mut slot) => match slot.get_mut() {
                Some(row) => {
                    row.clear();
                    row.extend_from_slice(value);
                }
                removed => *removed = Some(value.to_vec()),
            },
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(Some(value.to_vec()));
            }
        }
        Ok(())
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
        self.writes.entry(table).or_default().insert(key.to_vec(), None);
        Ok(())
    }
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.writes.entry(table).or_default().insert(key.to_vec(), Some(value));
        Ok(())
    }
}

/// Writes buffered by an [`Overlay`], per table in key order; `None` is a removal.
pub type Writes = BTreeMap<Table, BTreeMap<Vec<u8>, Option<Vec<u8>>>>;

/// Applies an overlay's writes to `store`, in key order.
pub fn apply_writes<S: Store + ?Sized>(store: &mut S, writes: Writes) -> Result<()> {
    for (table, rows) in writes {
        for (key, value) in rows {
            match value {
                Some(v) => store.put(table, &key, &v)?,
                None => store.remove(table, &key)?,
            }
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
        let mut k = s.0.to_vec();
        push_str(&mut k, provider);
        k.extend_from_slice(model.as_bytes());
        k
    }

    /// `session ‖ len ‖ name`: the prefix of every history row of one host state entry.
    pub fn host_state_name(s: &SessionId, name: &str) -> Vec<u8> {
        let mut k = s.0.to_vec();
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
        let mut k = (!last_seq).to_be_bytes().to_vec();
        k.extend_from_slice(&s.0);
        k
    }

    /// `len ‖ key ‖ len ‖ value`: the prefix of every index row for one label.
    pub fn label_prefix(key: &str, value: &str) -> Vec<u8> {
        let mut k = Vec::new();
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
        assert_eq!(writes[&Table::Heads].len(), 2);
        assert_eq!(base.get(Table::Heads, b"a").unwrap(), Some(b"1".to_vec()));
    }

    #[test]
    fn table_names_are_unique() {
        let mut names: Vec<_> = Table::ALL.iter().map(|t| t.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Table::ALL.len());
    }
}
