//! Purge and content garbage collection: erasing a session's data for good while the
//! chain still verifies (`docs/design.md` §7f).
//!
//! A purge is exclusive and offline, like compaction: it needs the database closed. It
//!
//! 1. opens the database as an [`Engine`] (format, key, projections brought up to the
//!    log), decides the purge against its projections (`NotFound`, `Purged`,
//!    `HasForks`), and closes it;
//! 2. in one durable transaction on the log file: appends a [`SessionPurged`] tombstone
//!    per session purged, replaces every earlier record of those sessions by its erased
//!    form (header, payload digest, the same chain hash: [`annal_codec::erase_record`]),
//!    and removes from the content rows every object that no record of a session that is
//!    not purged reaches (with the attachments of the messages it does reach); the
//!    transaction also marks the erasure as unfinished;
//! 3. shreds the projections file (overwrites it with zeros, then deletes it), since its
//!    rows and free pages hold the erased data;
//! 4. rewrites the log file: a new file gets every row of the three tables, is synced
//!    and renamed over the old one, whose bytes are then overwritten with zeros through a
//!    handle kept open; the new file never held an erased byte, and it has no mark;
//! 5. opens the database again, which folds the projections from the log into a new
//!    projections file.
//!
//! A crash before step 2 commits leaves everything as it was; after it, the mark makes
//! the next [`Engine::open`] (or purge, collection, compaction) finish steps 3 and 4
//! before anything else. Garbage collection ([`collect_garbage`]) is the same without
//! tombstones: it removes whatever content nothing live reaches, and rewrites the files
//! only when it removed something.

use crate::engine::{projections_path, Engine, Options};
use crate::error::{fail_closed, Error, Limit, Location, Rejection, Result};
use crate::log::{self, Entry, Tip};
use crate::pieces::ContentWriter;
use crate::projection::{ForkEdge, SessionHead};
use crate::store::{keys, StoreExt, Table};
use crate::tables::{meta_keys, LOG, META};
use annal_codec::content::{entries, push_stored};
use annal_codec::{
    decode_header, decode_record, erase_record, message_attachments, reseal, verify_chain, ContentId, Event, LogChain,
    Record, SessionId, SessionPurged,
};
use redb::{ReadableDatabase, ReadableTable};
use std::collections::{BTreeMap, HashSet};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What to purge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgeRequest {
    /// The session.
    pub session: SessionId,
    /// Why, kept in the tombstone (for example `gdpr-art17`): it must not itself hold
    /// the data being erased. At most `note_bytes_max` bytes.
    pub reason: String,
    /// Who asked, kept in the tombstone. At most `id_bytes_max` bytes.
    pub actor: String,
    /// Purge the session's fork descendants too (transitively). Without it, a session
    /// with descendants that are not purged is refused with [`Rejection::HasForks`].
    pub descendants: bool,
}

impl PurgeRequest {
    /// A purge of `session` alone.
    pub fn new(session: SessionId, reason: impl Into<String>, actor: impl Into<String>) -> PurgeRequest {
        PurgeRequest { session, reason: reason.into(), actor: actor.into(), descendants: false }
    }

    /// Purges the session's fork descendants too.
    pub fn with_descendants(mut self) -> PurgeRequest {
        self.descendants = true;
        self
    }
}

/// What a purge or a collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErasureReport {
    /// Each session purged and the seq of its tombstone, in log order.
    pub purged: Vec<(SessionId, u64)>,
    /// Records replaced by their erased form.
    pub records_erased: u64,
    /// Records sealed again because they were of record format 1 (the chain from the
    /// first of them on changed; 0 for a log written in format 2).
    pub records_resealed: u64,
    /// Content objects removed.
    pub objects_erased: u64,
    /// Their stored bytes.
    pub content_bytes_erased: u64,
    /// Streamed drafts of the purged sessions removed.
    pub drafts_erased: u64,
    /// The log file and projections file together, before.
    pub bytes_before: u64,
    /// The same, after.
    pub bytes_after: u64,
    /// The erasing transaction (scan, rewrite of rows, commit).
    pub erase_elapsed: Duration,
    /// Shredding the projections file and rewriting the log file.
    pub scrub_elapsed: Duration,
    /// Folding the projections again.
    pub rebuild_elapsed: Duration,
}

/// What purges and collections have reclaimed over a database's life (`meta.erased`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Sessions purged.
    pub sessions: u64,
    /// Records erased.
    pub records: u64,
    /// Content objects removed.
    pub objects: u64,
    /// Their stored bytes.
    pub bytes: u64,
}

impl Reclaimed {
    /// Adds these counts to the file's `meta.erased`, in `txn`.
    pub(crate) fn add_to(&self, txn: &redb::WriteTransaction) -> Result<()> {
        let mut meta = txn.open_table(META)?;
        let mut total = meta.get(meta_keys::ERASED)?.and_then(|g| Reclaimed::decode(g.value())).unwrap_or_default();
        total.sessions += self.sessions;
        total.records += self.records;
        total.objects += self.objects;
        total.bytes += self.bytes;
        meta.insert(meta_keys::ERASED, total.encode().as_slice())?;
        Ok(())
    }

    fn encode(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, v) in [self.sessions, self.records, self.objects, self.bytes].into_iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Decodes the `meta.erased` value; anything but 32 bytes is `None`.
    pub fn decode(bytes: &[u8]) -> Option<Reclaimed> {
        let v = |i: usize| bytes.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        if bytes.len() != 32 {
            return None;
        }
        Some(Reclaimed { sessions: v(0)?, records: v(1)?, objects: v(2)?, bytes: v(3)? })
    }

    /// What the log file's meta says, from a read transaction of it.
    pub fn read(txn: &redb::ReadTransaction) -> Result<Reclaimed> {
        let meta = match txn.open_table(META) {
            Ok(meta) => meta,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Reclaimed::default()),
            Err(e) => return Err(e.into()),
        };
        Ok(meta.get(meta_keys::ERASED)?.and_then(|g| Reclaimed::decode(g.value())).unwrap_or_default())
    }
}

/// Purges a session (and with [`PurgeRequest::descendants`] its fork descendants) from
/// the closed database at `path`. See the module documentation for the steps. A
/// rejection (`NotFound`, `Purged`, `HasForks`, `LimitExceeded`) writes nothing.
pub fn purge(path: impl AsRef<Path>, options: Options, request: &PurgeRequest) -> Result<ErasureReport> {
    let path = path.as_ref();
    let engine = Engine::open_with(path, options.clone())?;
    let decided = check(&engine, &options, request);
    engine.close()?;
    erase(path, &options, &decided?, request)
}

/// The sessions a decided purge erases (from [`check`]).
pub(crate) type Decided = Vec<(SessionHead, Option<SessionId>)>;

/// Decides `request` on an open engine: the limits, then the sessions it purges.
pub(crate) fn check(engine: &Engine, options: &Options, request: &PurgeRequest) -> Result<Decided> {
    options.limits.check(Limit::NoteBytes, request.reason.len() as u64)?;
    options.limits.check_id("actor", &request.actor)?;
    decide_purge(engine, request)
}

/// Removes every content object that no record of a session that is not purged reaches,
/// from the closed database at `path`, and rewrites the files if it removed any. Run
/// after a purge it finds nothing: the purge collected already.
pub fn collect_garbage(path: impl AsRef<Path>, options: Options) -> Result<ErasureReport> {
    let path = path.as_ref();
    Engine::open_with(path, options.clone())?.close()?;
    erase(path, &options, &[], &PurgeRequest::new(SessionId([0; 16]), "", ""))
}

/// The sessions to purge, with their heads, the requested one first and descendants in
/// the order they were forked.
fn decide_purge(engine: &Engine, request: &PurgeRequest) -> Result<Decided> {
    let view = engine.reader().snapshot()?;
    let Some(head) = crate::query::head(&view, &request.session)? else {
        return Err(Error::Rejected(Rejection::NotFound { session: request.session }));
    };
    let mut out = vec![(head, None)];
    let mut forks = Vec::new();
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].0.session;
        let mut children = Vec::new();
        view.scan(Table::Forks, &keys::session(&parent), |_, v| {
            children.push(crate::store::decode_row::<ForkEdge>(Table::Forks, &[], v)?);
            Ok(true)
        })?;
        children.sort_by_key(|c| c.seq);
        for child in children {
            if let Some(h) = view.row::<SessionHead>(Table::Heads, &keys::session(&child.child))? {
                forks.push(child.child);
                out.push((h, Some(request.session)));
            }
        }
        i += 1;
    }
    if !forks.is_empty() && !request.descendants {
        return Err(Error::Rejected(Rejection::HasForks { session: request.session, forks }));
    }
    Ok(out)
}

fn files_len(path: &Path) -> u64 {
    [path.to_path_buf(), projections_path(path)].iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum()
}

fn open_exclusive(path: &Path) -> Result<redb::Database> {
    fail_closed("open exclusively", || {
        redb::Database::open(path)
            .map_err(|e| Error::storage_in(format_args!("open {} exclusively", path.display()), e))
    })
}

/// Steps 2 to 5 of the module documentation, for sessions [`check`] decided on an engine
/// since closed.
pub(crate) fn erase(
    path: &Path,
    options: &Options,
    sessions: &[(SessionHead, Option<SessionId>)],
    request: &PurgeRequest,
) -> Result<ErasureReport> {
    let mut report = ErasureReport { bytes_before: files_len(path), ..ErasureReport::default() };
    let chain = options.chain_key.map_or_else(LogChain::plain, LogChain::keyed);
    let started = Instant::now();
    let changed = {
        let db = open_exclusive(path)?;
        let changed = fail_closed("purge", || erase_in_log(&db, &chain, options, sessions, request, &mut report))?;
        drop(db);
        changed
    };
    report.erase_elapsed = started.elapsed();
    if changed {
        let started = Instant::now();
        scrub(path)?;
        report.scrub_elapsed = started.elapsed();
        let started = Instant::now();
        Engine::open_with(path, options.clone())?.close()?;
        report.rebuild_elapsed = started.elapsed();
    }
    report.bytes_after = files_len(path);
    Ok(report)
}

/// The erasing transaction. Returns whether it wrote anything.
fn erase_in_log(
    db: &redb::Database,
    chain: &LogChain,
    options: &Options,
    sessions: &[(SessionHead, Option<SessionId>)],
    request: &PurgeRequest,
    report: &mut ErasureReport,
) -> Result<bool> {
    let limits = &options.limits;
    let (record_max, object_max) = (limits.record_bytes_max, limits.message_object_bytes_max());
    let purged: HashSet<SessionId> = sessions.iter().map(|(h, _)| h.session).collect();
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    // Walk the log: verify the chain, erase the purged sessions' records, seal again
    // from the first record-format-1 record that must change, and gather what the
    // records of the live sessions reach.
    let mut rewrites: Vec<(u64, Vec<u8>)> = Vec::new();
    let (mut messages, mut others) = (HashSet::<ContentId>::new(), HashSet::<ContentId>::new());
    let mut tip = Tip { seq: 0, hash: chain.genesis(), clock_ms: 0 };
    {
        let log = txn.open_table(LOG)?;
        let (mut old_prev, mut resealing) = (chain.genesis(), false);
        for item in log.iter()? {
            let (k, v) = item?;
            let (seq, bytes) = (k.value(), v.value());
            if seq != tip.seq + 1 {
                return Err(Error::corrupt(Location::Log { seq: tip.seq + 1 }, "gap in the log"));
            }
            old_prev = verify_chain(bytes, &old_prev, chain, seq).map_err(|source| Error::Decode { seq, source })?;
            let header = decode_header(bytes, record_max).map_err(|source| Error::Decode { seq, source })?;
            let erase_it = purged.contains(&header.session) && !header.erased;
            resealing |= erase_it && header.format == annal_codec::FORMAT_VERSION_V1;
            let (mut out, hash) = if resealing {
                reseal(bytes, &tip.hash, chain, record_max).map_err(|source| Error::Decode { seq, source })?
            } else {
                (bytes.to_vec(), old_prev)
            };
            if erase_it {
                out = erase_record(&out, chain, record_max).map_err(|source| Error::Decode { seq, source })?;
                report.records_erased += 1;
            } else if !header.erased {
                let record = decode_record(bytes, record_max).map_err(|source| Error::Decode { seq, source })?.record;
                collect_refs(&record.event, &mut messages, &mut others);
            }
            if resealing {
                report.records_resealed += u64::from(header.format == annal_codec::FORMAT_VERSION_V1);
            }
            if out != bytes {
                rewrites.push((seq, out));
            }
            tip = Tip { seq, hash, clock_ms: header.committed_at_ms.max(tip.clock_ms) };
        }
    }
    // What the live messages' attachments add, then the rows rewritten without the rest.
    let mut content_rewrites: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
    {
        let content = ContentWriter::open(&txn)?;
        for item in content.iter()? {
            let (seq, row) = item?;
            for entry in entries(&row, object_max) {
                let entry = entry.map_err(|e| Error::corrupt(Location::Log { seq }, e.to_string()))?;
                if messages.contains(&entry.id) {
                    let bytes = entry
                        .canonical(object_max)
                        .map_err(|e| Error::corrupt(Location::Content { id: entry.id.to_hex() }, e.to_string()))?;
                    if let Ok(attachments) = message_attachments(&bytes, object_max) {
                        others.extend(attachments);
                    }
                }
            }
        }
        for item in content.iter()? {
            let (seq, row) = item?;
            let keep = |id: &ContentId| messages.contains(id) || others.contains(id);
            if let Some((row, removed, bytes)) = filter_row(seq, &row, object_max, keep)? {
                report.objects_erased += removed.len() as u64;
                report.content_bytes_erased += bytes;
                content_rewrites.push((seq, (!row.is_empty()).then_some(row)));
            }
        }
    }
    if sessions.is_empty() && rewrites.is_empty() && content_rewrites.is_empty() {
        return Ok(false);
    }
    {
        let mut log = txn.open_table(LOG)?;
        for (seq, bytes) in &rewrites {
            log.insert(*seq, bytes.as_slice())?;
        }
        let mut content = ContentWriter::open(&txn)?;
        for (seq, row) in &content_rewrites {
            match row {
                Some(row) => content.put(*seq, row)?,
                None => content.remove(*seq)?,
            }
        }
    }
    // The purged sessions' streamed drafts: primary data too, kept beside the chain.
    for (head, _) in sessions {
        report.drafts_erased += crate::draft::remove_session(&txn, &head.session)?;
    }
    // The tombstones, one per session, through the one appender.
    let at = options.clock.now_ms().max(tip.clock_ms);
    let entries: Vec<Entry> = sessions
        .iter()
        .enumerate()
        .map(|(i, (head, ancestor))| Entry {
            record: Record {
                seq: tip.seq + 1 + i as u64,
                session: head.session,
                stream_seq: head.stream_seq + 1,
                committed_at_ms: at,
                event: Event::SessionPurged(SessionPurged {
                    reason: request.reason.clone(),
                    actor: request.actor.clone(),
                    with_ancestor: *ancestor,
                }),
            },
            content: Vec::new(),
        })
        .collect();
    log::append(&txn, tip, chain, record_max, &entries)?;
    report.purged = entries.iter().map(|e| (e.record.session, e.record.seq)).collect();
    let reclaimed = Reclaimed {
        sessions: sessions.len() as u64,
        records: report.records_erased,
        objects: report.objects_erased,
        bytes: report.content_bytes_erased,
    };
    reclaimed.add_to(&txn)?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(meta_keys::ERASURE_UNFINISHED, [1u8].as_slice())?;
    }
    txn.commit()?;
    Ok(true)
}

/// A filtered content row: its new bytes, the ids removed, their stored bytes.
pub(crate) type Filtered = (Vec<u8>, Vec<ContentId>, u64);

/// A content row without the objects `keep` refuses: the row's new bytes (empty when
/// nothing is kept), the ids removed and their stored bytes, or `None` when every object
/// is kept. Used by a purge and by the online collection.
pub(crate) fn filter_row(
    seq: u64,
    row: &[u8],
    object_max: u64,
    keep: impl Fn(&ContentId) -> bool,
) -> Result<Option<Filtered>> {
    let (mut kept, mut removed, mut bytes) = (Vec::new(), Vec::new(), 0u64);
    for entry in entries(row, object_max) {
        let entry = entry.map_err(|e| Error::corrupt(Location::Log { seq }, format!("content row: {e}")))?;
        if keep(&entry.id) {
            push_stored(&mut kept, &entry.id, entry.encoding, entry.stored);
        } else {
            removed.push(entry.id);
            bytes += entry.stored.len() as u64;
        }
    }
    Ok((!removed.is_empty()).then_some((kept, removed, bytes)))
}

/// The content ids an event reaches directly, split into message objects (whose
/// attachments it reaches too) and other objects.
pub(crate) fn collect_refs(event: &Event, messages: &mut HashSet<ContentId>, others: &mut HashSet<ContentId>) {
    let message_refs: &[ContentId] = match event {
        Event::SessionCreated(e) => &e.messages,
        Event::TurnCommitted(e) => &e.messages,
        Event::TranscriptRewritten(e) => &e.replacement,
        Event::InputEnqueued(e) => std::slice::from_ref(&e.message),
        _ => &[],
    };
    messages.extend(message_refs.iter().copied());
    others.extend(event.content_refs().into_iter().filter(|id| !message_refs.contains(id)));
}

/// Whether a read transaction of a log file sees the mark of an unfinished erasure.
pub fn unfinished_in(txn: &redb::ReadTransaction) -> bool {
    erasure_unfinished(txn).unwrap_or(false)
}

/// [`unfinished_in`], with the error of a file that cannot be read (a file with no
/// `meta` table has no mark).
pub(crate) fn erasure_unfinished(txn: &redb::ReadTransaction) -> Result<bool> {
    match txn.open_table(META) {
        Ok(meta) => Ok(meta.get(meta_keys::ERASURE_UNFINISHED)?.is_some()),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Finishes an interrupted erasure (steps 3 and 4): [`Engine::open`] calls it when the
/// log file carries the mark, before anything else.
pub(crate) fn finish(path: &Path) -> Result<()> {
    scrub(path)
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.display().to_string();
    move |e| Error::storage_in(format_args!("{what} {path}"), e)
}

/// Overwrites `file` from its start with zeros over its whole length, and syncs it.
fn zero(file: &mut std::fs::File, path: &Path) -> Result<()> {
    let len = file.metadata().map_err(io("stat", path))?.len();
    file.seek(std::io::SeekFrom::Start(0)).map_err(io("seek", path))?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n]).map_err(io("overwrite", path))?;
        left -= n as u64;
    }
    file.sync_all().map_err(io("sync", path))
}

pub(crate) fn sync_dir(path: &Path) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("sync directory", dir))
}

/// The file the log is rewritten into before it replaces the log.
pub fn scrub_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".scrub");
    PathBuf::from(name)
}

/// Compaction passes at most on the rewritten log file.
const COMPACT_PASSES_MAX: usize = 8;

/// Bytes of rows copied per transaction when the log is rewritten.
const SCRUB_TXN_BYTES: u64 = 64 << 20;

/// Steps 3 and 4: shred the projections file; rewrite the log file into a new one
/// without the mark, rename it over the log, and overwrite the old file's bytes.
fn scrub(path: &Path) -> Result<()> {
    let projections = projections_path(path);
    if projections.exists() {
        let mut file = std::fs::OpenOptions::new().write(true).open(&projections).map_err(io("open", &projections))?;
        zero(&mut file, &projections)?;
        drop(file);
        std::fs::remove_file(&projections).map_err(io("remove", &projections))?;
    }
    let tmp = scrub_path(path);
    if tmp.exists() {
        std::fs::remove_file(&tmp).map_err(io("remove", &tmp))?;
    }
    fail_closed("scrub", || {
        let old = open_exclusive(path)?;
        let mut new =
            redb::Database::create(&tmp).map_err(|e| Error::storage_in(format_args!("create {}", tmp.display()), e))?;
        let read = old.begin_read()?;
        copy_table(&read, &new, LOG)?;
        copy_content(&read, &new)?;
        copy_bytes_table(&read, &new, crate::draft::DRAFTS)?;
        copy_bytes_table(&read, &new, crate::draft::DRAFT_INDEX)?;
        let txn = new.begin_write()?;
        {
            let meta = read.open_table(META)?;
            let mut out = txn.open_table(META)?;
            for item in meta.iter()? {
                let (k, v) = item?;
                if k.value() != meta_keys::ERASURE_UNFINISHED {
                    out.insert(k.value(), v.value())?;
                }
            }
            // Every row was copied through the content writer, which listed its ids.
            out.insert(meta_keys::CONTENT_IDS_FROM, 1u64.to_le_bytes().as_slice())?;
        }
        txn.commit()?;
        // Bulk inserts leave free pages in the new file (holding only copies of what it
        // keeps); compaction gives them back, so the file is no larger than it must be.
        for _ in 0..COMPACT_PASSES_MAX {
            if !new.compact().map_err(|e| Error::storage_in("compaction", e))? {
                break;
            }
        }
        Ok(())
    })?;
    // The new file is durable (its last commit synced it); keep a handle on the old one,
    // put the new one in its place, then overwrite what the old one held.
    let mut old = std::fs::OpenOptions::new().write(true).open(path).map_err(io("open", path))?;
    std::fs::rename(&tmp, path).map_err(io("rename over", path))?;
    sync_dir(path)?;
    zero(&mut old, path)?;
    Ok(())
}

/// Copies every row of `table` into `new`, in transactions of about
/// [`SCRUB_TXN_BYTES`]. Each is durable: redb reuses the pages a transaction frees only
/// after a durable commit, so non-durable ones would grow the new file (measured: a
/// 48.5 MB log was rewritten into 71 MB), and a sync per 64 MiB costs little.
/// Copies every content row into `new`, in pieces whatever its layout in the old file.
fn copy_content(read: &redb::ReadTransaction, new: &redb::Database) -> Result<()> {
    let source = crate::pieces::ContentReader::open(read)?;
    let mut rows = source.iter()?.peekable();
    loop {
        let txn = new.begin_write()?;
        let last = {
            let mut out = ContentWriter::open(&txn)?;
            let mut bytes = 0u64;
            while bytes < SCRUB_TXN_BYTES {
                let Some(item) = rows.next() else { break };
                let (seq, row) = item?;
                bytes += row.len() as u64 + 8;
                out.append(seq, &row)?;
            }
            rows.peek().is_none()
        };
        txn.commit()?;
        if last {
            return Ok(());
        }
    }
}

fn copy_table(
    read: &redb::ReadTransaction,
    new: &redb::Database,
    table: redb::TableDefinition<u64, &[u8]>,
) -> Result<()> {
    let source = read.open_table(table)?;
    let mut rows = source.iter()?.peekable();
    loop {
        let txn = new.begin_write()?;
        let last = {
            let mut out = txn.open_table(table)?;
            let mut bytes = 0u64;
            while bytes < SCRUB_TXN_BYTES {
                let Some(item) = rows.next() else { break };
                let (k, v) = item?;
                bytes += v.value().len() as u64 + 8;
                out.insert(k.value(), v.value())?;
            }
            rows.peek().is_none()
        };
        txn.commit()?;
        if last {
            return Ok(());
        }
    }
}

/// Copies every row of a table keyed by bytes (the drafts, bounded by
/// `draft_bytes_total_max`) into `new`, in one durable transaction. A table the old file
/// does not have is left out.
fn copy_bytes_table(
    read: &redb::ReadTransaction,
    new: &redb::Database,
    table: redb::TableDefinition<&[u8], &[u8]>,
) -> Result<()> {
    let source = match read.open_table(table) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let txn = new.begin_write()?;
    {
        let mut out = txn.open_table(table)?;
        for item in source.iter()? {
            let (k, v) = item?;
            out.insert(k.value(), v.value())?;
        }
    }
    txn.commit()?;
    Ok(())
}

/// Every seq the session `session` has a record at, with whether it is erased: for tests
/// and tools that check a purge.
pub fn session_records(path: &Path, session: &SessionId) -> Result<BTreeMap<u64, bool>> {
    let db = crate::unclean::open_read_only(path, crate::reader::READER_CACHE_BYTES)?;
    let txn = db.begin_read()?;
    let log = txn.open_table(LOG)?;
    let mut out = BTreeMap::new();
    for item in log.iter()? {
        let (k, v) = item?;
        let header = decode_header(v.value(), u64::MAX).map_err(|source| Error::Decode { seq: k.value(), source })?;
        if header.session == *session {
            out.insert(k.value(), header.erased);
        }
    }
    Ok(out)
}
