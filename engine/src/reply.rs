//! The async twins of the engine's commands, and the future they return ([`Reply`]).
//!
//! Each command method of [`Engine`] (`commit_turn`, `create_session`, ...) has a twin
//! named with `_async` that queues the same request for the writer and returns a
//! [`Reply`]: a future that resolves to the same result. Both twins build the request the
//! same way and convert the writer's [`Outcome`] with the same function (in [`convert`]);
//! a twin is declared in one line of [`async_twins!`].

use crate::command::*;
use crate::copy::{CopyOutcome, SessionExport};
use crate::engine::{ContextOutcome, Engine, SessionReceipt, ToolReceipt, TurnOutcome};
use crate::error::{Error, Result};
use crate::import::ImportStats;
use crate::projection::ProjectionSet;
use crate::rebuild::RebuildStats;
use crate::writer::{ReplyTo, Request};
use annal_codec::SessionId;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future of a request's durable result, returned by the async twins of the engine's
/// commands ([`Engine::commit_turn_async`] and the others). It needs no particular
/// runtime: the writer thread completes it and wakes the task that awaits it.
///
/// **The request is queued when the method returns, not when the future is first
/// polled.** The future only waits for the writer's answer, so dropping it does not
/// cancel the request: a command queued is decided and, if accepted, committed and
/// announced to subscribers whether or not anyone awaits its reply. A caller that gave up
/// on a reply and wants to know what happened sends the same command again: every command
/// is idempotent by its key (turn id, context key, tool op id), so an exact retry answers
/// as one (`AlreadyCommitted` with the original receipt, `Duplicate`, `created: false`)
/// and never writes twice.
///
/// The method that returns a `Reply` does on the caller's thread what its blocking twin
/// does before it waits: it compresses the command's content (lz4: CPU work of the
/// calling task, in proportion to the content's size) and queues the request. The
/// writer's queue holds [`Options::queue_depth`](crate::Options::queue_depth) requests
/// (4096 by default): when that many are queued already, the call blocks the calling
/// thread until the writer takes one. Resolves to `Err(Closed)` if the engine is closed
/// before it answers.
///
/// A `Reply` must not be polled again after it returned `Ready`.
#[must_use = "the request is queued either way; await the reply to learn its outcome"]
pub struct Reply<T> {
    state: State<T>,
}

enum State<T> {
    /// The request could not be queued.
    Failed(Error),
    /// A command, and the conversion of its outcome.
    Command { rx: oneshot::Receiver<Result<Outcome>>, convert: fn(Outcome) -> Result<T> },
    /// A request whose reply is the result itself.
    Direct(oneshot::Receiver<Result<T>>),
    /// Resolved.
    Done,
}

impl<T> std::fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Failed(_) => "failed",
            State::Command { .. } | State::Direct(_) => "waiting",
            State::Done => "done",
        };
        f.debug_struct("Reply").field("state", &state).finish()
    }
}

impl<T> Future for Reply<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let closed = |_| Error::Closed;
        match std::mem::replace(&mut self.state, State::Done) {
            State::Failed(e) => Poll::Ready(Err(e)),
            State::Command { mut rx, convert } => match Pin::new(&mut rx).poll(cx) {
                Poll::Ready(result) => Poll::Ready(result.map_err(closed).and_then(|r| r).and_then(convert)),
                Poll::Pending => {
                    self.state = State::Command { rx, convert };
                    Poll::Pending
                }
            },
            State::Direct(mut rx) => match Pin::new(&mut rx).poll(cx) {
                Poll::Ready(result) => Poll::Ready(result.map_err(closed).and_then(|r| r)),
                Poll::Pending => {
                    self.state = State::Direct(rx);
                    Poll::Pending
                }
            },
            State::Done => panic!("a Reply was polled after it resolved"),
        }
    }
}

/// The conversion of the writer's [`Outcome`] of each command into the type its method
/// returns, shared by the blocking method and its async twin.
pub(crate) mod convert {
    use super::*;

    fn unexpected(outcome: Outcome) -> Error {
        Error::storage(format!("unexpected outcome {outcome:?}"))
    }

    /// `batch`: the members' outcomes.
    pub(crate) fn batch(outcome: Outcome) -> Result<Vec<Outcome>> {
        match outcome {
            Outcome::Batch(outcomes) => Ok(outcomes),
            other => Err(unexpected(other)),
        }
    }

    /// `create_session`, `fork`: the new session.
    pub(crate) fn created(outcome: Outcome) -> Result<SessionReceipt> {
        match outcome {
            Outcome::Created { session, receipt } => Ok(SessionReceipt { session, receipt }),
            other => Err(unexpected(other)),
        }
    }

    /// `commit_turn`.
    pub(crate) fn turn(outcome: Outcome) -> Result<TurnOutcome> {
        match outcome {
            Outcome::Committed(r) => Ok(TurnOutcome::Committed(r)),
            Outcome::AlreadyCommitted(r) => Ok(TurnOutcome::AlreadyCommitted(r)),
            other => Err(unexpected(other)),
        }
    }

    /// `rewrite`, `restore`.
    pub(crate) fn rewritten(outcome: Outcome) -> Result<Receipt> {
        match outcome {
            Outcome::Rewritten(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// `archive`: whether an event was written.
    pub(crate) fn archived(outcome: Outcome) -> Result<bool> {
        match outcome {
            Outcome::Archived { seq } => Ok(seq.is_some()),
            other => Err(unexpected(other)),
        }
    }

    /// `revive`: the event's seq.
    pub(crate) fn revived(outcome: Outcome) -> Result<u64> {
        match outcome {
            Outcome::Revived { seq } => Ok(seq),
            other => Err(unexpected(other)),
        }
    }

    /// `append_context`.
    pub(crate) fn context(outcome: Outcome) -> Result<ContextOutcome> {
        match outcome {
            Outcome::Staged { seq } => Ok(ContextOutcome::Staged(seq)),
            Outcome::Duplicate => Ok(ContextOutcome::Duplicate),
            other => Err(unexpected(other)),
        }
    }

    /// `record_tool_call`, `record_tool_result`.
    pub(crate) fn tool(outcome: Outcome) -> Result<ToolReceipt> {
        match outcome {
            Outcome::Tool { created, seq } => Ok(ToolReceipt { created, seq }),
            other => Err(unexpected(other)),
        }
    }

    /// `set_labels`: the event's seq, if one was written.
    pub(crate) fn labels(outcome: Outcome) -> Result<Option<u64>> {
        match outcome {
            Outcome::Labels { seq } => Ok(seq),
            other => Err(unexpected(other)),
        }
    }

    /// `set_metadata`: the event's seq, if one was written.
    pub(crate) fn metadata(outcome: Outcome) -> Result<Option<u64>> {
        match outcome {
            Outcome::Metadata { seq } => Ok(seq),
            other => Err(unexpected(other)),
        }
    }

    /// `set_host_state`: the event's seq, if one was written.
    pub(crate) fn host_state(outcome: Outcome) -> Result<Option<u64>> {
        match outcome {
            Outcome::HostState { seq } => Ok(seq),
            other => Err(unexpected(other)),
        }
    }

    /// `acquire_lease`, `renew_lease`: the lease.
    pub(crate) fn lease(outcome: Outcome) -> Result<Lease> {
        match outcome {
            Outcome::Lease { lease, .. } => Ok(lease),
            other => Err(unexpected(other)),
        }
    }

    /// `release_lease`: whether an event was written.
    pub(crate) fn lease_released(outcome: Outcome) -> Result<bool> {
        match outcome {
            Outcome::LeaseReleased { seq } => Ok(seq.is_some()),
            other => Err(unexpected(other)),
        }
    }

    /// `append_draft`: the segment's index.
    pub(crate) fn draft_appended(outcome: Outcome) -> Result<u32> {
        match outcome {
            Outcome::DraftAppended { index, .. } => Ok(index),
            other => Err(unexpected(other)),
        }
    }

    /// `enqueue_input`: the event's seq, if one was written.
    pub(crate) fn enqueued(outcome: Outcome) -> Result<Option<u64>> {
        match outcome {
            Outcome::Enqueued { seq } => Ok(seq),
            other => Err(unexpected(other)),
        }
    }

    /// `claim_inputs`: what the claim took.
    pub(crate) fn claimed(outcome: Outcome) -> Result<crate::query::Claim> {
        match outcome {
            Outcome::Claimed { claim, inputs, expires_at_ms, .. } => {
                Ok(crate::query::Claim { claim, inputs, expires_at_ms })
            }
            other => Err(unexpected(other)),
        }
    }

    /// `abandon_claim`: whether an event was written.
    pub(crate) fn claim_abandoned(outcome: Outcome) -> Result<bool> {
        match outcome {
            Outcome::ClaimAbandoned { seq } => Ok(seq.is_some()),
            other => Err(unexpected(other)),
        }
    }

    /// `cancel_input`: whether an event was written.
    pub(crate) fn input_cancelled(outcome: Outcome) -> Result<bool> {
        match outcome {
            Outcome::InputCancelled { seq } => Ok(seq.is_some()),
            other => Err(unexpected(other)),
        }
    }

    /// `discard_draft`: whether the draft existed.
    pub(crate) fn draft_discarded(outcome: Outcome) -> Result<bool> {
        match outcome {
            Outcome::DraftDiscarded { existed } => Ok(existed),
            other => Err(unexpected(other)),
        }
    }
}

impl Engine {
    /// Queues `command` (compressing its content on this thread first, as
    /// [`Engine::execute`] does) and returns the future of its converted outcome.
    fn submit<T>(&self, command: Command, convert: fn(Outcome) -> Result<T>) -> Reply<T> {
        let (reply, rx) = oneshot::channel();
        match self.send(self.command_request(command, reply)) {
            Ok(()) => Reply { state: State::Command { rx, convert } },
            Err(e) => Reply { state: State::Failed(e) },
        }
    }

    /// Queues the request that `make` builds around its reply channel and returns the
    /// future of its result.
    fn request<T>(&self, make: impl FnOnce(ReplyTo<T>) -> Request) -> Reply<T> {
        let (reply, rx) = oneshot::channel();
        match self.send(make(reply)) {
            Ok(()) => Reply { state: State::Direct(rx) },
            Err(e) => Reply { state: State::Failed(e) },
        }
    }

    /// The async twin of [`Engine::execute`]: queues any command and returns the future
    /// of its durable outcome (see [`Reply`] for when it is queued and what dropping the
    /// future does).
    pub fn execute_async(&self, command: Command) -> Reply<Outcome> {
        self.submit(command, Ok)
    }

    /// The async twin of [`Engine::rebuild`]. The rebuild runs on the writer thread
    /// whether or not the future is awaited.
    pub fn rebuild_async(&self, set: ProjectionSet) -> Reply<RebuildStats> {
        self.request(|reply| Request::Rebuild { set, reply })
    }

    /// The async twin of [`Engine::checkpoint`].
    pub fn checkpoint_async(&self) -> Reply<()> {
        self.request(|reply| Request::Checkpoint { reply })
    }

    /// The async twin of [`Engine::flush_drafts`].
    pub fn flush_drafts_async(&self) -> Reply<()> {
        self.request(|reply| Request::FlushDrafts { reply })
    }

    /// The async twin of [`Engine::import`].
    pub fn import_async(&self, records: Vec<annal_codec::Record>, content: Vec<Vec<u8>>) -> Reply<ImportStats> {
        self.request(|reply| Request::Import { records, content, reply })
    }

    /// The async twin of [`Engine::copy_in`].
    pub fn copy_in_async(&self, export: SessionExport) -> Reply<CopyOutcome> {
        self.request(|reply| Request::Copy { export, reply })
    }
}

/// Declares async twins: `blocking => twin(args) -> T = command, conversion;` defines
/// `Engine::twin(args) -> Reply<T>`, which queues `command` and converts its outcome with
/// `conversion`, the function the blocking method `Engine::blocking` uses.
macro_rules! async_twins {
    ($($blocking:ident => $twin:ident($($arg:ident: $ty:ty),*) -> $out:ty = $command:expr, $convert:path;)*) => {
        impl Engine {
            $(
                #[doc = concat!(
                    "The async twin of [`Engine::", stringify!($blocking), "`]: queues the same command ",
                    "and returns the future of the same result. The command is queued when this ",
                    "returns, and dropping the future does not cancel it (see [`Reply`])."
                )]
                pub fn $twin(&self, $($arg: $ty),*) -> Reply<$out> {
                    self.submit($command, $convert)
                }
            )*
        }
    };
}

async_twins! {
    batch => batch_async(commands: Vec<Command>) -> Vec<Outcome> = Command::Batch(commands), convert::batch;
    create_session => create_session_async(c: CreateSession) -> SessionReceipt
        = Command::CreateSession(c), convert::created;
    commit_turn => commit_turn_async(c: CommitTurn) -> TurnOutcome = Command::CommitTurn(c), convert::turn;
    rewrite => rewrite_async(c: Rewrite) -> Receipt = Command::Rewrite(c), convert::rewritten;
    restore => restore_async(c: Restore) -> Receipt = Command::Restore(c), convert::rewritten;
    fork => fork_async(c: Fork) -> SessionReceipt = Command::Fork(c), convert::created;
    fork_at => fork_at_async(parent: SessionId, index: u64) -> SessionReceipt
        = Command::Fork(Fork { parent, session: new_session_id(), index, replacement: None, labels: None }),
        convert::created;
    fork_replace => fork_replace_async(parent: SessionId, index: u64, message: Message) -> SessionReceipt
        = Command::Fork(Fork { parent, session: new_session_id(), index, replacement: Some(message), labels: None }),
        convert::created;
    archive => archive_async(session: SessionId, reason: impl Into<String>) -> bool
        = Command::Archive { session, reason: reason.into() }, convert::archived;
    revive => revive_async(session: SessionId, reason: impl Into<String>) -> u64
        = Command::Revive { session, reason: reason.into() }, convert::revived;
    append_context => append_context_async(c: AppendContext) -> ContextOutcome
        = Command::AppendContext(c), convert::context;
    record_tool_call => record_tool_call_async(c: RecordToolCall) -> ToolReceipt
        = Command::RecordToolCall(c), convert::tool;
    record_tool_result => record_tool_result_async(c: RecordToolResult) -> ToolReceipt
        = Command::RecordToolResult(c), convert::tool;
    set_labels => set_labels_async(c: SetLabels) -> Option<u64> = Command::SetLabels(c), convert::labels;
    set_metadata => set_metadata_async(c: SetMetadata) -> Option<u64> = Command::SetMetadata(c), convert::metadata;
    set_host_state => set_host_state_async(c: SetHostState) -> Option<u64>
        = Command::SetHostState(c), convert::host_state;
    acquire_lease => acquire_lease_async(session: SessionId, owner: impl Into<String>, ttl: std::time::Duration) -> Lease
        = Command::AcquireLease(AcquireLease { session, owner: owner.into(), ttl_ms: crate::engine::ttl_ms(ttl) }),
        convert::lease;
    renew_lease => renew_lease_async(lease: &Lease, ttl: std::time::Duration) -> Lease
        = Command::RenewLease(RenewLease { session: lease.session, token: lease.token, ttl_ms: crate::engine::ttl_ms(ttl) }),
        convert::lease;
    release_lease => release_lease_async(lease: &Lease) -> bool
        = Command::ReleaseLease { session: lease.session, token: lease.token }, convert::lease_released;
    append_draft => append_draft_async(session: SessionId, draft_id: impl Into<String>, segment: impl Into<Vec<u8>>) -> u32
        = Command::AppendDraft(AppendDraft { session, draft_id: draft_id.into(), segment: segment.into() }),
        convert::draft_appended;
    discard_draft => discard_draft_async(session: SessionId, draft_id: impl Into<String>) -> bool
        = Command::DiscardDraft { session, draft_id: draft_id.into() }, convert::draft_discarded;
    enqueue_input => enqueue_input_async(session: SessionId, input_id: impl Into<String>, message: Message, kind: annal_codec::InputKind) -> Option<u64>
        = Command::EnqueueInput(EnqueueInput { session, input_id: input_id.into(), message, kind }), convert::enqueued;
    claim_inputs => claim_inputs_async(c: ClaimInputs) -> crate::query::Claim = Command::ClaimInputs(c), convert::claimed;
    abandon_claim => abandon_claim_async(session: SessionId, claim: u64) -> bool
        = Command::AbandonClaim { session, claim }, convert::claim_abandoned;
    cancel_input => cancel_input_async(session: SessionId, input_id: impl Into<String>) -> bool
        = Command::CancelInput { session, input_id: input_id.into() }, convert::input_cancelled;
}
