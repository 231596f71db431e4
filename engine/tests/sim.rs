//! Deterministic simulation: one seed drives a whole schedule (a workload of every
//! command kind from several logical clients, checkpoints, power losses, process
//! crashes, failing I/O calls and reopens) against an engine whose log and projections
//! files live on the simulated disk of [`annal::fault::disk`], and the reference model
//! of `model/reference.rs` says what must be there after every reopen.
//!
//! Everything runs from this thread: the clients' commands are issued one at a time
//! (a client's several commands as one `Command::Batch` when the generator says so),
//! and neither the checkpoint policy nor the drafts' flush interval fires by itself, so
//! the engine's threads do their I/O in one order, and the I/O calls, which the disk counts, are the same for a seed at
//! every run. (Commit times come from the model's manual clock; they are also learned from the
//! log, as in the model test, and they change no I/O call.)
//!
//! After every reopen:
//! - every acknowledged commit is present, with the outcome the model gave it;
//! - the one command that was in flight when the power went or an I/O call failed is
//!   either absent or present whole, exactly as the model applies it;
//! - the log is dense, every chain link recomputes from the records, and the meta tip
//!   is the last record's hash; every stored object reads back and hashes to its id;
//! - every session's head agrees with the model (and, at some reopens and at the end,
//!   every query does);
//! - the projections (checkpoint plus whatever the open folded) equal a rebuild from
//!   the log;
//! - redb's own integrity check passes on both files.
//!
//! `cargo test -p annal --test sim` runs [`SEEDS_DEFAULT`] seeds. `SIM_SEEDS=n` runs `n`
//! seeds, `SIM_FIRST=s` starts at seed `s`, `SIM_SEED=s` runs that one seed (with its
//! schedule printed), and the ignored `simulation_long` runs for `SIM_MINUTES` minutes
//! (default 10). A failing seed prints the one command that replays it.

#[allow(dead_code)] // the model tests use the rest
#[path = "model/check.rs"]
mod check;
#[allow(dead_code)] // the model test uses the rest
#[path = "model/ops.rs"]
mod ops;
#[path = "model/reference.rs"]
mod reference;

use annal::codec::{encode_record, LogChain};
use annal::fault::disk::{IoKind, SimDisk, SimRng};
use annal::*;
use check::{compare_all, events_agree, learn_clock, ok, same, sessions, Checked};
use ops::{in_universe, limits, resolve, AtOpen, History, Op, Policy};
use proptest::strategy::{BoxedStrategy, Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use reference::{carried_content, Model};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Seeds of the default run.
const SEEDS_DEFAULT: u64 = 500;
/// The first seed of the default run.
const FIRST_SEED: u64 = 1;
/// Steps of one seed's schedule at most.
const STEPS_MAX: u64 = 40;
/// Logical clients at most.
const CLIENTS_MAX: u64 = 3;
/// I/O calls ahead at most where an armed fault or power loss lands.
const ARM_CALLS_MAX: u64 = 80;
/// Opens in a row that may be faulted before the disk is left alone.
const FAULTED_OPENS_MAX: u32 = 3;

const LOG: &str = "log";
const PROJECTIONS: &str = "projections";
const JOURNAL: [&str; 2] = ["journal.0", "journal.1"];

fn fail(what: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(what.to_string())
}

/// A fresh session id the seed fixes: the generators make UUIDv7 ids, which differ at
/// every run.
fn pinned_id(n: u64) -> SessionId {
    let mut bytes = [0xd5; 16];
    bytes[8..].copy_from_slice(&n.to_be_bytes());
    SessionId(bytes)
}

/// Replaces every fresh session id in `command` with a pinned one (the same id for the
/// same fresh id).
fn pin_ids(command: &mut Command, map: &mut BTreeMap<SessionId, SessionId>) {
    let mut pin = |s: &mut SessionId| {
        if in_universe(s) || s.0[..8] == [0xd5; 8] {
            return;
        }
        let next = pinned_id(map.len() as u64);
        *s = *map.entry(*s).or_insert(next);
    };
    match command {
        Command::Batch(members) => members.iter_mut().for_each(|m| pin_ids(m, map)),
        Command::CreateSession(c) => pin(&mut c.session),
        Command::Fork(f) => {
            pin(&mut f.parent);
            pin(&mut f.session);
        }
        Command::CommitTurn(c) => pin(&mut c.session),
        Command::Rewrite(c) => pin(&mut c.session),
        Command::Restore(c) => pin(&mut c.session),
        Command::Archive { session, .. } | Command::Revive { session, .. } => pin(session),
        Command::AppendContext(c) => pin(&mut c.session),
        Command::RecordToolCall(c) => pin(&mut c.session),
        Command::RecordToolResult(c) => pin(&mut c.session),
        Command::SetLabels(c) => pin(&mut c.session),
        Command::SetMetadata(c) => pin(&mut c.session),
        Command::SetHostState(c) => pin(&mut c.session),
        Command::AcquireLease(c) => pin(&mut c.session),
        Command::RenewLease(c) => pin(&mut c.session),
        Command::ReleaseLease { session, .. } => pin(session),
        Command::AppendDraft(c) => pin(&mut c.session),
        Command::DiscardDraft { session, .. } => pin(session),
        Command::EnqueueInput(c) => pin(&mut c.session),
        Command::ClaimInputs(c) => pin(&mut c.session),
        Command::AbandonClaim { session, .. } | Command::CancelInput { session, .. } => pin(session),
        Command::Fenced { fence, command } => {
            pin(&mut fence.session);
            pin_ids(command, map);
        }
    }
}

/// One logical client: its own history of turns (for retries) and the command it sent
/// and never heard back about.
#[derive(Default)]
struct Client {
    history: History,
    unacked: Option<Command>,
}

/// What one seed did.
#[derive(Clone, Debug, Default)]
struct Stats {
    commands: u64,
    acked_writes: u64,
    checkpoints: u64,
    power_losses: u64,
    torn_writes: u64,
    faults: u64,
    kills: u64,
    clean_reopens: u64,
    failed_opens: u64,
    unacked_present: u64,
    unacked_absent: u64,
    projections_recreated: u64,
    log_creation_lost: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.commands += o.commands;
        self.acked_writes += o.acked_writes;
        self.checkpoints += o.checkpoints;
        self.power_losses += o.power_losses;
        self.torn_writes += o.torn_writes;
        self.faults += o.faults;
        self.kills += o.kills;
        self.clean_reopens += o.clean_reopens;
        self.failed_opens += o.failed_opens;
        self.unacked_present += o.unacked_present;
        self.unacked_absent += o.unacked_absent;
        self.projections_recreated += o.projections_recreated;
        self.log_creation_lost += o.log_creation_lost;
    }
}

/// How the engine went down before a reopen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Down {
    /// `Engine::close`: everything flushed.
    Clean,
    /// The process died: every write survives.
    Kill,
    /// The power went: only what was synced survives for sure.
    PowerLoss,
    /// The power already went (an armed power loss fired): nothing more to do.
    Gone,
}

struct Sim {
    seed: u64,
    rng: SimRng,
    disk: SimDisk,
    runner: TestRunner,
    ops: BoxedStrategy<Op>,
    options: Options,
    model: Model,
    clients: Vec<Client>,
    ids: BTreeMap<SessionId, SessionId>,
    never_stored: BTreeSet<ContentId>,
    /// Projections images saved at clean closes, with the log seq each holds.
    saved: Vec<(Vec<u8>, u64)>,
    stats: Stats,
    verbose: bool,
    /// Whether an open of the log file has succeeded (its creation is durable).
    log_created: bool,
    /// Whether an open has succeeded since the projections file was last deleted.
    projections_created: bool,
    /// Opens the last [`Sim::open`] took (a fault or a power loss can interrupt one).
    open_attempts: u32,
}

/// Runs `f` with the disk's counting and faults paused.
fn paused<T>(disk: &SimDisk, f: impl FnOnce() -> T) -> T {
    disk.pause(true);
    let out = f();
    disk.pause(false);
    out
}

impl Sim {
    fn new(seed: u64, verbose: bool) -> Sim {
        let mut rng = SimRng::new(seed);
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let runner = TestRunner::new_with_rng(
            Config { failure_persistence: None, ..Config::default() },
            TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
        );
        let model = Model::new(limits());
        let options = Options {
            limits: limits(),
            clock: std::sync::Arc::new(model.time.clone()),
            durability: Durability::Durable,
            multi_process_readers: rng.chance(1, 2),
            compression: [annal::Compression::Lz4, annal::Compression::Zstd, annal::Compression::Off]
                [(seed % 3) as usize],
            cache_bytes: 1 << 20,
            checkpoint: Policy::Lazy.checkpoint(),
            // Frames land in place in the zeros, and past them the files grow.
            journal_preallocate_bytes: [0, 4096, 64 << 10][(seed % 3) as usize],
            // Drafts go with the next commit or at close, never by the clock: a flush
            // by the wall clock would be one more frame, or not, as the machine's load
            // spaced the steps, and a seed would not replay the same I/O.
            draft_flush_interval: std::time::Duration::from_secs(3600),
            ..Options::default()
        };
        let clients = (0..1 + rng.below(CLIENTS_MAX)).map(|_| Client::default()).collect();
        Sim {
            seed,
            disk: SimDisk::new(rng.next_u64()),
            rng,
            runner,
            ops: ops::op().boxed(),
            options,
            model,
            clients,
            ids: BTreeMap::new(),
            never_stored: BTreeSet::new(),
            saved: Vec::new(),
            stats: Stats::default(),
            verbose,
            log_created: false,
            projections_created: false,
            open_attempts: 0,
        }
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.verbose {
            eprintln!("[seed {}] {}", self.seed, what());
        }
    }

    fn open_once(&self) -> annal::Result<Engine> {
        let journal = [self.disk.file(JOURNAL[0]), self.disk.file(JOURNAL[1])];
        Engine::open_with_journal(self.disk.file(LOG), self.disk.file(PROJECTIONS), journal, self.options.clone())
    }

    /// Opens the engine, now and then with a fault or a power loss armed inside the open;
    /// an open that fails or loses power is retried after a power loss.
    fn open(&mut self) -> Checked<Engine> {
        let mut faulted = 0;
        self.open_attempts = 0;
        loop {
            self.open_attempts += 1;
            if faulted < FAULTED_OPENS_MAX && self.rng.chance(1, 4) {
                faulted += 1;
                if self.rng.chance(1, 2) {
                    self.disk.fail_call(self.rng.below(ARM_CALLS_MAX));
                } else {
                    self.disk.lose_power_at_call(self.rng.below(ARM_CALLS_MAX));
                }
            }
            let opened = self.open_once();
            self.disk.disarm();
            let fired = self.disk.take_fired();
            let lost = self.disk.take_power_loss();
            match (opened, fired, lost) {
                (Ok(engine), None, None) => {
                    self.log_created = true;
                    self.projections_created = true;
                    return Ok(engine);
                }
                (Err(e), None, None) => {
                    // A file whose creation a power loss cut short is no database (its
                    // length reached the disk, its header did not). `Engine::open` deletes
                    // and recreates such a projections file; with backends, the harness
                    // does it. A log file is only excused before its first open succeeded.
                    let mut excused = false;
                    if !opens(self.disk.image(PROJECTIONS).unwrap_or_default()) {
                        if self.projections_created {
                            return Err(fail(format!("a projections file that opened before no longer opens: {e:?}")));
                        }
                        self.disk.set_image(PROJECTIONS, Vec::new());
                        self.stats.projections_recreated += 1;
                        excused = true;
                    }
                    if !self.log_created && !opens(self.disk.image(LOG).unwrap_or_default()) {
                        self.disk.set_image(LOG, Vec::new());
                        self.stats.log_creation_lost += 1;
                        excused = true;
                    }
                    if !excused {
                        return Err(fail(format!("open failed with no fault: {e:?}")));
                    }
                    self.log(|| format!("open failed on a file whose creation was cut short: {e:?}"));
                }
                (opened, fired, lost) => {
                    self.log(|| format!("open interrupted: fault {fired:?}, power loss {lost:?}"));
                    if let Some(f) = &fired {
                        self.stats.faults += 1;
                        if opened.is_ok() && matches!(f.kind, IoKind::Write) {
                            // A failed write inside an open must fail the open.
                            return Err(fail(format!("an open succeeded through a failed write: {f:?}")));
                        }
                    }
                    if opened.is_err() {
                        self.stats.failed_opens += 1;
                    }
                    if lost.is_none() {
                        self.power_loss();
                    }
                    drop(opened);
                    self.disk.forget_detached();
                }
            }
        }
    }

    fn power_loss(&mut self) {
        let loss = self.disk.lose_power();
        self.stats.power_losses += 1;
        self.stats.torn_writes += loss.torn;
        self.log(|| format!("power loss: {loss:?}"));
    }

    fn next_op(&mut self) -> Op {
        let tree = self.ops.new_tree(&mut self.runner).expect("the generators never reject");
        tree.current()
    }

    fn run(&mut self) -> Checked<Stats> {
        let mut engine = self.open()?;
        let first = ops::valid_create().new_tree(&mut self.runner).expect("generate").current();
        engine = self.command(engine, 0, &first, 0)?;
        let steps = STEPS_MAX / 2 + self.rng.below(STEPS_MAX / 2);
        for step in 0..steps {
            let client = self.rng.below(self.clients.len() as u64) as usize;
            engine = match self.rng.below(100) {
                0..=4 => {
                    self.disk.fail_call(self.rng.below(ARM_CALLS_MAX));
                    self.log(|| format!("step {step}: fault armed"));
                    engine
                }
                5..=9 => {
                    self.disk.lose_power_at_call(self.rng.below(ARM_CALLS_MAX));
                    self.log(|| format!("step {step}: power loss armed"));
                    engine
                }
                10..=11 => self.reopen(engine, Down::PowerLoss, None, &format!("step {step}: power loss"))?,
                12..=13 => self.reopen(engine, Down::Kill, None, &format!("step {step}: kill"))?,
                14..=21 => self.checkpoint(engine, step)?,
                22..=31 if self.clients[client].unacked.is_some() => {
                    let command = self.clients[client].unacked.take().expect("checked");
                    self.log(|| format!("step {step}: client {client} retries"));
                    self.execute(engine, client, command, step)?
                }
                _ => {
                    let op = self.next_op();
                    self.command(engine, client, &op, step)?
                }
            };
        }
        self.disk.disarm();
        let down = [Down::Clean, Down::Kill, Down::PowerLoss][self.rng.below(3) as usize];
        let engine = self.reopen(engine, down, None, "at the end")?;
        paused(&self.disk, || compare_all(&engine, &self.model, &self.never_stored, "at the end"))?;
        engine.close().map_err(fail)?;
        Ok(self.stats.clone())
    }

    /// Runs one generated operation for `client`.
    fn command(&mut self, engine: Engine, client: usize, op: &Op, step: u64) -> Checked<Engine> {
        match op {
            Op::Check => {
                paused(&self.disk, || compare_all(&engine, &self.model, &self.never_stored, "at a check"))?;
                Ok(engine)
            }
            Op::Checkpoint => self.checkpoint(engine, step),
            Op::Reopen { projections, .. } => self.reopen(engine, Down::Clean, Some(*projections), "a clean reopen"),
            Op::Advance { ms } => {
                self.model.time.advance(u64::from(*ms));
                Ok(engine)
            }
            op => {
                let mut command = resolve(op, &self.model, &self.clients[client].history);
                pin_ids(&mut command, &mut self.ids);
                self.execute(engine, client, command, step)
            }
        }
    }

    fn checkpoint(&mut self, engine: Engine, step: u64) -> Checked<Engine> {
        let result = engine.checkpoint();
        self.stats.checkpoints += 1;
        if let Some(down) = self.interrupted() {
            self.log(|| format!("step {step}: checkpoint interrupted: {result:?}"));
            let engine = self.reopen(engine, down, None, "after an interrupted checkpoint")?;
            return Ok(engine);
        }
        ok(result, "checkpoint")?;
        same(paused(&self.disk, || engine.stats().delta_bytes), 0, "delta bytes after a checkpoint")?;
        Ok(engine)
    }

    /// Whether a fault fired or the power went since the last look, and if so how the
    /// engine must go down: a power loss after a fault (what an fsync that failed left
    /// on the disk is unknown), nothing more after a power loss.
    fn interrupted(&mut self) -> Option<Down> {
        let fired = self.disk.take_fired();
        let lost = self.disk.take_power_loss();
        if fired.is_some() {
            self.stats.faults += 1;
        }
        if let Some(l) = &lost {
            self.stats.power_losses += 1;
            self.stats.torn_writes += l.torn;
        }
        self.log(|| format!("interrupted: fault {fired:?}, power loss {lost:?}"));
        match (fired, lost) {
            (_, Some(_)) => Some(Down::Gone),
            (Some(_), None) => Some(Down::PowerLoss),
            (None, None) => None,
        }
    }

    fn execute(&mut self, engine: Engine, client: usize, command: Command, step: u64) -> Checked<Engine> {
        self.stats.commands += 1;
        let got = engine.execute(command.clone());
        let fired = self.disk.take_fired();
        let lost = self.disk.take_power_loss();
        if fired.is_none() && lost.is_none() {
            paused(&self.disk, || -> Checked {
                learn_clock(&engine, &mut self.model)?;
                let want = self.model.apply(&command).map_err(Error::Rejected);
                same(&got, &want, format_args!("step {step}: {command:#?}"))?;
                if want.as_ref().is_ok_and(Outcome::wrote) {
                    self.stats.acked_writes += 1;
                }
                self.clients[client].history.record(&command, want.as_ref().ok());
                if want.is_err() {
                    self.never_stored.extend(carried_content(&command));
                }
                Ok(())
            })?;
            return Ok(engine);
        }
        self.log(|| format!("step {step}: command interrupted ({fired:?}, {lost:?}): {got:?}"));
        if let (Some(f), None) = (&fired, &lost) {
            if matches!(f.kind, IoKind::Write | IoKind::Sync) && got.as_ref().is_ok_and(Outcome::wrote) {
                return Err(fail(format!("a command was acknowledged through a failed {:?}: {got:?}", f.kind)));
            }
        }
        if fired.is_some() {
            self.stats.faults += 1;
        }
        if let Some(l) = &lost {
            self.stats.power_losses += 1;
            self.stats.torn_writes += l.torn;
        }
        self.clients[client].history.record(&command, None);
        self.clients[client].unacked = Some(command.clone());
        let down = if lost.is_some() { Down::Gone } else { Down::PowerLoss };
        let engine = self.reopen(engine, down, Some(AtOpen::Keep), "after an interrupted command")?;
        self.settle(engine, Some(command))
    }

    /// Brings the engine down as `down` says and opens it again, then checks it. With
    /// `AtOpen::Keep` from [`Sim::execute`], the check of the unacknowledged command is
    /// left to the caller.
    fn reopen(&mut self, engine: Engine, down: Down, at_open: Option<AtOpen>, when: &str) -> Checked<Engine> {
        self.disk.disarm();
        let mut folded = None;
        match down {
            Down::Clean => {
                paused(&self.disk, || engine.close()).map_err(fail)?;
                self.stats.clean_reopens += 1;
                let file = self.disk.image(PROJECTIONS).unwrap_or_default();
                folded = Some(match at_open.unwrap_or(AtOpen::Keep) {
                    AtOpen::Keep => 0,
                    AtOpen::Delete => {
                        self.disk.set_image(PROJECTIONS, Vec::new());
                        self.projections_created = false;
                        self.model.seq
                    }
                    AtOpen::Stale(_) if self.saved.is_empty() => 0,
                    AtOpen::Stale(n) => {
                        let (old, seq) = self.saved[n as usize % self.saved.len()].clone();
                        self.disk.set_image(PROJECTIONS, old);
                        self.model.seq - seq
                    }
                });
                self.saved.push((file, self.model.seq));
            }
            Down::Kill => {
                self.disk.kill();
                self.stats.kills += 1;
                drop(engine);
            }
            Down::PowerLoss => {
                self.power_loss();
                drop(engine);
            }
            Down::Gone => drop(engine),
        }
        self.disk.forget_detached();
        // Lease renewals lived in the writer's memory.
        self.model.renewals.clear();
        self.log(|| format!("{when}: reopen after {down:?}"));
        let engine = self.open()?;
        if at_open == Some(AtOpen::Keep) && down != Down::Clean {
            // From `execute`: the caller settles the unacknowledged command first.
            return Ok(engine);
        }
        // An interrupted open may have folded (and checkpointed) part of it already.
        if let Some(folded) = folded.filter(|_| self.open_attempts == 1) {
            let recovered = engine.stats().recovered_events;
            same(recovered, folded, format_args!("{when}: events folded at open"))?;
        }
        self.settle(engine, None)
    }

    /// After a reopen: decides whether the unacknowledged command is there (whole) or
    /// not, then checks everything.
    fn settle(&mut self, engine: Engine, unacked: Option<Command>) -> Checked<Engine> {
        let disk = self.disk.clone();
        disk.pause(true);
        let result = self.settle_paused(&engine, unacked);
        disk.pause(false);
        result.map(|()| engine)
    }

    fn settle_paused(&mut self, engine: &Engine, unacked: Option<Command>) -> Checked {
        let (tip, _) = ok(engine.tip(), "tip")?;
        if tip != self.model.seq {
            let Some(command) = unacked.as_ref() else {
                return Err(fail(format!(
                    "after a reopen the log tip is {tip}, but {} events were acknowledged and none was in flight",
                    self.model.seq
                )));
            };
            let mut candidate = self.model.clone();
            learn_clock(engine, &mut candidate)?;
            let outcome = candidate.apply(command);
            if tip != candidate.seq {
                return Err(fail(format!(
                    "after a reopen the log tip is {tip}: {} events were acknowledged, and the command in flight \
                     would have made it {} ({outcome:?}): {command:#?}",
                    self.model.seq, candidate.seq
                )));
            }
            self.model = candidate;
            self.stats.unacked_present += 1;
            self.log(|| format!("the command in flight is present ({tip})"));
        } else if unacked.is_some() {
            self.stats.unacked_absent += 1;
        }
        self.settle_drafts(engine, unacked.as_ref())?;
        self.verify(engine)?;
        if self.rng.chance(1, 4) {
            compare_all(engine, &self.model, &self.never_stored, "after a reopen")?;
        }
        Ok(())
    }

    /// Drafts are written within the flush interval, not with every append: after a
    /// reopen each draft the engine holds must be a prefix of what was appended to it
    /// (the command in flight included), and no other draft may be there. The model then
    /// takes what survived.
    fn settle_drafts(&mut self, engine: &Engine, unacked: Option<&Command>) -> Checked {
        let mut allowed = self.model.drafts.clone();
        if let Some(Command::AppendDraft(c)) = unacked.map(Command::unfenced) {
            let d = allowed.entry((c.session, c.draft_id.clone())).or_insert_with(|| (Vec::new(), 0, 0));
            d.0.push(c.segment.clone());
        }
        let mut survived = std::collections::BTreeMap::new();
        for s in sessions(&self.model) {
            for d in engine.drafts(s, u64::MAX) {
                let key = (s, d.draft_id.clone());
                let Some((appended, _, _)) = allowed.get(&key) else {
                    return Err(fail(format!("after a reopen, draft {key:?} is there but was never appended")));
                };
                if d.segments.len() > appended.len() || d.segments[..] != appended[..d.segments.len()] {
                    return Err(fail(format!("after a reopen, draft {key:?} is not a prefix of what was appended")));
                }
                survived.insert(key, (d.segments, d.created_at_ms, d.updated_at_ms));
            }
        }
        self.model.drafts = survived;
        Ok(())
    }

    /// The checks of every reopen (see the module documentation).
    fn verify(&self, engine: &Engine) -> Checked {
        events_agree(engine, &self.model)?;
        let events = check::all_events(engine)?;
        let (_, tip_hash) = ok(engine.tip(), "tip")?;
        let chain = LogChain::plain();
        let mut prev = chain.genesis();
        for ev in &events {
            let (_, hash) = encode_record(&ev.record, &prev, &chain, u64::MAX).map_err(fail)?;
            same(hash, ev.chain_hash, format_args!("chain hash of seq {}", ev.record.seq))?;
            prev = hash;
            for id in ev.record.event.content_refs() {
                same(ok(engine.content(id), "content")?.is_some(), true, format_args!("content of {}", ev.record.seq))?;
            }
        }
        same(prev, tip_hash, "the meta tip is the last record's chain hash")?;
        for s in sessions(&self.model) {
            same(ok(engine.head(s), "head")?, self.model.head(&s), format_args!("head of {s}"))?;
        }
        for (id, bytes) in &self.model.content {
            same(ok(engine.content(*id), "content")?, Some(bytes.clone()), format_args!("content {id:?}"))?;
        }
        // The projections equal a rebuild: a fold of a copy of the log into nothing.
        let live = ok(engine.projection_digests(), "digests")?;
        let scratch = SimDisk::new(0);
        for name in [LOG, JOURNAL[0], JOURNAL[1]] {
            scratch.set_image(name, self.disk.image(name).unwrap_or_default());
        }
        let options = Options { durability: Durability::Relaxed, ..self.options.clone() };
        let journal = [scratch.file(JOURNAL[0]), scratch.file(JOURNAL[1])];
        let rebuilt = ok(
            Engine::open_with_journal(scratch.file(LOG), scratch.file(PROJECTIONS), journal, options),
            "open a copy of the log and its journal",
        )?;
        same(ok(rebuilt.projection_digests(), "digests")?, live, "the projections equal a rebuild")?;
        drop(rebuilt);
        for name in [LOG, PROJECTIONS] {
            integrity(self.disk.image(name).unwrap_or_default()).map_err(|e| fail(format!("{name}: {e}")))?;
        }
        Ok(())
    }
}

/// Whether redb opens a copy of `bytes` as a database (an empty file opens as a new one).
fn opens(bytes: Vec<u8>) -> bool {
    let copy = SimDisk::new(0);
    copy.set_image("f", bytes);
    let file = copy.file("f");
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        redb::Builder::new().create_with_backend(file).is_ok()
    }));
    opened.unwrap_or(false)
}

/// redb's integrity check (every page checksum of the committed trees) on a copy.
fn integrity(bytes: Vec<u8>) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    let copy = SimDisk::new(0);
    copy.set_image("f", bytes);
    let mut db = redb::Builder::new().create_with_backend(copy.file("f")).map_err(|e| format!("redb open: {e}"))?;
    db.check_integrity().map(|_| ()).map_err(|e| format!("redb integrity check: {e}"))
}

fn replay_line(seed: u64) -> String {
    format!("SIM_SEED={seed} cargo test -p annal --test sim simulation -- --nocapture")
}

/// Runs one seed; a failure names the command that replays it.
fn simulate(seed: u64, verbose: bool) -> Result<Stats, String> {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Sim::new(seed, verbose).run()));
    match run {
        Ok(Ok(stats)) => Ok(stats),
        Ok(Err(e)) => Err(format!("seed {seed} failed: {e}\nreplay: {}", replay_line(seed))),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("seed {seed} panicked: {what}\nreplay: {}", replay_line(seed)))
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Runs seeds from `first` until `count` are done or `until` passes; panics with the
/// first failure.
fn run_seeds(first: u64, count: u64, until: Option<Instant>) -> (u64, Stats) {
    let started = Instant::now();
    let mut total = Stats::default();
    let mut done = 0;
    for seed in first..first.saturating_add(count) {
        match simulate(seed, false) {
            Ok(stats) => total.add(&stats),
            Err(e) => panic!("{e}"),
        }
        done += 1;
        if until.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        if done % 1000 == 0 {
            eprintln!("{done} seeds in {:.0?}: {total:?}", started.elapsed());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "simulation: {done} seeds from {first} in {secs:.1} s ({:.0} seeds/minute): {total:?}",
        done as f64 * 60.0 / secs
    );
    (done, total)
}

#[test]
fn simulation() {
    if let Some(seed) = env_u64("SIM_SEED") {
        match simulate(seed, true) {
            Ok(stats) => eprintln!("seed {seed}: {stats:?}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let count = env_u64("SIM_SEEDS").unwrap_or(SEEDS_DEFAULT);
    let first = env_u64("SIM_FIRST").unwrap_or(FIRST_SEED);
    let (_, total) = run_seeds(first, count, None);
    if count >= SEEDS_DEFAULT {
        assert!(total.power_losses > 0 && total.faults > 0 && total.torn_writes > 0, "the schedules hit the disk");
        assert!(total.unacked_present > 0 && total.unacked_absent > 0, "commands in flight both land and vanish");
    }
}

#[test]
#[ignore = "long: runs for SIM_MINUTES minutes (default 10); run with --ignored"]
fn simulation_long() {
    let minutes = env_u64("SIM_MINUTES").unwrap_or(10);
    let first = env_u64("SIM_FIRST").unwrap_or(1 << 32);
    run_seeds(first, u64::MAX, Some(Instant::now() + Duration::from_secs(minutes * 60)));
}

#[test]
fn a_seed_replays_the_same_io() {
    let digest = |seed: u64| {
        let mut sim = Sim::new(seed, false);
        sim.run().expect("the seed passes");
        sim.disk.trace_digest()
    };
    for seed in [3, 4] {
        assert_eq!(digest(seed), digest(seed), "seed {seed} made the same I/O calls twice");
    }
}
