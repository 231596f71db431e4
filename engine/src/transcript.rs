//! The transcript projection's rows: a session's current transcript as chunks of content
//! ids, and its chain values every 128 positions.
//!
//! - **Ids.** A full chunk `k` (positions `128k .. 128k + 128`, all below the transcript's
//!   length) is one row of [`Table::Transcript`] under `session ‖ k` (u64 big-endian): 128
//!   content ids of 32 bytes, with no other framing. The last chunk, while it is not full,
//!   is kept in pieces of 32 positions: piece `p` under `session ‖ k ‖ p` (one byte, `0..4`)
//!   holds the ids of positions `128k + 32p ..`, 1 to 32 of them. A turn rewrites the piece
//!   it appends to (and starts the next one); the turn that fills a chunk replaces its
//!   pieces with the chunk's row. (Version 2 kept a row per position of the last chunk.)
//! - **Chain values.** Checkpoint `j` is `c(128 (j + 1))`, the chain value over the first
//!   `128 (j + 1)` messages, for every such prefix of the transcript. Row `b` of
//!   [`Table::TranscriptChains`], under `session ‖ b` (u64 big-endian), holds checkpoints
//!   `64b ..` (at most 64), 32 bytes each, no other framing. The chain value at any
//!   position is the checkpoint before it extended over at most 127 ids.
//!
//! A turn rewrites one piece, about 512 bytes on average (two rows when it crosses a piece
//! boundary, and every 128 messages a chunk row and a checkpoint). An edit that keeps the
//! length rewrites the rows it touches and the checkpoints after it (32 bytes per 128 later
//! positions); a splice that moves positions rewrites the chunks from its start. A fork
//! copies one row per 128 positions. A page read reads a row per 128 positions (a piece per
//! 32 in the last chunk). `docs/design.md` §5 has the layout with the other tables.

use crate::error::{Error, Location, Result};
use crate::projection::TranscriptRow;
use crate::store::{hex, keys, Store, Table};
use annal_codec::{ContentId, RevisionId, SessionId};

/// Positions per chunk, and between two checkpoints.
pub const CHUNK: u64 = 128;

/// Positions per piece of a chunk that is not full.
pub const PIECE: u64 = 32;

/// Checkpoints per row of [`Table::TranscriptChains`].
pub const CHECKPOINTS_PER_ROW: u64 = 64;

/// Bytes per id, and per chain value.
const ID: usize = 32;

fn key(session: &SessionId, chunk: u64) -> Vec<u8> {
    keys::session_u64(session, chunk)
}

fn piece_key(session: &SessionId, chunk: u64, piece: u64) -> Vec<u8> {
    let mut k = keys::session_u64(session, chunk);
    k.push(piece as u8);
    k
}

fn corrupt(table: Table, key: &[u8], detail: &str) -> Error {
    Error::corrupt(Location::Projection { table: table.name(), key: hex(key) }, detail)
}

/// Ids chunk `chunk` holds in a transcript `len` long.
fn held(chunk: u64, len: u64) -> u64 {
    len.saturating_sub(chunk * CHUNK).min(CHUNK)
}

/// Appends the ids of positions `from..to` (all inside one chunk) to `out`, as bytes.
fn read_ids<S: Store + ?Sized>(store: &S, session: &SessionId, from: u64, to: u64, out: &mut Vec<u8>) -> Result<()> {
    each_ids(store, session, from, to, |bytes| out.extend_from_slice(bytes))
}

/// Hands the ids of positions `from..to` (all inside one chunk) to `emit`, as bytes,
/// straight from the rows read: one slice of a full chunk's row, or one of each piece.
fn each_ids<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    from: u64,
    to: u64,
    mut emit: impl FnMut(&[u8]),
) -> Result<()> {
    if from >= to {
        return Ok(());
    }
    let chunk = from / CHUNK;
    let k = key(session, chunk);
    let mut whole = false;
    store.read(Table::Transcript, &k, &mut |bytes| match bytes {
        None => Ok(()),
        Some(bytes) if bytes.len() != CHUNK as usize * ID => {
            Err(corrupt(Table::Transcript, &k, "transcript chunk is not 128 ids"))
        }
        Some(bytes) => {
            let (a, b) = ((from - chunk * CHUNK) as usize, (to - chunk * CHUNK) as usize);
            emit(&bytes[a * ID..b * ID]);
            whole = true;
            Ok(())
        }
    })?;
    if whole {
        return Ok(());
    }
    let (first, last) = ((from - chunk * CHUNK) / PIECE, (to - 1 - chunk * CHUNK) / PIECE);
    for piece in first..=last {
        let start = chunk * CHUNK + piece * PIECE;
        let (a, b) = (from.max(start) - start, to.min(start + PIECE) - start);
        let k = piece_key(session, chunk, piece);
        store.read(Table::Transcript, &k, &mut |bytes| match bytes {
            Some(bytes) if bytes.is_empty() || bytes.len() % ID != 0 || bytes.len() > PIECE as usize * ID => {
                Err(corrupt(Table::Transcript, &k, "transcript piece is not 1 to 32 ids"))
            }
            Some(bytes) if bytes.len() >= b as usize * ID => {
                emit(&bytes[a as usize * ID..b as usize * ID]);
                Ok(())
            }
            _ => Err(corrupt(Table::Transcript, &k, "missing row")),
        })?;
    }
    Ok(())
}

/// Stores chunk `chunk`'s ids `bytes` (all of them, from the chunk's first position),
/// where it held `old` ids before and its positions before `same` did not change: a full
/// chunk as its row, a partial one as its pieces from the one holding `same` on. What
/// stored its old ids and is no longer needed is removed.
fn store_chunk<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    chunk: u64,
    bytes: &[u8],
    old: u64,
    same: u64,
) -> Result<()> {
    let n = (bytes.len() / ID) as u64;
    if n == CHUNK {
        store.put(Table::Transcript, &key(session, chunk), bytes)?;
        if old < CHUNK {
            remove_pieces(store, session, chunk, 0, old)?;
        }
        return Ok(());
    }
    let first = if old == CHUNK {
        store.remove(Table::Transcript, &key(session, chunk))?;
        0
    } else {
        same.min(old) / PIECE
    };
    for piece in first..n.div_ceil(PIECE) {
        let (a, b) = ((piece * PIECE) as usize * ID, bytes.len().min(((piece + 1) * PIECE) as usize * ID));
        store.put(Table::Transcript, &piece_key(session, chunk, piece), &bytes[a..b])?;
    }
    if old < CHUNK {
        remove_pieces(store, session, chunk, n, old)?;
    }
    Ok(())
}

/// Removes the pieces of chunk `chunk` past its first `keep` ids, of the `old` it held.
fn remove_pieces<S: Store + ?Sized>(store: &mut S, session: &SessionId, chunk: u64, keep: u64, old: u64) -> Result<()> {
    for piece in keep.div_ceil(PIECE)..old.div_ceil(PIECE) {
        store.remove(Table::Transcript, &piece_key(session, chunk, piece))?;
    }
    Ok(())
}

fn id_of(bytes: &[u8]) -> [u8; 32] {
    let mut a = [0u8; 32];
    a.copy_from_slice(bytes);
    a
}

/// The content ids at positions `from..to` of `session`'s current transcript. A position
/// that is not stored is `Corrupt` ("missing row").
pub fn ids<S: Store + ?Sized>(store: &S, session: &SessionId, from: u64, to: u64) -> Result<Vec<ContentId>> {
    let mut out = Vec::new();
    ids_into(store, session, from, to, &mut out)?;
    Ok(out)
}

/// [`ids`], appended to `out`, which grows once (a rewrite builds its list after the
/// splice in one buffer, the replacement first: a tail of 50,000 ids is 1.6 MB).
pub(crate) fn ids_into<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    from: u64,
    to: u64,
    out: &mut Vec<ContentId>,
) -> Result<()> {
    out.reserve(to.saturating_sub(from).min(1 << 16) as usize);
    let mut pos = from;
    while pos < to {
        let end = ((pos / CHUNK + 1) * CHUNK).min(to);
        each_ids(store, session, pos, end, |bytes| out.extend(bytes.chunks_exact(ID).map(|b| ContentId(id_of(b)))))?;
        pos = end;
    }
    Ok(())
}

/// Checkpoint `j`: the chain value `c(128 (j + 1))`.
fn checkpoint<S: Store + ?Sized>(store: &S, session: &SessionId, j: u64) -> Result<RevisionId> {
    let k = key(session, j / CHECKPOINTS_PER_ROW);
    let at = (j % CHECKPOINTS_PER_ROW) as usize * ID;
    match store.get(Table::TranscriptChains, &k)? {
        Some(bytes) if bytes.len() % ID != 0 || bytes.len() > CHECKPOINTS_PER_ROW as usize * ID => {
            Err(corrupt(Table::TranscriptChains, &k, "chain row is not 1 to 64 chain values"))
        }
        Some(bytes) if bytes.len() > at => Ok(RevisionId(id_of(&bytes[at..at + ID]))),
        _ => Err(corrupt(Table::TranscriptChains, &k, "missing chain value")),
    }
}

/// The chain value over the first `len` messages: `c(len)`, from the checkpoint before
/// it and at most 127 ids.
pub fn chain_at<S: Store + ?Sized>(store: &S, session: &SessionId, len: u64) -> Result<RevisionId> {
    let whole = len / CHUNK;
    let base = match whole {
        0 => RevisionId::empty(),
        n => checkpoint(store, session, n - 1)?,
    };
    Ok(base.extend_all(&ids(store, session, whole * CHUNK, len)?))
}

/// The rows (id and chain value) at positions `from..to` of `session`'s current
/// transcript.
pub fn rows<S: Store + ?Sized>(store: &S, session: &SessionId, from: u64, to: u64) -> Result<Vec<TranscriptRow>> {
    let mut chain = chain_at(store, session, from)?;
    Ok(ids(store, session, from, to)?
        .into_iter()
        .map(|content| {
            chain = chain.extend(&content);
            TranscriptRow { content, chain }
        })
        .collect())
}

/// The row at `pos` of `session`'s current transcript.
pub fn row<S: Store + ?Sized>(store: &S, session: &SessionId, pos: u64) -> Result<TranscriptRow> {
    rows(store, session, pos, pos + 1)?
        .pop()
        .ok_or_else(|| corrupt(Table::Transcript, &key(session, pos / CHUNK), "missing row"))
}

/// Replaces the ids of positions `start..old_len` with `ids` (the transcript becomes
/// `start + ids.len()` long). Only the chunks from the one holding `start` are read or
/// written: that chunk's ids before `start` are kept, and what stored positions past the
/// new end is removed.
fn splice_ids<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    start: u64,
    old_len: u64,
    new: &[ContentId],
) -> Result<()> {
    let mut chunk = start / CHUNK;
    let mut same = start - chunk * CHUNK;
    let mut buf = Vec::with_capacity(CHUNK as usize * ID);
    // A chunk that was partial and stays partial is stored from the piece holding `same`
    // on, so the ids of the pieces before it are read only if the chunk fills up (a turn
    // appended to a transcript rewrites one piece, and read every piece before it). A
    // chunk that was full is stored again whole, as pieces or as its row.
    let mut unread = if held(chunk, old_len) == CHUNK { 0 } else { same / PIECE * PIECE };
    buf.resize(unread as usize * ID, 0);
    read_ids(store, session, chunk * CHUNK + unread, start, &mut buf)?;
    for id in new {
        buf.extend_from_slice(&id.0);
        if buf.len() == CHUNK as usize * ID {
            if unread > 0 {
                let mut head = Vec::with_capacity(unread as usize * ID);
                read_ids(store, session, chunk * CHUNK, chunk * CHUNK + unread, &mut head)?;
                buf[..head.len()].copy_from_slice(&head);
                unread = 0;
            }
            store_chunk(store, session, chunk, &buf, held(chunk, old_len), same)?;
            buf.clear();
            chunk += 1;
            same = 0;
        }
    }
    if !buf.is_empty() {
        store_chunk(store, session, chunk, &buf, held(chunk, old_len), same)?;
        chunk += 1;
    }
    for stale in chunk..old_len.div_ceil(CHUNK) {
        store_chunk(store, session, stale, &[], held(stale, old_len), 0)?;
    }
    Ok(())
}

/// Overwrites the ids of positions `start..start + new.len()`, all below the transcript's
/// length `len`, which does not change: only the rows holding them are written.
fn overwrite_ids<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    start: u64,
    len: u64,
    new: &[ContentId],
) -> Result<()> {
    let (mut pos, mut rest) = (start, new);
    while !rest.is_empty() {
        let chunk = pos / CHUNK;
        let n = (((chunk + 1) * CHUNK - pos) as usize).min(rest.len());
        let held = held(chunk, len);
        let mut bytes = Vec::with_capacity(held as usize * ID);
        read_ids(store, session, chunk * CHUNK, chunk * CHUNK + held, &mut bytes)?;
        let at = (pos - chunk * CHUNK) as usize * ID;
        for (slot, id) in bytes[at..at + n * ID].chunks_exact_mut(ID).zip(&rest[..n]) {
            slot.copy_from_slice(&id.0);
        }
        store_chunk(store, session, chunk, &bytes, held, pos - chunk * CHUNK)?;
        pos += n as u64;
        rest = &rest[n..];
    }
    Ok(())
}

/// Sets the checkpoints of a transcript now `new_len` long (it was `old_len`) whose
/// positions from `start` on have the chain values `chains` (`chains[i]` is
/// `c(start + i + 1)`); checkpoints before `start` stay, and those past the new end are
/// removed.
fn set_checkpoints<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    start: u64,
    old_len: u64,
    new_len: u64,
    chains: &[RevisionId],
) -> Result<()> {
    let first = start / CHUNK; // the first checkpoint that changes: c(128 (first + 1)) > start
    let new_count = new_len / CHUNK; // checkpoints after the splice
    let old_count = old_len / CHUNK;
    if new_count <= first && old_count <= first {
        return Ok(());
    }
    let first_row = first / CHECKPOINTS_PER_ROW;
    let mut buf = Vec::with_capacity(CHECKPOINTS_PER_ROW as usize * ID);
    if !first.is_multiple_of(CHECKPOINTS_PER_ROW) {
        let k = key(session, first_row);
        let bytes = store.get(Table::TranscriptChains, &k)?.unwrap_or_default();
        let kept = (first % CHECKPOINTS_PER_ROW) as usize * ID;
        if bytes.len() < kept {
            return Err(corrupt(Table::TranscriptChains, &k, "missing chain value"));
        }
        buf.extend_from_slice(&bytes[..kept]);
    }
    let mut row = first_row;
    for j in first..new_count {
        let at = ((j + 1) * CHUNK - start - 1) as usize;
        buf.extend_from_slice(&chains[at].0);
        if buf.len() == CHECKPOINTS_PER_ROW as usize * ID {
            store.put(Table::TranscriptChains, &key(session, row), &buf)?;
            buf.clear();
            row += 1;
        }
    }
    if !buf.is_empty() {
        store.put(Table::TranscriptChains, &key(session, row), &buf)?;
        row += 1;
    }
    for stale in row..old_count.div_ceil(CHECKPOINTS_PER_ROW) {
        store.remove(Table::TranscriptChains, &key(session, stale))?;
    }
    Ok(())
}

/// Replaces positions `start..end` of `session`'s transcript (`old_len` long) with the
/// first `replaced_by` ids of `after`, the list from `start` on once spliced (the
/// replacement, then the ids of `end..old_len`), chaining from `chain` (the chain value
/// `c(start)`). Returns the final chain value. A splice that keeps the
/// length writes only the chunks of the replaced positions; one that moves positions
/// rewrites the chunks from `start` on. Either way the checkpoints after `start` change.
#[allow(clippy::too_many_arguments)]
pub(crate) fn splice<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    start: u64,
    end: u64,
    old_len: u64,
    chain: RevisionId,
    after: &[ContentId],
    replaced_by: usize,
) -> Result<RevisionId> {
    let replacement = &after[..replaced_by.min(after.len())];
    let chains = chain_over(chain, after);
    let new_len = start + after.len() as u64;
    if replacement.len() as u64 == end - start {
        overwrite_ids(store, session, start, old_len, replacement)?;
    } else {
        splice_ids(store, session, start, old_len, after)?;
    }
    set_checkpoints(store, session, start, old_len, new_len, &chains)?;
    let end = chains.last().copied().unwrap_or(chain);
    recycle_chains(chains);
    Ok(end)
}

/// Copies the first `len` positions of `from`'s transcript to `to` (a fork): full chunks
/// and checkpoint rows byte for byte (the chain values of a prefix do not depend on the
/// session), the last partial chunk as pieces, the last checkpoint row cut.
pub(crate) fn copy_prefix<S: Store + ?Sized>(store: &mut S, from: &SessionId, to: &SessionId, len: u64) -> Result<()> {
    let mut buf = Vec::with_capacity(CHUNK as usize * ID);
    for chunk in 0..len.div_ceil(CHUNK) {
        let n = held(chunk, len);
        if n == CHUNK {
            // A whole chunk is copied as the row it is, its buffer handed over.
            if let Some(bytes) = store.get(Table::Transcript, &key(from, chunk))? {
                if bytes.len() == CHUNK as usize * ID {
                    store.put_vec(Table::Transcript, &key(to, chunk), bytes)?;
                    continue;
                }
            }
        }
        buf.clear();
        read_ids(store, from, chunk * CHUNK, chunk * CHUNK + n, &mut buf)?;
        store_chunk(store, to, chunk, &buf, 0, 0)?;
    }
    let checkpoints = len / CHUNK;
    for row in 0..checkpoints.div_ceil(CHECKPOINTS_PER_ROW) {
        let k = key(from, row);
        let n = (checkpoints - row * CHECKPOINTS_PER_ROW).min(CHECKPOINTS_PER_ROW) as usize * ID;
        match store.get(Table::TranscriptChains, &k)? {
            Some(bytes) if bytes.len() >= n => store.put(Table::TranscriptChains, &key(to, row), &bytes[..n])?,
            _ => return Err(corrupt(Table::TranscriptChains, &k, "missing chain value")),
        }
    }
    Ok(())
}

/// Lists at least this long are remembered by [`remember_chain`].
const REMEMBER_MIN: usize = 1024;

/// The chain values of the last long list `decide` hashed on this thread.
struct Remembered {
    base: RevisionId,
    ids: Vec<ContentId>,
    chains: Vec<RevisionId>,
}

thread_local! {
    static REMEMBERED: std::cell::RefCell<Option<Remembered>> = const { std::cell::RefCell::new(None) };
}

/// The chain value after `ids`, chaining from `base`, for `decide`: a rewrite or a
/// restore hashes the list its splice leaves behind (up to the whole transcript, 5 ms for
/// 50,000 messages), and the fold of the event it decided hashes the same list again, on
/// the same thread. A list of [`REMEMBER_MIN`] ids or more is kept with its chain values
/// (one list per thread, replaced by the next) for [`chain_over`] to take.
pub(crate) fn remember_chain(base: RevisionId, ids: Vec<ContentId>) -> RevisionId {
    let chains = hash_chain(base, &ids);
    let end = chains.last().copied().unwrap_or(base);
    remember(base, ids, chains);
    end
}

/// Keeps `ids` and their chain values from `base` ([`hash_chain`]'s) for [`chain_over`],
/// as [`remember_chain`] does, for a caller that needed the values before it could hand
/// over the list.
pub(crate) fn remember(base: RevisionId, ids: Vec<ContentId>, chains: Vec<RevisionId>) {
    debug_assert_eq!(ids.len(), chains.len());
    if ids.len() >= REMEMBER_MIN && ids.len() == chains.len() {
        let old = REMEMBERED.with(|r| r.borrow_mut().replace(Remembered { base, ids, chains }));
        if let Some(old) = old {
            recycle_ids(old.ids);
            recycle_chains(old.chains);
        }
    } else {
        recycle_ids(ids);
        recycle_chains(chains);
    }
}

/// Spare buffers kept per kind and thread by [`recycle_ids`] and [`recycle_chains`].
const SPARES_MAX: usize = 2;
/// The largest buffer kept: 8 MiB, a list of 262,144 ids.
const SPARE_BYTES_MAX: usize = 8 << 20;

/// Emptied buffers of the long lists a rewrite, a restore and their folds go through,
/// kept for the next (see [`spare_ids`]).
#[derive(Default)]
struct Spares {
    ids: Vec<Vec<ContentId>>,
    chains: Vec<Vec<RevisionId>>,
}

thread_local! {
    static SPARES: std::cell::RefCell<Spares> = std::cell::RefCell::new(Spares::default());
}

/// An empty list, with the room of one that an earlier command on this thread gave
/// back if there is one. A rewrite or a restore of a long transcript lists it several
/// times (the list after the splice, its chain values, the fold's list): 1.6 MB each at
/// 50,000 messages. Buffers that fresh allocations would take from the system each time
/// (the system allocator gives memory back past its trim threshold, and touching it
/// again costs a page fault per 4 KiB) are kept instead: at most [`SPARES_MAX`] per kind
/// and thread, none over [`SPARE_BYTES_MAX`].
pub(crate) fn spare_ids() -> Vec<ContentId> {
    SPARES.with(|s| s.borrow_mut().ids.pop()).unwrap_or_default()
}

/// [`spare_ids`], starting with `first`.
pub(crate) fn spare_ids_from(first: &[ContentId]) -> Vec<ContentId> {
    let mut ids = spare_ids();
    ids.extend_from_slice(first);
    ids
}

/// Gives a list back for [`spare_ids`].
pub(crate) fn recycle_ids(v: Vec<ContentId>) {
    recycle(v, |s| &mut s.ids);
}

/// [`spare_ids`] for chain values.
fn spare_chains() -> Vec<RevisionId> {
    SPARES.with(|s| s.borrow_mut().chains.pop()).unwrap_or_default()
}

/// Gives a list of chain values back for [`spare_chains`].
fn recycle_chains(v: Vec<RevisionId>) {
    recycle(v, |s| &mut s.chains);
}

/// Keeps `v`, emptied, in the pool `pool` picks, if it is worth keeping and the pool
/// has room.
fn recycle<T>(mut v: Vec<T>, pool: fn(&mut Spares) -> &mut Vec<Vec<T>>) {
    if keep(v.capacity() * std::mem::size_of::<T>()) {
        v.clear();
        SPARES.with(|s| {
            let mut s = s.borrow_mut();
            let pool = pool(&mut s);
            if pool.len() < SPARES_MAX {
                pool.push(v);
            }
        });
    }
}

/// Whether a buffer of `bytes` is worth keeping: a list of [`REMEMBER_MIN`] ids or more,
/// and at most [`SPARE_BYTES_MAX`].
fn keep(bytes: usize) -> bool {
    (REMEMBER_MIN * ID..=SPARE_BYTES_MAX).contains(&bytes)
}

/// How many of the first and of the last of a session's `len` positions hold the same
/// ids as `other`'s: the common prefix, then the common suffix of what is left after it
/// (so that the two never overlap). Reads the transcript a chunk at a time from each
/// end, and stops at the first difference, instead of listing it whole.
pub(crate) fn common_ends<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    len: u64,
    other: &[ContentId],
) -> Result<(usize, usize)> {
    let shared = len.min(other.len() as u64);
    let mut buf = Vec::with_capacity(CHUNK as usize);
    let mut prefix = 0u64;
    'forward: while prefix < shared {
        let end = ((prefix / CHUNK + 1) * CHUNK).min(shared);
        buf.clear();
        ids_into(store, session, prefix, end, &mut buf)?;
        for (i, id) in buf.iter().enumerate() {
            if *id != other[prefix as usize + i] {
                prefix += i as u64;
                break 'forward;
            }
        }
        prefix = end;
    }
    let room = shared - prefix;
    let mut suffix = 0u64;
    'backward: while suffix < room {
        // Positions `from..to` of the session, the chunk that holds `len - suffix - 1`.
        let to = len - suffix;
        let from = ((to - 1) / CHUNK * CHUNK).max(len - room);
        buf.clear();
        ids_into(store, session, from, to, &mut buf)?;
        for (i, id) in buf.iter().rev().enumerate() {
            if *id != other[other.len() - 1 - (suffix as usize + i)] {
                suffix += i as u64;
                break 'backward;
            }
        }
        suffix += to - from;
    }
    Ok((prefix as usize, suffix as usize))
}

/// The chain values after each of `ids`, chaining from `base`: `base.extend(ids[0])`, and
/// so on. A pure function. When the list [`remember_chain`] kept on this thread ends with
/// `ids`, and its chain value before them is `base` (the same input, compared in full
/// rather than trusted), its values are taken instead of hashing again, and the list is
/// forgotten.
pub(crate) fn chain_over(base: RevisionId, ids: &[ContentId]) -> Vec<RevisionId> {
    if ids.len() >= REMEMBER_MIN {
        let taken = REMEMBERED.with(|r| {
            let mut r = r.borrow_mut();
            let m = r.as_ref()?;
            let skip = m.ids.len().checked_sub(ids.len())?;
            let before = if skip == 0 { m.base } else { m.chains[skip - 1] };
            if before != base || m.ids[skip..] != *ids {
                return None;
            }
            let Remembered { ids, mut chains, .. } = r.take()?;
            recycle_ids(ids);
            chains.drain(..skip);
            Some(chains)
        });
        if let Some(chains) = taken {
            return chains;
        }
    }
    hash_chain(base, ids)
}

/// The chain values after each of `ids`, chaining from `base`, hashed.
pub(crate) fn hash_chain(base: RevisionId, ids: &[ContentId]) -> Vec<RevisionId> {
    let mut chains = spare_chains();
    chains.reserve_exact(ids.len());
    let mut c = base;
    for id in ids {
        c = c.extend(id);
        chains.push(c);
    }
    chains
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize, salt: u8) -> Vec<ContentId> {
        (0..n).map(|i| ContentId(*blake3::hash(&[(i % 251) as u8, (i / 251) as u8, salt]).as_bytes())).collect()
    }

    /// The common ends the naive way: both lists whole.
    fn naive_ends(a: &[ContentId], b: &[ContentId]) -> (usize, usize) {
        let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let room = a.len().min(b.len()) - prefix;
        let suffix = a.iter().rev().zip(b.iter().rev()).take(room).take_while(|(x, y)| x == y).count();
        (prefix, suffix)
    }

    proptest::proptest! {
        #[test]
        fn common_ends_match_the_whole_lists(
            len in 0usize..700,
            start in 0usize..700,
            cut in 0usize..300,
            inserted in 0usize..300,
            salt in 0u8..3,
        ) {
            let session = SessionId([7; 16]);
            let stored = ids(len, 0);
            let mut store = crate::store::MemStore::default();
            splice(&mut store, &session, 0, 0, 0, RevisionId::empty(), &stored, stored.len()).unwrap();
            let start = start.min(len);
            let end = (start + cut).min(len);
            // The replacement: other ids, or (salt 0) the same ones, so that the ends can
            // run into each other.
            let replacement = match salt {
                0 => stored[start..end].to_vec(),
                s => ids(inserted, s),
            };
            let mut other = stored.clone();
            other.splice(start..end, replacement);
            let got = common_ends(&store, &session, len as u64, &other).unwrap();
            proptest::prop_assert_eq!(got, naive_ends(&stored, &other));
        }
    }

    #[test]
    fn spare_buffers_are_kept_emptied_and_within_bounds() {
        let list = ids(2000, 1);
        let room = list.capacity();
        recycle_ids(list);
        let spare = spare_ids();
        assert!(spare.is_empty());
        assert_eq!(spare.capacity(), room, "the same buffer, emptied");
        // Short lists, and lists over the cap, are not kept.
        recycle_ids(Vec::with_capacity(10));
        assert_eq!(spare_ids().capacity(), 0);
        recycle_ids(Vec::with_capacity(SPARE_BYTES_MAX / ID + 1));
        assert_eq!(spare_ids().capacity(), 0);
        // At most a few a kind.
        for _ in 0..5 {
            recycle_ids(Vec::with_capacity(2000));
            recycle_chains(Vec::with_capacity(2000));
        }
        assert_eq!(SPARES.with(|s| (s.borrow().ids.len(), s.borrow().chains.len())), (SPARES_MAX, SPARES_MAX));
        // A chain hashed into a spare buffer is the same chain.
        let list = ids(1500, 2);
        assert_eq!(hash_chain(RevisionId::empty(), &list).last(), Some(&RevisionId::of(&list)));
    }

    #[test]
    fn remembered_chains_answer_only_the_same_input() {
        let list = ids(3000, 0);
        let base = RevisionId::empty();
        let all = hash_chain(base, &list);
        assert_eq!(remember_chain(base, list.clone()), RevisionId::of(&list));
        // Another base, or another list of the same length: hashed, and the list is kept.
        let other = RevisionId::empty().extend(&list[0]);
        assert_eq!(chain_over(other, &list[1000..]), hash_chain(other, &list[1000..]));
        let mut changed = list[1000..].to_vec();
        changed[1500] = ids(1, 9)[0];
        assert_eq!(chain_over(all[999], &changed), hash_chain(all[999], &changed));
        // A suffix from the chain value before it: the kept values, taken once.
        assert_eq!(chain_over(all[999], &list[1000..]), all[1000..].to_vec());
        assert!(REMEMBERED.with(|r| r.borrow().is_none()));
        assert_eq!(chain_over(all[999], &list[1000..]), all[1000..].to_vec());
        // A short list is not kept.
        assert_eq!(remember_chain(base, list[..10].to_vec()), RevisionId::of(&list[..10]));
        assert!(REMEMBERED.with(|r| r.borrow().is_none()));
    }
}
