//! The journal: the one write of a durable commit.
//!
//! A group commit writes one **frame** to `<db>.journal` at the journal's write offset
//! and calls `fdatasync` once. The frame holds the batch's records, already sealed with
//! their chain hashes, the content rows they introduce, and the batch's draft changes.
//! That is the whole durable path: one sequential write into a file that, after its
//! first cycle, is overwritten in place, so the `fdatasync` writes the frame's pages and
//! no file metadata.
//!
//! The log file takes the same rows later, when the absorber thread **absorbs** the
//! journal: one redb transaction appends every journalled record and content row under
//! its seq (the one appender, `log::append_sealed`) with the draft changes, commits
//! durably, and the journal starts again at offset 0. Until then the rows are read from memory:
//! every view holds the `Tail` of sealed batches past the log file's snapshot.
//!
//! Frame layout (little-endian):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `ANJ1` |
//! | 4 | 4 | payload length `P` |
//! | 8 | 8 | cycle: the journal files' use count, one more at every switch |
//! | 16 | 8 | first seq (the next seq, for a frame of draft changes only) |
//! | 24 | 4 | records `N` |
//! | 28 | 32 | chain hash before the first record, `h(first - 1)` |
//! | 60 | 32 | blake3 of bytes 0..60 and the payload |
//! | 92 | `P` | payload: `N` × (u32 record length, record, u32 content row length, row), then u32 draft length and the draft changes |
//!
//! There are two journal files. The writer appends to one until it holds
//! [`JOURNAL_SWITCH_BYTES`], then turns to the other (from offset 0, in a new cycle)
//! once the absorber has taken everything that one held, and hands the first to the
//! absorber thread, which appends its rows to the log file behind the commits.
//!
//! Recovery reads each file from offset 0 while its frames are whole (the checksum
//! holds), of one cycle, and each starts at the seq after the one before it; it orders
//! the frames of both files by cycle, skips those the log file holds, and checks that
//! the rest continue the log's tip, chain hash by chain hash. A torn frame fails its
//! checksum and ends its file's scan: it was never acknowledged.

use crate::error::{Error, Location, Result};
use crate::log::Tip;
use annal_codec::{ChainHash, LogChain};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A frame's magic.
pub const FRAME_MAGIC: [u8; 4] = *b"ANJ1";

/// Bytes of a frame before its payload.
pub const FRAME_HEADER_LEN: usize = 92;

/// Journal bytes past which the writer turns to the other journal file, and the
/// absorber takes what the first one holds into the log file. It bounds what views read
/// from memory, and what an open after a crash appends to the log file.
pub const JOURNAL_SWITCH_BYTES: u64 = 1 << 20;

/// Journal bytes past which the writer waits for the absorber before it takes more
/// commits (backpressure: the rows views read from memory stay bounded).
pub const JOURNAL_BYTES_MAX: u64 = 16 * JOURNAL_SWITCH_BYTES;

/// Times a reader reads the log file's tip and the journal again when the journal does
/// not continue the tip it read: a live writer absorbed the journal in between, and
/// started a file again.
pub const JOURNAL_READ_TRIES_MAX: u32 = 16;

/// The two journal files beside the log file `path`: `<path>.journal.0` and `.1`.
pub fn journal_paths(path: &Path) -> [PathBuf; 2] {
    [0, 1].map(|i| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".journal.{i}"));
        PathBuf::from(p)
    })
}

/// A record sealed with its chain hash, and the content row it introduces.
#[derive(Clone, Debug)]
pub(crate) struct Sealed {
    pub seq: u64,
    pub record: Vec<u8>,
    /// The content row (empty when the record introduced no object).
    pub content: Vec<u8>,
}

/// One group commit's sealed rows, as views read them from memory (never empty).
#[derive(Debug)]
pub(crate) struct SealedBatch {
    pub rows: Vec<Sealed>,
}

impl SealedBatch {
    fn first_seq(&self) -> u64 {
        self.rows.first().map_or(0, |r| r.seq)
    }
}

/// Batches a tail keeps in its short list before it merges them into the long one.
const TAIL_RECENT_MAX: usize = 64;

/// The journalled batches the log file's snapshot does not hold yet, oldest first. A
/// clone (every view takes one) shares the lists. The newest batches sit in a short
/// list that each commit copies, and every [`TAIL_RECENT_MAX`] batches they move into
/// the long one: a commit copies at most that many entries, plus the long list once in
/// that many commits, where one list would copy a whole journal file's worth each time.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tail {
    /// The older batches.
    long: Arc<Vec<Arc<SealedBatch>>>,
    /// The batches after them, at most [`TAIL_RECENT_MAX`].
    recent: Arc<Vec<Arc<SealedBatch>>>,
}

impl Tail {
    /// The tail with `batch` (which holds records) after it.
    pub fn with(&self, batch: Arc<SealedBatch>) -> Tail {
        debug_assert!(!batch.rows.is_empty(), "a tail's batches hold records");
        if self.recent.len() < TAIL_RECENT_MAX {
            let mut recent = Vec::with_capacity(self.recent.len() + 1);
            recent.extend(self.recent.iter().cloned());
            recent.push(batch);
            return Tail { long: self.long.clone(), recent: Arc::new(recent) };
        }
        Tail { long: Arc::new(self.batches().cloned().collect()), recent: Arc::new(vec![batch]) }
    }

    /// The tail without the records at or below `seq` (the log file holds them now).
    pub fn after(&self, seq: u64) -> Tail {
        let long = self.batches().filter(|b| b.rows.last().is_some_and(|r| r.seq > seq)).cloned().collect();
        Tail { long: Arc::new(long), recent: Arc::default() }
    }

    /// The first seq the tail holds.
    pub fn first_seq(&self) -> Option<u64> {
        self.batches().next().map(|b| b.first_seq())
    }

    /// Sealed row `seq`, if the tail holds it.
    pub fn get(&self, seq: u64) -> Option<&Sealed> {
        let list = match self.recent.first() {
            Some(first) if first.first_seq() <= seq => &self.recent,
            _ => &self.long,
        };
        let i = list.partition_point(|b| b.first_seq() <= seq).checked_sub(1)?;
        let batch = &list[i];
        batch.rows.get(usize::try_from(seq - batch.first_seq()).ok()?).filter(|r| r.seq == seq)
    }

    /// Every batch, oldest first.
    pub fn batches(&self) -> impl DoubleEndedIterator<Item = &Arc<SealedBatch>> {
        self.long.iter().chain(self.recent.iter())
    }
}

/// Encodes one frame: `rows` sealed after `prev` (none for draft changes alone, which
/// then name `next_seq`), and the batch's encoded draft changes.
#[cfg(test)]
pub(crate) fn encode_frame(cycle: u64, next_seq: u64, prev: &ChainHash, rows: &[Sealed], drafts: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    encode_frame_into(&mut f, cycle, next_seq, prev, rows, drafts);
    f
}

/// Encodes one frame (see [`Journal::append`]) into `f`, which it clears first: the
/// writer reuses one buffer, so a frame does not fault in fresh pages.
fn encode_frame_into(f: &mut Vec<u8>, cycle: u64, next_seq: u64, prev: &ChainHash, rows: &[Sealed], drafts: &[u8]) {
    let payload_len: usize =
        rows.iter().map(|r| 8 + r.record.len() + r.content.len()).sum::<usize>() + 4 + drafts.len();
    f.clear();
    f.reserve(FRAME_HEADER_LEN + payload_len);
    f.extend_from_slice(&FRAME_MAGIC);
    f.extend_from_slice(&(payload_len as u32).to_le_bytes());
    f.extend_from_slice(&cycle.to_le_bytes());
    f.extend_from_slice(&rows.first().map_or(next_seq, |r| r.seq).to_le_bytes());
    f.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    f.extend_from_slice(&prev.0);
    f.extend_from_slice(&[0; 32]);
    for r in rows {
        f.extend_from_slice(&(r.record.len() as u32).to_le_bytes());
        f.extend_from_slice(&r.record);
        f.extend_from_slice(&(r.content.len() as u32).to_le_bytes());
        f.extend_from_slice(&r.content);
    }
    f.extend_from_slice(&(drafts.len() as u32).to_le_bytes());
    f.extend_from_slice(drafts);
    let sum = checksum(&f[..60], &f[FRAME_HEADER_LEN..]);
    f[60..92].copy_from_slice(&sum);
}

fn checksum(header: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(header);
    h.update(payload);
    *h.finalize().as_bytes()
}

/// A frame read back.
#[derive(Debug)]
pub(crate) struct Frame {
    pub cycle: u64,
    pub first_seq: u64,
    pub prev: ChainHash,
    pub rows: Vec<Sealed>,
    /// The batch's draft changes, encoded (`crate::draft::DraftWrites::encode`).
    pub drafts: Vec<u8>,
    /// Bytes the frame takes in the file.
    pub len: u64,
}

impl Frame {
    /// The seq after its last record (its first seq, for draft changes alone).
    fn next_seq(&self) -> u64 {
        self.first_seq.saturating_add(self.rows.len() as u64)
    }
}

/// The payload length named by the frame header at the start of `bytes`, if they start
/// with a whole header that has a frame's magic (whether or not the frame is intact).
fn payload_len(bytes: &[u8]) -> Option<usize> {
    let header = bytes.get(..FRAME_HEADER_LEN)?;
    (header[..4] == FRAME_MAGIC).then(|| u32::from_le_bytes(header[4..8].try_into().unwrap_or_default()) as usize)
}

/// Reads the frame at the start of `bytes`: `None` if it is not a whole, intact frame
/// (the end of the journal). Bounded by `bytes`: nothing is allocated beyond it.
pub(crate) fn read_frame(bytes: &[u8]) -> Option<Frame> {
    let payload_len = payload_len(bytes)?;
    let header = &bytes[..FRAME_HEADER_LEN];
    let u32_at = |b: &[u8], at: usize| b.get(at..at + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap_or_default()));
    let payload = bytes.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN.checked_add(payload_len)?)?;
    if checksum(&header[..60], payload) != header[60..92] {
        return None;
    }
    let cycle = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let first_seq = u64::from_le_bytes(header[16..24].try_into().ok()?);
    let count = u32_at(header, 24)? as u64;
    let prev = ChainHash(header[28..60].try_into().ok()?);
    let mut at = 0usize;
    let take = |at: &mut usize| -> Option<Vec<u8>> {
        let len = u32_at(payload, *at)? as usize;
        let v = payload.get(*at + 4..(*at + 4).checked_add(len)?)?.to_vec();
        *at += 4 + len;
        Some(v)
    };
    let mut rows = Vec::new();
    for i in 0..count {
        let record = take(&mut at)?;
        let content = take(&mut at)?;
        rows.push(Sealed { seq: first_seq.checked_add(i)?, record, content });
    }
    let drafts = take(&mut at)?;
    (at == payload.len()).then_some(Frame {
        cycle,
        first_seq,
        prev,
        rows,
        drafts,
        len: (FRAME_HEADER_LEN + payload_len) as u64,
    })
}

/// The bytes of a journal file that its frames chain through: from offset 0, each
/// frame header's payload length leads to the next header, and the read stops at the
/// first header that is not a frame's (its bytes included), or at the file's end
/// (`len`). [`scan`] of these bytes is [`scan`] of the whole file: it reads nothing
/// else. The preallocated zeros past the frames are not read. `read(at, buf)` reads
/// what the file holds at `at` into `buf`, and returns how many bytes it read.
fn read_chained(len: u64, mut read: impl FnMut(u64, &mut [u8]) -> Result<usize>) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut at = 0u64;
    while at < len {
        let header_end = (at + FRAME_HEADER_LEN as u64).min(len);
        bytes.resize(header_end as usize, 0);
        let n = read(at, &mut bytes[at as usize..])?;
        bytes.truncate(at as usize + n);
        let Some(payload_len) = payload_len(&bytes[at as usize..]) else { break };
        let end = (at + FRAME_HEADER_LEN as u64 + payload_len as u64).min(len);
        let from = bytes.len();
        bytes.resize(end as usize, 0);
        let n = read(from as u64, &mut bytes[from..])?;
        bytes.truncate(from + n);
        if bytes.len() as u64 != end {
            break;
        }
        at = end;
    }
    Ok(bytes)
}

/// A journal file at `path`: its length, and the bytes its frames chain through
/// ([`read_chained`]; empty if there is no file).
pub(crate) fn read_file(path: &Path) -> Result<(u64, Vec<u8>)> {
    use std::os::unix::fs::FileExt;
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, Vec::new())),
        Err(e) => return Err(e.into()),
    };
    let len = file.metadata()?.len();
    let bytes = read_chained(len, |at, buf| {
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], at + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        Ok(done)
    })?;
    Ok((len, bytes))
}

/// The frames of one journal file's current cycle: from offset 0, while each is whole,
/// of the first frame's cycle, and starts at the seq after the one before it. A frame
/// that fails its checksum ends the cycle (it was being written when the power went,
/// and was never acknowledged), unless a whole frame of the same cycle follows it: then
/// an acknowledged frame is damaged, and the journal is `Corrupt`.
fn scan(bytes: &[u8]) -> Result<Vec<Frame>> {
    let mut frames: Vec<Frame> = Vec::new();
    let mut at = 0usize;
    loop {
        let Some(frame) = bytes.get(at..).and_then(read_frame) else {
            if let Some(last) = frames.last() {
                let next = last.next_seq();
                if damaged_before(bytes, at).is_some_and(|f| f.cycle == last.cycle && f.first_seq >= next) {
                    return Err(Error::corrupt(
                        Location::Log { seq: next },
                        format!("journal: the frame after seq {} is damaged", next.saturating_sub(1)),
                    ));
                }
            }
            return Ok(frames);
        };
        if let Some(last) = frames.last() {
            if frame.cycle != last.cycle || frame.first_seq != last.next_seq() {
                return Ok(frames);
            }
        }
        at += frame.len as usize;
        frames.push(frame);
    }
}

/// The whole frame that follows the frame at `at` whose header is intact but whose
/// bytes fail their checksum, if there is one.
fn damaged_before(bytes: &[u8], at: usize) -> Option<Frame> {
    let payload_len = payload_len(bytes.get(at..)?)?;
    let end = at.checked_add(FRAME_HEADER_LEN)?.checked_add(payload_len)?;
    read_frame(bytes.get(end..)?)
}

/// The frames of both journal files (`files`, their bytes) that continue a log whose
/// tip is (`tip_seq`, `tip_hash`), in the order they were written, each record's chain
/// hash checked. Frames of records the log already holds are skipped.
pub(crate) fn read_after(
    files: &[Vec<u8>],
    tip_seq: u64,
    tip_hash: &ChainHash,
    chain: &LogChain,
) -> Result<Vec<Frame>> {
    let mut all = Vec::new();
    for file in files {
        all.extend(scan(file)?);
    }
    continuing(all, tip_seq, tip_hash, chain)
}

/// The frames of both journal files' scans (`all`) that continue a log whose tip is
/// (`tip_seq`, `tip_hash`): see [`read_after`].
fn continuing(mut all: Vec<Frame>, tip_seq: u64, tip_hash: &ChainHash, chain: &LogChain) -> Result<Vec<Frame>> {
    // A file's frames are in order already; the files follow each other by cycle.
    all.sort_by_key(|f| f.cycle);
    let (mut next, mut hash) = (tip_seq.saturating_add(1), *tip_hash);
    let mut frames = Vec::new();
    for frame in all {
        let count = frame.rows.len() as u64;
        // Records the log holds; draft changes journalled before the last of them.
        if frame.next_seq() <= next && !(count == 0 && frame.first_seq == next) {
            continue;
        }
        if frame.first_seq != next || frame.prev != hash {
            return Err(Error::corrupt(
                Location::Log { seq: next },
                format!("journal frame at seq {} does not continue the log at {}", frame.first_seq, next - 1),
            ));
        }
        for row in &frame.rows {
            hash = annal_codec::verify_chain(&row.record, &hash, chain, row.seq)
                .map_err(|source| Error::Decode { seq: row.seq, source })?;
        }
        next = next.saturating_add(count);
        frames.push(frame);
    }
    Ok(frames)
}

/// A record and its content row as the journal holds them, for tools that walk the log
/// past the log file (`annal verify`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalRow {
    /// The record's seq.
    pub seq: u64,
    /// The record's bytes, sealed with its chain hash.
    pub record: Vec<u8>,
    /// The content row of the objects it introduced (empty for none).
    pub content: Vec<u8>,
}

/// The journal files beside the log file `path`: the bytes their frames chain through
/// (empty where there is none; the zeros past the frames are not read).
pub fn read_journal(path: &Path) -> Result<Vec<Vec<u8>>> {
    journal_paths(path).iter().map(|p| read_file(p).map(|(_, bytes)| bytes)).collect()
}

/// The journalled rows of `files` (see [`read_journal`]) that continue a log whose last
/// record is `seq` with chain hash `hash`, in order, chain-checked. An error when a frame
/// does not continue it (a damaged journal, or one a writer started again after the log
/// file was read).
pub fn rows_after(files: &[Vec<u8>], seq: u64, hash: &ChainHash, chain: &LogChain) -> Result<Vec<JournalRow>> {
    let frames = read_after(files, seq, hash, chain)?;
    let rows = frames.into_iter().flat_map(|f| f.rows);
    Ok(rows.map(|r| JournalRow { seq: r.seq, record: r.record, content: r.content }).collect())
}

/// A read-only opener's view of a journal it does not write: the frames past the log
/// file's tip, read again only when the tip moved or a file changed where a writer
/// writes (its length, its first frame header, or the bytes just past its last frame,
/// where the next frame of the cycle goes). A live writer appends to the files while it
/// reads them: a frame still being written fails its checksum and ends the scan, and a
/// journal that does not continue the tip it read means the writer absorbed it in
/// between (the caller reads the tip again). A frame written whole and not yet synced
/// passes its checksum, so the follower can take a commit before the writer's
/// `fdatasync` returns, that is before it is acknowledged (`docs/guarantees.md`,
/// Durability).
pub(crate) struct Follower {
    paths: [PathBuf; 2],
    cached: parking_lot::Mutex<Option<Followed>>,
}

/// Where a journal file changes when a writer writes to it.
type Stamp = (u64, Vec<u8>, Vec<u8>);

/// What a [`Follower`] read last.
struct Followed {
    /// Each file's stamp, and where its frames of the current cycle end.
    files: [(Stamp, u64); 2],
    tip: (u64, ChainHash),
    tail: Tail,
}

/// `len` bytes of `file` from `at` (fewer past its end; none if it cannot be read).
fn read_at(file: &File, at: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let n = file.read_at(&mut buf, at).unwrap_or(0);
    buf.truncate(n);
    buf
}

fn stamp(path: &Path, end: u64) -> Stamp {
    match File::open(path) {
        Ok(f) => {
            let len = f.metadata().map_or(0, |m| m.len());
            (len, read_at(&f, 0, FRAME_HEADER_LEN), read_at(&f, end, FRAME_HEADER_LEN))
        }
        Err(_) => (0, Vec::new(), Vec::new()),
    }
}

impl Follower {
    /// Follows the journal beside the log file `path`.
    pub fn new(path: &Path) -> Follower {
        Follower { paths: journal_paths(path), cached: parking_lot::Mutex::new(None) }
    }

    /// The journalled batches that continue a log whose tip is (`seq`, `hash`).
    pub fn tail_after(&self, seq: u64, hash: &ChainHash, chain: &LogChain) -> Result<Tail> {
        let mut cached = self.cached.lock();
        if let Some(c) = cached.as_ref().filter(|c| c.tip == (seq, *hash)) {
            let same = (0..2).all(|i| stamp(&self.paths[i], c.files[i].1) == c.files[i].0);
            if same {
                return Ok(c.tail.clone());
            }
        }
        let [(len0, bytes0), (len1, bytes1)] = [read_file(&self.paths[0])?, read_file(&self.paths[1])?];
        let (lens, bytes) = ([len0, len1], [bytes0, bytes1]);
        let scanned = [scan(&bytes[0])?, scan(&bytes[1])?];
        let files = [0, 1].map(|i| {
            let end = scanned[i].iter().map(|f| f.len).sum::<u64>();
            // The chained bytes hold the header-sized bytes at 0 and past the last frame
            // (or the file ends there), as `stamp` reads them.
            let at = |from: u64| {
                bytes[i].get(from as usize..).map_or(Vec::new(), |b| b[..b.len().min(FRAME_HEADER_LEN)].to_vec())
            };
            ((lens[i], at(0), at(end)), end)
        });
        // A frame whose header is whole but whose bytes are not (one the writer is still
        // writing, as likely as a damaged one) ends the read; its header is already what
        // it will be, so a stamp taken now would not change when the frame is done, and
        // the tail kept would miss it and every commit after it. Such a read is not kept.
        let unfinished = (0..2).any(|i| {
            let rest = bytes[i].get(files[i].1 as usize..).unwrap_or_default();
            payload_len(rest).is_some() && read_frame(rest).is_none()
        });
        let [first, second] = scanned;
        let tail = continuing(first.into_iter().chain(second).collect(), seq, hash, chain)?
            .into_iter()
            .filter(|f| !f.rows.is_empty())
            .fold(Tail::default(), |t, f| t.with(Arc::new(SealedBatch { rows: f.rows })));
        *cached = (!unfinished).then(|| Followed { files, tip: (seq, *hash), tail: tail.clone() });
        Ok(tail)
    }
}

/// The highest cycle either journal file holds a frame of.
fn last_cycle(files: &[Vec<u8>]) -> u64 {
    files.iter().flat_map(|b| scan(b).unwrap_or_default()).map(|f| f.cycle).max().unwrap_or(0)
}

/// Appends the frames of the journal beside the log file `path` that continue `tip` to
/// the log file, with their draft changes, in one durable transaction (an open after a
/// crash), and returns the new tip. Nothing is written when there are none.
/// The journal then writes from offset 0 of its first file, in a cycle after every one
/// the files hold.
pub(crate) fn recover(db: &redb::Database, journal: &mut Journal, tip: Tip, chain: &LogChain) -> Result<Tip> {
    let contents = journal.contents()?;
    journal.cycle = last_cycle(&contents) + 1;
    let frames = read_after(&contents, tip.seq, &tip.hash, chain)?;
    if frames.is_empty() {
        return Ok(tip);
    }
    let mut next = tip;
    for row in frames.iter().flat_map(|f| f.rows.iter()) {
        let header = annal_codec::decode_header(&row.record, u64::MAX)
            .map_err(|source| Error::Decode { seq: row.seq, source })?;
        let hash = annal_codec::stored_chain_hash(&row.record)
            .ok_or_else(|| Error::corrupt(Location::Log { seq: row.seq }, "record too short"))?;
        next = Tip { seq: row.seq, hash, clock_ms: header.committed_at_ms.max(next.clock_ms) };
    }
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    crate::log::append_sealed(&txn, tip.seq, frames.iter().flat_map(|f| f.rows.iter()), &next)?;
    for frame in &frames {
        let drafts = crate::draft::DraftWrites::decode(&frame.drafts, frame.drafts.len() as u64)?;
        crate::draft::write(&txn, &drafts)?;
    }
    txn.commit()?;
    Ok(next)
}

/// The journal the writer appends to: two files beside the log file, or two redb
/// storage backends (the fault-injecting and simulated ones of [`crate::fault`]).
pub(crate) struct Journal {
    files: [Box<dyn redb::StorageBackend>; 2],
    /// The files, when they are: removed at a clean close.
    paths: Option<[PathBuf; 2]>,
    /// The file frames go to.
    active: usize,
    /// Where the next frame goes in it.
    offset: u64,
    /// For each file, the absorber request (`crate::absorb::Absorber::request`, counted
    /// from 1) that takes what the file holds in its current cycle into the log file, its
    /// records and its draft changes alike; 0 for none. A file is not written again
    /// before that request is done.
    needs: [u64; 2],
    /// The active file's cycle.
    cycle: u64,
    /// Each file's length.
    len: [u64; 2],
    /// The frame being written, kept between frames (its capacity is reused).
    buffer: Vec<u8>,
    /// How far from offset 0 each file may hold bytes other than zeros: what it held at
    /// open, and every frame since (the shred at a clean close zeroes this much).
    dirty: [u64; 2],
}

fn io(e: std::io::Error) -> Error {
    Error::storage_in("journal", e)
}

/// The default of [`crate::Options::journal_preallocate_bytes`]: bytes of written zeros
/// each journal file holds from its creation on, so that a frame lands in place and its
/// `fdatasync` writes the frame's pages and no file size (`docs/design.md` §7g). A
/// file's first cycle ends at [`JOURNAL_SWITCH_BYTES`] plus its last frame.
pub const JOURNAL_PREALLOC_BYTES: u64 = JOURNAL_SWITCH_BYTES + (1 << 20);

/// The size of each write of zeros that preallocates a journal file: one page. The page
/// cache sizes a file's folios by the writes that create them, and a later frame that
/// dirties part of a large folio makes the kernel count (and write back) all of it: with
/// 1 MiB writes of zeros, the kernel's `write_bytes` grew by 1 MiB a commit.
const PREALLOC_WRITE_BYTES: u64 = 4096;

/// Extends `file` with written zeros to `bytes`, durably (nothing if it is that long).
fn preallocate(file: &dyn redb::StorageBackend, bytes: u64) -> Result<u64> {
    let len = file.len().map_err(io)?;
    if len >= bytes {
        return Ok(len);
    }
    let zeros = vec![0u8; PREALLOC_WRITE_BYTES as usize];
    let mut at = len;
    while at < bytes {
        let n = (bytes - at).min(zeros.len() as u64) as usize;
        file.write(at, &zeros[..n]).map_err(io)?;
        at += n as u64;
    }
    file.sync_data().map_err(io)?;
    Ok(bytes)
}

impl Journal {
    /// Opens (or creates) the journal files beside the log file `path`.
    pub fn open(path: &Path, preallocate_bytes: u64) -> Result<Journal> {
        let paths = journal_paths(path);
        let mut created = false;
        let mut open = |p: &Path| -> Result<redb::backends::FileBackend> {
            created |= !p.exists();
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .map_err(|e| Error::storage_in(format_args!("the journal file {}", p.display()), e))?;
            redb::backends::FileBackend::new(file).map_err(|e| Error::storage_in("journal", e))
        };
        let files: [Box<dyn redb::StorageBackend>; 2] = [Box::new(open(&paths[0])?), Box::new(open(&paths[1])?)];
        if created {
            // The files' names must survive a power loss as their frames do.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
        }
        Journal::start(files, Some(paths), preallocate_bytes)
    }

    /// A journal on two backends.
    pub fn on_backends(
        first: impl redb::StorageBackend,
        second: impl redb::StorageBackend,
        preallocate_bytes: u64,
    ) -> Result<Journal> {
        Journal::start([Box::new(first), Box::new(second)], None, preallocate_bytes)
    }

    /// A journal on `files`, each extended with zeros to `preallocate_bytes`.
    fn start(
        files: [Box<dyn redb::StorageBackend>; 2],
        paths: Option<[PathBuf; 2]>,
        preallocate_bytes: u64,
    ) -> Result<Journal> {
        let dirty = [files[0].len().map_err(io)?, files[1].len().map_err(io)?];
        let len =
            [preallocate(files[0].as_ref(), preallocate_bytes)?, preallocate(files[1].as_ref(), preallocate_bytes)?];
        // The cycle is set by `recover`, which reads the files.
        Ok(Journal { files, paths, active: 0, offset: 0, needs: [0, 0], cycle: 1, len, buffer: Vec::new(), dirty })
    }

    /// What each file's frames chain through, old frames included ([`read_chained`]).
    pub fn contents(&self) -> Result<Vec<Vec<u8>>> {
        self.files
            .iter()
            .map(|f| {
                let len = f.len().map_err(io)?;
                read_chained(len, |at, buf| {
                    f.read(at, buf).map_err(io)?;
                    Ok(buf.len())
                })
            })
            .collect()
    }

    /// Writes the frame of `rows` sealed after `prev` (none for draft changes alone,
    /// which then name `next_seq`) and the encoded draft changes `drafts` at the write
    /// offset, and waits for it to be durable. Returns the frame's length.
    pub fn append(&mut self, next_seq: u64, prev: &ChainHash, rows: &[Sealed], drafts: &[u8]) -> Result<u64> {
        let mut frame = std::mem::take(&mut self.buffer);
        encode_frame_into(&mut frame, self.cycle, next_seq, prev, rows, drafts);
        let written = self.write(&frame);
        let len = frame.len() as u64;
        self.buffer = frame;
        written.map(|()| len)
    }

    /// Writes `frame` at the write offset and waits for it to be durable.
    fn write(&mut self, frame: &[u8]) -> Result<()> {
        let file = &self.files[self.active];
        let end = self.offset + frame.len() as u64;
        if end > self.len[self.active] {
            file.set_len(end).map_err(io)?;
            self.len[self.active] = end;
        }
        self.dirty[self.active] = self.dirty[self.active].max(end);
        file.write(self.offset, frame).map_err(io)?;
        file.sync_data().map_err(io)?;
        self.offset = end;
        Ok(())
    }

    /// The absorber request that must be done before the file that is not active is
    /// written again (0 for none).
    pub fn other_needs(&self) -> u64 {
        self.needs[1 - self.active]
    }

    /// After a [`Journal::switch`]: the absorber request `request` takes what the file
    /// just left holds.
    pub fn left(&mut self, request: u64) {
        self.needs[1 - self.active] = request;
    }

    /// Bytes the active file holds in this cycle.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Turns to the other file, from offset 0 in a new cycle, if the active one holds
    /// [`JOURNAL_SWITCH_BYTES`] and the log file holds everything the other one does
    /// (the absorber has done its first `done` requests). Returns whether it did; then
    /// the caller hands the absorber what the file it left holds ([`Journal::left`]).
    pub fn switch(&mut self, done: u64) -> bool {
        let other = 1 - self.active;
        if self.offset < JOURNAL_SWITCH_BYTES || self.needs[other] > done {
            return false;
        }
        self.active = other;
        self.offset = 0;
        self.needs[other] = 0;
        self.cycle += 1;
        true
    }

    /// Starts again from offset 0 in a new cycle: the log file holds every frame.
    pub fn restart(&mut self) {
        self.offset = 0;
        self.needs = [0, 0];
        self.cycle += 1;
    }

    /// At a clean close, once the log file holds every frame: overwrites with zeros
    /// what both files' frames took (the rest is zeros already), then removes them
    /// (backends are cut to nothing). Their bytes do not outlive them on the disk: a
    /// purge closes the engine first, and a journal may hold what the purge erases.
    pub fn shred(self) -> Result<()> {
        let mut lens = [0u64; 2];
        for (len, (file, dirty)) in lens.iter_mut().zip(self.files.iter().zip(self.dirty)) {
            *len = file.len().map_err(io)?.min(dirty);
        }
        // Zeros for the larger of the two, in pieces of at most 1 MiB (a clean close of a
        // journal that took a few frames writes a few pages, and allocates no more).
        let zeros = vec![0u8; lens[0].max(lens[1]).min(1 << 20) as usize];
        for (file, len) in self.files.iter().zip(lens) {
            let mut at = 0;
            while at < len {
                let n = (len - at).min(zeros.len() as u64) as usize;
                file.write(at, &zeros[..n]).map_err(io)?;
                at += n as u64;
            }
            if self.paths.is_none() {
                file.set_len(0).map_err(io)?;
            }
            file.sync_data().map_err(io)?;
            let _ = file.close();
        }
        for path in self.paths.iter().flatten() {
            std::fs::remove_file(path)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first: u64, n: u64) -> SealedBatch {
        let rows = (first..first + n)
            .map(|seq| Sealed { seq, record: vec![seq as u8; 40], content: vec![1; (seq % 3) as usize] })
            .collect();
        SealedBatch { rows }
    }

    #[test]
    fn a_frame_round_trips_and_any_flipped_byte_ends_the_scan() {
        let f = encode_frame(2, 5, &ChainHash([9; 32]), &batch(5, 3).rows, &[7; 3]);
        let back = read_frame(&f).expect("whole frame");
        assert_eq!((back.cycle, back.first_seq, back.len as usize, back.rows.len()), (2, 5, f.len(), 3));
        assert_eq!(back.rows[2].record, vec![7u8; 40]);
        assert_eq!(back.drafts, vec![7; 3]);
        for i in 0..f.len() {
            let mut bad = f.clone();
            bad[i] ^= 0x40;
            assert!(read_frame(&bad).is_none(), "byte {i}");
        }
        for cut in 0..f.len() {
            assert!(read_frame(&f[..cut]).is_none(), "cut at {cut}");
        }
    }

    /// A backend that keeps, when it is cut to nothing, what it held just before.
    #[derive(Debug, Default)]
    struct Kept {
        file: redb::backends::InMemoryBackend,
        before_cut: Arc<parking_lot::Mutex<Option<Vec<u8>>>>,
    }

    impl redb::StorageBackend for Kept {
        fn len(&self) -> std::io::Result<u64> {
            self.file.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.file.read(offset, out)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            if len == 0 {
                let mut all = vec![0; self.file.len()? as usize];
                self.file.read(0, &mut all)?;
                *self.before_cut.lock() = Some(all);
            }
            self.file.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.file.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            // Grows as a file does (redb's in-memory backend wants `set_len` first).
            let end = offset + data.len() as u64;
            if end > self.file.len()? {
                self.file.set_len(end)?;
            }
            self.file.write(offset, data)
        }
    }

    /// A clean close overwrites with zeros every byte a frame took, and what the file
    /// held at the open, in pieces of at most 1 MiB: here more than 1 MiB of frames in
    /// one file and a few old bytes in the other.
    #[test]
    fn a_shred_leaves_zeros_wherever_a_frame_or_an_old_byte_was() {
        let (first, second) = (Kept::default(), Kept::default());
        redb::StorageBackend::write(&second, 0, &[0xAB; 300]).unwrap();
        let cuts = [first.before_cut.clone(), second.before_cut.clone()];
        let mut journal = Journal::on_backends(first, second, 4096).unwrap();
        let big = Sealed { seq: 1, record: vec![0x5A; 40], content: vec![0xC3; 700 << 10] };
        let mut prev = ChainHash([0; 32]);
        for seq in 1..=2u64 {
            let row = Sealed { seq, ..big.clone() };
            journal.append(seq, &prev, &[row], &[]).unwrap();
            prev = ChainHash([seq as u8; 32]);
        }
        assert!(journal.offset() > 1 << 20, "the frames took more than one piece of zeros");
        let took = journal.offset() as usize;
        journal.shred().unwrap();
        let [first, second] = cuts.map(|c| c.lock().take().expect("each file was cut to nothing"));
        assert!(first.len() >= took && first.iter().all(|&b| b == 0), "frames left in the first file");
        assert!(second.len() >= 300 && second.iter().all(|&b| b == 0), "old bytes left in the second file");
    }

    /// Found by the `journal` fuzz target: a frame whose last record is seq `u64::MAX`
    /// made the seq after it overflow.
    #[test]
    fn a_frame_at_the_end_of_the_seq_space_is_refused_without_overflow() {
        let rows = vec![Sealed { seq: u64::MAX, record: vec![1; 40], content: Vec::new() }];
        let f = encode_frame(1, u64::MAX, &ChainHash([0; 32]), &rows, &[]);
        let twice = [f.clone(), f].concat();
        assert!(scan(&twice).is_ok());
        let chain = LogChain::plain();
        assert!(read_after(&[twice], 0, &chain.genesis(), &chain).is_err());
    }

    /// The chained read of a file holds everything a scan of the whole file reads:
    /// whole frames, a torn one, a damaged one with a frame after it, then zeros.
    #[test]
    fn a_chained_read_scans_as_the_whole_file_does() {
        let a = encode_frame(1, 1, &ChainHash([1; 32]), &batch(1, 2).rows, &[]);
        let b = encode_frame(1, 3, &ChainHash([2; 32]), &batch(3, 1).rows, &[5; 4]);
        let whole = |frames: &[&[u8]], zeros: usize| [frames.concat(), vec![0; zeros]].concat();
        let mut damaged = whole(&[&a, &b, &a], 300);
        damaged[a.len() + FRAME_HEADER_LEN + 3] ^= 1;
        let mut torn = whole(&[&a, &b], 0);
        let cut = torn.len() - 7;
        torn.truncate(cut);
        for file in [whole(&[&a, &b], 4096), whole(&[], 4096), whole(&[&a], 10), damaged, torn, Vec::new()] {
            let chained = read_chained(file.len() as u64, |at, buf| {
                buf.copy_from_slice(&file[at as usize..at as usize + buf.len()]);
                Ok(buf.len())
            })
            .unwrap();
            assert!(file.starts_with(&chained) && chained.len() <= file.len());
            let frames = |r: Result<Vec<Frame>>| r.map(|f| f.iter().map(|f| (f.first_seq, f.len)).collect::<Vec<_>>());
            assert_eq!(format!("{:?}", frames(scan(&chained))), format!("{:?}", frames(scan(&file))));
        }
    }

    /// A file is written again only once the absorber has taken what it held, draft
    /// changes alone included: a cycle of draft frames (which carry no seq) waits for
    /// the request that takes them as a cycle of records does.
    #[test]
    fn a_file_of_draft_frames_alone_waits_for_the_request_that_takes_them() {
        let mut journal = Journal::on_backends(Kept::default(), Kept::default(), 4096).unwrap();
        let drafts = vec![0xD7; (JOURNAL_SWITCH_BYTES / 2) as usize];
        let fill = |journal: &mut Journal| {
            while journal.offset() < JOURNAL_SWITCH_BYTES {
                journal.append(1, &ChainHash([0; 32]), &[], &drafts).unwrap();
            }
        };
        fill(&mut journal);
        assert!(journal.switch(0), "the second file holds nothing");
        journal.left(1);
        fill(&mut journal);
        assert_eq!(journal.other_needs(), 1);
        assert!(!journal.switch(0), "the first file's drafts are not in the log file yet");
        assert!(journal.switch(1));
        journal.left(2);
        journal.restart();
        assert_eq!(journal.other_needs(), 0, "a restart follows an absorption of everything");
    }

    /// A follower that read a frame the writer had not finished (its header whole, its
    /// bytes not yet) reads it once it is done, though the header, the file's length and
    /// the log's tip are as they were.
    #[test]
    fn a_follower_reads_again_a_frame_it_found_unfinished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let chain = LogChain::plain();
        let mut prev = chain.genesis();
        let mut frames = Vec::new();
        for seq in 1..=2u64 {
            let mut record = vec![seq as u8; 100];
            let split = record.len() - 32;
            let hash = annal_codec::chain_link(&record[..split], &prev, &chain);
            record[split..].copy_from_slice(&hash.0);
            frames.push(encode_frame(1, seq, &prev, &[Sealed { seq, record, content: vec![7; 100] }], &[]));
            prev = hash;
        }
        let [first, second] = journal_paths(&path);
        let mut file = [frames[0].clone(), frames[1][..frames[1].len() - 50].to_vec(), vec![0; 4096]].concat();
        file.truncate(8192);
        std::fs::write(&first, &file).unwrap();
        std::fs::write(&second, vec![0; 8192]).unwrap();
        let follower = Follower::new(&path);
        let seqs = |tail: &Tail| tail.batches().flat_map(|b| b.rows.iter().map(|r| r.seq)).collect::<Vec<_>>();
        assert_eq!(seqs(&follower.tail_after(0, &chain.genesis(), &chain).unwrap()), vec![1]);
        let at = frames[0].len();
        file[at..at + frames[1].len()].copy_from_slice(&frames[1]);
        std::fs::write(&first, &file).unwrap();
        assert_eq!(seqs(&follower.tail_after(0, &chain.genesis(), &chain).unwrap()), vec![1, 2]);
        // Nothing unfinished: the read is kept, and answers again.
        assert_eq!(seqs(&follower.tail_after(0, &chain.genesis(), &chain).unwrap()), vec![1, 2]);
    }

    /// Past [`TAIL_RECENT_MAX`] batches the tail moves its newest into its long list;
    /// lookups, the order and `after` see one list all the same.
    #[test]
    fn a_long_tail_finds_every_row_across_its_two_lists() {
        let mut tail = Tail::default();
        let mut first = 1;
        for n in (0..3 * TAIL_RECENT_MAX as u64 + 5).map(|i| 1 + i % 3) {
            tail = tail.with(Arc::new(batch(first, n)));
            first += n;
        }
        for seq in 1..first {
            assert_eq!(tail.get(seq).map(|r| r.seq), Some(seq));
        }
        assert!(tail.get(0).is_none() && tail.get(first).is_none());
        let seqs: Vec<u64> = tail.batches().flat_map(|b| b.rows.iter().map(|r| r.seq)).collect();
        assert_eq!(seqs, (1..first).collect::<Vec<_>>());
        let after = tail.after(first / 2);
        assert!(after.first_seq().is_some_and(|s| s <= first / 2 + 1));
        assert!(after.get(first - 1).is_some() && after.get(1).is_none());
    }

    #[test]
    fn the_tail_finds_rows_by_seq_and_drops_absorbed_batches() {
        let tail = Tail::default().with(Arc::new(batch(3, 2))).with(Arc::new(batch(5, 4)));
        for seq in 3..9 {
            assert_eq!(tail.get(seq).map(|r| r.seq), Some(seq));
        }
        assert!(tail.get(2).is_none() && tail.get(9).is_none());
        let after = tail.after(4);
        assert_eq!(after.first_seq(), Some(5));
        assert!(after.get(4).is_none() && after.get(5).is_some());
        assert!(tail.after(8).first_seq().is_none());
    }
}
