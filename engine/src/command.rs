//! Commands: the mutations a host asks for, and what each returns.

use annal_codec::{Recovery, RevisionId, Role, SessionId, ToolOutcome, Usage};
use std::collections::{BTreeMap, BTreeSet};

/// A message as the host hands it in. The engine never parses `body`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// A short media type, e.g. `text/plain` or `application/json`.
    pub content_type: String,
    /// The host's serialized message.
    pub body: Vec<u8>,
    /// Attachment bytes; each is stored once as its own content object.
    pub attachments: Vec<Vec<u8>>,
}

impl Message {
    /// A message with a role, a content type and a body.
    pub fn new(role: Role, content_type: impl Into<String>, body: impl Into<Vec<u8>>) -> Message {
        Message { role, content_type: content_type.into(), body: body.into(), attachments: Vec::new() }
    }

    /// A `text/plain` message from the user.
    pub fn user(text: impl Into<String>) -> Message {
        Message::new(Role::User, "text/plain", text.into().into_bytes())
    }

    /// A `text/plain` message from the assistant.
    pub fn assistant(text: impl Into<String>) -> Message {
        Message::new(Role::Assistant, "text/plain", text.into().into_bytes())
    }

    /// A `text/plain` system message.
    pub fn system(text: impl Into<String>) -> Message {
        Message::new(Role::System, "text/plain", text.into().into_bytes())
    }

    /// A `text/plain` tool message.
    pub fn tool(text: impl Into<String>) -> Message {
        Message::new(Role::Tool, "text/plain", text.into().into_bytes())
    }

    /// Adds an attachment.
    pub fn with_attachment(mut self, bytes: impl Into<Vec<u8>>) -> Message {
        self.attachments.push(bytes.into());
        self
    }

    pub(crate) fn approx_bytes(&self) -> u64 {
        (self.body.len() + self.content_type.len() + self.attachments.iter().map(Vec::len).sum::<usize>()) as u64
    }
}

/// Which head a write expects.
///
/// `Exact(revision)` compares the transcript's content: it holds again after a restore
/// brings the same messages back, and events that do not touch the transcript (context,
/// tool calls, labels, archive, usage-only turns) do not move it. `Version(n)` compares
/// the session's stream sequence number ([`crate::SessionHead::stream_seq`]), which every
/// event of the session moves and nothing ever moves back: use it as a fence when the
/// host must know that nothing at all happened to the session since it read it (a
/// restore between the read and the write, the ABA case, fails it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Exactly this revision; otherwise `RevisionConflict`.
    Exact(RevisionId),
    /// Exactly this stream sequence number (the head's `stream_seq`); otherwise
    /// `VersionConflict`.
    Version(u64),
    /// Whatever the head is.
    Any,
}

/// Create a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateSession {
    /// The new session's id (UUIDv7 by default).
    pub session: SessionId,
    /// Labels for listing.
    pub labels: BTreeMap<String, String>,
    /// Opaque host metadata.
    pub metadata: Vec<u8>,
    /// Initial messages.
    pub messages: Vec<Message>,
}

impl CreateSession {
    /// A new, empty session with a fresh UUIDv7 id.
    pub fn new() -> CreateSession {
        CreateSession::with_id(new_session_id())
    }

    /// A new, empty session with a host-supplied id.
    pub fn with_id(session: SessionId) -> CreateSession {
        CreateSession { session, labels: BTreeMap::new(), metadata: Vec::new(), messages: Vec::new() }
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> CreateSession {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets the metadata bytes.
    pub fn metadata(mut self, bytes: impl Into<Vec<u8>>) -> CreateSession {
        self.metadata = bytes.into();
        self
    }

    /// Adds an initial message.
    pub fn message(mut self, message: Message) -> CreateSession {
        self.messages.push(message);
        self
    }
}

impl Default for CreateSession {
    fn default() -> Self {
        CreateSession::new()
    }
}

/// A fresh UUIDv7 session id: ids sort by creation time.
pub fn new_session_id() -> SessionId {
    SessionId(*uuid::Uuid::now_v7().as_bytes())
}

/// Commit a turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitTurn {
    /// The session.
    pub session: SessionId,
    /// Host-chosen idempotency key.
    pub turn_id: String,
    /// The head this turn was produced against.
    pub expected: Expected,
    /// Messages appended (at least one).
    pub messages: Vec<Message>,
    /// Usage deltas.
    pub usage: Vec<Usage>,
    /// Pending context keys this turn applies.
    pub applied_context: Vec<String>,
    /// Tool operations this turn references.
    pub tool_ops: Vec<String>,
    /// Optional host run id.
    pub run_id: Option<String>,
    /// Host state entries the turn sets and removes, atomically with it.
    pub state: StateChanges,
    /// The streamed draft this turn finalizes: the turn's commit removes it in the same
    /// transaction (an exact retry too; a draft that is not there is no error).
    pub draft: Option<String>,
    /// Queued inputs this turn consumes: each must be claimed; the turn completes them
    /// atomically (they are part of its event and its commit hash).
    pub inputs: Vec<String>,
}

/// Changes to a session's host state: small named blobs a runtime keeps beside the
/// transcript (tool state, plugin state, execution state, model configuration). Each
/// value is stored as a content object and addressed by its name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateChanges {
    /// Entries to set (added or replaced): name → value.
    pub set: BTreeMap<String, Vec<u8>>,
    /// Entry names to remove (a name the session does not hold is ignored).
    pub remove: BTreeSet<String>,
}

impl StateChanges {
    /// Whether it asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }

    fn approx_bytes(&self) -> u64 {
        self.set.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum::<u64>()
            + self.remove.iter().map(|k| k.len() as u64).sum::<u64>()
    }
}

/// Replace a session's metadata blob (every version stays in the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetMetadata {
    /// The session.
    pub session: SessionId,
    /// The new metadata.
    pub metadata: Vec<u8>,
    /// The head this change was made against.
    pub expected: Expected,
}

/// Set and remove host state entries of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetHostState {
    /// The session.
    pub session: SessionId,
    /// The changes.
    pub state: StateChanges,
    /// The head this change was made against.
    pub expected: Expected,
}

impl SetHostState {
    /// No changes yet, against `expected`.
    pub fn new(session: SessionId, expected: Expected) -> SetHostState {
        SetHostState { session, state: StateChanges::default(), expected }
    }

    /// Sets entry `name` to `value`.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> SetHostState {
        self.state.set.insert(name.into(), value.into());
        self
    }

    /// Removes entry `name`.
    pub fn remove(mut self, name: impl Into<String>) -> SetHostState {
        self.state.remove.insert(name.into());
        self
    }
}

impl CommitTurn {
    /// A turn with an id, an expected revision and no messages yet.
    pub fn new(session: SessionId, turn_id: impl Into<String>, expected: Expected) -> CommitTurn {
        CommitTurn {
            session,
            turn_id: turn_id.into(),
            expected,
            messages: Vec::new(),
            usage: Vec::new(),
            applied_context: Vec::new(),
            tool_ops: Vec::new(),
            run_id: None,
            state: StateChanges::default(),
            draft: None,
            inputs: Vec::new(),
        }
    }

    /// Consumes a claimed queued input with this turn (completed atomically with it).
    pub fn consumes(mut self, input_id: impl Into<String>) -> CommitTurn {
        self.inputs.push(input_id.into());
        self
    }

    /// Names the streamed draft this turn finalizes (removed with the commit).
    pub fn finalizes(mut self, draft_id: impl Into<String>) -> CommitTurn {
        self.draft = Some(draft_id.into());
        self
    }

    /// Sets host state entry `name` to `value` with this turn.
    pub fn set_state(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> CommitTurn {
        self.state.set.insert(name.into(), value.into());
        self
    }

    /// Removes host state entry `name` with this turn.
    pub fn remove_state(mut self, name: impl Into<String>) -> CommitTurn {
        self.state.remove.insert(name.into());
        self
    }

    /// Appends a message.
    pub fn message(mut self, m: Message) -> CommitTurn {
        self.messages.push(m);
        self
    }

    /// Adds a usage delta.
    pub fn usage(mut self, provider: &str, model: &str, input: u64, output: u64) -> CommitTurn {
        self.usage.push(Usage {
            provider: provider.into(),
            model: model.into(),
            input,
            output,
            cache_read: 0,
            cache_write: 0,
        });
        self
    }

    /// Applies a pending context key.
    pub fn apply_context(mut self, key: impl Into<String>) -> CommitTurn {
        self.applied_context.push(key.into());
        self
    }

    /// References a tool operation.
    pub fn tool_op(mut self, op_id: impl Into<String>) -> CommitTurn {
        self.tool_ops.push(op_id.into());
        self
    }

    /// Sets the run id.
    pub fn run_id(mut self, run: impl Into<String>) -> CommitTurn {
        self.run_id = Some(run.into());
        self
    }
}

/// Why a range is rewritten (restore has its own command).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RewriteReason {
    /// Edit a message.
    Edit,
    /// Summarise a range.
    Compaction,
    /// Remove content.
    Redaction,
}

/// Replace messages `start..end` of the head with `replacement`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewrite {
    /// The session.
    pub session: SessionId,
    /// The parent revision the rewrite was computed from (required).
    pub expected: RevisionId,
    /// First replaced position.
    pub start: u64,
    /// One past the last replaced position.
    pub end: u64,
    /// New messages (none deletes the range).
    pub replacement: Vec<Message>,
    /// Why.
    pub reason: RewriteReason,
    /// Free-form note for the revision graph.
    pub note: String,
    /// Who.
    pub actor: String,
}

/// Go back to a revision this session held before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restore {
    /// The session.
    pub session: SessionId,
    /// The head the restore was decided against.
    pub expected: RevisionId,
    /// The revision to restore.
    pub target: RevisionId,
    /// Free-form note.
    pub note: String,
    /// Who.
    pub actor: String,
}

/// Branch a new session from the head of another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fork {
    /// The parent session.
    pub parent: SessionId,
    /// The new session's id.
    pub session: SessionId,
    /// Keep the parent's first `index` messages.
    pub index: u64,
    /// With a replacement, message `index` is replaced by it (the fork holds `index + 1`).
    pub replacement: Option<Message>,
    /// Labels for the fork; `None` keeps the parent's.
    pub labels: Option<BTreeMap<String, String>>,
}

/// Stage system context for a later turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendContext {
    /// The session.
    pub session: SessionId,
    /// Host-chosen key.
    pub key: String,
    /// The context bytes (not blank).
    pub content: Vec<u8>,
    /// Where it came from.
    pub source: String,
}

/// T1: record a tool call before dispatching it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordToolCall {
    /// The session.
    pub session: SessionId,
    /// Host-chosen operation id, unique per session.
    pub op_id: String,
    /// The provider's tool call id.
    pub call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Argument bytes.
    pub args: Vec<u8>,
    /// Enclosing operation, for nested calls.
    pub parent_op: Option<String>,
    /// The turn the call belongs to.
    pub turn_id: Option<String>,
    /// Whether re-running after a crash is safe.
    pub recovery: Recovery,
}

/// T2: record a tool call's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordToolResult {
    /// The session.
    pub session: SessionId,
    /// The operation.
    pub op_id: String,
    /// How it ended.
    pub outcome: ToolOutcome,
    /// Result bytes.
    pub result: Vec<u8>,
}

/// Set and remove labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetLabels {
    /// The session.
    pub session: SessionId,
    /// Labels to set.
    pub set: BTreeMap<String, String>,
    /// Label keys to remove.
    pub remove: BTreeSet<String>,
}

/// Take the session's execution lease for `owner` for `ttl_ms` (writer clock). Granted
/// when nobody holds a live lease, with a token one larger than any the session had; a
/// holder asking again renews its lease in memory and keeps its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireLease {
    /// The session.
    pub session: SessionId,
    /// Who asks (a worker id, not empty).
    pub owner: String,
    /// How long the lease lasts unless renewed, in ms (1 ..= [`LEASE_TTL_MS_MAX`]).
    pub ttl_ms: u64,
}

/// Extend a live lease: the holder presents its token and a new time to live. Renewals
/// are held in the writer's memory, not in the log: after a restart a lease expires at
/// the time its grant recorded, and a takeover then fences the old holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewLease {
    /// The session.
    pub session: SessionId,
    /// The holder's token.
    pub token: u64,
    /// The new time to live from now, in ms (1 ..= [`LEASE_TTL_MS_MAX`]).
    pub ttl_ms: u64,
}

/// Append a segment to a streamed draft: partial model output that survives a crash
/// (up to the last flush) and that other readers see, kept outside the log's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendDraft {
    /// The session.
    pub session: SessionId,
    /// The host's draft id (an id: 1 to `id_bytes_max` bytes).
    pub draft_id: String,
    /// The segment (not empty).
    pub segment: Vec<u8>,
}

/// Queue user input in a session's inbox, for the live turn or the next one. An exact
/// retry (same id, same message and kind) writes nothing; the same id with anything
/// else is `InputConflict`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnqueueInput {
    /// The session.
    pub session: SessionId,
    /// Host-chosen id, the idempotency key.
    pub input_id: String,
    /// The input.
    pub message: Message,
    /// Which turn it is for.
    pub kind: annal_codec::InputKind,
}

/// Claim queued inputs, fenced by the session's current lease token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimInputs {
    /// The session.
    pub session: SessionId,
    /// The session's current lease token; any other is `Fenced`.
    pub token: u64,
    /// Who claims (a worker id).
    pub owner: String,
    /// For the live turn (active-turn inputs) or the next turn (next-turn inputs, only
    /// while the session is idle).
    pub target: annal_codec::ClaimTarget,
    /// How long the claim holds, in ms (1 ..= [`LEASE_TTL_MS_MAX`]).
    pub ttl_ms: u64,
    /// Inputs to claim at most (1 ..= `list_items_max`).
    pub max: u64,
}

/// The longest time to live a lease may ask for: one day.
pub const LEASE_TTL_MS_MAX: u64 = 24 * 60 * 60 * 1000;

/// A fencing token presented with a command: the command is accepted only while `token`
/// is `session`'s current lease token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The session whose lease fences the command (for a fork: the parent).
    pub session: SessionId,
    /// The token the worker holds.
    pub token: u64,
}

impl Fence {
    /// A fence on `session` with `token`.
    pub fn new(session: SessionId, token: u64) -> Fence {
        Fence { session, token }
    }
}

/// Every mutation. Hosts usually call the typed methods on [`crate::Engine`]; a
/// [`Command::Batch`] runs several commands all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Create a session.
    CreateSession(CreateSession),
    /// Commit a turn.
    CommitTurn(CommitTurn),
    /// Rewrite a range.
    Rewrite(Rewrite),
    /// Restore a revision.
    Restore(Restore),
    /// Fork a session.
    Fork(Fork),
    /// Archive a session.
    Archive {
        /// The session.
        session: SessionId,
        /// Why.
        reason: String,
    },
    /// Revive an archived session.
    Revive {
        /// The session.
        session: SessionId,
        /// Why.
        reason: String,
    },
    /// Stage context.
    AppendContext(AppendContext),
    /// T1.
    RecordToolCall(RecordToolCall),
    /// T2.
    RecordToolResult(RecordToolResult),
    /// Change labels.
    SetLabels(SetLabels),
    /// Replace the metadata blob.
    SetMetadata(SetMetadata),
    /// Set and remove host state entries.
    SetHostState(SetHostState),
    /// Several commands, in order, all or nothing.
    Batch(Vec<Command>),
    /// Take (or, for its holder, renew) the session's execution lease.
    AcquireLease(AcquireLease),
    /// Renew a held lease (in memory; writes nothing to the log).
    RenewLease(RenewLease),
    /// Give up a held lease.
    ReleaseLease {
        /// The session.
        session: SessionId,
        /// The holder's token.
        token: u64,
    },
    /// Append a segment to a draft (no event: drafts live beside the log).
    AppendDraft(AppendDraft),
    /// Remove a draft and its segments.
    DiscardDraft {
        /// The session.
        session: SessionId,
        /// The draft.
        draft_id: String,
    },
    /// Queue an input in the session's inbox.
    EnqueueInput(EnqueueInput),
    /// Claim queued inputs.
    ClaimInputs(ClaimInputs),
    /// Give a claim up: its inputs that no turn consumed are queued again.
    AbandonClaim {
        /// The session.
        session: SessionId,
        /// The claim (the stream seq of its `InputsClaimed`).
        claim: u64,
    },
    /// Withdraw an input no live claim holds.
    CancelInput {
        /// The session.
        session: SessionId,
        /// The input.
        input_id: String,
    },
    /// `command`, accepted only while `fence.token` is the current lease token of
    /// `fence.session`; otherwise [`crate::Rejection::Fenced`] and nothing is written.
    Fenced {
        /// The fence.
        fence: Fence,
        /// The command it guards.
        command: Box<Command>,
    },
}

impl Command {
    /// A bound on the bytes this command carries, checked against `command_bytes_max`.
    pub fn approx_bytes(&self) -> u64 {
        let msgs = |ms: &[Message]| ms.iter().map(Message::approx_bytes).sum::<u64>();
        let labels = |l: &BTreeMap<String, String>| l.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum::<u64>();
        match self {
            Command::CreateSession(c) => msgs(&c.messages) + labels(&c.labels) + c.metadata.len() as u64,
            Command::CommitTurn(c) => {
                msgs(&c.messages)
                    + c.turn_id.len() as u64
                    + c.applied_context.iter().chain(&c.tool_ops).map(|s| s.len() as u64).sum::<u64>()
                    + c.usage.iter().map(|u| (u.provider.len() + u.model.len() + 32) as u64).sum::<u64>()
                    + c.state.approx_bytes()
                    + c.inputs.iter().map(|s| s.len() as u64).sum::<u64>()
            }
            Command::Rewrite(c) => msgs(&c.replacement) + (c.note.len() + c.actor.len()) as u64,
            Command::Restore(c) => (c.note.len() + c.actor.len()) as u64,
            Command::Fork(c) => {
                c.replacement.as_ref().map_or(0, Message::approx_bytes) + c.labels.as_ref().map_or(0, labels)
            }
            Command::Archive { reason, .. } | Command::Revive { reason, .. } => reason.len() as u64,
            Command::AppendContext(c) => (c.content.len() + c.key.len() + c.source.len()) as u64,
            Command::RecordToolCall(c) => (c.args.len() + c.op_id.len() + c.call_id.len() + c.tool_name.len()) as u64,
            Command::RecordToolResult(c) => (c.result.len() + c.op_id.len()) as u64,
            Command::SetLabels(c) => labels(&c.set) + c.remove.iter().map(|k| k.len() as u64).sum::<u64>(),
            Command::SetMetadata(c) => c.metadata.len() as u64,
            Command::SetHostState(c) => c.state.approx_bytes(),
            Command::Batch(cs) => cs.iter().map(Command::approx_bytes).sum(),
            Command::AcquireLease(c) => c.owner.len() as u64,
            Command::RenewLease(_) | Command::ReleaseLease { .. } => 0,
            Command::AppendDraft(c) => (c.segment.len() + c.draft_id.len()) as u64,
            Command::DiscardDraft { draft_id, .. } => draft_id.len() as u64,
            Command::EnqueueInput(c) => c.input_id.len() as u64 + c.message.approx_bytes(),
            Command::ClaimInputs(c) => c.owner.len() as u64,
            Command::AbandonClaim { .. } => 0,
            Command::CancelInput { input_id, .. } => input_id.len() as u64,
            Command::Fenced { command, .. } => command.approx_bytes(),
        }
    }

    /// The command inside any fences.
    pub fn unfenced(&self) -> &Command {
        match self {
            Command::Fenced { command, .. } => command.unfenced(),
            other => other,
        }
    }

    /// The session the command writes to, if it is a single-session command.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Command::CreateSession(c) => Some(c.session),
            Command::CommitTurn(c) => Some(c.session),
            Command::Rewrite(c) => Some(c.session),
            Command::Restore(c) => Some(c.session),
            Command::Fork(c) => Some(c.session),
            Command::Archive { session, .. } | Command::Revive { session, .. } => Some(*session),
            Command::AppendContext(c) => Some(c.session),
            Command::RecordToolCall(c) => Some(c.session),
            Command::RecordToolResult(c) => Some(c.session),
            Command::SetLabels(c) => Some(c.session),
            Command::SetMetadata(c) => Some(c.session),
            Command::SetHostState(c) => Some(c.session),
            Command::AcquireLease(c) => Some(c.session),
            Command::RenewLease(c) => Some(c.session),
            Command::ReleaseLease { session, .. } => Some(*session),
            Command::AppendDraft(c) => Some(c.session),
            Command::DiscardDraft { session, .. } => Some(*session),
            Command::EnqueueInput(c) => Some(c.session),
            Command::ClaimInputs(c) => Some(c.session),
            Command::AbandonClaim { session, .. } | Command::CancelInput { session, .. } => Some(*session),
            Command::Fenced { command, .. } => command.session(),
            Command::Batch(_) => None,
        }
    }
}

/// Where a committed event landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    /// Global sequence number of the event.
    pub seq: u64,
    /// The session's revision after the event.
    pub revision: RevisionId,
    /// Writer clock, unix ms.
    pub committed_at_ms: u64,
}

/// The result of a command that was accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A session was created (or forked).
    Created {
        /// The new session.
        session: SessionId,
        /// Its receipt.
        receipt: Receipt,
    },
    /// A turn was committed now.
    Committed(Receipt),
    /// The exact turn was committed before; this is the original receipt.
    AlreadyCommitted(Receipt),
    /// The transcript was rewritten or restored.
    Rewritten(Receipt),
    /// The session is archived; `seq` is `None` if it already was.
    Archived {
        /// The archive event, if one was written.
        seq: Option<u64>,
    },
    /// The session was revived.
    Revived {
        /// The revive event.
        seq: u64,
    },
    /// The context was staged.
    Staged {
        /// The event.
        seq: u64,
    },
    /// The same key and content were staged before; nothing written.
    Duplicate,
    /// A tool call or result was recorded; `created` is false for an exact retry.
    Tool {
        /// Whether an event was written.
        created: bool,
        /// The event, when written.
        seq: Option<u64>,
    },
    /// Labels changed; `seq` is `None` when nothing changed.
    Labels {
        /// The event, if one was written.
        seq: Option<u64>,
    },
    /// The metadata was replaced; `seq` is `None` when it already was this.
    Metadata {
        /// The event, if one was written.
        seq: Option<u64>,
    },
    /// Host state changed; `seq` is `None` when nothing changed.
    HostState {
        /// The event, if one was written.
        seq: Option<u64>,
    },
    /// The session was purged (the tombstone's seq). Only a purge writes one; commands
    /// never do.
    Purged {
        /// The tombstone.
        seq: u64,
    },
    /// Every command of a batch, in order.
    Batch(Vec<Outcome>),
    /// A lease was granted or renewed.
    Lease {
        /// The lease.
        lease: Lease,
        /// The `LeaseAcquired` event, when the lease was granted now (`None` for a
        /// renewal).
        seq: Option<u64>,
    },
    /// A lease was released; `seq` is `None` if it already was.
    LeaseReleased {
        /// The `LeaseReleased` event, if one was written.
        seq: Option<u64>,
    },
    /// A segment was appended to a draft.
    DraftAppended {
        /// The segment's index in the draft.
        index: u32,
        /// The draft's bytes with it.
        draft_bytes: u64,
    },
    /// A draft was discarded; `existed` is false if there was none.
    DraftDiscarded {
        /// Whether the draft existed.
        existed: bool,
    },
    /// An input was queued; `seq` is `None` for an exact retry.
    Enqueued {
        /// The `InputEnqueued` event, if one was written.
        seq: Option<u64>,
    },
    /// Inputs were claimed; `claim` is `None` when none was claimable.
    Claimed {
        /// The `InputsClaimed` event, if one was written.
        seq: Option<u64>,
        /// The claim: the session's stream seq of its `InputsClaimed` event.
        claim: Option<u64>,
        /// The inputs claimed, in queue order.
        inputs: Vec<String>,
        /// When the claim expires (writer clock, unix ms).
        expires_at_ms: u64,
    },
    /// A claim was abandoned; `seq` is `None` if it was closed already.
    ClaimAbandoned {
        /// The `ClaimAbandoned` event, if one was written.
        seq: Option<u64>,
    },
    /// An input was cancelled; `seq` is `None` if it was already.
    InputCancelled {
        /// The `InputCancelled` event, if one was written.
        seq: Option<u64>,
    },
}

/// An execution lease as its holder sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The session.
    pub session: SessionId,
    /// The holder.
    pub owner: String,
    /// The fencing token: present it with [`Fence`] on every command.
    pub token: u64,
    /// When it expires unless renewed (writer clock, unix ms).
    pub expires_at_ms: u64,
}

impl Lease {
    /// The fence for commands made under this lease.
    pub fn fence(&self) -> Fence {
        Fence { session: self.session, token: self.token }
    }
}

impl Outcome {
    /// The seqs of the events this outcome wrote, in commit order (a batch's members in
    /// order); empty for a retry or a no-op. A host can tell from it whether a command
    /// wrote and where each event landed.
    pub fn seqs(&self) -> Vec<u64> {
        let mut out = Vec::new();
        self.push_seqs(&mut out);
        out
    }

    /// Whether this outcome wrote at least one event.
    pub fn wrote(&self) -> bool {
        !self.seqs().is_empty()
    }

    /// Moves what this outcome wrote to where it landed: each written event's seq
    /// through `seq`, and each written receipt's time to `at_ms` (a shared log's fold
    /// numbers and stamps the events it applies, `crate::backend`).
    pub(crate) fn relocate(&mut self, seq: &impl Fn(u64) -> u64, at_ms: u64) {
        match self {
            Outcome::Created { receipt, .. } | Outcome::Committed(receipt) | Outcome::Rewritten(receipt) => {
                receipt.seq = seq(receipt.seq);
                receipt.committed_at_ms = at_ms;
            }
            Outcome::Revived { seq: s } | Outcome::Staged { seq: s } | Outcome::Purged { seq: s } => *s = seq(*s),
            Outcome::Archived { seq: s }
            | Outcome::Labels { seq: s }
            | Outcome::Metadata { seq: s }
            | Outcome::HostState { seq: s }
            | Outcome::Tool { seq: s, .. }
            | Outcome::Lease { seq: s, .. }
            | Outcome::LeaseReleased { seq: s }
            | Outcome::Enqueued { seq: s }
            | Outcome::ClaimAbandoned { seq: s }
            | Outcome::InputCancelled { seq: s }
            | Outcome::Claimed { seq: s, .. } => {
                if let Some(s) = s.as_mut() {
                    *s = seq(*s);
                }
            }
            Outcome::AlreadyCommitted(_)
            | Outcome::Duplicate
            | Outcome::DraftAppended { .. }
            | Outcome::DraftDiscarded { .. } => {}
            Outcome::Batch(outcomes) => outcomes.iter_mut().for_each(|o| o.relocate(seq, at_ms)),
        }
    }

    fn push_seqs(&self, out: &mut Vec<u64>) {
        match self {
            Outcome::Created { receipt, .. } | Outcome::Committed(receipt) | Outcome::Rewritten(receipt) => {
                out.push(receipt.seq)
            }
            Outcome::Revived { seq } | Outcome::Staged { seq } | Outcome::Purged { seq } => out.push(*seq),
            Outcome::Archived { seq }
            | Outcome::Labels { seq }
            | Outcome::Metadata { seq }
            | Outcome::HostState { seq }
            | Outcome::Tool { seq, .. }
            | Outcome::Lease { seq, .. }
            | Outcome::LeaseReleased { seq }
            | Outcome::Enqueued { seq }
            | Outcome::ClaimAbandoned { seq }
            | Outcome::InputCancelled { seq }
            | Outcome::Claimed { seq, .. } => out.extend(*seq),
            Outcome::AlreadyCommitted(_)
            | Outcome::Duplicate
            | Outcome::DraftAppended { .. }
            | Outcome::DraftDiscarded { .. } => {}
            Outcome::Batch(outcomes) => outcomes.iter().for_each(|o| o.push_seqs(out)),
        }
    }
}
