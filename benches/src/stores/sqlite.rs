//! The SQLite baseline: an event table plus projection tables, updated in one
//! transaction per commit, the way the SQLite session stores of agent frameworks work.
//!
//! Choices, each the one SQLite's own documentation recommends for this job:
//! - `journal_mode=WAL` with `synchronous=FULL`: every commit appends to the WAL and
//!   fsyncs it before it returns, so an acknowledged commit survives power loss (the
//!   WAL default, `NORMAL`, may lose the last commits). Automatic checkpoints stay on.
//! - One writer connection behind a mutex, and a separate connection for reads. SQLite
//!   admits one writer at a time whatever the number of connections; with a connection
//!   per thread, contending writers get `SQLITE_BUSY` and `busy_timeout` retries them
//!   after sleeps of up to 100 ms, which wastes the disk's time. Serializing writers in
//!   the process is what the docs advise for a single-process application, and WAL lets
//!   the reader run beside the writer.
//! - `BEGIN IMMEDIATE` for every write transaction (it takes the write lock up front
//!   instead of upgrading a read lock), and cached prepared statements for every query.
//! - Message bodies are stored once, in `messages`; events and the `transcript`
//!   projection refer to them by row id, so a compaction rewrites ids, never bodies.
//!
//! Projections (`sessions`, `transcript`, `context`, `usage`, `turns`) are updated by
//! [`fold`], the same function the rebuild replays the event table through.

use super::{fork_id, Cursor, Head, SessionStore, StoreKind};
use crate::workload::{Msg, Op, Turn};
use crate::Result;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The database file inside the store's directory.
pub const FILE: &str = "sessions.sqlite";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events(
  seq INTEGER PRIMARY KEY, session BLOB NOT NULL, stream_seq INTEGER NOT NULL,
  kind TEXT NOT NULL, payload TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_session ON events(session, stream_seq);
CREATE TABLE IF NOT EXISTS messages(
  id INTEGER PRIMARY KEY, role TEXT NOT NULL, content_type TEXT NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sessions(
  id BLOB PRIMARY KEY, message_count INTEGER NOT NULL, last_seq INTEGER NOT NULL,
  stream_seq INTEGER NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  parent BLOB) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS transcript(
  session BLOB NOT NULL, position INTEGER NOT NULL, message_id INTEGER NOT NULL,
  PRIMARY KEY(session, position)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS context(
  session BLOB NOT NULL, key TEXT NOT NULL, message_id INTEGER NOT NULL, applied INTEGER NOT NULL,
  PRIMARY KEY(session, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage(
  session BLOB NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL,
  input INTEGER NOT NULL, output INTEGER NOT NULL, PRIMARY KEY(session, provider, model)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS turns(
  session BLOB NOT NULL, turn_id TEXT NOT NULL, seq INTEGER NOT NULL,
  PRIMARY KEY(session, turn_id)) WITHOUT ROWID;
";

const PROJECTIONS: [&str; 5] = ["sessions", "transcript", "context", "usage", "turns"];

/// Rewrites the closed database without its free pages (`VACUUM`) and folds the WAL
/// back into it (`wal_checkpoint(TRUNCATE)`).
pub fn vacuum(dir: &Path) -> Result<()> {
    let conn = Connection::open(dir.join(FILE))?;
    conn.execute_batch("VACUUM")?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

/// SQLite behind the [`SessionStore`] trait.
pub struct SqliteStore {
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
    forks: AtomicU64,
}

fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if mode != "wal" {
        return Err(format!("sqlite refused WAL mode: {mode}").into());
    }
    conn.execute_batch("PRAGMA synchronous=FULL;")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn insert_message(tx: &Transaction<'_>, m: &Msg) -> Result<i64> {
    tx.prepare_cached("INSERT INTO messages(role, content_type, body) VALUES (?1, ?2, ?3)")?.execute(params![
        m.role.as_str(),
        m.content_type,
        m.body
    ])?;
    Ok(tx.last_insert_rowid())
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_i64).collect()).unwrap_or_default()
}

fn insert_rows(tx: &Transaction<'_>, session: &[u8], from: i64, ids: &[i64]) -> Result<()> {
    let mut stmt = tx.prepare_cached("INSERT INTO transcript(session, position, message_id) VALUES (?1, ?2, ?3)")?;
    for (i, id) in ids.iter().enumerate() {
        stmt.execute(params![session, from + i as i64, id])?;
    }
    Ok(())
}

fn transcript_ids(tx: &Transaction<'_>, session: &[u8], from: i64, to: i64) -> Result<Vec<i64>> {
    let mut stmt = tx.prepare_cached(
        "SELECT message_id FROM transcript WHERE session = ?1 AND position >= ?2 AND position < ?3 ORDER BY position",
    )?;
    let rows = stmt.query_map(params![session, from, to], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<Vec<i64>>>()?)
}

/// Folds one event into the projections: the live path and the rebuild both call it.
pub fn fold(
    tx: &Transaction<'_>,
    seq: i64,
    session: &[u8],
    stream_seq: i64,
    kind: &str,
    p: &Value,
    at: i64,
) -> Result<()> {
    if kind == "created" {
        let messages = ids(&p["messages"]);
        let parent = p["parent"].as_str().map(|s| s.as_bytes().to_vec());
        tx.prepare_cached(
            "INSERT INTO sessions(id, message_count, last_seq, stream_seq, created_at, updated_at, parent)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)",
        )?
        .execute(params![session, messages.len() as i64, seq, stream_seq, at, parent])?;
        return insert_rows(tx, session, 0, &messages);
    }
    let count: i64 =
        tx.prepare_cached("SELECT message_count FROM sessions WHERE id = ?1")?.query_row([session], |r| r.get(0))?;
    let count = match kind {
        "turn" => {
            let messages = ids(&p["messages"]);
            insert_rows(tx, session, count, &messages)?;
            tx.prepare_cached(
                "INSERT INTO usage(session, provider, model, input, output) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(session, provider, model) DO UPDATE
                 SET input = input + excluded.input, output = output + excluded.output",
            )?
            .execute(params![session, "provider", "model", p["input"].as_i64(), p["output"].as_i64()])?;
            tx.prepare_cached("INSERT INTO turns(session, turn_id, seq) VALUES (?1, ?2, ?3)")?.execute(params![
                session,
                p["turn_id"].as_str(),
                seq
            ])?;
            if let Some(key) = p["applied_context"].as_str() {
                tx.prepare_cached("UPDATE context SET applied = 1 WHERE session = ?1 AND key = ?2")?
                    .execute(params![session, key])?;
            }
            count + messages.len() as i64
        }
        "context" => {
            tx.prepare_cached("INSERT INTO context(session, key, message_id, applied) VALUES (?1, ?2, ?3, 0)")?
                .execute(params![session, p["key"].as_str(), p["message"].as_i64()])?;
            count
        }
        "compaction" | "restore" => {
            let start = p["start"].as_i64().ok_or("rewrite without start")?;
            let end = p["end"].as_i64().ok_or("rewrite without end")?;
            let tail = transcript_ids(tx, session, end, i64::MAX)?;
            tx.prepare_cached("DELETE FROM transcript WHERE session = ?1 AND position >= ?2")?
                .execute(params![session, start])?;
            let mut rows = ids(&p["replacement"]);
            rows.extend(tail);
            insert_rows(tx, session, start, &rows)?;
            start + rows.len() as i64
        }
        other => return Err(format!("unknown event kind {other}").into()),
    };
    tx.prepare_cached(
        "UPDATE sessions SET message_count = ?2, last_seq = ?3, stream_seq = ?4, updated_at = ?5 WHERE id = ?1",
    )?
    .execute(params![session, count, seq, stream_seq, at])?;
    Ok(())
}

/// Appends an event and folds it, inside `tx`.
fn append(tx: &Transaction<'_>, session: &[u8], kind: &str, payload: Value) -> Result<()> {
    let stream: Option<i64> = tx
        .prepare_cached("SELECT stream_seq FROM sessions WHERE id = ?1")?
        .query_row([session], |r| r.get(0))
        .optional()?;
    let stream_seq = stream.unwrap_or(0) + 1;
    let at = now_ms();
    tx.prepare_cached(
        "INSERT INTO events(session, stream_seq, kind, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![session, stream_seq, kind, payload.to_string(), at])?;
    let seq = tx.last_insert_rowid();
    fold(tx, seq, session, stream_seq, kind, &payload, at)
}

fn apply_op(tx: &Transaction<'_>, session: &[u8], op: &Op, fork: Option<[u8; 16]>) -> Result<()> {
    match op {
        Op::Turn(t) => {
            let mut messages = Vec::with_capacity(t.messages.len());
            for m in &t.messages {
                messages.push(insert_message(tx, m)?);
            }
            let payload = json!({
                "turn_id": t.id, "messages": messages, "input": t.usage.0, "output": t.usage.1,
                "applied_context": t.apply_context,
            });
            append(tx, session, "turn", payload)
        }
        Op::Context { key, content } => {
            let m = Msg { role: crate::workload::Role::System, content_type: "text/plain", body: content.clone() };
            let id = insert_message(tx, &m)?;
            append(tx, session, "context", json!({ "key": key, "message": id }))
        }
        Op::Compact { start, end, summary } => {
            let replaced = transcript_ids(tx, session, *start as i64, *end as i64)?;
            let id = insert_message(tx, summary)?;
            let payload = json!({ "start": start, "end": end, "replacement": [id], "replaced": replaced });
            append(tx, session, "compaction", payload)
        }
        Op::Restore => {
            let last: String = tx
                .prepare_cached(
                    "SELECT payload FROM events WHERE session = ?1 AND kind = 'compaction'
                     ORDER BY stream_seq DESC LIMIT 1",
                )?
                .query_row([session], |r| r.get(0))?;
            let c: Value = serde_json::from_str(&last)?;
            let start = c["start"].as_i64().ok_or("compaction without start")?;
            let summary = ids(&c["replacement"]);
            let payload = json!({
                "start": start, "end": start + summary.len() as i64,
                "replacement": c["replaced"], "replaced": summary,
            });
            append(tx, session, "restore", payload)
        }
        Op::Fork { index } => {
            let child = fork.ok_or("fork without an id")?;
            let messages = transcript_ids(tx, session, 0, *index as i64)?;
            let payload = json!({ "messages": messages, "parent": super::hex(session), "index": index });
            append(tx, &child, "created", payload)
        }
    }
}

impl SqliteStore {
    /// Opens (or creates) `dir/sessions.sqlite`.
    pub fn open(dir: &Path) -> Result<SqliteStore> {
        let path = dir.join(FILE);
        let writer = connect(&path)?;
        writer.execute_batch(SCHEMA)?;
        let reader = connect(&path)?;
        Ok(SqliteStore { writer: Mutex::new(writer), reader: Mutex::new(reader), forks: AtomicU64::new(0) })
    }

    fn write<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut conn = self.writer.lock().map_err(|_| "sqlite writer lock poisoned")?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }
}

fn create_in(tx: &Transaction<'_>, id: &[u8; 16], system: &Msg) -> Result<()> {
    let m = insert_message(tx, system)?;
    append(tx, id, "created", json!({ "messages": [m], "parent": null }))
}

/// Creates the store in `dir`: one transaction per session (the session and all its
/// turns), each committed with `synchronous=FULL`.
pub fn bulk_load(dir: &Path, ids: &[[u8; 16]], system: &Msg, turns: &[Vec<Turn>]) -> Result<()> {
    let store = SqliteStore::open(dir)?;
    for (id, session_turns) in ids.iter().zip(turns) {
        store.write(|tx| {
            create_in(tx, id, system)?;
            for t in session_turns {
                apply_op(tx, id, &Op::Turn(t.clone()), None)?;
            }
            Ok(())
        })?;
    }
    Box::new(store).close()
}

impl SessionStore for SqliteStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Sqlite
    }

    fn create(&self, id: [u8; 16], system: &Msg) -> Result<Cursor> {
        self.write(|tx| create_in(tx, &id, system))?;
        Ok(Cursor::new(id))
    }

    fn apply(&self, cursor: &mut Cursor, op: &Op) -> Result<()> {
        let fork = match op {
            Op::Fork { .. } => Some(fork_id(self.forks.fetch_add(1, Ordering::Relaxed))),
            _ => None,
        };
        self.write(|tx| apply_op(tx, &cursor.id, op, fork))
    }

    fn head(&self, id: [u8; 16]) -> Result<Head> {
        let conn = self.reader.lock().map_err(|_| "sqlite reader lock poisoned")?;
        let mut stmt = conn.prepare_cached("SELECT message_count, stream_seq FROM sessions WHERE id = ?1")?;
        let (count, events): (i64, i64) = stmt.query_row([&id[..]], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(Head { message_count: count as u64, events: events as u64 })
    }

    fn page(&self, id: [u8; 16], offset: u64, limit: u64) -> Result<u64> {
        let conn = self.reader.lock().map_err(|_| "sqlite reader lock poisoned")?;
        let mut stmt = conn.prepare_cached(
            "SELECT m.role, m.content_type, m.body FROM transcript t JOIN messages m ON m.id = t.message_id
             WHERE t.session = ?1 AND t.position >= ?2 ORDER BY t.position LIMIT ?3",
        )?;
        let mut rows = stmt.query(params![&id[..], offset as i64, limit as i64])?;
        let mut bytes = 0u64;
        while let Some(row) = rows.next()? {
            let role: String = row.get(0)?;
            let content_type: String = row.get(1)?;
            let body: Vec<u8> = row.get(2)?;
            std::hint::black_box((role, content_type));
            bytes += body.len() as u64;
        }
        Ok(bytes)
    }

    fn rebuild(&self) -> Result<u64> {
        self.write(|tx| {
            for table in PROJECTIONS {
                tx.execute(&format!("DELETE FROM {table}"), [])?;
            }
            let mut stmt =
                tx.prepare("SELECT seq, session, stream_seq, kind, payload, created_at FROM events ORDER BY seq")?;
            let mut rows = stmt.query([])?;
            let mut events = 0u64;
            while let Some(row) = rows.next()? {
                let session: Vec<u8> = row.get(1)?;
                let kind: String = row.get(3)?;
                let payload: Value = serde_json::from_str(row.get_ref(4)?.as_str()?)?;
                fold(tx, row.get(0)?, &session, row.get(2)?, &kind, &payload, row.get(5)?)?;
                events += 1;
            }
            Ok(events)
        })
    }

    fn close(self: Box<Self>) -> Result<()> {
        let SqliteStore { writer, reader, .. } = *self;
        drop(reader.into_inner().map_err(|_| "sqlite reader lock poisoned")?);
        let writer = writer.into_inner().map_err(|_| "sqlite writer lock poisoned")?;
        writer.close().map_err(|(_, e)| e)?;
        Ok(())
    }
}
