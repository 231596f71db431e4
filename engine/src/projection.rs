//! Projection rows and the projection catalogue. Every row here is written by
//! [`crate::evolve()`] and nothing else.

use crate::store::Table;
use annal_codec::{ClaimTarget, ContentId, ForkOrigin, InputKind, Recovery, RevisionId, SessionId, ToolOutcome};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A disposable projection: a set of tables folded from the log by [`crate::evolve()`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Projection {
    /// Session heads.
    Heads,
    /// The current transcript of each session.
    Transcript,
    /// Revision graphs and fork edges.
    Graph,
    /// Pending and applied context appends.
    Context,
    /// Turn idempotency records.
    Turns,
    /// The usage ledger.
    Usage,
    /// The label index for listing.
    Labels,
    /// The tool-operation ledger.
    Tools,
    /// The per-session stream index: (session, stream seq) → global seq.
    Streams,
    /// The content-id index: the first 8 bytes of a content id → the seqs of the content
    /// rows holding an object of that key.
    Content,
    /// The per-session input inbox: queued inputs and their claims.
    Inbox,
}

impl Projection {
    /// Every projection.
    pub const ALL: [Projection; 11] = [
        Projection::Heads,
        Projection::Transcript,
        Projection::Graph,
        Projection::Context,
        Projection::Turns,
        Projection::Usage,
        Projection::Labels,
        Projection::Tools,
        Projection::Streams,
        Projection::Content,
        Projection::Inbox,
    ];

    /// The name used in `meta` and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Projection::Heads => "heads",
            Projection::Transcript => "transcript",
            Projection::Graph => "graph",
            Projection::Context => "context",
            Projection::Turns => "turns",
            Projection::Usage => "usage",
            Projection::Labels => "labels",
            Projection::Tools => "tools",
            Projection::Streams => "streams",
            Projection::Content => "content",
            Projection::Inbox => "inbox",
        }
    }

    /// The projection with this name.
    pub fn from_name(name: &str) -> Option<Projection> {
        Projection::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The fold version. Bump it when the projection's code changes: a database whose
    /// stored version differs rebuilds the projection at open.
    pub fn version(self) -> u32 {
        match self {
            // 2: a turn reporting a model twice counts as one turn for it.
            Projection::Usage => 2,
            // 2: the transition that first produces a node is not stored as an edge.
            // 3: a recipe's message ids are one byte string (`annal_codec::ids::id_list`).
            // 4: the revision order in rows of 32 ids (it was a row per node).
            // 5: a node's row leaves out its revision and its splice's parent.
            // 6: a session's nodes in hashed buckets (`crate::buckets`; it was a row per
            // node).
            // 7: a node keeps what its record does not hold, and names its parents by the
            //    seqs of their records (it copied the recipe and held the parents' ids);
            //    the revision order holds those seqs, 16 a row (it held 8 ids a row).
            Projection::Graph => 7,
            // 2: heads carry the host state; the host state history table.
            // 3: heads carry the execution lease.
            // 4: the tombstones of purged sessions.
            Projection::Heads => 4,
            // 2: the recency order and the label counts.
            Projection::Labels => 2,
            // 2: the transcript in chunks of 128 content ids, and its chain values every
            // 128 positions (`crate::transcript`).
            // 3: the last chunk in pieces of 32 positions (it was a row per position).
            // 4: a chunk holds runs that name their ids by the record whose message list
            //    holds them (it held the ids, 32 bytes each).
            Projection::Transcript => 4,
            // 2: the stream index in rows of 64 stream seqs (it was a row per event).
            Projection::Streams => 2,
            // 2: a session's turn records in hashed buckets (`crate::buckets`; it was a
            // row per turn).
            // 3: a turn's entry is the seq of its record (it was the commit hash and the
            //    receipt, which the record holds).
            Projection::Turns => 3,
            // 2: the content-id index in hashed buckets (it was a row per object).
            // 3: keyed by the first 8 bytes of an id, listing the rows of that key
            //    (`crate::buckets::CONTENT`; it was the whole id and one seq).
            Projection::Content => 3,
            _ => 1,
        }
    }

    /// The tables this projection owns.
    pub fn tables(self) -> &'static [Table] {
        match self {
            Projection::Heads => &[Table::Heads, Table::HostStateLog, Table::Purged],
            Projection::Transcript => &[Table::Transcript, Table::TranscriptTip, Table::TranscriptChains],
            Projection::Graph => {
                &[Table::Revisions, Table::RevisionOrder, Table::RevisionEdges, Table::Forks, Table::GraphTip]
            }
            Projection::Context => &[Table::Context],
            Projection::Turns => &[Table::Turns],
            Projection::Usage => &[Table::Usage],
            Projection::Labels => &[
                Table::LabelSessions,
                Table::LabelIndex,
                Table::CreationOrder,
                Table::RecencyOrder,
                Table::LabelCounts,
                Table::RecencyTip,
            ],
            Projection::Tools => {
                &[Table::ToolOps, Table::ToolOrder, Table::Unsettled, Table::UnsettledAll, Table::ToolTip]
            }
            Projection::Streams => &[Table::StreamIndex],
            Projection::Content => &[Table::ContentIndex],
            Projection::Inbox => &[Table::Inputs, Table::Claims, Table::InboxTip],
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// A set of projections, for folding or rebuilding some of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProjectionSet(u16);

impl ProjectionSet {
    /// Every projection.
    pub fn all() -> ProjectionSet {
        ProjectionSet(Projection::ALL.iter().fold(0, |m, p| m | p.bit()))
    }

    /// No projection.
    pub fn none() -> ProjectionSet {
        ProjectionSet(0)
    }

    /// This set plus `p`.
    pub fn with(self, p: Projection) -> ProjectionSet {
        ProjectionSet(self.0 | p.bit())
    }

    /// Whether `p` is in the set.
    pub fn contains(self, p: Projection) -> bool {
        self.0 & p.bit() != 0
    }

    /// The members of both sets.
    pub(crate) fn and(self, other: ProjectionSet) -> ProjectionSet {
        ProjectionSet(self.0 & other.0)
    }

    /// The members of this set that `other` lacks.
    pub(crate) fn without(self, other: ProjectionSet) -> ProjectionSet {
        ProjectionSet(self.0 & !other.0)
    }

    /// The members, in catalogue order.
    pub fn iter(self) -> impl Iterator<Item = Projection> {
        Projection::ALL.into_iter().filter(move |p| self.contains(*p))
    }
}

impl FromIterator<Projection> for ProjectionSet {
    fn from_iter<I: IntoIterator<Item = Projection>>(iter: I) -> Self {
        iter.into_iter().fold(ProjectionSet::none(), ProjectionSet::with)
    }
}

/// What is left of a purged session in the projections: where its tombstone is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgedSession {
    /// The tombstone's global seq.
    pub seq: u64,
    /// The tombstone's stream seq (the session's last).
    pub stream_seq: u64,
    /// When it was purged, unix ms.
    pub purged_at_ms: u64,
}

/// The head of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHead {
    /// The session.
    pub session: SessionId,
    /// Current revision.
    pub revision: RevisionId,
    /// Messages in the current transcript.
    pub message_count: u64,
    /// Whether archived.
    pub archived: bool,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Host metadata.
    #[serde(with = "serde_bytes")]
    pub metadata: Vec<u8>,
    /// Set for forks.
    pub forked_from: Option<ForkOrigin>,
    /// Seq of the creating event.
    pub created_seq: u64,
    /// Creation time, unix ms.
    pub created_at_ms: u64,
    /// Seq of the latest event.
    pub last_seq: u64,
    /// Stream seq of the latest event (events in the session).
    pub stream_seq: u64,
    /// Time of the latest event, unix ms.
    pub updated_at_ms: u64,
    /// Host state entries: name → content id of the value.
    pub host_state: BTreeMap<String, ContentId>,
    /// The session's execution lease, as last granted or released in the log (renewals
    /// live in the writer's memory: [`crate::Reader::lease`] shows them).
    pub lease: Option<LeaseState>,
}

/// Where a queued input stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InputState {
    /// Queued, held by no claim.
    Pending,
    /// Held by the claim made at stream seq `claim` until `expires_at_ms` (after which
    /// it is claimable again).
    Claimed {
        /// The claim.
        claim: u64,
        /// When the claim expires (writer clock, unix ms).
        expires_at_ms: u64,
    },
    /// Consumed by a turn.
    Completed {
        /// The turn.
        turn_id: String,
        /// The event that completed it.
        seq: u64,
    },
    /// Withdrawn.
    Cancelled {
        /// The event that cancelled it.
        seq: u64,
    },
}

impl InputState {
    /// `pending`, `claimed`, `completed` or `cancelled`.
    pub fn name(&self) -> &'static str {
        match self {
            InputState::Pending => "pending",
            InputState::Claimed { .. } => "claimed",
            InputState::Completed { .. } => "completed",
            InputState::Cancelled { .. } => "cancelled",
        }
    }

    /// Whether a claim may take it at `now_ms`: pending, or held by an expired claim.
    pub fn claimable(&self, now_ms: u64) -> bool {
        match self {
            InputState::Pending => true,
            InputState::Claimed { expires_at_ms, .. } => *expires_at_ms <= now_ms,
            _ => false,
        }
    }
}

/// A queued input of a session's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRow {
    /// The host's input id.
    pub input_id: String,
    /// The event that queued it.
    pub seq: u64,
    /// The message object.
    pub message: ContentId,
    /// Which turn it is for.
    pub kind: InputKind,
    /// Where it stands.
    pub state: InputState,
}

/// A claim on queued inputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRow {
    /// The claim: the session's stream seq of its `InputsClaimed` (stream seqs survive a
    /// session copy; global seqs do not).
    pub claim: u64,
    /// Who holds it.
    pub owner: String,
    /// The lease token it was fenced with.
    pub token: u64,
    /// What it is for.
    pub target: ClaimTarget,
    /// The inputs it took.
    #[serde(deserialize_with = "annal_codec::wire::seq::deserialize")]
    pub inputs: Vec<String>,
    /// When it expires (writer clock, unix ms).
    pub expires_at_ms: u64,
    /// Whether it still holds an input (not abandoned, not all consumed or re-claimed).
    pub open: bool,
}

/// A session's inbox at a glance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxTip {
    /// Inputs neither completed nor cancelled, in queue order.
    #[serde(deserialize_with = "annal_codec::wire::seq::deserialize")]
    pub open: Vec<String>,
    /// Open claims, oldest first.
    #[serde(deserialize_with = "annal_codec::wire::seq::deserialize")]
    pub claims: Vec<u64>,
}

/// A session's execution lease as the log records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    /// Who holds (or last held) it.
    pub owner: String,
    /// Its fencing token: the session's current one. Commands fenced with a smaller token
    /// are refused.
    pub token: u64,
    /// When it expires unless renewed (writer clock, unix ms).
    pub expires_at_ms: u64,
    /// Whether its holder released it.
    pub released: bool,
}

impl LeaseState {
    /// Whether the lease still excludes other owners at `now_ms`, given the expiry
    /// `expires_at_ms` it has (its granted one, or a later renewal).
    pub fn holds(&self, expires_at_ms: u64, now_ms: u64) -> bool {
        !self.released && now_ms < expires_at_ms
    }
}

/// One position of the current transcript: its id and chain value, as
/// [`crate::transcript::rows`] reads them from the id chunks and the checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptRow {
    /// The message's content id.
    pub content: ContentId,
    /// The chain value `c(position + 1)`.
    pub chain: RevisionId,
}

/// Length and revision of a session's current transcript.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptTip {
    /// Messages.
    pub len: u64,
    /// Chain value over all of them.
    pub revision: RevisionId,
}

/// How a revision node first came to be.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeOrigin {
    /// The session was created (possibly as a fork).
    Created,
    /// A turn appended messages.
    Turn {
        /// The turn id.
        turn_id: String,
    },
    /// A rewrite or restore.
    Rewrite {
        /// `edit`, `compaction`, `redaction` or `restore`.
        kind: String,
        /// Note.
        note: String,
        /// Actor.
        actor: String,
    },
}

/// How to rebuild a revision's message list from earlier ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Recipe {
    /// The first revision of a session: the fork prefix (if any) plus messages.
    Root {
        /// Fork origin.
        fork: Option<ForkOrigin>,
        /// Messages after the prefix.
        #[serde(with = "annal_codec::ids::id_list")]
        messages: Vec<ContentId>,
    },
    /// The parent revision with `start..end` replaced (a turn is a splice at the end).
    Splice {
        /// The parent revision (same session).
        parent: RevisionId,
        /// Start.
        start: u64,
        /// End.
        end: u64,
        /// Replacement.
        #[serde(with = "annal_codec::ids::id_list")]
        replacement: Vec<ContentId>,
    },
}

/// A node of a session's revision graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionNode {
    /// The revision.
    pub revision: RevisionId,
    /// Order of first appearance in the session, from 0.
    pub ordinal: u64,
    /// Every revision an edge came from (none for the first).
    pub parents: Vec<RevisionId>,
    /// How it first came to be.
    pub origin: NodeOrigin,
    /// Seq of the event that first produced it.
    pub seq: u64,
    /// Messages.
    pub message_count: u64,
    /// When first produced, unix ms.
    pub created_at_ms: u64,
    /// How to materialize it.
    pub recipe: Recipe,
}

/// A revision node as the graph projection stores it (version 7): what the record that
/// first produced the node does not hold. The rest (the origin, the time and the recipe)
/// is read from that record, at `seq` ([`revision_node`]): a node costs about 13 bytes and
/// its key, where version 6 copied the recipe's message ids (32 bytes each) and named its
/// parents by their 32-byte ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredNode {
    /// Order of first appearance in the session.
    pub ordinal: u64,
    /// Each parent by the seq of the record that first produced it (its node's `seq`);
    /// the first is the head the node was made from.
    #[serde(deserialize_with = "annal_codec::wire::seq::deserialize")]
    pub parents: Vec<u64>,
    /// The record that first produced the node.
    pub seq: u64,
    /// Messages.
    pub message_count: u64,
}

/// Where a projection key of the revision nodes names `revision` in `session`.
pub(crate) fn node_location(session: &SessionId, revision: &RevisionId) -> crate::error::Location {
    crate::error::Location::Projection {
        table: Table::Revisions.name(),
        key: crate::store::hex(&crate::store::keys::session_rev(session, revision)),
    }
}

/// The stored node of `revision` in `session`, whose nodes' map is `size` bytes
/// (`buckets::REVISIONS.size`); `None` if the session never had that revision.
pub(crate) fn stored_node<S: crate::store::Store + ?Sized>(
    store: &S,
    session: &SessionId,
    size: u64,
    revision: &RevisionId,
) -> crate::error::Result<Option<StoredNode>> {
    let key = crate::store::keys::session_rev(session, revision);
    crate::buckets::REVISIONS.get_sized(store, &session.0, size, &revision.0, |v| {
        crate::store::decode_row::<StoredNode>(Table::Revisions, &key, v)
    })
}

/// The record at `seq` that first produced a revision in `session`, and that revision,
/// read through [`crate::store::Store::record_at`] (within a batch, the writer's store
/// answers for the batch's own records first).
/// With `revision`, the record must produce that one. A record of another session, or
/// that produces no revision (or another), is a corrupt projection; a store that cannot
/// read the log cannot answer ([`crate::Error::Storage`]).
pub(crate) fn node_record<S: crate::store::Store + ?Sized>(
    store: &S,
    session: &SessionId,
    revision: Option<&RevisionId>,
    seq: u64,
) -> crate::error::Result<(RevisionId, annal_codec::Record)> {
    let record = store.record_at(seq)?.ok_or_else(|| {
        crate::error::Error::storage(format!("the record of a revision node (seq {seq}) cannot be read here"))
    })?;
    match record.event.revision_after() {
        Some(produced)
            if record.seq == seq && record.session == *session && revision.is_none_or(|r| *r == produced) =>
        {
            Ok((produced, record))
        }
        _ => Err(crate::error::Error::corrupt(
            match revision {
                Some(r) => node_location(session, r),
                None => crate::error::Location::Log { seq },
            },
            format!("a revision node names seq {seq}, which is not the record that produced it"),
        )),
    }
}

/// How `node` (of `revision`, first produced by `record`) came to be, and its recipe,
/// whose splice parent is `parent` (the node's first parent).
pub(crate) fn origin_and_recipe(
    session: &SessionId,
    revision: &RevisionId,
    node: &StoredNode,
    record: annal_codec::Record,
    parent: Option<RevisionId>,
) -> crate::error::Result<(NodeOrigin, Recipe)> {
    use annal_codec::Event;
    let corrupt = |what: &str| crate::error::Error::corrupt(node_location(session, revision), what.to_string());
    match record.event {
        Event::SessionCreated(e) => {
            Ok((NodeOrigin::Created, Recipe::Root { fork: e.forked_from, messages: e.messages }))
        }
        Event::TurnCommitted(e) => {
            let start = node
                .message_count
                .checked_sub(e.messages.len() as u64)
                .ok_or_else(|| corrupt("a turn longer than its node"))?;
            let parent = parent.ok_or_else(|| corrupt("a splice with no parent"))?;
            let recipe = Recipe::Splice { parent, start, end: start, replacement: e.messages };
            Ok((NodeOrigin::Turn { turn_id: e.turn_id }, recipe))
        }
        Event::TranscriptRewritten(e) => {
            if parent != Some(e.parent_revision) {
                return Err(corrupt("a rewrite's node whose first parent is not the rewrite's parent"));
            }
            let origin = NodeOrigin::Rewrite { kind: e.kind.name().into(), note: e.note, actor: e.actor };
            let recipe =
                Recipe::Splice { parent: e.parent_revision, start: e.start, end: e.end, replacement: e.replacement };
            Ok((origin, recipe))
        }
        _ => Err(corrupt("a revision node whose record produces no revision")),
    }
}

/// Reads the revision node of `revision` in `session` (`None` if the session never had
/// that revision): its row in the graph projection, and the rest from the record that
/// first produced it and from its parents' records. So `store` must see the log (a view,
/// or an overlay over one): a store of projection rows alone answers with
/// [`crate::Error::Storage`].
pub fn revision_node<S: crate::store::Store + ?Sized>(
    store: &S,
    session: &SessionId,
    revision: &RevisionId,
) -> crate::error::Result<Option<RevisionNode>> {
    let size = crate::buckets::REVISIONS.size(store, &session.0)?;
    let Some(node) = stored_node(store, session, size, revision)? else {
        return Ok(None);
    };
    let (_, record) = node_record(store, session, Some(revision), node.seq)?;
    full_node(store, session, revision, node, record, &Default::default()).map(Some)
}

/// The [`RevisionNode`] of `revision` from its stored `node` and its `record`. Each
/// parent's id is taken from `known` (seq of a node's record → its revision), else read
/// from the parent's record.
pub(crate) fn full_node<S: crate::store::Store + ?Sized>(
    store: &S,
    session: &SessionId,
    revision: &RevisionId,
    node: StoredNode,
    record: annal_codec::Record,
    known: &std::collections::HashMap<u64, RevisionId>,
) -> crate::error::Result<RevisionNode> {
    let parents = node
        .parents
        .iter()
        .map(|&p| match known.get(&p) {
            Some(r) => Ok(*r),
            None => node_record(store, session, None, p).map(|(r, _)| r),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let created_at_ms = record.committed_at_ms;
    let (origin, recipe) = origin_and_recipe(session, revision, &node, record, parents.first().copied())?;
    Ok(RevisionNode {
        revision: *revision,
        ordinal: node.ordinal,
        parents,
        origin,
        seq: node.seq,
        message_count: node.message_count,
        created_at_ms,
        recipe,
    })
}

impl RevisionNode {
    /// The head transition that first produced this revision, by its origin event: from
    /// nothing for a session's first revision, else from its first parent (the head it
    /// was made from; later parents are only ever appended).
    pub fn creation_edge(&self) -> RevisionEdge {
        let from = match self.origin {
            NodeOrigin::Created => None,
            _ => self.parents.first().copied(),
        };
        RevisionEdge { seq: self.seq, from, to: self.revision, origin: self.origin.clone(), at_ms: self.created_at_ms }
    }
}

/// A transition of a session's head.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionEdge {
    /// The event.
    pub seq: u64,
    /// The previous head (none at creation).
    pub from: Option<RevisionId>,
    /// The new head.
    pub to: RevisionId,
    /// What happened.
    pub origin: NodeOrigin,
    /// When, unix ms.
    pub at_ms: u64,
}

/// A fork, stored under its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkEdge {
    /// The fork.
    pub child: SessionId,
    /// Parent revision at the fork.
    pub revision: RevisionId,
    /// Prefix length taken.
    pub message_count: u64,
    /// The fork's creating event.
    pub seq: u64,
}

/// The graph's head marker for a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphTip {
    /// Current head.
    pub head: RevisionId,
    /// The seq of the record that first produced the head's node.
    pub head_seq: u64,
    /// Nodes so far.
    pub nodes: u64,
    /// Messages at the head.
    pub len: u64,
}

/// Whether a context entry has been applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContextState {
    /// Waiting for a turn.
    Pending,
    /// Applied by a turn.
    Applied {
        /// The turn's event.
        seq: u64,
        /// The turn id.
        turn_id: String,
    },
}

/// A staged context append.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextEntry {
    /// The key.
    pub key: String,
    /// The content.
    pub content: ContentId,
    /// Where from.
    pub source: String,
    /// The append event.
    pub appended_seq: u64,
    /// Pending or applied.
    pub state: ContextState,
}

/// Usage totals for one (provider, model).
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Provider.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cache reads.
    pub cache_read: u64,
    /// Cache writes.
    pub cache_write: u64,
    /// Turns that reported usage for this model.
    pub turns: u64,
}

/// The label projection's copy of a session's labels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSession {
    /// Seq of the creating event (the listing order).
    pub created_seq: u64,
    /// Current labels.
    pub labels: BTreeMap<String, String>,
}

/// The state of a tool operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolState {
    /// Called, no result yet: on the unsettled list.
    Prepared,
    /// A result was recorded.
    Settled {
        /// How it ended.
        outcome: ToolOutcome,
        /// Result content.
        result: ContentId,
        /// The result event.
        seq: u64,
        /// When, unix ms.
        at_ms: u64,
    },
}

/// One tool operation in the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOp {
    /// The session.
    pub session: SessionId,
    /// Operation id.
    pub op_id: String,
    /// Order recorded in the session, from 0.
    pub ordinal: u64,
    /// Provider call id.
    pub call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Arguments.
    pub args: ContentId,
    /// Parent operation.
    pub parent_op: Option<String>,
    /// Turn.
    pub turn_id: Option<String>,
    /// Recovery policy.
    pub recovery: Recovery,
    /// The call event.
    pub call_seq: u64,
    /// When called, unix ms.
    pub called_at_ms: u64,
    /// Prepared or settled.
    pub state: ToolState,
}

/// Tool ops recorded in a session so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolTip {
    /// Count.
    pub count: u64,
}
