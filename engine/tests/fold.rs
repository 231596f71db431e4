//! `decide` and `evolve` with no database: the store is a [`MemStore`], records are
//! sequenced by hand, and every projection row is read back and checked.

use annal::codec::{
    content_id, encode_message, ContextAppended, LabelsChanged, RewriteKind, SessionArchived, SessionCreated,
    ToolCallRecorded, TranscriptRewritten, TurnCommitted,
};
use annal::store::keys;
use annal::*;
use std::collections::{BTreeMap, BTreeSet};

/// Folds `r` into `store`, introducing the content it refers to that is not stored yet
/// (as the writer does; these ids do not share their first 8 bytes, so the content-id
/// index alone tells).
/// The transcript names its messages by the records that hold their ids: a rewrite's or a
/// fork's fold reads the lists of the records before it, from `records`.
fn fold_one(store: &mut MemStore, records: &[Record], r: &Record, set: ProjectionSet) -> Result<()> {
    let mut fresh: Vec<ContentId> = Vec::new();
    for id in r.event.content_refs() {
        if !fresh.contains(&id) && !annal::buckets::content_may_be_stored(store, &id)? {
            fresh.push(id);
        }
    }
    evolve(&mut store::WithRecords::write(store, &LogRecords(records)), r, &fresh, set)
}

/// The records of a hand-made log, for the fold and for `decide` (which reads a
/// committed turn's record, and a node's).
struct LogRecords<'a>(&'a [Record]);

impl store::Records for LogRecords<'_> {
    fn record(&self, seq: u64) -> Result<Option<Record>> {
        Ok(self.0.iter().find(|r| r.seq == seq).cloned())
    }
}

/// A log in memory: decides commands against the store, sequences the events and
/// folds them with every projection.
struct Log {
    store: MemStore,
    records: Vec<Record>,
    streams: BTreeMap<SessionId, u64>,
    limits: Limits,
}

/// The projections of a hand-made log with its records, as a view of an engine has
/// them: `decide` reads a committed turn's record (its commit hash and receipt).
struct WithLog<'a> {
    store: &'a MemStore,
    records: &'a [Record],
}

impl Store for WithLog<'_> {
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        self.store.read(table, key, f)
    }
    fn put(&mut self, _: Table, _: &[u8], _: &[u8]) -> Result<()> {
        unreachable!("decide only reads")
    }
    fn remove(&mut self, _: Table, _: &[u8]) -> Result<()> {
        unreachable!("decide only reads")
    }
    fn record_at(&self, seq: u64) -> Result<Option<Record>> {
        store::Records::record(&LogRecords(self.records), seq)
    }
}

/// The writer clock of the hand-made log: seq `n` commits at `CLOCK_MS + n`.
const CLOCK_MS: u64 = 1_700_000_000_000;

impl Log {
    fn new() -> Log {
        Log { store: MemStore::default(), records: Vec::new(), streams: BTreeMap::new(), limits: Limits::default() }
    }

    /// The record that would carry `event` next in `session`'s stream.
    fn next_record(&self, session: SessionId, event: Event) -> Record {
        let seq = self.records.len() as u64 + 1;
        let stream_seq = self.streams.get(&session).copied().unwrap_or(0) + 1;
        Record { seq, session, stream_seq, committed_at_ms: CLOCK_MS + seq, event }
    }

    /// Folds `record` with every projection and appends it.
    fn fold(&mut self, record: Record) -> Result<()> {
        fold_one(&mut self.store, &self.records, &record, ProjectionSet::all())?;
        self.streams.insert(record.session, record.stream_seq);
        self.records.push(record);
        Ok(())
    }

    fn decide(&self, command: &Command) -> Result<Decision> {
        decide(&self.with_log(), command, &self.limits, &annal::Now::at(0))
    }

    /// Decides `command` and, if it writes, folds its event.
    fn run(&mut self, command: Command) -> Result<Outcome> {
        match self.decide(&command)? {
            Decision::Noop(outcome) => Ok(outcome),
            Decision::Renew(lease) => Ok(Outcome::Lease { lease, seq: None }),
            Decision::Draft { outcome, .. } => Ok(outcome),
            Decision::Write { session, event, .. } => {
                let record = self.next_record(session, event);
                let outcome = outcome_of(&record);
                self.fold(record)?;
                Ok(outcome)
            }
        }
    }

    fn ok(&mut self, command: Command) -> Outcome {
        self.run(command).expect("command accepted")
    }

    fn row<T: serde::de::DeserializeOwned>(&self, table: Table, key: &[u8]) -> Option<T> {
        self.store.row(table, key).expect("row decodes")
    }

    fn head(&self, s: SessionId) -> SessionHead {
        self.row(Table::Heads, &keys::session(&s)).expect("session has a head")
    }

    fn transcript(&self, s: SessionId) -> Vec<TranscriptRow> {
        annal::transcript::rows(&self.with_log(), &s, 0, self.head(s).message_count).expect("transcript rows")
    }

    fn node(&self, s: SessionId, r: RevisionId) -> RevisionNode {
        annal::revision_node(&self.with_log(), &s, &r).expect("node decodes").expect("revision node")
    }

    /// The projections with the records, as a view has them.
    fn with_log(&self) -> WithLog<'_> {
        WithLog { store: &self.store, records: &self.records }
    }

    /// Every key of `table`.
    fn keys(&self, table: Table) -> Vec<Vec<u8>> {
        self.store.tables.get(&table).map(|t| t.keys().cloned().collect()).unwrap_or_default()
    }
}

fn sid(n: u8) -> SessionId {
    SessionId([n; 16])
}

fn cid(m: &Message) -> ContentId {
    let object = MessageObject {
        role: m.role,
        content_type: m.content_type.clone(),
        body: m.body.clone(),
        attachments: m.attachments.iter().map(|a| content_id(a)).collect(),
    };
    content_id(&encode_message(&object, u64::MAX).expect("message encodes"))
}

fn cids(ms: &[Message]) -> Vec<ContentId> {
    ms.iter().map(cid).collect()
}

fn create(s: SessionId, messages: &[Message]) -> Command {
    let mut c = CreateSession::with_id(s).label("team", "red");
    c.messages = messages.to_vec();
    Command::CreateSession(c)
}

fn turn(s: SessionId, id: &str, expected: Expected, messages: &[Message]) -> CommitTurn {
    let mut t = CommitTurn::new(s, id, expected);
    t.messages = messages.to_vec();
    t
}

fn rewrite(s: SessionId, expected: RevisionId, start: u64, end: u64, replacement: &[Message]) -> Command {
    Command::Rewrite(Rewrite {
        session: s,
        expected,
        start,
        end,
        replacement: replacement.to_vec(),
        reason: RewriteReason::Compaction,
        note: "compact".into(),
        actor: "host".into(),
    })
}

fn restore(s: SessionId, expected: RevisionId, target: RevisionId) -> Command {
    Command::Restore(Restore { session: s, expected, target, note: "undo".into(), actor: "host".into() })
}

fn tool_call(s: SessionId, op: &str, parent: Option<&str>) -> RecordToolCall {
    RecordToolCall {
        session: s,
        op_id: op.into(),
        call_id: format!("call-{op}"),
        tool_name: "bash".into(),
        args: b"ls".to_vec(),
        parent_op: parent.map(str::to_string),
        turn_id: None,
        recovery: Recovery::ReplaySafe,
    }
}

fn receipt(o: &Outcome) -> Receipt {
    match o {
        Outcome::Created { receipt, .. } => *receipt,
        Outcome::Committed(r) | Outcome::AlreadyCommitted(r) | Outcome::Rewritten(r) => *r,
        other => panic!("no receipt in {other:?}"),
    }
}

fn corrupt_seq(r: Result<()>) -> u64 {
    match r {
        Err(Error::Corrupt { location: Location::Log { seq }, .. }) => seq,
        other => panic!("expected corruption at a log seq, got {other:?}"),
    }
}

#[test]
fn session_created_fills_head_transcript_graph_and_labels() {
    let mut log = Log::new();
    let s = sid(1);
    let ms = [Message::system("be brief"), Message::user("hi")];
    let out = log.ok(create(s, &ms));
    let rev = RevisionId::of(&cids(&ms));
    assert_eq!(
        out,
        Outcome::Created { session: s, receipt: Receipt { seq: 1, revision: rev, committed_at_ms: CLOCK_MS + 1 } }
    );

    let head = log.head(s);
    assert_eq!((head.revision, head.message_count, head.archived), (rev, 2, false));
    assert_eq!((head.created_seq, head.last_seq, head.stream_seq), (1, 1, 1));
    assert_eq!((head.created_at_ms, head.updated_at_ms), (CLOCK_MS + 1, CLOCK_MS + 1));
    assert_eq!(head.labels, BTreeMap::from([("team".to_string(), "red".to_string())]));

    let rows = log.transcript(s);
    assert_eq!(rows.iter().map(|r| r.content).collect::<Vec<_>>(), cids(&ms));
    assert_eq!(rows[0].chain, RevisionId::of(&cids(&ms[..1])));
    assert_eq!(rows[1].chain, rev);
    let tip: TranscriptTip = log.row(Table::TranscriptTip, &keys::session(&s)).unwrap();
    assert_eq!((tip.len, tip.revision), (2, rev));

    let node = log.node(s, rev);
    assert_eq!((node.ordinal, node.seq, node.message_count), (0, 1, 2));
    assert!(node.parents.is_empty());
    assert_eq!(node.origin, NodeOrigin::Created);
    assert_eq!(node.recipe, Recipe::Root { fork: None, messages: cids(&ms) });
    // The revision order's first row holds the seq of the node's record, a u64 BE.
    let order = log.store.get(Table::RevisionOrder, &keys::session_u64(&s, 0)).unwrap().unwrap();
    assert_eq!(order, 1u64.to_be_bytes());
    // The transition that produced the node is the node itself, not a stored edge.
    assert!(log.keys(Table::RevisionEdges).is_empty());
    let edge = node.creation_edge();
    assert_eq!((edge.seq, edge.from, edge.to, edge.origin), (1, None, rev, NodeOrigin::Created));
    let graph_tip: GraphTip = log.row(Table::GraphTip, &keys::session(&s)).unwrap();
    assert_eq!(graph_tip, GraphTip { head: rev, head_seq: 1, nodes: 1, len: 2 });

    let labels: LabelSession = log.row(Table::LabelSessions, &keys::session(&s)).unwrap();
    assert_eq!(labels.created_seq, 1);
    assert_eq!(log.keys(Table::LabelIndex), vec![keys::label_index("team", "red", 1, &s)]);
    let created: SessionId = log.row(Table::CreationOrder, &keys::u64(1)).unwrap();
    assert_eq!(created, s);
    for t in [Table::Context, Table::Turns, Table::Usage, Table::ToolOps, Table::Unsettled, Table::Forks] {
        assert!(log.keys(t).is_empty(), "{t:?} is empty after a create");
    }
}

#[test]
fn turn_committed_appends_applies_context_and_counts_usage() {
    let mut log = Log::new();
    let s = sid(1);
    let sys = [Message::system("sys")];
    let rev0 = receipt(&log.ok(create(s, &sys))).revision;
    let ctx = AppendContext { session: s, key: "mem".into(), content: b"remember".to_vec(), source: "notes".into() };
    assert_eq!(log.ok(Command::AppendContext(ctx)), Outcome::Staged { seq: 2 });
    let entry: ContextEntry = log.row(Table::Context, &keys::session_str(&s, "mem")).unwrap();
    assert_eq!(entry.state, ContextState::Pending);
    assert_eq!((entry.content, entry.appended_seq), (content_id(b"remember"), 2));

    let msgs = [Message::user("q"), Message::assistant("a")];
    let t = turn(s, "t1", Expected::Exact(rev0), &msgs)
        .usage("p", "m", 10, 5)
        .usage("p", "m", 1, 1)
        .usage("q", "m", 7, 0)
        .apply_context("mem");
    let r = receipt(&log.ok(Command::CommitTurn(t)));
    let mut all = cids(&sys);
    all.extend(cids(&msgs));
    assert_eq!(r, Receipt { seq: 3, revision: RevisionId::of(&all), committed_at_ms: CLOCK_MS + 3 });

    let head = log.head(s);
    assert_eq!((head.revision, head.message_count, head.stream_seq, head.last_seq), (r.revision, 3, 3, 3));
    assert_eq!(log.transcript(s).iter().map(|x| x.content).collect::<Vec<_>>(), all);

    let entry: ContextEntry = log.row(Table::Context, &keys::session_str(&s, "mem")).unwrap();
    assert_eq!(entry.state, ContextState::Applied { seq: 3, turn_id: "t1".into() });
    // The turns projection names the record; the record holds the receipt.
    assert_eq!(annal::buckets::turn_seq(&log.store, &s, "t1").unwrap(), Some(r.seq));
    assert_eq!(annal::buckets::turn_seq(&log.store, &s, "t2").unwrap(), None);

    let pm: UsageTotals = log.row(Table::Usage, &keys::usage(&s, "p", "m")).unwrap();
    assert_eq!((pm.input, pm.output, pm.turns), (11, 6, 1), "two entries of one turn count as one turn");
    let qm: UsageTotals = log.row(Table::Usage, &keys::usage(&s, "q", "m")).unwrap();
    assert_eq!((qm.input, qm.output, qm.turns), (7, 0, 1));

    let node = log.node(s, r.revision);
    assert_eq!(node.parents, vec![rev0]);
    assert_eq!(node.origin, NodeOrigin::Turn { turn_id: "t1".into() });
    assert_eq!(node.recipe, Recipe::Splice { parent: rev0, start: 1, end: 1, replacement: cids(&msgs) });
}

#[test]
fn transcript_rewritten_splices_and_drops_the_tail() {
    let mut log = Log::new();
    let s = sid(1);
    let ms = [Message::user("1"), Message::assistant("2"), Message::user("3"), Message::assistant("4")];
    let rev0 = receipt(&log.ok(create(s, &ms))).revision;
    let summary = [Message::system("summary")];
    let r = receipt(&log.ok(rewrite(s, rev0, 0, 3, &summary)));
    let mut after = cids(&summary);
    after.push(cid(&ms[3]));
    assert_eq!(r.revision, RevisionId::of(&after));
    assert_eq!(log.head(s).message_count, 2);
    assert_eq!(log.transcript(s).iter().map(|x| x.content).collect::<Vec<_>>(), after);
    for p in 2..4 {
        assert!(annal::transcript::row(&log.with_log(), &s, p).is_err(), "row {p} dropped");
    }
    let node = log.node(s, r.revision);
    assert_eq!(
        node.origin,
        NodeOrigin::Rewrite { kind: "compaction".into(), note: "compact".into(), actor: "host".into() }
    );
    assert_eq!(node.message_count, 2);

    // Restoring the parent returns to exactly the parent's id and node.
    let back = receipt(&log.ok(restore(s, r.revision, rev0)));
    assert_eq!(back.revision, rev0);
    assert_eq!(log.transcript(s).iter().map(|x| x.content).collect::<Vec<_>>(), cids(&ms));
    let node = log.node(s, rev0);
    assert_eq!((node.ordinal, node.parents.clone()), (0, vec![r.revision]));
    let tip: GraphTip = log.row(Table::GraphTip, &keys::session(&s)).unwrap();
    assert_eq!(tip, GraphTip { head: rev0, head_seq: 1, nodes: 2, len: 4 });
    // A transition back to a revision the session already had is a stored edge, and
    // the only one: the rewrite's transition is its node's creation.
    assert_eq!(log.keys(Table::RevisionEdges), vec![keys::session_u64(&s, back.seq)]);
    let edge: RevisionEdge = log.row(Table::RevisionEdges, &keys::session_u64(&s, back.seq)).unwrap();
    assert_eq!((edge.from, edge.to), (Some(r.revision), rev0));
    // The root node gained a parent, but its own creation still came from nothing.
    assert_eq!(log.node(s, rev0).creation_edge().from, None);
    assert_eq!(log.node(s, r.revision).creation_edge().from, Some(rev0));
}

#[test]
fn archive_revive_and_labels_change_the_head_and_the_index() {
    let mut log = Log::new();
    let s = sid(1);
    log.ok(create(s, &[]));
    let archive = Command::Archive { session: s, reason: "done".into() };
    assert_eq!(log.ok(archive.clone()), Outcome::Archived { seq: Some(2) });
    assert!(log.head(s).archived);
    assert_eq!(log.decide(&archive).unwrap(), Decision::Noop(Outcome::Archived { seq: None }));
    // A label change that changes nothing answers as a retry even when archived; one
    // that changes something is refused.
    let nothing = Command::SetLabels(SetLabels { session: s, set: BTreeMap::new(), remove: BTreeSet::new() });
    assert_eq!(log.decide(&nothing).unwrap(), Decision::Noop(Outcome::Labels { seq: None }));
    let set = BTreeMap::from([("archived-label".to_string(), "x".to_string())]);
    let labels = Command::SetLabels(SetLabels { session: s, set, remove: BTreeSet::new() });
    let got = log.run(labels);
    assert!(matches!(got, Err(Error::Rejected(Rejection::Archived { .. }))), "{got:?}");
    assert_eq!(log.ok(Command::Revive { session: s, reason: "again".into() }), Outcome::Revived { seq: 3 });
    assert!(!log.head(s).archived);

    let set = BTreeMap::from([("team".to_string(), "blue".to_string()), ("tier".to_string(), "1".to_string())]);
    let change = Command::SetLabels(SetLabels { session: s, set, remove: BTreeSet::new() });
    assert_eq!(log.ok(change.clone()), Outcome::Labels { seq: Some(4) });
    assert_eq!(log.decide(&change).unwrap(), Decision::Noop(Outcome::Labels { seq: None }));
    let mut index = vec![keys::label_index("team", "blue", 1, &s), keys::label_index("tier", "1", 1, &s)];
    index.sort();
    assert_eq!(log.keys(Table::LabelIndex), index);
    let remove = BTreeSet::from(["team".to_string()]);
    log.ok(Command::SetLabels(SetLabels { session: s, set: BTreeMap::new(), remove }));
    assert_eq!(log.keys(Table::LabelIndex), vec![keys::label_index("tier", "1", 1, &s)]);
    let ls: LabelSession = log.row(Table::LabelSessions, &keys::session(&s)).unwrap();
    assert_eq!(ls.labels, BTreeMap::from([("tier".to_string(), "1".to_string())]));
    assert_eq!(log.head(s).labels, ls.labels);
    assert_eq!(log.head(s).stream_seq, 5);
}

#[test]
fn tool_calls_enter_and_results_leave_the_unsettled_index() {
    let mut log = Log::new();
    let s = sid(1);
    log.ok(create(s, &[]));
    let outer = log.ok(Command::RecordToolCall(tool_call(s, "outer", None)));
    assert_eq!(outer, Outcome::Tool { created: true, seq: Some(2) });
    log.ok(Command::RecordToolCall(tool_call(s, "inner", Some("outer"))));

    let op: ToolOp = log.row(Table::ToolOps, &keys::session_str(&s, "inner")).unwrap();
    assert_eq!((op.ordinal, op.call_seq, op.parent_op.as_deref()), (1, 3, Some("outer")));
    assert_eq!(op.state, ToolState::Prepared);
    let order: String = log.row(Table::ToolOrder, &keys::session_u64(&s, 1)).unwrap();
    assert_eq!(order, "inner");
    assert_eq!(log.keys(Table::Unsettled), vec![keys::session_u64(&s, 2), keys::session_u64(&s, 3)]);
    let all: (SessionId, String) = log.row(Table::UnsettledAll, &keys::u64(3)).unwrap();
    assert_eq!(all, (s, "inner".to_string()));
    let tip: ToolTip = log.row(Table::ToolTip, &keys::session(&s)).unwrap();
    assert_eq!(tip.count, 2);

    let result =
        RecordToolResult { session: s, op_id: "outer".into(), outcome: ToolOutcome::Error, result: b"exit 1".to_vec() };
    assert_eq!(log.ok(Command::RecordToolResult(result)), Outcome::Tool { created: true, seq: Some(4) });
    let op: ToolOp = log.row(Table::ToolOps, &keys::session_str(&s, "outer")).unwrap();
    let settled =
        ToolState::Settled { outcome: ToolOutcome::Error, result: content_id(b"exit 1"), seq: 4, at_ms: CLOCK_MS + 4 };
    assert_eq!(op.state, settled);
    assert_eq!(log.keys(Table::Unsettled), vec![keys::session_u64(&s, 3)]);
    assert_eq!(log.keys(Table::UnsettledAll), vec![keys::u64(3)]);
}

#[test]
fn fork_copies_the_prefix_and_records_the_edge() {
    let mut log = Log::new();
    let (parent, child) = (sid(1), sid(2));
    let ms = [Message::user("a"), Message::assistant("b"), Message::user("c")];
    let prev = receipt(&log.ok(create(parent, &ms))).revision;
    let replacement = Message::user("c'");
    let fork = Fork { parent, session: child, index: 2, replacement: Some(replacement.clone()), labels: None };
    let r = receipt(&log.ok(Command::Fork(fork)));
    let mut want = cids(&ms[..2]);
    want.push(cid(&replacement));
    assert_eq!(r.revision, RevisionId::of(&want));
    assert_eq!(log.transcript(child).iter().map(|x| x.content).collect::<Vec<_>>(), want);
    assert_eq!(log.head(child).forked_from, Some(ForkOrigin { session: parent, revision: prev, message_count: 2 }));
    assert_eq!(log.head(child).labels, log.head(parent).labels);
    let edge: ForkEdge = log.row(Table::Forks, &keys::session_pair(&parent, &child)).unwrap();
    assert_eq!(edge, ForkEdge { child, revision: prev, message_count: 2, seq: 2 });
    assert_eq!(log.head(parent).last_seq, 1, "the parent's stream is untouched");
    assert_eq!(log.head(child).stream_seq, 1);
}

#[test]
fn decide_answers_retries_with_noops() {
    let mut log = Log::new();
    let s = sid(1);
    let rev0 = receipt(&log.ok(create(s, &[]))).revision;
    let t = turn(s, "t1", Expected::Exact(rev0), &[Message::user("hi")]).usage("p", "m", 1, 1);
    let first = receipt(&log.ok(Command::CommitTurn(t.clone())));
    log.ok(Command::CommitTurn(turn(s, "t2", Expected::Any, &[Message::user("more")])));
    // The head moved and the expected revision is stale: still the original receipt.
    assert_eq!(log.decide(&Command::CommitTurn(t.clone())).unwrap(), Decision::Noop(Outcome::AlreadyCommitted(first)));
    let drifted = t.clone().usage("p", "m", 1, 1);
    assert_eq!(
        log.decide(&Command::CommitTurn(drifted)).unwrap_err(),
        Error::Rejected(Rejection::TurnConflict { turn_id: "t1".into() })
    );

    let ctx = Command::AppendContext(AppendContext {
        session: s,
        key: "k".into(),
        content: b"text".to_vec(),
        source: "src".into(),
    });
    log.ok(ctx.clone());
    assert_eq!(log.decide(&ctx).unwrap(), Decision::Noop(Outcome::Duplicate));

    let call = Command::RecordToolCall(tool_call(s, "op", None));
    log.ok(call.clone());
    assert_eq!(log.decide(&call).unwrap(), Decision::Noop(Outcome::Tool { created: false, seq: None }));
    let result = Command::RecordToolResult(RecordToolResult {
        session: s,
        op_id: "op".into(),
        outcome: ToolOutcome::Ok,
        result: b"done".to_vec(),
    });
    log.ok(result.clone());
    assert_eq!(log.decide(&result).unwrap(), Decision::Noop(Outcome::Tool { created: false, seq: None }));

    let archive = Command::Archive { session: s, reason: String::new() };
    log.ok(archive.clone());
    assert_eq!(log.decide(&archive).unwrap(), Decision::Noop(Outcome::Archived { seq: None }));
    // Even archived, an exact retry of a committed turn is answered from its record.
    assert_eq!(log.decide(&Command::CommitTurn(t)).unwrap(), Decision::Noop(Outcome::AlreadyCommitted(first)));
}

/// A log touching every projection: turns with usage and context, a compaction, a
/// restore, tools (nested, settled), labels, an archive and a revive, and a fork.
fn busy_log() -> Log {
    let mut log = Log::new();
    let (a, b) = (sid(1), sid(2));
    let mut rev = receipt(&log.ok(create(a, &[Message::system("sys")]))).revision;
    let ctx = AppendContext { session: a, key: "k".into(), content: b"ctx".to_vec(), source: "s".into() };
    log.ok(Command::AppendContext(ctx));
    log.ok(Command::RecordToolCall(tool_call(a, "op1", None)));
    log.ok(Command::RecordToolCall(tool_call(a, "op2", Some("op1"))));
    for i in 0..4 {
        let msgs = [Message::user(format!("u{i}")), Message::assistant(format!("a{i}"))];
        let mut t = turn(a, &format!("t{i}"), Expected::Exact(rev), &msgs).usage("p", "m", 10, i).usage("q", "n", 1, 1);
        if i == 1 {
            t = t.apply_context("k").tool_op("op1");
        }
        rev = receipt(&log.ok(Command::CommitTurn(t))).revision;
    }
    let result = RecordToolResult { session: a, op_id: "op2".into(), outcome: ToolOutcome::Ok, result: b"r".to_vec() };
    log.ok(Command::RecordToolResult(result));
    let before = rev;
    rev = receipt(&log.ok(rewrite(a, rev, 1, 7, &[Message::system("summary")]))).revision;
    let fork = Fork { parent: a, session: b, index: 1, replacement: None, labels: None };
    log.ok(Command::Fork(fork));
    log.ok(restore(a, rev, before));
    let set = BTreeMap::from([("tier".to_string(), "gold".to_string())]);
    log.ok(Command::SetLabels(SetLabels { session: b, set, remove: BTreeSet::from(["team".to_string()]) }));
    // The inbox: an input claimed (no lease: token 0) and consumed by a turn, one left.
    let input = |id: &str| EnqueueInput {
        session: a,
        input_id: id.into(),
        message: Message::user(id),
        kind: annal::codec::InputKind::NextTurn,
    };
    log.ok(Command::EnqueueInput(input("in-1")));
    log.ok(Command::EnqueueInput(input("in-2")));
    let claim = ClaimInputs {
        session: a,
        token: 0,
        owner: "w".into(),
        target: annal::codec::ClaimTarget::NextTurn,
        ttl_ms: 1000,
        max: 1,
    };
    log.ok(Command::ClaimInputs(claim));
    let drain = turn(a, "drain", Expected::Any, &[Message::assistant("done")]).consumes("in-1");
    log.ok(Command::CommitTurn(drain));
    log.ok(Command::Archive { session: b, reason: "old".into() });
    log.ok(Command::Revive { session: b, reason: "new".into() });
    log.ok(Command::CommitTurn(turn(b, "t0", Expected::Any, &[Message::user("fork turn")]).usage("p", "m", 3, 3)));
    log
}

#[test]
fn each_projection_folds_alone_to_the_same_rows() {
    let full = busy_log();
    for p in Projection::ALL {
        let mut alone = MemStore::default();
        for r in &full.records {
            fold_one(&mut alone, &full.records, r, ProjectionSet::none().with(p)).unwrap();
        }
        for t in Table::ALL {
            let want = if p.tables().contains(&t) { full.store.tables.get(&t) } else { None };
            assert_eq!(alone.tables.get(&t), want, "{} folded alone: table {}", p.name(), t.name());
        }
        assert!(p.tables().iter().any(|t| full.store.tables.contains_key(t)), "{} has rows", p.name());
    }
}

#[test]
fn folding_twice_gives_identical_tables() {
    let full = busy_log();
    let mut again = MemStore::default();
    for r in &full.records {
        fold_one(&mut again, &full.records, r, ProjectionSet::all()).unwrap();
    }
    assert_eq!(again, full.store);
    assert_eq!(query::mem_digests(&again), query::mem_digests(&full.store));
}

#[test]
fn materialize_rebuilds_every_revision_a_session_held() {
    let mut log = Log::new();
    let (a, b) = (sid(1), sid(2));
    let m = |t: &str| Message::user(t);
    let r0 = receipt(&log.ok(create(a, &[m("0")]))).revision;
    let r1 = receipt(&log.ok(Command::CommitTurn(turn(a, "t1", Expected::Any, &[m("1"), m("2")])))).revision;
    let r2 = receipt(&log.ok(rewrite(a, r1, 1, 2, &[m("x"), m("y")]))).revision;
    let rb = receipt(&log.ok(Command::Fork(Fork { parent: a, session: b, index: 2, replacement: None, labels: None })));
    let r3 = receipt(&log.ok(restore(a, r2, r0))).revision;
    let rb1 = receipt(&log.ok(Command::CommitTurn(turn(b, "t1", Expected::Any, &[m("b")])))).revision;
    let want = |ts: &[&str]| Some(ts.iter().map(|t| cid(&m(t))).collect::<Vec<_>>());

    assert_eq!(r3, r0);
    assert_eq!(materialize(&log.with_log(), &a, &r0).unwrap(), want(&["0"]));
    assert_eq!(materialize(&log.with_log(), &a, &r1).unwrap(), want(&["0", "1", "2"]));
    assert_eq!(materialize(&log.with_log(), &a, &r2).unwrap(), want(&["0", "x", "y", "2"]));
    // The fork's revisions go back through the parent's graph.
    assert_eq!(materialize(&log.with_log(), &b, &rb.revision).unwrap(), want(&["0", "x"]));
    assert_eq!(materialize(&log.with_log(), &b, &rb1).unwrap(), want(&["0", "x", "b"]));
    // A revision the session never held, even one its parent held, is unknown.
    assert_eq!(materialize(&log.with_log(), &b, &r1).unwrap(), None);
    assert_eq!(materialize(&log.with_log(), &a, &RevisionId([7; 32])).unwrap(), None);
}

/// The projections with the records, counting the records read, and with a cache of
/// revisions' lists as an engine's view has one.
struct Remembering<'a> {
    log: WithLog<'a>,
    reads: std::cell::Cell<u64>,
    lists: std::cell::RefCell<std::collections::HashMap<RevisionId, std::sync::Arc<[ContentId]>>>,
}

impl Store for Remembering<'_> {
    fn read(&self, table: Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        self.log.read(table, key, f)
    }
    fn put(&mut self, _: Table, _: &[u8], _: &[u8]) -> Result<()> {
        unreachable!("decide only reads")
    }
    fn remove(&mut self, _: Table, _: &[u8]) -> Result<()> {
        unreachable!("decide only reads")
    }
    fn record_at(&self, seq: u64) -> Result<Option<Record>> {
        self.reads.set(self.reads.get() + 1);
        self.log.record_at(seq)
    }
    /// Not counted: an engine keeps records' lists in its cache, which reading the
    /// head's transcript goes through.
    fn message_list(&self, seq: u64) -> Result<Option<std::sync::Arc<[ContentId]>>> {
        self.log.message_list(seq)
    }
    fn cached_revision(&self, revision: &RevisionId) -> Option<std::sync::Arc<[ContentId]>> {
        self.lists.borrow().get(revision).cloned()
    }
    fn keep_revision(&self, revision: &RevisionId, list: &[ContentId]) {
        self.lists.borrow_mut().insert(*revision, list.into());
    }
}

/// Rebuilding a revision's list walks its recipes back from the revision, reading a
/// record a node; a list rebuilt once is kept (by an engine, in its content cache), and
/// the next walk that reaches that revision stops there: a restore of a long session
/// reads the records since the revision the previous one rebuilt, not every record of
/// the session. A kept list counts only at a node the session holds, and the list a walk
/// ends with is hashed against the revision asked for either way.
#[test]
fn a_walk_over_the_recipes_stops_at_a_list_rebuilt_before() {
    let mut log = Log::new();
    let (s, other) = (sid(1), sid(2));
    let m = |t: String| Message::user(t);
    let mut revisions = vec![receipt(&log.ok(create(s, &[m("0".into())]))).revision];
    for i in 1..=60 {
        let t = turn(s, &format!("t{i}"), Expected::Any, &[m(format!("{i}"))]);
        revisions.push(receipt(&log.ok(Command::CommitTurn(t))).revision);
    }
    let want = |n: usize| Some((0..=n).map(|i| cid(&m(format!("{i}")))).collect::<Vec<_>>());
    fn remembering(log: &Log) -> Remembering<'_> {
        Remembering {
            log: WithLog { store: &log.store, records: &log.records },
            reads: Default::default(),
            lists: Default::default(),
        }
    }

    let store = remembering(&log);
    assert_eq!(materialize(&store, &s, &revisions[50]).unwrap(), want(50));
    let from_the_start = store.reads.get();
    assert!(from_the_start >= 50, "{from_the_start} records read");
    assert!(store.lists.borrow().contains_key(&revisions[50]));
    store.reads.set(0);
    assert_eq!(materialize(&store, &s, &revisions[53]).unwrap(), want(53));
    assert!(store.reads.get() <= 6, "{} records read after the kept list", store.reads.get());
    // The revision itself: no record at all.
    store.reads.set(0);
    assert_eq!(materialize(&store, &s, &revisions[50]).unwrap(), want(50));
    assert_eq!(store.reads.get(), 0);
    // A restore keeps its target's list too, and its decision is the one a walk from the
    // start makes.
    let command = restore(s, revisions[60], revisions[55]);
    let plain = decide(&log.with_log(), &command, &log.limits, &annal::Now::at(0)).unwrap();
    store.reads.set(0);
    let remembered = decide(&store, &command, &log.limits, &annal::Now::at(0)).unwrap();
    assert_eq!(format!("{remembered:?}"), format!("{plain:?}"));
    assert!(store.reads.get() <= 8, "{} records read", store.reads.get());
    assert!(store.lists.borrow().contains_key(&revisions[55]));

    // A kept list of a revision another session never held is not that session's.
    log.ok(create(other, &[m("x".into())]));
    let store = remembering(&log);
    store.keep_revision(&revisions[50], &want(50).unwrap());
    assert_eq!(materialize(&store, &other, &revisions[50]).unwrap(), None);
    // A kept list that is not the revision's fails the hash check of the walk that took it.
    store.keep_revision(&revisions[50], &want(49).unwrap());
    assert!(matches!(materialize(&store, &s, &revisions[53]), Err(Error::Corrupt { .. })));
}

/// A node's row holds what its record does not: none of its messages' ids (the
/// map's entries are keyed by the revisions' ids, which the row holds once each). Reading it needs the records: a store of
/// projection rows alone cannot answer, and a node whose seq names another record is a
/// corrupt projection.
#[test]
fn a_revision_node_takes_its_recipe_from_its_record() {
    let mut log = Log::new();
    let s = sid(1);
    let m = |t: &str| Message::user(t);
    let r0 = receipt(&log.ok(create(s, &[m("0")]))).revision;
    let r1 = receipt(&log.ok(Command::CommitTurn(turn(s, "t1", Expected::Any, &[m("1"), m("2")])))).revision;
    let r2 = receipt(&log.ok(rewrite(s, r1, 1, 2, &[m("x")]))).revision;
    let node = log.node(s, r2);
    assert_eq!(node.recipe, Recipe::Splice { parent: r1, start: 1, end: 2, replacement: cids(&[m("x")]) });
    assert_eq!((node.parents.clone(), node.seq, node.created_at_ms), (vec![r1], 3, CLOCK_MS + 3));
    let node = log.node(s, r1);
    assert_eq!(node.recipe, Recipe::Splice { parent: r0, start: 1, end: 1, replacement: cids(&[m("1"), m("2")]) });
    assert_eq!(node.origin, NodeOrigin::Turn { turn_id: "t1".into() });
    for (key, row) in &log.store.tables[&Table::Revisions] {
        for id in cids(&[m("0"), m("1"), m("2"), m("x")]) {
            assert!(!row.windows(32).any(|w| w == id.0), "row {key:?} holds {id}");
        }
    }
    assert!(matches!(annal::revision_node(&log.store, &s, &r1), Err(Error::Storage(_))));
    assert!(matches!(materialize(&log.store, &s, &r2), Err(Error::Storage(_))));
    // The turn's record, swapped for the rewrite's: the node names a record that did
    // not produce it.
    let mut records = log.records.clone();
    records[1] = Record { seq: 2, ..records[2].clone() };
    let swapped = WithLog { store: &log.store, records: &records };
    assert!(matches!(annal::revision_node(&swapped, &s, &r1), Err(Error::Corrupt { .. })));
    assert!(matches!(materialize(&swapped, &s, &r2), Err(Error::Corrupt { .. })));
}

#[test]
fn evolve_reports_a_wrong_revision_after_at_its_seq() {
    let mut log = Log::new();
    let s = sid(1);
    log.ok(create(s, &[]));
    let msg = cid(&Message::user("hi"));
    let event = Event::TurnCommitted(TurnCommitted {
        turn_id: "t".into(),
        commit_hash: annal::codec::turn_commit_hash(&[msg], &[], &[], &[]),
        messages: vec![msg],
        usage: Vec::new(),
        applied_context: Vec::new(),
        tool_ops: Vec::new(),
        run_id: None,
        revision_after: RevisionId::of(&[msg, msg]),
        state: Default::default(),
        inputs: Vec::new(),
    });
    let record = log.next_record(s, event);
    assert_eq!(corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())), 2);
    let transcript_alone = ProjectionSet::none().with(Projection::Transcript);
    assert_eq!(corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, transcript_alone)), 2);

    let created = Event::SessionCreated(SessionCreated {
        labels: BTreeMap::new(),
        metadata: Vec::new(),
        forked_from: None,
        messages: vec![msg],
        revision_after: RevisionId::empty(),
    });
    let record = log.next_record(sid(2), created);
    assert_eq!(corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())), 2);
}

#[test]
fn evolve_reports_a_stream_gap_at_its_seq() {
    let mut log = Log::new();
    let s = sid(1);
    log.ok(create(s, &[]));
    let mut record = log.next_record(s, Event::SessionArchived(SessionArchived { reason: String::new() }));
    record.stream_seq = 3;
    assert_eq!(corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())), 2);
    record.stream_seq = 1;
    assert_eq!(
        corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())),
        2,
        "a repeated stream seq"
    );
    record.stream_seq = 2;
    fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all()).unwrap();
}

#[test]
fn the_stream_index_stays_dense_across_its_rows() {
    // A row holds `STREAM_CHUNK` stream seqs: a gap, a repeat or a new row before the
    // last is full is corruption on either side of a row's edge.
    let mut log = Log::new();
    let s = sid(1);
    log.ok(create(s, &[]));
    let archived = || Event::SessionArchived(SessionArchived { reason: String::new() });
    for _ in 1..annal::evolve::STREAM_CHUNK {
        let record = log.next_record(s, archived());
        log.fold(record).unwrap();
    }
    let c = annal::evolve::STREAM_CHUNK;
    let mut record = log.next_record(s, archived());
    assert_eq!(record.stream_seq, c + 1);
    let seq = record.seq;
    for (stream_seq, why) in [(c + 2, "a gap at a new row"), (c, "a repeat in a full row"), (0, "stream seq 0")] {
        record.stream_seq = stream_seq;
        assert_eq!(
            corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())),
            seq,
            "{why}"
        );
    }
    record.stream_seq = c + 1;
    log.fold(record).unwrap();
    let mut record = log.next_record(s, archived());
    let seq = record.seq;
    for (stream_seq, why) in [(c + 1, "a repeat in the new row"), (c + 4, "a gap in the new row")] {
        record.stream_seq = stream_seq;
        assert_eq!(
            corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())),
            seq,
            "{why}"
        );
    }
    // Two rows for c + 1 events: the first full, the second holding one seq.
    assert_eq!(log.keys(Table::StreamIndex).len(), 2);
    let second: Vec<u8> = log.store.get(Table::StreamIndex, &keys::session_u64(&s, 1)).unwrap().unwrap();
    assert_eq!(second, (c + 1).to_be_bytes());
}

#[test]
fn evolve_reports_an_event_on_an_unknown_session() {
    let mut log = Log::new();
    log.ok(create(sid(1), &[]));
    let ghost = sid(9);
    let events = [
        Event::SessionArchived(SessionArchived { reason: String::new() }),
        Event::LabelsChanged(LabelsChanged { set: BTreeMap::new(), remove: BTreeSet::new() }),
        Event::ContextAppended(ContextAppended { key: "k".into(), content: content_id(b"c"), source: String::new() }),
        Event::ToolCallRecorded(ToolCallRecorded {
            op_id: "op".into(),
            call_id: "c".into(),
            tool_name: "t".into(),
            args: content_id(b"a"),
            parent_op: None,
            turn_id: None,
            recovery: Recovery::ReplaySafe,
        }),
    ];
    for event in events {
        let kind = event.kind();
        let record = log.next_record(ghost, event);
        assert_eq!(
            corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())),
            2,
            "{kind}"
        );
    }
    // Creating a session twice is corruption too.
    let again = Event::SessionCreated(SessionCreated {
        labels: BTreeMap::new(),
        metadata: Vec::new(),
        forked_from: None,
        messages: Vec::new(),
        revision_after: RevisionId::empty(),
    });
    let mut record = log.next_record(sid(1), again);
    record.stream_seq = 1;
    assert_eq!(corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())), 2);
}

#[test]
fn evolve_reports_a_rewrite_whose_parent_is_not_the_head() {
    let mut log = Log::new();
    let s = sid(1);
    let ms = [Message::user("a"), Message::user("b")];
    let rev0 = receipt(&log.ok(create(s, &ms))).revision;
    let rev1 = receipt(&log.ok(rewrite(s, rev0, 0, 1, &[]))).revision;
    // Built against the old head: its recomputed result would even be consistent.
    let stale = Event::TranscriptRewritten(TranscriptRewritten {
        parent_revision: rev0,
        start: 0,
        end: 0,
        replacement: vec![cid(&Message::user("z"))],
        kind: RewriteKind::Edit,
        note: String::new(),
        actor: String::new(),
        revision_after: RevisionId::of(&[cid(&Message::user("z")), cid(&ms[1])]),
    });
    let record = log.next_record(s, stale);
    assert_eq!(corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())), 3);
    let graph_alone = ProjectionSet::none().with(Projection::Graph);
    assert_eq!(corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, graph_alone)), 3);

    let past_the_end = Event::TranscriptRewritten(TranscriptRewritten {
        parent_revision: rev1,
        start: 0,
        end: 2,
        replacement: Vec::new(),
        kind: RewriteKind::Redaction,
        note: String::new(),
        actor: String::new(),
        revision_after: RevisionId::empty(),
    });
    let record = log.next_record(s, past_the_end);
    assert_eq!(corrupt_seq(fold_one(&mut log.store.clone(), &log.records, &record, ProjectionSet::all())), 3);
}

/// The transcript's chunks of 128 ids and its checkpoints (`annal::transcript`) against a
/// plain list:
/// turns, rewrites of any range, restores and forks at any index, across chunk boundaries. After
/// each step the rows, their chain values and the number of chunks stored agree.
mod chunks {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Step {
        Turn(u8),
        Long(u16),
        Edit { start: u16, len: u8 },
        Restore(u8),
        Rewrite { start: u16, len: u16, replacement: u8 },
        Fork { index: u16, replace: bool },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u8..200).prop_map(Step::Turn),
            (1000u16..4096).prop_map(Step::Long).no_shrink(),
            (any::<u16>(), 1u8..140).prop_map(|(start, len)| Step::Edit { start, len }),
            any::<u8>().prop_map(Step::Restore),
            (any::<u16>(), 0u16..200, 0u8..70).prop_map(|(start, len, replacement)| Step::Rewrite {
                start,
                len,
                replacement
            }),
            (any::<u16>(), any::<bool>()).prop_map(|(index, replace)| Step::Fork { index, replace }),
        ]
    }

    fn rows_of(log: &Log, table: Table, s: SessionId) -> usize {
        log.store.tables.get(&table).map_or(0, |t| t.keys().filter(|k| k[..16] == s.0).count())
    }

    fn check(log: &Log, s: SessionId, want: &[ContentId]) {
        let rows = log.transcript(s);
        assert_eq!(rows.iter().map(|r| r.content).collect::<Vec<_>>(), want);
        let mut chain = RevisionId::empty();
        for (i, r) in rows.iter().enumerate() {
            chain = chain.extend(&want[i]);
            assert_eq!(r.chain, chain, "chain at {i}");
        }
        let n = want.len();
        assert_eq!(rows_of(log, Table::Transcript, s), n.div_ceil(128), "chunk rows stored");
        assert_eq!(rows_of(log, Table::TranscriptChains, s), (n / 128).div_ceil(64), "checkpoint rows stored");
        for len in [0, n / 2, n.saturating_sub(1), n] {
            let chain = annal::transcript::chain_at(&log.with_log(), &s, len as u64).expect("chain value");
            assert_eq!(chain, RevisionId::of(&want[..len]), "chain at {len}");
        }
        assert!(annal::transcript::row(&log.with_log(), &s, want.len() as u64).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn chunked_rows_follow_the_list(steps in proptest::collection::vec(step(), 1..24)) {
            let mut log = Log::new();
            let mut next = 0u32;
            let mut fresh = |n: usize| -> Vec<Message> {
                (0..n).map(|_| { next += 1; Message::user(format!("m{next}")) }).collect()
            };
            let mut current = sid(1);
            let first = fresh(3);
            let mut want = cids(&first);
            let mut rev = receipt(&log.ok(create(current, &first))).revision;
            let mut forks = 1u8;
            let mut history = vec![(rev, want.clone())];
            for (i, step) in steps.into_iter().enumerate() {
                match step {
                    Step::Turn(_) | Step::Long(_) => {
                        let n = match step { Step::Turn(n) => n as usize, Step::Long(n) => n as usize, _ => 0 };
                        let ms = fresh(n);
                        want.extend(cids(&ms));
                        let t = turn(current, &format!("t{i}"), Expected::Exact(rev), &ms);
                        rev = receipt(&log.ok(Command::CommitTurn(t))).revision;
                    }
                    Step::Rewrite { start, len, replacement } => {
                        let start = start as usize % (want.len() + 1);
                        let end = (start + len as usize).min(want.len());
                        let ms = fresh(replacement as usize);
                        let mut after = want.clone();
                        after.splice(start..end, cids(&ms));
                        if after.is_empty() || after == want {
                            continue;
                        }
                        let c = rewrite(current, rev, start as u64, end as u64, &ms);
                        rev = receipt(&log.ok(c)).revision;
                        want = after;
                    }
                    Step::Edit { start, len } => {
                        // The same number of messages in place: only their chunks change.
                        if want.is_empty() {
                            continue;
                        }
                        let start = start as usize % want.len();
                        let end = (start + len as usize).min(want.len());
                        let ms = fresh(end - start);
                        want.splice(start..end, cids(&ms));
                        rev = receipt(&log.ok(rewrite(current, rev, start as u64, end as u64, &ms))).revision;
                    }
                    Step::Restore(pick) => {
                        // Back to a revision the current session held before.
                        let (target, list) = history[pick as usize % history.len()].clone();
                        if target == rev {
                            continue;
                        }
                        rev = receipt(&log.ok(restore(current, rev, target))).revision;
                        want = list;
                    }
                    Step::Fork { index, replace } => {
                        forks += 1;
                        let child = sid(forks);
                        let replace = replace && !want.is_empty();
                        let index = index as usize % if replace { want.len() } else { want.len() + 1 };
                        let replacement = if replace { fresh(1).pop() } else { None };
                        want.truncate(index);
                        if let Some(m) = &replacement {
                            want.push(cid(m));
                        }
                        let fork = Fork { parent: current, session: child, index: index as u64, replacement, labels: None };
                        rev = receipt(&log.ok(Command::Fork(fork))).revision;
                        current = child;
                        history.clear();
                    }
                }
                check(&log, current, &want);
                history.push((rev, want.clone()));
            }
        }
    }
}

/// Two ids that share the first 8 bytes (the content-id index's key), stored by two
/// records: the index lists both rows under the key, a reference to either is accepted,
/// and a reference to an id of a key no row has is corrupt.
#[test]
fn ids_that_share_the_index_key_are_both_listed() {
    let mut store = MemStore::default();
    let (mut a, mut b, mut stranger) = ([1u8; 32], [2u8; 32], [3u8; 32]);
    a[..8].copy_from_slice(&[7; 8]);
    b[..8].copy_from_slice(&[7; 8]);
    stranger[..8].copy_from_slice(&[8; 8]);
    let (a, b, stranger) = (ContentId(a), ContentId(b), ContentId(stranger));
    let created = |seq: u64, messages: Vec<ContentId>| Record {
        seq,
        session: sid(seq as u8),
        stream_seq: 1,
        committed_at_ms: CLOCK_MS + seq,
        event: Event::SessionCreated(SessionCreated {
            labels: BTreeMap::new(),
            metadata: Vec::new(),
            forked_from: None,
            messages,
            revision_after: RevisionId::empty(),
        }),
    };
    let content = ProjectionSet::none().with(Projection::Content);
    evolve(&mut store, &created(1, vec![a]), &[a], content).unwrap();
    evolve(&mut store, &created(2, vec![b]), &[b], content).unwrap();
    assert_eq!(annal::buckets::content_rows(&store, &a).unwrap(), [1, 2]);
    assert_eq!(annal::buckets::content_rows(&store, &b).unwrap(), [1, 2]);
    // A later record may refer to either without storing it.
    evolve(&mut store, &created(3, vec![a, b]), &[], content).unwrap();
    assert_eq!(corrupt_seq(evolve(&mut store, &created(4, vec![stranger]), &[], content)), 4);
}
