//! Helpers shared by the integration tests: opening engines, building commands, and
//! reading the whole log back.
#![allow(dead_code)]

use annal::codec::{content_id, encode_message};
use annal::*;
use std::path::PathBuf;

/// A database in a fresh temporary directory.
pub struct Db {
    /// Keeps the directory alive for the test's duration.
    pub dir: tempfile::TempDir,
    /// The database file.
    pub path: PathBuf,
}

impl Db {
    pub fn new() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("annal.redb");
        Db { dir, path }
    }

    /// Opens with relaxed durability (fast) and the given limits.
    pub fn open_limits(&self, limits: Limits) -> Engine {
        Engine::open_with(&self.path, Options { limits, durability: Durability::Relaxed, ..Options::default() })
            .unwrap()
    }

    /// Opens with relaxed durability and default limits.
    pub fn open(&self) -> Engine {
        self.open_limits(Limits::default())
    }

    /// Opens with the default, durable options.
    pub fn open_durable(&self) -> Engine {
        Engine::open(&self.path).unwrap()
    }
}

/// The rejection inside `result`, panicking on success or on any other error.
#[track_caller]
pub fn rejected<T: std::fmt::Debug>(result: Result<T>) -> Rejection {
    match result {
        Err(Error::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The content id the engine gives `m`: blake3 of the canonical message object.
pub fn message_id(m: &Message) -> ContentId {
    let attachments = m.attachments.iter().map(|a| content_id(a)).collect();
    let object =
        MessageObject { role: m.role, content_type: m.content_type.clone(), body: m.body.clone(), attachments };
    content_id(&encode_message(&object, u64::MAX).unwrap())
}

/// The revision id of a transcript holding exactly `messages`, computed independently.
pub fn revision_of(messages: &[Message]) -> RevisionId {
    let ids: Vec<ContentId> = messages.iter().map(message_id).collect();
    RevisionId::of(&ids)
}

/// A session with `initial` messages; returns its id and head revision.
pub fn create(engine: &Engine, initial: &[Message]) -> (SessionId, RevisionId) {
    let mut c = CreateSession::new();
    for m in initial {
        c = c.message(m.clone());
    }
    let r = engine.create_session(c).unwrap();
    (r.session, r.receipt.revision)
}

/// A user/assistant turn with id `turn_id` against `expected`.
pub fn turn(session: SessionId, turn_id: &str, expected: RevisionId) -> CommitTurn {
    CommitTurn::new(session, turn_id, Expected::Exact(expected))
        .message(Message::user(format!("question of {turn_id}")))
        .message(Message::assistant(format!("answer of {turn_id}")))
}

/// Commits `n` two-message turns named `{prefix}{i}` and returns the new head.
pub fn commit_turns(engine: &Engine, session: SessionId, prefix: &str, n: usize, mut head: RevisionId) -> RevisionId {
    for i in 0..n {
        head = engine.commit_turn(turn(session, &format!("{prefix}{i}"), head)).unwrap().receipt().revision;
    }
    head
}

/// The current head of `session`, which must exist.
pub fn head(engine: &Engine, session: SessionId) -> SessionHead {
    engine.head(session).unwrap().expect("session exists")
}

/// A context append.
pub fn context(session: SessionId, key: &str, content: &str) -> AppendContext {
    AppendContext { session, key: key.into(), content: content.as_bytes().to_vec(), source: "memory".into() }
}

/// A top-level tool call.
pub fn tool_call(session: SessionId, op_id: &str, tool: &str, args: &str) -> RecordToolCall {
    RecordToolCall {
        session,
        op_id: op_id.into(),
        call_id: format!("call-{op_id}"),
        tool_name: tool.into(),
        args: args.as_bytes().to_vec(),
        parent_op: None,
        turn_id: None,
        recovery: Recovery::ReplaySafe,
    }
}

/// A successful tool result.
pub fn tool_result(session: SessionId, op_id: &str, result: &str) -> RecordToolResult {
    RecordToolResult { session, op_id: op_id.into(), outcome: ToolOutcome::Ok, result: result.as_bytes().to_vec() }
}

/// A rewrite of `start..end` with `replacement`.
pub fn rewrite(
    session: SessionId,
    expected: RevisionId,
    start: u64,
    end: u64,
    replacement: Vec<Message>,
    reason: RewriteReason,
) -> Rewrite {
    Rewrite {
        session,
        expected,
        start,
        end,
        replacement,
        reason,
        note: format!("{reason:?} of {start}..{end}"),
        actor: "tester".into(),
    }
}

/// A restore of `target` against `expected`.
pub fn restore(session: SessionId, expected: RevisionId, target: RevisionId) -> Restore {
    Restore { session, expected, target, note: "undo".into(), actor: "tester".into() }
}

/// Every event of the log, in seq order, read page by page.
pub fn all_events(reader: &Reader) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    let mut from_seq = 1;
    loop {
        let page = reader.events(EventQuery { from_seq, max_events: 64, max_bytes: 1 << 20 }).unwrap();
        out.extend(page.events);
        if !page.has_more {
            return out;
        }
        from_seq = page.next_seq;
    }
}

/// Every event of one session, in stream order.
pub fn session_events(reader: &Reader, session: SessionId) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    let mut from_seq = 1;
    loop {
        let page = reader.session_events(session, EventQuery { from_seq, max_events: 64, max_bytes: 1 << 20 }).unwrap();
        let done = page.events.is_empty() || !page.has_more;
        out.extend(page.events);
        if done {
            return out;
        }
        from_seq = page.next_seq;
    }
}

/// The whole current transcript of `session`.
pub fn transcript(reader: &Reader, session: SessionId) -> Vec<StoredMessage> {
    reader.transcript(session, PageRequest::first(1000)).unwrap().messages
}

/// The content ids of the whole current transcript.
pub fn transcript_ids(reader: &Reader, session: SessionId) -> Vec<ContentId> {
    transcript(reader, session).into_iter().map(|m| m.content_id).collect()
}

/// The content ids of the whole transcript at `revision`, a revision the session held.
pub fn transcript_ids_at(reader: &Reader, session: SessionId, revision: RevisionId) -> Vec<ContentId> {
    let page = reader.transcript_at(session, revision, PageRequest::first(1000)).unwrap();
    page.messages.into_iter().map(|m| m.content_id).collect()
}

/// The last committed global seq.
pub fn tip_seq(reader: &Reader) -> u64 {
    reader.tip().unwrap().0
}

/// A workload touching every event kind and projection: creation with labels, turns with
/// usage and context, rewrites, a restore, forks (one grown past a transcript chunk), tools
/// (nested), labels, archive and revive. Returns the sessions it created.
pub fn workload(engine: &Engine) -> Vec<SessionId> {
    let created = engine
        .create_session(
            CreateSession::new()
                .label("team", "core")
                .label("env", "prod")
                .metadata(b"meta".to_vec())
                .message(Message::system("be helpful"))
                .message(Message::user("hello").with_attachment(b"png bytes".to_vec())),
        )
        .unwrap();
    let s = created.session;
    let mut rev = created.receipt.revision;
    engine.append_context(context(s, "repo", "src/ holds the code")).unwrap();
    engine.append_context(context(s, "date", "today")).unwrap();
    engine.record_tool_call(tool_call(s, "op1", "bash", "ls")).unwrap();
    let nested = RecordToolCall { parent_op: Some("op1".into()), ..tool_call(s, "op1.1", "grep", "fn") };
    engine.record_tool_call(nested).unwrap();
    engine.record_tool_result(tool_result(s, "op1.1", "3 hits")).unwrap();
    for i in 0..4 {
        let mut t = turn(s, &format!("w{i}"), rev).usage("anthropic", "claude", 100 + i, 10);
        if i == 1 {
            t = t.apply_context("repo").tool_op("op1");
        }
        if i == 2 {
            t = t.usage("openai", "gpt", 7, 3);
        }
        if i == 3 {
            t = t.set_state("model", b"{\"name\":\"claude\"}".to_vec()).set_state("tool.fs", b"cwd=/src".to_vec());
        }
        rev = engine.commit_turn(t).unwrap().receipt().revision;
    }
    let before = rev;
    rev = engine
        .rewrite(rewrite(s, rev, 0, 6, vec![Message::system("summary")], RewriteReason::Compaction))
        .unwrap()
        .revision;
    rev = engine.rewrite(rewrite(s, rev, 1, 2, vec![Message::user("edited")], RewriteReason::Edit)).unwrap().revision;
    rev = engine.restore(restore(s, rev, before)).unwrap().revision;
    engine.commit_turn(turn(s, "after-restore", rev)).unwrap();
    // The inbox: two inputs, one claimed under a lease and consumed by a turn, one left.
    engine.enqueue_input(s, "in-1", Message::user("and the tests?"), InputKind::NextTurn).unwrap();
    engine.enqueue_input(s, "in-2", Message::user("later"), InputKind::ActiveTurn).unwrap();
    let lease = engine.acquire_lease(s, "worker", std::time::Duration::from_secs(3600)).unwrap();
    let claim = ClaimInputs {
        session: s,
        token: lease.token,
        owner: lease.owner.clone(),
        target: ClaimTarget::NextTurn,
        ttl_ms: 60_000,
        max: 4,
    };
    engine.claim_inputs(claim).unwrap();
    let drain = CommitTurn::new(s, "drain", Expected::Any).message(Message::assistant("tests pass")).consumes("in-1");
    engine.fenced(lease.fence()).commit_turn(drain).unwrap();
    let fork = engine.fork_at(s, 4).unwrap().session;
    let branch = engine.fork_replace(s, 2, Message::user("what if")).unwrap().session;
    engine.commit_turn(turn(fork, "f0", head(engine, fork).revision)).unwrap();
    // A long turn: the fork's transcript fills a chunk of ids and gets a checkpoint.
    let long = (0..140).map(|i| Message::assistant(format!("line {i}"))).collect();
    let mut t = CommitTurn::new(fork, "f-long", Expected::Any);
    t.messages = long;
    engine.commit_turn(t).unwrap();
    let mut set = std::collections::BTreeMap::new();
    set.insert("stage".to_string(), "review".to_string());
    let remove = ["env".to_string()].into_iter().collect();
    engine.set_labels(SetLabels { session: s, set, remove }).unwrap();
    engine.archive(branch, "abandoned").unwrap();
    engine.archive(fork, "done").unwrap();
    engine.revive(fork, "more work").unwrap();
    engine.record_tool_result(tool_result(s, "op1", "a b c")).unwrap();
    engine.record_tool_call(tool_call(fork, "op9", "web", "q")).unwrap();
    let state = SetHostState::new(s, Expected::Any).set("model", b"{\"name\":\"claude-2\"}".to_vec()).remove("tool.fs");
    engine.set_host_state(state).unwrap();
    engine.set_metadata(SetMetadata { session: fork, metadata: b"meta-2".to_vec(), expected: Expected::Any }).unwrap();
    vec![s, fork, branch]
}

/// Rewrites the raw bytes of the log record at `seq` with `edit` (which may change its
/// length), then re-seals the plain record chain from there to the tip, and the tip in
/// `meta`, so that only what `edit` changed differs. The engine must be closed.
pub fn edit_log_record(path: &std::path::Path, seq: u64, edit: impl FnOnce(&mut Vec<u8>)) {
    use annal::codec::{stored_chain_hash, LogChain, HASH_LEN};
    use annal::tables::{encode_tip, meta_keys, LOG, META};
    use redb::ReadableTable;
    let chain = LogChain::plain();
    let raw = redb::Database::create(path).unwrap();
    let txn = raw.begin_write().unwrap();
    let (last, prev) = {
        let mut log = txn.open_table(LOG).unwrap();
        let last = log.last().unwrap().unwrap().0.value();
        let mut prev = match seq {
            1 => chain.genesis(),
            n => stored_chain_hash(log.get(n - 1).unwrap().unwrap().value()).unwrap(),
        };
        let mut edit = Some(edit);
        for n in seq..=last {
            let mut bytes = log.get(n).unwrap().unwrap().value().to_vec();
            if let Some(edit) = edit.take() {
                edit(&mut bytes);
            }
            let split = bytes.len() - HASH_LEN;
            prev = annal::codec::chain_link(&bytes[..split], &prev, &chain);
            bytes[split..].copy_from_slice(&prev.0);
            log.insert(n, bytes.as_slice()).unwrap();
        }
        let mut meta = txn.open_table(META).unwrap();
        meta.insert(meta_keys::TIP, encode_tip(last, &prev).as_slice()).unwrap();
        (last, prev)
    };
    txn.commit().unwrap();
    // A projections file checkpointed at the tip stays current: only the record changed.
    let projections = annal::projections_path(path);
    if projections.exists() {
        let raw = redb::Database::create(&projections).unwrap();
        let txn = raw.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            let mark = meta.get(meta_keys::CHECKPOINT).unwrap().map(|g| g.value().to_vec());
            if let Some(mark) = mark {
                if annal::tables::decode_tip(&mark).unwrap().0 == last {
                    meta.insert(meta_keys::CHECKPOINT, encode_tip(last, &prev).as_slice()).unwrap();
                }
            }
        }
        txn.commit().unwrap();
    }
}

/// Writes one `meta` value through a raw redb handle. The engine must be closed.
pub fn set_meta(path: &std::path::Path, key: &str, value: &[u8]) {
    let raw = redb::Database::create(path).unwrap();
    let txn = raw.begin_write().unwrap();
    txn.open_table(annal::tables::META).unwrap().insert(key, value).unwrap();
    txn.commit().unwrap();
}

/// Reads one integer `meta` value through a raw redb handle. The engine must be closed.
pub fn meta_u64(path: &std::path::Path, key: &str) -> Option<u64> {
    use redb::ReadableDatabase;
    let raw = redb::Database::create(path).unwrap();
    let txn = raw.begin_read().unwrap();
    let meta = txn.open_table(annal::tables::META).unwrap();
    let value = meta.get(key).unwrap().map(|g| g.value().to_vec());
    value.and_then(|v| annal::tables::meta_u64(&v))
}
