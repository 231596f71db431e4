//! The floor: the least work a durable, group-committing, hash-chained session log does
//! per commit on this workload, measured beside the real stores so that a throughput
//! target can be set against what any design could reach on the same machine that day.
//!
//! What it does, as annal does it:
//! - each caller encodes its messages, hashes them (blake3) and compresses the ones that
//!   compress (lz4, kept when it saves an eighth), on its own thread;
//! - one writer thread gathers whatever is queued (without waiting for more, like
//!   annal's), checks each command against the session's state (the expected revision,
//!   the turn id's idempotency), chains each record
//!   (`h(seq) = blake3(h(seq-1) ‖ header ‖ blake3(payload))`), stores each content object
//!   once, writes the batch as one frame into a file preallocated with zeros and calls
//!   `fdatasync` once, then answers every caller.
//!
//! What it leaves out, and annal does not: the state is typed values in memory and is
//! never written anywhere, so there are no projections, no checkpoints, no indexes, no
//! log file beside the frames, no recovery, no reads but the head, and no rebuild. It is
//! a probe, not a store: only the commit phase of the comparison runs it.
//!
//! Two pieces of annal's work behind the commit path can be added to it ([`Behind`]),
//! each on a thread of its own, to bound what a design that folds typed values in memory
//! would make with them: the log file's copy of every record and content object (a redb
//! file in annal's default concurrency mode, a durable commit each 1 MiB of frames, as
//! annal's absorber does), and checkpoints of the projections (a durable commit of a
//! second redb file each 16,384 events or second, as annal's default policy: every dirty
//! session's head, its transcript positions written since the last checkpoint, its new
//! turn ids and the content-id index of the objects stored since, encoded there).

use super::{fork_id, Cursor, Head, SessionStore, StoreKind};
use crate::workload::{Msg, Op, Role};
use crate::Result;
use crossbeam_channel::{Receiver, Sender};
use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Id = [u8; 32];

/// Bytes of the frame file, preallocated with zeros; frames wrap around at its end.
const FILE_BYTES: u64 = 256 << 20;

/// A content object as a caller prepared it.
struct Object {
    id: Id,
    stored: Vec<u8>,
}

enum Kind {
    Create { messages: Vec<Object> },
    Turn { turn_id: String, expected: Id, messages: Vec<Object>, usage: (u64, u64) },
    Context { key: String, object: Object },
    Rewrite { expected: Id, start: u64, end: u64, messages: Vec<Object> },
    Restore { expected: Id, target: Id },
    Fork { child: [u8; 16], index: u64 },
}

struct Request {
    session: [u8; 16],
    kind: Kind,
    reply: oneshot::Sender<std::result::Result<Id, String>>,
}

/// One session's state, as typed values.
#[derive(Default)]
struct Session {
    revision: Id,
    /// The transcript's content ids and the chain value after each.
    ids: Vec<Id>,
    chain: Vec<Id>,
    stream_seq: u64,
    turns: HashMap<String, Id>,
    /// Transcripts a restore may go back to (those a rewrite replaced).
    revisions: HashMap<Id, Vec<Id>>,
    context: HashMap<String, Id>,
    usage: (u64, u64),
}

impl Session {
    /// Sets the transcript from position `from` on to `ids`, rechaining from there.
    fn set_tail(&mut self, from: usize, ids: &[Id]) {
        self.ids.truncate(from);
        self.chain.truncate(from);
        let mut c = self.chain.last().copied().unwrap_or_else(chain_start);
        for id in ids {
            c = chain_step(&c, id);
            self.ids.push(*id);
            self.chain.push(c);
        }
        self.revision = c;
    }
}

fn chain_start() -> Id {
    *blake3::hash(b"annal.transcript.v1").as_bytes()
}

fn chain_step(c: &Id, id: &Id) -> Id {
    let mut h = blake3::Hasher::new();
    h.update(c);
    h.update(id);
    *h.finalize().as_bytes()
}

/// Encodes, hashes and (when it pays) compresses a message on the caller's thread.
fn prepare(m: &Msg) -> Object {
    let mut canonical = Vec::with_capacity(m.body.len() + 2 + m.content_type.len());
    canonical.push(m.role as u8);
    canonical.push(m.content_type.len() as u8);
    canonical.extend_from_slice(m.content_type.as_bytes());
    canonical.extend_from_slice(&m.body);
    let id = *blake3::hash(&canonical).as_bytes();
    if canonical.len() >= 128 {
        let compressed = lz4_flex::block::compress_prepend_size(&canonical);
        if compressed.len() <= canonical.len() - canonical.len() / 8 {
            return Object { id, stored: compressed };
        }
    }
    Object { id, stored: canonical }
}

/// What the floor does behind its commit path, beside the frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Behind {
    /// Copy every record and content object into a redb log file.
    pub log: bool,
    /// Checkpoint the projections into a redb file.
    pub checkpoint: bool,
}

impl Behind {
    /// Nothing: the floor as the default comparison runs it.
    pub const NOTHING: Behind = Behind { log: false, checkpoint: false };
}

/// Events between two checkpoints (annal's default policy).
const CHECKPOINT_EVENTS: u64 = 16_384;
/// The longest time between two checkpoints (annal's default policy).
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Frame bytes each durable commit of the log file takes (annal's journal switch size).
const ABSORB_BYTES: usize = 1 << 20;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const CONTENT: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("content");
const HEADS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("heads");
const TRANSCRIPT: TableDefinition<(&[u8], u64), &[u8]> = TableDefinition::new("transcript");
const CONTENT_IDS: TableDefinition<&[u8], u64> = TableDefinition::new("content_ids");
const TURNS: TableDefinition<(&[u8], &str), &[u8]> = TableDefinition::new("turns");

/// A batch's frame and, for each record, its seq, its bytes' range and its new objects'.
type Absorbed = (Vec<u8>, Vec<(u64, Range<usize>, Vec<Range<usize>>)>);

/// One dirty session, as the checkpointer gets it.
struct Dirty {
    id: [u8; 16],
    revision: Id,
    stream_seq: u64,
    usage: (u64, u64),
    /// The first transcript position written since the last checkpoint, and the ids from it.
    from: usize,
    ids: Vec<Id>,
    turns: Vec<(String, Id)>,
}

/// A checkpoint: the dirty sessions and the objects stored since the last one.
struct Checkpoint {
    sessions: Vec<Dirty>,
    objects: Vec<(Id, u64)>,
}

/// The writer's side of the work behind it.
struct Handoff {
    absorb: Option<Sender<Absorbed>>,
    checkpoint: Option<Sender<Checkpoint>>,
    /// This batch's records, for the absorber.
    entries: Vec<(u64, Range<usize>, Vec<Range<usize>>)>,
    /// Since the last checkpoint: events, the time it was taken, each dirty session's
    /// first transcript position written, the objects stored and the turns committed.
    events: u64,
    since: std::time::Instant,
    dirty: HashMap<[u8; 16], usize>,
    objects: Vec<(Id, u64)>,
    turns: Vec<([u8; 16], String, Id)>,
}

/// The log file's copy: one durable transaction each [`ABSORB_BYTES`] of frames, in
/// annal's default concurrency mode. Returns the records it holds at the end.
fn absorb(path: &Path, rx: Receiver<Absorbed>) -> std::result::Result<u64, redb::Error> {
    let mut builder = redb::Builder::new();
    builder.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
    let db = builder.create(path)?;
    let write = |pending: &mut Vec<Absorbed>| -> std::result::Result<(), redb::Error> {
        let txn = db.begin_write()?;
        {
            let (mut log, mut content) = (txn.open_table(LOG)?, txn.open_table(CONTENT)?);
            for (frame, entries) in pending.iter() {
                for (seq, record, objects) in entries {
                    log.insert(*seq, &frame[record.clone()])?;
                    for (i, object) in objects.iter().enumerate() {
                        content.insert((*seq, i as u32), &frame[object.clone()])?;
                    }
                }
            }
        }
        txn.commit()?;
        pending.clear();
        Ok(())
    };
    let (mut pending, mut bytes) = (Vec::new(), 0);
    while let Ok(batch) = rx.recv() {
        bytes += batch.0.len();
        pending.push(batch);
        if bytes >= ABSORB_BYTES {
            write(&mut pending)?;
            bytes = 0;
        }
    }
    if !pending.is_empty() {
        write(&mut pending)?;
    }
    Ok(db.begin_read()?.open_table(LOG)?.len()?)
}

/// The checkpointer: each checkpoint's rows, encoded here, in one durable transaction.
/// Returns the checkpoints written.
fn checkpoint(path: &Path, rx: Receiver<Checkpoint>) -> std::result::Result<u64, redb::Error> {
    let mut builder = redb::Builder::new();
    builder.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
    let db = builder.create(path)?;
    let mut written = 0;
    let mut head = Vec::with_capacity(72);
    while let Ok(c) = rx.recv() {
        let txn = db.begin_write()?;
        {
            let mut heads = txn.open_table(HEADS)?;
            let mut transcript = txn.open_table(TRANSCRIPT)?;
            let mut content_ids = txn.open_table(CONTENT_IDS)?;
            let mut turns = txn.open_table(TURNS)?;
            for s in &c.sessions {
                head.clear();
                head.extend_from_slice(&s.revision);
                for n in [s.stream_seq, (s.from + s.ids.len()) as u64, s.usage.0, s.usage.1] {
                    head.extend_from_slice(&n.to_le_bytes());
                }
                heads.insert(&s.id[..], &head[..])?;
                for (i, id) in s.ids.iter().enumerate() {
                    transcript.insert((&s.id[..], (s.from + i) as u64), &id[..])?;
                }
                for (turn, revision) in &s.turns {
                    turns.insert((&s.id[..], turn.as_str()), &revision[..])?;
                }
            }
            for (id, seq) in &c.objects {
                content_ids.insert(&id[..], *seq)?;
            }
        }
        txn.commit()?;
        written += 1;
    }
    Ok(written)
}

/// The floor behind the [`SessionStore`] trait (commit phase and head reads only).
pub struct FloorStore {
    queue: Option<Sender<Request>>,
    writer: Option<JoinHandle<std::result::Result<(), String>>>,
    heads: Arc<Mutex<HashMap<[u8; 16], Head>>>,
    syncs: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
    forks: AtomicU64,
    kind: StoreKind,
}

impl FloorStore {
    /// Creates the frame file in `dir` (preallocated with zeros) and starts the writer,
    /// with the work `behind` does behind the commit path on threads of its own.
    pub fn open(dir: &Path, behind: Behind) -> Result<FloorStore> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("floor.frames"))?;
        let zeros = vec![0u8; 1 << 20];
        for i in 0..FILE_BYTES / zeros.len() as u64 {
            file.write_all_at(&zeros, i * zeros.len() as u64)?;
        }
        file.sync_all()?;
        let (queue, rx) = crossbeam_channel::bounded(4096);
        let heads = Arc::new(Mutex::new(HashMap::new()));
        let (syncs, written) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut writer = Writer {
            file,
            offset: 0,
            sessions: HashMap::new(),
            content: HashSet::new(),
            seq: 0,
            tip: *blake3::hash(b"annal.log.v1").as_bytes(),
            frame: Vec::with_capacity(1 << 20),
            heads: heads.clone(),
            syncs: syncs.clone(),
            written: written.clone(),
            handoff: None,
        };
        let (mut absorber, mut checkpointer) = (None, None);
        if behind.log || behind.checkpoint {
            let mut handoff = Handoff {
                absorb: None,
                checkpoint: None,
                entries: Vec::new(),
                events: 0,
                since: std::time::Instant::now(),
                dirty: HashMap::new(),
                objects: Vec::new(),
                turns: Vec::new(),
            };
            if behind.log {
                let (tx, rx) = crossbeam_channel::bounded(1024);
                let path = dir.join("floor.log.redb");
                absorber =
                    Some(std::thread::Builder::new().name("floor-absorber".into()).spawn(move || absorb(&path, rx))?);
                handoff.absorb = Some(tx);
            }
            if behind.checkpoint {
                let (tx, rx) = crossbeam_channel::bounded(2);
                let path = dir.join("floor.projections.redb");
                checkpointer = Some(
                    std::thread::Builder::new()
                        .name("floor-checkpointer".into())
                        .spawn(move || checkpoint(&path, rx))?,
                );
                handoff.checkpoint = Some(tx);
            }
            writer.handoff = Some(handoff);
        }
        let writer = std::thread::Builder::new().name("floor-writer".into()).spawn(move || {
            writer.run(rx);
            drop(writer.handoff.take());
            if let Some(absorber) = absorber {
                let records = absorber.join().map_err(|_| "the absorber panicked")?.map_err(|e| e.to_string())?;
                if records != writer.seq {
                    return Err(format!("the log file holds {records} records of {}", writer.seq));
                }
            }
            if let Some(checkpointer) = checkpointer {
                checkpointer.join().map_err(|_| "the checkpointer panicked")?.map_err(|e| e.to_string())?;
            }
            Ok(())
        })?;
        let kind = StoreKind::Floor(behind);
        let forks = AtomicU64::new(0);
        Ok(FloorStore { queue: Some(queue), writer: Some(writer), heads, syncs, written, forks, kind })
    }

    fn call(&self, session: [u8; 16], kind: Kind) -> Result<Id> {
        let (reply, rx) = oneshot::channel();
        self.queue.as_ref().ok_or("closed")?.send(Request { session, kind, reply }).map_err(|_| "closed")?;
        Ok(rx.recv().map_err(|_| "no reply")??)
    }
}

struct Writer {
    file: File,
    offset: u64,
    sessions: HashMap<[u8; 16], Session>,
    content: HashSet<Id>,
    seq: u64,
    tip: Id,
    frame: Vec<u8>,
    heads: Arc<Mutex<HashMap<[u8; 16], Head>>>,
    syncs: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
    handoff: Option<Handoff>,
}

impl Writer {
    fn run(&mut self, rx: Receiver<Request>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            batch.extend(rx.try_iter());
            self.frame.clear();
            let outcomes: Vec<_> = batch.iter().map(|r| self.decide(r)).collect();
            if !self.frame.is_empty() {
                if let Err(e) = self.append() {
                    for r in batch {
                        let _ = r.reply.send(Err(e.to_string()));
                    }
                    return;
                }
            }
            if let Err(e) = self.hand_off() {
                for r in batch {
                    let _ = r.reply.send(Err(e.clone()));
                }
                return;
            }
            {
                let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
                for r in &batch {
                    for session in [r.session].into_iter().chain(match &r.kind {
                        Kind::Fork { child, .. } => Some(*child),
                        _ => None,
                    }) {
                        if let Some(s) = self.sessions.get(&session) {
                            heads.insert(session, Head { message_count: s.ids.len() as u64, events: s.stream_seq });
                        }
                    }
                }
            }
            for (r, outcome) in batch.into_iter().zip(outcomes) {
                let _ = r.reply.send(outcome);
            }
        }
    }

    /// Hands the durable batch to the absorber, and a checkpoint to the checkpointer when
    /// one is due (both wait when they are behind: backpressure).
    fn hand_off(&mut self) -> std::result::Result<(), String> {
        let Some(h) = self.handoff.as_mut() else { return Ok(()) };
        if let Some(absorb) = &h.absorb {
            if !h.entries.is_empty() {
                let entries = std::mem::take(&mut h.entries);
                absorb.send((self.frame.clone(), entries)).map_err(|_| "the absorber stopped")?;
            }
        }
        let Some(checkpoint) = &h.checkpoint else { return Ok(()) };
        if h.events < CHECKPOINT_EVENTS && h.since.elapsed() < CHECKPOINT_INTERVAL {
            return Ok(());
        }
        let mut sessions = Vec::with_capacity(h.dirty.len());
        let mut at = HashMap::with_capacity(h.dirty.len());
        for (id, from) in h.dirty.drain() {
            let s = &self.sessions[&id];
            let from = from.min(s.ids.len());
            at.insert(id, sessions.len());
            let (revision, stream_seq, usage, ids) = (s.revision, s.stream_seq, s.usage, s.ids[from..].to_vec());
            sessions.push(Dirty { id, revision, stream_seq, usage, from, ids, turns: Vec::new() });
        }
        for (id, turn, revision) in h.turns.drain(..) {
            sessions[at[&id]].turns.push((turn, revision));
        }
        let objects = std::mem::take(&mut h.objects);
        (h.events, h.since) = (0, std::time::Instant::now());
        checkpoint.send(Checkpoint { sessions, objects }).map_err(|_| "the checkpointer stopped".into())
    }

    /// Notes that `session`'s state changed, its transcript from position `from` on.
    fn touch(&mut self, session: [u8; 16], from: usize) {
        if let Some(h) = self.handoff.as_mut().filter(|h| h.checkpoint.is_some()) {
            let first = h.dirty.entry(session).or_insert(from);
            *first = (*first).min(from);
        }
    }

    /// Writes the frame at the write offset and waits for it to be durable.
    fn append(&mut self) -> std::io::Result<()> {
        if self.offset + self.frame.len() as u64 > FILE_BYTES {
            self.offset = 0;
        }
        self.file.write_all_at(&self.frame, self.offset)?;
        self.file.sync_data()?;
        self.offset += self.frame.len() as u64;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.written.fetch_add(self.frame.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Chains a record of `kind` for `session` into the frame, with the objects no
    /// earlier record stored.
    fn record(&mut self, session: &[u8; 16], stream_seq: u64, kind: u8, payload: &[u8], objects: &[&Object]) {
        self.seq += 1;
        let mut header = [0u8; 52];
        header[0..4].copy_from_slice(b"ANNL");
        header[4] = 2;
        header[5] = kind;
        header[8..16].copy_from_slice(&self.seq.to_le_bytes());
        header[16..32].copy_from_slice(session);
        header[32..40].copy_from_slice(&stream_seq.to_le_bytes());
        header[48..52].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let mut h = blake3::Hasher::new();
        h.update(&self.tip);
        h.update(&header);
        h.update(blake3::hash(payload).as_bytes());
        self.tip = *h.finalize().as_bytes();
        let start = self.frame.len();
        self.frame.extend_from_slice(&header);
        self.frame.extend_from_slice(payload);
        self.frame.extend_from_slice(&self.tip);
        let record = start..self.frame.len();
        let mut stored = Vec::new();
        for o in objects {
            if self.content.insert(o.id) {
                self.frame.extend_from_slice(&o.id);
                self.frame.extend_from_slice(&(o.stored.len() as u32).to_le_bytes());
                let at = self.frame.len();
                self.frame.extend_from_slice(&o.stored);
                if let Some(h) = self.handoff.as_mut() {
                    stored.push(at..self.frame.len());
                    if h.checkpoint.is_some() {
                        h.objects.push((o.id, self.seq));
                    }
                }
            }
        }
        if let Some(h) = self.handoff.as_mut() {
            h.events += 1;
            if h.absorb.is_some() {
                h.entries.push((self.seq, record, stored));
            }
        }
    }

    fn decide(&mut self, r: &Request) -> std::result::Result<Id, String> {
        let mut payload = Vec::with_capacity(512);
        let session = r.session;
        match &r.kind {
            Kind::Create { messages } => {
                if self.sessions.contains_key(&session) {
                    return Err("session exists".into());
                }
                let mut s = Session { stream_seq: 1, ..Session::default() };
                let ids: Vec<Id> = messages.iter().map(|o| o.id).collect();
                s.set_tail(0, &ids);
                ids.iter().for_each(|id| payload.extend_from_slice(id));
                let revision = s.revision;
                self.sessions.insert(session, s);
                self.touch(session, 0);
                self.record(&session, 1, 1, &payload, &messages.iter().collect::<Vec<_>>());
                Ok(revision)
            }
            Kind::Turn { turn_id, expected, messages, usage } => {
                let s = self.sessions.get_mut(&session).ok_or("no such session")?;
                if let Some(revision) = s.turns.get(turn_id) {
                    return Ok(*revision);
                }
                if s.revision != *expected {
                    return Err("revision conflict".into());
                }
                let ids: Vec<Id> = messages.iter().map(|o| o.id).collect();
                let len = s.ids.len();
                s.set_tail(len, &ids);
                s.stream_seq += 1;
                s.usage = (s.usage.0 + usage.0, s.usage.1 + usage.1);
                s.turns.insert(turn_id.clone(), s.revision);
                payload.extend_from_slice(turn_id.as_bytes());
                ids.iter().for_each(|id| payload.extend_from_slice(id));
                payload.extend_from_slice(&s.revision);
                let (stream_seq, revision) = (s.stream_seq, s.revision);
                self.touch(session, len);
                if let Some(h) = self.handoff.as_mut().filter(|h| h.checkpoint.is_some()) {
                    h.turns.push((session, turn_id.clone(), revision));
                }
                self.record(&session, stream_seq, 2, &payload, &messages.iter().collect::<Vec<_>>());
                Ok(revision)
            }
            Kind::Context { key, object } => {
                let s = self.sessions.get_mut(&session).ok_or("no such session")?;
                if s.context.get(key) == Some(&object.id) {
                    return Ok(s.revision);
                }
                s.context.insert(key.clone(), object.id);
                s.stream_seq += 1;
                payload.extend_from_slice(key.as_bytes());
                payload.extend_from_slice(&object.id);
                let (stream_seq, revision, len) = (s.stream_seq, s.revision, s.ids.len());
                self.touch(session, len);
                self.record(&session, stream_seq, 6, &payload, &[object]);
                Ok(revision)
            }
            Kind::Rewrite { expected, start, end, messages } => {
                let s = self.sessions.get_mut(&session).ok_or("no such session")?;
                if s.revision != *expected {
                    return Err("revision conflict".into());
                }
                let (start, end) = (*start as usize, (*end as usize).min(s.ids.len()));
                s.revisions.insert(s.revision, s.ids.clone());
                let mut tail: Vec<Id> = messages.iter().map(|o| o.id).collect();
                tail.extend_from_slice(&s.ids[end..]);
                s.set_tail(start, &tail);
                s.stream_seq += 1;
                payload.extend_from_slice(expected);
                messages.iter().for_each(|o| payload.extend_from_slice(&o.id));
                let (stream_seq, revision) = (s.stream_seq, s.revision);
                self.touch(session, start);
                self.record(&session, stream_seq, 3, &payload, &messages.iter().collect::<Vec<_>>());
                Ok(revision)
            }
            Kind::Restore { expected, target } => {
                let s = self.sessions.get_mut(&session).ok_or("no such session")?;
                if s.revision != *expected {
                    return Err("revision conflict".into());
                }
                let ids = s.revisions.get(target).cloned().ok_or("unknown revision")?;
                let common = s.ids.iter().zip(&ids).take_while(|(a, b)| a == b).count();
                s.set_tail(common, &ids[common..]);
                s.stream_seq += 1;
                payload.extend_from_slice(target);
                let (stream_seq, revision) = (s.stream_seq, s.revision);
                self.touch(session, common);
                self.record(&session, stream_seq, 3, &payload, &[]);
                Ok(revision)
            }
            Kind::Fork { child, index } => {
                let parent = self.sessions.get(&session).ok_or("no such session")?;
                let n = (*index as usize).min(parent.ids.len());
                let mut s = Session { stream_seq: 1, ..Session::default() };
                s.ids = parent.ids[..n].to_vec();
                s.chain = parent.chain[..n].to_vec();
                s.revision = s.chain.last().copied().unwrap_or_else(chain_start);
                payload.extend_from_slice(&session);
                payload.extend_from_slice(&s.revision);
                let revision = s.revision;
                self.sessions.insert(*child, s);
                self.touch(*child, 0);
                self.record(child, 1, 1, &payload, &[]);
                Ok(revision)
            }
        }
    }
}

impl SessionStore for FloorStore {
    fn kind(&self) -> StoreKind {
        self.kind
    }

    fn create(&self, id: [u8; 16], system: &Msg) -> Result<Cursor> {
        let revision = self.call(id, Kind::Create { messages: vec![prepare(system)] })?;
        Ok(Cursor { id, revision, before_compaction: revision })
    }

    fn apply(&self, cursor: &mut Cursor, op: &Op) -> Result<()> {
        let kind = match op {
            Op::Turn(t) => Kind::Turn {
                turn_id: t.id.clone(),
                expected: cursor.revision,
                messages: t.messages.iter().map(prepare).collect(),
                usage: t.usage,
            },
            Op::Context { key, content } => {
                let m = Msg { role: Role::System, content_type: "text/plain", body: content.clone() };
                Kind::Context { key: key.clone(), object: prepare(&m) }
            }
            Op::Compact { start, end, summary } => {
                Kind::Rewrite { expected: cursor.revision, start: *start, end: *end, messages: vec![prepare(summary)] }
            }
            Op::Restore => Kind::Restore { expected: cursor.revision, target: cursor.before_compaction },
            Op::Fork { index } => {
                let child = fork_id(self.forks.fetch_add(1, Ordering::Relaxed));
                self.call(cursor.id, Kind::Fork { child, index: *index })?;
                return Ok(());
            }
        };
        let compacting = matches!(op, Op::Compact { .. });
        let revision = self.call(cursor.id, kind)?;
        if compacting {
            cursor.before_compaction = cursor.revision;
        }
        cursor.revision = revision;
        Ok(())
    }

    fn head(&self, id: [u8; 16]) -> Result<Head> {
        let heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        Ok(*heads.get(&id).ok_or("no such session")?)
    }

    fn page(&self, _: [u8; 16], _: u64, _: u64) -> Result<u64> {
        Err("the floor keeps no transcript to read".into())
    }

    fn rebuild(&self) -> Result<u64> {
        Err("the floor keeps no projection to rebuild".into())
    }

    fn syncs(&self) -> Option<u64> {
        Some(self.syncs.load(Ordering::Relaxed))
    }

    fn written_bytes(&self) -> Option<u64> {
        Some(self.written.load(Ordering::Relaxed))
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        drop(self.queue.take());
        if let Some(writer) = self.writer.take() {
            writer.join().map_err(|_| "the floor's writer panicked")??;
        }
        Ok(())
    }
}
