//! Hashed buckets: a map of many small entries kept in few projection rows.
//!
//! The content-id index (one entry a key of a content id's first 8 bytes), the turn records (one entry a
//! committed turn) and the revision nodes (one entry a revision) are lookups by a key
//! that has no useful order. A row an entry made them most of the projections' rows. A [`Buckets`] map packs its entries into buckets by a
//! 64-bit hash of the key, with linear hashing: a map whose entries take `size` bytes has
//! `n = max(1, ⌈size / bytes⌉)` buckets, and an entry whose hash is `h` lives in bucket
//! `h mod 2^(i+1)` if that is below `n`, else `h mod 2^i`, where `2^i ≤ n < 2^(i+1)`. An
//! insert that makes `n` grow splits bucket `n - 2^i` into itself and bucket `n`; a removal
//! that makes it shrink merges the last bucket back into the one it was split from.
//!
//! So which entries a bucket holds is a function of the map's entries alone, not of the
//! order they came in or went out: a live map and one folded again from the log are the
//! same rows, byte for byte.
//!
//! Rows (in the map's table, under the map's prefix: a session id, or nothing for a global
//! map):
//!
//! ```text
//! prefix                              size: u64 LE (absent when the map is empty)
//! prefix ‖ bucket (u64 BE) ‖ part (u16 BE)
//!                                     more: u8 (1 when part + 1 follows, else 0)
//!                                     entries: (key length: varint, value length:
//!                                               varint, key, value)*
//! ```
//!
//! A bucket's entries are sorted by key and split greedily into parts of at most
//! [`PART_BYTES`] (an entry larger than that has a part of its own); an empty bucket has no
//! row. A bucket holds `bytes` of entries on average, a third of a part, so a part is one
//! row in the common case;
//! the parts bound a row's size when a bucket holds more than its share.

use crate::error::{Error, Location, Result};
use crate::store::{Store, Table};
use annal_codec::{ContentId, SessionId};

/// Most bytes of entries in one part of a bucket (an entry larger than that is a part of
/// its own).
pub const PART_BYTES: usize = 3_072;

/// Bytes of a varint (LEB128) holding `n`.
fn varint_len(n: usize) -> usize {
    (usize::BITS - (n | 1).leading_zeros()).div_ceil(7) as usize
}

pub(crate) fn put_varint(out: &mut Vec<u8>, n: usize) {
    let mut bytes = [0u8; 10];
    let len = varint_into(&mut bytes, n);
    out.extend_from_slice(&bytes[..len]);
}

/// Writes `n` as a varint (LEB128) at the start of `out`, which holds at least 10 bytes;
/// returns its length.
fn varint_into(out: &mut [u8], mut n: usize) -> usize {
    let mut i = 0;
    while n >= 0x80 {
        out[i] = n as u8 | 0x80;
        n >>= 7;
        i += 1;
    }
    out[i] = n as u8;
    i + 1
}

/// Reads a varint of at most `usize` bits, in its shortest form, advancing `rest`.
pub(crate) fn read_varint(rest: &mut &[u8]) -> Option<usize> {
    let mut n = 0usize;
    for (i, &b) in rest.iter().enumerate().take(10) {
        let bits = ((b & 0x7f) as usize).checked_shl(7 * i as u32)?;
        if bits >> (7 * i) != (b & 0x7f) as usize {
            return None;
        }
        n |= bits;
        if b & 0x80 == 0 {
            if b == 0 && i > 0 {
                return None;
            }
            *rest = &rest[i + 1..];
            return Some(n);
        }
    }
    None
}

/// Bytes an entry takes: its lengths as varints, its key and its value.
fn entry_size(key: &[u8], value: &[u8]) -> usize {
    entry_len(key.len(), value.len())
}

/// Bytes of an entry whose key and value take `key` and `value` bytes.
fn entry_len(key: usize, value: usize) -> usize {
    varint_len(key) + varint_len(value) + key + value
}

/// Replaces the bytes `range` of `row` with `parts`, one after another: the bytes after
/// the range move once, and each part is one copy (`Vec::splice` fed the same bytes as
/// one chained iterator moved them a byte at a time).
fn replace_range<const N: usize>(row: &mut Vec<u8>, range: std::ops::Range<usize>, parts: [&[u8]; N]) {
    let new_len: usize = parts.iter().map(|p| p.len()).sum();
    let (start, end) = (range.start, range.end);
    let tail = row.len() - end;
    if new_len > end - start {
        row.resize(row.len() + new_len - (end - start), 0);
    }
    row.copy_within(end..end + tail, start + new_len);
    row.truncate(start + new_len + tail);
    let mut at = start;
    for part in parts {
        row[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
}

/// Appends an entry.
fn put_entry(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    put_varint(out, key.len());
    put_varint(out, value.len());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// The byte order of two keys, with their first 8 bytes compared as one integer: the
/// engine's keys are 32-byte hashes and turn ids, which nearly always differ there, and
/// a bucket's scan compares the key sought with each entry's.
fn key_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    if let (Some(x), Some(y)) = (a.first_chunk::<8>(), b.first_chunk::<8>()) {
        let order = u64::from_be_bytes(*x).cmp(&u64::from_be_bytes(*y));
        if order.is_ne() {
            return order;
        }
    }
    a.cmp(b)
}

/// Longest key a map takes.
const KEY_BYTES_MAX: usize = u16::MAX as usize;

/// One hashed map: its table, the hash of its keys and the bytes of entries a bucket
/// holds on average.
#[derive(Clone, Copy, Debug)]
pub struct Buckets {
    /// The logical table holding the map's rows.
    pub table: Table,
    /// The hash of a key: 64 bits that an outside party cannot make collide cheaply.
    pub hash: fn(&[u8]) -> u64,
    /// Bytes of entries a bucket holds on average: a map of `size` bytes has
    /// `max(1, ⌈size / bytes⌉)` buckets.
    pub bytes: u64,
}

/// Bytes of entries a bucket of the engine's maps holds on average: about 24 content
/// index entries, 12 turn records or 4 revision nodes of the comparison's workload, and
/// a third of a part, so that a bucket seldom needs a second one.
pub const BUCKET_BYTES: u64 = 1_024;

/// The content-id index: the first [`CONTENT_KEY_BYTES`] bytes of a content id → the seq of
/// every content row that holds an object whose id starts with them (see
/// [`content_rows`]). Content ids are blake3 hashes already; their first 8 bytes are the
/// hash.
pub const CONTENT: Buckets = Buckets { table: Table::ContentIndex, hash: leading_u64, bytes: CONTENT_BUCKET_BYTES };

/// Bytes of entries a bucket of the content-id index holds on average: about 30 entries of
/// 13 bytes, as many as a bucket of [`BUCKET_BYTES`] held of the whole ids' 42-byte
/// entries, so that a lookup scans as few.
pub const CONTENT_BUCKET_BYTES: u64 = 384;

/// Bytes of a content id that key its entry in the content-id index. Two ids share them
/// by chance about once in 2^32 pairs (or by grinding about 2^32 hashes), so an entry
/// lists every row holding an object with that key, and only a row says which id it
/// holds: a lookup names the rows that may hold an id, and the caller reads them.
pub const CONTENT_KEY_BYTES: usize = 8;

/// A session's committed turns: turn id (UTF-8) → the seq of the record that committed
/// it (a LEB128 varint), under the session's prefix. The record holds the rest (its
/// commit hash and its receipt). A turn id is chosen by the host, so it is hashed
/// (blake3).
pub const TURNS: Buckets = Buckets { table: Table::Turns, hash: blake3_u64, bytes: BUCKET_BYTES };

fn leading_u64(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_le_bytes(b)
}

fn blake3_u64(key: &[u8]) -> u64 {
    leading_u64(blake3::hash(key).as_bytes())
}

/// A session's revision nodes: revision id (32 bytes) → `StoredNode` (canonically
/// encoded), under the session's prefix. Revision ids are blake3 hashes; their first 8
/// bytes are the hash. A node of a turn holds the turn's message ids, so its size
/// follows the turn's (about 270 bytes on the comparison's workload, 3.3 KB for turns of
/// 100 messages); buckets of a fixed number of bytes keep a lookup to about one part
/// whatever the nodes' size.
pub const REVISIONS: Buckets = Buckets { table: Table::Revisions, hash: leading_u64, bytes: BUCKET_BYTES };

/// A hashed map held whole in memory by the store of a long fold ([`Store::held_map`]):
/// its entries, in a hash map, and its size. It is loaded from the map's rows when the
/// fold first writes to it, and written back as rows once, when the store hands its writes
/// over. A committed turn or a revision node then costs one insert into the hash map,
/// where a bucket's row was read, spliced and written again at every record; the rows
/// written are those the changes one by one would leave, since a map's rows are a
/// function of its entries (each bucket's entries sorted, packed into parts in order).
#[derive(Debug)]
pub struct HeldMap {
    map: Buckets,
    entries: hashbrown::HashMap<Vec<u8>, Vec<u8>, crate::store::RowHasher>,
    /// Bytes of the entries ([`Buckets::size`]).
    size: u64,
    /// The parts of each bucket in the rows it was loaded from.
    stored: Vec<usize>,
    /// Whether anything was set or removed since it was loaded.
    changed: bool,
}

impl HeldMap {
    /// Sets `key` to `value`; returns whether the key is new, keeping the value replaced
    /// in `old_value`.
    fn set(&mut self, key: &[u8], value: &[u8], old_value: &mut Option<Vec<u8>>) -> bool {
        self.changed = true;
        self.size += entry_size(key, value) as u64;
        match self.entries.entry_ref(key) {
            hashbrown::hash_map::EntryRef::Occupied(mut held) => {
                self.size -= entry_size(key, held.get()) as u64;
                *old_value = Some(std::mem::replace(held.get_mut(), value.to_vec()));
                false
            }
            hashbrown::hash_map::EntryRef::Vacant(vacant) => {
                vacant.insert(value.to_vec());
                true
            }
        }
    }

    /// Removes `key`; returns whether the map held it.
    fn remove(&mut self, key: &[u8]) -> bool {
        match self.entries.remove(key) {
            Some(value) => {
                self.changed = true;
                self.size -= entry_size(key, &value) as u64;
                true
            }
            None => false,
        }
    }

    /// The entries of each bucket of the map its size gives, each bucket in key order.
    fn buckets(&self) -> Vec<Vec<Entry<'_>>> {
        let n = if self.size == 0 { 0 } else { buckets_for(self.size, self.map.bytes) };
        let mut buckets = vec![Vec::new(); n as usize];
        for (k, v) in &self.entries {
            buckets[address((self.map.hash)(k), n) as usize].push((&k[..], &v[..]));
        }
        for bucket in &mut buckets {
            bucket.sort_unstable_by(|a: &Entry<'_>, b: &Entry<'_>| a.0.cmp(b.0));
        }
        buckets
    }

    /// Writes the map's rows into `store`, over those it was loaded from, if it changed:
    /// its size row, then each bucket as [`Buckets::write_bucket`] packs it.
    pub(crate) fn write<S: Store + ?Sized>(&self, store: &mut S, prefix: &[u8]) -> Result<()> {
        if !self.changed {
            return Ok(());
        }
        let map = &self.map;
        match self.size {
            0 => store.remove(map.table, prefix)?,
            size => store.put(map.table, prefix, &size.to_le_bytes())?,
        }
        let buckets = self.buckets();
        for bucket in 0..buckets.len().max(self.stored.len()) {
            let entries = buckets.get(bucket).map_or(&[][..], |e| &e[..]);
            map.write_bucket(store, prefix, bucket as u64, entries, self.stored.get(bucket).copied().unwrap_or(0))?;
        }
        Ok(())
    }
}

/// The key of `id`'s entry in the content-id index.
fn content_key(id: &ContentId) -> &[u8] {
    &id.0[..CONTENT_KEY_BYTES]
}

/// The seqs an entry of the content-id index lists: LEB128 varints in their shortest
/// form, ascending (a seq twice when its row holds two objects of the entry's key), at
/// least one.
fn decode_content_rows(id: &ContentId, value: &[u8]) -> Result<Vec<u64>> {
    let bad = || CONTENT.corrupt(content_key(id), "bad content index entry");
    let mut rest = value;
    let mut seqs = Vec::with_capacity(1);
    while !rest.is_empty() {
        let seq = read_varint(&mut rest).ok_or_else(bad)? as u64;
        if seqs.last().is_some_and(|last| *last > seq) {
            return Err(bad());
        }
        seqs.push(seq);
    }
    if seqs.is_empty() {
        return Err(bad());
    }
    Ok(seqs)
}

fn encode_content_rows(seqs: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(seqs.len() * 4);
    for seq in seqs {
        put_varint(&mut out, *seq as usize);
    }
    out
}

/// The seqs of the content rows that may hold `id`, ascending: every row the content-id
/// index lists under its key ([`CONTENT_KEY_BYTES`]). Nearly always none or the one that
/// holds it; the rows themselves say which holds `id`.
pub fn content_rows<S: Store + ?Sized>(store: &S, id: &ContentId) -> Result<Vec<u64>> {
    content_rows_sized(store, CONTENT.size(store, &[])?, id)
}

/// [`content_rows`] in an index of `size` bytes ([`Buckets::size`]), for a reader that
/// looks up many ids at one seq.
pub fn content_rows_sized<S: Store + ?Sized>(store: &S, size: u64, id: &ContentId) -> Result<Vec<u64>> {
    let mut seqs =
        CONTENT.get_sized(store, &[], size, content_key(id), |v| decode_content_rows(id, v))?.unwrap_or_default();
    let rows = seqs.len();
    store.deferred_content_seqs(id, &mut seqs);
    if seqs.len() > rows {
        seqs.sort_unstable();
    }
    Ok(seqs)
}

/// Whether the content-id index lists a row under `id`'s key: `false` means `id` is not
/// stored; `true` that a row may hold it (one holding another id of that key, by chance).
pub fn content_may_be_stored<S: Store + ?Sized>(store: &S, id: &ContentId) -> Result<bool> {
    if store.deferred_content_holds(id) {
        return Ok(true);
    }
    CONTENT.contains(store, &[], content_key(id))
}

/// Whether `id` is stored, as a writer deciding what a command stores must know it: each
/// row the content-id index names under its key is asked whether it holds `id`, first
/// `staged` (the rows of the batch being decided, not in `store`'s rows yet: `None` for
/// a seq it does not hold), then `store` ([`Store::content_row_holds`]). A store that
/// cannot tell is an error, not a guess.
pub(crate) fn content_is_stored<S: Store + ?Sized>(
    store: &S,
    id: &ContentId,
    staged: &dyn Fn(u64) -> Option<bool>,
) -> Result<bool> {
    // The content-key filter knows every key of the index's rows: a key it never saw,
    // and that no addition held outside the rows has, is not in the index.
    if !store.deferred_content_holds(id) && store.content_key_absent(DeferredContent::key_of(id)) {
        return Ok(false);
    }
    for seq in content_rows(store, id)? {
        let holds = match staged(seq) {
            Some(holds) => holds,
            None => store.content_row_holds(seq, id)?.ok_or_else(|| {
                Error::storage(format!("content row {seq} cannot be read here to tell whether it holds {id}"))
            })?,
        };
        if holds {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Content-id index entries added and not yet in the map's rows. A store that folds many
/// records from sequence 0 (a catch-up's, a rebuild's) defers them
/// ([`Store::deferred_content`]) and merges them into the rows all at once; the writer's
/// overlay defers a batch's, which the delta keeps as typed entries until a checkpoint
/// merges them. Lookups of the index through such a store see them
/// ([`Store::deferred_content_seqs`]).
#[derive(Debug, Default)]
pub struct DeferredContent {
    /// Each addition's key (its bytes as a big-endian integer, so that integers sort as
    /// the keys do) and seq, in the order they came.
    added: Vec<(u64, u64)>,
    /// The keys of `added`.
    keys: std::collections::HashSet<u64, crate::store::RowHasher>,
}

impl DeferredContent {
    /// The key of `id`'s entry, as an integer.
    pub(crate) fn key_of(id: &ContentId) -> u64 {
        u64::from_be_bytes(id.0[..CONTENT_KEY_BYTES].try_into().expect("eight bytes"))
    }

    fn add(&mut self, id: &ContentId, seq: u64) {
        self.add_key(Self::key_of(id), seq);
    }

    /// Adds an addition under the key `key` (as [`DeferredContent::key_of`] gives it).
    pub(crate) fn add_key(&mut self, key: u64, seq: u64) {
        self.added.push((key, seq));
        self.keys.insert(key);
    }

    /// Whether an addition is deferred under `id`'s key.
    pub(crate) fn holds(&self, id: &ContentId) -> bool {
        self.keys.contains(&Self::key_of(id))
    }

    /// Appends to `out` the seqs deferred under `id`'s key (a scan of every addition,
    /// after a lookup of the key: few are deferred under any one key).
    pub(crate) fn seqs_into(&self, id: &ContentId, out: &mut Vec<u64>) {
        let key = Self::key_of(id);
        if self.keys.contains(&key) {
            out.extend(self.added.iter().filter(|(k, _)| *k == key).map(|(_, seq)| *seq));
        }
    }

    /// Whether nothing is deferred.
    pub(crate) fn is_empty(&self) -> bool {
        self.added.is_empty()
    }

    /// Adds every addition of `other`, after these.
    pub(crate) fn extend(&mut self, other: &DeferredContent) {
        for &(key, seq) in other.pairs() {
            self.add_key(key, seq);
        }
    }

    /// The additions deferred.
    pub(crate) fn len(&self) -> usize {
        self.added.len()
    }

    /// Each addition, as (key, seq), in the order they came.
    pub(crate) fn pairs(&self) -> &[(u64, u64)] {
        &self.added
    }

    /// Drops every addition after the first `len` (those of a command undone).
    pub(crate) fn truncate(&mut self, len: usize) {
        if len < self.added.len() {
            self.added.truncate(len);
            self.keys = self.added.iter().map(|(key, _)| *key).collect();
        }
    }

    /// The memory the additions take, about: 16 bytes each, and 16 a key in the set.
    pub(crate) fn bytes(&self) -> usize {
        self.added.len() * 16 + self.keys.len() * 16
    }
}

/// A callback over a hashed map's (key, value) entries ([`Buckets::each`]).
pub type EntryVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

/// The content-id index's additions a layer of the delta holds, folded by the writer and
/// not yet in the index's rows: each key's seqs, for lookups by a view (which sees those
/// at or below its seq), until the checkpoint that writes the layer merges them into the
/// rows ([`content_merge`]). Nearly every key has one seq; the others are listed apart.
#[derive(Debug, Default)]
pub(crate) struct ContentAdds {
    first: std::collections::HashMap<u64, u64, crate::store::RowHasher>,
    more: Vec<(u64, u64)>,
}

impl ContentAdds {
    /// Adds every addition of `deferred`.
    pub(crate) fn extend(&mut self, deferred: &DeferredContent) {
        for &(key, seq) in deferred.pairs() {
            match self.first.entry(key) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(seq);
                }
                std::collections::hash_map::Entry::Occupied(_) => self.more.push((key, seq)),
            }
        }
    }

    /// Whether none is held (a key's second seq goes to `more` only after its first).
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_empty()
    }

    /// Whether an addition under `id`'s key at or below `seq` is held.
    pub(crate) fn holds(&self, id: &ContentId, seq: u64) -> bool {
        let key = DeferredContent::key_of(id);
        self.first.get(&key).is_some_and(|s| *s <= seq) || self.more.iter().any(|(k, s)| *k == key && *s <= seq)
    }

    /// Appends to `out` the seqs added under `id`'s key, at or below `seq`.
    pub(crate) fn seqs_into(&self, id: &ContentId, seq: u64, out: &mut Vec<u64>) {
        let key = DeferredContent::key_of(id);
        out.extend(self.first.get(&key).filter(|s| **s <= seq));
        out.extend(self.more.iter().filter(|(k, s)| *k == key && *s <= seq).map(|(_, s)| *s));
    }

    /// The additions, to merge into the index's rows.
    pub(crate) fn to_deferred(&self) -> DeferredContent {
        let mut deferred = DeferredContent::default();
        self.upto_into(u64::MAX, &mut deferred);
        deferred
    }

    /// Adds to `deferred` the additions at or below `seq`.
    pub(crate) fn upto_into(&self, seq: u64, deferred: &mut DeferredContent) {
        self.keys_upto(seq, &mut |key, at| deferred.add_key(key, at));
    }

    /// Calls `f` with each addition (key, seq) held at or below `seq`.
    pub(crate) fn keys_upto(&self, seq: u64, f: &mut dyn FnMut(u64, u64)) {
        let all = self.first.iter().map(|(k, s)| (*k, *s)).chain(self.more.iter().copied());
        for (key, at) in all.filter(|(_, at)| *at <= seq) {
            f(key, at);
        }
    }

    /// The additions held.
    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.more.len()
    }
}

/// Merges `deferred` into the content-id index of `store`, every key at once: the rows are
/// those the additions one by one would have written ([`content_add`]), because which
/// entries a bucket holds, and so its rows, follow from the map's entries alone (module
/// docs). Each key's new value is its old seqs and its deferred ones, ascending; the map
/// takes its new size and splits to it first (an empty map has nothing to split), then
/// each bucket that gains or changes an entry is read and written once.
pub(crate) fn content_merge<S: Store + ?Sized>(store: &mut S, deferred: DeferredContent) -> Result<()> {
    let mut added = deferred.added;
    if added.is_empty() {
        return Ok(());
    }
    added.sort_unstable();
    let size = CONTENT.size(store, &[])?;
    // Each key's entry: its bucket (once the map's size is known), its key, and where its
    // value is in `values`.
    let mut merged: Vec<(u64, [u8; CONTENT_KEY_BYTES], std::ops::Range<usize>)> =
        Vec::with_capacity(deferred.keys.len());
    let mut values: Vec<u8> = Vec::with_capacity(added.len() * 4);
    let mut resized = size;
    for group in added.chunk_by(|a, b| a.0 == b.0) {
        let key = group[0].0.to_be_bytes();
        let start = values.len();
        let old = match size {
            0 => None,
            _ => {
                let mut id = [0u8; 32];
                id[..CONTENT_KEY_BYTES].copy_from_slice(&key);
                CONTENT.get_sized(store, &[], size, &key, |v| Ok((decode_content_rows(&ContentId(id), v)?, v.len())))?
            }
        };
        let fresh = group.iter().map(|(_, seq)| *seq);
        match old {
            None => fresh.for_each(|seq| put_varint(&mut values, seq as usize)),
            Some((mut seqs, old_len)) => {
                let old_size = entry_len(key.len(), old_len) as u64;
                resized = resized.checked_sub(old_size).ok_or_else(|| CONTENT.corrupt(&[], "bad map size"))?;
                seqs.extend(fresh);
                seqs.sort_unstable();
                seqs.iter().for_each(|seq| put_varint(&mut values, *seq as usize));
            }
        }
        resized += entry_size(&key, &values[start..]) as u64;
        merged.push((0, key, start..values.len()));
    }
    if size == 0 {
        store.put(CONTENT.table, &[], &resized.to_le_bytes())?;
    } else {
        CONTENT.resize(store, &[], size, resized)?;
    }
    let n = buckets_for(resized, CONTENT.bytes);
    for (bucket, key, _) in merged.iter_mut() {
        *bucket = address((CONTENT.hash)(key), n);
    }
    merged.sort_unstable_by_key(|(bucket, key, _)| (*bucket, *key));
    for group in merged.chunk_by(|a, b| a.0 == b.0) {
        let bucket = group[0].0;
        let parts = CONTENT.read_parts(store, &[], bucket)?;
        let old = CONTENT.entries(&[], bucket, n, &parts)?;
        // Both lists are sorted by key: merge them, a new value replacing an old one.
        let mut entries: Vec<Entry<'_>> = Vec::with_capacity(old.len() + group.len());
        let mut old = old.into_iter().peekable();
        for (_, key, value) in group {
            while let Some(e) = old.next_if(|(k, _)| *k < key.as_slice()) {
                entries.push(e);
            }
            old.next_if(|(k, _)| *k == key.as_slice());
            entries.push((key.as_slice(), &values[value.clone()]));
        }
        entries.extend(old);
        CONTENT.write_bucket(store, &[], bucket, &entries, parts.len())?;
    }
    Ok(())
}

/// Records in the content-id index that the content row at `seq` holds `id`.
pub fn content_add<S: Store + ?Sized>(store: &mut S, id: &ContentId, seq: u64) -> Result<()> {
    store.note_content_key(DeferredContent::key_of(id));
    if let Some(deferred) = store.deferred_content() {
        deferred.add(id, seq);
        return Ok(());
    }
    let one = encode_content_rows(&[seq]);
    // The common case: no row holds an object of this key yet.
    if let Some(old) = CONTENT.replace(store, &[], content_key(id), &one)? {
        let mut seqs = decode_content_rows(id, &old)?;
        let at = seqs.partition_point(|s| *s <= seq);
        seqs.insert(at, seq);
        CONTENT.insert(store, &[], content_key(id), &encode_content_rows(&seqs))?;
    }
    Ok(())
}

/// Records in the content-id index that the content row at `seq` no longer holds `id`
/// (a content collection removed it); `false` when the index did not list that row.
pub fn content_remove<S: Store + ?Sized>(store: &mut S, id: &ContentId, seq: u64) -> Result<bool> {
    if let Some(deferred) = store.deferred_content().map(std::mem::take) {
        content_merge(store, deferred)?;
    }
    let Some(mut seqs) = CONTENT.get(store, &[], content_key(id), |v| decode_content_rows(id, v))? else {
        return Ok(false);
    };
    let Some(at) = seqs.iter().position(|s| *s == seq) else {
        return Ok(false);
    };
    seqs.remove(at);
    if seqs.is_empty() {
        CONTENT.remove(store, &[], content_key(id))?;
    } else {
        CONTENT.insert(store, &[], content_key(id), &encode_content_rows(&seqs))?;
    }
    Ok(true)
}

/// The seq of the record that committed turn `turn_id` of `session`, if one did.
pub fn turn_seq<S: Store + ?Sized>(store: &S, session: &SessionId, turn_id: &str) -> Result<Option<u64>> {
    TURNS.get(store, &session.0, turn_id.as_bytes(), |v| {
        let mut rest = v;
        match read_varint(&mut rest) {
            Some(seq) if rest.is_empty() => Ok(seq as u64),
            _ => Err(TURNS.corrupt(&crate::store::keys::session_str(session, turn_id), "bad turn entry")),
        }
    })
}

/// Records that the record at `seq` committed turn `turn_id` of `session`; `false` (and
/// nothing changed but the seq) when the turn was committed before.
pub fn turn_add<S: Store + ?Sized>(store: &mut S, session: &SessionId, turn_id: &str, seq: u64) -> Result<bool> {
    let mut value = Vec::with_capacity(4);
    put_varint(&mut value, seq as usize);
    TURNS.insert(store, &session.0, turn_id.as_bytes(), &value)
}

/// Buckets a map of `size` bytes of entries has.
fn buckets_for(size: u64, bytes: u64) -> u64 {
    size.div_ceil(bytes).max(1)
}

/// `i` with `2^i ≤ n < 2^(i+1)`, for `n ≥ 1`.
fn level(n: u64) -> u32 {
    63 - n.max(1).leading_zeros()
}

/// The bucket of `hash` in a map of `n` buckets.
fn address(hash: u64, n: u64) -> u64 {
    let i = level(n);
    let b = if i >= 63 { hash } else { hash & ((2u64 << i) - 1) };
    if b < n {
        b
    } else {
        b - (1u64 << i)
    }
}

/// The key of `prefix`'s bucket `bucket`, part `part`.
fn part_key(prefix: &[u8], bucket: u64, part: u16) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 10);
    k.extend_from_slice(prefix);
    k.extend_from_slice(&bucket.to_be_bytes());
    k.extend_from_slice(&part.to_be_bytes());
    k
}

/// One entry of a part, borrowed.
type Entry<'a> = (&'a [u8], &'a [u8]);

/// An insert into a one-part bucket: the new entry replaces the entry bytes `at..end`
/// (empty for a new key; the old entry of `old` bytes otherwise), and the entries then
/// take `size` bytes.
struct Splice {
    at: usize,
    end: usize,
    size: usize,
    old: Option<usize>,
    /// Where the old entry's value is in the entry bytes, if there is one.
    old_value: std::ops::Range<usize>,
}

impl Buckets {
    fn corrupt(&self, key: &[u8], detail: impl Into<String>) -> Error {
        Error::corrupt(Location::Projection { table: self.table.name(), key: crate::store::hex(key) }, detail)
    }

    /// Bytes of the entries in `prefix`'s map (each entry's lengths, key and value, as a
    /// part holds them): what its number of buckets follows.
    pub fn size<S: Store + ?Sized>(&self, store: &S, prefix: &[u8]) -> Result<u64> {
        if let Some(held) = store.held_map_ref(self.table, prefix) {
            return Ok(held.size);
        }
        self.stored_size(store, prefix)
    }

    /// [`Buckets::size`] as the map's rows say it.
    fn stored_size<S: Store + ?Sized>(&self, store: &S, prefix: &[u8]) -> Result<u64> {
        let mut size = 0;
        store.read(self.table, prefix, &mut |v| {
            if let Some(v) = v {
                let b = <[u8; 8]>::try_from(v).map_err(|_| self.corrupt(prefix, "bad map size row"))?;
                size = u64::from_le_bytes(b);
            }
            Ok(())
        })?;
        Ok(size)
    }

    /// `prefix`'s map read whole from its rows, to hold in memory ([`HeldMap`]).
    pub(crate) fn load<S: Store + ?Sized>(&self, store: &S, prefix: &[u8]) -> Result<HeldMap> {
        let size = self.stored_size(store, prefix)?;
        let n = if size == 0 { 0 } else { buckets_for(size, self.bytes) };
        let mut entries = hashbrown::HashMap::with_hasher(crate::store::RowHasher::default());
        let mut stored = Vec::with_capacity(n as usize);
        let mut sum = 0u64;
        for bucket in 0..n {
            let parts = self.read_parts(store, prefix, bucket)?;
            for (k, v) in self.entries(prefix, bucket, n, &parts)? {
                sum += entry_size(k, v) as u64;
                entries.insert(k.to_vec(), v.to_vec());
            }
            stored.push(parts.len());
        }
        if sum != size {
            return Err(self.corrupt(prefix, "map size row does not match its entries"));
        }
        Ok(HeldMap { map: *self, entries, size, stored, changed: false })
    }

    /// A part's `more` flag and the bytes of its entries.
    fn split<'a>(&self, row_key: &[u8], part: &'a [u8]) -> Result<(bool, &'a [u8])> {
        match part.split_first() {
            Some((&more, rest)) if more <= 1 => Ok((more == 1, rest)),
            _ => Err(self.corrupt(row_key, "bad bucket row")),
        }
    }

    /// The next entry of a part's entry bytes, advancing `rest` past it; bytes that are not
    /// a whole entry are corrupt.
    fn next_entry<'a>(&self, row_key: &[u8], rest: &mut &'a [u8]) -> Result<Option<Entry<'a>>> {
        if rest.is_empty() {
            return Ok(None);
        }
        let bad = || self.corrupt(row_key, "bad bucket row");
        let mut body = *rest;
        let (klen, vlen) = match body {
            // Both lengths below 128, one byte each (always their shortest form): every
            // entry of the engine's maps.
            [k, v, tail @ ..] if *k < 0x80 && *v < 0x80 => {
                body = tail;
                (*k as usize, *v as usize)
            }
            _ => {
                let klen = read_varint(&mut body).ok_or_else(bad)?;
                (klen, read_varint(&mut body).ok_or_else(bad)?)
            }
        };
        if body.len() < klen || body.len() - klen < vlen {
            return Err(bad());
        }
        let entry = (&body[..klen], &body[klen..klen + vlen]);
        *rest = &body[klen + vlen..];
        Ok(Some(entry))
    }

    /// Appends a part's entries to `out`; returns its `more` flag.
    fn parse<'a>(&self, row_key: &[u8], part: &'a [u8], out: &mut Vec<Entry<'a>>) -> Result<bool> {
        let (more, mut rest) = self.split(row_key, part)?;
        while let Some(entry) = self.next_entry(row_key, &mut rest)? {
            out.push(entry);
        }
        Ok(more)
    }

    /// The value of `key` in one part, if it holds it, and whether the key may be in the
    /// next part (the part's `more` flag, unless an entry past the key was met): the
    /// lookup's scan, which allocates nothing and stops at the first entry at or past the
    /// key.
    fn find<'a>(&self, row_key: &[u8], part: &'a [u8], key: &[u8]) -> Result<(Option<&'a [u8]>, bool)> {
        let (more, mut rest) = self.split(row_key, part)?;
        while let Some((k, v)) = self.next_entry(row_key, &mut rest)? {
            match key_cmp(k, key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Ok((Some(v), more)),
                // Entries are sorted across a bucket's parts: the key is in none of them.
                std::cmp::Ordering::Greater => return Ok((None, false)),
            }
        }
        Ok((None, more))
    }

    /// The raw parts of `prefix`'s bucket `bucket`, in order (none for an empty bucket).
    fn read_parts<S: Store + ?Sized>(&self, store: &S, prefix: &[u8], bucket: u64) -> Result<Vec<Vec<u8>>> {
        let mut parts = Vec::new();
        loop {
            let part = u16::try_from(parts.len()).map_err(|_| self.corrupt(prefix, "bucket of too many parts"))?;
            let key = part_key(prefix, bucket, part);
            let mut row = None;
            store.read(self.table, &key, &mut |v| {
                row = v.map(<[u8]>::to_vec);
                Ok(())
            })?;
            match row {
                None if part == 0 => return Ok(parts),
                None => return Err(self.corrupt(&key, "bucket part missing")),
                Some(row) => {
                    let more = row.first() == Some(&1);
                    parts.push(row);
                    if !more {
                        return Ok(parts);
                    }
                }
            }
        }
    }

    /// Parses parts read by [`Buckets::read_parts`] into their entries, checking that they
    /// are sorted, unique and in the right bucket of a map of `n` buckets.
    fn entries<'a>(&self, prefix: &[u8], bucket: u64, n: u64, parts: &'a [Vec<u8>]) -> Result<Vec<Entry<'a>>> {
        let mut out = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let key = part_key(prefix, bucket, i as u16);
            let more = self.parse(&key, part, &mut out)?;
            if more != (i + 1 < parts.len()) {
                return Err(self.corrupt(&key, "bad bucket part flag"));
            }
        }
        let misplaced = out.iter().any(|(k, _)| address((self.hash)(k), n) != bucket);
        if misplaced || out.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(self.corrupt(&part_key(prefix, bucket, 0), "bucket entries out of order or place"));
        }
        Ok(out)
    }

    /// Calls `f` with the value of `key` in `prefix`'s map, if it holds one.
    pub fn get<S: Store + ?Sized, R>(
        &self,
        store: &S,
        prefix: &[u8],
        key: &[u8],
        f: impl FnOnce(&[u8]) -> Result<R>,
    ) -> Result<Option<R>> {
        self.get_sized(store, prefix, self.size(store, prefix)?, key, f)
    }

    /// [`Buckets::get`] in a map whose [`Buckets::size`] the caller read already (a walk
    /// that looks up many keys of one map reads it once).
    pub fn get_sized<S: Store + ?Sized, R>(
        &self,
        store: &S,
        prefix: &[u8],
        size: u64,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> Result<R>,
    ) -> Result<Option<R>> {
        if let Some(held) = store.held_map_ref(self.table, prefix) {
            return held.entries.get(key).map(|v| f(v)).transpose();
        }
        if size == 0 {
            return Ok(None);
        }
        let bucket = address((self.hash)(key), buckets_for(size, self.bytes));
        let mut f = Some(f);
        let mut found = None;
        let mut part = 0u16;
        loop {
            let row_key = part_key(prefix, bucket, part);
            let mut more = false;
            store.read(self.table, &row_key, &mut |v| {
                let Some(v) = v else {
                    if part > 0 {
                        return Err(self.corrupt(&row_key, "bucket part missing"));
                    }
                    return Ok(());
                };
                let (value, next) = self.find(&row_key, v, key)?;
                more = next;
                if let Some(value) = value {
                    if let Some(f) = f.take() {
                        found = Some(f(value)?);
                    }
                    more = false;
                }
                Ok(())
            })?;
            if !more {
                return Ok(found);
            }
            part = part.checked_add(1).ok_or_else(|| self.corrupt(prefix, "bucket of too many parts"))?;
        }
    }

    /// Every entry of `prefix`'s map, bucket by bucket, each bucket in key order (for
    /// checks and tools; a lookup reads one bucket).
    pub fn all<S: Store + ?Sized>(&self, store: &S, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        self.each(store, prefix, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `f` with every entry of `prefix`'s map, bucket by bucket, each bucket in key
    /// order, holding one bucket at a time.
    pub fn each<S: Store + ?Sized>(&self, store: &S, prefix: &[u8], f: &mut EntryVisitor<'_>) -> Result<()> {
        if let Some(held) = store.held_map_ref(self.table, prefix) {
            for bucket in held.buckets() {
                for (k, v) in bucket {
                    f(k, v)?;
                }
            }
            return Ok(());
        }
        let size = self.size(store, prefix)?;
        if size == 0 {
            return Ok(());
        }
        let n = buckets_for(size, self.bytes);
        for bucket in 0..n {
            let parts = self.read_parts(store, prefix, bucket)?;
            for (k, v) in self.entries(prefix, bucket, n, &parts)? {
                f(k, v)?;
            }
        }
        Ok(())
    }

    /// Whether `prefix`'s map holds `key`.
    pub fn contains<S: Store + ?Sized>(&self, store: &S, prefix: &[u8], key: &[u8]) -> Result<bool> {
        Ok(self.get(store, prefix, key, |_| Ok(()))?.is_some())
    }

    /// Writes `prefix`'s bucket `bucket` as `entries` (sorted), in parts, removing parts
    /// past the new last one up to `old_parts`.
    fn write_bucket<S: Store + ?Sized>(
        &self,
        store: &mut S,
        prefix: &[u8],
        bucket: u64,
        entries: &[Entry<'_>],
        old_parts: usize,
    ) -> Result<()> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        // Each part is sized once: the entries left, up to a part's bytes.
        let mut left: usize = entries.iter().map(|(k, v)| entry_size(k, v)).sum();
        let mut current: Vec<u8> = Vec::new();
        for (k, v) in entries {
            if k.len() > KEY_BYTES_MAX {
                return Err(self.corrupt(prefix, "bucket key too long"));
            }
            if current.len() > 1 && current.len() - 1 + entry_size(k, v) > PART_BYTES {
                parts.push(std::mem::take(&mut current));
            }
            if current.is_empty() {
                current.reserve_exact(1 + left.min(PART_BYTES));
                current.push(0);
            }
            put_entry(&mut current, k, v);
            left -= entry_size(k, v);
        }
        if !current.is_empty() {
            parts.push(current);
        }
        let written = parts.len();
        if written > u16::MAX as usize + 1 {
            return Err(self.corrupt(prefix, "bucket of too many parts"));
        }
        for (i, mut part) in parts.into_iter().enumerate() {
            part[0] = u8::from(i + 1 < written);
            store.put_vec(self.table, &part_key(prefix, bucket, i as u16), part)?;
        }
        for i in written..old_parts {
            store.remove(self.table, &part_key(prefix, bucket, i as u16))?;
        }
        Ok(())
    }

    /// The common case of an insert: the bucket is one part (or empty) and stays one
    /// part, so its new row is the old one with the entry spliced in, written without
    /// taking the bucket apart. Returns whether the key is new, or `None` when the bucket
    /// has parts or would need them ([`Buckets::write_bucket`] packs it then).
    fn insert_in_one_part<S: Store + ?Sized>(
        &self,
        store: &mut S,
        prefix: &[u8],
        bucket: u64,
        key: &[u8],
        value: &[u8],
        old_value: &mut Option<Vec<u8>>,
    ) -> Result<Option<Option<usize>>> {
        if key.len() > KEY_BYTES_MAX {
            return Err(self.corrupt(prefix, "bucket key too long"));
        }
        let row_key = part_key(prefix, bucket, 0);
        // Where the store holds the row in a buffer of its own (a rebuild's overlay), the
        // entry is spliced into it there.
        let mut old = None;
        let in_place = store.update_in_place(self.table, &row_key, &mut |row| {
            let Some(splice) = self.one_part_splice(&row_key, Some(row), key, value)? else { return Ok(false) };
            if splice.old.is_some() {
                *old_value = Some(row[1 + splice.old_value.start..1 + splice.old_value.end].to_vec());
            }
            // The lengths' varints, then the key and the value, spliced in without a
            // buffer of their own.
            let mut header = [0u8; 20];
            let n = varint_into(&mut header, key.len());
            let n = n + varint_into(&mut header[n..], value.len());
            replace_range(row, 1 + splice.at..1 + splice.end, [&header[..n], key, value]);
            old = Some(splice.old);
            Ok(true)
        })?;
        if in_place {
            return Ok(old);
        }
        let mut row = None;
        store.read(self.table, &row_key, &mut |v| {
            let Some(splice) = self.one_part_splice(&row_key, v, key, value)? else { return Ok(()) };
            let entries = v.map_or(&[][..], |v| &v[1..]);
            if splice.old.is_some() {
                *old_value = Some(entries[splice.old_value.clone()].to_vec());
            }
            let mut out = Vec::with_capacity(1 + splice.size);
            out.push(0);
            out.extend_from_slice(&entries[..splice.at]);
            put_entry(&mut out, key, value);
            out.extend_from_slice(&entries[splice.end..]);
            row = Some((out, splice.old));
            Ok(())
        })?;
        match row {
            Some((out, old)) => {
                store.put_vec(self.table, &row_key, out)?;
                Ok(Some(old))
            }
            None => Ok(None),
        }
    }

    /// Where `key` goes in the one-part bucket row `row` (or an empty bucket), as
    /// [`Buckets::insert_in_one_part`] splices it; `None` when the bucket has parts or
    /// would need them.
    fn one_part_splice(&self, row_key: &[u8], row: Option<&[u8]>, key: &[u8], value: &[u8]) -> Result<Option<Splice>> {
        let (more, entries) = match row {
            Some(v) => self.split(row_key, v)?,
            None => (false, &[][..]),
        };
        if more {
            return Ok(None);
        }
        // `at..end`: where the entry goes, and the old entry of the same key, if any.
        let (mut at, mut end, mut rest, mut others) = (0, 0, entries, 0usize);
        let mut equal = false;
        let mut old_value = 0..0;
        // Entries past the key are only walked (a row that does not parse whole is
        // corrupt, and is not written back), not compared.
        let mut past = false;
        while let Some((k, v)) = self.next_entry(row_key, &mut rest)? {
            let next = entries.len() - rest.len();
            if !past {
                match key_cmp(k, key) {
                    std::cmp::Ordering::Less => at = next,
                    std::cmp::Ordering::Greater => past = true,
                    std::cmp::Ordering::Equal => {
                        (equal, end, past) = (true, next, true);
                        old_value = next - v.len()..next;
                        // The key's own entry is not one of the others.
                        continue;
                    }
                }
            }
            others += 1;
        }
        if !equal {
            end = at;
        }
        let size = entries.len() - (end - at) + entry_size(key, value);
        if size > PART_BYTES && others > 0 {
            return Ok(None);
        }
        Ok(Some(Splice { at, end, size, old: equal.then_some(end - at), old_value }))
    }

    /// Sets `key` to `value` in `prefix`'s map; returns whether the key is new.
    pub fn insert<S: Store + ?Sized>(&self, store: &mut S, prefix: &[u8], key: &[u8], value: &[u8]) -> Result<bool> {
        let mut old = None;
        self.set(store, prefix, key, value, &mut old)
    }

    /// Sets `key` to `value` in `prefix`'s map; returns the value it replaced, if any.
    pub fn replace<S: Store + ?Sized>(
        &self,
        store: &mut S,
        prefix: &[u8],
        key: &[u8],
        value: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let mut old = None;
        self.set(store, prefix, key, value, &mut old)?;
        Ok(old)
    }

    /// [`Buckets::insert`], keeping the value replaced in `old_value`.
    fn set<S: Store + ?Sized>(
        &self,
        store: &mut S,
        prefix: &[u8],
        key: &[u8],
        value: &[u8],
        old_value: &mut Option<Vec<u8>>,
    ) -> Result<bool> {
        if let Some(held) = store.held_map(self, prefix)? {
            if key.len() > KEY_BYTES_MAX {
                return Err(self.corrupt(prefix, "bucket key too long"));
            }
            return Ok(held.set(key, value, old_value));
        }
        let size = self.size(store, prefix)?;
        let n = buckets_for(size, self.bytes);
        let bucket = address((self.hash)(key), n);
        let old = match self.insert_in_one_part(store, prefix, bucket, key, value, old_value)? {
            Some(old) => old,
            None => {
                let parts = self.read_parts(store, prefix, bucket)?;
                let mut entries = self.entries(prefix, bucket, n, &parts)?;
                let old = match entries.binary_search_by(|(k, _)| (*k).cmp(key)) {
                    Ok(i) => {
                        let replaced = std::mem::replace(&mut entries[i].1, value);
                        *old_value = Some(replaced.to_vec());
                        Some(entry_size(entries[i].0, replaced))
                    }
                    Err(i) => {
                        entries.insert(i, (key, value));
                        None
                    }
                };
                self.write_bucket(store, prefix, bucket, &entries, parts.len())?;
                old
            }
        };
        let resized = size + entry_size(key, value) as u64 - old.unwrap_or(0) as u64;
        self.resize(store, prefix, size, resized)?;
        Ok(old.is_none())
    }

    /// Removes `key` from `prefix`'s map; returns whether it held it.
    pub fn remove<S: Store + ?Sized>(&self, store: &mut S, prefix: &[u8], key: &[u8]) -> Result<bool> {
        if let Some(held) = store.held_map(self, prefix)? {
            return Ok(held.remove(key));
        }
        let size = self.size(store, prefix)?;
        if size == 0 {
            return Ok(false);
        }
        let n = buckets_for(size, self.bytes);
        let bucket = address((self.hash)(key), n);
        let parts = self.read_parts(store, prefix, bucket)?;
        let mut entries = self.entries(prefix, bucket, n, &parts)?;
        let Ok(i) = entries.binary_search_by(|(k, _)| (*k).cmp(key)) else {
            return Ok(false);
        };
        let (k, v) = entries.remove(i);
        let resized = size.checked_sub(entry_size(k, v) as u64).ok_or_else(|| self.corrupt(prefix, "bad map size"))?;
        self.write_bucket(store, prefix, bucket, &entries, parts.len())?;
        self.resize(store, prefix, size, resized)?;
        Ok(true)
    }

    /// Splits bucket `from`, one part (`part`), of a map of `n` buckets into itself and
    /// bucket `n`: each entry's bytes are copied as they are into the row it now belongs
    /// to, with the checks [`Buckets::entries`] makes. A subset of one part's entries
    /// packs into one part, so the rows are those [`Buckets::write_bucket`] writes.
    fn split_one_part<S: Store + ?Sized>(
        &self,
        store: &mut S,
        prefix: &[u8],
        from: u64,
        n: u64,
        part: &[u8],
    ) -> Result<()> {
        let row_key = part_key(prefix, from, 0);
        let (more, mut rest) = self.split(&row_key, part)?;
        if more {
            return Err(self.corrupt(&row_key, "bad bucket part flag"));
        }
        let (mut kept, mut moved) = (vec![0u8], vec![0u8]);
        let mut previous: Option<&[u8]> = None;
        while !rest.is_empty() {
            let start = rest;
            let Some((k, _)) = self.next_entry(&row_key, &mut rest)? else { break };
            if k.len() > KEY_BYTES_MAX {
                return Err(self.corrupt(prefix, "bucket key too long"));
            }
            let bytes = &start[..start.len() - rest.len()];
            let hash = (self.hash)(k);
            if address(hash, n) != from || previous.is_some_and(|p| p >= k) {
                return Err(self.corrupt(&row_key, "bucket entries out of order or place"));
            }
            previous = Some(k);
            match address(hash, n + 1) == n {
                true => moved.extend_from_slice(bytes),
                false => kept.extend_from_slice(bytes),
            }
        }
        match kept.len() > 1 {
            true => store.put_vec(self.table, &row_key, kept)?,
            false => store.remove(self.table, &row_key)?,
        }
        if moved.len() > 1 {
            store.put_vec(self.table, &part_key(prefix, n, 0), moved)?;
        }
        Ok(())
    }

    /// Records that the map's entries went from `from` to `to` bytes, and splits or merges
    /// buckets until the map has the buckets that `to` gives.
    fn resize<S: Store + ?Sized>(&self, store: &mut S, prefix: &[u8], from: u64, to: u64) -> Result<()> {
        if to == 0 {
            store.remove(self.table, prefix)?;
        } else {
            // An overlay's `put` overwrites the buffer it holds the row in.
            store.put(self.table, prefix, &to.to_le_bytes())?;
        }
        let (mut n, target) = (buckets_for(from, self.bytes), buckets_for(to, self.bytes));
        while n < target {
            // Bucket `n - 2^i` splits into itself and bucket `n`.
            let from = n - (1u64 << level(n));
            let parts = self.read_parts(store, prefix, from)?;
            if let [part] = &parts[..] {
                self.split_one_part(store, prefix, from, n, part)?;
                n += 1;
                continue;
            }
            let entries = self.entries(prefix, from, n, &parts)?;
            let (moved, kept): (Vec<Entry<'_>>, Vec<Entry<'_>>) =
                entries.into_iter().partition(|(k, _)| address((self.hash)(k), n + 1) == n);
            self.write_bucket(store, prefix, from, &kept, parts.len())?;
            self.write_bucket(store, prefix, n, &moved, 0)?;
            n += 1;
        }
        while n > target {
            // The last bucket merges back into the one it was split from.
            let last = n - 1;
            let into = last - (1u64 << level(last));
            let last_parts = self.read_parts(store, prefix, last)?;
            let into_parts = self.read_parts(store, prefix, into)?;
            let mut merged = self.entries(prefix, last, n, &last_parts)?;
            merged.extend(self.entries(prefix, into, n, &into_parts)?);
            merged.sort_unstable_by(|a, b| a.0.cmp(b.0));
            self.write_bucket(store, prefix, into, &merged, into_parts.len())?;
            self.write_bucket(store, prefix, last, &[], last_parts.len())?;
            n -= 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A map whose hash is the key's first 8 bytes: tests choose where keys land.
    /// 72 bytes a bucket: four entries of an 8-byte key and an 8-byte value (and 2 bytes
    /// of lengths each).
    const RAW: Buckets = Buckets { table: Table::ContentIndex, hash: leading_u64, bytes: 72 };

    fn rows(store: &MemStore) -> Vec<(Vec<u8>, Vec<u8>)> {
        store.tables.get(&Table::ContentIndex).map(|t| t.clone().into_iter().collect()).unwrap_or_default()
    }

    /// An id whose first 8 bytes are `key` (as a content id's would be) and the rest `tail`.
    fn id(key: u64, tail: u8) -> ContentId {
        let mut id = [tail; 32];
        id[..8].copy_from_slice(&key.to_le_bytes());
        ContentId(id)
    }

    #[test]
    fn the_content_index_lists_every_row_of_a_key_and_forgets_one_at_a_time() {
        let mut store = MemStore::default();
        let (a, b, c, other) = (id(7, 1), id(7, 2), id(7, 3), id(8, 1));
        assert!(content_rows(&store, &a).unwrap().is_empty());
        assert!(!content_may_be_stored(&store, &a).unwrap());
        // Three ids of one key, in two rows (the later one added first), and another key.
        content_add(&mut store, &b, 300).unwrap();
        content_add(&mut store, &a, 5).unwrap();
        content_add(&mut store, &c, 300).unwrap();
        content_add(&mut store, &other, 5).unwrap();
        // Every id of the key gets every row of the key, ascending, a row as often as it
        // holds an object of the key: only the rows say which holds which.
        for x in [a, b, c] {
            assert_eq!(content_rows(&store, &x).unwrap(), [5, 300, 300]);
            assert!(content_may_be_stored(&store, &x).unwrap());
        }
        assert_eq!(content_rows(&store, &other).unwrap(), [5]);
        // The entry's bytes: key, then the seqs as varints (300 is 0xac 0x02).
        let entries = CONTENT.all(&store, &[]).unwrap();
        assert_eq!(entries[0], (7u64.to_le_bytes().to_vec(), vec![5, 0xac, 0x02, 0xac, 0x02]));
        // A removal names the id and its row; an unlisted row is not removed.
        assert!(!content_remove(&mut store, &a, 6).unwrap());
        assert!(content_remove(&mut store, &c, 300).unwrap());
        assert_eq!(content_rows(&store, &a).unwrap(), [5, 300]);
        assert!(content_remove(&mut store, &a, 5).unwrap());
        assert!(content_remove(&mut store, &b, 300).unwrap());
        assert!(content_rows(&store, &b).unwrap().is_empty());
        assert!(!content_remove(&mut store, &b, 300).unwrap());
        // The key's entry is gone with its last row; the other key's stays.
        assert_eq!(CONTENT.all(&store, &[]).unwrap().len(), 1);
        assert!(content_remove(&mut store, &other, 5).unwrap());
        assert!(rows(&store).is_empty(), "an empty index holds no row");
    }

    #[test]
    fn a_content_index_entry_that_is_not_ascending_varints_is_corrupt() {
        let key = 9u64.to_le_bytes();
        for bad in [vec![], vec![0x80], vec![5, 4], vec![0x85, 0x00]] {
            let mut store = MemStore::default();
            CONTENT.insert(&mut store, &[], &key, &bad).unwrap();
            let err = content_rows(&store, &id(9, 0)).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{bad:?}: {err}");
            assert!(matches!(content_add(&mut store, &id(9, 0), 1).unwrap_err(), Error::Corrupt { .. }));
        }
    }

    /// A store of projection rows that also answers which content rows hold which ids,
    /// as a view of an engine does.
    struct WithRows {
        store: MemStore,
        rows: BTreeMap<u64, Vec<ContentId>>,
    }

    impl Store for WithRows {
        fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
            self.store.read(table, key, f)
        }
        fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
            self.store.put(table, key, value)
        }
        fn remove(&mut self, table: Table, key: &[u8]) -> Result<()> {
            self.store.remove(table, key)
        }
        fn content_row_holds(&self, seq: u64, id: &ContentId) -> Result<Option<bool>> {
            Ok(Some(self.rows.get(&seq).is_some_and(|ids| ids.contains(id))))
        }
    }

    #[test]
    fn an_id_is_stored_only_if_a_row_of_its_key_holds_it() {
        let (a, b, c) = (id(7, 1), id(7, 2), id(7, 3));
        let mut store = WithRows { store: MemStore::default(), rows: BTreeMap::new() };
        content_add(&mut store, &a, 5).unwrap();
        store.rows.insert(5, vec![a]);
        let none = |_: u64| None;
        assert!(content_is_stored(&store, &a, &none).unwrap());
        // `b` shares `a`'s key, and row 5 does not hold it: not stored, to be stored.
        assert!(!content_is_stored(&store, &b, &none).unwrap());
        assert!(!content_is_stored(&store, &id(8, 1), &none).unwrap());
        // A row of the batch being decided (seq 9) answers for itself, before the store.
        content_add(&mut store, &b, 9).unwrap();
        let staged = |seq: u64| (seq == 9).then_some(true);
        assert!(content_is_stored(&store, &b, &staged).unwrap());
        let staged_other = |seq: u64| (seq == 9).then_some(false);
        assert!(!content_is_stored(&store, &c, &staged_other).unwrap());
        // A store that cannot read the rows does not guess.
        let mut plain = MemStore::default();
        content_add(&mut plain, &a, 5).unwrap();
        assert!(matches!(content_is_stored(&plain, &a, &none).unwrap_err(), Error::Storage(_)));
        // Without an entry for the key, no row is asked.
        assert!(!content_is_stored(&plain, &id(8, 1), &none).unwrap());
    }

    #[test]
    fn varints_round_trip_in_their_shortest_form() {
        for n in [0usize, 1, 127, 128, 300, 16_383, 16_384, u32::MAX as usize, usize::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, n);
            assert_eq!(out.len(), varint_len(n), "{n}");
            let mut rest = &out[..];
            assert_eq!(read_varint(&mut rest), Some(n));
            assert!(rest.is_empty());
        }
        assert_eq!(read_varint(&mut &[0xff; 11][..]), None, "longer than a usize");
        assert_eq!(read_varint(&mut &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f][..]), None);
    }

    #[test]
    fn addresses_follow_linear_hashing() {
        // One bucket: everything in 0.
        assert_eq!(address(7, 1), 0);
        // Two buckets: the low bit.
        assert_eq!((address(6, 2), address(7, 2)), (0, 1));
        // Three: bucket 0 split into 0 and 2 (two bits), bucket 1 not yet (one bit).
        assert_eq!((address(4, 3), address(6, 3), address(5, 3), address(7, 3)), (0, 2, 1, 1));
        assert_eq!((buckets_for(0, 4), buckets_for(4, 4), buckets_for(5, 4), buckets_for(9, 4)), (1, 1, 2, 3));
    }

    /// Every row of the content-id index that `reference` holds, and every row a map of
    /// its size or a little larger could hold, as `store` holds them.
    fn index_rows(reference: &MemStore, store: &dyn Store) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let n = buckets_for(CONTENT.size(reference, &[]).unwrap(), CONTENT.bytes);
        let mut keys: std::collections::BTreeSet<Vec<u8>> = rows(reference).into_iter().map(|(k, _)| k).collect();
        keys.insert(Vec::new());
        keys.extend((0..n + 4).flat_map(|b| (0..4).map(move |p| part_key(&[], b, p))));
        keys.into_iter().map(|k| (k.clone(), store.get(Table::ContentIndex, &k).unwrap())).collect()
    }

    /// A content id of key number `k` (spread over the hash's bits) and tail `tail`.
    fn spread_id(k: u16, tail: u8) -> ContentId {
        id(u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15), tail)
    }

    /// A map of a table a fold's [`crate::store::Typed`] store holds whole, with buckets of
    /// 72 bytes, so that a few entries split and merge them, and a value of kilobytes
    /// makes a bucket of parts.
    const HELD: Buckets = Buckets { table: Table::Turns, hash: leading_u64, bytes: 72 };

    fn held_key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 1..10)
    }

    fn held_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            8 => proptest::collection::vec(any::<u8>(), 0..40),
            1 => proptest::collection::vec(any::<u8>(), 1_000..3_500),
        ]
    }

    /// A map larger than a typed store holds whole is changed row by row: its rows stay
    /// readable, and are those of the same change made to the rows directly.
    #[test]
    fn a_large_map_is_not_held_whole() {
        let prefix = [7u8; 16];
        let mut base = MemStore::default();
        for i in 0..30u8 {
            HELD.insert(&mut base, &prefix, &[i], &[i; 3_000]).unwrap();
        }
        assert!(HELD.size(&base, &prefix).unwrap() > crate::store::HELD_MAP_BYTES_MAX);
        let mut direct = base.clone();
        let mut typed = crate::store::Typed::new(base);
        for key in [&b"new"[..], b"newer"] {
            assert!(HELD.insert(&mut direct, &prefix, key, b"value").unwrap());
            assert!(HELD.insert(&mut typed, &prefix, key, b"value").unwrap());
            assert!(typed.get(Table::Turns, &prefix).is_ok());
        }
        let turns = |store: &MemStore| store.tables.get(&Table::Turns).cloned().unwrap_or_default();
        assert_eq!(turns(&typed.into_inner().unwrap()), turns(&direct));
    }

    proptest! {
        /// A map held whole by a fold's typed store answers every lookup as its rows
        /// would, and writes the rows its sets and removals one by one leave: into a map
        /// empty or holding entries already, with buckets that split, merge and take parts.
        #[test]
        fn a_map_held_whole_writes_the_rows_of_its_changes_one_by_one(
            before in proptest::collection::vec((held_key(), held_value()), 0..30),
            ops in proptest::collection::vec((any::<bool>(), held_key(), held_value()), 1..60),
        ) {
            let prefix = [7u8; 16];
            let mut base = MemStore::default();
            for (k, v) in &before {
                HELD.insert(&mut base, &prefix, k, v).unwrap();
            }
            let mut one_by_one = base.clone();
            let mut typed = crate::store::Typed::new(base);
            for (remove, k, v) in &ops {
                match remove {
                    true => prop_assert_eq!(
                        HELD.remove(&mut one_by_one, &prefix, k).unwrap(),
                        HELD.remove(&mut typed, &prefix, k).unwrap()
                    ),
                    false => prop_assert_eq!(
                        HELD.replace(&mut one_by_one, &prefix, k, v).unwrap(),
                        HELD.replace(&mut typed, &prefix, k, v).unwrap()
                    ),
                }
                prop_assert_eq!(
                    HELD.get(&one_by_one, &prefix, k, |v| Ok(v.to_vec())).unwrap(),
                    HELD.get(&typed, &prefix, k, |v| Ok(v.to_vec())).unwrap()
                );
                prop_assert_eq!(HELD.size(&one_by_one, &prefix).unwrap(), HELD.size(&typed, &prefix).unwrap());
            }
            prop_assert_eq!(HELD.all(&one_by_one, &prefix).unwrap(), HELD.all(&typed, &prefix).unwrap());
            // The rows themselves are not to be read while the map is held.
            prop_assert!(typed.get(Table::Turns, &prefix).is_err());
            let written = typed.into_inner().unwrap();
            let turns = |store: &MemStore| store.tables.get(&Table::Turns).cloned().unwrap_or_default();
            prop_assert_eq!(turns(&written), turns(&one_by_one));
        }
    }

    proptest! {
        /// Replacing a range with parts leaves what `Vec::splice` leaves: ranges at the
        /// start, the middle and the end, growing, shrinking and keeping the length.
        #[test]
        fn replace_range_splices(
            row in proptest::collection::vec(any::<u8>(), 0..64),
            a in 0usize..65,
            b in 0usize..65,
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 3),
        ) {
            let (start, end) = (a.min(b).min(row.len()), a.max(b).min(row.len()));
            let mut expected = row.clone();
            expected.splice(start..end, parts.concat());
            let mut got = row;
            replace_range(&mut got, start..end, [&parts[0][..], &parts[1][..], &parts[2][..]]);
            prop_assert_eq!(got, expected);
        }
    }

    proptest! {
        /// Additions merged at once into a map that holds entries already, or none, leave
        /// the rows the same additions made one by one leave: keys new and old, a key's
        /// seqs out of order and twice, maps that split.
        #[test]
        fn a_merge_writes_the_rows_additions_one_by_one_write(
            before in proptest::collection::vec((0u16..300, 0u8..2, 0u64..1 << 22), 0..300),
            added in proptest::collection::vec((0u16..300, 0u8..2, 0u64..1 << 22), 0..400),
        ) {
            let mut one_by_one = MemStore::default();
            for (k, tail, seq) in &before {
                content_add(&mut one_by_one, &spread_id(*k, *tail), *seq).unwrap();
            }
            let mut merged = one_by_one.clone();
            let mut deferred = DeferredContent::default();
            for (k, tail, seq) in &added {
                content_add(&mut one_by_one, &spread_id(*k, *tail), *seq).unwrap();
                deferred.add(&spread_id(*k, *tail), *seq);
            }
            content_merge(&mut merged, deferred).unwrap();
            prop_assert_eq!(rows(&merged), rows(&one_by_one));
        }

        /// A catch-up's store defers the index's additions while the index starts a chunk
        /// empty, and settles them at the chunk's end: lookups between see every addition,
        /// a removal merges what is deferred first, and each chunk ends with the rows a
        /// store written one addition at a time holds.
        #[test]
        fn a_store_that_defers_additions_reads_and_settles_as_one_that_does_not(
            steps in proptest::collection::vec(
                prop_oneof![
                    6 => (0u16..120, 0u8..2, 0u64..1 << 22).prop_map(|(k, t, s)| (0u8, k, t, s)),
                    2 => (0u16..120, 0u8..2, 0u64..8).prop_map(|(k, t, s)| (1u8, k, t, s)),
                    2 => (0u16..120, 0u8..2).prop_map(|(k, t)| (2u8, k, t, 0)),
                    1 => Just((3u8, 0, 0, 0)),
                ],
                0..250,
            ),
        ) {
            let base = MemStore::default();
            let mut reference = MemStore::default();
            let mut overlay = crate::store::Overlay::new(&base);
            let mut held = crate::store::HeldRows::new(Table::ContentIndex);
            let mut folding = crate::store::Held { held: &mut held, rest: &mut overlay };
            folding.defer_if_empty().unwrap();
            for (op, k, tail, seq) in steps {
                let id = spread_id(k, tail);
                match op {
                    0 => {
                        content_add(&mut folding, &id, seq).unwrap();
                        content_add(&mut reference, &id, seq).unwrap();
                    }
                    1 => {
                        // A seq the index lists for the id, mostly.
                        let listed = content_rows(&reference, &id).unwrap();
                        let seq = listed.get(seq as usize % listed.len().max(1)).copied().unwrap_or(seq);
                        prop_assert_eq!(
                            content_remove(&mut folding, &id, seq).unwrap(),
                            content_remove(&mut reference, &id, seq).unwrap()
                        );
                    }
                    2 => {
                        prop_assert_eq!(content_rows(&folding, &id).unwrap(), content_rows(&reference, &id).unwrap());
                        prop_assert_eq!(
                            content_may_be_stored(&folding, &id).unwrap(),
                            content_may_be_stored(&reference, &id).unwrap()
                        );
                    }
                    _ => {
                        folding.settle().unwrap();
                        prop_assert_eq!(index_rows(&reference, &folding), index_rows(&reference, &reference));
                        folding.defer_if_empty().unwrap();
                    }
                }
            }
            folding.settle().unwrap();
            prop_assert_eq!(index_rows(&reference, &folding), index_rows(&reference, &reference));
        }
    }

    #[test]
    fn a_map_splits_and_merges_back_to_the_same_rows() {
        let mut store = MemStore::default();
        let key = |i: u64| i.to_le_bytes().to_vec();
        for i in 0..40u64 {
            assert!(RAW.insert(&mut store, b"", &key(i), &i.to_be_bytes()).unwrap());
        }
        assert!(!RAW.insert(&mut store, b"", &key(3), b"x").unwrap(), "a second insert replaces");
        assert_eq!(RAW.size(&store, b"").unwrap(), 40 * 18 - 7);
        // 713 bytes at 72 a bucket: 10 buckets and the size row.
        assert_eq!(rows(&store).len(), 11);
        for i in 0..40u64 {
            let v = RAW.get(&store, b"", &key(i), |v| Ok(v.to_vec())).unwrap().unwrap();
            assert_eq!(v, if i == 3 { b"x".to_vec() } else { i.to_be_bytes().to_vec() });
        }
        assert!(!RAW.contains(&store, b"", &key(99)).unwrap());
        // Removing the last 30 leaves what inserting the first 10 alone writes.
        for i in 10..40u64 {
            assert!(RAW.remove(&mut store, b"", &key(i)).unwrap());
        }
        assert!(!RAW.remove(&mut store, b"", &key(10)).unwrap());
        let mut fresh = MemStore::default();
        for i in 0..10u64 {
            let v = if i == 3 { b"x".to_vec() } else { i.to_be_bytes().to_vec() };
            RAW.insert(&mut fresh, b"", &key(i), &v).unwrap();
        }
        assert_eq!(rows(&store), rows(&fresh));
        for i in 0..10u64 {
            RAW.remove(&mut store, b"", &key(i)).unwrap();
        }
        assert!(rows(&store).is_empty(), "an empty map has no rows");
    }

    #[test]
    fn a_crowded_bucket_spills_into_parts() {
        let mut store = MemStore::default();
        // Every key hashes to 0: one bucket holds them all whatever the map's size.
        let key = |i: u64| {
            let mut k = vec![0u8; 8];
            k.extend_from_slice(&i.to_be_bytes());
            k
        };
        let value = vec![7u8; 500];
        for i in 0..30u64 {
            RAW.insert(&mut store, b"", &key(i), &value).unwrap();
        }
        let parts: Vec<_> = rows(&store).into_iter().filter(|(k, _)| !k.is_empty()).collect();
        assert!(parts.len() >= 5, "{} parts", parts.len());
        assert!(parts.iter().all(|(_, v)| v.len() <= PART_BYTES + 1));
        for i in 0..30u64 {
            assert!(RAW.contains(&store, b"", &key(i)).unwrap());
        }
        for i in 0..30u64 {
            assert!(RAW.remove(&mut store, b"", &key(i)).unwrap());
        }
        assert!(rows(&store).is_empty());
    }

    #[test]
    fn a_bad_row_is_corrupt_not_a_panic() {
        let mut store = MemStore::default();
        RAW.insert(&mut store, b"", &1u64.to_le_bytes(), b"v").unwrap();
        // No flag, a bad flag, lengths past the row, a varint that does not end, and one
        // not in its shortest form.
        for bad in [vec![], vec![2], vec![0, 1, 5, 1], vec![0, 0x80], vec![0, 0x81, 0, 0, 1]] {
            store.put(Table::ContentIndex, &part_key(b"", 0, 0), &bad).unwrap();
            let err = RAW.get(&store, b"", &1u64.to_le_bytes(), |_| Ok(())).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        }
        store.put(Table::ContentIndex, b"", b"short").unwrap();
        assert!(matches!(RAW.size(&store, b"").unwrap_err(), Error::Corrupt { .. }));
    }

    proptest! {
        /// The scans' comparison is the keys' byte order, whatever their lengths and
        /// however much of their first 8 bytes they share.
        #[test]
        fn keys_compare_in_byte_order(
            a in proptest::collection::vec(0u8..3, 0..12),
            b in proptest::collection::vec(0u8..3, 0..12),
            shared in proptest::collection::vec(any::<u8>(), 0..10),
        ) {
            let (a, b) = ([&shared[..], &a].concat(), [&shared[..], &b].concat());
            prop_assert_eq!(key_cmp(&a, &b), a.cmp(&b));
            prop_assert_eq!(key_cmp(&b, &a), b.cmp(&a));
        }

        /// Against a `BTreeMap`: every lookup agrees, and the rows are those of the same
        /// entries inserted alone in any order (the layout is a function of the entries).
        #[test]
        fn a_map_is_a_map(
            ops in proptest::collection::vec((any::<bool>(), 0u8..64, any::<u8>(), 0usize..1_200), 0..300),
        ) {
            let mut store = MemStore::default();
            let mut model = BTreeMap::new();
            let key = |k: u8| blake3::hash(&[k]).as_bytes().to_vec();
            // The same operations through an overlay that no command stages, which splices
            // entries into the rows it holds in place (a rebuild's), over an empty store.
            let base = MemStore::default();
            let mut overlay = crate::store::Overlay::new(&base);
            // Values up to 1,200 bytes: buckets of a few entries spill into parts.
            for (insert, k, v, len) in ops {
                let value = vec![v; len];
                if insert {
                    let new = model.insert(k, value.clone()).is_none();
                    prop_assert_eq!(RAW.insert(&mut store, b"s", &key(k), &value).unwrap(), new);
                    prop_assert_eq!(RAW.insert(&mut overlay, b"s", &key(k), &value).unwrap(), new);
                } else {
                    let held = model.remove(&k).is_some();
                    prop_assert_eq!(RAW.remove(&mut store, b"s", &key(k)).unwrap(), held);
                    prop_assert_eq!(RAW.remove(&mut overlay, b"s", &key(k)).unwrap(), held);
                }
            }
            let mut folded = MemStore::default();
            crate::store::apply_writes(&mut folded, overlay.into_writes()).unwrap();
            prop_assert_eq!(rows(&store), rows(&folded));
            for k in 0..64u8 {
                let got = RAW.get(&store, b"s", &key(k), |v| Ok(v.to_vec())).unwrap();
                prop_assert_eq!(got.as_ref(), model.get(&k));
            }
            let size: usize = model.iter().map(|(k, v)| entry_size(&key(*k), v)).sum();
            prop_assert_eq!(RAW.size(&store, b"s").unwrap(), size as u64);
            let mut all = RAW.all(&store, b"s").unwrap();
            all.sort();
            let expected: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (key(*k), v.clone())).collect::<BTreeMap<_, _>>().into_iter().collect();
            prop_assert_eq!(all, expected);
            let mut fresh = MemStore::default();
            for (k, v) in model.iter().rev() {
                RAW.insert(&mut fresh, b"s", &key(*k), v).unwrap();
            }
            prop_assert_eq!(rows(&store), rows(&fresh));
        }
    }
}
