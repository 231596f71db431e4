//! Every limit in [`annal::Limits`] (SPEC §8, invariant 10), at the limit and one past it.
//!
//! A command at the limit is accepted. One past it is `Rejection::LimitExceeded` naming
//! the right [`Limit`], with `actual > max`, and every file of the database (the log file,
//! its projections file and its two journal files) is byte for byte what it would have
//! been without the command: the test copies the closed database, opens and closes the
//! copy without the command, opens the original, sends the command (the files are hashed
//! before and after it while the engine is open), closes it, and compares the two
//! databases file by file. Queries that break a page limit are rejected the same way and
//! write nothing.
//! The record-size limit is checked in the codec's decoder.

use annal::codec::{decode_record, encode_record, DecodeError, LogChain};
use annal::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Limits small enough that every test is fast. Each is far from the others, so that a
/// command built to break one breaks no other.
fn small() -> Limits {
    Limits {
        content_bytes_max: 512,
        command_bytes_max: 600,
        messages_per_command_max: 4,
        labels_per_session_max: 3,
        label_key_bytes_max: 8,
        label_value_bytes_max: 16,
        id_bytes_max: 12,
        page_items_max: 5,
        page_bytes_max: 4096,
        record_bytes_max: 64 << 10,
        metadata_bytes_max: 32,
        batch_commands_max: 3,
        attachments_per_message_max: 2,
        list_items_max: 3,
        note_bytes_max: 20,
        host_state_name_bytes_max: 16,
        host_state_entries_max: 3,
        draft_bytes_max: 64,
        session_draft_bytes_max: 96,
        draft_bytes_total_max: 128,
        inbox_inputs_max: 4,
    }
}

fn options(limits: Limits) -> Options {
    Options { limits, ..Options::default() }
}

struct Db {
    _dir: tempfile::TempDir,
    path: PathBuf,
    options: Options,
}

impl Db {
    fn new(limits: Limits) -> Db {
        Db::with_options(options(limits))
    }

    fn with_options(options: Options) -> Db {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("limits.redb");
        let db = Db { _dir: dir, path, options };
        db.open().close().expect("create the file");
        db
    }

    fn open(&self) -> Engine {
        Engine::open_with(&self.path, self.options.clone()).expect("open")
    }
}

/// What each file of the database is, in the order of [`database_files`].
const FILE_NAMES: [&str; 4] = ["log file", "projections file", "journal file 0", "journal file 1"];

/// The hash of every file of the database at `path` ([`database_files`]: the log file, its
/// projections file and its two journal files), `None` for one that does not exist.
fn files_hash(path: &Path) -> [Option<blake3::Hash>; 4] {
    database_files(path).map(|file| match std::fs::read(&file) {
        Ok(bytes) => Some(blake3::hash(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("read {}: {e}", file.display()),
    })
}

/// Fails naming every file whose hash differs between `left` and `right`.
#[track_caller]
fn assert_same_files(left: [Option<blake3::Hash>; 4], right: [Option<blake3::Hash>; 4], what: &str) {
    let short = |h: &Option<blake3::Hash>| h.map_or("absent".to_string(), |h| h.to_hex()[..12].to_string());
    let differ: Vec<String> = FILE_NAMES
        .iter()
        .zip(left.iter().zip(&right))
        .filter(|(_, (l, r))| l != r)
        .map(|(name, (l, r))| format!("{name} {} -> {}", short(l), short(r)))
        .collect();
    assert!(differ.is_empty(), "{what}: {}", differ.join(", "));
}

#[track_caller]
fn assert_limit<T: std::fmt::Debug>(result: Result<T>, limit: Limit) {
    match result {
        Err(Error::Rejected(Rejection::LimitExceeded { limit: found, actual, max })) => {
            assert_eq!(found, limit, "the rejection names the limit");
            assert!(actual > max, "{limit}: reported actual {actual} must exceed max {max}");
        }
        other => panic!("expected LimitExceeded({limit}), got {other:?}"),
    }
}

/// Sends `command` to a closed database and checks it is rejected for `limit`, that no
/// file of the database changes while the engine is open, and that every file ends up
/// exactly as opening and closing it without the command leaves it (redb records its
/// allocator state when it closes, so a bare before/after hash around an open and a close
/// differs even with no command at all).
#[track_caller]
fn reject_without_trace(db: &Db, command: Command, limit: Limit) {
    let control = db.path.with_extension("control");
    for (from, to) in database_files(&db.path).iter().zip(database_files(&control)) {
        if from.exists() {
            std::fs::copy(from, to).expect("copy");
        }
    }
    Engine::open_with(&control, db.options.clone()).expect("open control").close().expect("close control");
    let engine = db.open();
    let tip = engine.tip().expect("tip");
    let digests = engine.projection_digests().expect("digests");
    let notices = engine.subscribe();
    // Every file a command could write: a durable commit writes a journal file, the log
    // file takes the journal's rows, and checkpoints write the projections file (the delta
    // is empty after a clean open, so no checkpoint runs while the files are hashed).
    let open_hash = files_hash(&db.path);
    let journalled = db.options.durability == Durability::Durable;
    let exist = [true, true, journalled, journalled];
    assert_eq!(open_hash.map(|h| h.is_some()), exist, "{limit}: the files of the open database");
    assert_limit(engine.execute(command), limit);
    assert_same_files(
        open_hash,
        files_hash(&db.path),
        &format!("{limit}: the rejected command wrote to the open database"),
    );
    assert_eq!(engine.tip().expect("tip"), tip, "{limit}: the tip moved");
    assert_eq!(engine.projection_digests().expect("digests"), digests, "{limit}: projections changed");
    assert!(notices.try_recv().is_err(), "{limit}: a rejection notified a subscriber");
    engine.close().expect("close");
    assert_same_files(
        files_hash(&control),
        files_hash(&db.path),
        &format!("{limit}: the database differs from a run without the command"),
    );
    database_files(&control)
        .iter()
        .filter(|f| f.exists())
        .for_each(|f| std::fs::remove_file(f).expect("remove control"));
}

/// Runs `command` on a closed database and expects it to be accepted.
#[track_caller]
fn accept(db: &Db, command: Command) -> Outcome {
    let engine = db.open();
    let outcome = engine.execute(command).expect("accepted at the limit");
    engine.close().expect("close");
    outcome
}

/// A closed database with one session; returns the session and its head.
fn with_session(db: &Db) -> (SessionId, RevisionId) {
    let engine = db.open();
    let c = engine.create_session(CreateSession::new().message(Message::system("sys"))).expect("create");
    engine.close().expect("close");
    (c.session, c.receipt.revision)
}

fn head(db: &Db, session: SessionId) -> RevisionId {
    let engine = db.open();
    let head = engine.head(session).expect("head").expect("exists").revision;
    engine.close().expect("close");
    head
}

fn turn(session: SessionId, id: &str, expected: RevisionId) -> CommitTurn {
    CommitTurn::new(session, id, Expected::Exact(expected)).message(Message::user("hi"))
}

fn text(len: u64) -> String {
    "x".repeat(len as usize)
}

fn labels(n: u64, key_len: u64, value_len: u64) -> BTreeMap<String, String> {
    (0..n).map(|i| (format!("{i:0width$}", width = key_len as usize), text(value_len))).collect()
}

fn tool_call(session: SessionId, op: &str, args: Vec<u8>) -> RecordToolCall {
    RecordToolCall {
        session,
        op_id: op.into(),
        call_id: "c".into(),
        tool_name: "t".into(),
        args,
        parent_op: None,
        turn_id: None,
        recovery: Recovery::ReplaySafe,
    }
}

#[test]
fn content_bytes() {
    let limits = small();
    let max = limits.content_bytes_max;
    let db = Db::new(limits);
    let (s, _) = with_session(&db);
    // Raw content objects: context text, tool arguments and results, attachments.
    let ctx =
        |key: &str, len| AppendContext { session: s, key: key.into(), content: text(len).into(), source: "".into() };
    accept(&db, Command::AppendContext(ctx("a", max)));
    reject_without_trace(&db, Command::AppendContext(ctx("b", max + 1)), Limit::ContentBytes);
    accept(&db, Command::RecordToolCall(tool_call(s, "op1", vec![1; max as usize])));
    reject_without_trace(
        &db,
        Command::RecordToolCall(tool_call(s, "op2", vec![1; max as usize + 1])),
        Limit::ContentBytes,
    );
    let result = |op: &str, len: u64| RecordToolResult {
        session: s,
        op_id: op.into(),
        outcome: ToolOutcome::Ok,
        result: vec![2; len as usize],
    };
    reject_without_trace(&db, Command::RecordToolResult(result("op1", max + 1)), Limit::ContentBytes);
    accept(&db, Command::RecordToolResult(result("op1", max)));
    let with_attachment = |len: u64| Message::user("a").with_attachment(vec![3; len as usize]);
    let h = head(&db, s);
    reject_without_trace(
        &db,
        Command::CommitTurn(CommitTurn::new(s, "t1", Expected::Exact(h)).message(with_attachment(max + 1))),
        Limit::ContentBytes,
    );
    accept(&db, Command::CommitTurn(CommitTurn::new(s, "t1", Expected::Exact(h)).message(with_attachment(max))));
    // A message's limit is on its body, what the host sends (SPEC §8): a body of exactly
    // the limit is accepted, though its stored object is larger.
    let body = max;
    let h = head(&db, s);
    let msg = |len: u64| Message::new(Role::User, "text/plain", vec![b'm'; len as usize]);
    reject_without_trace(
        &db,
        Command::CommitTurn(CommitTurn::new(s, "t2", Expected::Exact(h)).message(msg(body + 1))),
        Limit::ContentBytes,
    );
    accept(&db, Command::CommitTurn(CommitTurn::new(s, "t2", Expected::Exact(h)).message(msg(body))));
}

#[test]
fn command_bytes() {
    let limits = small();
    let max = limits.command_bytes_max;
    let db = Db::new(limits);
    // Three messages of `text/plain` whose bodies add up to the rest of the budget.
    let create = |total: u64| {
        let body = (total - 3 * 10) / 3;
        let last = total - 3 * 10 - 2 * body;
        let mut c = CreateSession::new();
        for len in [body, body, last] {
            c = c.message(Message::new(Role::User, "text/plain", vec![b'c'; len as usize]));
        }
        Command::CreateSession(c)
    };
    assert_eq!(create(max).approx_bytes(), max);
    accept(&db, create(max));
    reject_without_trace(&db, create(max + 1), Limit::CommandBytes);
}

#[test]
fn messages_per_command() {
    let limits = small();
    let max = limits.messages_per_command_max;
    let db = Db::new(limits);
    let (s, h) = with_session(&db);
    let many = |id: &str, n: u64, expected| {
        let mut t = CommitTurn::new(s, id, Expected::Exact(expected));
        for i in 0..n {
            t = t.message(Message::user(format!("m{i}")));
        }
        Command::CommitTurn(t)
    };
    reject_without_trace(&db, many("t1", max + 1, h), Limit::MessagesPerCommand);
    accept(&db, many("t1", max, h));
    let create = |n: u64| {
        let mut c = CreateSession::new();
        for i in 0..n {
            c = c.message(Message::user(format!("m{i}")));
        }
        Command::CreateSession(c)
    };
    reject_without_trace(&db, create(max + 1), Limit::MessagesPerCommand);
    accept(&db, create(max));
    let h = head(&db, s);
    let rewrite = |n: u64| {
        Command::Rewrite(Rewrite {
            session: s,
            expected: h,
            start: 0,
            end: 1,
            replacement: (0..n).map(|i| Message::system(format!("r{i}"))).collect(),
            reason: RewriteReason::Edit,
            note: String::new(),
            actor: String::new(),
        })
    };
    reject_without_trace(&db, rewrite(max + 1), Limit::MessagesPerCommand);
    accept(&db, rewrite(max));
}

#[test]
fn labels_per_session() {
    let limits = small();
    let max = limits.labels_per_session_max;
    let db = Db::new(limits);
    let create = |n| Command::CreateSession(CreateSession { labels: labels(n, 2, 1), ..CreateSession::new() });
    reject_without_trace(&db, create(max + 1), Limit::LabelsPerSession);
    let Outcome::Created { session, .. } = accept(&db, create(max)) else { panic!("created") };
    // Adding one more label to a full session.
    let more = SetLabels { session, set: labels(1, 3, 1), remove: BTreeSet::new() };
    reject_without_trace(&db, Command::SetLabels(more), Limit::LabelsPerSession);
    // One command may set at most the limit.
    let (s, _) = with_session(&db);
    let set = |n| Command::SetLabels(SetLabels { session: s, set: labels(n, 4, 1), remove: BTreeSet::new() });
    reject_without_trace(&db, set(max + 1), Limit::LabelsPerSession);
    accept(&db, set(max));
    // A fork with its own labels.
    let fork = |n| {
        Command::Fork(Fork {
            parent: s,
            session: new_session_id(),
            index: 1,
            replacement: None,
            labels: Some(labels(n, 2, 1)),
        })
    };
    reject_without_trace(&db, fork(max + 1), Limit::LabelsPerSession);
    accept(&db, fork(max));
}

#[test]
fn label_key_and_value_bytes() {
    let limits = small();
    let (key_max, value_max) = (limits.label_key_bytes_max, limits.label_value_bytes_max);
    let db = Db::new(limits);
    let (s, _) = with_session(&db);
    let set =
        |k: u64, v: u64| Command::SetLabels(SetLabels { session: s, set: labels(1, k, v), remove: BTreeSet::new() });
    reject_without_trace(&db, set(key_max + 1, 1), Limit::LabelKeyBytes);
    accept(&db, set(key_max, 1));
    reject_without_trace(&db, set(1, value_max + 1), Limit::LabelValueBytes);
    accept(&db, set(1, value_max));
    let remove = |k: u64| {
        Command::SetLabels(SetLabels { session: s, set: BTreeMap::new(), remove: [text(k)].into_iter().collect() })
    };
    reject_without_trace(&db, remove(key_max + 1), Limit::LabelKeyBytes);
    accept(&db, remove(key_max));
    let create =
        |k: u64, v: u64| Command::CreateSession(CreateSession { labels: labels(1, k, v), ..CreateSession::new() });
    reject_without_trace(&db, create(key_max + 1, 1), Limit::LabelKeyBytes);
    reject_without_trace(&db, create(1, value_max + 1), Limit::LabelValueBytes);
    accept(&db, create(key_max, value_max));
}

#[test]
fn id_bytes() {
    let limits = small();
    let max = limits.id_bytes_max;
    let db = Db::new(limits);
    let (s, h) = with_session(&db);
    reject_without_trace(&db, Command::CommitTurn(turn(s, &text(max + 1), h)), Limit::IdBytes);
    accept(&db, Command::CommitTurn(turn(s, &text(max), h)));
    let h = head(&db, s);
    reject_without_trace(&db, Command::CommitTurn(turn(s, "t-run", h).run_id(text(max + 1))), Limit::IdBytes);
    accept(&db, Command::CommitTurn(turn(s, "t-run", h).run_id(text(max))));
    let ctx = |k: u64| AppendContext { session: s, key: text(k), content: b"c".to_vec(), source: "".into() };
    reject_without_trace(&db, Command::AppendContext(ctx(max + 1)), Limit::IdBytes);
    accept(&db, Command::AppendContext(ctx(max)));
    reject_without_trace(&db, Command::RecordToolCall(tool_call(s, &text(max + 1), b"a".to_vec())), Limit::IdBytes);
    accept(&db, Command::RecordToolCall(tool_call(s, &text(max), b"a".to_vec())));
    let named = |len: u64| RecordToolCall { tool_name: text(len), ..tool_call(s, "named", b"a".to_vec()) };
    reject_without_trace(&db, Command::RecordToolCall(named(max + 1)), Limit::IdBytes);
    accept(&db, Command::RecordToolCall(named(max)));
    let typed = |len: u64| Message::new(Role::User, text(len), b"body".to_vec());
    let h = head(&db, s);
    let t = |len| Command::CommitTurn(CommitTurn::new(s, "typed", Expected::Exact(h)).message(typed(len)));
    reject_without_trace(&db, t(max + 1), Limit::IdBytes);
    accept(&db, t(max));
}

#[test]
fn metadata_bytes() {
    let limits = small();
    let max = limits.metadata_bytes_max;
    let db = Db::new(limits);
    let create = |n: u64| Command::CreateSession(CreateSession::new().metadata(vec![7; n as usize]));
    reject_without_trace(&db, create(max + 1), Limit::MetadataBytes);
    accept(&db, create(max));
}

#[test]
fn batch_commands() {
    let limits = small();
    let max = limits.batch_commands_max;
    let db = Db::new(limits);
    let batch = |n: u64| Command::Batch((0..n).map(|_| Command::CreateSession(CreateSession::new())).collect());
    reject_without_trace(&db, batch(max + 1), Limit::BatchCommands);
    let Outcome::Batch(outcomes) = accept(&db, batch(max)) else { panic!("batch") };
    assert_eq!(outcomes.len() as u64, max);
}

#[test]
fn attachments_per_message() {
    let limits = small();
    let max = limits.attachments_per_message_max;
    let db = Db::new(limits);
    let (s, h) = with_session(&db);
    let message = |n: u64| (0..n).fold(Message::user("a"), |m, i| m.with_attachment(vec![i as u8; 4]));
    let t = |n| Command::CommitTurn(CommitTurn::new(s, "t", Expected::Exact(h)).message(message(n)));
    reject_without_trace(&db, t(max + 1), Limit::AttachmentsPerMessage);
    accept(&db, t(max));
}

#[test]
fn list_items() {
    let limits = small();
    let max = limits.list_items_max;
    let db = Db::new(limits);
    let (s, h) = with_session(&db);
    let usage = |id: &str, n: u64, expected| {
        let t = (0..n).fold(turn(s, id, expected), |t, i| t.usage("p", &format!("m{i}"), 1, 1));
        Command::CommitTurn(t)
    };
    reject_without_trace(&db, usage("u", max + 1, h), Limit::ListItems);
    accept(&db, usage("u", max, h));
    let engine = db.open();
    for i in 0..=max {
        let key = format!("k{i}");
        engine.append_context(AppendContext { session: s, key, content: b"c".to_vec(), source: "".into() }).unwrap();
        engine.record_tool_call(tool_call(s, &format!("op{i}"), b"a".to_vec())).unwrap();
    }
    engine.close().unwrap();
    let h = head(&db, s);
    let ctx = |n: u64| Command::CommitTurn((0..n).fold(turn(s, "c", h), |t, i| t.apply_context(format!("k{i}"))));
    reject_without_trace(&db, ctx(max + 1), Limit::ListItems);
    accept(&db, ctx(max));
    let h = head(&db, s);
    let ops = |n: u64| Command::CommitTurn((0..n).fold(turn(s, "o", h), |t, i| t.tool_op(format!("op{i}"))));
    reject_without_trace(&db, ops(max + 1), Limit::ListItems);
    accept(&db, ops(max));
}

#[test]
fn note_bytes() {
    let limits = small();
    let max = limits.note_bytes_max;
    let db = Db::new(limits);
    let (s, _) = with_session(&db);
    reject_without_trace(&db, Command::Archive { session: s, reason: text(max + 1) }, Limit::NoteBytes);
    accept(&db, Command::Archive { session: s, reason: text(max) });
    reject_without_trace(&db, Command::Revive { session: s, reason: text(max + 1) }, Limit::NoteBytes);
    accept(&db, Command::Revive { session: s, reason: text(max) });
    let h = head(&db, s);
    let rewrite = |note: u64, actor: u64| {
        Command::Rewrite(Rewrite {
            session: s,
            expected: h,
            start: 0,
            end: 1,
            replacement: vec![Message::system("edited")],
            reason: RewriteReason::Edit,
            note: text(note),
            actor: text(actor),
        })
    };
    reject_without_trace(&db, rewrite(max + 1, 0), Limit::NoteBytes);
    reject_without_trace(&db, rewrite(0, max + 1), Limit::NoteBytes);
    accept(&db, rewrite(max, max));
    let ctx = |len: u64| AppendContext { session: s, key: "k".into(), content: b"c".to_vec(), source: text(len) };
    reject_without_trace(&db, Command::AppendContext(ctx(max + 1)), Limit::NoteBytes);
    accept(&db, Command::AppendContext(ctx(max)));
}

/// A query is not a command, but a page over the limit is the same typed rejection and
/// leaves every file of the database alone.
#[track_caller]
fn query_rejected<T: std::fmt::Debug>(db: &Db, engine: &Engine, query: impl FnOnce() -> Result<T>, limit: Limit) {
    // The commits before it go to the projections file first (and the journal into the
    // log file), so that nothing else writes a file while they are hashed.
    engine.checkpoint().expect("checkpoint");
    let before = files_hash(&db.path);
    assert_limit(query(), limit);
    assert!(engine.tip().is_ok(), "still readable");
    assert_same_files(before, files_hash(&db.path), "a rejected query wrote to the database");
}

#[test]
fn page_items() {
    let limits = small();
    let max = limits.page_items_max;
    let db = Db::new(limits);
    let (s, mut h) = with_session(&db);
    let engine = db.open();
    for i in 0..max + 2 {
        h = engine.commit_turn(turn(s, &format!("t{i}"), h)).unwrap().receipt().revision;
        engine.create_session(CreateSession::new()).unwrap();
        engine.record_tool_call(tool_call(s, &format!("op{i}"), b"a".to_vec())).unwrap();
    }
    let at = PageRequest::first(max);
    let past = PageRequest::first(max + 1);
    assert_eq!(engine.transcript(s, at).unwrap().messages.len() as u64, max);
    query_rejected(&db, &engine, || engine.transcript(s, past), Limit::PageItems);
    assert_eq!(engine.transcript_at(s, h, at).unwrap().messages.len() as u64, max);
    query_rejected(&db, &engine, || engine.transcript_at(s, h, past), Limit::PageItems);
    assert_eq!(engine.revisions(s, at).unwrap().page.items.len() as u64, max);
    query_rejected(&db, &engine, || engine.revisions(s, past), Limit::PageItems);
    assert_eq!(engine.tool_ops(s, at).unwrap().items.len() as u64, max);
    query_rejected(&db, &engine, || engine.tool_ops(s, past), Limit::PageItems);
    assert_eq!(engine.unsettled_all(at).unwrap().items.len() as u64, max);
    query_rejected(&db, &engine, || engine.unsettled_all(past), Limit::PageItems);
    assert_eq!(engine.list_sessions(&ListQuery::new().page(0, max)).unwrap().items.len() as u64, max);
    query_rejected(&db, &engine, || engine.list_sessions(&ListQuery::new().page(0, max + 1)), Limit::PageItems);
    let q = |n| EventQuery { from_seq: 1, max_events: n, max_bytes: 4096 };
    assert_eq!(engine.events(q(max)).unwrap().events.len() as u64, max);
    query_rejected(&db, &engine, || engine.events(q(max + 1)), Limit::PageItems);
    assert_eq!(engine.session_events(s, q(max)).unwrap().events.len() as u64, max);
    query_rejected(&db, &engine, || engine.session_events(s, q(max + 1)), Limit::PageItems);
    engine.close().unwrap();
}

#[test]
fn page_bytes() {
    let limits = small();
    let max = limits.page_bytes_max;
    let db = Db::new(limits);
    let (s, _) = with_session(&db);
    let engine = db.open();
    let q = |n| EventQuery { from_seq: 1, max_events: 5, max_bytes: n };
    let page = engine.events(q(max)).unwrap();
    assert_eq!(page.events.len(), 1);
    query_rejected(&db, &engine, || engine.events(q(max + 1)), Limit::PageBytes);
    query_rejected(&db, &engine, || engine.session_events(s, q(max + 1)), Limit::PageBytes);
    // A budget smaller than the one record is OversizedRecord, never a truncated record.
    let size = page.events[0].size;
    let err = engine.events(q(size - 1)).unwrap_err();
    assert_eq!(err, Error::OversizedRecord { seq: 1, size, max_bytes: size - 1 });
    assert_eq!(engine.events(q(size)).unwrap().events.len(), 1);
    engine.close().unwrap();
}

/// The decoder bounds a record by `record_bytes_max`: a record of exactly the limit
/// decodes, one byte over it is `TooLarge`.
#[test]
fn record_bytes_in_the_decoder() {
    let db = Db::new(small());
    let (s, h) = with_session(&db);
    let engine = db.open();
    engine.commit_turn(turn(s, "t", h).usage("provider", "model", 1, 2)).unwrap();
    for ev in engine.events(EventQuery { from_seq: 1, max_events: 5, max_bytes: 4096 }).unwrap().events {
        let bytes = engine.snapshot().unwrap().raw_record(ev.record.seq).unwrap().unwrap();
        let len = bytes.len() as u64;
        assert_eq!(len, ev.size);
        assert_eq!(decode_record(&bytes, len).unwrap().record, ev.record);
        assert_eq!(decode_record(&bytes, len - 1).unwrap_err(), DecodeError::TooLarge { size: len, max: len - 1 });
    }
    engine.close().unwrap();
    // A reader whose record limit is below a stored record fails closed on it.
    let tight = Limits { record_bytes_max: 60, ..small() };
    let engine = Engine::open_with(&db.path, options(tight)).unwrap();
    let err = engine.events(EventQuery { from_seq: 1, max_events: 5, max_bytes: 4096 }).unwrap_err();
    assert!(matches!(err, Error::Decode { seq: 1, source: DecodeError::TooLarge { max: 60, .. } }), "{err:?}");
    engine.close().unwrap();
}

/// The encoded size of the record of a one-message turn with these usage model names.
fn turn_record_len(turn_id: &str, models: &[String]) -> u64 {
    let usage = models
        .iter()
        .map(|m| Usage { provider: "p".into(), model: m.clone(), input: 1, output: 1, cache_read: 0, cache_write: 0 })
        .collect();
    let record = Record {
        seq: 2,
        session: SessionId([0; 16]),
        stream_seq: 2,
        committed_at_ms: 0,
        event: Event::TurnCommitted(annal::codec::TurnCommitted {
            turn_id: turn_id.into(),
            commit_hash: CommitHash([0; 32]),
            messages: vec![ContentId([0; 32])],
            usage,
            applied_context: vec![],
            tool_ops: vec![],
            run_id: None,
            revision_after: RevisionId([0; 32]),
            state: Default::default(),
            inputs: vec![],
        }),
    };
    let chain = LogChain::plain();
    encode_record(&record, &chain.genesis(), &chain, u64::MAX).expect("encode").0.len() as u64
}

/// A command whose record would be larger than `record_bytes_max` is a typed rejection
/// that writes nothing; it must not fail the commit as an I/O error would.
#[test]
fn record_bytes_in_the_writer() {
    let models = |extra: usize| -> Vec<String> {
        (0..3).map(|i| format!("m{i}{}", "x".repeat(if i == 2 { 8 + extra } else { 8 }))).collect()
    };
    let max = turn_record_len("t", &models(0));
    assert_eq!(turn_record_len("t", &models(1)), max + 1);
    let db = Db::new(Limits { record_bytes_max: max, ..small() });
    let (s, h) = with_session(&db);
    let t =
        |models: Vec<String>| Command::CommitTurn(models.iter().fold(turn(s, "t", h), |t, m| t.usage("p", m, 1, 1)));
    reject_without_trace(&db, t(models(1)), Limit::RecordBytes);
    let engine = db.open();
    assert!(!engine.is_poisoned(), "a too-large record is the caller's problem, not an I/O failure");
    engine.close().unwrap();
    accept(&db, t(models(0)));
}

/// The real default content limit: a 16 MiB content object is accepted and one byte more
/// is rejected, for raw content and for a message object.
#[test]
fn default_content_limit_is_16_mib() {
    let limits = Limits::default();
    let max = limits.content_bytes_max;
    assert_eq!(max, 16 << 20);
    let db = Db::with_options(Options { limits, durability: Durability::Relaxed, ..Options::default() });
    let (s, h) = with_session(&db);
    let ctx = |key: &str, len: u64| AppendContext {
        session: s,
        key: key.into(),
        content: vec![b'c'; len as usize],
        source: "".into(),
    };
    reject_without_trace(&db, Command::AppendContext(ctx("big", max + 1)), Limit::ContentBytes);
    accept(&db, Command::AppendContext(ctx("big", max)));
    let body = max;
    let msg = |len: u64| Message::new(Role::User, "text/plain", vec![b'm'; len as usize]);
    let t = |len| Command::CommitTurn(CommitTurn::new(s, "t", Expected::Exact(h)).message(msg(len)));
    reject_without_trace(&db, t(body + 1), Limit::ContentBytes);
    accept(&db, t(body));
    let engine = db.open();
    let page = engine.transcript(s, PageRequest::first(2)).unwrap();
    assert_eq!(page.messages[1].message.body.len() as u64, body);
    engine.close().unwrap();
}

/// A configuration the storage format cannot represent, or that could never be used, is
/// refused when the engine (or a reader) opens, with a typed error naming the limit, and
/// nothing is created.
#[test]
fn limits_that_cannot_be_represented_are_refused_before_anything_is_opened() {
    type Case = (Limit, Box<dyn Fn(&mut Limits)>);
    let cases: Vec<Case> = vec![
        (Limit::LabelKeyBytes, Box::new(|l| l.label_key_bytes_max = 65_536)),
        (Limit::LabelValueBytes, Box::new(|l| l.label_value_bytes_max = 1 << 20)),
        (Limit::IdBytes, Box::new(|l| l.id_bytes_max = 70_000)),
        (Limit::IdBytes, Box::new(|l| l.id_bytes_max = 0)),
        (Limit::ContentBytes, Box::new(|l| l.content_bytes_max = 0)),
        (Limit::ContentBytes, Box::new(|l| l.content_bytes_max = u32::MAX as u64)),
        (Limit::PageItems, Box::new(|l| l.page_items_max = 0)),
        (Limit::RecordBytes, Box::new(|l| l.record_bytes_max = 0)),
        (Limit::BatchCommands, Box::new(|l| l.batch_commands_max = 0)),
        // Smaller than the largest message: content 512 + 32 + ids 12 + 2 attachments.
        (Limit::PageBytes, Box::new(|l| l.page_bytes_max = 600)),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (n, (limit, set)) in cases.into_iter().enumerate() {
        let mut limits = small();
        set(&mut limits);
        let found = match limits.validate() {
            Err(Error::InvalidLimits { limit, .. }) => limit,
            other => panic!("case {n}: expected InvalidLimits({limit}), got {other:?}"),
        };
        assert_eq!(found, limit, "case {n}");
        let path = dir.path().join(format!("refused-{n}.redb"));
        match Engine::open_with(&path, options(limits.clone())) {
            Err(Error::InvalidLimits { limit: found, .. }) => assert_eq!(found, limit, "case {n}"),
            other => panic!("case {n}: open gave {:?}", other.map(drop)),
        }
        assert!(!path.exists(), "case {n}: a refused open created the file");
        assert!(!annal::projections_path(&path).exists(), "case {n}: a refused open created the projections file");
        let backend = redb::backends::InMemoryBackend::new();
        assert!(matches!(
            Engine::open_with_backend(backend, options(limits.clone())).map(drop),
            Err(Error::InvalidLimits { .. })
        ));
        assert!(matches!(Reader::open(&path, limits, None).map(drop), Err(Error::InvalidLimits { .. })));
    }
    // The page budget may equal the largest message exactly.
    let mut limits = small();
    limits.page_bytes_max = limits.message_object_bytes_max();
    limits.validate().expect("a page that holds exactly the largest message");
    Limits::default().validate().expect("the defaults");
}
