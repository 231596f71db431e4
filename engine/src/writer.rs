//! The writer thread: group commit.
//!
//! Callers send requests over a bounded channel and block on their own reply channel.
//! The writer drains whatever is queued (up to `batch_commands_max`) into one write
//! transaction and one fsync. Each command is decided against state that includes the
//! commands before it, staged in an [`Overlay`], and applied only if accepted, so a
//! rejection writes nothing. Replies and subscriber notices go out only after the commit
//! is durable. An I/O error during the commit fails every caller in the batch and
//! poisons the engine.

use crate::command::{Command, Outcome};
use crate::decide::{decide, outcome_of, Decision};
use crate::error::{Error, Limit, Location, Rejection, Result};
use crate::evolve::evolve;
use crate::limits::Limits;
use crate::projection::SessionHead;
use crate::projection::{Projection, ProjectionSet};
use crate::rebuild::RebuildStats;
use crate::store::{apply_writes, decode_row, Overlay, Store, Table};
use crate::tables::{self, ReadStore, RedbStore, CONTENT, LOG, META, SESSION_LOG};
use annal_codec::{encode_record, ChainHash, ContentId, LogChain, Record, SessionId};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use redb::{Database, ReadableDatabase, ReadableTable};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A durable commit, announced to subscribers once per accepted command that wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitNotice {
    /// First global seq written by the command.
    pub first_seq: u64,
    /// Last global seq written by the command.
    pub last_seq: u64,
    /// Sessions the command wrote to.
    pub sessions: Vec<SessionId>,
    /// Commit time, unix ms.
    pub committed_at_ms: u64,
}

/// Queue depth of each subscriber; a subscriber that falls this far behind is dropped
/// (its receiver disconnects) rather than stalling the writer.
pub const SUBSCRIBER_QUEUE_MAX: usize = 65_536;

pub(crate) struct Shared {
    pub db: Arc<crate::engine::Db>,
    pub heads: Arc<crate::cache::HeadCache>,
    pub limits: Limits,
    pub chain: LogChain,
    pub durability: redb::Durability,
    pub poisoned: AtomicBool,
    pub subscribers: Mutex<Vec<Sender<CommitNotice>>>,
    pub batch_commands_max: usize,
}

pub(crate) enum Request {
    Command { command: Command, reply: Sender<Result<Outcome>> },
    Rebuild { set: ProjectionSet, reply: Sender<Result<RebuildStats>> },
    Import { records: Vec<Record>, content: Vec<Vec<u8>>, reply: Sender<Result<ImportStats>> },
}

/// What an import appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportStats {
    /// Records appended.
    pub records: u64,
    /// New content objects stored.
    pub content_objects: u64,
    /// The log tip after the import.
    pub tip_seq: u64,
}

/// The writer's view of the log tip.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tip {
    pub seq: u64,
    pub hash: ChainHash,
    pub clock_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// How long the writer waits, at most, for committers to come back before it starts a
/// batch smaller than the previous one. Committers released by one commit resubmit
/// within microseconds; without this wait they split into two alternating groups that
/// each pay a full fsync.
pub const GATHER_WAIT_MAX: Duration = Duration::from_micros(300);

pub(crate) fn run(shared: Arc<Shared>, rx: Receiver<Request>, mut tip: Tip) {
    let mut previous_batch = 1usize;
    while let Ok(first) = rx.recv() {
        let mut commands = Vec::new();
        let mut pending = Some(first);
        let deadline = Instant::now() + GATHER_WAIT_MAX;
        while let Some(req) = pending.take() {
            match req {
                Request::Command { command, reply } => commands.push((command, reply)),
                Request::Rebuild { set, reply } => {
                    // Commit what came before, then rebuild alone.
                    flush(&shared, &mut tip, std::mem::take(&mut commands));
                    let _ = reply.send(rebuild(&shared, set));
                }
                Request::Import { records, content, reply } => {
                    flush(&shared, &mut tip, std::mem::take(&mut commands));
                    let _ = reply.send(import(&shared, &mut tip, records, content));
                }
            }
            if commands.len() >= shared.batch_commands_max {
                break;
            }
            pending = match rx.try_recv() {
                Ok(req) => Some(req),
                Err(_) if commands.len() < previous_batch => rx.recv_deadline(deadline).ok(),
                Err(_) => None,
            };
        }
        if !commands.is_empty() {
            previous_batch = commands.len();
        }
        flush(&shared, &mut tip, commands);
    }
}

fn rebuild(shared: &Shared, set: ProjectionSet) -> Result<RebuildStats> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    let result = crate::error::fail_closed("rebuild", || {
        crate::rebuild::rebuild_db(&shared.db, &shared.chain, shared.limits.record_bytes_max, set, &mut |_, _| {})
    });
    // Heads read during the rebuild came from the old rows.
    shared.heads.clear();
    if matches!(result, Err(Error::Storage(_)) | Err(Error::Corrupt { location: Location::File, .. })) {
        shared.poisoned.store(true, Ordering::Release);
    }
    result
}

fn flush(shared: &Shared, tip: &mut Tip, batch: Vec<(Command, Sender<Result<Outcome>>)>) {
    if batch.is_empty() {
        return;
    }
    if shared.poisoned.load(Ordering::Acquire) {
        for (_, reply) in batch {
            let _ = reply.send(Err(Error::Poisoned));
        }
        return;
    }
    let commands: Vec<&Command> = batch.iter().map(|(c, _)| c).collect();
    match crate::error::fail_closed("commit", || commit_batch(shared, tip, &commands)) {
        Ok((outcomes, notices)) => {
            for ((_, reply), outcome) in batch.into_iter().zip(outcomes) {
                let _ = reply.send(outcome);
            }
            notify(shared, notices);
        }
        Err(e) => {
            shared.poisoned.store(true, Ordering::Release);
            for (_, reply) in batch {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

fn notify(shared: &Shared, notices: Vec<CommitNotice>) {
    if notices.is_empty() {
        return;
    }
    let mut subs = shared.subscribers.lock();
    subs.retain(|s| notices.iter().all(|n| s.try_send(n.clone()).is_ok()));
}

type Staged = (Vec<Record>, Vec<(ContentId, Vec<u8>)>);

/// Decides and folds one command (or a batch) into `overlay`, sequencing its events.
fn apply<S: Store + ?Sized>(
    overlay: &mut Overlay<'_, S>,
    next_seq: &mut u64,
    clock_ms: u64,
    last_stream: &dyn Fn(&SessionId) -> Result<u64>,
    command: &Command,
    limits: &Limits,
    staged: &mut Staged,
) -> Result<Outcome> {
    if let Command::Batch(commands) = command {
        limits.check(Limit::BatchCommands, commands.len() as u64)?;
        limits.check(Limit::CommandBytes, command.approx_bytes())?;
        let mut outcomes = Vec::with_capacity(commands.len());
        for (index, c) in commands.iter().enumerate() {
            let result = match c {
                Command::Batch(_) => Err(Error::Rejected(Rejection::InvalidRequest { reason: "nested batch".into() })),
                c => apply(overlay, next_seq, clock_ms, last_stream, c, limits, staged),
            };
            match result {
                Ok(o) => outcomes.push(o),
                Err(Error::Rejected(r)) => {
                    return Err(Error::Rejected(Rejection::Batch { index, rejection: Box::new(r) }));
                }
                Err(e) => return Err(e),
            }
        }
        return Ok(Outcome::Batch(outcomes));
    }
    match decide(&*overlay, command, limits)? {
        Decision::Noop(outcome) => Ok(outcome),
        Decision::Write { session, event, content } => {
            let stream_seq = match overlay.stream_tip(&session) {
                Some(s) => s,
                None => last_stream(&session)?,
            } + 1;
            let record = Record { seq: *next_seq, session, stream_seq, committed_at_ms: clock_ms, event };
            evolve(overlay, &record, ProjectionSet::all())?;
            overlay.set_stream_tip(session, stream_seq);
            *next_seq += 1;
            let outcome = outcome_of(&record);
            staged.0.push(record);
            staged.1.extend(content);
            Ok(outcome)
        }
    }
}

type BatchResult = (Vec<Result<Outcome>>, Vec<CommitNotice>);

/// What the accepted commands of a batch will write.
#[derive(Default)]
struct Pending {
    records: Vec<Record>,
    content: std::collections::BTreeMap<ContentId, Vec<u8>>,
    streams: std::collections::BTreeMap<SessionId, u64>,
}

/// Decides and folds the batch on a read snapshot (the writer is the only writer, so the
/// snapshot is the latest commit), then writes what was accepted in one transaction. A
/// batch with nothing to write opens no write transaction at all, so rejections and
/// idempotent retries leave every byte of the file alone.
fn commit_batch(shared: &Shared, tip: &mut Tip, commands: &[&Command]) -> Result<BatchResult> {
    let clock_ms = now_ms().max(tip.clock_ms);
    let mut next_seq = tip.seq + 1;
    let mut outcomes = Vec::with_capacity(commands.len());
    let mut notices = Vec::new();
    let mut pending = Pending::default();
    let snapshot = shared.db.begin_read()?;
    let base = ReadStore::new(&snapshot);
    let session_log = snapshot.open_table(SESSION_LOG)?;
    let mut accepted = Overlay::new(&base);
    for command in commands {
        let mut staged: Staged = (Vec::new(), Vec::new());
        let mut seq = next_seq;
        let result = {
            let mut overlay = Overlay::new(&accepted);
            let last_stream = |s: &SessionId| match pending.streams.get(s) {
                Some(n) => Ok(*n),
                None => tables::last_stream_seq(&session_log, s),
            };
            apply(&mut overlay, &mut seq, clock_ms, &last_stream, command, &shared.limits, &mut staged)
                .map(|o| (o, overlay.into_writes()))
        };
        let (outcome, writes) = match result {
            Ok(ok) => ok,
            Err(e @ Error::Storage(_)) => return Err(e),
            Err(e) => {
                outcomes.push(Err(e));
                continue;
            }
        };
        apply_writes(&mut accepted, writes)?;
        next_seq = seq;
        let mut sessions = Vec::new();
        for record in &staged.0 {
            pending.streams.insert(record.session, record.stream_seq);
            if !sessions.contains(&record.session) {
                sessions.push(record.session);
            }
        }
        if let (Some(first), Some(last)) = (staged.0.first(), staged.0.last()) {
            notices.push(CommitNotice {
                first_seq: first.seq,
                last_seq: last.seq,
                sessions,
                committed_at_ms: clock_ms,
            });
        }
        pending.records.extend(staged.0);
        pending.content.extend(staged.1);
        outcomes.push(Ok(outcome));
    }
    if pending.records.is_empty() {
        return Ok((outcomes, notices));
    }
    let writes = accepted.into_writes();
    drop(session_log);
    drop(snapshot);
    let heads: Vec<SessionHead> = writes
        .get(&Table::Heads)
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| value.as_ref().map(|v| decode_row(Table::Heads, key, v)))
        .collect::<Result<_>>()?;
    *tip = write_batch(shared, *tip, clock_ms, writes, pending)?;
    for head in heads {
        shared.heads.offer(head, true);
    }
    Ok((outcomes, notices))
}

/// Writes an accepted batch: projection rows, sealed records, the per-session index, new
/// content objects and the meta tip, in one transaction with one commit.
fn write_batch(
    shared: &Shared,
    tip: Tip,
    clock_ms: u64,
    writes: crate::store::Writes,
    pending: Pending,
) -> Result<Tip> {
    let mut txn = shared.db.begin_write()?;
    txn.set_durability(shared.durability)?;
    let mut next = Tip { clock_ms, ..tip };
    {
        RedbStore::open(&txn)?.apply(writes)?;
        let mut log = txn.open_table(LOG)?;
        let mut session_log = txn.open_table(SESSION_LOG)?;
        for record in &pending.records {
            let (bytes, hash) = encode_record(record, &next.hash, &shared.chain, shared.limits.record_bytes_max)
                .map_err(|e| Error::Storage(format!("encode record {}: {e}", record.seq)))?;
            log.insert(record.seq, bytes.as_slice())?;
            session_log.insert((record.session.0, record.stream_seq), record.seq)?;
            next.hash = hash;
            next.seq = record.seq;
        }
        let mut content = txn.open_table(CONTENT)?;
        for (id, bytes) in &pending.content {
            if content.get(id.0)?.is_none() {
                content.insert(id.0, bytes.as_slice())?;
            }
        }
        let mut meta = txn.open_table(META)?;
        meta.insert(tables::meta_keys::TIP, tables::encode_tip(next.seq, &next.hash).as_slice())?;
        for p in Projection::ALL {
            meta.insert(tables::meta_keys::cursor(p).as_str(), next.seq.to_le_bytes().as_slice())?;
        }
    }
    txn.commit()?;
    Ok(next)
}

/// Reads the log tip and last commit time, checking them against `meta`.
pub(crate) fn load_tip(db: &Database, chain: &LogChain) -> Result<Tip> {
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    let log = txn.open_table(LOG)?;
    let last = log.last()?.map(|(k, v)| (k.value(), v.value().to_vec()));
    let stored = meta.get(tables::meta_keys::TIP)?.map(|g| tables::decode_tip(g.value())).transpose()?;
    let tip_location = || crate::error::Location::Meta { key: tables::meta_keys::TIP.into() };
    match (last, stored) {
        (None, None) => Ok(Tip { seq: 0, hash: chain.genesis(), clock_ms: 0 }),
        (Some((last_seq, bytes)), Some((seq, hash))) => {
            if last_seq != seq || annal_codec::stored_chain_hash(&bytes) != Some(hash) {
                return Err(Error::corrupt(
                    tip_location(),
                    format!("meta tip {seq} does not match the last record {last_seq}"),
                ));
            }
            let header =
                annal_codec::decode_header(&bytes, u64::MAX).map_err(|source| Error::Decode { seq, source })?;
            Ok(Tip { seq, hash, clock_ms: header.committed_at_ms })
        }
        _ => Err(Error::corrupt(tip_location(), "meta tip and log disagree about emptiness")),
    }
}

fn import_error(seq: u64, reason: impl Into<String>) -> Error {
    Error::Rejected(Rejection::InvalidImport { seq, reason: reason.into() })
}

/// Appends exported records as they are, in one transaction: same seqs, stream seqs,
/// timestamps and so the same chain (under this database's key). Each record must follow
/// the tip densely, keep the clock monotonic, refer only to content it brings or that is
/// stored, and fold cleanly (the fold recomputes every `revision_after`). All or nothing.
fn import(shared: &Shared, tip: &mut Tip, records: Vec<Record>, content: Vec<Vec<u8>>) -> Result<ImportStats> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    shared.heads.clear();
    let result = crate::error::fail_closed("import", || import_txn(shared, tip, records, content));
    shared.heads.clear();
    if matches!(result, Err(Error::Storage(_)) | Err(Error::Corrupt { location: Location::File, .. })) {
        shared.poisoned.store(true, Ordering::Release);
    }
    result
}

fn import_txn(shared: &Shared, tip: &mut Tip, records: Vec<Record>, content: Vec<Vec<u8>>) -> Result<ImportStats> {
    let limits = &shared.limits;
    let offered: std::collections::BTreeMap<ContentId, Vec<u8>> =
        content.into_iter().map(|bytes| (annal_codec::content_id(&bytes), bytes)).collect();
    let mut txn = shared.db.begin_write()?;
    txn.set_durability(shared.durability)?;
    let mut next = *tip;
    let mut stored_objects = 0u64;
    {
        let mut store = RedbStore::open(&txn)?;
        let mut log = txn.open_table(LOG)?;
        let mut session_log = txn.open_table(SESSION_LOG)?;
        let mut content_table = txn.open_table(CONTENT)?;
        for record in &records {
            let seq = record.seq;
            if seq != next.seq + 1 {
                return Err(import_error(seq, format!("expected seq {}", next.seq + 1)));
            }
            if record.committed_at_ms < next.clock_ms {
                return Err(import_error(seq, "committed_at goes back in time"));
            }
            let last = tables::last_stream_seq(&session_log, &record.session)?;
            if record.stream_seq != last + 1 {
                return Err(import_error(seq, format!("expected stream seq {}", last + 1)));
            }
            if let annal_codec::Event::TurnCommitted(e) = &record.event {
                let hash = annal_codec::turn_commit_hash(&e.messages, &e.usage, &e.applied_context, &e.tool_ops);
                if hash != e.commit_hash {
                    return Err(import_error(seq, "commit hash does not recompute"));
                }
            }
            for id in record.event.content_refs() {
                stored_objects += store_offered(&offered, &mut content_table, &id, limits).map_err(|e| match e {
                    Error::Storage(s) => Error::Storage(s),
                    other => import_error(seq, other.to_string()),
                })?;
            }
            evolve(&mut store, record, ProjectionSet::all()).map_err(|e| match e {
                Error::Storage(s) => Error::Storage(s),
                other => import_error(seq, other.to_string()),
            })?;
            let (bytes, hash) = encode_record(record, &next.hash, &shared.chain, limits.record_bytes_max)
                .map_err(|e| import_error(seq, e.to_string()))?;
            log.insert(seq, bytes.as_slice())?;
            session_log.insert((record.session.0, record.stream_seq), seq)?;
            next = Tip { seq, hash, clock_ms: record.committed_at_ms };
        }
        let mut meta = txn.open_table(META)?;
        meta.insert(tables::meta_keys::TIP, tables::encode_tip(next.seq, &next.hash).as_slice())?;
        for p in Projection::ALL {
            meta.insert(tables::meta_keys::cursor(p).as_str(), next.seq.to_le_bytes().as_slice())?;
        }
    }
    txn.commit()?;
    *tip = next;
    Ok(ImportStats { records: records.len() as u64, content_objects: stored_objects, tip_seq: next.seq })
}

/// Makes sure content `id` is stored, taking it from `offered` if needed. Message
/// objects bring their attachments along. Returns how many objects were written.
fn store_offered(
    offered: &std::collections::BTreeMap<ContentId, Vec<u8>>,
    table: &mut redb::Table<[u8; 32], &[u8]>,
    id: &ContentId,
    limits: &Limits,
) -> Result<u64> {
    if table.get(id.0)?.is_some() {
        return Ok(0);
    }
    let bytes = offered.get(id).ok_or_else(|| {
        Error::Rejected(Rejection::InvalidRequest { reason: format!("content {id} is neither offered nor stored") })
    })?;
    limits.check(Limit::ContentBytes, bytes.len() as u64)?;
    table.insert(id.0, bytes.as_slice())?;
    let mut written = 1;
    if let Ok(message) = annal_codec::decode_message(bytes, limits.content_bytes_max) {
        for a in &message.attachments {
            written += store_offered(offered, table, a, limits)?;
        }
    }
    Ok(written)
}
