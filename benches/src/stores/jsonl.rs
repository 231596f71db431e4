//! The JSON Lines baseline: one file per session, one line per event, appended with
//! `write` and made durable with `sync_data` before the append returns, the way many
//! coding agents keep their transcripts.
//!
//! Choices:
//! - Sessions are independent: each file has its own lock, so appends to different
//!   sessions run (and fsync) in parallel; the store has no global write lock.
//! - A new file is made durable by fsyncing the file and then its directory.
//! - The current transcript is the fold of the file: a compaction line replaces a range
//!   with its summary, a restore line undoes the compaction before it. The store keeps,
//!   per session, an in-memory index of where each current message's line starts, built
//!   on the session's first access by reading its file once and kept up to date on
//!   every append. A head read is then a lookup, and a page read is one `pread` and one
//!   JSON parse per line it touches. Rebuilding the projections means re-reading every
//!   file.
//! - A fork writes a new file whose first line carries copies of the kept messages.

use super::{fork_id, hex, Cursor, Head, SessionStore, StoreKind};
use crate::workload::{Msg, Op, Turn};
use crate::Result;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Where one current message lives: the line at `offset` of `len` bytes, entry `index`
/// of its `messages` array.
#[derive(Clone, Copy, Debug)]
struct MsgRef {
    offset: u64,
    len: u32,
    index: u32,
}

struct Undo {
    start: usize,
    replaced: Vec<MsgRef>,
    inserted: usize,
}

struct SessionFile {
    file: File,
    len: u64,
    lines: u64,
    transcript: Vec<MsgRef>,
    undo: Option<Undo>,
}

type Sessions = HashMap<[u8; 16], Arc<Mutex<SessionFile>>>;

/// JSON Lines files behind the [`SessionStore`] trait.
pub struct JsonlStore {
    dir: PathBuf,
    sessions: Mutex<Sessions>,
    forks: AtomicU64,
}

fn message_json(m: &Msg) -> Value {
    json!({ "role": m.role.as_str(), "content_type": m.content_type, "body": String::from_utf8_lossy(&m.body) })
}

fn line(v: &Value) -> Vec<u8> {
    let mut bytes = v.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

fn id_of(name: &str) -> Option<[u8; 16]> {
    let stem = name.strip_suffix(".jsonl")?;
    if stem.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&stem[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(id)
}

impl SessionFile {
    /// Folds the line at `offset` into the index.
    fn fold(&mut self, offset: u64, len: u32, v: &Value) -> Result<()> {
        let count = v["messages"].as_array().map_or(0, Vec::len) as u32;
        let refs = (0..count).map(|index| MsgRef { offset, len, index });
        match v["type"].as_str() {
            Some("created") | Some("turn") => self.transcript.extend(refs),
            Some("context") => {}
            Some("compaction") => {
                let start = v["start"].as_u64().ok_or("compaction without start")? as usize;
                let end = v["end"].as_u64().ok_or("compaction without end")? as usize;
                let replaced = self.transcript.splice(start..end, refs).collect();
                self.undo = Some(Undo { start, replaced, inserted: count as usize });
            }
            Some("restore") => {
                let undo = self.undo.take().ok_or("restore without a compaction")?;
                self.transcript.splice(undo.start..undo.start + undo.inserted, undo.replaced);
            }
            other => return Err(format!("unknown line type {other:?}").into()),
        }
        self.lines += 1;
        self.len = offset + len as u64;
        Ok(())
    }

    /// Reads the whole file and builds the index.
    fn load(path: &Path) -> Result<SessionFile> {
        let mut file = OpenOptions::new().read(true).append(true).open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut s = SessionFile { file, len: 0, lines: 0, transcript: Vec::new(), undo: None };
        let mut offset = 0usize;
        for raw in bytes.split_inclusive(|b| *b == b'\n') {
            if raw.last() != Some(&b'\n') {
                break; // a torn final line was never acknowledged
            }
            let v: Value = serde_json::from_slice(raw)?;
            s.fold(offset as u64, raw.len() as u32, &v)?;
            offset += raw.len();
        }
        Ok(s)
    }

    /// Appends one line durably and folds it.
    fn append(&mut self, v: &Value) -> Result<()> {
        let bytes = line(v);
        self.file.write_all(&bytes)?;
        self.file.sync_data()?;
        let offset = self.len;
        self.fold(offset, bytes.len() as u32, v)
    }

    /// The messages at `range` of the current transcript, as JSON values.
    fn messages(&self, from: usize, to: usize) -> Result<Vec<Value>> {
        let mut out = Vec::with_capacity(to.saturating_sub(from));
        let mut cached: Option<(u64, Value)> = None;
        for r in self.transcript.get(from..to.min(self.transcript.len())).unwrap_or(&[]) {
            if cached.as_ref().map(|(o, _)| *o) != Some(r.offset) {
                let mut buf = vec![0u8; r.len as usize];
                self.file.read_exact_at(&mut buf, r.offset)?;
                cached = Some((r.offset, serde_json::from_slice(&buf)?));
            }
            let (_, v) = cached.as_ref().ok_or("no line")?;
            out.push(v["messages"][r.index as usize].clone());
        }
        Ok(out)
    }
}

fn create_file(path: &Path, dir: &Path, first: &Value) -> Result<SessionFile> {
    let mut file = OpenOptions::new().read(true).append(true).create_new(true).open(path)?;
    let bytes = line(first);
    file.write_all(&bytes)?;
    file.sync_data()?;
    File::open(dir)?.sync_all()?;
    let mut s = SessionFile { file, len: 0, lines: 0, transcript: Vec::new(), undo: None };
    s.fold(0, bytes.len() as u32, first)?;
    Ok(s)
}

impl JsonlStore {
    /// Opens (or creates) the store in `dir`. Nothing is read until a session is used.
    pub fn open(dir: &Path) -> Result<JsonlStore> {
        let dir = dir.join("sessions");
        std::fs::create_dir_all(&dir)?;
        Ok(JsonlStore { dir, sessions: Mutex::new(HashMap::new()), forks: AtomicU64::new(0) })
    }

    fn path(&self, id: &[u8; 16]) -> PathBuf {
        self.dir.join(format!("{}.jsonl", hex(id)))
    }

    fn session(&self, id: &[u8; 16]) -> Result<Arc<Mutex<SessionFile>>> {
        let mut map = self.sessions.lock().map_err(|_| "jsonl index lock poisoned")?;
        if let Some(s) = map.get(id) {
            return Ok(s.clone());
        }
        let s = Arc::new(Mutex::new(SessionFile::load(&self.path(id))?));
        map.insert(*id, s.clone());
        Ok(s)
    }

    fn insert(&self, id: [u8; 16], file: SessionFile) -> Result<()> {
        let mut map = self.sessions.lock().map_err(|_| "jsonl index lock poisoned")?;
        map.insert(id, Arc::new(Mutex::new(file)));
        Ok(())
    }
}

/// Creates the store in `dir`: each session's file is written whole and synced once.
pub fn bulk_load(dir: &Path, ids: &[[u8; 16]], system: &Msg, turns: &[Vec<Turn>]) -> Result<()> {
    let store = JsonlStore::open(dir)?;
    for (id, session_turns) in ids.iter().zip(turns) {
        let mut bytes = line(&json!({ "type": "created", "messages": [message_json(system)] }));
        for t in session_turns {
            bytes.extend(line(&turn_json(t)));
        }
        let mut file = OpenOptions::new().write(true).create_new(true).open(store.path(id))?;
        file.write_all(&bytes)?;
        file.sync_data()?;
    }
    File::open(&store.dir)?.sync_all()?;
    Ok(())
}

fn turn_json(t: &Turn) -> Value {
    let messages: Vec<Value> = t.messages.iter().map(message_json).collect();
    json!({
        "type": "turn", "turn_id": t.id, "messages": messages, "input": t.usage.0, "output": t.usage.1,
        "applied_context": t.apply_context,
    })
}

impl SessionStore for JsonlStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Jsonl
    }

    fn create(&self, id: [u8; 16], system: &Msg) -> Result<Cursor> {
        let first = json!({ "type": "created", "messages": [message_json(system)] });
        let file = create_file(&self.path(&id), &self.dir, &first)?;
        self.insert(id, file)?;
        Ok(Cursor::new(id))
    }

    fn apply(&self, cursor: &mut Cursor, op: &Op) -> Result<()> {
        let session = self.session(&cursor.id)?;
        let mut s = session.lock().map_err(|_| "jsonl session lock poisoned")?;
        match op {
            Op::Turn(t) => s.append(&turn_json(t)),
            Op::Context { key, content } => {
                s.append(&json!({ "type": "context", "key": key, "content": String::from_utf8_lossy(content) }))
            }
            Op::Compact { start, end, summary } => s.append(&json!({
                "type": "compaction", "start": start, "end": end, "messages": [message_json(summary)],
            })),
            Op::Restore => s.append(&json!({ "type": "restore" })),
            Op::Fork { index } => {
                let kept = s.messages(0, *index as usize)?;
                drop(s);
                let child = fork_id(self.forks.fetch_add(1, Ordering::Relaxed));
                let first = json!({ "type": "created", "messages": kept, "parent": hex(&cursor.id), "index": index });
                let file = create_file(&self.path(&child), &self.dir, &first)?;
                self.insert(child, file)
            }
        }
    }

    fn head(&self, id: [u8; 16]) -> Result<Head> {
        let session = self.session(&id)?;
        let s = session.lock().map_err(|_| "jsonl session lock poisoned")?;
        Ok(Head { message_count: s.transcript.len() as u64, events: s.lines })
    }

    fn page(&self, id: [u8; 16], offset: u64, limit: u64) -> Result<u64> {
        let session = self.session(&id)?;
        let s = session.lock().map_err(|_| "jsonl session lock poisoned")?;
        let messages = s.messages(offset as usize, (offset + limit) as usize)?;
        Ok(messages.iter().map(|m| m["body"].as_str().map_or(0, str::len) as u64).sum())
    }

    fn rebuild(&self) -> Result<u64> {
        let mut fresh: Sessions = HashMap::new();
        let mut events = 0;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(id_of) else { continue };
            let s = SessionFile::load(&entry.path())?;
            events += s.lines;
            fresh.insert(id, Arc::new(Mutex::new(s)));
        }
        *self.sessions.lock().map_err(|_| "jsonl index lock poisoned")? = fresh;
        Ok(events)
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
