//! The naive redb baseline: what a first event store on redb tends to look like. Each
//! event is a JSON document keyed by (session, stream seq), appended in its own durable
//! transaction (`Durability::Immediate`), and the whole session snapshot (every current
//! message, usage and pending context) is rewritten as one JSON document in the same
//! transaction on every turn.
//!
//! Choices: concurrent committers simply queue on redb's write lock (redb admits one
//! write transaction at a time). A head or page read parses the session's snapshot.
//! Undoing a compaction refolds the session's events, since the snapshot keeps only the
//! current transcript. Rebuilding drops the snapshots and folds every event again.

use super::{fork_id, hex, Cursor, Head, SessionStore, StoreKind};
use crate::workload::{Msg, Op, Turn};
use crate::Result;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The database file inside the store's directory.
pub const FILE: &str = "naive.redb";

const EVENTS: TableDefinition<([u8; 16], u64), &str> = TableDefinition::new("events");
const SNAPSHOTS: TableDefinition<[u8; 16], &str> = TableDefinition::new("snapshots");

/// The naive redb store behind the [`SessionStore`] trait.
pub struct NaiveRedbStore {
    db: Database,
    forks: AtomicU64,
}

#[derive(Default)]
struct State {
    messages: Vec<Value>,
    events: u64,
    input: u64,
    output: u64,
    context: Map<String, Value>,
    undo: Option<(usize, Vec<Value>, usize)>,
}

fn message_json(m: &Msg) -> Value {
    json!({ "role": m.role.as_str(), "content_type": m.content_type, "body": String::from_utf8_lossy(&m.body) })
}

fn turn_json(t: &Turn) -> Value {
    let messages: Vec<Value> = t.messages.iter().map(message_json).collect();
    json!({
        "type": "turn", "turn_id": t.id, "messages": messages, "input": t.usage.0, "output": t.usage.1,
        "applied_context": t.apply_context,
    })
}

impl State {
    fn from_snapshot(s: &str) -> Result<State> {
        let mut v: Value = serde_json::from_str(s)?;
        let messages = match v["messages"].take() {
            Value::Array(a) => a,
            _ => Vec::new(),
        };
        let context = match v["context"].take() {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        Ok(State {
            messages,
            events: v["events"].as_u64().unwrap_or(0),
            input: v["input"].as_u64().unwrap_or(0),
            output: v["output"].as_u64().unwrap_or(0),
            context,
            undo: None,
        })
    }

    fn snapshot(&self) -> String {
        json!({
            "messages": self.messages, "events": self.events, "input": self.input, "output": self.output,
            "context": self.context,
        })
        .to_string()
    }

    fn fold(&mut self, e: &Value) -> Result<()> {
        let messages = || e["messages"].as_array().cloned().unwrap_or_default();
        match e["type"].as_str() {
            Some("created") => self.messages = messages(),
            Some("turn") => {
                self.messages.extend(messages());
                self.input += e["input"].as_u64().unwrap_or(0);
                self.output += e["output"].as_u64().unwrap_or(0);
                if let Some(key) = e["applied_context"].as_str() {
                    self.context.remove(key);
                }
            }
            Some("context") => {
                let key = e["key"].as_str().ok_or("context without key")?;
                self.context.insert(key.to_string(), e["content"].clone());
            }
            Some("compaction") => {
                let start = e["start"].as_u64().ok_or("compaction without start")? as usize;
                let end = e["end"].as_u64().ok_or("compaction without end")? as usize;
                let summary = messages();
                let inserted = summary.len();
                let replaced = self.messages.splice(start..end, summary).collect();
                self.undo = Some((start, replaced, inserted));
            }
            Some("restore") => {
                let (start, replaced, inserted) = self.undo.take().ok_or("restore without a compaction")?;
                self.messages.splice(start..start + inserted, replaced);
            }
            other => return Err(format!("unknown event type {other:?}").into()),
        }
        self.events += 1;
        Ok(())
    }
}

fn load(txn: &WriteTransaction, id: &[u8; 16]) -> Result<State> {
    let snapshots = txn.open_table(SNAPSHOTS)?;
    let s = snapshots.get(id)?.ok_or("no such session")?;
    State::from_snapshot(s.value())
}

fn refold(txn: &WriteTransaction, id: &[u8; 16]) -> Result<State> {
    let events = txn.open_table(EVENTS)?;
    let mut state = State::default();
    for entry in events.range((*id, 0)..=(*id, u64::MAX))? {
        let (_, v) = entry?;
        state.fold(&serde_json::from_str(v.value())?)?;
    }
    Ok(state)
}

fn append(txn: &WriteTransaction, id: &[u8; 16], state: &mut State, event: &Value) -> Result<()> {
    state.fold(event)?;
    txn.open_table(EVENTS)?.insert((*id, state.events), event.to_string().as_str())?;
    txn.open_table(SNAPSHOTS)?.insert(id, state.snapshot().as_str())?;
    Ok(())
}

fn create_in(txn: &WriteTransaction, id: &[u8; 16], system: &Msg) -> Result<()> {
    let event = json!({ "type": "created", "messages": [message_json(system)] });
    append(txn, id, &mut State::default(), &event)
}

impl NaiveRedbStore {
    /// Opens (or creates) `dir/naive.redb`.
    pub fn open(dir: &Path) -> Result<NaiveRedbStore> {
        let db = Database::create(dir.join(FILE))?;
        let txn = db.begin_write()?;
        txn.open_table(EVENTS)?;
        txn.open_table(SNAPSHOTS)?;
        txn.commit()?;
        Ok(NaiveRedbStore { db, forks: AtomicU64::new(0) })
    }

    fn write<T>(&self, f: impl FnOnce(&WriteTransaction) -> Result<T>) -> Result<T> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        let out = f(&txn)?;
        txn.commit()?;
        Ok(out)
    }

    fn read_state(&self, id: &[u8; 16]) -> Result<State> {
        let txn = self.db.begin_read()?;
        let snapshots = txn.open_table(SNAPSHOTS)?;
        let s = snapshots.get(id)?.ok_or("no such session")?;
        State::from_snapshot(s.value())
    }
}

/// Creates the store in `dir`: one durable transaction per session holding its events
/// and its final snapshot.
pub fn bulk_load(dir: &Path, ids: &[[u8; 16]], system: &Msg, turns: &[Vec<Turn>]) -> Result<()> {
    let store = NaiveRedbStore::open(dir)?;
    for (id, session_turns) in ids.iter().zip(turns) {
        store.write(|txn| {
            let mut state = State::default();
            state.fold(&json!({ "type": "created", "messages": [message_json(system)] }))?;
            let mut events = txn.open_table(EVENTS)?;
            events.insert(
                (*id, 1),
                json!({ "type": "created", "messages": [message_json(system)] }).to_string().as_str(),
            )?;
            for t in session_turns {
                let e = turn_json(t);
                state.fold(&e)?;
                events.insert((*id, state.events), e.to_string().as_str())?;
            }
            txn.open_table(SNAPSHOTS)?.insert(id, state.snapshot().as_str())?;
            Ok(())
        })?;
    }
    Box::new(store).close()
}

impl SessionStore for NaiveRedbStore {
    fn kind(&self) -> StoreKind {
        StoreKind::NaiveRedb
    }

    fn create(&self, id: [u8; 16], system: &Msg) -> Result<Cursor> {
        self.write(|txn| create_in(txn, &id, system))?;
        Ok(Cursor::new(id))
    }

    fn apply(&self, cursor: &mut Cursor, op: &Op) -> Result<()> {
        let id = cursor.id;
        self.write(|txn| match op {
            Op::Turn(t) => append(txn, &id, &mut load(txn, &id)?, &turn_json(t)),
            Op::Context { key, content } => {
                let e = json!({ "type": "context", "key": key, "content": String::from_utf8_lossy(content) });
                append(txn, &id, &mut load(txn, &id)?, &e)
            }
            Op::Compact { start, end, summary } => {
                let e =
                    json!({ "type": "compaction", "start": start, "end": end, "messages": [message_json(summary)] });
                append(txn, &id, &mut load(txn, &id)?, &e)
            }
            Op::Restore => append(txn, &id, &mut refold(txn, &id)?, &json!({ "type": "restore" })),
            Op::Fork { index } => {
                let parent = load(txn, &id)?;
                let kept: Vec<Value> = parent.messages.iter().take(*index as usize).cloned().collect();
                let child = fork_id(self.forks.fetch_add(1, Ordering::Relaxed));
                let e = json!({ "type": "created", "messages": kept, "parent": hex(&id), "index": index });
                append(txn, &child, &mut State::default(), &e)
            }
        })
    }

    fn head(&self, id: [u8; 16]) -> Result<Head> {
        let state = self.read_state(&id)?;
        Ok(Head { message_count: state.messages.len() as u64, events: state.events })
    }

    fn page(&self, id: [u8; 16], offset: u64, limit: u64) -> Result<u64> {
        let state = self.read_state(&id)?;
        let page = state.messages.iter().skip(offset as usize).take(limit as usize);
        Ok(page.map(|m| m["body"].as_str().map_or(0, str::len) as u64).sum())
    }

    fn rebuild(&self) -> Result<u64> {
        self.write(|txn| {
            txn.delete_table(SNAPSHOTS)?;
            let events = txn.open_table(EVENTS)?;
            let mut snapshots = txn.open_table(SNAPSHOTS)?;
            let mut current: Option<([u8; 16], State)> = None;
            let mut count = 0u64;
            for entry in events.iter()? {
                let (k, v) = entry?;
                let (id, _) = k.value();
                if current.as_ref().is_some_and(|(c, _)| *c != id) {
                    if let Some((c, state)) = current.take() {
                        snapshots.insert(c, state.snapshot().as_str())?;
                    }
                }
                let (_, state) = current.get_or_insert_with(|| (id, State::default()));
                state.fold(&serde_json::from_str(v.value())?)?;
                count += 1;
            }
            if let Some((c, state)) = current {
                snapshots.insert(c, state.snapshot().as_str())?;
            }
            Ok(count)
        })
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
