//! Arbitrary command sequences against a fresh engine whose log and projections files
//! are two in-memory backends (relaxed durability, small limits), with ids, sizes and
//! indexes that include the absurd, and explicit checkpoints between them. No reference
//! model is needed for the invariants checked:
//!
//! - an accepted command that writes moves the tip densely by the events it wrote, and
//!   every new record verifies and carries the next sequence number;
//! - an accepted command that writes nothing, and every rejection, leave the tip and the
//!   projection digests unchanged;
//! - no command fails with anything but a typed rejection;
//! - a checkpoint (the delta written into the projections file) succeeds and changes
//!   neither the tip nor the digests;
//! - every query on every session answers or is a typed rejection;
//! - after the sequence, the engine closes (checkpointing the whole delta); reopened on
//!   the same two backends, it has nothing to fold and the same tip and digests;
//! - `rebuild(ProjectionSet::all())` (a fold of the whole log into emptied projections)
//!   then reproduces the digests.

#![no_main]

use annal::fault::SharedMemory;
use annal::{
    AppendContext, Command, CommitTurn, CreateSession, Durability, Engine, Error, EventQuery, Expected, Fork, Limits,
    ListQuery, Message, Options, Outcome, PageRequest, ProjectionSet, RecordToolCall, RecordToolResult, Recovery,
    Restore, RevisionId, Rewrite, RewriteReason, Role, SessionId, SetHostState, SetLabels, SetMetadata, StateChanges,
    ToolOutcome, Usage,
};
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

/// Sessions the commands address; most ids come from this pool so that commands meet.
const POOL: usize = 4;
/// Longest generated string or byte string: a few times the largest limit below.
const SIZE_MAX: u32 = 4096;
/// Commands per input at most.
const COMMANDS_MAX: usize = 48;

fn limits() -> Limits {
    Limits {
        content_bytes_max: 512,
        command_bytes_max: 2048,
        messages_per_command_max: 6,
        labels_per_session_max: 4,
        label_key_bytes_max: 16,
        label_value_bytes_max: 32,
        id_bytes_max: 24,
        page_items_max: 64,
        page_bytes_max: 1 << 16,
        record_bytes_max: 1 << 14,
        metadata_bytes_max: 64,
        batch_commands_max: 5,
        attachments_per_message_max: 2,
        list_items_max: 4,
        note_bytes_max: 40,
        host_state_name_bytes_max: 16,
        host_state_entries_max: 3,
    }
}

#[derive(Arbitrary, Debug)]
enum Sid {
    Pool(u8),
    Raw([u8; 16]),
}

#[derive(Arbitrary, Debug)]
enum Text {
    Pool(u8),
    Sized { len: u16, fill: u8 },
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Bytes {
    Text(Text),
    Raw(Vec<u8>),
    Blank(u8),
}

#[derive(Arbitrary, Debug)]
enum Exp {
    Any,
    Head,
    Empty,
    Raw([u8; 32]),
    /// `Expected::Version`: the session's stream seq plus this (wrapping) offset.
    Version(i8),
}

#[derive(Arbitrary, Debug)]
enum Index {
    Small(u8),
    Huge(u64),
}

#[derive(Arbitrary, Debug)]
struct Msg {
    role: u8,
    content_type: Text,
    body: Bytes,
    attachments: Vec<Bytes>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Create {
        id: Sid,
        labels: Vec<(Text, Text)>,
        metadata: Bytes,
        messages: Vec<Msg>,
    },
    Turn {
        s: Sid,
        turn: Text,
        expected: Exp,
        messages: Vec<Msg>,
        usage: Vec<(Text, Text, u64, u64)>,
        ctx: Vec<Text>,
        ops: Vec<Text>,
        run: Option<Text>,
        state: Vec<(Text, Bytes)>,
        unstate: Vec<Text>,
    },
    Rewrite {
        s: Sid,
        expected: Exp,
        start: Index,
        end: Index,
        replacement: Vec<Msg>,
        reason: u8,
        note: Text,
        actor: Text,
    },
    Restore {
        s: Sid,
        expected: Exp,
        target: Index,
        note: Text,
    },
    Fork {
        parent: Sid,
        child: Sid,
        index: Index,
        replacement: Option<Msg>,
        labels: Option<Vec<(Text, Text)>>,
    },
    Archive {
        s: Sid,
        reason: Text,
    },
    Revive {
        s: Sid,
        reason: Text,
    },
    Context {
        s: Sid,
        key: Text,
        content: Bytes,
        source: Text,
    },
    ToolCall {
        s: Sid,
        op: Text,
        call: Text,
        tool: Text,
        args: Bytes,
        parent: Option<Text>,
        turn: Option<Text>,
        safe: bool,
    },
    ToolResult {
        s: Sid,
        op: Text,
        outcome: u8,
        result: Bytes,
    },
    Labels {
        s: Sid,
        set: Vec<(Text, Text)>,
        remove: Vec<Text>,
    },
    Metadata {
        s: Sid,
        metadata: Bytes,
        expected: Exp,
    },
    HostState {
        s: Sid,
        set: Vec<(Text, Bytes)>,
        remove: Vec<Text>,
        expected: Exp,
    },
    Batch(Vec<Op>),
    /// Not a command: `Engine::checkpoint` (inside a batch, an empty nested batch).
    Checkpoint,
}

const WORDS: [&str; 8] = ["a", "k", "op-1", "op-2", "turn-1", "turn-2", "model", ""];

struct Ctx {
    engine: Engine,
    pool: [SessionId; POOL],
}

impl Ctx {
    fn sid(&self, s: &Sid) -> SessionId {
        match s {
            Sid::Pool(i) => self.pool[*i as usize % POOL],
            Sid::Raw(b) => SessionId(*b),
        }
    }

    fn text(&self, t: &Text) -> String {
        match t {
            Text::Pool(i) => WORDS[*i as usize % WORDS.len()].to_string(),
            Text::Sized { len, fill } => {
                let c = char::from(b'a' + fill % 26);
                std::iter::repeat_n(c, (*len as u32 % SIZE_MAX) as usize).collect()
            }
            Text::Raw(s) => s.chars().take(SIZE_MAX as usize).collect(),
        }
    }

    fn state(&self, set: &[(Text, Bytes)], remove: &[Text]) -> StateChanges {
        StateChanges {
            set: set.iter().take(6).map(|(n, v)| (self.text(n), self.bytes(v))).collect(),
            remove: remove.iter().take(6).map(|n| self.text(n)).collect(),
        }
    }

    fn bytes(&self, b: &Bytes) -> Vec<u8> {
        match b {
            Bytes::Text(t) => self.text(t).into_bytes(),
            Bytes::Raw(v) => v.iter().copied().take(SIZE_MAX as usize).collect(),
            Bytes::Blank(n) => vec![b' '; *n as usize % 8],
        }
    }

    fn head(&self, s: SessionId) -> Option<RevisionId> {
        self.engine.head(s).ok().flatten().map(|h| h.revision)
    }

    fn exp(&self, s: SessionId, e: &Exp) -> Expected {
        match e {
            Exp::Any => Expected::Any,
            Exp::Head => Expected::Exact(self.head(s).unwrap_or_else(RevisionId::empty)),
            Exp::Empty => Expected::Exact(RevisionId::empty()),
            Exp::Raw(r) => Expected::Exact(RevisionId(*r)),
            Exp::Version(off) => {
                let at = self.engine.head(s).ok().flatten().map_or(0, |h| h.stream_seq);
                Expected::Version(at.wrapping_add_signed(i64::from(*off)))
            }
        }
    }

    fn exact(&self, s: SessionId, e: &Exp) -> RevisionId {
        match self.exp(s, e) {
            Expected::Exact(r) => r,
            Expected::Any | Expected::Version(_) => self.head(s).unwrap_or_else(RevisionId::empty),
        }
    }

    fn index(&self, i: &Index) -> u64 {
        match i {
            Index::Small(n) => *n as u64,
            Index::Huge(n) => *n,
        }
    }

    fn message(&self, m: &Msg) -> Message {
        let role = [Role::System, Role::User, Role::Assistant, Role::Tool][m.role as usize % 4];
        let mut out = Message::new(role, self.text(&m.content_type), self.bytes(&m.body));
        out.attachments = m.attachments.iter().take(8).map(|a| self.bytes(a)).collect();
        out
    }

    fn messages(&self, ms: &[Msg]) -> Vec<Message> {
        ms.iter().take(10).map(|m| self.message(m)).collect()
    }

    fn labels(&self, ls: &[(Text, Text)]) -> std::collections::BTreeMap<String, String> {
        ls.iter().take(8).map(|(k, v)| (self.text(k), self.text(v))).collect()
    }

    /// A revision the session held, by index into its revision list, or a made-up one.
    fn revision(&self, s: SessionId, i: &Index) -> RevisionId {
        let n = self.index(i);
        match self.engine.revisions(s, PageRequest::first(64)) {
            Ok(page) if !page.page.items.is_empty() && n < 1 << 32 => {
                page.page.items[n as usize % page.page.items.len()].revision
            }
            _ => RevisionId([n as u8; 32]),
        }
    }

    fn command(&self, op: &Op, depth: u32) -> Command {
        match op {
            Op::Create { id, labels, metadata, messages } => Command::CreateSession(CreateSession {
                session: self.sid(id),
                labels: self.labels(labels),
                metadata: self.bytes(metadata),
                messages: self.messages(messages),
            }),
            Op::Turn { s, turn, expected, messages, usage, ctx, ops, run, state, unstate } => {
                let s = self.sid(s);
                Command::CommitTurn(CommitTurn {
                    session: s,
                    turn_id: self.text(turn),
                    expected: self.exp(s, expected),
                    messages: self.messages(messages),
                    usage: usage
                        .iter()
                        .take(8)
                        .map(|(p, m, i, o)| Usage {
                            provider: self.text(p),
                            model: self.text(m),
                            input: *i,
                            output: *o,
                            cache_read: i.rotate_left(7),
                            cache_write: o.rotate_left(3),
                        })
                        .collect(),
                    applied_context: ctx.iter().take(8).map(|t| self.text(t)).collect(),
                    tool_ops: ops.iter().take(8).map(|t| self.text(t)).collect(),
                    run_id: run.as_ref().map(|t| self.text(t)),
                    state: self.state(state, unstate),
                })
            }
            Op::Rewrite { s, expected, start, end, replacement, reason, note, actor } => {
                let s = self.sid(s);
                Command::Rewrite(Rewrite {
                    session: s,
                    expected: self.exact(s, expected),
                    start: self.index(start),
                    end: self.index(end),
                    replacement: self.messages(replacement),
                    reason: [RewriteReason::Edit, RewriteReason::Compaction, RewriteReason::Redaction]
                        [*reason as usize % 3],
                    note: self.text(note),
                    actor: self.text(actor),
                })
            }
            Op::Restore { s, expected, target, note } => {
                let s = self.sid(s);
                Command::Restore(Restore {
                    session: s,
                    expected: self.exact(s, expected),
                    target: self.revision(s, target),
                    note: self.text(note),
                    actor: "fuzz".into(),
                })
            }
            Op::Fork { parent, child, index, replacement, labels } => Command::Fork(Fork {
                parent: self.sid(parent),
                session: self.sid(child),
                index: self.index(index),
                replacement: replacement.as_ref().map(|m| self.message(m)),
                labels: labels.as_ref().map(|l| self.labels(l)),
            }),
            Op::Archive { s, reason } => Command::Archive { session: self.sid(s), reason: self.text(reason) },
            Op::Revive { s, reason } => Command::Revive { session: self.sid(s), reason: self.text(reason) },
            Op::Context { s, key, content, source } => Command::AppendContext(AppendContext {
                session: self.sid(s),
                key: self.text(key),
                content: self.bytes(content),
                source: self.text(source),
            }),
            Op::ToolCall { s, op, call, tool, args, parent, turn, safe } => Command::RecordToolCall(RecordToolCall {
                session: self.sid(s),
                op_id: self.text(op),
                call_id: self.text(call),
                tool_name: self.text(tool),
                args: self.bytes(args),
                parent_op: parent.as_ref().map(|t| self.text(t)),
                turn_id: turn.as_ref().map(|t| self.text(t)),
                recovery: if *safe { Recovery::ReplaySafe } else { Recovery::NotReplaySafe },
            }),
            Op::ToolResult { s, op, outcome, result } => Command::RecordToolResult(RecordToolResult {
                session: self.sid(s),
                op_id: self.text(op),
                outcome: [ToolOutcome::Ok, ToolOutcome::Error, ToolOutcome::Cancelled][*outcome as usize % 3],
                result: self.bytes(result),
            }),
            Op::Labels { s, set, remove } => Command::SetLabels(SetLabels {
                session: self.sid(s),
                set: self.labels(set),
                remove: remove.iter().take(8).map(|t| self.text(t)).collect(),
            }),
            Op::Metadata { s, metadata, expected } => {
                let s = self.sid(s);
                Command::SetMetadata(SetMetadata {
                    session: s,
                    metadata: self.bytes(metadata),
                    expected: self.exp(s, expected),
                })
            }
            Op::HostState { s, set, remove, expected } => {
                let s = self.sid(s);
                Command::SetHostState(SetHostState {
                    session: s,
                    state: self.state(set, remove),
                    expected: self.exp(s, expected),
                })
            }
            Op::Batch(ops) if depth < 2 => {
                Command::Batch(ops.iter().take(8).map(|o| self.command(o, depth + 1)).collect())
            }
            Op::Batch(_) | Op::Checkpoint => Command::Batch(Vec::new()),
        }
    }
}

/// Whether an accepted outcome says the command wrote an event.
fn wrote(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Created { .. } | Outcome::Committed(_) | Outcome::Rewritten(_) => true,
        Outcome::Revived { .. } | Outcome::Staged { .. } => true,
        Outcome::Archived { seq }
        | Outcome::Labels { seq }
        | Outcome::Metadata { seq }
        | Outcome::HostState { seq } => seq.is_some(),
        Outcome::Tool { created, .. } => *created,
        Outcome::AlreadyCommitted(_) | Outcome::Duplicate => false,
        Outcome::Batch(outcomes) => outcomes.iter().any(wrote),
    }
}

/// Sequence numbers an accepted outcome names.
fn seqs(outcome: &Outcome, out: &mut Vec<u64>) {
    match outcome {
        Outcome::Created { receipt, .. } | Outcome::Committed(receipt) | Outcome::Rewritten(receipt) => {
            out.push(receipt.seq)
        }
        Outcome::Revived { seq } | Outcome::Staged { seq } => out.push(*seq),
        Outcome::Archived { seq: Some(seq) }
        | Outcome::Labels { seq: Some(seq) }
        | Outcome::Metadata { seq: Some(seq) }
        | Outcome::HostState { seq: Some(seq) } => out.push(*seq),
        Outcome::Tool { seq: Some(seq), .. } => out.push(*seq),
        Outcome::Batch(outcomes) => outcomes.iter().for_each(|o| seqs(o, out)),
        _ => {}
    }
}

/// Every record from `from` to the tip, page by page; each page verifies its chain links.
fn events_from(engine: &Engine, from: u64) -> Vec<annal::StoredEvent> {
    let mut out = Vec::new();
    let mut from = from;
    loop {
        let page =
            engine.events(EventQuery { from_seq: from, max_events: 64, max_bytes: 1 << 16 }).expect("log verifies");
        out.extend(page.events);
        if !page.has_more {
            return out;
        }
        from = page.next_seq;
    }
}

fn ok_or_rejected<T>(what: &str, r: Result<T, Error>) {
    match r {
        Ok(_) | Err(Error::Rejected(_)) => {}
        Err(e) => panic!("{what}: {e:?}"),
    }
}

fn query_everything(engine: &Engine, sessions: &[SessionId]) {
    let page = PageRequest::first(16);
    ok_or_rejected("list", engine.list_sessions(&ListQuery::new().include_archived()));
    ok_or_rejected("unsettled_all", engine.unsettled_all(page));
    for s in sessions {
        ok_or_rejected("head", engine.head(*s));
        ok_or_rejected("transcript", engine.transcript(*s, page));
        ok_or_rejected("graph", engine.graph(*s));
        ok_or_rejected("context", engine.context(*s));
        ok_or_rejected("usage", engine.usage(*s));
        ok_or_rejected("unsettled", engine.unsettled(*s));
        ok_or_rejected("tool_ops", engine.tool_ops(*s, page));
        ok_or_rejected(
            "session_events",
            engine.session_events(*s, EventQuery { from_seq: 1, max_events: 16, max_bytes: 1 << 16 }),
        );
        if let Ok(revs) = engine.revisions(*s, PageRequest::first(64)) {
            for node in revs.page.items {
                let t = engine.transcript_at(*s, node.revision, page).expect("a listed revision reads");
                assert_eq!(t.revision, node.revision);
                assert_eq!(t.total, node.message_count);
            }
        }
    }
}

fn options() -> Options {
    Options { limits: limits(), durability: Durability::Relaxed, cache_bytes: 1 << 20, ..Options::default() }
}

/// Reopens the engine on `log` and `projections`, and checks that it reads the same tip
/// and projections as before it closed.
fn reopen(log: &SharedMemory, projections: &SharedMemory, tip: u64, digests: &[annal::TableDigest]) -> Engine {
    let engine = Engine::open_with_backends(log.clone(), projections.clone(), options()).expect("reopen");
    assert_eq!(engine.tip().expect("tip").0, tip, "reopened: the same tip");
    assert_eq!(engine.projection_digests().expect("digests"), digests, "reopened: the same projections");
    engine
}

fuzz_target!(|ops: Vec<Op>| {
    let (log, projections) = (SharedMemory::new(), SharedMemory::new());
    let engine = Engine::open_with_backends(log.clone(), projections.clone(), options()).expect("open in memory");
    let mut pool = [SessionId([0; 16]); POOL];
    for (i, s) in pool.iter_mut().enumerate() {
        s.0[15] = i as u8 + 1;
    }
    let ctx = Ctx { engine, pool };
    for op in ops.iter().take(COMMANDS_MAX) {
        let (tip, _) = ctx.engine.tip().expect("tip");
        let digests = ctx.engine.projection_digests().expect("digests");
        if let Op::Checkpoint = op {
            ctx.engine.checkpoint().expect("checkpoint");
            assert_eq!(ctx.engine.tip().expect("tip").0, tip, "a checkpoint writes no event");
            assert_eq!(ctx.engine.projection_digests().expect("digests"), digests, "a checkpoint changes no row");
            continue;
        }
        let command = ctx.command(op, 0);
        match ctx.engine.execute(command) {
            Ok(outcome) => {
                let (after, _) = ctx.engine.tip().expect("tip");
                let mut named = Vec::new();
                seqs(&outcome, &mut named);
                if wrote(&outcome) {
                    assert!(after > tip, "a write moves the tip: {outcome:?}");
                    let new = events_from(&ctx.engine, tip + 1);
                    assert_eq!(new.len() as u64, after - tip, "every new record reads back");
                    for (k, ev) in new.iter().enumerate() {
                        assert_eq!(ev.record.seq, tip + 1 + k as u64, "dense");
                    }
                    assert_eq!(named.len() as u64, after - tip, "one receipt per event: {outcome:?}");
                    for (k, seq) in named.iter().enumerate() {
                        assert_eq!(*seq, tip + 1 + k as u64, "receipts in order");
                    }
                } else {
                    assert_eq!(after, tip, "a no-op writes nothing: {outcome:?}");
                    assert!(named.iter().all(|s| *s <= tip), "a no-op names only old events");
                    assert_eq!(ctx.engine.projection_digests().expect("digests"), digests, "a no-op changes nothing");
                }
            }
            Err(Error::Rejected(_)) => {
                assert_eq!(ctx.engine.tip().expect("tip").0, tip, "a rejection writes nothing");
                assert_eq!(ctx.engine.projection_digests().expect("digests"), digests, "a rejection changes nothing");
            }
            Err(e) => panic!("a command failed with a non-rejection: {e:?}"),
        }
    }
    let sessions: Vec<SessionId> = ctx.pool.to_vec();
    query_everything(&ctx.engine, &sessions);
    let (tip, _) = ctx.engine.tip().expect("tip");
    let count = events_from(&ctx.engine, 1).len() as u64;
    assert_eq!(count, tip, "the log is dense up to the tip");
    let live = ctx.engine.projection_digests().expect("digests");
    ctx.engine.close().expect("close");
    let engine = reopen(&log, &projections, tip, &live);
    assert_eq!(engine.stats().recovered_events, 0, "close checkpointed the whole delta");
    engine.rebuild(ProjectionSet::all()).expect("rebuild");
    assert_eq!(engine.projection_digests().expect("digests"), live, "rebuild reproduces the live projections");
    engine.close().expect("close");
});
