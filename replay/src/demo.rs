//! `annal demo`: a realistic agent workload through the public API, then an offline
//! rebuild, a deep verify and a summary.
//!
//! Each session plays a coding agent: a system prompt, staged context that later turns
//! apply, turns with token usage, tool calls and their results (one is left unsettled,
//! as after a crash), a compaction, sometimes a restore of the compacted history and a
//! fork that tries another approach, label changes, and archive and revive. Sessions
//! run on several threads at once, so the writer's group commit shows in the durable
//! commit rate.

use crate::inspect::Stats;
use crate::rebuild::{RebuildOptions, RebuildReport};
use crate::verify::{VerifyOptions, VerifyReport};
use crate::{human_bytes, progress, CliError, Result};
use annal::{
    AppendContext, CommitTurn, CreateSession, Engine, Expected, Message, RecordToolCall, RecordToolResult, Recovery,
    Restore, RevisionId, Rewrite, RewriteReason, Role, SessionId, SetLabels, ToolOutcome,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Sessions the demo runs by default.
pub const DEFAULT_SESSIONS: u64 = 64;
/// Client threads at most.
const WORKERS_MAX: u64 = 8;

/// How to run the demo.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Where to write the database; a temporary file when `None`.
    pub db: Option<PathBuf>,
    /// How many top-level sessions to run (forks come on top).
    pub sessions: u64,
    /// Show a progress bar on a terminal.
    pub progress: bool,
}

impl Default for DemoOptions {
    fn default() -> DemoOptions {
        DemoOptions { db: None, sessions: DEFAULT_SESSIONS, progress: false }
    }
}

/// What the demo did.
#[derive(Debug)]
pub struct DemoReport {
    /// The database file.
    pub path: PathBuf,
    /// Whether the file is temporary (removed when the report is dropped).
    pub temporary: bool,
    /// Top-level sessions run.
    pub sessions: u64,
    /// Commands sent through the API.
    pub commands: u64,
    /// Events in the log afterwards.
    pub events: u64,
    /// Wall time of the workload.
    pub workload: Duration,
    /// Client threads.
    pub workers: u64,
    /// What the engine wrote during the workload (log transactions, appended bytes,
    /// checkpoints).
    pub engine: annal::StatsSnapshot,
    /// Bytes this process wrote to storage during the workload (both files, every
    /// checkpoint), from `/proc/self/io`; `None` where the system does not say.
    pub disk_bytes: Option<u64>,
    /// The offline rebuild.
    pub rebuild: RebuildReport,
    /// The deep verify after the rebuild.
    pub verify: VerifyReport,
    /// Storage statistics.
    pub stats: Stats,
    /// The session whose graph is shown.
    pub showcase: SessionId,
    /// Its revision graph as text.
    pub graph: String,
    /// Tool calls with no durable result, across every session (what a host would
    /// resume or cancel after a crash).
    pub unsettled: Vec<annal::ToolOp>,
    /// What the workers of a multi-agent host did: lines of the summary.
    pub hosts: Vec<String>,
    _dir: Option<(crate::interrupt::Scratch, tempfile::TempDir)>,
}

impl DemoReport {
    /// Durable commands per second during the workload.
    pub fn commits_per_sec(&self) -> f64 {
        self.commands as f64 / self.workload.as_secs_f64().max(1e-9)
    }

    /// The summary as text.
    pub fn render(&self) -> String {
        let s = &self.stats;
        let verdict = if self.verify.is_clean() {
            "clean".to_string()
        } else {
            format!("{} FINDINGS", self.verify.findings.len())
        };
        let tables = match &self.verify.deep {
            Some(Ok(n)) => format!(", {n} projection tables byte-identical to a fresh fold"),
            _ => String::new(),
        };
        let mut out = format!(
            "annal demo: {} agent sessions through the public API\n\
             database   {}{}\n\n\
             workload   {} sessions ({} forks), {} commands, {} events in {:.2} s from {} client threads\n\
             \x20          {:.0} durable commits/s: every acknowledged commit was fsynced, group-committed\n\
             \x20          turns with usage, context appends applied by later turns, tool calls and results\n\
             \x20          (one left unsettled, one context pending), compactions, restores, forks, labels, archive, revive\n\
             durable    {} journal frames ({:.1} commits each, one fsync each), {} appended per commit (records and new content);\n\
             \x20          {} absorption{} into the log file behind them, {} checkpoint{} ({} projection rows);\n\
             \x20          {} written to disk per commit, every file included\n\
             rebuild    {} projections refolded: {} events, {} sessions in {:.3} s ({:.0} events/s)\n\
             verify     --deep {verdict}: {} records, chain, content ids, revisions{tables}\n\
             storage    {} file; {} content objects stored once ({}), referenced {} times ({}):\n\
             \x20          dedup saved {}, {:.2} file bytes per logical byte\n\n",
            self.sessions,
            self.path.display(),
            if self.temporary { " (temporary; pass --db PATH to keep it)" } else { "" },
            s.sessions,
            s.sessions.saturating_sub(self.sessions),
            self.commands,
            self.events,
            self.workload.as_secs_f64(),
            self.workers,
            self.commits_per_sec(),
            self.engine.log_commits,
            self.engine.events as f64 / self.engine.log_commits.max(1) as f64,
            human_bytes(self.engine.appended_bytes / self.engine.events.max(1)),
            self.engine.absorptions,
            if self.engine.absorptions == 1 { "" } else { "s" },
            self.engine.checkpoints,
            if self.engine.checkpoints == 1 { "" } else { "s" },
            self.engine.checkpoint_rows,
            self.disk_bytes.map_or("(unknown)".to_string(), |b| human_bytes(b / self.engine.events.max(1))),
            self.rebuild.projections.len(),
            self.rebuild.events,
            self.rebuild.sessions,
            self.rebuild.elapsed.as_secs_f64(),
            self.rebuild.events_per_sec(),
            self.verify.records,
            human_bytes(s.file_bytes),
            s.content_objects,
            human_bytes(s.content_bytes),
            s.content_refs,
            human_bytes(s.referenced_bytes),
            human_bytes(s.dedup_saved_bytes()),
            s.bytes_per_logical_byte(),
        );
        for f in &self.verify.findings {
            out.push_str(&format!("FINDING {f}\n"));
        }
        out.push_str(&format!("unsettled  {} tool call(s) with no durable result:\n", self.unsettled.len()));
        for op in &self.unsettled {
            let recovery = match op.recovery {
                annal::Recovery::ReplaySafe => "safe to run again",
                annal::Recovery::NotReplaySafe => "check before running again",
            };
            out.push_str(&format!(
                "           {} {} (call {}) in session {}, seq {}: {recovery}\n",
                op.op_id, op.tool_name, op.call_id, op.session, op.call_seq
            ));
        }
        for (i, line) in self.hosts.iter().enumerate() {
            out.push_str(if i == 0 { "hosts      " } else { "           " });
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
        out.push_str(&self.graph);
        if !self.temporary {
            let db = self.path.display();
            out.push_str(&format!(
                "\nnext: annal sessions {db} --archived | annal inspect {db} {s} | annal graph {db} {s}\n",
                s = self.showcase
            ));
        }
        out
    }
}

/// A small, deterministic pseudo-random sequence (xorshift), so runs look varied but
/// repeat exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const PROJECTS: [&str; 3] = ["annal", "billing-api", "docs-site"];
const SYSTEM_PROMPT: &str = "You are a careful coding agent. Work in small steps, run the tests, explain each change.";
const STYLE_GUIDE: &str =
    "Style: rustfmt with max_width 120; every public item has a doc comment; no unwrap in library code.";
const TASKS: [&str; 4] = [
    "The test `rebuild_is_idempotent` fails on CI. Find out why and fix it.",
    "Add a `--limit` flag to the export command and document it.",
    "The invoice total is off by one cent for some currencies. Investigate.",
    "Rewrite the getting-started page so a new user succeeds in five minutes.",
];
/// A tiny PNG signature and header: binary content, exported as base64.
const SCREENSHOT: [u8; 24] = [
    0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, b'I', b'H', b'D', b'R', 0, 0, 0, 0x40, 0, 0, 0, 0x30,
];

struct Agent<'a> {
    engine: &'a Engine,
    commands: &'a AtomicU64,
    session: SessionId,
    head: RevisionId,
    rng: Rng,
    turn: u64,
}

impl Agent<'_> {
    fn count(&self) {
        self.commands.fetch_add(1, Ordering::Relaxed);
    }

    fn turn(&mut self, messages: Vec<Message>, tokens_in: u64, apply: &[&str], tools: &[&str]) -> Result<()> {
        self.turn += 1;
        let model = if self.rng.below(4) == 0 { "claude-haiku-4" } else { "claude-sonnet-4" };
        let mut t = CommitTurn::new(self.session, format!("turn-{}", self.turn), Expected::Exact(self.head))
            .usage("anthropic", model, tokens_in + self.rng.below(400), 60 + self.rng.below(600))
            .run_id(format!("run-{}", self.turn.div_ceil(3)));
        if let Some(u) = t.usage.first_mut() {
            u.cache_read = tokens_in / 2;
            u.cache_write = self.rng.below(200);
        }
        for m in messages {
            t = t.message(m);
        }
        for k in apply {
            t = t.apply_context(*k);
        }
        for op in tools {
            t = t.tool_op(*op);
        }
        // The host keeps the model it used last beside the transcript (host state).
        t = t.set_state("model", format!("{{\"provider\":\"anthropic\",\"name\":\"{model}\"}}").into_bytes());
        self.head = self.engine.commit_turn(t)?.receipt().revision;
        self.count();
        Ok(())
    }

    fn context(&self, key: &str, text: &str, source: &str) -> Result<()> {
        let c = AppendContext { session: self.session, key: key.into(), content: text.into(), source: source.into() };
        self.engine.append_context(c)?;
        self.count();
        Ok(())
    }

    fn tool_call(&self, op: &str, tool: &str, args: &str, recovery: Recovery) -> Result<()> {
        self.engine.record_tool_call(RecordToolCall {
            session: self.session,
            op_id: op.into(),
            call_id: format!("toolu_{}", &blake3::hash(format!("{}{op}", self.session).as_bytes()).to_hex()[..16]),
            tool_name: tool.into(),
            args: args.as_bytes().to_vec(),
            parent_op: None,
            turn_id: Some(format!("turn-{}", self.turn)),
            recovery,
        })?;
        self.count();
        Ok(())
    }

    fn tool_result(&self, op: &str, outcome: ToolOutcome, result: &str) -> Result<()> {
        let r = RecordToolResult { session: self.session, op_id: op.into(), outcome, result: result.into() };
        self.engine.record_tool_result(r)?;
        self.count();
        Ok(())
    }
}

/// Runs one agent session; returns its id.
fn run_session(engine: &Engine, commands: &AtomicU64, index: u64) -> Result<SessionId> {
    let project = PROJECTS[(index % 3) as usize];
    let task = TASKS[(index % 4) as usize];
    let created = engine.create_session(
        CreateSession::new()
            .label("project", project)
            .label("agent", "coder")
            .metadata(format!("{{\"host\":\"demo\",\"worker\":{index}}}"))
            .message(Message::system(SYSTEM_PROMPT)),
    )?;
    let mut a = Agent {
        engine,
        commands,
        session: created.session,
        head: created.receipt.revision,
        rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (index + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
        turn: 0,
    };
    a.count();
    a.context("repo-map", &format!("{project}/: src/ tests/ docs/ Cargo.toml README.md"), "indexer")?;
    a.turn(
        vec![Message::user(task), Message::assistant("Let me look at the code and run the tests first.")],
        1800,
        &["repo-map"],
        &[],
    )?;
    a.tool_call("op-1", "bash", r#"{"cmd":"cargo test --workspace 2>&1 | tail -20"}"#, Recovery::ReplaySafe)?;
    a.tool_result("op-1", ToolOutcome::Ok, "test result: FAILED. 41 passed; 1 failed; 0 ignored")?;
    a.turn(
        vec![
            Message::tool("test result: FAILED. 41 passed; 1 failed"),
            Message::new(Role::User, "text/plain", "Here is what I see in the terminal.").with_attachment(SCREENSHOT),
            Message::assistant("One test fails. The assertion compares two digests taken at different times."),
        ],
        2600,
        &[],
        &["op-1"],
    )?;
    a.context("style-guide", STYLE_GUIDE, "project-config")?;
    a.turn(
        vec![Message::user("Keep to the style guide."), Message::assistant("Understood.")],
        3100,
        &["style-guide"],
        &[],
    )?;
    for step in 0..3 {
        let text = format!("Step {}: reading module {} and narrowing down the cause.", step + 1, a.rng.below(90));
        a.turn(vec![Message::assistant(text)], 3400 + step * 500, &[], &[])?;
    }
    a.tool_call("op-2", "edit_file", r#"{"path":"src/lib.rs","patch":"@@ -10 +10 @@"}"#, Recovery::NotReplaySafe)?;
    a.tool_result("op-2", ToolOutcome::Ok, "patched src/lib.rs (1 hunk)")?;
    a.turn(vec![Message::assistant("Fixed: the digest is now taken in the same snapshot.")], 5200, &[], &["op-2"])?;
    let before_compaction = a.head;
    let len = engine.head(a.session)?.map_or(1, |h| h.message_count);
    let rewrite = Rewrite {
        session: a.session,
        expected: a.head,
        start: 1,
        end: len.saturating_sub(1).max(1),
        replacement: vec![Message::system(format!("Summary: investigated '{task}', found the cause, patched it."))],
        reason: RewriteReason::Compaction,
        note: "compact the investigation".into(),
        actor: "host".into(),
    };
    a.head = engine.rewrite(rewrite)?.revision;
    a.count();
    if index.is_multiple_of(3) {
        let restore = Restore {
            session: a.session,
            expected: a.head,
            target: before_compaction,
            note: "the summary lost a detail".into(),
            actor: "user".into(),
        };
        a.head = engine.restore(restore)?.revision;
        a.count();
    }
    a.turn(vec![Message::user("Run the tests again."), Message::assistant("All 42 tests pass.")], 2100, &[], &[])?;
    if index.is_multiple_of(2) {
        let fork = engine.fork_at(a.session, 3)?;
        a.count();
        let rng = Rng(a.rng.next());
        let mut f = Agent { engine, commands, session: fork.session, head: fork.receipt.revision, rng, turn: 100 };
        f.turn(vec![Message::user("Try a different approach: revert and add a retry.")], 1900, &[], &[])?;
    }
    if index == 0 {
        // The host "crashes" between recording the call and its result.
        a.tool_call("op-3", "bash", r#"{"cmd":"git push origin fix"}"#, Recovery::NotReplaySafe)?;
        a.context("review-notes", "Reviewer: please also cover the empty-log case.", "code-review")?;
    }
    let mut set = BTreeMap::new();
    set.insert("status".to_string(), "done".to_string());
    engine.set_labels(SetLabels { session: a.session, set, remove: Default::default() })?;
    a.count();
    if index % 4 == 1 {
        engine.archive(a.session, "task finished")?;
        a.count();
        if index % 8 == 1 {
            engine.revive(a.session, "follow-up question from the user")?;
            a.count();
        }
    }
    Ok(a.session)
}

/// What the workload did.
struct Workload {
    commands: u64,
    showcase: SessionId,
    elapsed: Duration,
    workers: u64,
    engine: annal::StatsSnapshot,
    disk_bytes: Option<u64>,
}

/// Bytes this process has written to storage, from `/proc/self/io` (Linux).
pub fn process_write_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines().find_map(|l| l.strip_prefix("write_bytes:")).and_then(|v| v.trim().parse().ok())
}

/// Runs the workload on `path`.
fn workload(path: &Path, sessions: u64, show_progress: bool) -> Result<Workload> {
    let written_before = process_write_bytes();
    let engine = Engine::open(path)?;
    let commands = AtomicU64::new(0);
    let next = AtomicU64::new(0);
    let workers = sessions.clamp(1, WORKERS_MAX);
    let bar = progress::bar(sessions, "demo", show_progress);
    let started = Instant::now();
    let results: Vec<Result<Vec<(u64, SessionId)>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= sessions {
                            return Ok(mine);
                        }
                        mine.push((i, run_session(&engine, &commands, i)?));
                        bar.inc(1);
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(CliError::finding("a demo worker panicked"))))
            .collect()
    });
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let mut showcase = None;
    for r in results {
        for (i, s) in r? {
            if i == 0 {
                showcase = Some(s);
            }
        }
    }
    let probe = engine.clone();
    engine.close()?;
    let written = process_write_bytes().zip(written_before).map(|(after, before)| after.saturating_sub(before));
    let showcase = showcase.ok_or_else(|| CliError::usage("the demo needs at least one session"))?;
    Ok(Workload {
        commands: commands.load(Ordering::Relaxed),
        showcase,
        elapsed,
        workers,
        engine: probe.stats(),
        disk_bytes: written,
    })
}

/// Runs the demo: workload, rebuild, deep verify, statistics and a revision graph.
pub fn demo(opts: &DemoOptions) -> Result<DemoReport> {
    if opts.sessions == 0 {
        return Err(CliError::usage("--sessions must be at least 1"));
    }
    let (dir, path) = match &opts.db {
        Some(p) => {
            if p.exists() {
                return Err(CliError::usage(format!("{} exists; the demo writes a new database", p.display())));
            }
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
                return Err(CliError::usage(format!("{}: no such directory for the demo's database", dir.display())));
            }
            (None, p.clone())
        }
        None => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("demo.redb");
            (Some((crate::interrupt::Scratch::new(dir.path()), dir)), path)
        }
    };
    let Workload { commands, showcase, elapsed, workers, engine, disk_bytes } =
        workload(&path, opts.sessions, opts.progress)?;
    let hosts = hosts(&path)?;
    let rebuild = crate::rebuild::rebuild(&path, &RebuildOptions { progress: opts.progress, ..Default::default() })?;
    let verify =
        crate::verify::verify(&path, &VerifyOptions { deep: true, progress: opts.progress, ..Default::default() })?;
    let reader = crate::open_reader(&path, None)?;
    let stats = crate::inspect::stats(&reader, &path)?;
    let graph = crate::graph::text(&reader.graph(showcase)?);
    let unsettled = reader.unsettled_all(annal::PageRequest::first(100))?.items;
    Ok(DemoReport {
        temporary: dir.is_some(),
        path,
        sessions: opts.sessions,
        commands,
        events: stats.events,
        workload: elapsed,
        workers,
        engine,
        disk_bytes,
        rebuild,
        verify,
        stats,
        showcase,
        graph,
        unsettled,
        hosts,
        _dir: dir,
    })
}

/// Two workers of a multi-agent host share one session through its execution lease:
/// the first stalls past its lease, the second takes over with a larger token, and the
/// first one's late commit is fenced and writes nothing.
fn hosts(path: &Path) -> Result<Vec<String>> {
    let engine = Engine::open(path)?;
    let session = engine.create_session(CreateSession::new().label("demo", "workers"))?.session;
    let ttl = Duration::from_millis(50);
    let first = engine.acquire_lease(session, "worker-a", ttl)?;
    let a = engine.fenced(first.fence());
    let turn = CommitTurn::new(session, "a-1", Expected::Any).message(Message::user("plan the migration"));
    a.commit_turn(turn)?;
    // worker-a stalls (a long tool call, a GC pause) past its lease.
    std::thread::sleep(ttl + Duration::from_millis(10));
    let second = engine.acquire_lease(session, "worker-b", Duration::from_secs(30))?;
    let b = engine.fenced(second.fence());
    let turn = CommitTurn::new(session, "b-1", Expected::Any).message(Message::assistant("migration planned"));
    b.commit_turn(turn)?;
    let tip = engine.tip()?.0;
    let late = CommitTurn::new(session, "a-2", Expected::Any).message(Message::assistant("stale answer"));
    let fenced = match a.commit_turn(late) {
        Err(annal::Error::Rejected(annal::Rejection::Fenced { presented, current })) => {
            format!("fenced (token {presented} < {current}), nothing written: tip stays at seq {}", engine.tip()?.0)
        }
        other => return Err(CliError::finding(format!("a stale worker's commit was not fenced: {other:?}"))),
    };
    if engine.tip()?.0 != tip {
        return Err(CliError::finding("a fenced commit moved the log"));
    }
    // The user types twice while the session is idle; worker-b drains the inbox into
    // its next turn.
    engine.enqueue_input(session, "in-1", Message::user("add a rollback step"), annal::InputKind::NextTurn)?;
    engine.enqueue_input(session, "in-2", Message::user("and estimate the time"), annal::InputKind::NextTurn)?;
    let queued = engine.pending_inputs(session)?.len();
    let claim = b.claim_inputs(annal::ClaimInputs {
        session,
        token: second.token,
        owner: second.owner.clone(),
        target: annal::ClaimTarget::NextTurn,
        ttl_ms: 30_000,
        max: 10,
    })?;
    let mut drain = CommitTurn::new(session, "b-2", Expected::Any)
        .message(Message::user("add a rollback step; and estimate the time"))
        .message(Message::assistant("rollback added; about two hours"));
    for id in &claim.inputs {
        drain = drain.consumes(id.clone());
    }
    b.commit_turn(drain)?;
    let open = engine.inbox(session)?.len();
    b.release_lease(&second)?;
    engine.close()?;
    let mut lines = vec![
        format!(
            "lease: worker-a took token {}, committed, then stalled past its {} ms lease",
            first.token,
            ttl.as_millis()
        ),
        format!("worker-b took over with token {} and committed; worker-a's late commit was {fenced}", second.token),
        format!(
            "inbox: {queued} inputs queued while the session was idle; worker-b claimed {} under its lease and its \
             turn b-2 consumed them in its own commit: {open} left open",
            claim.inputs.len()
        ),
    ];
    lines.extend(draft_crash()?);
    Ok(lines)
}

/// A model's answer streams into a draft on a simulated disk; the power goes mid-stream;
/// the reopened engine lists the draft as abandoned with every segment up to the last
/// flush; the host resumes it and commits the turn that finalizes it.
fn draft_crash() -> Result<Vec<String>> {
    use annal::fault::disk::SimDisk;
    let disk = SimDisk::new(7);
    // No flush by the interval: only the explicit one counts, so the outcome is exact.
    let options = annal::Options { draft_flush_interval: Duration::from_secs(3600), ..annal::Options::default() };
    let open = || Engine::open_with_backends(disk.file("log"), disk.file("projections"), options.clone());
    let engine = open()?;
    let session = engine.create_session(CreateSession::new().message(Message::user("how do we migrate?")))?;
    let streamed = ["The migration ", "takes three ", "steps: ", "first, "];
    for (i, segment) in streamed.iter().enumerate() {
        engine.append_draft(session.session, "answer", *segment)?;
        if i == 2 {
            engine.flush_drafts()?;
        }
    }
    disk.lose_power();
    drop(engine);
    disk.forget_detached();
    let engine = open()?;
    let abandoned = engine.abandoned_drafts().to_vec();
    let Some(found) = abandoned.first() else {
        return Err(CliError::finding("the flushed draft did not survive the power loss"));
    };
    let text: String = engine
        .draft(found.session, &found.draft_id, 0, u64::MAX)
        .map(|d| d.segments.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect())
        .unwrap_or_default();
    engine.append_draft(session.session, "answer", "back up, then copy, then switch.")?;
    let full: String = streamed[..3].concat() + "back up, then copy, then switch.";
    let turn = CommitTurn::new(session.session, "answer", Expected::Exact(session.receipt.revision))
        .message(Message::assistant(full))
        .finalizes("answer");
    engine.commit_turn(turn)?;
    let left = engine.drafts(session.session, u64::MAX).len();
    engine.close()?;
    Ok(vec![
        format!("draft: {} segments streamed, 3 flushed, then the power went (a simulated disk)", streamed.len()),
        format!(
            "the reopened engine lists draft {:?} as abandoned with {} segments ({text:?})",
            found.draft_id, found.segments
        ),
        format!("the host resumed it and committed the turn that finalizes it: {left} drafts left"),
    ])
}
