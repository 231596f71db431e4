//! Streamed partial drafts: what a model has produced of an answer so far, kept beside
//! the log and outside its chain.
//!
//! A draft is a list of segments under `(session, draft id)`. The writer holds every
//! draft in memory ([`DraftState`], bounded by the draft limits), which is what readers
//! see at once, and writes new segments to the log file's [`DRAFTS`] and
//! [`DRAFT_INDEX`] tables with the next commit (in its journal frame, which the
//! absorber writes into those tables with its records), or on their own once
//! `Options::draft_flush_interval` has passed since the first unwritten one: a crash
//! loses at most that interval of segments. The turn commit that names a draft removes
//! it in the frame that appends the turn; a discard is written at once. Drafts are
//! never exported, copied or folded into projections.

use crate::error::Result;
use annal_codec::SessionId;
use redb::{ReadableTable, TableDefinition, WriteTransaction};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// Draft segments (log file): `session ‖ u16 BE id length ‖ id ‖ u32 BE index` → bytes.
pub const DRAFTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("drafts");
/// Draft summaries (log file): `session ‖ u16 BE id length ‖ id` → created at (u64 LE),
/// updated at (u64 LE), segments (u32 LE), bytes (u64 LE): 28 bytes.
pub const DRAFT_INDEX: TableDefinition<&[u8], &[u8]> = TableDefinition::new("draft_index");

/// Bytes of a [`DRAFT_INDEX`] value.
pub const DRAFT_INDEX_VALUE_LEN: usize = 28;

/// A draft's identity.
pub type DraftKey = (SessionId, String);

/// The [`DRAFT_INDEX`] key of a draft (the prefix of its segment keys).
pub fn draft_key(session: &SessionId, draft_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(18 + draft_id.len());
    k.extend_from_slice(&session.0);
    k.extend_from_slice(&(draft_id.len() as u16).to_be_bytes());
    k.extend_from_slice(draft_id.as_bytes());
    k
}

/// The [`DRAFTS`] key of segment `index` of a draft.
pub fn segment_key(session: &SessionId, draft_id: &str, index: u32) -> Vec<u8> {
    let mut k = draft_key(session, draft_id);
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// Splits a [`DRAFT_INDEX`] key, if it is well formed.
pub fn parse_draft_key(key: &[u8]) -> Option<DraftKey> {
    let session = SessionId(key.get(..16)?.try_into().ok()?);
    let len = u16::from_be_bytes(key.get(16..18)?.try_into().ok()?) as usize;
    let id = std::str::from_utf8(key.get(18..18 + len)?).ok()?;
    (key.len() == 18 + len && !id.is_empty()).then(|| (session, id.to_string()))
}

/// Splits a [`DRAFTS`] key into the draft and the segment index, if it is well formed.
pub fn parse_segment_key(key: &[u8]) -> Option<(DraftKey, u32)> {
    let split = key.len().checked_sub(4)?;
    let draft = parse_draft_key(&key[..split])?;
    Some((draft, u32::from_be_bytes(key[split..].try_into().ok()?)))
}

/// A [`DRAFT_INDEX`] value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexValue {
    /// When the first segment was appended (writer clock, unix ms).
    pub created_at_ms: u64,
    /// When the last segment was appended.
    pub updated_at_ms: u64,
    /// Segments.
    pub segments: u32,
    /// Bytes of all segments.
    pub bytes: u64,
}

impl IndexValue {
    /// The 28 stored bytes.
    pub fn encode(&self) -> [u8; DRAFT_INDEX_VALUE_LEN] {
        let mut v = [0u8; DRAFT_INDEX_VALUE_LEN];
        v[..8].copy_from_slice(&self.created_at_ms.to_le_bytes());
        v[8..16].copy_from_slice(&self.updated_at_ms.to_le_bytes());
        v[16..20].copy_from_slice(&self.segments.to_le_bytes());
        v[20..].copy_from_slice(&self.bytes.to_le_bytes());
        v
    }

    /// Decodes stored bytes, if they have the right length.
    pub fn decode(v: &[u8]) -> Option<IndexValue> {
        if v.len() != DRAFT_INDEX_VALUE_LEN {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(v[i..i + 8].try_into().expect("eight bytes"));
        Some(IndexValue {
            created_at_ms: u64_at(0),
            updated_at_ms: u64_at(8),
            segments: u32::from_le_bytes(v[16..20].try_into().expect("four bytes")),
            bytes: u64_at(20),
        })
    }
}

/// A draft as a reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft {
    /// The session.
    pub session: SessionId,
    /// The host's draft id.
    pub draft_id: String,
    /// Index of the first segment in `segments`.
    pub first_segment: u32,
    /// Segments, in order, as far as the byte budget allowed.
    pub segments: Vec<Vec<u8>>,
    /// Segments the draft holds.
    pub total_segments: u32,
    /// Bytes the draft holds.
    pub total_bytes: u64,
    /// When its first segment was appended (writer clock, unix ms).
    pub created_at_ms: u64,
    /// When its last segment was appended.
    pub updated_at_ms: u64,
}

impl Draft {
    /// Whether `segments` holds every segment from `first_segment` to the end.
    pub fn is_complete(&self) -> bool {
        self.first_segment as usize + self.segments.len() == self.total_segments as usize
    }
}

/// A draft's summary, without its bytes: what [`crate::Engine::abandoned_drafts`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftSummary {
    /// The session.
    pub session: SessionId,
    /// The host's draft id.
    pub draft_id: String,
    /// Segments.
    pub segments: u32,
    /// Bytes.
    pub bytes: u64,
    /// When its first segment was appended (writer clock, unix ms).
    pub created_at_ms: u64,
    /// When its last segment was appended.
    pub updated_at_ms: u64,
}

/// One draft in memory.
#[derive(Clone, Debug, Default)]
pub(crate) struct DraftMem {
    segments: Vec<Vec<u8>>,
    bytes: u64,
    /// Segments already in the file.
    written: u32,
    created_at_ms: u64,
    updated_at_ms: u64,
}

/// A change `decide` asks for: it writes nothing to the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftChange {
    /// Append `segment` to the draft (as segment `index`).
    Append {
        /// The draft.
        key: DraftKey,
        /// Its index.
        index: u32,
        /// The bytes.
        segment: Vec<u8>,
    },
    /// Remove the draft.
    Discard {
        /// The draft.
        key: DraftKey,
    },
}

/// Every draft, held by the writer; readers look.
#[derive(Debug, Default)]
pub struct DraftState {
    drafts: BTreeMap<DraftKey, DraftMem>,
    session_bytes: HashMap<SessionId, u64>,
    total_bytes: u64,
    /// Drafts whose rows in the file must go (before any row of theirs is written
    /// again).
    deleted: BTreeSet<DraftKey>,
    /// Drafts with segments not in the file yet.
    dirty: BTreeSet<DraftKey>,
    /// When the oldest unwritten change was made.
    dirty_since: Option<Instant>,
    /// A change that must be written with the next transaction, whatever the interval.
    urgent: bool,
}

/// What one transaction writes of the drafts.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct DraftWrites {
    #[serde(deserialize_with = "annal_codec::wire::seq::deserialize")]
    deletes: Vec<DraftKey>,
    /// (key, first index, segments from it, index value).
    #[serde(deserialize_with = "annal_codec::wire::seq::deserialize")]
    inserts: Vec<(DraftKey, u32, Vec<Vec<u8>>, IndexValue)>,
}

impl DraftWrites {
    /// Whether it writes nothing.
    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.inserts.is_empty()
    }

    /// The bytes a journal frame carries (empty for no changes).
    pub fn encode(&self) -> Result<Vec<u8>> {
        match self.is_empty() {
            true => Ok(Vec::new()),
            false => annal_codec::wire::to_bytes(self, u64::MAX)
                .map_err(|e| crate::error::Error::storage(format!("encode draft changes: {e}"))),
        }
    }

    /// Decodes [`DraftWrites::encode`], reading at most `limit` bytes.
    pub fn decode(bytes: &[u8], limit: u64) -> Result<DraftWrites> {
        if bytes.is_empty() {
            return Ok(DraftWrites::default());
        }
        annal_codec::wire::from_bytes(bytes, limit)
            .map_err(|e| crate::error::Error::corrupt(crate::error::Location::File, format!("journal drafts: {e}")))
    }
}

impl DraftState {
    /// Loads every draft from the log file (at open). Drafts are outside the chain and
    /// never block an open: a summary that does not parse is skipped, and a draft whose
    /// segments do not match its summary keeps the segments that are there in order,
    /// and is written anew with the next transaction (`annal verify` reports such
    /// damage before an open repairs it).
    pub(crate) fn load(txn: &redb::ReadTransaction) -> Result<DraftState> {
        let mut state = DraftState::default();
        let index = match txn.open_table(DRAFT_INDEX) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(state),
            Err(e) => return Err(e.into()),
        };
        let segments = txn.open_table(DRAFTS)?;
        for row in index.iter()? {
            let (k, v) = row?;
            let (Some(key), Some(value)) = (parse_draft_key(k.value()), IndexValue::decode(v.value())) else {
                continue;
            };
            let mut mem = DraftMem {
                created_at_ms: value.created_at_ms,
                updated_at_ms: value.updated_at_ms,
                ..DraftMem::default()
            };
            for i in 0..value.segments {
                match segments.get(segment_key(&key.0, &key.1, i).as_slice())? {
                    Some(segment) => {
                        mem.bytes += segment.value().len() as u64;
                        mem.segments.push(segment.value().to_vec());
                    }
                    None => break,
                }
            }
            mem.written = mem.segments.len() as u32;
            if mem.written != value.segments || mem.bytes != value.bytes || mem.segments.is_empty() {
                // Rewritten with the next transaction: its rows go, what was read comes back.
                mem.written = 0;
                state.deleted.insert(key.clone());
                state.urgent = true;
                state.dirty_since = Some(Instant::now());
                if mem.segments.is_empty() {
                    continue;
                }
                state.dirty.insert(key.clone());
            }
            *state.session_bytes.entry(key.0).or_default() += mem.bytes;
            state.total_bytes += mem.bytes;
            state.drafts.insert(key, mem);
        }
        Ok(state)
    }

    /// Segments and bytes of a draft, if it exists.
    pub fn draft(&self, session: &SessionId, draft_id: &str) -> Option<(u32, u64)> {
        self.drafts.get(&(*session, draft_id.to_string())).map(|d| (d.segments.len() as u32, d.bytes))
    }

    /// Bytes of the drafts of `session`.
    pub fn session_bytes(&self, session: &SessionId) -> u64 {
        self.session_bytes.get(session).copied().unwrap_or(0)
    }

    /// Bytes of every draft.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Summaries of every draft, in key order.
    pub fn summaries(&self) -> Vec<DraftSummary> {
        self.drafts.iter().map(|(k, d)| summary(k, d)).collect()
    }

    /// The drafts of `session` with their segments, in draft id order, as far as
    /// `max_bytes` of segments allows (a draft cut short says so: see
    /// [`Draft::is_complete`]).
    pub fn read(&self, session: &SessionId, max_bytes: u64) -> Vec<Draft> {
        let mut budget = max_bytes;
        let from = (*session, String::new());
        let mut out = Vec::new();
        for (k, d) in self.drafts.range(from..).take_while(|(k, _)| k.0 == *session) {
            out.push(take(k, d, 0, &mut budget));
        }
        out
    }

    /// One draft, from segment `from`, as far as `max_bytes` allows.
    pub fn read_one(&self, session: &SessionId, draft_id: &str, from: u32, max_bytes: u64) -> Option<Draft> {
        let key = (*session, draft_id.to_string());
        let mut budget = max_bytes;
        self.drafts.get(&key).map(|d| take(&key, d, from, &mut budget))
    }

    /// Applies an accepted change (at once: readers see it).
    pub(crate) fn apply(&mut self, change: DraftChange, now_ms: u64) {
        match change {
            DraftChange::Append { key, index, segment } => {
                let d = self
                    .drafts
                    .entry(key.clone())
                    .or_insert_with(|| DraftMem { created_at_ms: now_ms, ..DraftMem::default() });
                debug_assert_eq!(index as usize, d.segments.len());
                let n = segment.len() as u64;
                d.bytes += n;
                d.updated_at_ms = now_ms;
                d.segments.push(segment);
                *self.session_bytes.entry(key.0).or_default() += n;
                self.total_bytes += n;
                self.dirty.insert(key);
                self.dirty_since.get_or_insert_with(Instant::now);
            }
            DraftChange::Discard { key } => self.remove(&key),
        }
    }

    /// Removes a draft from memory and marks its rows for deletion with the next
    /// transaction, whatever the flush interval (a discard, or the turn that finalizes
    /// it, is written at once).
    pub(crate) fn remove(&mut self, key: &DraftKey) {
        if let Some(d) = self.drafts.remove(key) {
            let left = self.session_bytes.entry(key.0).or_default();
            *left -= d.bytes;
            if *left == 0 {
                self.session_bytes.remove(&key.0);
            }
            self.total_bytes -= d.bytes;
            self.dirty.remove(key);
            if d.written > 0 {
                self.deleted.insert(key.clone());
                self.urgent = true;
            }
            self.dirty_since.get_or_insert_with(Instant::now);
        }
    }

    /// When the oldest unwritten change was made, and whether one must be written now.
    pub(crate) fn pending(&self) -> (Option<Instant>, bool) {
        (self.dirty_since.filter(|_| !self.dirty.is_empty() || !self.deleted.is_empty()), self.urgent)
    }

    /// What a transaction must write so that the file holds every draft as memory does.
    pub(crate) fn writes(&self) -> DraftWrites {
        let mut w = DraftWrites::default();
        w.deletes.extend(self.deleted.iter().cloned());
        for key in &self.dirty {
            let d = &self.drafts[key];
            let value = IndexValue {
                created_at_ms: d.created_at_ms,
                updated_at_ms: d.updated_at_ms,
                segments: d.segments.len() as u32,
                bytes: d.bytes,
            };
            w.inserts.push((key.clone(), d.written, d.segments[d.written as usize..].to_vec(), value));
        }
        w
    }

    /// After `writes` committed: what they wrote is in the file.
    pub(crate) fn written(&mut self, writes: &DraftWrites) {
        for key in &writes.deletes {
            self.deleted.remove(key);
        }
        for (key, first, segments, _) in &writes.inserts {
            if let Some(d) = self.drafts.get_mut(key) {
                d.written = d.written.max(first + segments.len() as u32);
                if d.written as usize == d.segments.len() {
                    self.dirty.remove(key);
                }
            }
        }
        self.urgent = false;
        if self.dirty.is_empty() && self.deleted.is_empty() {
            self.dirty_since = None;
        }
    }
}

fn summary(k: &DraftKey, d: &DraftMem) -> DraftSummary {
    DraftSummary {
        session: k.0,
        draft_id: k.1.clone(),
        segments: d.segments.len() as u32,
        bytes: d.bytes,
        created_at_ms: d.created_at_ms,
        updated_at_ms: d.updated_at_ms,
    }
}

fn take(k: &DraftKey, d: &DraftMem, from: u32, budget: &mut u64) -> Draft {
    let mut segments = Vec::new();
    for s in d.segments.iter().skip(from as usize) {
        if s.len() as u64 > *budget {
            *budget = 0;
            break;
        }
        *budget -= s.len() as u64;
        segments.push(s.clone());
    }
    Draft {
        session: k.0,
        draft_id: k.1.clone(),
        first_segment: from.min(d.segments.len() as u32),
        segments,
        total_segments: d.segments.len() as u32,
        total_bytes: d.bytes,
        created_at_ms: d.created_at_ms,
        updated_at_ms: d.updated_at_ms,
    }
}

/// Writes `w` in `txn`: deletions first, then new segments and summaries.
pub(crate) fn write(txn: &WriteTransaction, w: &DraftWrites) -> Result<()> {
    if w.is_empty() {
        return Ok(());
    }
    let mut segments = txn.open_table(DRAFTS)?;
    let mut index = txn.open_table(DRAFT_INDEX)?;
    for (session, id) in &w.deletes {
        let prefix = draft_key(session, id);
        let end = segment_key(session, id, u32::MAX);
        segments.retain_in(prefix.as_slice()..=end.as_slice(), |_, _| false)?;
        index.remove(prefix.as_slice())?;
    }
    for ((session, id), first, new, value) in &w.inserts {
        for (i, s) in new.iter().enumerate() {
            segments.insert(segment_key(session, id, first + i as u32).as_slice(), s.as_slice())?;
        }
        index.insert(draft_key(session, id).as_slice(), value.encode().as_slice())?;
    }
    Ok(())
}

/// Removes every draft of `session` from the drafts tables in `txn` (a purge). Returns
/// how many drafts there were.
pub(crate) fn remove_session(txn: &WriteTransaction, session: &SessionId) -> Result<u64> {
    let mut segments = txn.open_table(DRAFTS)?;
    let mut index = txn.open_table(DRAFT_INDEX)?;
    let (start, end) = (session.0.to_vec(), [session.0.as_slice(), &[0xff; 3]].concat());
    let mut drafts = 0u64;
    index.retain_in(start.as_slice()..end.as_slice(), |_, _| {
        drafts += 1;
        false
    })?;
    segments.retain_in(start.as_slice()..end.as_slice(), |_, _| false)?;
    Ok(drafts)
}

/// Reads the drafts tables of a log file and checks their structure: keys and summaries
/// parse, every summary's segments are there and add up to its bytes, and no segment
/// lies outside a summary. Returns the drafts' summaries, or what is wrong.
pub fn check_structure(txn: &redb::ReadTransaction) -> std::result::Result<Vec<DraftSummary>, String> {
    let index = match txn.open_table(DRAFT_INDEX) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.to_string()),
    };
    let segments = txn.open_table(DRAFTS).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut expected: BTreeMap<DraftKey, (u32, u64)> = BTreeMap::new();
    for row in index.iter().map_err(|e| e.to_string())? {
        let (k, v) = row.map_err(|e| e.to_string())?;
        let key = parse_draft_key(k.value()).ok_or("a draft summary has a malformed key")?;
        let value =
            IndexValue::decode(v.value()).ok_or(format!("draft {:?} of {}: malformed summary", key.1, key.0))?;
        expected.insert(key.clone(), (value.segments, value.bytes));
        out.push(DraftSummary {
            session: key.0,
            draft_id: key.1,
            segments: value.segments,
            bytes: value.bytes,
            created_at_ms: value.created_at_ms,
            updated_at_ms: value.updated_at_ms,
        });
    }
    let mut seen: BTreeMap<DraftKey, (u32, u64)> = BTreeMap::new();
    for row in segments.iter().map_err(|e| e.to_string())? {
        let (k, v) = row.map_err(|e| e.to_string())?;
        let (key, index) = parse_segment_key(k.value()).ok_or("a draft segment has a malformed key")?;
        let Some((count, _)) = expected.get(&key) else {
            return Err(format!("draft {:?} of {}: a segment without a summary", key.1, key.0));
        };
        let entry = seen.entry(key.clone()).or_default();
        if index != entry.0 || index >= *count {
            return Err(format!("draft {:?} of {}: segment {index} out of order", key.1, key.0));
        }
        entry.0 += 1;
        entry.1 += v.value().len() as u64;
    }
    for (key, want) in &expected {
        let got = seen.get(key).copied().unwrap_or_default();
        if got != *want {
            return Err(format!("draft {:?} of {}: {got:?} segments and bytes, summary says {want:?}", key.1, key.0));
        }
    }
    Ok(out)
}
