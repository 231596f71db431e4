//! The transcript projection's rows: a session's current transcript stored in chunks of
//! [`CHUNK`] positions, so that a fork copies, a rewrite rewrites and a page reads one row
//! per 64 messages instead of one row per message, while a turn still writes only its own
//! messages.
//!
//! A full chunk `k` (positions `64k .. 64k + 64`, all below the transcript's length) is
//! one row under `session ‖ k` (u64 big-endian): 64 entries of 64 bytes, with no other
//! framing. The last chunk, while it is not full, is kept as one row per position under
//! `session ‖ k ‖ offset` (one byte, `0..63`), each a single entry. An entry is the
//! message's content id (32 bytes), then the chain value `c(position + 1)` (32 bytes).
//! The turn that fills a chunk replaces its single rows with the chunk's row.
//! `docs/design.md` §5 has the layout with the other tables.

use crate::error::{Error, Location, Result};
use crate::projection::TranscriptRow;
use crate::store::{hex, keys, Store, Table};
use annal_codec::{ContentId, RevisionId, SessionId};

/// Positions per chunk.
pub const CHUNK: u64 = 64;

/// Bytes per entry: content id, then chain value.
const ENTRY: usize = 64;

fn key(session: &SessionId, chunk: u64) -> Vec<u8> {
    keys::session_u64(session, chunk)
}

fn single_key(session: &SessionId, pos: u64) -> Vec<u8> {
    let mut k = keys::session_u64(session, pos / CHUNK);
    k.push((pos % CHUNK) as u8);
    k
}

fn corrupt(key: &[u8], detail: &str) -> Error {
    Error::corrupt(Location::Projection { table: Table::Transcript.name(), key: hex(key) }, detail)
}

/// Reads full chunk `chunk` of `session`; `None` when it is not stored as a full chunk. A
/// value that is not 64 entries is `Corrupt`.
fn read_chunk<S: Store + ?Sized>(store: &S, session: &SessionId, chunk: u64) -> Result<Option<Vec<u8>>> {
    let k = key(session, chunk);
    match store.get(Table::Transcript, &k)? {
        None => Ok(None),
        Some(bytes) if bytes.len() != CHUNK as usize * ENTRY => Err(corrupt(&k, "transcript chunk is not 64 entries")),
        Some(bytes) => Ok(Some(bytes)),
    }
}

/// Reads the single row at `pos` into `out`.
fn read_single<S: Store + ?Sized>(store: &S, session: &SessionId, pos: u64, out: &mut Vec<u8>) -> Result<()> {
    let k = single_key(session, pos);
    match store.get(Table::Transcript, &k)? {
        None => Err(corrupt(&k, "missing row")),
        Some(bytes) if bytes.len() != ENTRY => Err(corrupt(&k, "transcript row is not one entry")),
        Some(bytes) => {
            out.extend_from_slice(&bytes);
            Ok(())
        }
    }
}

/// The entries of positions `from..to` (all inside one chunk), as bytes.
fn read_entries<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    from: u64,
    to: u64,
    out: &mut Vec<u8>,
) -> Result<()> {
    let chunk = from / CHUNK;
    match read_chunk(store, session, chunk)? {
        Some(bytes) => {
            let (a, b) = ((from - chunk * CHUNK) as usize, (to - chunk * CHUNK) as usize);
            out.extend_from_slice(&bytes[a * ENTRY..b * ENTRY]);
        }
        None => {
            for pos in from..to {
                read_single(store, session, pos, out)?;
            }
        }
    }
    Ok(())
}

fn entry(bytes: &[u8]) -> TranscriptRow {
    let mut content = [0u8; 32];
    let mut chain = [0u8; 32];
    content.copy_from_slice(&bytes[..32]);
    chain.copy_from_slice(&bytes[32..ENTRY]);
    TranscriptRow { content: ContentId(content), chain: RevisionId(chain) }
}

fn push_entry(out: &mut Vec<u8>, content: &ContentId, chain: &RevisionId) {
    out.extend_from_slice(&content.0);
    out.extend_from_slice(&chain.0);
}

/// The rows at positions `from..to` of `session`'s current transcript. A position that
/// is not stored is `Corrupt` ("missing row").
pub fn rows<S: Store + ?Sized>(store: &S, session: &SessionId, from: u64, to: u64) -> Result<Vec<TranscriptRow>> {
    let mut bytes = Vec::with_capacity(to.saturating_sub(from).min(1 << 16) as usize * ENTRY);
    let mut pos = from;
    while pos < to {
        let end = ((pos / CHUNK + 1) * CHUNK).min(to);
        read_entries(store, session, pos, end, &mut bytes)?;
        pos = end;
    }
    Ok(bytes.chunks_exact(ENTRY).map(entry).collect())
}

/// The row at `pos` of `session`'s current transcript.
pub fn row<S: Store + ?Sized>(store: &S, session: &SessionId, pos: u64) -> Result<TranscriptRow> {
    Ok(rows(store, session, pos, pos + 1)?[0])
}

/// The chain value over the first `len` messages: `c(len)`.
pub fn chain_at<S: Store + ?Sized>(store: &S, session: &SessionId, len: u64) -> Result<RevisionId> {
    match len {
        0 => Ok(RevisionId::empty()),
        n => Ok(row(store, session, n - 1)?.chain),
    }
}

/// Stores `entries`, the bytes of positions `from..` of chunk `chunk` of `session`,
/// for a transcript `new_len` long: as the chunk's row when the chunk is full (then
/// `entries` is the whole chunk), else as single rows.
fn write_chunk<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    chunk: u64,
    from: u64,
    entries: &[u8],
    new_len: u64,
) -> Result<()> {
    if new_len >= (chunk + 1) * CHUNK {
        debug_assert_eq!(from, chunk * CHUNK);
        return store.put(Table::Transcript, &key(session, chunk), entries);
    }
    for (i, e) in entries.chunks_exact(ENTRY).enumerate() {
        store.put(Table::Transcript, &single_key(session, from + i as u64), e)?;
    }
    Ok(())
}

/// Removes what stores positions `from..to` (inside chunk `chunk`) of a transcript that
/// was `old_len` long.
fn remove_chunk<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    chunk: u64,
    from: u64,
    to: u64,
    old_len: u64,
) -> Result<()> {
    if old_len >= (chunk + 1) * CHUNK {
        return store.remove(Table::Transcript, &key(session, chunk));
    }
    for pos in from..to {
        store.remove(Table::Transcript, &single_key(session, pos))?;
    }
    Ok(())
}

/// Replaces positions `start..old_len` of `session`'s transcript with `messages`,
/// chaining from `chain` (the chain value `c(start)`), and returns the final chain value.
/// Only the chunks from the one holding `start` on are read or written; what stored
/// positions past the new end is removed.
pub(crate) fn splice<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    start: u64,
    old_len: u64,
    mut chain: RevisionId,
    messages: &[ContentId],
) -> Result<RevisionId> {
    let new_len = start + messages.len() as u64;
    let first = start / CHUNK;
    let first_start = first * CHUNK;
    let old_full = old_len >= (first + 1) * CHUNK;
    let new_full = new_len >= (first + 1) * CHUNK;
    // The positions of the first chunk before `start` stay. They are rewritten with the
    // rest of the chunk only when the chunk changes form (partial to full, or back);
    // a partial chunk that stays partial keeps its single rows.
    let mut buf = Vec::with_capacity(CHUNK as usize * ENTRY);
    let mut from = start;
    if start > first_start && (old_full || new_full) {
        read_entries(store, session, first_start, start, &mut buf)?;
        from = first_start;
    }
    // Remove what stored the old positions from the first chunk on (the first chunk's
    // kept single rows stay when it stays partial).
    let old_chunks = old_len.div_ceil(CHUNK);
    for chunk in first..old_chunks {
        let lo = if chunk == first { from } else { chunk * CHUNK };
        remove_chunk(store, session, chunk, lo, old_len.min((chunk + 1) * CHUNK), old_len)?;
    }
    let chains = chain_over(chain, messages);
    let mut chunk = first;
    for (content, c) in messages.iter().zip(&chains) {
        chain = *c;
        push_entry(&mut buf, content, &chain);
        if from + (buf.len() / ENTRY) as u64 == (chunk + 1) * CHUNK {
            write_chunk(store, session, chunk, from, &buf, new_len)?;
            buf.clear();
            chunk += 1;
            from = chunk * CHUNK;
        }
    }
    if !buf.is_empty() {
        write_chunk(store, session, chunk, from, &buf, new_len)?;
    }
    Ok(chain)
}

/// Copies the first `len` positions of `from`'s transcript to `to` (a fork): full chunks
/// byte for byte (the chain values of a prefix do not depend on the session), the last
/// partial one as single rows.
pub(crate) fn copy_prefix<S: Store + ?Sized>(store: &mut S, from: &SessionId, to: &SessionId, len: u64) -> Result<()> {
    for chunk in 0..len.div_ceil(CHUNK) {
        let end = len.min((chunk + 1) * CHUNK);
        let mut buf = Vec::with_capacity(CHUNK as usize * ENTRY);
        read_entries(store, from, chunk * CHUNK, end, &mut buf)?;
        write_chunk(store, to, chunk, chunk * CHUNK, &buf, len)?;
    }
    Ok(())
}

/// Lists at least this long have their chain values remembered by [`chain_over`].
const REMEMBER_MIN: usize = 1024;

/// The chain values of the last long list [`chain_over`] hashed on this thread.
struct Remembered {
    base: RevisionId,
    ids: Vec<ContentId>,
    chains: Vec<RevisionId>,
}

thread_local! {
    static REMEMBERED: std::cell::RefCell<Option<Remembered>> = const { std::cell::RefCell::new(None) };
}

/// The chain values after each of `ids`, chaining from `base`: `base.extend(ids[0])`, and
/// so on. A pure function, cached for long lists: `decide` hashes the list a rewrite or
/// a restore leaves behind its splice (up to the whole transcript, 5 ms for 50,000
/// messages), and the fold of the event it decided, on the same thread, hashes the same
/// list again. The cache holds the last long list hashed on the thread and answers a
/// request whose `ids` are a suffix of it and whose `base` is the chain value before that
/// suffix: the same input, so the same output, compared in full rather than trusted.
pub(crate) fn chain_over(base: RevisionId, ids: &[ContentId]) -> Vec<RevisionId> {
    if ids.len() < REMEMBER_MIN {
        return hash_chain(base, ids);
    }
    let hit = REMEMBERED.with(|r| {
        let r = r.borrow();
        let m = r.as_ref()?;
        let skip = m.ids.len().checked_sub(ids.len())?;
        let before = if skip == 0 { m.base } else { m.chains[skip - 1] };
        (before == base && m.ids[skip..] == *ids).then(|| m.chains[skip..].to_vec())
    });
    if let Some(chains) = hit {
        return chains;
    }
    let chains = hash_chain(base, ids);
    REMEMBERED.with(|r| *r.borrow_mut() = Some(Remembered { base, ids: ids.to_vec(), chains: chains.clone() }));
    chains
}

fn hash_chain(base: RevisionId, ids: &[ContentId]) -> Vec<RevisionId> {
    let mut chains = Vec::with_capacity(ids.len());
    let mut c = base;
    for id in ids {
        c = c.extend(id);
        chains.push(c);
    }
    chains
}

/// The chain value after `ids`, chaining from `base` (through [`chain_over`]'s cache).
pub(crate) fn chain_end(base: RevisionId, ids: &[ContentId]) -> RevisionId {
    match ids.len() {
        n if n < REMEMBER_MIN => base.extend_all(ids),
        _ => chain_over(base, ids).last().copied().unwrap_or(base),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize, salt: u8) -> Vec<ContentId> {
        (0..n).map(|i| ContentId(*blake3::hash(&[(i % 251) as u8, (i / 251) as u8, salt]).as_bytes())).collect()
    }

    #[test]
    fn remembered_chains_answer_only_the_same_input() {
        let list = ids(3000, 0);
        let base = RevisionId::empty();
        let all = chain_over(base, &list);
        assert_eq!(all, hash_chain(base, &list));
        // A suffix from the chain value before it: the cached values.
        assert_eq!(chain_over(all[999], &list[1000..]), hash_chain(all[999], &list[1000..]));
        // The same suffix from another base, or another list of the same length: hashed.
        let other = RevisionId::empty().extend(&list[0]);
        assert_eq!(chain_over(other, &list[1000..]), hash_chain(other, &list[1000..]));
        let mut changed = list[1000..].to_vec();
        changed[1500] = ids(1, 9)[0];
        assert_eq!(chain_over(all[999], &changed), hash_chain(all[999], &changed));
        assert_eq!(chain_end(base, &list), RevisionId::of(&list));
        assert_eq!(chain_end(base, &list[..10]), RevisionId::of(&list[..10]));
    }
}
