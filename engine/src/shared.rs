//! A host of a shared log (`docs/design.md` §13): the engine with its log on a
//! [`LogBackend`] that several hosts append to, each folding every host's messages into
//! its own files.
//!
//! - **Publishing.** The writer gathers a batch of commands and decides them, as the
//!   embedded engine does, against its fold of the stream. Each accepted command that
//!   writes becomes one message ([`encode_message`]): its records, with their session
//!   stream sequences as decided and the global sequence left to the fold, the content
//!   objects they introduce, and a MAC under the chain key. The batch is appended in one
//!   pipelined call. The writer then waits until its own fold has taken in every message
//!   it stored, and answers each caller with the fold's verdict.
//! - **Folding.** A pump thread subscribes to the stream from the host's position and
//!   hands messages to the writer thread in order. The fold (`fold_batch`) applies a
//!   message only if its MAC holds, it decodes, every record's session stream sequence
//!   follows the session's last applied record at that point of the stream, and every
//!   record folds (`evolve`, the same checks as an import). Otherwise the whole message
//!   is *void* on every host: nothing of it is applied. Applied records take the next
//!   global sequence numbers and the host's chain, and go into the host's log file with
//!   the stream position, without an fsync (the stream is the durable copy); the delta,
//!   the checkpointer and every query work as in the embedded engine.
//! - **Conflicts.** A command whose message was void, or that the backend refused
//!   under its expectation, is decided again against the fold that now holds what beat
//!   it, and published again, a bounded number of times: a command with an expectation
//!   (an expected revision) then gets its typed rejection, and one without is applied
//!   after the other, as on one host. A turn retried across hosts is answered by the
//!   turn index, as on one host.

use crate::backend::{BackendError, Expected, LogBackend, Publish, Published, StreamMessage, Target};
use crate::checkpoint::Signal;
use crate::command::{Command, Outcome};
use crate::decide::Prepared;
use crate::delta::LogUpdate;
use crate::error::{Error, Rejection, Result};
use crate::log::Entry;
use crate::store::Overlay;
use crate::tables::{meta_keys, META};
use crate::writer::{after_apply, notify, CommitNotice, ReplyTo, Request, Shared};
use annal_codec::content::{entries as content_entries, push_stored};
use annal_codec::{content_id, decode_record, encode_record, ChainHash, ContentId, LogChain, Record, SessionId};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use redb::ReadableDatabase;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The magic of a message.
pub const MESSAGE_MAGIC: &[u8; 4] = b"ANNM";
/// The message format of a message without guards, which every release reads.
pub const MESSAGE_VERSION: u8 = 1;
/// The message format of a message with guards ([`encode_guarded_message`]).
pub const MESSAGE_VERSION_GUARDED: u8 = 2;
/// Bytes of one guard in a message: a session id and a stream sequence.
const GUARD_BYTES: usize = 16 + 8;
/// How many times a command is decided again after its message lost to another.
pub const REDECIDE_MAX: u32 = 64;
/// The most messages the fold takes in one transaction of the host's log file, and the
/// most the pump reads from the stream at once.
pub const FOLD_BATCH_MAX: usize = 1024;
/// The most messages queued between the pump and the fold.
pub const FOLD_QUEUE_MESSAGES_MAX: usize = 4096;
/// The most payload bytes queued between the pump and the fold: a host far behind a
/// stream of large messages holds this much of it in memory, not
/// [`FOLD_QUEUE_MESSAGES_MAX`] of the largest messages the backend takes. A message
/// larger than the bound goes alone.
pub const FOLD_QUEUE_BYTES_MAX: u64 = 64 << 20;
/// How often the host's log file gets a durable commit while messages arrive.
const DURABLE_EVERY: Duration = Duration::from_secs(1);
/// How long a published message may wait for the fold before its caller gets
/// [`BackendError::Unavailable`].
const FOLD_WAIT_MAX: Duration = Duration::from_secs(60);

/// Encodes the entries one command decided as a message: `"ANNM"`, the version, the
/// entry count (u32 LE), then per entry the record (u32 LE length, the record encoded
/// with global sequence 0 and a zero previous hash) and its content row (u32 LE length,
/// the row), then a 32-byte MAC, `H_k(zero hash ‖ everything before)` with the chain's
/// key (`docs/design.md` §13).
pub fn encode_message(records: &[(Record, Vec<u8>)], chain: &LogChain, record_bytes_max: u64) -> Result<Vec<u8>> {
    encode_guarded_message(records, &[], chain, record_bytes_max)
}

/// Encodes a message as [`encode_message`] does, with `guards`: (session, stream
/// sequence) pairs that must each be the session's next stream sequence where the fold
/// meets the message, or the message is void ([`Void::Stale`]). A command fenced by the
/// lease of a session it does not write (a fork fenced on its parent, a fenced batch of
/// other sessions) carries its fence session as a guard, so a takeover of the lease
/// that the stream orders before it voids it on every host. Without guards the bytes
/// are [`encode_message`]'s (format 1); with them, format 2 puts after the version the
/// guard count (u32 LE) and each guard (16-byte session id, u64 LE stream sequence).
pub fn encode_guarded_message(
    records: &[(Record, Vec<u8>)],
    guards: &[(SessionId, u64)],
    chain: &LogChain,
    record_bytes_max: u64,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MESSAGE_MAGIC);
    match guards.is_empty() {
        true => out.push(MESSAGE_VERSION),
        false => {
            out.push(MESSAGE_VERSION_GUARDED);
            out.extend_from_slice(&(guards.len() as u32).to_le_bytes());
            for (session, stream_seq) in guards {
                out.extend_from_slice(&session.0);
                out.extend_from_slice(&stream_seq.to_le_bytes());
            }
        }
    }
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for (record, row) in records {
        let mut record = record.clone();
        record.seq = 0;
        let (bytes, _) = encode_record(&record, &ChainHash([0; 32]), chain, record_bytes_max)
            .map_err(|e| Error::Rejected(Rejection::InvalidRequest { reason: format!("record: {e}") }))?;
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
        out.extend_from_slice(&(row.len() as u32).to_le_bytes());
        out.extend_from_slice(row);
    }
    let mac = chain.next(&ChainHash([0; 32]), &out);
    out.extend_from_slice(&mac.0);
    Ok(out)
}

/// Why a message was void: nothing of it applies, on any host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Void {
    /// Its MAC does not hold under this host's chain key: not written by a holder of
    /// the key, or damaged.
    Forged,
    /// It does not decode.
    Malformed(String),
    /// A record's session stream sequence does not follow the session's last applied
    /// record: it was decided under a state that another message changed first.
    Stale {
        /// The session.
        session: SessionId,
        /// The sequence the record carried.
        carried: u64,
        /// The sequence the session's next record takes.
        next: u64,
    },
    /// A record does not fold (what an import would refuse).
    Invalid(String),
}

impl std::fmt::Display for Void {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Void::Forged => write!(f, "its MAC does not hold"),
            Void::Malformed(why) => write!(f, "malformed: {why}"),
            Void::Stale { session, carried, next } => {
                write!(f, "session {session} record {carried} decided where the next is {next}")
            }
            Void::Invalid(why) => write!(f, "does not fold: {why}"),
        }
    }
}

/// A decoded message: its records, and the content objects it carries by id
/// (canonical bytes, each checked against its id).
#[derive(Clone, Debug, Default)]
pub struct Message {
    /// The records, with global sequence 0.
    pub records: Vec<Record>,
    /// The objects.
    pub objects: BTreeMap<ContentId, Vec<u8>>,
    /// Each object's stored form as the message carries it (encoding, stored bytes), so
    /// that the fold stores it without compressing it again.
    pub stored: BTreeMap<ContentId, (u8, Vec<u8>)>,
    /// The guards ([`encode_guarded_message`]): each session's stream sequence the fold
    /// must find next.
    pub guards: Vec<(SessionId, u64)>,
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> std::result::Result<&'a [u8], Void> {
    if bytes.len() < n {
        return Err(Void::Malformed("truncated".into()));
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn take_u32(bytes: &mut &[u8]) -> std::result::Result<usize, Void> {
    let b = take(bytes, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// Decodes a message and checks its MAC. Never panics, whatever the bytes; every
/// length is checked against what is left and against the limits.
pub fn decode_message(
    bytes: &[u8],
    chain: &LogChain,
    record_bytes_max: u64,
    object_bytes_max: u64,
) -> std::result::Result<Message, Void> {
    if bytes.len() < MESSAGE_MAGIC.len() + 1 + 4 + 32 {
        return Err(Void::Malformed("shorter than a message".into()));
    }
    let (body, mac) = bytes.split_at(bytes.len() - 32);
    if chain.next(&ChainHash([0; 32]), body).0[..] != mac[..] {
        return Err(Void::Forged);
    }
    let mut rest = body;
    if take(&mut rest, 4)? != MESSAGE_MAGIC {
        return Err(Void::Malformed("bad magic".into()));
    }
    let version = take(&mut rest, 1)?[0];
    let mut message = Message::default();
    match version {
        MESSAGE_VERSION => {}
        MESSAGE_VERSION_GUARDED => {
            let guards = take_u32(&mut rest)?;
            if guards == 0 || guards > rest.len() / GUARD_BYTES {
                return Err(Void::Malformed(format!("{guards} guards")));
            }
            for _ in 0..guards {
                let guard = take(&mut rest, GUARD_BYTES)?;
                let (session, stream_seq) = guard.split_at(16);
                let session = SessionId(session.try_into().map_err(|_| Void::Malformed("guard".into()))?);
                let stream_seq =
                    u64::from_le_bytes(stream_seq.try_into().map_err(|_| Void::Malformed("guard".into()))?);
                message.guards.push((session, stream_seq));
            }
        }
        _ => return Err(Void::Malformed(format!("message version {version}"))),
    }
    let count = take_u32(&mut rest)?;
    for _ in 0..count {
        let len = take_u32(&mut rest)?;
        let record = decode_record(take(&mut rest, len)?, record_bytes_max)
            .map_err(|e| Void::Malformed(format!("record: {e}")))?
            .record;
        let len = take_u32(&mut rest)?;
        let row = take(&mut rest, len)?;
        for entry in content_entries(row, object_bytes_max) {
            let entry = entry.map_err(|e| Void::Malformed(format!("content: {e}")))?;
            let canonical = entry.canonical(object_bytes_max).map_err(|e| Void::Malformed(format!("content: {e}")))?;
            if content_id(&canonical) != entry.id {
                return Err(Void::Malformed(format!("content {} does not hash to its id", entry.id)));
            }
            message.objects.insert(entry.id, canonical.into_owned());
            message.stored.insert(entry.id, (entry.encoding, entry.stored.to_vec()));
        }
        message.records.push(record);
    }
    if !rest.is_empty() {
        return Err(Void::Malformed("trailing bytes".into()));
    }
    Ok(message)
}

/// What the fold made of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Applied: its records took global seqs from `first_seq`, stamped `at_ms`.
    Applied { first_seq: u64, at_ms: u64 },
    /// Void.
    Void(Void),
}

/// What the writer thread of a host keeps.
pub(crate) struct HostState {
    /// The last stream sequence folded.
    pub position: u64,
    /// Each session's last message on its own subject (what the backend's expectation
    /// takes), as far as this host has folded.
    pub subject_last: HashMap<SessionId, u64>,
    /// When the host's log file last had a durable commit.
    pub last_durable: Instant,
    /// Drawn at open: the idempotency keys of this host's messages are its own.
    pub nonce: [u8; 16],
}

/// What callers and the writer share about a host: its position, and a condition to
/// wait on for it.
pub(crate) struct HostShared {
    pub backend: Arc<dyn LogBackend>,
    pub position: Mutex<u64>,
    pub moved: Condvar,
    /// The highest stream sequence the pump has seen.
    pub seen: AtomicU64,
    pub stop: AtomicBool,
    /// The payload bytes the pump queued and the fold has not taken yet.
    pub queued: QueueBytes,
}

/// Payload bytes in the queue between the pump and the fold, bounded: the pump waits
/// before it queues past the bound ([`QueueBytes::take`]) and the fold gives the bytes
/// back as it takes the messages ([`QueueBytes::give_back`]).
pub(crate) struct QueueBytes {
    used: Mutex<u64>,
    freed: Condvar,
    max: u64,
}

impl QueueBytes {
    /// A queue of at most `max` bytes.
    pub fn new(max: u64) -> QueueBytes {
        QueueBytes { used: Mutex::new(0), freed: Condvar::new(), max }
    }

    /// Counts `n` bytes in once they fit (at once when the queue is empty, whatever
    /// `n`), or returns false when `stop` is set while waiting.
    pub fn take(&self, n: u64, stop: &AtomicBool) -> bool {
        let mut used = self.used.lock();
        while *used > 0 && used.saturating_add(n) > self.max {
            if stop.load(Ordering::Acquire) {
                return false;
            }
            self.freed.wait_for(&mut used, Duration::from_millis(100));
        }
        *used += n;
        true
    }

    /// Gives back `n` bytes the fold took off the queue.
    pub fn give_back(&self, n: u64) {
        let mut used = self.used.lock();
        *used = used.saturating_sub(n);
        self.freed.notify_all();
    }

    /// Bytes queued now.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        *self.used.lock()
    }
}

/// A host's progress through the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStatus {
    /// The last stream sequence this host's fold took in.
    pub position: u64,
    /// The stream's last sequence, as the backend last told it.
    pub stream_tip: u64,
}

impl HostStatus {
    /// Messages the fold is behind the stream.
    pub fn lag(&self) -> u64 {
        self.stream_tip.saturating_sub(self.position)
    }
}

/// Reads the stream position from the host's log file (0 for a new host).
pub(crate) fn read_position(txn: &redb::ReadTransaction) -> Result<u64> {
    let Ok(meta) = txn.open_table(META) else {
        return Ok(0);
    };
    let position = meta.get(meta_keys::STREAM_POSITION)?.and_then(|g| crate::tables::meta_u64(g.value()));
    Ok(position.unwrap_or(0))
}

/// Folds `messages` (in stream order, each the one after the host's position) into the
/// host's files in one transaction, and returns each message's verdict.
pub(crate) fn fold_batch(
    shared: &Shared,
    host: &mut HostState,
    messages: Vec<StreamMessage>,
    checkpoints: &Sender<Signal>,
) -> Result<Vec<(u64, Verdict)>> {
    let tip = *shared.tip.lock();
    let view = shared.delta.view();
    let mut overlay = Overlay::new(&view);
    let (mut next_seq, mut clock_ms) = (tip.seq + 1, tip.clock_ms);
    let mut entries = Vec::new();
    let mut verdicts = Vec::with_capacity(messages.len());
    let mut notices = Vec::new();
    for m in messages {
        if m.seq != host.position + 1 {
            return Err(Error::Backend(BackendError::Other(format!(
                "the stream gave message {} after {}",
                m.seq, host.position
            ))));
        }
        host.position = m.seq;
        if let Target::Session(s) = m.target {
            host.subject_last.insert(s, m.seq);
        }
        overlay.stage();
        let start = entries.len();
        match fold_one(shared, &mut overlay, &mut entries, &m, next_seq, clock_ms) {
            Ok(at_ms) => {
                overlay.keep();
                let last_seq = next_seq + (entries.len() - start) as u64 - 1;
                notices.extend(CommitNotice::of(entries[start..].iter().map(|e| &e.record), at_ms));
                verdicts.push((m.seq, Verdict::Applied { first_seq: next_seq, at_ms }));
                next_seq = last_seq + 1;
                clock_ms = at_ms;
            }
            Err(Folding::Void(void)) => {
                overlay.discard();
                entries.truncate(start);
                verdicts.push((m.seq, Verdict::Void(void)));
            }
            Err(Folding::Failed(e)) => return Err(e),
        }
    }
    let writes = overlay.into_writes();
    drop(view);
    let mut txn = shared.log_db.begin_write()?;
    let durable = host.last_durable.elapsed() >= DURABLE_EVERY;
    txn.set_durability(if durable { redb::Durability::Immediate } else { shared.durability })?;
    let next = match entries.is_empty() {
        true => tip,
        false => crate::log::append(&txn, tip, &shared.chain, shared.limits.record_bytes_max, &entries)?.0,
    };
    txn.open_table(META)?.insert(meta_keys::STREAM_POSITION, &host.position.to_le_bytes()[..])?;
    txn.commit()?;
    if durable {
        host.last_durable = Instant::now();
    }
    if !entries.is_empty() {
        shared.stats.log_commits.fetch_add(1, Ordering::Relaxed);
        shared.stats.events.fetch_add(entries.len() as u64, Ordering::Relaxed);
        let log = LogUpdate::File(shared.log_db.begin_read()?);
        shared.delta.apply(writes, next.seq, next.hash, entries.len() as u64, log);
        *shared.tip.lock() = next;
        notify(shared, notices);
        after_apply(shared, checkpoints);
    }
    Ok(verdicts)
}

enum Folding {
    Void(Void),
    Failed(Error),
}

/// Folds one message into `overlay`: its records numbered from `next_seq` and stamped
/// no earlier than `clock_ms`, their entries appended to `entries` (the batch's so far,
/// whose rows the content checks read; on an error the caller cuts them back). Returns
/// their time.
fn fold_one(
    shared: &Shared,
    overlay: &mut Overlay<'_, crate::delta::View>,
    entries: &mut Vec<Entry>,
    m: &StreamMessage,
    next_seq: u64,
    clock_ms: u64,
) -> std::result::Result<u64, Folding> {
    let limits = &shared.limits;
    let message = decode_message(&m.payload, &shared.chain, limits.record_bytes_max, limits.message_object_bytes_max())
        .map_err(Folding::Void)?;
    if message.records.is_empty() {
        return Err(Folding::Void(Void::Malformed("no records".into())));
    }
    if let Target::Session(s) = m.target {
        if message.records.iter().any(|r| r.session != s) {
            return Err(Folding::Void(Void::Malformed("a record of another session than its subject's".into())));
        }
    }
    // A guard's session must be where the command was decided (its fence's lease, say,
    // not taken over since).
    for (session, carried) in &message.guards {
        let next = crate::writer::next_stream_seq(&*overlay, session).map_err(Folding::Failed)?;
        if *carried != next {
            return Err(Folding::Void(Void::Stale { session: *session, carried: *carried, next }));
        }
    }
    let mut at_ms = clock_ms;
    for (i, mut record) in message.records.into_iter().enumerate() {
        let next = crate::writer::next_stream_seq(&*overlay, &record.session).map_err(Folding::Failed)?;
        if record.stream_seq != next {
            let void = Void::Stale { session: record.session, carried: record.stream_seq, next };
            return Err(Folding::Void(void));
        }
        record.seq = next_seq + i as u64;
        record.committed_at_ms = record.committed_at_ms.max(at_ms);
        at_ms = record.committed_at_ms;
        let offer = crate::import::Offered {
            objects: &message.objects,
            stored: &message.stored,
            compression: shared.compression,
        };
        match crate::import::fold_foreign(overlay, crate::log::Staged([entries, &[]]), offer, record, m.seq, limits) {
            Ok(entry) => entries.push(entry),
            Err(e @ Error::Storage(_)) => return Err(Folding::Failed(e)),
            Err(e) => return Err(Folding::Void(Void::Invalid(e.to_string()))),
        }
    }
    Ok(at_ms)
}

/// A command waiting for its message's verdict.
struct Waiting {
    queued: Queued,
    /// The outcome as decided, its seqs counted from `placeholder`.
    outcome: Outcome,
    placeholder: u64,
    since: Instant,
}

/// A command queued to be decided (again).
struct Queued {
    command: Command,
    prepared: Box<Prepared>,
    reply: ReplyTo<Outcome>,
    tries: u32,
}

/// The writer thread of a host: decides and publishes batches, folds the stream, and
/// answers callers once their messages are folded.
pub(crate) fn run(
    shared: Arc<Shared>,
    rx: Receiver<Request>,
    folds: Receiver<StreamMessage>,
    host: Arc<HostShared>,
    mut state: HostState,
    checkpoints: Sender<Signal>,
) {
    let mut requests = Some(rx);
    let mut queue: VecDeque<Queued> = VecDeque::new();
    let mut waiting: BTreeMap<u64, Vec<Waiting>> = BTreeMap::new();
    let never = crossbeam_channel::never();
    loop {
        let taking = waiting.is_empty() && queue.is_empty();
        let rx = match (&requests, taking) {
            (Some(rx), true) => rx,
            _ => &never,
        };
        crossbeam_channel::select! {
            recv(folds) -> m => match m {
                Ok(first) => {
                    let mut batch = vec![first];
                    while batch.len() < FOLD_BATCH_MAX {
                        match folds.try_recv() {
                            Ok(m) => batch.push(m),
                            Err(_) => break,
                        }
                    }
                    host.queued.give_back(batch.iter().map(|m| m.payload.len() as u64).sum());
                    fold(&shared, &host, &mut state, batch, &checkpoints, &mut waiting, &mut queue);
                }
                Err(_) => break,
            },
            recv(rx) -> req => match req {
                Ok(req) => {
                    let mut pending = Some(req);
                    while let Some(req) = pending.take() {
                        match req {
                            Request::Command { command, reply, prepared } => {
                                queue.push_back(Queued { command: *command, prepared, reply, tries: 0 });
                            }
                            other => {
                                // Alone: what is queued is decided first, after it.
                                exclusive(&shared, other, &checkpoints);
                            }
                        }
                        if queue.len() >= shared.batch_commands_max {
                            break;
                        }
                        pending = requests.as_ref().and_then(|rx| rx.try_recv().ok());
                    }
                }
                Err(_) => requests = None,
            },
            default(Duration::from_millis(100)) => {}
        }
        expire(&mut waiting);
        // Drafts never go to the stream: they are written to the host's own log file
        // once the flush interval has passed (or at once, for removals), as an embedded
        // engine writes them.
        let (since, urgent) = shared.drafts.lock().pending();
        if urgent || since.is_some_and(|t| t.elapsed() >= shared.draft_flush_interval) {
            let _ = write_host_drafts(&shared);
        }
        if shared.poisoned.load(Ordering::Acquire) {
            // Poisoned (by the checkpointer, or a fold): nothing more is folded, so the
            // commands that wait for their messages, and those queued, are answered now,
            // not when they expire.
            for (_, ws) in std::mem::take(&mut waiting) {
                for w in ws {
                    let _ = w.queued.reply.send(Err(Error::Poisoned));
                }
            }
            for q in queue.drain(..) {
                let _ = q.reply.send(Err(Error::Poisoned));
            }
        }
        if waiting.is_empty() && !queue.is_empty() {
            publish(&shared, &host, &state, &mut queue, &mut waiting);
        }
        if requests.is_none() && waiting.is_empty() && queue.is_empty() {
            break;
        }
    }
    // Closing: the host's log file gets a durable commit, and the checkpointer stops.
    host.stop.store(true, Ordering::Release);
    for (_, ws) in std::mem::take(&mut waiting) {
        for w in ws {
            let _ = w.queued.reply.send(Err(Error::Closed));
        }
    }
    // What drafts hold goes to the file, and the file is made durable.
    let _ = write_host_drafts(&shared);
    let _ = durable_commit(&shared);
    shared.subscribers.lock().clear();
    let _ = checkpoints.send(Signal::Stop);
}

/// Writes every draft change still in memory to the host's log file (without an fsync:
/// the host's durable commits, and its close, make it durable).
fn write_host_drafts(shared: &Shared) -> Result<()> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    let writes = shared.drafts.lock().writes();
    if writes.is_empty() {
        return Ok(());
    }
    crate::writer::write_drafts(shared, &writes)?;
    shared.drafts.lock().written(&writes);
    Ok(())
}

/// Commits the host's log file durably (what the fold wrote without an fsync).
fn durable_commit(shared: &Shared) -> Result<()> {
    let mut txn = shared.log_db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    txn.commit()?;
    Ok(())
}

/// Runs a request that is not a command on a host: those that only read or rewrite the
/// host's own files run; those that would write the log other than through the stream
/// are refused.
fn exclusive(shared: &Shared, req: Request, checkpoints: &Sender<Signal>) {
    let refuse = |what: &str| {
        Error::Rejected(Rejection::InvalidRequest { reason: format!("{what} is not available on a shared log") })
    };
    if shared.poisoned.load(Ordering::Acquire) {
        return crate::writer::fail(req, Error::Poisoned);
    }
    match req {
        Request::Command { .. } => {}
        Request::Checkpoint { reply } => drop(reply.send(crate::writer::drain(shared, checkpoints))),
        Request::FlushDrafts { reply } => {
            let result = write_host_drafts(shared).and_then(|()| durable_commit(shared));
            let _ = reply.send(result);
        }
        Request::Rebuild { set, reply } => {
            let tip = *shared.tip.lock();
            let _ = reply.send(crate::writer::rebuild(shared, &tip, set, checkpoints));
        }
        Request::Import { reply, .. } => drop(reply.send(Err(refuse("import")))),
        Request::Copy { reply, .. } => drop(reply.send(Err(refuse("session copy")))),
        Request::Sweep { reply, .. } => drop(reply.send(Err(refuse("content collection")))),
        Request::CollectDone { reply } => drop(reply.send(Err(refuse("content collection")))),
    }
}

/// Folds a batch from the stream, then answers the waiting commands it decided: an
/// applied message's caller gets its outcome where the fold put it; a void one's
/// command is queued to be decided again.
fn fold(
    shared: &Shared,
    host: &HostShared,
    state: &mut HostState,
    batch: Vec<StreamMessage>,
    checkpoints: &Sender<Signal>,
    waiting: &mut BTreeMap<u64, Vec<Waiting>>,
    queue: &mut VecDeque<Queued>,
) {
    if shared.poisoned.load(Ordering::Acquire) {
        return;
    }
    let verdicts = match crate::error::fail_closed("fold", || fold_batch(shared, state, batch, checkpoints)) {
        Ok(verdicts) => verdicts,
        Err(e) => {
            shared.poisoned.set(&e);
            for (_, ws) in std::mem::take(waiting) {
                for w in ws {
                    let _ = w.queued.reply.send(Err(e.clone()));
                }
            }
            return;
        }
    };
    *host.position.lock() = state.position;
    host.moved.notify_all();
    for (seq, verdict) in verdicts {
        let Some(ws) = waiting.remove(&seq) else { continue };
        for mut w in ws {
            match &verdict {
                Verdict::Applied { first_seq, at_ms } => {
                    let (from, to) = (w.placeholder, *first_seq);
                    w.outcome.relocate(&|s| s.wrapping_sub(from).wrapping_add(to), *at_ms);
                    let _ = w.queued.reply.send(Ok(w.outcome));
                }
                Verdict::Void(_) => requeue(queue, w.queued),
            }
        }
    }
    requeue_folded(waiting, queue, state.position);
}

/// Decides again the commands whose messages were stored at or before `position` but
/// that the fold did not answer: duplicates of messages folded earlier.
fn requeue_folded(waiting: &mut BTreeMap<u64, Vec<Waiting>>, queue: &mut VecDeque<Queued>, position: u64) {
    let folded: Vec<u64> = waiting.range(..=position).map(|(k, _)| *k).collect();
    for seq in folded {
        for w in waiting.remove(&seq).unwrap_or_default() {
            requeue(queue, w.queued);
        }
    }
}

/// Queues a command to be decided again, unless it has lost [`REDECIDE_MAX`] times.
fn requeue(queue: &mut VecDeque<Queued>, q: Queued) {
    if q.tries + 1 >= REDECIDE_MAX {
        let detail = format!("the command lost to other hosts' commands {REDECIDE_MAX} times");
        let _ = q.reply.send(Err(Error::Backend(BackendError::Unavailable(detail))));
        return;
    }
    queue.push_back(Queued { tries: q.tries + 1, ..q });
}

/// Fails the commands whose messages the fold has not reached in [`FOLD_WAIT_MAX`].
fn expire(waiting: &mut BTreeMap<u64, Vec<Waiting>>) {
    let late: Vec<u64> = waiting
        .iter()
        .filter(|(_, ws)| ws.iter().any(|w| w.since.elapsed() > FOLD_WAIT_MAX))
        .map(|(k, _)| *k)
        .collect();
    for seq in late {
        for w in waiting.remove(&seq).unwrap_or_default() {
            let detail = format!("message {seq} was stored but the fold did not reach it");
            let _ = w.queued.reply.send(Err(Error::Backend(BackendError::Unavailable(detail))));
        }
    }
}

/// Decides what is queued against the fold, and publishes each accepted command that
/// writes as one message; the batch's messages go in one pipelined append.
fn publish(
    shared: &Shared,
    host: &HostShared,
    state: &HostState,
    queue: &mut VecDeque<Queued>,
    waiting: &mut BTreeMap<u64, Vec<Waiting>>,
) {
    let batch: Vec<Queued> = queue.drain(..).collect();
    if shared.poisoned.load(Ordering::Acquire) {
        for q in batch {
            let _ = q.reply.send(Err(Error::Poisoned));
        }
        return;
    }
    let tip = *shared.tip.lock();
    let placeholder = tip.seq + 1;
    let commands: Vec<(&Command, &Prepared)> = batch.iter().map(|q| (&q.command, &*q.prepared)).collect();
    let decided = crate::error::fail_closed("decide", || {
        crate::writer::decide_batch(shared, placeholder, tip.clock_ms, &commands)
    });
    drop(commands);
    let decided = match decided {
        Ok(d) => d,
        Err(e) => {
            shared.poisoned.set(&e);
            for q in batch {
                let _ = q.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    let mut publishes = Vec::new();
    let mut sent = Vec::new();
    let mut targeted = std::collections::HashSet::new();
    for ((q, outcome), span) in batch.into_iter().zip(decided.outcomes).zip(decided.spans) {
        let outcome = match outcome {
            Ok(o) if !span.is_empty() => o,
            answer => {
                let _ = q.reply.send(answer);
                continue;
            }
        };
        let guards = match guards_of(shared, &q.command, &decided.entries[..span.start], &decided.entries[span.clone()])
        {
            Ok(guards) => guards,
            Err(e) => {
                let _ = q.reply.send(Err(e));
                continue;
            }
        };
        let entries = &decided.entries[span];
        match message_of(shared, state, entries, &guards, q.tries, &mut targeted) {
            // Over the backend's limit: this command alone fails, before anything is sent.
            Ok(p) if p.payload.len() as u64 > host.backend.max_payload() => {
                let (size, max) = (p.payload.len() as u64, host.backend.max_payload());
                drop(q.reply.send(Err(Error::Backend(BackendError::TooLarge { size, max }))));
            }
            Ok(p) => {
                publishes.push(p);
                let first = entries[0].record.seq;
                sent.push((q, outcome, first));
            }
            Err(e) => drop(q.reply.send(Err(e))),
        }
    }
    if publishes.is_empty() {
        return;
    }
    match host.backend.append(publishes) {
        Ok(outcomes) => {
            for ((q, outcome, placeholder), published) in sent.into_iter().zip(outcomes) {
                match published {
                    Published::Stored { seq, .. } => {
                        let w = Waiting { queued: q, outcome, placeholder, since: Instant::now() };
                        waiting.entry(seq).or_default().push(w);
                    }
                    Published::Conflict => requeue(queue, q),
                }
            }
        }
        Err(e) => {
            for (q, _, _) in sent {
                let _ = q.reply.send(Err(Error::Backend(e.clone())));
            }
        }
    }
    requeue_folded(waiting, queue, state.position);
}

/// The guards of a command's message: its fence's session, when the command is fenced
/// and writes no record of that session (whose own stream sequence would guard it
/// then), at the stream sequence the session takes next after the batch's `before`
/// entries, as the command was decided.
fn guards_of(shared: &Shared, command: &Command, before: &[Entry], own: &[Entry]) -> Result<Vec<(SessionId, u64)>> {
    let Command::Fenced { fence, .. } = command else {
        return Ok(Vec::new());
    };
    if own.iter().any(|e| e.record.session == fence.session) {
        return Ok(Vec::new());
    }
    let view = shared.delta.view();
    let next = crate::writer::next_stream_seq(&view, &fence.session)?;
    let earlier = before.iter().filter(|e| e.record.session == fence.session).count() as u64;
    Ok(vec![(fence.session, next + earlier)])
}

/// The message of one command's entries, with its target, expectation and key.
///
/// A second message of a session in one batch carries no expectation: the backend
/// checks one against the messages it has stored, and the first is still in flight. Nor
/// does a command decided again (`tries` > 0): the backend refuses before the fold has
/// seen what beat it, so a command refused once is stored and left to the fold, which
/// has then passed what beat it when it answers.
fn message_of(
    shared: &Shared,
    state: &HostState,
    entries: &[Entry],
    guards: &[(SessionId, u64)],
    tries: u32,
    targeted: &mut std::collections::HashSet<SessionId>,
) -> Result<Publish> {
    let records: Vec<(Record, Vec<u8>)> = entries
        .iter()
        .map(|e| {
            let mut row = Vec::new();
            for o in &e.content {
                push_stored(&mut row, &o.id, o.encoding, &o.bytes);
            }
            (e.record.clone(), row)
        })
        .collect();
    let payload = encode_guarded_message(&records, guards, &shared.chain, shared.limits.record_bytes_max)?;
    let first = &entries[0].record;
    let single = entries.iter().all(|e| e.record.session == first.session);
    let (target, expected) = match single {
        true => {
            let again = !targeted.insert(first.session) || tries > 0;
            let expected = match (state.subject_last.get(&first.session), first.stream_seq) {
                _ if again => Expected::Any,
                (_, 1) => Expected::NoMessage,
                (Some(last), _) => Expected::Last(*last),
                (None, _) => Expected::Any,
            };
            (Target::Session(first.session), expected)
        }
        false => {
            targeted.extend(entries.iter().map(|e| e.record.session));
            (Target::Many, Expected::Any)
        }
    };
    // The key names this host's decision: a retry of the same decision (after a lost
    // acknowledgement) is stored once; a decision taken again (after a conflict), the
    // same turn decided on another host, or a retry of the turn with other content (its
    // commit hash differs), is a new message, which the fold voids or applies, so that
    // each caller learns whether its own command wrote (the other content's caller is
    // told `TurnConflict`, as an embedded engine tells it).
    let msg_id = match &first.event {
        annal_codec::Event::TurnCommitted(t) => {
            let mut h = blake3::Hasher::new();
            h.update(b"annal.message.key.v2");
            h.update(&state.nonce);
            h.update(&first.session.0);
            h.update(&first.stream_seq.to_le_bytes());
            h.update(t.turn_id.as_bytes());
            h.update(&t.commit_hash.0);
            Some(annal_codec::ids::hex(&h.finalize().as_bytes()[..16]))
        }
        _ => None,
    };
    Ok(Publish { target, payload, expected, msg_id })
}

/// How long the pump lets a subscription stay silent while the stream's tip is past the
/// host's position before it reads the messages itself and subscribes again.
pub const SUBSCRIPTION_STALL: Duration = Duration::from_secs(2);

/// The pump: subscribes to the stream after `position` and hands every message to the
/// writer thread in order, filling any gap from a read, and subscribing again after a
/// failure. A subscription that goes silent while the stream holds messages past the
/// host's position (a consumer lost with a server, which the client does not always
/// recreate) is replaced after [`SUBSCRIPTION_STALL`]: the pump reads what it missed
/// and subscribes again after it.
pub(crate) fn pump(host: Arc<HostShared>, position: u64, tx: Sender<StreamMessage>) {
    let mut next = position + 1;
    let mut subscription = None;
    let mut last_tip_check = Instant::now() - Duration::from_secs(1);
    let mut last_message = Instant::now();
    while !host.stop.load(Ordering::Acquire) {
        if last_tip_check.elapsed() >= Duration::from_millis(200) {
            if let Ok(tip) = host.backend.tip() {
                host.seen.fetch_max(tip, Ordering::Relaxed);
            }
            last_tip_check = Instant::now();
        }
        let seen = host.seen.load(Ordering::Relaxed);
        let behind = seen >= next;
        if behind && last_message.elapsed() >= SUBSCRIPTION_STALL {
            subscription = None;
            let missed = (seen - next + 1).min(FOLD_BATCH_MAX as u64) as usize;
            if let Ok(batch) = host.backend.read(next, missed) {
                if forward(&host, batch, &mut next, &tx).is_err() {
                    return;
                }
            }
            last_message = Instant::now();
            continue;
        }
        if !behind {
            last_message = Instant::now();
        }
        let sub = match subscription.as_mut() {
            Some(sub) => sub,
            None => match host.backend.subscribe(next) {
                Ok(sub) => subscription.insert(sub),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            },
        };
        let m = match sub.next_within(Duration::from_millis(100)) {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(_) => {
                subscription = None;
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if m.seq < next {
            continue;
        }
        let mut batch = Vec::new();
        if m.seq > next {
            // A gap: read it, at most FOLD_BATCH_MAX messages at a time. Past that, `m`
            // waits for a later read (the subscription goes on after it, and each
            // message it delivers past `next` reads the gap on).
            let want = (m.seq - next).min(FOLD_BATCH_MAX as u64);
            match host.backend.read(next, want as usize) {
                Ok(gap) if gap.len() as u64 == want && gap.first().map(|g| g.seq) == Some(next) => batch.extend(gap),
                _ => {
                    subscription = None;
                    continue;
                }
            }
        }
        if batch.last().map_or(next, |g| g.seq + 1) == m.seq {
            batch.push(m);
        }
        if forward(&host, batch, &mut next, &tx).is_err() {
            return;
        }
        last_message = Instant::now();
    }
}

/// Queues `batch` for the fold from `next` on, in order, stopping at the first message
/// that is not the next one. `Err` when the writer is gone.
fn forward(
    host: &HostShared,
    batch: Vec<StreamMessage>,
    next: &mut u64,
    tx: &Sender<StreamMessage>,
) -> std::result::Result<(), ()> {
    for m in batch {
        if m.seq != *next {
            break;
        }
        host.seen.fetch_max(m.seq, Ordering::Relaxed);
        if !host.queued.take(m.payload.len() as u64, &host.stop) {
            return Err(());
        }
        *next = m.seq + 1;
        tx.send(m).map_err(drop)?;
    }
    Ok(())
}

/// What [`verify_stream`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamReport {
    /// Messages read.
    pub messages: u64,
    /// Records in the messages that authenticate and decode.
    pub records: u64,
    /// Messages whose MAC does not hold under the key: written without it, or damaged.
    pub forged: Vec<u64>,
    /// Messages that authenticate but do not decode.
    pub malformed: Vec<(u64, String)>,
    /// The stream's last sequence when the walk ended.
    pub tip: u64,
}

impl StreamReport {
    /// Whether every message authenticates and decodes.
    pub fn is_clean(&self) -> bool {
        self.forged.is_empty() && self.malformed.is_empty()
    }
}

/// Walks a shared log from its first message to its tip, checking that the stream is
/// dense and that every message authenticates under `chain` and decodes. A message
/// that fails is what the fold voids on every host; one that fails its MAC was
/// published by someone without the chain key (or damaged). Whether an authentic
/// message applied is the fold's business: a host's own log file then verifies like
/// any other (`annal verify`).
pub fn verify_stream(
    backend: &dyn LogBackend,
    chain: &LogChain,
    limits: &crate::Limits,
) -> std::result::Result<StreamReport, BackendError> {
    let mut report = StreamReport { tip: backend.tip()?, ..StreamReport::default() };
    let mut next = 1;
    while next <= report.tip {
        let batch = backend.read(next, 1024)?;
        if batch.is_empty() {
            return Err(BackendError::Other(format!("the stream ends at {} before its tip {}", next - 1, report.tip)));
        }
        for m in batch {
            if m.seq != next {
                return Err(BackendError::Other(format!("the stream skips from {} to {}", next - 1, m.seq)));
            }
            next += 1;
            report.messages += 1;
            match decode_message(&m.payload, chain, limits.record_bytes_max, limits.message_object_bytes_max()) {
                Ok(message) => report.records += message.records.len() as u64,
                Err(Void::Forged) => report.forged.push(m.seq),
                Err(other) => report.malformed.push((m.seq, other.to_string())),
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_between_pump_and_fold_holds_at_most_its_bytes() {
        let queue = Arc::new(QueueBytes::new(100));
        let stop = Arc::new(AtomicBool::new(false));
        assert!(queue.take(60, &stop) && queue.take(40, &stop));
        assert_eq!(queue.used(), 100);
        // Past the bound, the pump waits until the fold gives bytes back.
        let (q, s) = (queue.clone(), stop.clone());
        let waiting = std::thread::spawn(move || q.take(30, &s));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiting.is_finished(), "the pump waits while the queue is full");
        assert_eq!(queue.used(), 100);
        queue.give_back(60);
        assert!(waiting.join().unwrap());
        assert_eq!(queue.used(), 70);
        // A message over the bound goes alone, into an empty queue.
        queue.give_back(70);
        assert!(queue.take(1_000, &stop));
        // Closing wakes a pump that waits.
        let (q, s) = (queue.clone(), stop.clone());
        let waiting = std::thread::spawn(move || q.take(1, &s));
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Release);
        assert!(!waiting.join().unwrap(), "a stopped pump queues nothing");
        assert_eq!(queue.used(), 1_000);
    }
}
