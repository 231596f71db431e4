//! The event catalogue (v1) and the content objects events refer to.

use crate::ids::{CommitHash, ContentId, RevisionId, SessionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The kind byte of a record. Stable on disk: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// [`SessionCreated`]
    SessionCreated = 1,
    /// [`TurnCommitted`]
    TurnCommitted = 2,
    /// [`TranscriptRewritten`]
    TranscriptRewritten = 3,
    /// [`SessionArchived`]
    SessionArchived = 4,
    /// [`SessionRevived`]
    SessionRevived = 5,
    /// [`ContextAppended`]
    ContextAppended = 6,
    /// [`ToolCallRecorded`]
    ToolCallRecorded = 7,
    /// [`ToolResultRecorded`]
    ToolResultRecorded = 8,
    /// [`LabelsChanged`]
    LabelsChanged = 9,
    /// [`MetadataSet`]
    MetadataSet = 10,
    /// [`HostStateChanged`]
    HostStateChanged = 11,
    /// [`LeaseAcquired`]
    LeaseAcquired = 12,
    /// [`LeaseReleased`]
    LeaseReleased = 13,
    /// [`InputEnqueued`]
    InputEnqueued = 14,
    /// [`InputsClaimed`]
    InputsClaimed = 15,
    /// [`ClaimAbandoned`]
    ClaimAbandoned = 16,
    /// [`InputCancelled`]
    InputCancelled = 17,
    /// [`SessionPurged`]
    SessionPurged = 20,
}

impl EventKind {
    /// Every kind, in kind-byte order.
    pub const ALL: [EventKind; 18] = [
        EventKind::SessionCreated,
        EventKind::TurnCommitted,
        EventKind::TranscriptRewritten,
        EventKind::SessionArchived,
        EventKind::SessionRevived,
        EventKind::ContextAppended,
        EventKind::ToolCallRecorded,
        EventKind::ToolResultRecorded,
        EventKind::LabelsChanged,
        EventKind::MetadataSet,
        EventKind::HostStateChanged,
        EventKind::LeaseAcquired,
        EventKind::LeaseReleased,
        EventKind::InputEnqueued,
        EventKind::InputsClaimed,
        EventKind::ClaimAbandoned,
        EventKind::InputCancelled,
        EventKind::SessionPurged,
    ];

    /// The kind for a kind byte, if this binary knows it.
    pub fn from_byte(b: u8) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.byte() == b)
    }

    /// The kind byte.
    pub fn byte(self) -> u8 {
        self as u8
    }

    /// The schema version this binary writes for the kind.
    pub fn current_version(self) -> u16 {
        match self {
            // 2: a turn may set and remove host state entries (`TurnCommitted::state`).
            // 3: a turn may consume queued inputs (`TurnCommitted::inputs`).
            EventKind::TurnCommitted => 3,
            _ => 1,
        }
    }

    /// The oldest schema version this binary can read (older ones are upcast).
    pub fn oldest_version(self) -> u16 {
        match self {
            EventKind::ContextAppended => 0,
            _ => 1,
        }
    }

    /// The name used in logs, errors and exports.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::SessionCreated => "SessionCreated",
            EventKind::TurnCommitted => "TurnCommitted",
            EventKind::TranscriptRewritten => "TranscriptRewritten",
            EventKind::SessionArchived => "SessionArchived",
            EventKind::SessionRevived => "SessionRevived",
            EventKind::ContextAppended => "ContextAppended",
            EventKind::ToolCallRecorded => "ToolCallRecorded",
            EventKind::ToolResultRecorded => "ToolResultRecorded",
            EventKind::LabelsChanged => "LabelsChanged",
            EventKind::MetadataSet => "MetadataSet",
            EventKind::HostStateChanged => "HostStateChanged",
            EventKind::LeaseAcquired => "LeaseAcquired",
            EventKind::LeaseReleased => "LeaseReleased",
            EventKind::InputEnqueued => "InputEnqueued",
            EventKind::InputsClaimed => "InputsClaimed",
            EventKind::ClaimAbandoned => "ClaimAbandoned",
            EventKind::InputCancelled => "InputCancelled",
            EventKind::SessionPurged => "SessionPurged",
        }
    }

    /// The kind with this name, if any.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The session and revision a fork branched from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    /// The parent session.
    pub session: SessionId,
    /// The parent's head revision when the fork was taken.
    pub revision: RevisionId,
    /// How many of the parent's messages the fork starts with.
    pub message_count: u64,
}

/// A session came into being, empty, with initial messages, or as a fork.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCreated {
    /// Labels for listing.
    pub labels: BTreeMap<String, String>,
    /// Opaque host metadata.
    #[serde(with = "serde_bytes")]
    pub metadata: Vec<u8>,
    /// Set when the session is a fork.
    pub forked_from: Option<ForkOrigin>,
    /// Initial messages, after the forked prefix if any.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub messages: Vec<ContentId>,
    /// The revision after creation; replay recomputes and compares it.
    pub revision_after: RevisionId,
}

/// Token usage reported by a provider for one model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Provider name, e.g. `anthropic`.
    pub provider: String,
    /// Model name.
    pub model: String,
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Tokens read from a prompt cache.
    pub cache_read: u64,
    /// Tokens written to a prompt cache.
    pub cache_write: u64,
}

/// A turn appended messages to a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnCommitted {
    /// Host-chosen turn id, the idempotency key.
    pub turn_id: String,
    /// Hash of the turn's semantic content.
    pub commit_hash: CommitHash,
    /// Appended messages.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub messages: Vec<ContentId>,
    /// Usage deltas.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub usage: Vec<Usage>,
    /// Context keys this turn applied.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub applied_context: Vec<String>,
    /// Tool operations this turn settled or referenced.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub tool_ops: Vec<String>,
    /// Optional host run id.
    pub run_id: Option<String>,
    /// The revision after the turn.
    pub revision_after: RevisionId,
    /// Host state entries the turn set and removed (schema 2; empty when read from 1).
    pub state: StateDelta,
    /// Queued inputs the turn consumed, completed with it (schema 3; empty when read
    /// from 1 or 2).
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub inputs: Vec<String>,
}

impl TurnCommitted {
    /// The commit hash its content gives (`turn_commit_hash_with_inputs`): what
    /// `commit_hash` must be.
    pub fn recomputed_hash(&self) -> CommitHash {
        crate::hash::turn_commit_hash_with_inputs(
            &self.messages,
            &self.usage,
            &self.applied_context,
            &self.tool_ops,
            &self.state,
            &self.inputs,
        )
    }
}

/// The fields of [`TurnCommitted`] before its messages, for
/// [`TurnCommitted::from_bytes`].
#[derive(Deserialize)]
struct TurnHead {
    turn_id: String,
    commit_hash: CommitHash,
}

/// The fields of [`TurnCommitted`] after its messages.
#[derive(Deserialize)]
struct TurnTail {
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    usage: Vec<Usage>,
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    applied_context: Vec<String>,
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    tool_ops: Vec<String>,
    run_id: Option<String>,
    revision_after: RevisionId,
    state: StateDelta,
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    inputs: Vec<String>,
}

impl TurnCommitted {
    /// Decodes the current schema's encoding, as [`crate::wire::from_bytes`] does (the
    /// same bytes accepted, the same value), with the messages' ids taken in one copy
    /// each ([`crate::wire::from_bytes_around_ids`]): a turn of 100 messages decodes
    /// several times faster.
    pub fn from_bytes(bytes: &[u8], limit: u64) -> Result<TurnCommitted, crate::wire::WireError> {
        let (head, ids, tail): (TurnHead, _, TurnTail) = crate::wire::from_bytes_around_ids(bytes, limit)?;
        Ok(TurnCommitted {
            turn_id: head.turn_id,
            commit_hash: head.commit_hash,
            messages: ids.into_iter().map(ContentId).collect(),
            usage: tail.usage,
            applied_context: tail.applied_context,
            tool_ops: tail.tool_ops,
            run_id: tail.run_id,
            revision_after: tail.revision_after,
            state: tail.state,
            inputs: tail.inputs,
        })
    }
}

/// The fields of [`SessionCreated`] before its messages, for
/// [`SessionCreated::from_bytes`].
#[derive(Deserialize)]
struct CreatedHead {
    labels: BTreeMap<String, String>,
    #[serde(with = "serde_bytes")]
    metadata: Vec<u8>,
    forked_from: Option<ForkOrigin>,
}

impl SessionCreated {
    /// Decodes the current schema's encoding as [`crate::wire::from_bytes`] does, with
    /// the messages' ids taken in one copy each (as [`TurnCommitted::from_bytes`]).
    pub fn from_bytes(bytes: &[u8], limit: u64) -> Result<SessionCreated, crate::wire::WireError> {
        let (head, ids, revision_after): (CreatedHead, _, RevisionId) =
            crate::wire::from_bytes_around_ids(bytes, limit)?;
        Ok(SessionCreated {
            labels: head.labels,
            metadata: head.metadata,
            forked_from: head.forked_from,
            messages: ids.into_iter().map(ContentId).collect(),
            revision_after,
        })
    }
}

/// Schema version 2 of [`TurnCommitted`], before `inputs` existed. Upcast on read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnCommittedV2 {
    /// Host-chosen turn id, the idempotency key.
    pub turn_id: String,
    /// Hash of the turn's semantic content.
    pub commit_hash: CommitHash,
    /// Appended messages.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub messages: Vec<ContentId>,
    /// Usage deltas.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub usage: Vec<Usage>,
    /// Context keys this turn applied.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub applied_context: Vec<String>,
    /// Tool operations this turn settled or referenced.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub tool_ops: Vec<String>,
    /// Optional host run id.
    pub run_id: Option<String>,
    /// The revision after the turn.
    pub revision_after: RevisionId,
    /// Host state entries the turn set and removed.
    pub state: StateDelta,
}

impl From<TurnCommittedV2> for TurnCommitted {
    fn from(v2: TurnCommittedV2) -> TurnCommitted {
        TurnCommitted {
            turn_id: v2.turn_id,
            commit_hash: v2.commit_hash,
            messages: v2.messages,
            usage: v2.usage,
            applied_context: v2.applied_context,
            tool_ops: v2.tool_ops,
            run_id: v2.run_id,
            revision_after: v2.revision_after,
            state: v2.state,
            inputs: Vec::new(),
        }
    }
}

/// Schema version 1 of [`TurnCommitted`], before `state` existed. Upcast on read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnCommittedV1 {
    /// Host-chosen turn id, the idempotency key.
    pub turn_id: String,
    /// Hash of the turn's semantic content.
    pub commit_hash: CommitHash,
    /// Appended messages.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub messages: Vec<ContentId>,
    /// Usage deltas.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub usage: Vec<Usage>,
    /// Context keys this turn applied.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub applied_context: Vec<String>,
    /// Tool operations this turn settled or referenced.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub tool_ops: Vec<String>,
    /// Optional host run id.
    pub run_id: Option<String>,
    /// The revision after the turn.
    pub revision_after: RevisionId,
}

impl From<TurnCommittedV1> for TurnCommitted {
    fn from(v1: TurnCommittedV1) -> TurnCommitted {
        TurnCommitted {
            turn_id: v1.turn_id,
            commit_hash: v1.commit_hash,
            messages: v1.messages,
            usage: v1.usage,
            applied_context: v1.applied_context,
            tool_ops: v1.tool_ops,
            run_id: v1.run_id,
            revision_after: v1.revision_after,
            state: StateDelta::default(),
            inputs: Vec::new(),
        }
    }
}

/// Changes to a session's host state: named entries (tool, plugin or execution state,
/// model configuration) whose values are content objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDelta {
    /// Entries set (added or replaced): name → content id of the value.
    pub set: BTreeMap<String, ContentId>,
    /// Entry names removed.
    pub remove: BTreeSet<String>,
}

impl StateDelta {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

impl TranscriptRewritten {
    /// Decodes the current schema's encoding as [`crate::wire::from_bytes`] does, with
    /// the replacement's ids taken in one copy each (as [`TurnCommitted::from_bytes`]).
    pub fn from_bytes(bytes: &[u8], limit: u64) -> Result<TranscriptRewritten, crate::wire::WireError> {
        type Head = (RevisionId, u64, u64);
        type Tail = (RewriteKind, String, String, RevisionId);
        let ((parent_revision, start, end), ids, (kind, note, actor, revision_after)): (Head, _, Tail) =
            crate::wire::from_bytes_around_ids(bytes, limit)?;
        Ok(TranscriptRewritten {
            parent_revision,
            start,
            end,
            replacement: ids.into_iter().map(ContentId).collect(),
            kind,
            note,
            actor,
            revision_after,
        })
    }
}

/// Why a transcript was rewritten.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RewriteKind {
    /// A message was edited.
    Edit,
    /// A range was summarised.
    Compaction,
    /// Content was removed for safety or privacy.
    Redaction,
    /// The transcript went back to an earlier revision of the same session.
    Restore {
        /// The revision restored.
        target: RevisionId,
    },
}

impl RewriteKind {
    /// A short name: `edit`, `compaction`, `redaction` or `restore`.
    pub fn name(&self) -> &'static str {
        match self {
            RewriteKind::Edit => "edit",
            RewriteKind::Compaction => "compaction",
            RewriteKind::Redaction => "redaction",
            RewriteKind::Restore { .. } => "restore",
        }
    }
}

/// A splice of the transcript: `start..end` replaced by `replacement`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptRewritten {
    /// The head the rewrite was decided against.
    pub parent_revision: RevisionId,
    /// First replaced position.
    pub start: u64,
    /// One past the last replaced position.
    pub end: u64,
    /// New messages for the range (possibly none).
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub replacement: Vec<ContentId>,
    /// Why.
    pub kind: RewriteKind,
    /// Free-form note.
    pub note: String,
    /// Who did it.
    pub actor: String,
    /// The revision after the splice.
    pub revision_after: RevisionId,
}

/// The session was archived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionArchived {
    /// Why.
    pub reason: String,
}

/// The session was revived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRevived {
    /// Why.
    pub reason: String,
}

/// System context was staged, pending until a turn applies it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextAppended {
    /// Host-chosen key.
    pub key: String,
    /// The context text.
    pub content: ContentId,
    /// Where it came from.
    pub source: String,
}

/// Schema version 0 of [`ContextAppended`], before `source` existed. Upcast on read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextAppendedV0 {
    /// Host-chosen key.
    pub key: String,
    /// The context text.
    pub content: ContentId,
}

/// Whether re-running a tool call after a crash is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Recovery {
    /// Running it again is harmless.
    ReplaySafe,
    /// Running it again could repeat a side effect.
    NotReplaySafe,
}

/// How a tool operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolOutcome {
    /// It succeeded.
    Ok,
    /// It failed.
    Error,
    /// It was cancelled.
    Cancelled,
}

impl ToolOutcome {
    /// `ok`, `error` or `cancelled`.
    pub fn name(self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::Error => "error",
            ToolOutcome::Cancelled => "cancelled",
        }
    }
}

/// T1: a tool call was prepared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRecorded {
    /// Host-chosen operation id, unique per session.
    pub op_id: String,
    /// The provider's tool call id.
    pub call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Arguments.
    pub args: ContentId,
    /// The enclosing operation, for nested calls.
    pub parent_op: Option<String>,
    /// The turn this call belongs to, if known.
    pub turn_id: Option<String>,
    /// Whether re-running is safe.
    pub recovery: Recovery,
}

/// T2: a tool call was settled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultRecorded {
    /// The operation settled.
    pub op_id: String,
    /// How it ended.
    pub outcome: ToolOutcome,
    /// The result bytes.
    pub result: ContentId,
}

/// Labels were set or removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelsChanged {
    /// Labels set (added or overwritten).
    pub set: BTreeMap<String, String>,
    /// Label keys removed.
    pub remove: BTreeSet<String>,
}

/// The session's metadata blob was replaced (every version stays in the log).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataSet {
    /// The new metadata.
    #[serde(with = "serde_bytes")]
    pub metadata: Vec<u8>,
}

/// Host state entries were set or removed by the dedicated command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStateChanged {
    /// The change.
    pub state: StateDelta,
}

/// An execution lease on the session was granted: `owner` may drive the session until
/// `expires_at_ms` (writer clock), and commands fenced with `token` are accepted until a
/// larger token is granted. Tokens of a session start at 1 and grow by one per grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAcquired {
    /// Who holds the lease (a worker id).
    pub owner: String,
    /// The fencing token.
    pub token: u64,
    /// When the lease expires unless renewed, unix ms of the writer's clock.
    pub expires_at_ms: u64,
}

/// The holder of the lease with `token` gave it up before it expired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseReleased {
    /// The token of the lease released.
    pub token: u64,
}

/// When a queued input is for: the turn that runs now, or the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum InputKind {
    /// Claimed by the next turn, once the session is idle.
    NextTurn,
    /// Claimed by the live turn, at a checkpoint of its own.
    ActiveTurn,
}

impl InputKind {
    /// `next_turn` or `active_turn`.
    pub fn name(self) -> &'static str {
        match self {
            InputKind::NextTurn => "next_turn",
            InputKind::ActiveTurn => "active_turn",
        }
    }
}

/// What a claim is for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ClaimTarget {
    /// The turn with this id, running now (not committed yet): it claims active-turn
    /// inputs.
    Turn(String),
    /// The next turn: it claims next-turn inputs while the session is idle.
    NextTurn,
}

/// User input was queued in the session's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputEnqueued {
    /// Host-chosen id, the idempotency key.
    pub input_id: String,
    /// The message (a message object).
    pub message: ContentId,
    /// Which turn it is for.
    pub kind: InputKind,
}

/// Queued inputs were claimed by `owner` under the lease with `token`, until
/// `expires_at_ms`. The claim is named by this event's stream seq in its session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputsClaimed {
    /// Who claims (a worker id).
    pub owner: String,
    /// The lease token the claim was fenced with.
    pub token: u64,
    /// What the claim is for.
    pub target: ClaimTarget,
    /// The inputs claimed, in queue order.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub inputs: Vec<String>,
    /// When the claim expires (writer clock, unix ms).
    pub expires_at_ms: u64,
}

/// A claim was given up: its inputs that no turn completed are queued again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimAbandoned {
    /// The claim (the stream seq of its `InputsClaimed`).
    pub claim: u64,
}

/// A queued input was withdrawn before any turn consumed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputCancelled {
    /// The input.
    pub input_id: String,
}

/// The session was purged: every record of it before this one is erased (its payload
/// removed, its header and payload digest kept), and so is every content object no
/// record of a session that is not purged reaches. The tombstone itself keeps only
/// what the host gave the purge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionPurged {
    /// Why (for example `gdpr-art17`). Kept: it must not hold the erased data.
    pub reason: String,
    /// Who asked for it. Kept, like the reason.
    pub actor: String,
    /// The purged ancestor whose purge took this session with it, when it was purged as
    /// a fork descendant.
    pub with_ancestor: Option<SessionId>,
}

/// What is left of a record whose payload was erased by a purge: its header fields
/// (kept byte for byte, since the chain covers them) and the digest of the payload that
/// was there. Never written by a command; read back from an erased record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Erased {
    /// The kind of the event that was there.
    pub kind: EventKind,
    /// Its schema version.
    pub schema_version: u16,
    /// Its payload's length.
    pub payload_len: u32,
    /// `LogChain::payload_digest` of its payload.
    pub payload_digest: [u8; 32],
}

/// One event of the catalogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// See [`SessionCreated`].
    SessionCreated(SessionCreated),
    /// See [`TurnCommitted`].
    TurnCommitted(TurnCommitted),
    /// See [`TranscriptRewritten`].
    TranscriptRewritten(TranscriptRewritten),
    /// See [`SessionArchived`].
    SessionArchived(SessionArchived),
    /// See [`SessionRevived`].
    SessionRevived(SessionRevived),
    /// See [`ContextAppended`].
    ContextAppended(ContextAppended),
    /// See [`ToolCallRecorded`].
    ToolCallRecorded(ToolCallRecorded),
    /// See [`ToolResultRecorded`].
    ToolResultRecorded(ToolResultRecorded),
    /// See [`LabelsChanged`].
    LabelsChanged(LabelsChanged),
    /// See [`MetadataSet`].
    MetadataSet(MetadataSet),
    /// See [`HostStateChanged`].
    HostStateChanged(HostStateChanged),
    /// See [`LeaseAcquired`].
    LeaseAcquired(LeaseAcquired),
    /// See [`LeaseReleased`].
    LeaseReleased(LeaseReleased),
    /// See [`InputEnqueued`].
    InputEnqueued(InputEnqueued),
    /// See [`InputsClaimed`].
    InputsClaimed(InputsClaimed),
    /// See [`ClaimAbandoned`].
    ClaimAbandoned(ClaimAbandoned),
    /// See [`InputCancelled`].
    InputCancelled(InputCancelled),
    /// See [`SessionPurged`].
    SessionPurged(SessionPurged),
    /// A record of a purged session, its payload erased. See [`Erased`].
    Erased(Erased),
}

impl Event {
    /// The kind of this event.
    pub fn kind(&self) -> EventKind {
        match self {
            Event::SessionCreated(_) => EventKind::SessionCreated,
            Event::TurnCommitted(_) => EventKind::TurnCommitted,
            Event::TranscriptRewritten(_) => EventKind::TranscriptRewritten,
            Event::SessionArchived(_) => EventKind::SessionArchived,
            Event::SessionRevived(_) => EventKind::SessionRevived,
            Event::ContextAppended(_) => EventKind::ContextAppended,
            Event::ToolCallRecorded(_) => EventKind::ToolCallRecorded,
            Event::ToolResultRecorded(_) => EventKind::ToolResultRecorded,
            Event::LabelsChanged(_) => EventKind::LabelsChanged,
            Event::MetadataSet(_) => EventKind::MetadataSet,
            Event::HostStateChanged(_) => EventKind::HostStateChanged,
            Event::LeaseAcquired(_) => EventKind::LeaseAcquired,
            Event::LeaseReleased(_) => EventKind::LeaseReleased,
            Event::InputEnqueued(_) => EventKind::InputEnqueued,
            Event::InputsClaimed(_) => EventKind::InputsClaimed,
            Event::ClaimAbandoned(_) => EventKind::ClaimAbandoned,
            Event::InputCancelled(_) => EventKind::InputCancelled,
            Event::SessionPurged(_) => EventKind::SessionPurged,
            Event::Erased(e) => e.kind,
        }
    }

    /// Whether this is what is left of an erased record.
    pub fn is_erased(&self) -> bool {
        matches!(self, Event::Erased(_))
    }

    /// Every content id this event refers to, in field order.
    pub fn content_refs(&self) -> Vec<ContentId> {
        let mut refs = Vec::new();
        self.each_content_ref(|id| refs.push(id));
        refs
    }

    /// Calls `f` with every content id this event refers to, in field order (the ids of
    /// [`Event::content_refs`], without collecting them).
    pub fn each_content_ref(&self, mut f: impl FnMut(ContentId)) {
        match self {
            Event::SessionCreated(e) => e.messages.iter().copied().for_each(f),
            Event::TurnCommitted(e) => e.messages.iter().chain(e.state.set.values()).copied().for_each(f),
            Event::TranscriptRewritten(e) => e.replacement.iter().copied().for_each(f),
            Event::ContextAppended(e) => f(e.content),
            Event::ToolCallRecorded(e) => f(e.args),
            Event::ToolResultRecorded(e) => f(e.result),
            Event::HostStateChanged(e) => e.state.set.values().copied().for_each(f),
            Event::InputEnqueued(e) => f(e.message),
            Event::InputsClaimed(_)
            | Event::ClaimAbandoned(_)
            | Event::InputCancelled(_)
            | Event::SessionArchived(_)
            | Event::SessionRevived(_)
            | Event::LabelsChanged(_)
            | Event::MetadataSet(_)
            | Event::LeaseAcquired(_)
            | Event::LeaseReleased(_)
            | Event::SessionPurged(_)
            | Event::Erased(_) => {}
        }
    }

    /// The revision the event claims the session holds afterwards, when it changes the
    /// transcript.
    pub fn revision_after(&self) -> Option<RevisionId> {
        match self {
            Event::SessionCreated(e) => Some(e.revision_after),
            Event::TurnCommitted(e) => Some(e.revision_after),
            Event::TranscriptRewritten(e) => Some(e.revision_after),
            _ => None,
        }
    }
}

/// The role of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// System prompt or instructions.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's output.
    Tool,
}

impl Role {
    /// `system`, `user`, `assistant` or `tool`.
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// The role with this name.
    pub fn from_name(name: &str) -> Option<Role> {
        [Role::System, Role::User, Role::Assistant, Role::Tool].into_iter().find(|r| r.name() == name)
    }
}

/// A message as stored in the content table. Its content id is blake3 of its canonical
/// encoding. The body is opaque to the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageObject {
    /// Who speaks.
    pub role: Role,
    /// A short media type, e.g. `application/json`.
    pub content_type: String,
    /// The host's serialized message.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// Content ids of attachments, stored as separate content objects.
    #[serde(deserialize_with = "crate::wire::seq::deserialize")]
    pub attachments: Vec<ContentId>,
}
