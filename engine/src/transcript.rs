//! The transcript projection's rows: a session's current transcript as chunks of runs,
//! each naming its messages by the record whose event holds their ids, and its chain
//! values every 128 positions.
//!
//! - **Runs.** A record's *message list* ([`message_list`]) is the ids its event puts into
//!   a transcript: a creation's root messages, a turn's messages, a rewrite's replacement.
//!   Every position of a transcript holds an id of some record's list, and a run
//!   `(seq, start, count)` names the positions that hold ids `start .. start + count` of
//!   the list of the record at `seq`. Chunk `k` (positions `128k .. 128k + 128`, fewer
//!   for the last) is one row of [`Table::Transcript`] under `session ‖ k` (u64
//!   big-endian): its runs in order, each as three LEB128 varints in their shortest form
//!   (seq, start, count of at least 1), a run that continues the one before it merged
//!   into it, a run that crosses a chunk's end cut there. A turn appends a run of about 5
//!   bytes where version 3 stored 32 bytes an id. (Version 3 held the ids themselves,
//!   128 to a row, the last chunk in pieces of 32; version 2 a row per position of the
//!   last chunk; version 1 one `TranscriptRow { content, chain }` per position.)
//! - **Chain values.** Checkpoint `j` is `c(128 (j + 1))`, the chain value over the first
//!   `128 (j + 1)` messages, for every such prefix of the transcript. Row `b` of
//!   [`Table::TranscriptChains`], under `session ‖ b` (u64 big-endian), holds checkpoints
//!   `64b ..` (at most 64), 32 bytes each, no other framing. The chain value at any
//!   position is the checkpoint before it extended over at most 127 ids.
//!
//! Ids are read from the records the runs name ([`Store::message_list`]): the view's
//! (the journal's rows in memory, else the log file, through the engine's list cache),
//! the batch's own while `decide` and `evolve` work on it. A store of projection rows
//! alone cannot read them ([`Error::Storage`]). A record never changes under its seq, so
//! a fork copies its parent's chunk rows byte for byte.
//!
//! A turn rewrites the last chunk's row (about 5 bytes a run, a run a turn), and every
//! 128 messages adds a checkpoint. An edit that keeps the length rewrites the chunks it
//! touches and the checkpoints after it (32 bytes per 128 later positions); a splice that
//! moves positions rewrites the chunks from its start. `docs/design.md` §5 has the layout
//! with the other tables.

use crate::error::{Error, Location, Result};
use crate::projection::TranscriptRow;
use crate::store::{hex, keys, Store, Table};
use annal_codec::{ContentId, Event, RevisionId, SessionId};
use std::sync::Arc;

/// Positions per chunk, and between two checkpoints.
pub const CHUNK: u64 = 128;

/// Checkpoints per row of [`Table::TranscriptChains`].
pub const CHECKPOINTS_PER_ROW: u64 = 64;

/// Bytes per chain value.
const ID: usize = 32;

/// The ids `event` puts into its session's transcript, in order: a creation's root
/// messages (after a fork's prefix), a turn's messages, a rewrite's replacement. `None`
/// for an event that changes no transcript.
pub fn message_list(event: &Event) -> Option<&[ContentId]> {
    match event {
        Event::SessionCreated(e) => Some(&e.messages),
        Event::TurnCommitted(e) => Some(&e.messages),
        Event::TranscriptRewritten(e) => Some(&e.replacement),
        _ => None,
    }
}

/// The message list of `record` ([`message_list`]) as the stores hand it out: empty for
/// an event that has none.
pub(crate) fn list_of(record: &annal_codec::Record) -> Arc<[ContentId]> {
    Arc::from(message_list(&record.event).unwrap_or_default())
}

/// Positions that hold ids `start .. start + count` of the message list of the record
/// at `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    /// The record whose message list holds the ids.
    pub seq: u64,
    /// The first id's index in that list.
    pub start: u64,
    /// How many ids (at least 1).
    pub count: u64,
}

fn key(session: &SessionId, chunk: u64) -> Vec<u8> {
    keys::session_u64(session, chunk)
}

fn corrupt(table: Table, key: &[u8], detail: &str) -> Error {
    Error::corrupt(Location::Projection { table: table.name(), key: hex(key) }, detail)
}

/// Positions chunk `chunk` holds in a transcript `len` long.
fn held(chunk: u64, len: u64) -> u64 {
    len.saturating_sub(chunk * CHUNK).min(CHUNK)
}

/// Writes `n` as a LEB128 varint ([`crate::buckets::put_varint`]).
fn put_varint(out: &mut Vec<u8>, n: u64) {
    crate::buckets::put_varint(out, n as usize);
}

/// Reads a LEB128 varint in its shortest form, advancing `rest`
/// ([`crate::buckets::read_varint`]).
fn read_varint(rest: &mut &[u8]) -> Option<u64> {
    crate::buckets::read_varint(rest).map(|n| n as u64)
}

/// Appends `run` to `runs`, merged into the last one when it continues it.
fn push_run(runs: &mut Vec<Run>, run: Run) {
    if let Some(last) = runs.last_mut() {
        if last.seq == run.seq && last.start + last.count == run.start {
            last.count += run.count;
            return;
        }
    }
    runs.push(run);
}

/// A chunk's row: its runs as varint triples.
fn encode_chunk(runs: &[Run]) -> Vec<u8> {
    let mut out = Vec::with_capacity(runs.len() * 6);
    for r in runs {
        put_varint(&mut out, r.seq);
        put_varint(&mut out, r.start);
        put_varint(&mut out, r.count);
    }
    out
}

/// Appends the runs of chunk row `bytes` (at `k`) to `runs`, as stored, and returns the
/// positions they hold: whole varint triples, each run at least 1 position long and
/// within a list's reach, at most [`CHUNK`] positions in all and at least one.
fn decode_chunk(k: &[u8], bytes: &[u8], runs: &mut Vec<Run>) -> Result<u64> {
    let mut rest = bytes;
    let mut total = 0u64;
    while !rest.is_empty() {
        let run = match (read_varint(&mut rest), read_varint(&mut rest), read_varint(&mut rest)) {
            (Some(seq), Some(start), Some(count)) if count > 0 && start.checked_add(count).is_some() => {
                Run { seq, start, count }
            }
            _ => return Err(corrupt(Table::Transcript, k, "transcript chunk is not whole runs")),
        };
        total += run.count.min(CHUNK + 1);
        if total > CHUNK {
            return Err(corrupt(Table::Transcript, k, "transcript chunk holds more than 128 positions"));
        }
        runs.push(run);
    }
    if total == 0 {
        return Err(corrupt(Table::Transcript, k, "transcript chunk holds no position"));
    }
    Ok(total)
}

/// Appends the runs of positions `from..to` of `session`'s transcript to `runs`, cut to
/// them and merged where one continues another (across chunks too). A position that is
/// not stored is `Corrupt` ("missing row").
fn runs_into<S: Store + ?Sized>(store: &S, session: &SessionId, from: u64, to: u64, runs: &mut Vec<Run>) -> Result<()> {
    let mut chunk_runs = Vec::new();
    let mut pos = from;
    while pos < to {
        let chunk = pos / CHUNK;
        let k = key(session, chunk);
        chunk_runs.clear();
        let mut n = 0;
        store.read(Table::Transcript, &k, &mut |bytes| {
            if let Some(bytes) = bytes {
                n = decode_chunk(&k, bytes, &mut chunk_runs)?;
            }
            Ok(())
        })?;
        let end = ((chunk + 1) * CHUNK).min(to);
        if chunk * CHUNK + n < end {
            return Err(corrupt(Table::Transcript, &k, "missing row"));
        }
        let mut at = chunk * CHUNK;
        for r in &chunk_runs {
            let (a, b) = (at.max(pos), (at + r.count).min(end));
            if a < b {
                push_run(runs, Run { seq: r.seq, start: r.start + (a - at), count: b - a });
            }
            at += r.count;
            if at >= end {
                break;
            }
        }
        pos = end;
    }
    Ok(())
}

/// Appends the ids `run` names to `out`, from the message list of its record (`last`
/// keeps the list read last, which the next run often names again).
fn run_ids<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    run: &Run,
    last: &mut Option<(u64, Arc<[ContentId]>)>,
    out: &mut Vec<ContentId>,
) -> Result<()> {
    let list = match last {
        Some((seq, list)) if *seq == run.seq => list,
        _ => {
            let list = store.message_list(run.seq)?.ok_or_else(|| {
                Error::storage(format!("the record of a transcript's messages (seq {}) cannot be read here", run.seq))
            })?;
            &mut last.insert((run.seq, list)).1
        }
    };
    let range = usize::try_from(run.start).ok().zip(usize::try_from(run.start + run.count).ok());
    match range.and_then(|(a, b)| list.get(a..b)) {
        Some(ids) => {
            out.extend_from_slice(ids);
            Ok(())
        }
        None => Err(Error::corrupt(
            Location::Projection { table: Table::Transcript.name(), key: hex(&keys::session(session)) },
            format!(
                "a run names ids {}..{} of record {}, which has {}",
                run.start,
                run.start + run.count,
                run.seq,
                list.len()
            ),
        )),
    }
}

/// Writes `runs`, the positions from chunk `first`'s first on, as the rows of chunks
/// `first ..`: each run cut where a chunk ends.
fn store_runs<S: Store + ?Sized>(store: &mut S, session: &SessionId, first: u64, runs: &[Run]) -> Result<()> {
    let mut chunk = first;
    let mut row: Vec<Run> = Vec::new();
    let mut room = CHUNK;
    for r in runs {
        let mut r = *r;
        while r.count > 0 {
            let n = r.count.min(room);
            row.push(Run { seq: r.seq, start: r.start, count: n });
            r.start += n;
            r.count -= n;
            room -= n;
            if room == 0 {
                store.put_vec(Table::Transcript, &key(session, chunk), encode_chunk(&row))?;
                row.clear();
                room = CHUNK;
                chunk += 1;
            }
        }
    }
    if !row.is_empty() {
        store.put_vec(Table::Transcript, &key(session, chunk), encode_chunk(&row))?;
    }
    Ok(())
}

/// Appends `run` to `session`'s transcript, `len` long: a turn. The last chunk's row
/// takes it at its end without being decoded (merged into its last run when it
/// continues it); a run that fills the chunk goes on in new ones.
fn append_run<S: Store + ?Sized>(store: &mut S, session: &SessionId, len: u64, mut run: Run) -> Result<()> {
    let mut pos = len;
    while run.count > 0 {
        let chunk = pos / CHUNK;
        let n = run.count.min((chunk + 1) * CHUNK - pos);
        let piece = Run { count: n, ..run };
        let k = key(session, chunk);
        if pos == chunk * CHUNK {
            store.put_vec(Table::Transcript, &k, encode_chunk(&[piece]))?;
        } else if !store
            .update_in_place(Table::Transcript, &k, &mut |bytes| append_to_chunk(&k, bytes, piece).map(|()| true))?
        {
            // Not in a buffer of the store's own (the row is in the file, or shared
            // with readers): a copy, written back.
            let mut bytes =
                store.get(Table::Transcript, &k)?.ok_or_else(|| corrupt(Table::Transcript, &k, "missing row"))?;
            append_to_chunk(&k, &mut bytes, piece)?;
            store.put_vec(Table::Transcript, &k, bytes)?;
        }
        run.start += n;
        run.count -= n;
        pos += n;
    }
    Ok(())
}

/// Appends `run` to chunk row `bytes` (at `k`), merged into the row's last run when it
/// continues it. The last run is found from the row's end (a varint ends at its first
/// byte below 0x80), so the row is not decoded. A row that is not whole runs is
/// `Corrupt`, and left as it was.
fn append_to_chunk(k: &[u8], bytes: &mut Vec<u8>, run: Run) -> Result<()> {
    let not_runs = || corrupt(Table::Transcript, k, "transcript chunk is not whole runs");
    // Where each of the last three varints starts.
    let mut starts = [0usize; 3];
    let mut end = bytes.len();
    for slot in starts.iter_mut().rev() {
        if end == 0 || bytes[end - 1] >= 0x80 {
            return Err(not_runs());
        }
        let mut at = end - 1;
        while at > 0 && bytes[at - 1] >= 0x80 {
            at -= 1;
        }
        *slot = at;
        end = at;
    }
    let mut rest = &bytes[starts[0]..];
    let last = match (read_varint(&mut rest), read_varint(&mut rest), read_varint(&mut rest)) {
        (Some(seq), Some(start), Some(count)) if rest.is_empty() => Run { seq, start, count },
        _ => return Err(not_runs()),
    };
    if last.seq == run.seq && last.start.checked_add(last.count) == Some(run.start) {
        bytes.truncate(starts[2]);
        put_varint(bytes, last.count + run.count);
    } else {
        put_varint(bytes, run.seq);
        put_varint(bytes, run.start);
        put_varint(bytes, run.count);
    }
    Ok(())
}

fn id_of(bytes: &[u8]) -> [u8; 32] {
    let mut a = [0u8; 32];
    a.copy_from_slice(bytes);
    a
}

/// The content ids at positions `from..to` of `session`'s current transcript. A position
/// that is not stored is `Corrupt` ("missing row"); a store that cannot read the log
/// cannot answer ([`Error::Storage`]).
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
    let mut runs = Vec::new();
    runs_into(store, session, from, to, &mut runs)?;
    let mut last = None;
    for run in &runs {
        run_ids(store, session, run, &mut last, out)?;
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
    if from >= to {
        return Ok(Vec::new());
    }
    // The ids from the checkpoint before `from` on, read in one pass: the first ones
    // only chain up to `from`.
    let whole = from / CHUNK;
    let mut chain = match whole {
        0 => RevisionId::empty(),
        n => checkpoint(store, session, n - 1)?,
    };
    let ids = ids(store, session, whole * CHUNK, to)?;
    let (before, page) = ids.split_at((from - whole * CHUNK) as usize);
    chain = chain.extend_all(before);
    Ok(page
        .iter()
        .map(|content| {
            chain = chain.extend(content);
            TranscriptRow { content: *content, chain }
        })
        .collect())
}

/// The row at `pos` of `session`'s current transcript.
pub fn row<S: Store + ?Sized>(store: &S, session: &SessionId, pos: u64) -> Result<TranscriptRow> {
    rows(store, session, pos, pos + 1)?
        .pop()
        .ok_or_else(|| corrupt(Table::Transcript, &key(session, pos / CHUNK), "missing row"))
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
/// positions of `inserted` (none for an empty replacement), chaining from `chain` (the
/// chain value `c(start)`) over `after`: the ids from `start` on once spliced (the
/// inserted run's, then those of `end..old_len`). Returns the final chain value. A splice
/// that keeps the length writes only the chunks of the replaced positions; one that moves
/// positions rewrites the chunks from `start` on. Either way the checkpoints after
/// `start` change.
#[allow(clippy::too_many_arguments)]
pub(crate) fn splice<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    start: u64,
    end: u64,
    old_len: u64,
    chain: RevisionId,
    inserted: Option<Run>,
    after: &[ContentId],
) -> Result<RevisionId> {
    let count = inserted.map_or(0, |r| r.count);
    let new_len = start + after.len() as u64;
    if start > end || end > old_len || new_len != old_len - (end - start) + count {
        return Err(Error::storage(format!(
            "a splice of {start}..{end} of {old_len} positions by {count} does not leave {new_len}"
        )));
    }
    let first = start / CHUNK;
    // When the length does not change, positions after `end` keep their place: only the
    // chunks of `start..end` are written again.
    let same = count == end - start;
    if let (true, Some(run)) = (start == old_len, inserted) {
        append_run(store, session, old_len, run)?;
    } else if !(same && count == 0) {
        let stop = if same { (end.div_ceil(CHUNK) * CHUNK).min(old_len) } else { old_len };
        let mut runs = Vec::new();
        runs_into(store, session, first * CHUNK, start, &mut runs)?;
        if let Some(r) = inserted {
            push_run(&mut runs, r);
        }
        runs_into(store, session, end, stop, &mut runs)?;
        store_runs(store, session, first, &runs)?;
        if !same {
            for stale in new_len.div_ceil(CHUNK)..old_len.div_ceil(CHUNK) {
                store.remove(Table::Transcript, &key(session, stale))?;
            }
        }
    }
    let chains = chain_over(chain, after);
    set_checkpoints(store, session, start, old_len, new_len, &chains)?;
    let end = chains.last().copied().unwrap_or(chain);
    recycle_chains(chains);
    Ok(end)
}

/// Copies the first `len` positions of `from`'s transcript to `to` (a fork): full chunks
/// and checkpoint rows byte for byte (runs and the chain values of a prefix do not depend
/// on the session), the last partial chunk cut, the last checkpoint row cut.
pub(crate) fn copy_prefix<S: Store + ?Sized>(store: &mut S, from: &SessionId, to: &SessionId, len: u64) -> Result<()> {
    let mut runs = Vec::new();
    for chunk in 0..len.div_ceil(CHUNK) {
        let n = held(chunk, len);
        let k = key(from, chunk);
        let bytes = store.get(Table::Transcript, &k)?.ok_or_else(|| corrupt(Table::Transcript, &k, "missing row"))?;
        runs.clear();
        let total = decode_chunk(&k, &bytes, &mut runs)?;
        if total < n {
            return Err(corrupt(Table::Transcript, &k, "missing row"));
        }
        if total == n {
            store.put_vec(Table::Transcript, &key(to, chunk), bytes)?;
            continue;
        }
        let mut cut = Vec::with_capacity(runs.len());
        let mut room = n;
        for r in &runs {
            if room == 0 {
                break;
            }
            let count = r.count.min(room);
            cut.push(Run { count, ..*r });
            room -= count;
        }
        store.put_vec(Table::Transcript, &key(to, chunk), encode_chunk(&cut))?;
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
    use crate::store::WithRecords;

    fn ids(n: usize, salt: u8) -> Vec<ContentId> {
        (0..n).map(|i| ContentId(*blake3::hash(&[(i % 251) as u8, (i / 251) as u8, salt]).as_bytes())).collect()
    }

    /// The message lists of the records the runs name, by seq.
    #[derive(Default)]
    struct Lists(std::collections::HashMap<u64, Arc<[ContentId]>>);

    impl crate::store::Records for Lists {
        fn record(&self, _: u64) -> Result<Option<annal_codec::Record>> {
            Ok(None)
        }
        fn message_list(&self, seq: u64) -> Result<Option<Arc<[ContentId]>>> {
            Ok(self.0.get(&seq).cloned())
        }
    }

    /// Projection rows, and the lists they name.
    #[derive(Default)]
    struct Listed {
        rows: crate::store::MemStore,
        lists: Lists,
    }

    impl Listed {
        fn read(&self) -> WithRecords<'_, crate::store::MemStore> {
            WithRecords::read(&self.rows, &self.lists)
        }

        fn write(&mut self) -> WithRecords<'_, crate::store::MemStore> {
            WithRecords::write(&mut self.rows, &self.lists)
        }

        /// Splices `list`, the message list of a new record at `seq`, over `start..end`
        /// of the transcript (`len` long, whose ids are `model`), as the fold does.
        fn splice(
            &mut self,
            session: &SessionId,
            seq: u64,
            start: usize,
            end: usize,
            list: Vec<ContentId>,
            model: &mut Vec<ContentId>,
        ) {
            let len = model.len() as u64;
            let inserted = (!list.is_empty()).then_some(Run { seq, start: 0, count: list.len() as u64 });
            self.lists.0.insert(seq, list.clone().into());
            let mut after = list.clone();
            after.extend_from_slice(&model[end..]);
            let base = chain_at(&self.read(), session, start as u64).unwrap();
            let chain =
                splice(&mut self.write(), session, start as u64, end as u64, len, base, inserted, &after).unwrap();
            model.splice(start..end, list);
            assert_eq!(chain, RevisionId::of(model));
        }

        /// Every chunk row of `session`: its runs.
        fn chunks(&self, session: &SessionId) -> Vec<Vec<Run>> {
            let mut out = Vec::new();
            for chunk in 0.. {
                let k = key(session, chunk);
                let Some(bytes) = self.rows.get(Table::Transcript, &k).unwrap() else { break };
                let mut runs = Vec::new();
                decode_chunk(&k, &bytes, &mut runs).unwrap();
                out.push(runs);
            }
            out
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Appends this many new ids.
        Append(usize),
        /// Replaces positions `a..b` (taken modulo the length) with this many new ids.
        Replace(usize, usize, usize),
        /// Replaces positions `a..a + n` with as many new ids.
        Overwrite(usize, usize),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0usize..300).prop_map(Op::Append),
            (0usize..1000, 0usize..400, 0usize..200).prop_map(|(a, n, k)| Op::Replace(a, n, k)),
            (0usize..1000, 1usize..200).prop_map(|(a, n)| Op::Overwrite(a, n)),
        ]
    }

    proptest::proptest! {
        #[test]
        fn runs_hold_what_a_list_holds(ops in proptest::collection::vec(op(), 1..12), fork_at in 0usize..2000) {
            let session = SessionId([7; 16]);
            let mut store = Listed::default();
            let mut model = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let seq = i as u64 + 1;
                let fresh = |n: usize| ids(n, seq as u8);
                let len = model.len();
                match *op {
                    Op::Append(n) => store.splice(&session, seq, len, len, fresh(n), &mut model),
                    Op::Replace(a, n, k) => {
                        let a = if len == 0 { 0 } else { a % (len + 1) };
                        let b = (a + n).min(len);
                        store.splice(&session, seq, a, b, fresh(k), &mut model);
                    }
                    Op::Overwrite(a, n) if len > 0 => {
                        let a = a % len;
                        let b = (a + n).min(len);
                        store.splice(&session, seq, a, b, fresh(b - a), &mut model);
                    }
                    Op::Overwrite(..) => {}
                }
                let got = super::ids(&store.read(), &session, 0, model.len() as u64).unwrap();
                proptest::prop_assert_eq!(&got, &model);
                // Every chunk but the last holds 128 positions, none holds runs that one
                // run would hold, and no chunk past the end is left.
                let chunks = store.chunks(&session);
                proptest::prop_assert_eq!(chunks.len() as u64, (model.len() as u64).div_ceil(CHUNK));
                for (k, runs) in chunks.iter().enumerate() {
                    let n: u64 = runs.iter().map(|r| r.count).sum();
                    proptest::prop_assert_eq!(n, held(k as u64, model.len() as u64));
                    for w in runs.windows(2) {
                        proptest::prop_assert!(!(w[0].seq == w[1].seq && w[0].start + w[0].count == w[1].start));
                    }
                }
                for p in [0, model.len() / 3, model.len() / 2, model.len()] {
                    proptest::prop_assert_eq!(chain_at(&store.read(), &session, p as u64).unwrap(), RevisionId::of(&model[..p]));
                }
            }
            // A fork's prefix: the same ids, and the chunks of the parent's full ones byte for byte.
            let child = SessionId([8; 16]);
            let n = fork_at.min(model.len());
            copy_prefix(&mut store.write(), &session, &child, n as u64).unwrap();
            proptest::prop_assert_eq!(super::ids(&store.read(), &child, 0, n as u64).unwrap(), model[..n].to_vec());
            proptest::prop_assert_eq!(chain_at(&store.read(), &child, n as u64).unwrap(), RevisionId::of(&model[..n]));
        }
    }

    #[test]
    fn an_append_that_continues_the_last_run_merges_into_it() {
        let session = SessionId([7; 16]);
        let mut store = Listed::default();
        store.lists.0.insert(1, ids(300, 1).into());
        store.lists.0.insert(2, ids(2, 2).into());
        append_run(&mut store.write(), &session, 0, Run { seq: 1, start: 0, count: 3 }).unwrap();
        append_run(&mut store.write(), &session, 3, Run { seq: 1, start: 3, count: 2 }).unwrap();
        assert_eq!(store.chunks(&session), [vec![Run { seq: 1, start: 0, count: 5 }]]);
        append_run(&mut store.write(), &session, 5, Run { seq: 2, start: 0, count: 2 }).unwrap();
        // Continues the first record's run, but not the last run of the chunk.
        append_run(&mut store.write(), &session, 7, Run { seq: 1, start: 5, count: 200 }).unwrap();
        assert_eq!(
            store.chunks(&session),
            [
                vec![
                    Run { seq: 1, start: 0, count: 5 },
                    Run { seq: 2, start: 0, count: 2 },
                    Run { seq: 1, start: 5, count: 121 }
                ],
                vec![Run { seq: 1, start: 126, count: 79 }],
            ]
        );
        let mut want = ids(300, 1)[..5].to_vec();
        want.extend(ids(2, 2));
        want.extend_from_slice(&ids(300, 1)[5..205]);
        assert_eq!(super::ids(&store.read(), &session, 0, 207).unwrap(), want);
        // A row whose end is not a whole run is refused, not extended.
        store.rows.put(Table::Transcript, &key(&session, 1), &[1, 0x80]).unwrap();
        assert!(matches!(
            append_run(&mut store.write(), &session, 207, Run { seq: 2, start: 0, count: 1 }),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn a_store_that_cannot_read_records_cannot_read_ids_and_a_bad_run_is_corrupt() {
        let session = SessionId([7; 16]);
        let mut store = Listed::default();
        let mut model = Vec::new();
        store.splice(&session, 1, 0, 0, ids(5, 1), &mut model);
        store.lists.0.clear();
        assert!(matches!(super::ids(&store.read(), &session, 0, 5), Err(Error::Storage(_))));
        // A run past its record's list.
        store.lists.0.insert(1, ids(3, 1).into());
        assert!(matches!(super::ids(&store.read(), &session, 0, 5), Err(Error::Corrupt { .. })));
        // A chunk that is not whole runs, or holds no position.
        for bad in [&[1u8, 0][..], &[1, 0, 0], &[], &[1, 0, 0x80]] {
            store.rows.put(Table::Transcript, &key(&session, 0), bad).unwrap();
            assert!(matches!(super::ids(&store.read(), &session, 0, 1), Err(Error::Corrupt { .. })), "{bad:?}");
        }
        // More than 128 positions.
        store
            .rows
            .put(Table::Transcript, &key(&session, 0), &encode_chunk(&[Run { seq: 1, start: 0, count: 129 }]))
            .unwrap();
        assert!(matches!(super::ids(&store.read(), &session, 0, 1), Err(Error::Corrupt { .. })));
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
            let mut store = Listed::default();
            let mut model = Vec::new();
            store.splice(&session, 1, 0, 0, stored.clone(), &mut model);
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
            let got = common_ends(&store.read(), &session, len as u64, &other).unwrap();
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
