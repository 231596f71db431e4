//! The shared log behind a trait: what a [`crate::Engine::open_shared`] host appends its
//! commands' records to, and folds every host's records from.
//!
//! A [`LogBackend`] is an ordered, replicated (or at least durable) log of messages.
//! Each message has a *target* (one session, or [`Target::Many`] for a command that
//! writes several), an opaque payload, and a stream sequence that the backend assigns,
//! dense from 1. It offers what a shared engine needs and no more: append a batch, each
//! message under an expectation about its target's last message and with an
//! idempotency key; read from a sequence; the tip; and a subscription that delivers
//! every message from a sequence on, in order.
//!
//! Two implementations: [`RedbStream`], a stream in a redb file (or in memory) that
//! hosts in one process share, and `annal_jetstream::JetStreamLog` (crate
//! `annal-jetstream`), a replicated NATS JetStream stream that hosts on many machines
//! share. The embedded engine ([`crate::Engine::open`]) keeps its log in its own file
//! and needs neither. `docs/design.md` §13 describes the protocol.

use annal_codec::SessionId;
use parking_lot::{Condvar, Mutex};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a message writes: one session, or several (a command that spans sessions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// One session.
    Session(SessionId),
    /// Several sessions.
    Many,
}

/// The state of its target that a message was decided under. A backend refuses the
/// message ([`Published::Conflict`]) when its target does not hold it; this is an early
/// rejection only: the fold decides whether a stored message applies
/// (`docs/design.md` §13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Anything.
    Any,
    /// No message has this target yet.
    NoMessage,
    /// The target's last message is at this stream sequence.
    Last(u64),
}

/// One message to append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    /// Its target.
    pub target: Target,
    /// Its bytes.
    pub payload: Vec<u8>,
    /// What its target must hold for the backend to store it.
    pub expected: Expected,
    /// Its idempotency key: a second message with the same key is not stored again,
    /// and is acknowledged with the first one's sequence.
    pub msg_id: Option<String>,
}

/// What became of one appended message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// Stored at `seq` (or before, when `duplicate`: its key was seen).
    Stored {
        /// The stream sequence.
        seq: u64,
        /// The backend had it already.
        duplicate: bool,
    },
    /// Refused by the expectation: nothing was stored.
    Conflict,
}

/// A message read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamMessage {
    /// Its stream sequence.
    pub seq: u64,
    /// Its target.
    pub target: Target,
    /// Its bytes.
    pub payload: Vec<u8>,
}

/// A failure of the backend. None of them poisons an engine: the engine's own files
/// are untouched, and a command whose append failed can be retried (a turn's retry is
/// idempotent).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The backend did not answer in time, or the connection is down: a message sent
    /// may or may not be stored.
    #[error("log backend unavailable: {0}")]
    Unavailable(String),
    /// The backend refused the client (credentials, permissions).
    #[error("log backend refused: {0}")]
    Refused(String),
    /// A message is larger than the backend takes; nothing of its batch was sent.
    #[error("message of {size} bytes is over the log backend's limit of {max}")]
    TooLarge {
        /// The message's size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// Anything else (a damaged message read back, a broken stream).
    #[error("log backend: {0}")]
    Other(String),
}

/// A subscription: every message from a sequence on, in order.
pub trait Subscription: Send {
    /// The next message, or `None` if none arrived within `wait`.
    fn next_within(&mut self, wait: Duration) -> Result<Option<StreamMessage>, BackendError>;
}

/// An ordered log of messages that several hosts share.
pub trait LogBackend: Send + Sync {
    /// Appends `batch` in order, and returns one outcome per message, in order.
    fn append(&self, batch: Vec<Publish>) -> Result<Vec<Published>, BackendError>;
    /// Up to `max` messages from sequence `from` on.
    fn read(&self, from: u64, max: usize) -> Result<Vec<StreamMessage>, BackendError>;
    /// The last stream sequence (0 when empty).
    fn tip(&self) -> Result<u64, BackendError>;
    /// The sequence of the last message with `target`, if any (what [`Expected::Last`]
    /// takes).
    fn last_of(&self, target: &Target) -> Result<Option<u64>, BackendError>;
    /// Every message from `from` on, in order, as they arrive.
    fn subscribe(&self, from: u64) -> Result<Box<dyn Subscription>, BackendError>;
    /// The largest payload a message may carry.
    fn max_payload(&self) -> u64;
}

/// Stream sequence → target (1 byte: 0 session, 1 many; then 16 bytes of session id
/// for a session) and payload.
const STREAM: TableDefinition<u64, &[u8]> = TableDefinition::new("stream");
/// Target key (17 bytes) → its last stream sequence.
const LAST: TableDefinition<&[u8], u64> = TableDefinition::new("stream_last");
/// Idempotency key → the sequence of the message that first had it.
const KEYS: TableDefinition<&str, u64> = TableDefinition::new("stream_keys");

/// The largest payload a [`RedbStream`] takes by default (16 MiB and some room).
pub const REDB_STREAM_PAYLOAD_MAX: u64 = 20 << 20;

fn target_key(target: &Target) -> [u8; 17] {
    let mut key = [0u8; 17];
    if let Target::Session(s) = target {
        key[1..].copy_from_slice(&s.0);
    } else {
        key[0] = 1;
    }
    key
}

fn other(e: impl std::fmt::Display) -> BackendError {
    BackendError::Other(e.to_string())
}

fn decode_stored(seq: u64, bytes: &[u8]) -> Result<StreamMessage, BackendError> {
    let malformed = || BackendError::Other(format!("stream message {seq} is malformed"));
    let (&kind, rest) = bytes.split_first().ok_or_else(malformed)?;
    let (target, payload) = match kind {
        0 if rest.len() >= 16 => {
            let mut id = [0u8; 16];
            id.copy_from_slice(&rest[..16]);
            (Target::Session(SessionId(id)), &rest[16..])
        }
        1 => (Target::Many, rest),
        _ => return Err(malformed()),
    };
    Ok(StreamMessage { seq, target, payload: payload.to_vec() })
}

struct StreamInner {
    db: redb::Database,
    /// The tip, and the condition subscribers wait on.
    tip: Mutex<u64>,
    grew: Condvar,
    max_payload: u64,
}

/// A stream in one redb file (or in memory), for hosts in one process: clone it into
/// each [`crate::Engine::open_shared`]. Every append is one durable transaction; a key
/// is remembered for good (no window).
#[derive(Clone)]
pub struct RedbStream {
    inner: Arc<StreamInner>,
}

impl std::fmt::Debug for RedbStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStream").field("tip", &*self.inner.tip.lock()).finish()
    }
}

impl RedbStream {
    /// Opens (or creates) the stream in the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<RedbStream, BackendError> {
        let db = redb::Database::create(path).map_err(other)?;
        RedbStream::start(db)
    }

    /// A stream in memory, gone when the last clone is dropped.
    pub fn memory() -> Result<RedbStream, BackendError> {
        let db =
            redb::Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).map_err(other)?;
        RedbStream::start(db)
    }

    fn start(db: redb::Database) -> Result<RedbStream, BackendError> {
        let txn = db.begin_write().map_err(other)?;
        txn.open_table(STREAM).map_err(other)?;
        txn.open_table(LAST).map_err(other)?;
        txn.open_table(KEYS).map_err(other)?;
        txn.commit().map_err(other)?;
        let tip = {
            let txn = db.begin_read().map_err(other)?;
            let table = txn.open_table(STREAM).map_err(other)?;
            let last = table.last().map_err(other)?;
            last.map_or(0, |(k, _)| k.value())
        };
        let inner =
            StreamInner { db, tip: Mutex::new(tip), grew: Condvar::new(), max_payload: REDB_STREAM_PAYLOAD_MAX };
        Ok(RedbStream { inner: Arc::new(inner) })
    }
}

impl LogBackend for RedbStream {
    fn append(&self, batch: Vec<Publish>) -> Result<Vec<Published>, BackendError> {
        if let Some(p) = batch.iter().find(|p| p.payload.len() as u64 > self.inner.max_payload) {
            return Err(BackendError::TooLarge { size: p.payload.len() as u64, max: self.inner.max_payload });
        }
        // One writer at a time: the tip's lock orders appends.
        let mut tip = self.inner.tip.lock();
        let txn = self.inner.db.begin_write().map_err(other)?;
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut next = *tip;
        {
            let mut stream = txn.open_table(STREAM).map_err(other)?;
            let mut last = txn.open_table(LAST).map_err(other)?;
            let mut keys = txn.open_table(KEYS).map_err(other)?;
            for p in batch {
                if let Some(id) = &p.msg_id {
                    if let Some(seq) = keys.get(id.as_str()).map_err(other)? {
                        outcomes.push(Published::Stored { seq: seq.value(), duplicate: true });
                        continue;
                    }
                }
                let key = target_key(&p.target);
                let current = last.get(&key[..]).map_err(other)?.map(|g| g.value());
                let holds = match p.expected {
                    Expected::Any => true,
                    Expected::NoMessage => current.is_none(),
                    Expected::Last(seq) => current == Some(seq),
                };
                if !holds {
                    outcomes.push(Published::Conflict);
                    continue;
                }
                next += 1;
                let mut value = Vec::with_capacity(17 + p.payload.len());
                match p.target {
                    Target::Session(s) => {
                        value.push(0);
                        value.extend_from_slice(&s.0);
                    }
                    Target::Many => value.push(1),
                }
                value.extend_from_slice(&p.payload);
                stream.insert(next, value.as_slice()).map_err(other)?;
                last.insert(&key[..], next).map_err(other)?;
                if let Some(id) = &p.msg_id {
                    keys.insert(id.as_str(), next).map_err(other)?;
                }
                outcomes.push(Published::Stored { seq: next, duplicate: false });
            }
        }
        txn.commit().map_err(other)?;
        *tip = next;
        self.inner.grew.notify_all();
        Ok(outcomes)
    }

    fn read(&self, from: u64, max: usize) -> Result<Vec<StreamMessage>, BackendError> {
        let txn = self.inner.db.begin_read().map_err(other)?;
        let table = txn.open_table(STREAM).map_err(other)?;
        let mut out = Vec::new();
        for row in table.range(from.max(1)..).map_err(other)?.take(max) {
            let (k, v) = row.map_err(other)?;
            out.push(decode_stored(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn tip(&self) -> Result<u64, BackendError> {
        Ok(*self.inner.tip.lock())
    }

    fn last_of(&self, target: &Target) -> Result<Option<u64>, BackendError> {
        let txn = self.inner.db.begin_read().map_err(other)?;
        let table = txn.open_table(LAST).map_err(other)?;
        let last = table.get(&target_key(target)[..]).map_err(other)?;
        Ok(last.map(|g| g.value()))
    }

    fn subscribe(&self, from: u64) -> Result<Box<dyn Subscription>, BackendError> {
        Ok(Box::new(RedbSubscription { stream: self.clone(), next: from.max(1), buffered: Vec::new().into_iter() }))
    }

    fn max_payload(&self) -> u64 {
        self.inner.max_payload
    }
}

/// A [`RedbStream`]'s subscription: reads ahead in batches, waits on the stream's
/// condition for more.
struct RedbSubscription {
    stream: RedbStream,
    next: u64,
    buffered: std::vec::IntoIter<StreamMessage>,
}

impl Subscription for RedbSubscription {
    fn next_within(&mut self, wait: Duration) -> Result<Option<StreamMessage>, BackendError> {
        if let Some(m) = self.buffered.next() {
            return Ok(Some(m));
        }
        let deadline = Instant::now() + wait;
        {
            let mut tip = self.stream.inner.tip.lock();
            while *tip < self.next {
                if self.stream.inner.grew.wait_until(&mut tip, deadline).timed_out() {
                    return Ok(None);
                }
            }
        }
        let batch = self.stream.read(self.next, 1024)?;
        if let Some(last) = batch.last() {
            self.next = last.seq + 1;
        }
        self.buffered = batch.into_iter();
        Ok(self.buffered.next())
    }
}

/// A backend URL (`tls://user:password@host:port/STREAM?token=...`) with its password and
/// its `token` masked (`***`), for messages and logs: an error or a report that quotes a
/// URL must not carry its secrets.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((auth, hosts)) => match auth.split_once(':') {
            Some((user, _)) => format!("{user}:***@{hosts}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some(("token", _)) => "token=***".to_string(),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(target: Target, expected: Expected, id: Option<&str>) -> Publish {
        Publish { target, payload: b"x".to_vec(), expected, msg_id: id.map(str::to_string) }
    }

    #[test]
    fn expectations_keys_reads_and_subscriptions() {
        let stream = RedbStream::memory().unwrap();
        let (a, b) = (Target::Session(SessionId([1; 16])), Target::Session(SessionId([2; 16])));
        let mut sub = stream.subscribe(1).unwrap();
        assert_eq!(sub.next_within(Duration::from_millis(10)).unwrap(), None);
        let out = stream
            .append(vec![
                message(a, Expected::NoMessage, Some("k1")),
                message(a, Expected::NoMessage, None),
                message(b, Expected::Any, None),
                message(a, Expected::Last(1), Some("k1")),
                message(a, Expected::Last(1), None),
                message(Target::Many, Expected::Any, None),
            ])
            .unwrap();
        use Published::*;
        assert_eq!(
            out,
            vec![
                Stored { seq: 1, duplicate: false },
                Conflict,
                Stored { seq: 2, duplicate: false },
                Stored { seq: 1, duplicate: true },
                Stored { seq: 3, duplicate: false },
                Stored { seq: 4, duplicate: false },
            ]
        );
        assert_eq!(stream.tip().unwrap(), 4);
        assert_eq!(stream.last_of(&a).unwrap(), Some(3));
        assert_eq!(stream.last_of(&Target::Session(SessionId([9; 16]))).unwrap(), None);
        let read = stream.read(2, 2).unwrap();
        assert_eq!(read.iter().map(|m| (m.seq, m.target)).collect::<Vec<_>>(), vec![(2, b), (3, a)]);
        let seen: Vec<u64> = (0..4).map(|_| sub.next_within(Duration::from_secs(1)).unwrap().unwrap().seq).collect();
        assert_eq!(seen, vec![1, 2, 3, 4]);
        let too_large =
            Publish { payload: vec![0; REDB_STREAM_PAYLOAD_MAX as usize + 1], ..message(a, Expected::Any, None) };
        assert!(matches!(stream.append(vec![too_large]), Err(BackendError::TooLarge { .. })));
        assert_eq!(stream.tip().unwrap(), 4);
    }

    #[test]
    fn a_subscriber_wakes_for_a_later_append_and_a_file_keeps_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stream.redb");
        let stream = RedbStream::open(&path).unwrap();
        let mut sub = stream.subscribe(1).unwrap();
        let writer = stream.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            writer.append(vec![message(Target::Many, Expected::Any, None)]).unwrap();
        });
        let m = sub.next_within(Duration::from_secs(5)).unwrap().expect("woken");
        assert_eq!((m.seq, m.target, m.payload), (1, Target::Many, b"x".to_vec()));
        t.join().unwrap();
        drop((sub, stream));
        let again = RedbStream::open(&path).unwrap();
        assert_eq!(again.tip().unwrap(), 1);
    }
}
