//! The writer thread: group commit.
//!
//! Callers send requests over a bounded channel and block on their own reply channel.
//! The writer drains whatever is queued (up to `batch_commands_max`) into one journal
//! frame and one fsync (`crate::journal`; without a journal, one write transaction of
//! the log file). Each command is decided against state that includes the
//! commands before it, staged in an [`Overlay`], and applied only if accepted, so a
//! rejection writes nothing. Replies and subscriber notices go out only after the commit
//! is durable. An I/O error during the commit fails every caller in the batch and
//! poisons the engine.

use crate::absorb::Absorber;
use crate::checkpoint::{self, CheckpointPolicy, Cursors, Signal};
use crate::command::{Command, CommitTurn, Outcome};
use crate::decide::{check_fence, decide, outcome_of, Decision, Now, Prepared, Renewal, Renewals};
use crate::delta::{Delta, LogUpdate};
use crate::draft::{DraftChange, DraftState, DraftWrites};
use crate::engine::EngineStats;
use crate::error::{Error, Limit, Location, Rejection, Result};
use crate::evolve::evolve;
use crate::journal::{Journal, SealedBatch, JOURNAL_BYTES_MAX};
use crate::limits::Limits;
use crate::log::{Entry, Staged, StoredObject, Tip};
use crate::projection::{Projection, ProjectionSet, SessionHead};
use crate::rebuild::RebuildStats;
use crate::store::WithRecords;
use crate::store::{keys, Overlay, Store, StoreExt, Table, Writes};
use annal_codec::{ContentId, LogChain, Record, SessionId};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use redb::ReadableDatabase;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A durable commit, announced to subscribers once per accepted command that wrote, and
/// once per import ([`crate::Engine::import`]) or copy ([`crate::Engine::copy_in`]) that
/// appended records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitNotice {
    /// First global seq written by the commit.
    pub first_seq: u64,
    /// Last global seq written by the commit.
    pub last_seq: u64,
    /// Sessions the commit wrote to, in the order of their first record.
    pub sessions: Vec<SessionId>,
    /// Commit time, unix ms: for an import or a copy, the `committed_at_ms` of its last
    /// record.
    pub committed_at_ms: u64,
}

impl CommitNotice {
    /// The notice of a commit that appended `records` (in seq order) at
    /// `committed_at_ms`: their first and last seq and their sessions in the order of
    /// their first record. `None` for no record.
    pub(crate) fn of<'r>(records: impl IntoIterator<Item = &'r Record>, committed_at_ms: u64) -> Option<CommitNotice> {
        let mut records = records.into_iter();
        let first = records.next()?;
        let mut notice =
            CommitNotice { first_seq: first.seq, last_seq: first.seq, sessions: vec![first.session], committed_at_ms };
        for r in records {
            notice.last_seq = r.seq;
            if !notice.sessions.contains(&r.session) {
                notice.sessions.push(r.session);
            }
        }
        Some(notice)
    }
}

/// Queue depth of each subscriber; a subscriber that falls this far behind is dropped
/// (its receiver disconnects) rather than stalling the writer.
pub const SUBSCRIBER_QUEUE_MAX: usize = 65_536;

/// Where the writer sends a request's result: a oneshot that the caller either blocks
/// on (`recv`) or awaits (the async twins' [`crate::Reply`]).
pub(crate) type ReplyTo<T> = oneshot::Sender<Result<T>>;

/// A subscriber to commit notices.
pub(crate) enum Subscriber {
    /// [`crate::Engine::subscribe`]: dropped when its queue is full.
    Channel(Sender<CommitNotice>),
    /// [`crate::Engine::subscribe_stream`]: told that it lagged when its queue is full.
    Stream(crate::stream::StreamSender),
}

impl Subscriber {
    /// Delivers `notices` in order. Returns false if the subscriber is to be dropped.
    fn deliver(&mut self, notices: &[CommitNotice]) -> bool {
        match self {
            Subscriber::Channel(tx) => notices.iter().all(|n| tx.try_send(n.clone()).is_ok()),
            Subscriber::Stream(tx) => notices.iter().all(|n| tx.deliver(n)),
        }
    }
}

pub(crate) struct Shared {
    pub log_db: Arc<crate::engine::Db>,
    pub projections: Arc<crate::engine::Db>,
    pub delta: Arc<Delta>,
    pub limits: Limits,
    pub chain: LogChain,
    pub durability: redb::Durability,
    pub policy: CheckpointPolicy,
    pub poisoned: Arc<crate::error::Poison>,
    pub subscribers: Mutex<Vec<Subscriber>>,
    pub batch_commands_max: usize,
    pub stats: Arc<EngineStats>,
    /// The log tip as of the last durable batch (the writer's).
    pub tip: Mutex<Tip>,
    /// How callers compress content (`Options::compression`).
    pub compression: annal_codec::content::Compression,
    /// The writer's clock.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Lease renewals, held in memory (the writer's; readers look).
    pub renewals: Arc<Mutex<Renewals>>,
    /// Every draft (the writer's; readers look).
    pub drafts: Arc<Mutex<DraftState>>,
    /// How long a draft segment may wait in memory before it is written on its own.
    pub draft_flush_interval: Duration,
}

pub(crate) enum Request {
    /// Boxed: the queue's slots are preallocated, and a command is large.
    Command {
        command: Box<Command>,
        reply: ReplyTo<Outcome>,
        prepared: Box<Prepared>,
    },
    Rebuild {
        set: ProjectionSet,
        reply: ReplyTo<RebuildStats>,
    },
    Checkpoint {
        reply: ReplyTo<()>,
    },
    FlushDrafts {
        reply: ReplyTo<()>,
    },
    Import {
        records: Vec<Record>,
        content: Vec<Vec<u8>>,
        reply: ReplyTo<crate::import::ImportStats>,
    },
    Copy {
        export: crate::copy::SessionExport,
        reply: ReplyTo<crate::copy::CopyOutcome>,
    },
    /// One sweep batch of an online content collection.
    Sweep {
        marks: Box<crate::collect::Marks>,
        sweep: crate::collect::Sweep,
        reply: ReplyTo<(Box<crate::collect::Marks>, crate::collect::Swept)>,
    },
    /// The end of an online content collection: checkpoint, sync, clear the mark.
    CollectDone {
        reply: ReplyTo<()>,
    },
}

/// The writer thread: gathers a batch, decides and folds it, appends it, publishes it.
///
/// It holds the group-commit state ([`Core`]) while it works, and does it all in order:
/// it gathers whatever is queued, without waiting for more, decides and
/// folds each command on a view of the delta (a rejected command's staged writes are
/// dropped), appends the batch to the log's journal in one frame and one fsync, applies
/// its rows to the delta, and only then notifies subscribers and replies; the absorber
/// (`crate::absorb`) moves the journal into the log file behind it. Nothing is
/// acknowledged before its batch is durable; if a commit fails, the engine is poisoned
/// and every caller of the batch gets the error. A lone committer whose command finds
/// the state free commits it on its own thread instead ([`Core::commit_here`]), by the
/// same steps.
pub(crate) fn run(shared: Arc<Shared>, rx: Receiver<Request>, core: Arc<Core>) {
    loop {
        // Draft segments wait in memory at most the flush interval.
        let due = shared.drafts.lock().pending().0.map(|since| since + shared.draft_flush_interval);
        let first = match due {
            Some(due) => match rx.recv_deadline(due) {
                Ok(req) => req,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let _ = core.state.lock().seq.flush_drafts(&shared);
                    continue;
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            },
            None => match rx.recv() {
                Ok(req) => req,
                Err(_) => break,
            },
        };
        let mut state = core.state.lock();
        let State { seq, checkpoints, previous_batch } = &mut *state;
        // Room for what is queued now or the last batch's size, whichever is more:
        // growing the list by doubling moved every command taken so far.
        let expected = core.pending.load(Ordering::Acquire).max(*previous_batch);
        let mut commands = Vec::with_capacity(expected.min(shared.batch_commands_max));
        let mut pending = Some(first);
        while let Some(req) = pending.take() {
            // Taken under the state's lock: no caller commits before it is done.
            core.pending.fetch_sub(1, Ordering::AcqRel);
            match req {
                Request::Command { command, reply, prepared } => commands.push((*command, reply, prepared)),
                other => {
                    // Everything before it goes first, then it runs alone on an idle log.
                    seq.commit(&shared, std::mem::take(&mut commands), checkpoints);
                    exclusive(&shared, seq, other, checkpoints);
                }
            }
            if commands.len() >= shared.batch_commands_max {
                break;
            }
            // What is queued, and no more: the committers this batch leaves out queue
            // while it is decided and synced, and make the next one (design §7).
            pending = rx.try_recv().ok();
        }
        if !commands.is_empty() {
            *previous_batch = commands.len();
        }
        seq.commit(&shared, commands, checkpoints);
    }
    // Closing: what drafts hold goes to the file, and the journal into the log file.
    let mut state = core.state.lock();
    shared.delta.stop_filter();
    let seq = &mut state.seq;
    let _ = seq.flush_drafts(&shared);
    if seq.absorb(&shared).is_ok() {
        if let Some(journal) = seq.journal.take() {
            let _ = journal.shred();
        }
    }
    drop(seq.absorber.take());
    // Nothing is committed after this: subscribers' channels close (a stream ends).
    shared.subscribers.lock().clear();
    let _ = state.checkpoints.send(Signal::Stop);
}

/// The group-commit state that one thread at a time holds: the writer thread while it
/// runs a batch, or a caller that commits its own command on its own thread
/// ([`Core::commit_here`]).
pub(crate) struct Core {
    state: Mutex<State>,
    /// Requests sent to the writer thread that it has not taken under the state's lock
    /// yet: a caller commits on its own thread only while there are none (and the lock
    /// is free), so it never overtakes one.
    pending: AtomicUsize,
}

/// What [`Core`] guards.
struct State {
    seq: Sequencer,
    checkpoints: Sender<Signal>,
    /// The number of commands in the last batch: a caller commits on its own thread only
    /// after a batch of one ([`Core::commit_here`]).
    previous_batch: usize,
}

impl Core {
    /// The writer's state after the log's tip `tip`; starts the absorber when commits go
    /// to a journal.
    pub(crate) fn new(shared: &Arc<Shared>, tip: Tip, checkpoints: Sender<Signal>, journal: Option<Journal>) -> Core {
        let absorber = match &journal {
            Some(_) => match Absorber::start(shared.clone()) {
                Ok(absorber) => Some(absorber),
                Err(e) => {
                    // Without its absorber the journal would only grow: refuse writes.
                    shared.poisoned.set(&e);
                    None
                }
            },
            None => None,
        };
        let seq = Sequencer { next_seq: tip.seq + 1, clock_ms: tip.clock_ms, journal, absorber, absorbing: Vec::new() };
        Core { state: Mutex::new(State { seq, checkpoints, previous_batch: 1 }), pending: AtomicUsize::new(0) }
    }

    /// Sends `request` to the writer thread over `queue`, counted in `pending` until
    /// the writer takes it under the state's lock.
    pub(crate) fn queue(&self, queue: &Sender<Request>, request: Request) -> Result<()> {
        self.pending.fetch_add(1, Ordering::AcqRel);
        queue.send(request).map_err(|_| {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            Error::Closed
        })
    }

    /// Commits `command` on the caller's thread, as a batch of its own, when that costs
    /// nobody a group commit: the state is free, no request is queued or running on the
    /// writer thread, and the last batch held one command. Returns the request back
    /// otherwise, for the queue. This saves a lone committer the two thread hand-offs
    /// (`docs/design.md` §7).
    pub(crate) fn commit_here(&self, shared: &Shared, request: Request) -> std::result::Result<(), Request> {
        if self.pending.load(Ordering::Acquire) > 0 {
            return Err(request);
        }
        let Some(mut state) = self.state.try_lock() else {
            return Err(request);
        };
        if state.previous_batch > 1 || self.pending.load(Ordering::Acquire) > 0 {
            return Err(request);
        }
        let Request::Command { command, reply, prepared } = request else {
            return Err(request);
        };
        let State { seq, checkpoints, .. } = &mut *state;
        shared.stats.caller_commits.fetch_add(1, Ordering::Relaxed);
        seq.commit(shared, vec![(*command, reply, prepared)], checkpoints);
        Ok(())
    }
}

/// Writes draft changes in a transaction of their own.
pub(crate) fn write_drafts(shared: &Shared, writes: &DraftWrites) -> Result<()> {
    let mut txn = shared.log_db.begin_write()?;
    txn.set_durability(shared.durability)?;
    crate::draft::write(&txn, writes)?;
    txn.commit()?;
    Ok(())
}

/// Fails a request that cannot run.
pub(crate) fn fail(req: Request, e: Error) {
    match req {
        Request::Command { reply, .. } => drop(reply.send(Err(e))),
        Request::Rebuild { reply, .. } => drop(reply.send(Err(e))),
        Request::Checkpoint { reply } | Request::FlushDrafts { reply } => drop(reply.send(Err(e))),
        Request::Import { reply, .. } => drop(reply.send(Err(e))),
        Request::Copy { reply, .. } => drop(reply.send(Err(e))),
        Request::Sweep { reply, .. } => drop(reply.send(Err(e))),
        Request::CollectDone { reply } => drop(reply.send(Err(e))),
    }
}

/// Runs a request that needs the log to itself (every batch before it is applied).
fn exclusive(shared: &Shared, seq: &mut Sequencer, req: Request, checkpoints: &Sender<Signal>) {
    if shared.poisoned.load(Ordering::Acquire) {
        return fail(req, Error::Poisoned);
    }
    if let Request::FlushDrafts { reply } = req {
        return drop(reply.send(seq.flush_drafts(shared)));
    }
    // It reads or writes the log file alone: the journal goes into it first.
    if let Err(e) = seq.absorb(shared) {
        return fail(req, e);
    }
    let tip = *shared.tip.lock();
    match req {
        Request::Command { .. } | Request::FlushDrafts { .. } => {}
        Request::Rebuild { set, reply } => drop(reply.send(rebuild(shared, &tip, set, checkpoints))),
        Request::Checkpoint { reply } => drop(reply.send(drain(shared, checkpoints))),
        Request::Import { records, content, reply } => {
            let mut tip = tip;
            // The import appends all of its records or none.
            let notice = CommitNotice::of(&records, 0);
            let result = crate::import::import(shared, &mut tip, records, content);
            *shared.tip.lock() = tip;
            seq.next_seq = tip.seq + 1;
            seq.clock_ms = seq.clock_ms.max(tip.clock_ms);
            // One durable transaction, one notice, sent before the reply as for a command.
            if let (Ok(_), Some(notice)) = (&result, notice) {
                notify(shared, vec![CommitNotice { committed_at_ms: tip.clock_ms, ..notice }]);
            }
            let _ = reply.send(result);
            after_apply(shared, checkpoints);
        }
        Request::Copy { export, reply } => {
            let mut tip = tip;
            let result = crate::copy::copy_in(shared, &mut tip, seq.clock_ms, export);
            *shared.tip.lock() = tip;
            seq.next_seq = tip.seq + 1;
            seq.clock_ms = seq.clock_ms.max(tip.clock_ms);
            let result = result.map(|(outcome, notice)| {
                notify(shared, notice.into_iter().collect());
                outcome
            });
            let _ = reply.send(result);
            after_apply(shared, checkpoints);
        }
        Request::Sweep { mut marks, sweep, reply } => {
            // The content-id index's additions the delta holds go into its rows first:
            // the sweep removes entries from the rows.
            let result = crate::error::fail_closed("collect", || {
                drain(shared, checkpoints)?;
                sweep_batch(shared, &tip, &mut marks, &sweep)
            });
            if let Err(e) = &result {
                shared.poisoned.set(e);
            }
            let _ = reply.send(result.map(|swept| (marks, swept)));
            after_apply(shared, checkpoints);
        }
        Request::CollectDone { reply } => {
            let result = crate::error::fail_closed("collect", || {
                drain(shared, checkpoints)?;
                crate::collect::sync_projections(&shared.projections)?;
                crate::collect::clear_mark(&shared.log_db)
            });
            let _ = reply.send(result);
        }
    }
}

/// One sweep batch of an online collection, on the idle log: mark what the records
/// since the last batch reach, rewrite the batch's rows durably, then fold the removals
/// into the delta.
fn sweep_batch(
    shared: &Shared,
    tip: &Tip,
    marks: &mut crate::collect::Marks,
    sweep: &crate::collect::Sweep,
) -> Result<crate::collect::Swept> {
    let (record_max, object_max) = (shared.limits.record_bytes_max, shared.limits.message_object_bytes_max());
    let view = shared.delta.view();
    marks.read(&view, tip.seq, record_max, object_max)?;
    let mut txn = shared.log_db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    let swept = crate::collect::sweep_rows(&txn, marks, sweep, object_max)?;
    if swept.removed.is_empty() {
        txn.abort()?;
        return Ok(swept);
    }
    txn.commit()?;
    // Forgotten once new views no longer find them: an object a view taken before reads
    // from its older snapshot after this is not cached again (`ContentCache::put`).
    let ids: Vec<ContentId> = swept.removed.iter().map(|(id, _)| *id).collect();
    let mut overlay = Overlay::new(&view);
    if let Err(e) = crate::evolve::content_collected(&mut overlay, &swept.removed) {
        shared.delta.forget_content(&ids);
        return Err(e);
    }
    let writes = overlay.into_writes();
    drop(view);
    let published = shared.log_db.begin_read().map(|txn| {
        shared.delta.apply(writes, tip.seq, tip.hash, 0, LogUpdate::File(txn));
    });
    shared.delta.forget_content(&ids);
    published?;
    Ok(swept)
}

/// The writer's state: the next seq, the clock, and the journal.
struct Sequencer {
    next_seq: u64,
    clock_ms: u64,
    /// The journal, when commits go to it (a durable database in files); otherwise each
    /// group commit is a durable transaction of the log file.
    journal: Option<Journal>,
    /// The thread that appends the journal's rows to the log file (with the journal).
    absorber: Option<Absorber>,
    /// Draft changes journalled since the last absorption request, in order: the
    /// absorption writes them with the records.
    absorbing: Vec<DraftWrites>,
}

/// A batch of commands with their callers' reply channels.
pub(crate) type Batch = Vec<(Command, ReplyTo<Outcome>, Box<Prepared>)>;

impl Sequencer {
    /// Decides and folds `batch`, appends it durably, applies it to the delta, then
    /// notifies subscribers and replies.
    fn commit(&mut self, shared: &Shared, batch: Batch, checkpoints: &Sender<Signal>) {
        if batch.is_empty() {
            return;
        }
        if shared.poisoned.load(Ordering::Acquire) {
            for (_, reply, _) in batch {
                let _ = reply.send(Err(Error::Poisoned));
            }
            return;
        }
        shared.delta.maintain_filter();
        let commands: Vec<(&Command, &Prepared)> = batch.iter().map(|(c, _, p)| (c, &**p)).collect();
        let decided =
            crate::error::fail_closed("commit", || decide_batch(shared, self.next_seq, self.clock_ms, &commands));
        drop(commands);
        let replies = batch.into_iter().map(|(_, reply, _)| reply);
        let Decided { entries, writes, outcomes, notices, clock_ms, .. } = match decided {
            Ok(decided) => decided,
            Err(e) => {
                shared.poisoned.set(&e);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        };
        // Draft changes ride with the log's transaction; without one, removals (by a
        // turn's retry, or a discard) are written now, and appends once the flush
        // interval has passed.
        let draft_writes = {
            let drafts = shared.drafts.lock();
            let (since, urgent) = drafts.pending();
            let due = since.is_some_and(|t| t.elapsed() >= shared.draft_flush_interval);
            match !entries.is_empty() || urgent || due {
                true => drafts.writes(),
                false => DraftWrites::default(),
            }
        };
        if entries.is_empty() && draft_writes.is_empty() {
            for (reply, outcome) in replies.zip(outcomes) {
                let _ = reply.send(outcome);
            }
            return;
        }
        let tip = *shared.tip.lock();
        let committed = crate::error::fail_closed("commit", || {
            if let Some(journal) = self.journal.as_mut() {
                let (next, batch) = journal_frame(journal, shared, tip, &entries, &draft_writes)?;
                if let Some(batch) = batch {
                    let events = entries.len() as u64;
                    shared.delta.apply(writes, next.seq, next.hash, events, LogUpdate::Journalled(batch));
                }
                return Ok(next);
            }
            if entries.is_empty() {
                write_drafts(shared, &draft_writes)?;
                return Ok(tip);
            }
            let next = append(shared, tip, &entries, &draft_writes)?;
            let log = LogUpdate::File(shared.log_db.begin_read()?);
            shared.delta.apply(writes, next.seq, next.hash, entries.len() as u64, log);
            Ok(next)
        });
        match committed {
            Ok(next) => {
                shared.drafts.lock().written(&draft_writes);
                if self.journal.is_some() && !draft_writes.is_empty() {
                    self.absorbing.push(draft_writes);
                }
                *shared.tip.lock() = next;
                self.next_seq = next.seq + 1;
                self.clock_ms = clock_ms;
                // Subscribers first: a caller that subscribes after its reply must not
                // hear about its own commit.
                notify(shared, notices);
                for (reply, outcome) in replies.zip(outcomes) {
                    let _ = reply.send(outcome);
                }
                self.after_journal(shared);
                after_apply(shared, checkpoints);
            }
            Err(e) => {
                shared.poisoned.set(&e);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// Puts everything journalled into the log file and waits for it (before work that
    /// needs the log file to itself, and at close); then the journal starts again.
    fn absorb(&mut self, shared: &Shared) -> Result<()> {
        let (Some(journal), Some(absorber)) = (self.journal.as_mut(), self.absorber.as_mut()) else {
            return Ok(());
        };
        let tip = *shared.tip.lock();
        absorber.absorb_all(tip, std::mem::take(&mut self.absorbing))?;
        journal.restart();
        Ok(())
    }

    /// After a journalled batch: turns to the other journal file once the active one is
    /// full and the log file holds the other's rows, and hands the absorber what was
    /// journalled so far. Past [`JOURNAL_BYTES_MAX`] it waits for the absorber.
    fn after_journal(&mut self, shared: &Shared) {
        let (Some(journal), Some(absorber)) = (self.journal.as_mut(), self.absorber.as_mut()) else {
            return;
        };
        if journal.offset() >= JOURNAL_BYTES_MAX {
            absorber.wait_for(journal.other_needs(), shared);
        }
        if journal.switch(absorber.done()) {
            let request = absorber.request(*shared.tip.lock(), std::mem::take(&mut self.absorbing));
            journal.left(request);
        }
    }

    /// Writes every draft change still in memory: into the journal, or in a log
    /// transaction of its own.
    fn flush_drafts(&mut self, shared: &Shared) -> Result<()> {
        if shared.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        let writes = shared.drafts.lock().writes();
        if writes.is_empty() {
            return Ok(());
        }
        let tip = *shared.tip.lock();
        let result = crate::error::fail_closed("flush drafts", || match self.journal.as_mut() {
            Some(journal) => journal_frame(journal, shared, tip, &[], &writes).map(drop),
            None => write_drafts(shared, &writes),
        });
        match result {
            Ok(()) => {
                shared.drafts.lock().written(&writes);
                if self.journal.is_some() {
                    self.absorbing.push(writes);
                }
                Ok(())
            }
            Err(e) => {
                shared.poisoned.set(&e);
                Err(e)
            }
        }
    }
}

/// Decides and folds a batch on a view of the delta, its events numbered from
/// `next_seq` and stamped no earlier than `clock_ms`. A rejected command's staged writes
/// are dropped, so it consumes no sequence number.
pub(crate) fn decide_batch(
    shared: &Shared,
    next_seq: u64,
    clock_ms: u64,
    commands: &[(&Command, &Prepared)],
) -> Result<Decided> {
    {
        let clock_ms = shared.clock.now_ms().max(clock_ms);
        let mut renewals = shared.renewals.lock();
        let mut drafts = shared.drafts.lock();
        let view = shared.delta.view();
        let mut next_seq = next_seq;
        let mut outcomes = Vec::with_capacity(commands.len());
        let mut spans = Vec::with_capacity(commands.len());
        let mut notices = Vec::new();
        let mut entries: Vec<Entry> = Vec::new();
        // The content-id index's additions go to the delta as they are, for the
        // checkpoint to merge into the index's rows.
        let mut accepted = Overlay::deferring(&view);
        for (command, prepared) in commands {
            let mut staged = Vec::new();
            let mut effects = Vec::new();
            let mut seq = next_seq;
            accepted.stage();
            let result = {
                let to = Staging {
                    next_seq: &mut seq,
                    now: Now {
                        ms: clock_ms,
                        renewals: Some(&renewals),
                        drafts: Some(&drafts),
                        prepared: Some(prepared),
                    },
                    limits: &shared.limits,
                    earlier: &entries,
                    entries: &mut staged,
                    effects: &mut effects,
                };
                apply(&mut accepted, command, to)
            };
            let outcome = match result {
                Ok(outcome) => outcome,
                Err(e @ Error::Storage(_)) => return Err(e),
                Err(e) => {
                    // Nothing of the command survives, and it consumes no seq.
                    accepted.discard();
                    outcomes.push(Err(e));
                    spans.push(entries.len()..entries.len());
                    continue;
                }
            };
            accepted.keep();
            next_seq = seq;
            for effect in effects {
                match effect {
                    Effect::Renew(lease) => {
                        let renewal = Renewal { token: lease.token, expires_at_ms: lease.expires_at_ms };
                        renewals.insert(lease.session, renewal);
                    }
                    // A finalized draft goes now too: its removal is written with the turn.
                    Effect::Draft(change) => drafts.apply(change, clock_ms),
                }
            }
            notices.extend(CommitNotice::of(staged.iter().map(|e| &e.record), clock_ms));
            spans.push(entries.len()..entries.len() + staged.len());
            entries.extend(staged);
            outcomes.push(Ok(outcome));
        }
        Ok(Decided { entries, writes: accepted.into_writes(), outcomes, notices, clock_ms, spans })
    }
}

/// A decided batch.
pub(crate) struct Decided {
    pub entries: Vec<Entry>,
    pub writes: Writes,
    pub outcomes: Vec<Result<Outcome>>,
    pub notices: Vec<CommitNotice>,
    pub clock_ms: u64,
    /// Each command's entries, as a range of `entries`.
    pub spans: Vec<std::ops::Range<usize>>,
}

/// Writes a batch's frame to the journal, durably: its records sealed after `tip`,
/// their content rows and the draft changes. Returns the new tip and the sealed batch
/// (`None` for draft changes alone, which views do not read).
fn journal_frame(
    journal: &mut Journal,
    shared: &Shared,
    tip: Tip,
    entries: &[Entry],
    drafts: &DraftWrites,
) -> Result<(Tip, Option<Arc<SealedBatch>>)> {
    let (next, rows) = crate::log::seal(tip, &shared.chain, shared.limits.record_bytes_max, entries)?;
    let frame_len = journal.append(tip.seq + 1, &tip.hash, &rows, &drafts.encode()?)?;
    let appended: usize = rows.iter().map(|r| r.record.len() + r.content.len()).sum();
    shared.stats.log_commits.fetch_add(1, Ordering::Relaxed);
    shared.stats.events.fetch_add(entries.len() as u64, Ordering::Relaxed);
    shared.stats.appended_bytes.fetch_add(appended as u64, Ordering::Relaxed);
    shared.stats.journal_bytes.fetch_add(frame_len, Ordering::Relaxed);
    Ok((next, (!rows.is_empty()).then(|| Arc::new(SealedBatch { rows }))))
}

/// After a batch is applied to the delta: freezes the active layer for the checkpointer
/// when the policy says so, and waits for the checkpointer while the delta is over its
/// bound (backpressure: the delta never grows without limit).
pub(crate) fn after_apply(shared: &Shared, checkpoints: &Sender<Signal>) {
    let (events, bytes, _) = shared.delta.active_stats();
    if (events >= shared.policy.events || bytes >= shared.policy.delta_bytes) && shared.delta.freeze() {
        let _ = checkpoints.send(Signal::Work);
    }
    if shared.delta.bytes() >= shared.policy.delta_bytes_max {
        if shared.delta.freeze() {
            let _ = checkpoints.send(Signal::Work);
        }
        shared.stats.backpressure_waits.fetch_add(1, Ordering::Relaxed);
        let max = shared.policy.delta_bytes_max;
        shared.delta.wait_until(|d| d.bytes() < max || shared.poisoned.load(Ordering::Acquire));
    }
}

/// Checkpoints the whole delta and waits for it (rebuild runs on an empty delta).
pub(crate) fn drain(shared: &Shared, checkpoints: &Sender<Signal>) -> Result<()> {
    if shared.delta.freeze() {
        let _ = checkpoints.send(Signal::Work);
    }
    shared.delta.wait_until(|d| d.frozen() == 0 || shared.poisoned.load(Ordering::Acquire));
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    Ok(())
}

pub(crate) fn rebuild(
    shared: &Shared,
    tip: &Tip,
    set: ProjectionSet,
    checkpoints: &Sender<Signal>,
) -> Result<RebuildStats> {
    alone_on_the_log(shared, "rebuild", || {
        drain(shared, checkpoints)?;
        let log = shared.log_db.begin_read()?;
        let cursors = Cursors { seqs: [tip.seq; Projection::ALL.len()] }.reset(set);
        let stats = checkpoint::catch_up(
            &shared.projections,
            &log,
            &shared.chain,
            &shared.limits,
            tip,
            &cursors,
            shared.durability,
            &mut |_, _| {},
            checkpoint::Folding::default(),
        )?;
        shared.delta.set_checkpoint(shared.projections.begin_read()?)?;
        Ok(stats)
    })
}

/// Runs `f`, a request that has the log to itself (rebuild, import, copy): refused on a
/// poisoned engine; a panic inside fails closed; a storage failure, or damage found in a
/// file, poisons the engine, as a failed commit does.
pub(crate) fn alone_on_the_log<T>(shared: &Shared, what: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    let result = crate::error::fail_closed(what, f);
    if let Err(e @ (Error::Storage(_) | Error::Corrupt { location: Location::File, .. })) = &result {
        shared.poisoned.set(e);
    }
    result
}

/// Sends `notices` to every subscriber: a channel subscriber that fell too far behind is
/// dropped, a stream subscriber is marked as lagging (see [`crate::CommitStream`]), and
/// a subscriber whose receiving end is gone is dropped.
pub(crate) fn notify(shared: &Shared, notices: Vec<CommitNotice>) {
    if notices.is_empty() {
        return;
    }
    let mut subs = shared.subscribers.lock();
    subs.retain_mut(|s| s.deliver(&notices));
}

/// The content objects of a decision that are not stored yet, nor introduced earlier in
/// the batch (`staged`): the content-id index, read through the overlay, names the rows
/// that may hold each, and those rows say ([`crate::buckets::content_is_stored`]).
fn new_content<S: Store + ?Sized>(
    store: &S,
    staged: Staged<'_>,
    content: Vec<(ContentId, Vec<u8>)>,
) -> Result<Vec<(ContentId, Vec<u8>)>> {
    let mut fresh = Vec::with_capacity(content.len());
    for (id, bytes) in content {
        if !crate::buckets::content_is_stored(store, &id, &|seq| staged.holds(seq, &id))? {
            fresh.push((id, bytes));
        }
    }
    Ok(fresh)
}

/// The stream seq the session's next event gets: its head's, plus one.
pub(crate) fn next_stream_seq<S: Store + ?Sized>(store: &S, session: &SessionId) -> Result<u64> {
    match store.row::<SessionHead>(Table::Heads, &keys::session(session))? {
        Some(h) => Ok(h.stream_seq + 1),
        // No head: a new session, or a purged one (its creation erased), whose stream the
        // stream index still has.
        None => crate::evolve::STREAM_INDEX.len(store, session)?.checked_add(1).ok_or_else(|| {
            let table = Table::StreamIndex.name();
            Error::corrupt(Location::Projection { table, key: session.to_string() }, "a stream past any stream seq")
        }),
    }
}

/// Where `apply` puts what a command writes.
struct Staging<'a> {
    next_seq: &'a mut u64,
    now: Now<'a>,
    limits: &'a Limits,
    /// The entries of the batch's earlier commands, not in the view's rows yet.
    earlier: &'a [Entry],
    /// The entries of this command so far.
    entries: &'a mut Vec<Entry>,
    /// What the command changes in the writer's memory (applied once it is accepted).
    effects: &'a mut Vec<Effect>,
}

/// A change an accepted command makes beside the log and the delta, in the writer's
/// memory: a lease renewal, or a draft change (a draft finalized by a turn is a discard).
enum Effect {
    Renew(crate::command::Lease),
    Draft(DraftChange),
}

/// Decides and folds one command (or a batch) into `overlay`, sequencing its events.
fn apply<S: Store + ?Sized>(overlay: &mut Overlay<'_, S>, command: &Command, to: Staging<'_>) -> Result<Outcome> {
    let Staging { next_seq, now, limits, earlier, entries, effects } = to;
    if let Command::Fenced { fence, command } = command {
        limits.check(Limit::CommandBytes, command.approx_bytes())?;
        check_fence(&*overlay, fence)?;
        return apply(overlay, command, Staging { next_seq, now, limits, earlier, entries, effects });
    }
    if let Command::Batch(commands) = command {
        limits.check(Limit::BatchCommands, commands.len() as u64)?;
        limits.check(Limit::CommandBytes, command.approx_bytes())?;
        let mut outcomes = Vec::with_capacity(commands.len());
        for (index, c) in commands.iter().enumerate() {
            let result = match c.unfenced() {
                Command::Batch(_) => Err(Error::Rejected(Rejection::InvalidRequest { reason: "nested batch".into() })),
                Command::AcquireLease(_) | Command::RenewLease(_) => Err(Error::Rejected(Rejection::InvalidRequest {
                    reason: "lease acquisitions and renewals cannot be part of a batch".into(),
                })),
                Command::AppendDraft(_) | Command::DiscardDraft { .. } => {
                    Err(Error::Rejected(Rejection::InvalidRequest {
                        reason: "drafts cannot be part of a batch".into(),
                    }))
                }
                _ => {
                    let to = Staging {
                        next_seq: &mut *next_seq,
                        now,
                        limits,
                        earlier,
                        entries: &mut *entries,
                        effects: &mut *effects,
                    };
                    apply(overlay, c, to)
                }
            };
            match result {
                Ok(o) => outcomes.push(o),
                Err(Error::Rejected(r)) => {
                    return Err(Error::Rejected(Rejection::Batch { index, rejection: Box::new(r) }));
                }
                Err(e) => return Err(e),
            }
        }
        return Ok(Outcome::Batch(outcomes));
    }
    // The batch's records so far are in no view yet: the store answers for them first.
    let staged = Staged([earlier, &entries[..]]);
    let decision = decide(&WithRecords::read(&*overlay, &staged), command, limits, &now)?;
    if let Command::CommitTurn(CommitTurn { session, draft: Some(draft), .. }) = command {
        effects.push(Effect::Draft(DraftChange::Discard { key: (*session, draft.clone()) }));
    }
    match decision {
        Decision::Noop(outcome) => Ok(outcome),
        Decision::Draft { change, outcome } => {
            effects.push(Effect::Draft(change));
            Ok(outcome)
        }
        Decision::Renew(lease) => {
            effects.push(Effect::Renew(lease.clone()));
            Ok(Outcome::Lease { lease, seq: None })
        }
        Decision::Write { session, event, content } => {
            let stream_seq = next_stream_seq(&*overlay, &session)?;
            let record = Record { seq: *next_seq, session, stream_seq, committed_at_ms: now.ms, event };
            let content: Vec<StoredObject> = new_content(&*overlay, Staged([earlier, &entries[..]]), content)?
                .into_iter()
                .map(|(id, canonical)| match now.prepared.and_then(|p| p.compressed(&id)) {
                    Some((encoding, stored)) => StoredObject { id, encoding: *encoding, bytes: stored.clone() },
                    None => StoredObject::raw(id, canonical),
                })
                .collect();
            let introduced: Vec<ContentId> = content.iter().map(|o| o.id).collect();
            let staged = Staged([earlier, &entries[..]]);
            evolve(&mut WithRecords::write(overlay, &staged), &record, &introduced, ProjectionSet::all())?;
            *next_seq += 1;
            let outcome = outcome_of(&record);
            entries.push(Entry { record, content });
            Ok(outcome)
        }
    }
}

/// Appends entries to the log in one durable transaction, with the draft changes that
/// go with them: the one write of a commit.
pub(crate) fn append(shared: &Shared, tip: Tip, entries: &[Entry], drafts: &DraftWrites) -> Result<Tip> {
    let mut txn = shared.log_db.begin_write()?;
    txn.set_durability(shared.durability)?;
    let (next, written) = crate::log::append(&txn, tip, &shared.chain, shared.limits.record_bytes_max, entries)?;
    crate::draft::write(&txn, drafts)?;
    txn.commit()?;
    shared.stats.log_commits.fetch_add(1, Ordering::Relaxed);
    shared.stats.events.fetch_add(entries.len() as u64, Ordering::Relaxed);
    shared.stats.appended_bytes.fetch_add(written.record_bytes + written.content_bytes, Ordering::Relaxed);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::{Projection, ProjectionSet};
    use crate::store::MemStore;
    use annal_codec::{Event, Record, SessionArchived};

    #[test]
    fn the_next_stream_seq_of_a_session_without_a_head_is_found_across_index_rows() {
        // Only the stream index is folded, as for a purged session whose head is gone.
        let streams = ProjectionSet::none().with(Projection::Streams);
        let (session, other) = (SessionId([3; 16]), SessionId([4; 16]));
        let mut store = MemStore::default();
        let mut seq = 0;
        let mut held = 0;
        for want in [0u64, 1, 2, 63, 64, 65, 127, 128, 129, 300, 1000] {
            while held < want {
                for s in [session, other] {
                    seq += 1;
                    let event = Event::SessionArchived(SessionArchived { reason: String::new() });
                    let record = Record { seq, session: s, stream_seq: held + 1, committed_at_ms: seq, event };
                    crate::evolve::evolve(&mut store, &record, &[], streams).expect("folds");
                }
                held += 1;
            }
            assert_eq!(next_stream_seq(&store, &session).unwrap(), want + 1, "after {want} events");
        }
        assert_eq!(next_stream_seq(&store, &SessionId([5; 16])).unwrap(), 1);
    }
}
