//! Micro-benchmarks of the pieces a commit is made of: the record codec, the log chain
//! hash, `evolve` for each event kind, and a group-commit batch through the writer.

use annal::codec::{content_id, decode_record, encode_record, turn_commit_hash, LogChain, TurnCommitted};
use annal::{
    decide, evolve, new_session_id, AppendContext, Command, CommitTurn, ContentId, CreateSession, Decision, Durability,
    Engine, Event, Expected, Limits, MemStore, Message, Options, PageRequest, ProjectionSet, Record, RecordToolCall,
    RecordToolResult, Recovery, RevisionId, Rewrite, RewriteReason, SessionHead, SessionId, SetLabels, Store, StoreExt,
    Table, ToolOutcome, Usage,
};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Commands in the group-commit batch benchmark.
const BATCH_COMMANDS: u64 = 64;
/// Turns committed to the session the evolve benchmarks fold one more event into: with
/// its system prompt it holds 39 messages.
const SESSION_TURNS: u64 = 19;
/// Messages the compaction in the evolve benchmark keeps at the end of the transcript.
const COMPACTION_KEEP_MESSAGES: u64 = 9;
/// Decoded record bound used by the codec benchmarks (the engine's default).
const RECORD_BYTES_MAX: u64 = 128 << 20;

/// A typical turn record: a user and an assistant message, one usage entry, a run id.
fn typical_turn_record() -> Record {
    let messages = vec![content_id(b"user message"), content_id(b"assistant message")];
    let usage = vec![Usage {
        provider: "anthropic".into(),
        model: "claude-sonnet".into(),
        input: 1_834,
        output: 412,
        cache_read: 12_288,
        cache_write: 0,
    }];
    let commit_hash = turn_commit_hash(&messages, &usage, &[], &[]);
    let revision_after = RevisionId::of(&messages);
    Record {
        seq: 123_456,
        session: new_session_id(),
        stream_seq: 57,
        committed_at_ms: 1_750_000_000_000,
        event: Event::TurnCommitted(TurnCommitted {
            turn_id: "turn-000057".into(),
            commit_hash,
            messages,
            usage,
            applied_context: Vec::new(),
            tool_ops: Vec::new(),
            run_id: Some("run-7f3a".into()),
            revision_after,
            state: Default::default(),
            inputs: Vec::new(),
        }),
    }
}

fn codec(c: &mut Criterion) {
    let record = typical_turn_record();
    let chain = LogChain::plain();
    let prev = chain.genesis();
    let (bytes, _) = encode_record(&record, &prev, &chain, RECORD_BYTES_MAX).expect("encode");
    let body = &bytes[..bytes.len() - annal::codec::HASH_LEN];
    println!("typical TurnCommitted record: {} bytes", bytes.len());

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encode_turn_committed", |b| {
        b.iter(|| encode_record(black_box(&record), &prev, &chain, RECORD_BYTES_MAX).expect("encode"))
    });
    group.bench_function("decode_turn_committed", |b| {
        b.iter(|| decode_record(black_box(&bytes), RECORD_BYTES_MAX).expect("decode"))
    });
    group.bench_function("chain_next_plain", |b| b.iter(|| chain.next(black_box(&prev), black_box(body))));
    let keyed = LogChain::keyed([7; 32]);
    group.bench_function("chain_next_keyed", |b| b.iter(|| keyed.next(black_box(&prev), black_box(body))));
    group.finish();
}

/// A [`MemStore`] with a log cursor: decides commands and folds their events, as the
/// writer does, without a database.
#[derive(Clone)]
struct Folded {
    store: MemStore,
    next_seq: u64,
    limits: Limits,
}

impl Folded {
    fn new() -> Folded {
        Folded { store: MemStore::default(), next_seq: 1, limits: Limits::default() }
    }

    /// Decides `command` and sequences its event, without folding it. Returns the record
    /// and the content objects it introduces: those of the decision that the content-id
    /// index does not hold yet, as the writer computes them.
    fn record(&self, command: &Command) -> (Record, Vec<ContentId>) {
        let Decision::Write { session, event, content } =
            decide(&self.store, command, &self.limits, &annal::Now::at(0)).expect("decide")
        else {
            panic!("command {command:?} writes nothing");
        };
        let mut introduced = Vec::with_capacity(content.len());
        for (id, _) in content {
            if self.store.get(Table::ContentIndex, &id.0).expect("content index").is_none() {
                introduced.push(id);
            }
        }
        let head: Option<SessionHead> = self.store.row(Table::Heads, session.as_bytes()).expect("head");
        let record = Record {
            seq: self.next_seq,
            session,
            stream_seq: head.map_or(0, |h| h.stream_seq) + 1,
            committed_at_ms: 1_750_000_000_000 + self.next_seq,
            event,
        };
        (record, introduced)
    }

    /// Decides and folds `command`; returns its record.
    fn apply(&mut self, command: Command) -> Record {
        let (record, introduced) = self.record(&command);
        evolve(&mut self.store, &record, &introduced, ProjectionSet::all()).expect("evolve");
        self.next_seq += 1;
        record
    }

    fn revision(&self, session: SessionId) -> RevisionId {
        let head: SessionHead = self.store.row(Table::Heads, session.as_bytes()).expect("head").expect("session");
        head.revision
    }
}

fn turn(session: SessionId, n: u64) -> CommitTurn {
    CommitTurn::new(session, format!("turn-{n}"), Expected::Any)
        .message(Message::user(format!("question {n}: what does the build log say about the failing test?")))
        .message(Message::assistant(format!("answer {n}: the failure is in the storage check, line {}", n * 7)))
        .usage("anthropic", "claude", 1_800 + n, 400)
}

/// A store holding one live session of [`SESSION_TURNS`] turns with one pending
/// context key and one unsettled tool call, and one archived session.
fn populated() -> (Folded, SessionId, SessionId) {
    let mut f = Folded::new();
    let session = new_session_id();
    f.apply(Command::CreateSession(
        CreateSession::with_id(session).label("project", "bench").message(Message::system("You are a coding agent.")),
    ));
    for n in 0..SESSION_TURNS {
        f.apply(Command::CommitTurn(turn(session, n)));
    }
    f.apply(Command::AppendContext(AppendContext {
        session,
        key: "memory".into(),
        content: b"the user prefers short answers".to_vec(),
        source: "memory".into(),
    }));
    f.apply(Command::RecordToolCall(tool_call(session, "op-1")));
    let archived = new_session_id();
    f.apply(Command::CreateSession(CreateSession::with_id(archived).message(Message::system("old"))));
    f.apply(Command::Archive { session: archived, reason: "done".into() });
    (f, session, archived)
}

fn tool_call(session: SessionId, op_id: &str) -> RecordToolCall {
    RecordToolCall {
        session,
        op_id: op_id.into(),
        call_id: format!("call-{op_id}"),
        tool_name: "bash".into(),
        args: br#"{"command":"cargo test -p annal"}"#.to_vec(),
        parent_op: None,
        turn_id: None,
        recovery: Recovery::ReplaySafe,
    }
}

/// One command per event kind, each valid against [`populated`].
fn commands(f: &Folded, session: SessionId, archived: SessionId) -> Vec<(&'static str, Command)> {
    let count = 1 + 2 * SESSION_TURNS;
    vec![
        (
            "SessionCreated",
            Command::CreateSession(
                CreateSession::new().label("project", "bench").message(Message::system("You are a coding agent.")),
            ),
        ),
        ("TurnCommitted", Command::CommitTurn(turn(session, 1_000).apply_context("memory"))),
        (
            "TranscriptRewritten",
            Command::Rewrite(Rewrite {
                session,
                expected: f.revision(session),
                start: 1,
                end: count - COMPACTION_KEEP_MESSAGES,
                replacement: vec![Message::system("summary of the earlier conversation")],
                reason: RewriteReason::Compaction,
                note: "compaction".into(),
                actor: "host".into(),
            }),
        ),
        ("SessionArchived", Command::Archive { session, reason: "done".into() }),
        ("SessionRevived", Command::Revive { session: archived, reason: "again".into() }),
        (
            "ContextAppended",
            Command::AppendContext(AppendContext {
                session,
                key: "repo-map".into(),
                content: b"src/ engine/ codec/".to_vec(),
                source: "indexer".into(),
            }),
        ),
        ("ToolCallRecorded", Command::RecordToolCall(tool_call(session, "op-2"))),
        (
            "ToolResultRecorded",
            Command::RecordToolResult(RecordToolResult {
                session,
                op_id: "op-1".into(),
                outcome: ToolOutcome::Ok,
                result: b"test result: ok. 42 passed".to_vec(),
            }),
        ),
        (
            "LabelsChanged",
            Command::SetLabels(SetLabels {
                session,
                set: BTreeMap::from([("stage".to_string(), "review".to_string())]),
                remove: BTreeSet::from(["project".to_string()]),
            }),
        ),
    ]
}

fn evolve_per_kind(c: &mut Criterion) {
    let (f, session, archived) = populated();
    let mut group = c.benchmark_group("evolve");
    group.throughput(Throughput::Elements(1));
    for (kind, command) in commands(&f, session, archived) {
        let (record, introduced) = f.record(&command);
        assert_eq!(record.event.kind().name(), kind);
        group.bench_with_input(BenchmarkId::from_parameter(kind), &record, |b, record| {
            b.iter_batched_ref(
                || f.store.clone(),
                |store| evolve(store, record, &introduced, ProjectionSet::all()).expect("evolve"),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn group_commit(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = Options { durability: Durability::Relaxed, ..Options::default() };
    let engine = Engine::open_with(dir.path().join("micro.redb"), options).expect("open");
    let session =
        engine.create_session(CreateSession::new().message(Message::system("bench"))).expect("create").session;
    let mut n = 0u64;
    let mut next_turns = || {
        (0..BATCH_COMMANDS)
            .map(|_| {
                n += 1;
                Command::CommitTurn(turn(session, n))
            })
            .collect::<Vec<_>>()
    };

    let mut group = c.benchmark_group("group_commit_relaxed");
    group.sample_size(20).measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(BATCH_COMMANDS));
    group.bench_function("batch_of_64_turns", |b| {
        b.iter_batched(&mut next_turns, |commands| engine.batch(commands).expect("batch"), BatchSize::SmallInput)
    });
    group.bench_function("64_turns_one_by_one", |b| {
        b.iter_batched(
            &mut next_turns,
            |commands| {
                for command in commands {
                    engine.execute(command).expect("commit");
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
    engine.close().expect("close");
}

/// Queries on a live engine, as a host calls them from any thread or task: the session's
/// head, and a page of 20 messages of its 39-message transcript. Both read a view of the
/// checkpoint plus the delta at one seq (an MVCC snapshot) and never wait for the writer.
fn queries(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Engine::open(dir.path().join("queries.redb")).expect("open");
    let session = engine
        .create_session(CreateSession::new().message(Message::system("You are a coding agent.")))
        .expect("create")
        .session;
    engine.batch((0..SESSION_TURNS).map(|n| Command::CommitTurn(turn(session, n))).collect()).expect("turns");
    assert_eq!(engine.transcript(session, PageRequest::first(1)).expect("page").total, 1 + 2 * SESSION_TURNS);

    let mut group = c.benchmark_group("query");
    group.throughput(Throughput::Elements(1));
    group.bench_function("head", |b| b.iter(|| engine.head(black_box(session)).expect("head")));
    group.bench_function("transcript_page_20", |b| {
        b.iter(|| engine.transcript(black_box(session), PageRequest::new(10, 20)).expect("page"))
    });
    // The same reads after a checkpoint, with the delta empty.
    engine.checkpoint().expect("checkpoint");
    group.bench_function("head_checkpointed", |b| b.iter(|| engine.head(black_box(session)).expect("head")));
    group.bench_function("transcript_page_20_checkpointed", |b| {
        b.iter(|| engine.transcript(black_box(session), PageRequest::new(10, 20)).expect("page"))
    });
    group.finish();
    engine.close().expect("close");
}

criterion_group!(benches, codec, evolve_per_kind, group_commit, queries);
criterion_main!(benches);
