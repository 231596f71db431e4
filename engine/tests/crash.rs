//! Crash loop (SPEC S15, invariant 4): every acknowledged commit survives `kill -9`, and
//! nothing unacknowledged is ever half-visible.
//!
//! Each test re-executes its own test binary as a child process (selected by the
//! `ANNAL_CRASH_DB` environment variable, with `--exact <test name>`). The child opens the
//! database with the default, durable options and commits turns, rewrites, restores and
//! tool operations, and queued inputs that turns claim and consume under the session's
//! lease, from several threads, printing one `ACK` line per acknowledged event
//! to stdout, flushed. The parent kills it with SIGKILL after a seeded random delay,
//! reopens the same file (so history grows from kill to kill) and checks:
//!
//! - every acknowledged event is in the log at its seq, for its session, with its revision
//!   or tool operation;
//! - every batch of tool calls or results the child sent (it prints a `SENT` line naming
//!   each operation and its content before it sends the batch) is whole in the log, its
//!   events at consecutive seqs in the batch's order, or not there at all, whether it was
//!   acknowledged or not;
//! - the log is dense from 1 to the tip, every chain link verifies (the pages come through
//!   `events()`, and the chain is recomputed from re-encoded records), and the meta tip is
//!   the last record's hash;
//! - per-session stream sequences are dense, every referenced content object is stored;
//! - every session head equals the fold of its events and the chain over its transcript
//!   pages, and the unsettled tool list is exactly the calls without a durable result;
//! - `rebuild(ProjectionSet::all())` reproduces the projections byte for byte.
//!
//! The checkpoint tests (`kill_during_checkpoints*`) open most children with an eager
//! checkpoint policy (a checkpoint every 2 events and every millisecond), so that kills
//! land in every phase of a checkpoint: while the checkpointer folds, writes or commits
//! the projections file. One child in four never checkpoints before it is killed, runs
//! longer than the others, and leaves its whole run as an unflushed delta. The parent
//! verifies a copy of the files, so the next child's open finds what the kill left and
//! recovers it (folds the log past the last checkpoint); the early kills of these tests
//! wait until the child starts to open and then kill it within a few milliseconds, while
//! it opens the files and recovers.

use annal::codec::{content_id, encode_record, LogChain};
use annal::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set in the child: the database path. Its presence selects child mode.
const ENV_DB: &str = "ANNAL_CRASH_DB";
/// Set in the child: the workload seed.
const ENV_SEED: &str = "ANNAL_CRASH_SEED";
/// Set in the child: `mixed` or `tools`.
const ENV_MODE: &str = "ANNAL_CRASH_MODE";
/// Set in the child: its checkpoint policy, `default`, `eager` or `lazy`.
const ENV_POLICY: &str = "ANNAL_CRASH_POLICY";

/// The line the child prints just before it opens the database.
const OPENING: &str = "OPENING";

/// The line the child prints once the database is open and recovered, followed by the
/// events its open folded and how long that took, in microseconds.
const READY: &str = "READY";
/// Writer threads in the child, so that group commits carry several callers.
const CHILD_THREADS: u64 = 3;
/// Kills in the default run.
const KILLS_DEFAULT: u64 = 50;
/// Kills in the long, ignored run.
const KILLS_LONG: u64 = 1000;
/// Longest random delay between the child reporting ready and the kill.
const KILL_DELAY_MS_MAX: u64 = 80;
/// Every this many kills, the child is killed without waiting for it to be ready, so that
/// some kills land while it opens (and recovers) the database.
const KILL_EARLY_EVERY: u64 = 7;
/// In the checkpoint tests, an early kill comes this long at most after the child says it
/// is opening the database.
const KILL_OPENING_DELAY_US_MAX: u64 = 20_000;
/// In the checkpoint tests, one child in this many never checkpoints before the kill.
const LAZY_CHILD_EVERY: u64 = 4;
/// Longest random delay between a child that never checkpoints reporting ready and the
/// kill: longer than the others', so that it leaves a larger delta to recover.
const KILL_DELAY_LAZY_MS_MAX: u64 = 250;
/// How long a child may take to open the database before the test gives up on it.
const CHILD_READY_WAIT: Duration = Duration::from_secs(120);
/// Events per `events()` page when reading the log back.
const PAGE_EVENTS: u64 = 1000;
/// Items per page for the other paged queries.
const PAGE_ITEMS: u64 = 500;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Turns, compactions, restores and tool operations.
    Mixed,
    /// Mostly tool calls and results, in all-or-nothing batches.
    Tools,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Mixed => "mixed",
            Mode::Tools => "tools",
        }
    }
}

/// A child's checkpoint policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    /// [`CheckpointPolicy::default`].
    Default,
    /// A checkpoint every 2 events and every millisecond: the checkpointer is nearly
    /// always folding, writing or committing.
    Eager,
    /// No checkpoint before the kill: the whole run is an unflushed delta, which the next
    /// open folds from the log.
    Lazy,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Default => "default",
            Policy::Eager => "eager",
            Policy::Lazy => "lazy",
        }
    }

    fn from_name(name: &str) -> Policy {
        match name {
            "eager" => Policy::Eager,
            "lazy" => Policy::Lazy,
            _ => Policy::Default,
        }
    }

    fn checkpoint(self) -> CheckpointPolicy {
        match self {
            Policy::Default => CheckpointPolicy::default(),
            Policy::Eager => {
                CheckpointPolicy { events: 2, interval: Duration::from_millis(1), ..CheckpointPolicy::default() }
            }
            Policy::Lazy => CheckpointPolicy {
                events: u64::MAX,
                delta_bytes: u64::MAX,
                interval: Duration::from_secs(3600),
                ..CheckpointPolicy::default()
            },
        }
    }
}

/// How a kill loop checkpoints and verifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Checkpoints {
    /// Children use the default policy; the parent verifies the database itself, and its
    /// open recovers what the kill left.
    Default,
    /// Children mostly checkpoint eagerly, now and then never; the parent verifies a
    /// copy, so the next child's open recovers what the kill left, and early kills land
    /// during that open.
    Eager,
}

// ---------------------------------------------------------------------------------------
// Child side
// ---------------------------------------------------------------------------------------

/// Prints one acknowledged event. The line is complete and flushed before the next
/// command is sent, so the parent treats exactly the complete lines as acknowledged.
fn ack(kind: &str, seq: u64, session: SessionId, what: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ACK {kind} {seq} {session} {what}").and_then(|_| out.flush()).expect("write ack");
}

/// Prints a batch of tool calls (`T1`) or results (`T2`) before it is sent, flushed:
/// `SENT <kind> <session> <op>=<content id> ...`, the content being the call's arguments
/// or the result. A batch whose line is complete may have landed, acknowledged or not.
fn sent(kind: &str, session: SessionId, ops: &[(&str, &[u8])]) {
    let ops: Vec<String> = ops.iter().map(|(op, bytes)| format!("{op}={}", content_id(bytes).to_hex())).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "SENT {kind} {session} {}", ops.join(" ")).and_then(|_| out.flush()).expect("write sent");
}

fn ack_rev(receipt: &Receipt, session: SessionId) {
    ack("REV", receipt.seq, session, &receipt.revision.to_hex());
}

fn tool_call(session: SessionId, op_id: &str, parent: Option<String>, rng: &mut Rng) -> RecordToolCall {
    RecordToolCall {
        session,
        op_id: op_id.to_string(),
        call_id: format!("call-{op_id}"),
        tool_name: ["bash", "read_file", "search"][rng.below(3) as usize].to_string(),
        args: format!("{{\"op\":\"{op_id}\",\"n\":{}}}", rng.below(1000)).into_bytes(),
        parent_op: parent,
        turn_id: None,
        recovery: if rng.below(2) == 0 { Recovery::ReplaySafe } else { Recovery::NotReplaySafe },
    }
}

fn tool_result(session: SessionId, op_id: &str, rng: &mut Rng) -> RecordToolResult {
    let outcome = [ToolOutcome::Ok, ToolOutcome::Error, ToolOutcome::Cancelled][rng.below(3) as usize];
    RecordToolResult {
        session,
        op_id: op_id.to_string(),
        outcome,
        result: format!("result of {op_id}: {}", rng.next()).into_bytes(),
    }
}

fn tool_seq(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::Tool { created: true, seq: Some(seq) } => *seq,
        other => panic!("expected a new tool event, got {other:?}"),
    }
}

/// One writer thread's session and what it knows about it.
struct Worker {
    engine: Engine,
    rng: Rng,
    tag: String,
    session: SessionId,
    head: RevisionId,
    /// Every revision the session held, with its length.
    held: Vec<(RevisionId, u64)>,
    /// Tool calls without a result yet.
    open_ops: Vec<String>,
    ops: u64,
    /// The session's execution lease, once the worker has claimed inputs.
    lease: Option<Lease>,
}

impl Worker {
    fn start(engine: Engine, seed: u64, tag: String) -> Worker {
        let created = engine
            .create_session(
                CreateSession::new().label("crash", "loop").message(Message::system(format!("session {tag}"))),
            )
            .expect("create session");
        ack_rev(&created.receipt, created.session);
        let head = created.receipt.revision;
        Worker {
            engine,
            rng: Rng::new(seed),
            tag,
            session: created.session,
            head,
            held: vec![(head, 1)],
            open_ops: Vec::new(),
            ops: 0,
            lease: None,
        }
    }

    fn len(&self) -> u64 {
        self.held.iter().rev().find(|(r, _)| *r == self.head).map_or(0, |(_, l)| *l)
    }

    fn moved(&mut self, receipt: &Receipt, len: u64) {
        ack_rev(receipt, self.session);
        self.head = receipt.revision;
        self.held.push((self.head, len));
    }

    fn turn(&mut self, i: u64) {
        let mut turn = CommitTurn::new(self.session, format!("turn-{}-{i}", self.tag), Expected::Exact(self.head))
            .message(Message::user(format!("question {i} from {}", self.tag)))
            .message(Message::assistant(format!("answer {i}: {}", self.rng.next())))
            .usage("anthropic", "claude", 100 + self.rng.below(100), self.rng.below(50));
        if !self.open_ops.is_empty() && self.rng.below(3) == 0 {
            turn = turn.tool_op(self.open_ops[0].clone());
        }
        let receipt = match self.engine.commit_turn(turn).expect("commit turn") {
            TurnOutcome::Committed(r) => r,
            other => panic!("a fresh turn id was already committed: {other:?}"),
        };
        let len = self.len() + 2;
        self.moved(&receipt, len);
    }

    fn compact(&mut self, i: u64) {
        let len = self.len();
        let end = 1 + self.rng.below(len - 1);
        let rewrite = Rewrite {
            session: self.session,
            expected: self.head,
            start: 0,
            end,
            replacement: vec![Message::system(format!("summary {i} of {} by {}", end, self.tag))],
            reason: RewriteReason::Compaction,
            note: format!("compaction {i}"),
            actor: "crash-test".into(),
        };
        let receipt = self.engine.rewrite(rewrite).expect("compaction");
        self.moved(&receipt, len - end + 1);
    }

    fn restore(&mut self, i: u64) {
        let candidates: Vec<(RevisionId, u64)> = self.held.iter().copied().filter(|(r, _)| *r != self.head).collect();
        let (target, len) = candidates[self.rng.below(candidates.len() as u64) as usize];
        let restore = Restore {
            session: self.session,
            expected: self.head,
            target,
            note: format!("restore {i}"),
            actor: "crash-test".into(),
        };
        let receipt = self.engine.restore(restore).expect("restore");
        assert_eq!(receipt.revision, target, "a restore lands on the target's id");
        self.moved(&receipt, len);
    }

    fn next_op(&mut self) -> String {
        self.ops += 1;
        format!("op-{}-{}", self.tag, self.ops)
    }

    /// T1 alone; settles it at once half of the time.
    fn tool(&mut self) {
        let op = self.next_op();
        let call = tool_call(self.session, &op, None, &mut self.rng);
        let seq = self.engine.record_tool_call(call).expect("T1").seq.expect("T1 writes");
        ack("T1", seq, self.session, &op);
        if self.rng.below(2) == 0 {
            self.settle_one(op);
        } else {
            self.open_ops.push(op);
        }
    }

    fn settle_one(&mut self, op: String) {
        let result = tool_result(self.session, &op, &mut self.rng);
        let seq = self.engine.record_tool_result(result).expect("T2").seq.expect("T2 writes");
        ack("T2", seq, self.session, &op);
    }

    fn settle_oldest(&mut self) {
        if !self.open_ops.is_empty() {
            let op = self.open_ops.remove(0);
            self.settle_one(op);
        }
    }

    /// Several T1s in one all-or-nothing batch, the later ones nested under the first.
    fn tool_batch(&mut self) {
        let n = 1 + self.rng.below(4);
        let ops: Vec<String> = (0..n).map(|_| self.next_op()).collect();
        let calls: Vec<RecordToolCall> = ops
            .iter()
            .enumerate()
            .map(|(k, op)| {
                let parent = (k > 0 && self.rng.below(2) == 0).then(|| ops[0].clone());
                tool_call(self.session, op, parent, &mut self.rng)
            })
            .collect();
        sent("T1", self.session, &calls.iter().map(|c| (c.op_id.as_str(), c.args.as_slice())).collect::<Vec<_>>());
        let commands = calls.into_iter().map(Command::RecordToolCall).collect();
        let outcomes = self.engine.batch(commands).expect("T1 batch");
        for (op, outcome) in ops.iter().zip(&outcomes) {
            ack("T1", tool_seq(outcome), self.session, op);
        }
        self.open_ops.extend(ops);
    }

    /// Results for a random number of the open calls, in one batch.
    fn settle_batch(&mut self) {
        if self.open_ops.is_empty() {
            return;
        }
        let n = 1 + self.rng.below(self.open_ops.len() as u64);
        let ops: Vec<String> = self.open_ops.drain(..n as usize).collect();
        let results: Vec<RecordToolResult> =
            ops.iter().map(|op| tool_result(self.session, op, &mut self.rng)).collect();
        sent("T2", self.session, &results.iter().map(|r| (r.op_id.as_str(), r.result.as_slice())).collect::<Vec<_>>());
        let commands = results.into_iter().map(Command::RecordToolResult).collect();
        let outcomes = self.engine.batch(commands).expect("T2 batch");
        for (op, outcome) in ops.iter().zip(&outcomes) {
            ack("T2", tool_seq(outcome), self.session, op);
        }
    }

    fn step_mixed(&mut self, i: u64) {
        match self.rng.below(11) {
            0..=4 => self.turn(i),
            5 if self.len() >= 4 => self.compact(i),
            6 if self.held.len() >= 2 => self.restore(i),
            7 => self.tool(),
            8 => self.settle_oldest(),
            9 => self.tool_batch(),
            10 => self.inbox(i),
            _ => self.turn(i),
        }
    }

    /// Queues an input; now and then claims what is queued under the session's lease and
    /// commits the turn that consumes it.
    fn inbox(&mut self, i: u64) {
        let id = format!("in-{}-{i}", self.tag);
        let message = Message::user(format!("input {i} from {}", self.tag));
        let seq = self.engine.enqueue_input(self.session, &id, message, InputKind::NextTurn).expect("enqueue");
        ack("IN", seq.expect("a fresh input writes"), self.session, &id);
        if self.rng.below(2) == 0 {
            return;
        }
        let lease = match &self.lease {
            Some(lease) => lease.clone(),
            None => {
                let lease =
                    self.engine.acquire_lease(self.session, &self.tag, Duration::from_secs(3600)).expect("lease");
                self.lease = Some(lease.clone());
                lease
            }
        };
        let claim = ClaimInputs {
            session: self.session,
            token: lease.token,
            owner: lease.owner.clone(),
            target: ClaimTarget::NextTurn,
            ttl_ms: 3_600_000,
            max: 8,
        };
        let claim = self.engine.fenced(lease.fence()).claim_inputs(claim).expect("claim");
        let mut turn = CommitTurn::new(self.session, format!("drain-{}-{i}", self.tag), Expected::Exact(self.head))
            .message(Message::user(format!("{} queued inputs", claim.inputs.len())))
            .message(Message::assistant(format!("answered {}", self.rng.next())));
        for input in claim.inputs {
            turn = turn.consumes(input);
        }
        let receipt = self.engine.fenced(lease.fence()).commit_turn(turn).expect("drain").receipt();
        let len = self.len() + 2;
        self.moved(&receipt, len);
    }

    fn step_tools(&mut self, i: u64) {
        match self.rng.below(10) {
            0..=3 => self.tool_batch(),
            4..=6 => self.settle_batch(),
            7 => self.tool(),
            8 => self.settle_oldest(),
            _ => self.turn(i),
        }
    }
}

/// A host recovering from a crash settles what the previous run left unsettled.
fn settle_leftovers(engine: &Engine, rng: &mut Rng) {
    loop {
        let page = engine.unsettled_all(PageRequest::first(PAGE_ITEMS)).expect("unsettled_all");
        if page.items.is_empty() {
            return;
        }
        for op in page.items {
            let result = RecordToolResult {
                session: op.session,
                op_id: op.op_id.clone(),
                outcome: ToolOutcome::Cancelled,
                result: format!("cancelled after a crash: {}", rng.next()).into_bytes(),
            };
            let seq = engine.record_tool_result(result).expect("settle leftover").seq.expect("T2 writes");
            ack("T2", seq, op.session, &op.op_id);
        }
    }
}

/// The parent holds the write end of the child's stdin. When the parent goes away
/// without killing the child (it panicked, or was killed itself), stdin reaches end of
/// file and the child exits instead of writing forever.
fn exit_when_orphaned() {
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        std::process::exit(3);
    });
}

/// Prints a line of its own (libtest may have printed the test's name without a newline).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n{line}").and_then(|_| out.flush()).expect("write to the parent");
}

/// Runs the workload until killed.
fn child_main(path: &str) -> ! {
    exit_when_orphaned();
    let seed: u64 = std::env::var(ENV_SEED).expect("seed").parse().expect("numeric seed");
    let mode = if std::env::var(ENV_MODE).as_deref() == Ok("tools") { Mode::Tools } else { Mode::Mixed };
    let policy = Policy::from_name(&std::env::var(ENV_POLICY).unwrap_or_default());
    say(OPENING);
    let options = Options { checkpoint: policy.checkpoint(), ..Options::default() };
    let engine = Engine::open_with(path, options).expect("child opens the database");
    let mut rng = Rng::new(seed);
    settle_leftovers(&engine, &mut rng);
    let stats = engine.stats();
    say(&format!("{READY} {} {}", stats.recovered_events, stats.recovery_us));
    let threads: Vec<_> = (0..CHILD_THREADS)
        .map(|t| {
            let engine = engine.clone();
            let thread_seed = rng.next();
            std::thread::spawn(move || {
                let mut worker = Worker::start(engine, thread_seed, format!("{seed:x}-{t}"));
                for i in 0.. {
                    match mode {
                        Mode::Mixed => worker.step_mixed(i),
                        Mode::Tools => worker.step_tools(i),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker thread panicked");
    }
    unreachable!("workers loop until the process is killed")
}

// ---------------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------------

/// An event the child acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Acked {
    Revision(SessionId, RevisionId),
    ToolCall(SessionId, String),
    ToolResult(SessionId, String),
    Input(SessionId, String),
}

fn parse_ack(line: &str) -> Option<(u64, Acked)> {
    let mut parts = line.trim_end().split(' ');
    if parts.next()? != "ACK" {
        return None;
    }
    let kind = parts.next()?;
    let seq: u64 = parts.next()?.parse().ok()?;
    let session: SessionId = parts.next()?.parse().ok()?;
    let what = parts.next()?;
    let acked = match kind {
        "REV" => Acked::Revision(session, what.parse().ok()?),
        "T1" => Acked::ToolCall(session, what.to_string()),
        "T2" => Acked::ToolResult(session, what.to_string()),
        "IN" => Acked::Input(session, what.to_string()),
        _ => return None,
    };
    Some((seq, acked))
}

/// A batch of tool calls (`T1`) or results (`T2`) a child sent: its session, and each
/// operation with the content id of its arguments or result.
#[derive(Clone, Debug)]
struct Sent {
    kind: String,
    session: SessionId,
    ops: Vec<(String, ContentId)>,
    /// Whether the child that sent it acknowledged any of its events. Only that child
    /// settles the batch's operations until it is killed (operation ids name the child),
    /// so an acknowledgement of the same kind for one of them is the batch's own.
    acked: bool,
}

fn parse_sent(line: &str) -> Option<Sent> {
    let mut parts = line.trim_end().split(' ');
    if parts.next()? != "SENT" {
        return None;
    }
    let kind = parts.next().filter(|k| ["T1", "T2"].contains(k))?.to_string();
    let session: SessionId = parts.next()?.parse().ok()?;
    let ops = parts
        .map(|op| {
            let (op, id) = op.split_once('=')?;
            Some((op.to_string(), id.parse().ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Sent { kind, session, ops, acked: false })
}

/// Complete lines from the child's stdout, as they arrive. A line cut short by the kill
/// has no newline and is dropped: it was never acknowledged to anybody.
fn spawn_line_reader(stdout: impl Read + Send + 'static) -> (mpsc::Receiver<String>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) if buf.last() == Some(&b'\n') => {
                    if tx.send(String::from_utf8_lossy(&buf).into_owned()).is_err() {
                        return;
                    }
                }
                Ok(_) => return,
            }
        }
    });
    (rx, handle)
}

/// This test binary. `/proc/self/exe` still names it when a rebuild has replaced the file
/// on disk during a long run.
fn test_binary() -> PathBuf {
    let proc_exe = PathBuf::from("/proc/self/exe");
    if proc_exe.exists() {
        proc_exe
    } else {
        std::env::current_exe().expect("test binary")
    }
}

fn spawn_child(test_name: &str, path: &Path, seed: u64, mode: Mode, policy: Policy) -> Child {
    Process::new(test_binary())
        .args(["--exact", test_name, "--nocapture", "--include-ignored", "--test-threads", "1"])
        .env(ENV_DB, path)
        .env(ENV_SEED, seed.to_string())
        .env(ENV_MODE, mode.name())
        .env(ENV_POLICY, policy.name())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child")
}

fn child_stderr(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    err
}

/// The events and microseconds of the open's recovery, if `line` is the ready line.
fn parse_ready(line: &str) -> Option<(u64, u64)> {
    let mut words = line.split_whitespace();
    if words.next()? != READY {
        return None;
    }
    Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
}

/// What one child did before its kill.
struct Killed {
    /// The events it acknowledged.
    acked: Vec<(u64, Acked)>,
    /// The batches of tool events it sent.
    sent: Vec<Sent>,
    /// Whether it had started to open the database.
    opening: bool,
    /// Events its open folded, and how long that took in microseconds, if it got as far
    /// as ready.
    recovered: Option<(u64, u64)>,
}

/// Waits for the child's line that satisfies `wanted`, collecting the lines before it.
fn wait_for_line(
    child: &mut Child,
    lines: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    wanted: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + CHILD_READY_WAIT;
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(wait) {
            Ok(line) if wanted(&line) => return line,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("child never became ready: {}", child_stderr(child));
            }
        }
    }
}

/// Runs one child until the kill and returns what it did.
fn run_and_kill(test_name: &str, path: &Path, rng: &mut Rng, iteration: u64, mode: Mode, ckpt: Checkpoints) -> Killed {
    let policy = match ckpt {
        Checkpoints::Default => Policy::Default,
        Checkpoints::Eager if rng.below(LAZY_CHILD_EVERY) == 0 => Policy::Lazy,
        Checkpoints::Eager => Policy::Eager,
    };
    let mut child = spawn_child(test_name, path, rng.next(), mode, policy);
    let (lines, reader) = spawn_line_reader(child.stdout.take().expect("stdout"));
    let mut seen = Vec::new();
    let early = iteration % KILL_EARLY_EVERY == KILL_EARLY_EVERY - 1;
    if !early {
        let ready = wait_for_line(&mut child, &lines, &mut seen, |l| parse_ready(l).is_some());
        seen.push(ready);
        let max = if policy == Policy::Lazy { KILL_DELAY_LAZY_MS_MAX } else { KILL_DELAY_MS_MAX };
        std::thread::sleep(Duration::from_millis(rng.below(max + 1)));
    } else if ckpt == Checkpoints::Eager {
        let opening = wait_for_line(&mut child, &lines, &mut seen, |l| l.trim() == OPENING);
        seen.push(opening);
        std::thread::sleep(Duration::from_micros(rng.below(KILL_OPENING_DELAY_US_MAX + 1)));
    } else {
        std::thread::sleep(Duration::from_millis(rng.below(KILL_DELAY_MS_MAX + 1)));
    }
    if let Some(status) = child.try_wait().expect("try_wait") {
        panic!("child exited by itself with {status}: {}", child_stderr(&mut child));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    reader.join().expect("reader thread");
    seen.extend(lines.try_iter());
    let acked: Vec<(u64, Acked)> = seen.iter().filter_map(|l| parse_ack(l)).collect();
    let acked_ops: BTreeSet<(&str, SessionId, &str)> = acked
        .iter()
        .filter_map(|(_, a)| match a {
            Acked::ToolCall(s, op) => Some(("T1", *s, op.as_str())),
            Acked::ToolResult(s, op) => Some(("T2", *s, op.as_str())),
            _ => None,
        })
        .collect();
    let sent = seen
        .iter()
        .filter_map(|l| parse_sent(l))
        .map(|batch| {
            let acked = batch.ops.iter().any(|(op, _)| acked_ops.contains(&(batch.kind.as_str(), batch.session, op)));
            Sent { acked, ..batch }
        })
        .collect();
    Killed {
        acked,
        sent,
        opening: seen.iter().any(|l| l.trim() == OPENING),
        recovered: seen.iter().find_map(|l| parse_ready(l)),
    }
}

fn all_events(engine: &Engine) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let page = engine
            .events(EventQuery { from_seq: from, max_events: PAGE_EVENTS, max_bytes: 64 << 20 })
            .expect("every event page reads and verifies");
        out.extend(page.events);
        if !page.has_more {
            return out;
        }
        from = page.next_seq;
    }
}

fn all_sessions(engine: &Engine) -> Vec<SessionHead> {
    let mut out = Vec::new();
    loop {
        let q = ListQuery::new().include_archived().page(out.len() as u64, PAGE_ITEMS);
        let page = engine.list_sessions(&q).expect("list sessions");
        out.extend(page.items);
        if !page.has_more {
            return out;
        }
    }
}

fn all_unsettled(engine: &Engine) -> BTreeSet<(SessionId, String)> {
    let mut out = BTreeSet::new();
    let mut offset = 0;
    loop {
        let page = engine.unsettled_all(PageRequest::new(offset, PAGE_ITEMS)).expect("unsettled_all");
        offset += page.items.len() as u64;
        for op in page.items {
            assert_eq!(op.state, ToolState::Prepared, "an unsettled op is prepared");
            assert!(out.insert((op.session, op.op_id)), "an op is listed once");
        }
        if !page.has_more {
            return out;
        }
    }
}

/// What the log says about one session.
#[derive(Default)]
struct Folded {
    stream_seq: u64,
    last_seq: u64,
    revision: Option<RevisionId>,
}

/// Checks the log itself: dense, chained, tip in meta. Returns the per-session fold and
/// the tool calls that have no durable result.
/// Content objects are checked for the records after `content_checked` (earlier ones were
/// checked after an earlier kill, and the chain covers their records since).
fn check_log(
    engine: &Engine,
    events: &[StoredEvent],
    content_checked: u64,
) -> (HashMap<SessionId, Folded>, BTreeSet<(SessionId, String)>) {
    let (tip_seq, tip_hash) = engine.tip().expect("tip");
    assert_eq!(events.len() as u64, tip_seq, "the log holds exactly the records up to the tip");
    let chain = LogChain::plain();
    let mut prev = chain.genesis();
    let mut sessions: HashMap<SessionId, Folded> = HashMap::new();
    let mut open_ops = BTreeSet::new();
    let mut clock = 0;
    for (i, ev) in events.iter().enumerate() {
        let r = &ev.record;
        assert_eq!(r.seq, i as u64 + 1, "global sequence is dense");
        let (_, hash) = encode_record(r, &prev, &chain, u64::MAX).expect("re-encode");
        assert_eq!(hash, ev.chain_hash, "chain hash of seq {} recomputes", r.seq);
        prev = hash;
        assert!(r.committed_at_ms >= clock, "commit clock never goes back (seq {})", r.seq);
        clock = r.committed_at_ms;
        let s = sessions.entry(r.session).or_default();
        s.stream_seq += 1;
        assert_eq!(r.stream_seq, s.stream_seq, "stream sequence of {} is dense at seq {}", r.session, r.seq);
        s.last_seq = r.seq;
        if let Some(rev) = r.event.revision_after() {
            s.revision = Some(rev);
        }
        match &r.event {
            Event::ToolCallRecorded(e) => assert!(open_ops.insert((r.session, e.op_id.clone())), "T1 recorded once"),
            Event::ToolResultRecorded(e) => {
                assert!(open_ops.remove(&(r.session, e.op_id.clone())), "T2 at seq {} has its T1 before it", r.seq)
            }
            _ => {}
        }
        for id in r.event.content_refs().into_iter().filter(|_| r.seq > content_checked) {
            assert!(engine.content(id).expect("content verifies").is_some(), "content of seq {} is stored", r.seq);
        }
    }
    assert_eq!(prev, tip_hash, "the meta tip is the last record's chain hash");
    (sessions, open_ops)
}

fn check_acked(events: &[StoredEvent], acked: &BTreeMap<u64, Acked>) {
    for (seq, a) in acked {
        let ev = events.get((*seq - 1) as usize).unwrap_or_else(|| panic!("acknowledged seq {seq} was lost"));
        let r = &ev.record;
        match a {
            Acked::Revision(session, rev) => {
                assert_eq!(r.session, *session, "seq {seq} session");
                assert_eq!(r.event.revision_after(), Some(*rev), "seq {seq} revision");
            }
            Acked::ToolCall(session, op) => {
                assert_eq!(r.session, *session, "seq {seq} session");
                assert!(matches!(&r.event, Event::ToolCallRecorded(e) if e.op_id == *op), "seq {seq} is T1 of {op}");
            }
            Acked::ToolResult(session, op) => {
                assert_eq!(r.session, *session, "seq {seq} session");
                assert!(matches!(&r.event, Event::ToolResultRecorded(e) if e.op_id == *op), "seq {seq} is T2 of {op}");
            }
            Acked::Input(session, id) => {
                assert_eq!(r.session, *session, "seq {seq} session");
                assert!(matches!(&r.event, Event::InputEnqueued(e) if e.input_id == *id), "seq {seq} queues {id}");
            }
        }
    }
}

/// What [`check_batches`] found of the batches the children sent.
#[derive(Clone, Copy, Debug, Default)]
struct Batches {
    /// Whole in the log, none of their events acknowledged.
    landed_unacked: u64,
    /// Not in the log at all.
    absent: u64,
}

/// Every batch of tool events a child sent is whole in the log, its events at
/// consecutive seqs in the batch's order, or not there at all, and then none of its
/// events was acknowledged. An event belongs to a batch by its kind, session, operation
/// and content: a later child settles what a lost batch of results left open with
/// results of its own.
fn check_batches(events: &[StoredEvent], sent: &[Sent]) -> Batches {
    let mut logged: HashMap<(&str, SessionId, &str), (u64, ContentId)> = HashMap::new();
    for ev in events {
        let r = &ev.record;
        let (key, id) = match &r.event {
            Event::ToolCallRecorded(e) => (("T1", r.session, e.op_id.as_str()), e.args),
            Event::ToolResultRecorded(e) => (("T2", r.session, e.op_id.as_str()), e.result),
            _ => continue,
        };
        assert!(logged.insert(key, (r.seq, id)).is_none(), "{key:?} is in the log once");
    }
    let mut found = Batches::default();
    for batch in sent {
        let seqs: Vec<Option<u64>> = batch
            .ops
            .iter()
            .map(|(op, id)| {
                let logged = logged.get(&(batch.kind.as_str(), batch.session, op.as_str()));
                logged.filter(|(_, logged_id)| logged_id == id).map(|(seq, _)| *seq)
            })
            .collect();
        match seqs[0] {
            None => {
                assert!(seqs.iter().all(Option::is_none), "{batch:?} is partly in the log: {seqs:?}");
                assert!(!batch.acked, "{batch:?} was acknowledged and is not in the log");
                found.absent += 1;
            }
            Some(first) => {
                let whole: Vec<Option<u64>> = (first..).take(seqs.len()).map(Some).collect();
                assert_eq!(seqs, whole, "{batch:?} is not whole at consecutive seqs in the log");
                found.landed_unacked += u64::from(!batch.acked);
            }
        }
    }
    found
}

/// Every head equals the log's fold and the chain over its own transcript pages.
fn check_heads(engine: &Engine, folded: &HashMap<SessionId, Folded>) {
    let heads = all_sessions(engine);
    assert_eq!(heads.len(), folded.len(), "one head per session in the log");
    for head in heads {
        let f = folded.get(&head.session).expect("listed session is in the log");
        assert_eq!(Some(head.revision), f.revision, "head of {} is the last revision in its log", head.session);
        assert_eq!(head.stream_seq, f.stream_seq, "head stream seq of {}", head.session);
        assert_eq!(head.last_seq, f.last_seq, "head last seq of {}", head.session);
        let mut chain = RevisionId::empty();
        let mut offset = 0;
        loop {
            let page = engine.transcript(head.session, PageRequest::new(offset, PAGE_ITEMS)).expect("transcript");
            assert_eq!(page.total, head.message_count, "transcript length of {}", head.session);
            for m in &page.messages {
                assert_eq!(m.position, offset, "transcript positions are dense");
                chain = chain.extend(&m.content_id);
                assert_eq!(m.chain, chain, "stored chain at {} of {}", m.position, head.session);
                offset += 1;
            }
            if !page.has_more {
                break;
            }
        }
        assert_eq!(offset, head.message_count, "every transcript row is readable");
        assert_eq!(chain, head.revision, "head of {} is the chain over its transcript", head.session);
    }
}

fn verify_after_kill(path: &Path, acked: &BTreeMap<u64, Acked>, sent: &[Sent], content_checked: u64) -> (u64, Batches) {
    let engine = Engine::open(path).expect("reopen after kill");
    let events = all_events(&engine);
    let (folded, open_ops) = check_log(&engine, &events, content_checked);
    check_acked(&events, acked);
    let batches = check_batches(&events, sent);
    check_heads(&engine, &folded);
    assert_eq!(all_unsettled(&engine), open_ops, "unsettled list is exactly the calls with no durable result");
    let live = engine.projection_digests().expect("digests");
    engine.rebuild(ProjectionSet::all()).expect("rebuild");
    assert_eq!(engine.projection_digests().expect("digests"), live, "rebuild reproduces the live projections");
    engine.close().expect("close");
    (events.len() as u64, batches)
}

/// Verifies a copy of the database and its projections file as the kill left them, and
/// leaves the originals alone for the next child to recover.
fn verify_copy_after_kill(
    path: &Path,
    acked: &BTreeMap<u64, Acked>,
    sent: &[Sent],
    content_checked: u64,
) -> (u64, Batches) {
    let dir = tempfile::tempdir_in(path.parent().expect("a directory")).expect("tempdir");
    let copy = dir.path().join("copy.redb");
    for (from, to) in annal::database_files(path).iter().zip(annal::database_files(&copy)) {
        if from.exists() {
            std::fs::copy(from, to).expect("copy a file of the database");
        }
    }
    verify_after_kill(&copy, acked, sent, content_checked)
}

fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("crash.redb")
}

/// What the children's opens did, over a kill loop.
#[derive(Default)]
struct Opens {
    /// Children that got as far as ready.
    ready: u64,
    /// Of those, the ones whose open folded events past the last checkpoint.
    recovering: u64,
    /// Events folded by those opens, and the most one open folded.
    recovered_events: u64,
    recovered_events_max: u64,
    /// The longest recovery, in microseconds.
    recovery_us_max: u64,
    /// Children killed after they started to open the database and before they were
    /// ready (during the open, its recovery, or the settling of leftover tool calls).
    killed_opening: u64,
}

impl Opens {
    fn count(&mut self, killed: &Killed) {
        match killed.recovered {
            Some((events, us)) => {
                self.ready += 1;
                self.recovering += u64::from(events > 0);
                self.recovered_events += events;
                self.recovered_events_max = self.recovered_events_max.max(events);
                self.recovery_us_max = self.recovery_us_max.max(us);
            }
            None => self.killed_opening += u64::from(killed.opening),
        }
    }
}

/// Kills a child `kills` times on one database file and verifies after every kill.
fn kill_loop(test_name: &str, mode: Mode, ckpt: Checkpoints, kills: u64, seed: u64) {
    if let Ok(path) = std::env::var(ENV_DB) {
        child_main(&path);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let mut rng = Rng::new(seed);
    let mut acked: BTreeMap<u64, Acked> = BTreeMap::new();
    let mut sent: Vec<Sent> = Vec::new();
    let mut batches = Batches::default();
    let mut opens = Opens::default();
    let mut tip = 0;
    for iteration in 0..kills {
        let killed = run_and_kill(test_name, &path, &mut rng, iteration, mode, ckpt);
        opens.count(&killed);
        for (seq, a) in killed.acked {
            if let Some(before) = acked.insert(seq, a.clone()) {
                panic!("seq {seq} acknowledged twice: {before:?} and {a:?}");
            }
        }
        sent.extend(killed.sent);
        let (now, found) = match ckpt {
            Checkpoints::Default => verify_after_kill(&path, &acked, &sent, tip),
            Checkpoints::Eager => verify_copy_after_kill(&path, &acked, &sent, tip),
        };
        batches = found;
        assert!(now >= tip, "the log never shrinks ({tip} -> {now})");
        tip = now;
        if (iteration + 1) % 100 == 0 {
            eprintln!("{test_name}: {} kills, log tip {tip}", iteration + 1);
        }
    }
    assert!(!acked.is_empty(), "the children acknowledged commits before being killed");
    eprintln!(
        "{test_name}: {kills} kills, {} acknowledged events, log tip {tip}; {} batches of tool events sent, \
         {} of them in the log unacknowledged, {} not in the log; {} children ready, {} of whose \
         opens folded {} events past the last checkpoint (at most {} in one open; longest recovery {} us); \
         {} killed while opening",
        acked.len(),
        sent.len(),
        batches.landed_unacked,
        batches.absent,
        opens.ready,
        opens.recovering,
        opens.recovered_events,
        opens.recovered_events_max,
        opens.recovery_us_max,
        opens.killed_opening,
    );
    if ckpt == Checkpoints::Eager {
        assert!(opens.recovering > 0, "some child's open folded the log past the last checkpoint");
    }
    if mode == Mode::Tools {
        assert!(batches.landed_unacked > 0, "some kill left a batch in the log that was never acknowledged");
    }
}

#[test]
fn kill_during_mixed_workload() {
    kill_loop("kill_during_mixed_workload", Mode::Mixed, Checkpoints::Default, KILLS_DEFAULT, 0x5eed_0001);
}

#[test]
fn kill_during_tool_batches() {
    kill_loop("kill_during_tool_batches", Mode::Tools, Checkpoints::Default, KILLS_DEFAULT, 0x5eed_0002);
}

#[test]
fn kill_during_checkpoints() {
    kill_loop("kill_during_checkpoints", Mode::Mixed, Checkpoints::Eager, KILLS_DEFAULT, 0x5eed_0005);
}

#[test]
#[ignore = "long: 1,000 kills; run with --ignored"]
fn kill_during_mixed_workload_long() {
    kill_loop("kill_during_mixed_workload_long", Mode::Mixed, Checkpoints::Default, KILLS_LONG, 0x5eed_0003);
}

#[test]
#[ignore = "long: 1,000 kills; run with --ignored"]
fn kill_during_tool_batches_long() {
    kill_loop("kill_during_tool_batches_long", Mode::Tools, Checkpoints::Default, KILLS_LONG, 0x5eed_0004);
}

#[test]
#[ignore = "long: 1,000 kills; run with --ignored"]
fn kill_during_checkpoints_long() {
    kill_loop("kill_during_checkpoints_long", Mode::Mixed, Checkpoints::Eager, KILLS_LONG, 0x5eed_0006);
}
