//! The values queries and commands return, as frozen Python classes.

use pyo3::prelude::*;
use pyo3::types::PyList;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The list field of a page: made a Python list at its first read, and the same list at
/// every read after (a page of 10,000 messages is not converted again at each
/// `page.messages[i]`).
pub struct Listed<T> {
    items: Vec<T>,
    list: OnceLock<Py<PyList>>,
}

impl<T> Listed<T> {
    /// The items, as Rust values.
    pub fn into_items(self) -> Vec<T> {
        self.items
    }
}

impl<T> From<Vec<T>> for Listed<T> {
    fn from(items: Vec<T>) -> Listed<T> {
        Listed { items, list: OnceLock::new() }
    }
}

impl<T> FromIterator<T> for Listed<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Listed<T> {
        Listed::from(iter.into_iter().collect::<Vec<T>>())
    }
}

impl<T: Clone> Clone for Listed<T> {
    fn clone(&self) -> Listed<T> {
        Listed::from(self.items.clone())
    }
}

impl<'py, T> IntoPyObject<'py> for &Listed<T>
where
    T: Clone + IntoPyObject<'py>,
{
    type Target = PyList;
    type Output = Bound<'py, PyList>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        if let Some(list) = self.list.get() {
            return Ok(list.bind(py).clone());
        }
        let list = PyList::new(py, self.items.iter().cloned())?;
        // Another thread may have made it first: every read then returns that one.
        let kept = self.list.get_or_init(|| list.clone().unbind());
        Ok(kept.bind(py).clone())
    }
}

/// Where a committed event landed.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct Receipt {
    /// Global sequence number of the event.
    pub seq: u64,
    /// The session's revision after the event (hex).
    pub revision: String,
    /// Writer clock, unix ms.
    pub committed_at_ms: u64,
}

impl From<annal::Receipt> for Receipt {
    fn from(r: annal::Receipt) -> Receipt {
        Receipt { seq: r.seq, revision: r.revision.to_hex(), committed_at_ms: r.committed_at_ms }
    }
}

#[pymethods]
impl Receipt {
    fn __repr__(&self) -> String {
        format!("Receipt(seq={}, revision={:?}, committed_at_ms={})", self.seq, self.revision, self.committed_at_ms)
    }
}

/// A created (or forked) session and the receipt of its first event.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct SessionReceipt {
    /// The new session's id.
    pub session: String,
    /// Its receipt.
    pub receipt: Receipt,
}

impl From<annal::SessionReceipt> for SessionReceipt {
    fn from(r: annal::SessionReceipt) -> SessionReceipt {
        SessionReceipt { session: r.session.to_string(), receipt: r.receipt.into() }
    }
}

#[pymethods]
impl SessionReceipt {
    fn __repr__(&self) -> String {
        format!("SessionReceipt(session={:?}, seq={})", self.session, self.receipt.seq)
    }
}

/// The result of `commit_turn`.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct TurnResult {
    /// The turn's receipt (the original one for a retry).
    pub receipt: Receipt,
    /// Whether this exact turn had been committed before (nothing was written now).
    pub already_committed: bool,
}

impl From<annal::TurnOutcome> for TurnResult {
    fn from(o: annal::TurnOutcome) -> TurnResult {
        TurnResult {
            receipt: o.receipt().into(),
            already_committed: matches!(o, annal::TurnOutcome::AlreadyCommitted(_)),
        }
    }
}

#[pymethods]
impl TurnResult {
    fn __repr__(&self) -> String {
        format!("TurnResult(seq={}, already_committed={})", self.receipt.seq, self.already_committed)
    }
}

/// A session's head: what it is now.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct Head {
    /// The session id.
    pub session: String,
    /// The transcript's revision (hex).
    pub revision: String,
    /// Messages in the transcript.
    pub message_count: u64,
    /// Whether the session is archived.
    pub archived: bool,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The metadata blob.
    pub metadata: Vec<u8>,
    /// `(parent session, revision, message count)` if the session is a fork.
    pub forked_from: Option<(String, String, u64)>,
    /// Seq of the creating event.
    pub created_seq: u64,
    /// Creation time, unix ms.
    pub created_at_ms: u64,
    /// Seq of the latest event.
    pub last_seq: u64,
    /// The session's stream seq: every event moves it (use it with `expected=int`).
    pub stream_seq: u64,
    /// Time of the latest event, unix ms.
    pub updated_at_ms: u64,
    /// Host state: name → content id (read values with `Database.host_state`).
    pub host_state: BTreeMap<String, String>,
}

impl From<annal::SessionHead> for Head {
    fn from(h: annal::SessionHead) -> Head {
        Head {
            session: h.session.to_string(),
            revision: h.revision.to_hex(),
            message_count: h.message_count,
            archived: h.archived,
            labels: h.labels,
            metadata: h.metadata,
            forked_from: h.forked_from.map(|f| (f.session.to_string(), f.revision.to_hex(), f.message_count)),
            created_seq: h.created_seq,
            created_at_ms: h.created_at_ms,
            last_seq: h.last_seq,
            stream_seq: h.stream_seq,
            updated_at_ms: h.updated_at_ms,
            host_state: h.host_state.into_iter().map(|(k, v)| (k, v.to_hex())).collect(),
        }
    }
}

#[pymethods]
impl Head {
    fn __repr__(&self) -> String {
        format!(
            "Head(session={:?}, messages={}, stream_seq={}, archived={})",
            self.session, self.message_count, self.stream_seq, self.archived
        )
    }
}

/// A page of sessions.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct SessionPage {
    /// The heads.
    pub items: Listed<Head>,
    /// The offset used.
    pub offset: u64,
    /// The limit asked for.
    pub limit: u64,
    /// Whether more sessions follow.
    pub has_more: bool,
}

/// A message read back from a transcript.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct StoredMessage {
    /// Position in the transcript, from 0.
    pub position: u64,
    /// Content id of the message object.
    pub content_id: String,
    /// `"system"`, `"user"`, `"assistant"` or `"tool"`.
    pub role: String,
    /// The content type.
    pub content_type: String,
    /// The body.
    pub body: Vec<u8>,
    /// Content ids of the attachments (read them with `Database.content`).
    pub attachments: Vec<String>,
}

#[pymethods]
impl StoredMessage {
    fn __repr__(&self) -> String {
        format!("StoredMessage(position={}, role={:?}, body=<{} bytes>)", self.position, self.role, self.body.len())
    }
}

pub fn role_name(role: annal::Role) -> &'static str {
    match role {
        annal::Role::System => "system",
        annal::Role::User => "user",
        annal::Role::Assistant => "assistant",
        annal::Role::Tool => "tool",
    }
}

/// A page of a transcript.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct TranscriptPage {
    /// The session.
    pub session: String,
    /// The revision read.
    pub revision: String,
    /// Messages in that revision.
    pub total: u64,
    /// Offset used.
    pub offset: u64,
    /// The messages.
    pub messages: Listed<StoredMessage>,
    /// Whether messages follow this page.
    pub has_more: bool,
}

impl From<annal::TranscriptPage> for TranscriptPage {
    fn from(t: annal::TranscriptPage) -> TranscriptPage {
        TranscriptPage {
            session: t.session.to_string(),
            revision: t.revision.to_hex(),
            total: t.total,
            offset: t.offset,
            messages: t
                .messages
                .into_iter()
                .map(|m| StoredMessage {
                    position: m.position,
                    content_id: m.content_id.to_hex(),
                    role: role_name(m.message.role).into(),
                    content_type: m.message.content_type,
                    body: m.message.body,
                    attachments: m.message.attachments.iter().map(|a| a.to_hex()).collect(),
                })
                .collect(),
            has_more: t.has_more,
        }
    }
}

/// A distinct revision a session has held.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct RevisionNode {
    /// The revision id (hex).
    pub revision: String,
    /// Order of first appearance in the session.
    pub ordinal: u64,
    /// Seq of the event that first produced it.
    pub seq: u64,
    /// Messages in it.
    pub message_count: u64,
    /// When it first appeared, unix ms.
    pub created_at_ms: u64,
    /// `"created"`, `"turn"` or the rewrite kind (`"edit"`, `"restore"`, ...).
    pub origin: String,
}

impl From<annal::RevisionNode> for RevisionNode {
    fn from(n: annal::RevisionNode) -> RevisionNode {
        RevisionNode {
            revision: n.revision.to_hex(),
            ordinal: n.ordinal,
            seq: n.seq,
            message_count: n.message_count,
            created_at_ms: n.created_at_ms,
            origin: match n.origin {
                annal::NodeOrigin::Created => "created".into(),
                annal::NodeOrigin::Turn { .. } => "turn".into(),
                annal::NodeOrigin::Rewrite { kind, .. } => kind,
            },
        }
    }
}

/// A page of a session's revision list, oldest first, with the current head.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct RevisionPage {
    /// The session's current head revision (hex), on every page.
    pub head: String,
    /// Distinct revisions the session has held.
    pub total: u64,
    /// The revisions of this page.
    pub items: Listed<RevisionNode>,
    /// The offset used (clamped to `total`).
    pub offset: u64,
    /// The limit asked for.
    pub limit: u64,
    /// Whether more revisions follow.
    pub has_more: bool,
}

impl From<annal::RevisionPage> for RevisionPage {
    fn from(p: annal::RevisionPage) -> RevisionPage {
        RevisionPage {
            head: p.head.to_hex(),
            total: p.total,
            items: p.page.items.into_iter().map(RevisionNode::from).collect(),
            offset: p.page.offset,
            limit: p.page.limit,
            has_more: p.page.has_more,
        }
    }
}

/// A staged or applied system-context entry.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct ContextEntry {
    /// The host's key.
    pub key: String,
    /// Content id of the text.
    pub content_id: String,
    /// Where it came from.
    pub source: String,
    /// Seq of the append.
    pub appended_seq: u64,
    /// The turn that applied it, or `None` while it is pending.
    pub applied_by: Option<String>,
}

impl From<annal::ContextEntry> for ContextEntry {
    fn from(c: annal::ContextEntry) -> ContextEntry {
        ContextEntry {
            key: c.key,
            content_id: c.content.to_hex(),
            source: c.source,
            appended_seq: c.appended_seq,
            applied_by: match c.state {
                annal::ContextState::Pending => None,
                annal::ContextState::Applied { turn_id, .. } => Some(turn_id),
            },
        }
    }
}

/// Token usage of one provider and model in a session.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct UsageTotals {
    /// Provider.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cache-read tokens.
    pub cache_read: u64,
    /// Cache-write tokens.
    pub cache_write: u64,
    /// Turns that reported usage.
    pub turns: u64,
}

impl From<annal::UsageTotals> for UsageTotals {
    fn from(u: annal::UsageTotals) -> UsageTotals {
        UsageTotals {
            provider: u.provider,
            model: u.model,
            input: u.input,
            output: u.output,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
            turns: u.turns,
        }
    }
}

/// A tool operation of the ledger.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct ToolOp {
    /// The session.
    pub session: String,
    /// The host's operation id.
    pub op_id: String,
    /// Order of the call in the session.
    pub ordinal: u64,
    /// The provider's call id.
    pub call_id: String,
    /// The tool.
    pub tool_name: String,
    /// Content id of the arguments.
    pub args_id: String,
    /// The enclosing operation.
    pub parent_op: Option<String>,
    /// The turn it belongs to.
    pub turn_id: Option<String>,
    /// Whether re-running it after a crash is safe.
    pub replay_safe: bool,
    /// Seq of the call.
    pub call_seq: u64,
    /// `None` while unsettled; else `"ok"`, `"error"` or `"cancelled"`.
    pub outcome: Option<String>,
    /// Content id of the result, once settled.
    pub result_id: Option<String>,
}

impl From<annal::ToolOp> for ToolOp {
    fn from(t: annal::ToolOp) -> ToolOp {
        let (outcome, result_id) = match t.state {
            annal::ToolState::Prepared => (None, None),
            annal::ToolState::Settled { outcome, result, .. } => (Some(outcome.name().into()), Some(result.to_hex())),
        };
        ToolOp {
            session: t.session.to_string(),
            op_id: t.op_id,
            ordinal: t.ordinal,
            call_id: t.call_id,
            tool_name: t.tool_name,
            args_id: t.args.to_hex(),
            parent_op: t.parent_op,
            turn_id: t.turn_id,
            replay_safe: t.recovery == annal::Recovery::ReplaySafe,
            call_seq: t.call_seq,
            outcome,
            result_id,
        }
    }
}

/// A log record as read back.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct Event {
    /// Global seq.
    pub seq: u64,
    /// The session.
    pub session: String,
    /// The session's stream seq.
    pub stream_seq: u64,
    /// Writer clock, unix ms.
    pub committed_at_ms: u64,
    /// The event kind, e.g. `"TurnCommitted"`.
    pub kind: String,
    /// The event's fields, as text.
    pub detail: String,
    /// `h(seq)`, the chain hash (hex).
    pub chain_hash: String,
}

/// A page of events.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct EventPage {
    /// The events, in seq order.
    pub events: Listed<Event>,
    /// Where the next page starts.
    pub next_seq: u64,
    /// Whether events follow.
    pub has_more: bool,
}

impl From<annal::EventPage> for EventPage {
    fn from(p: annal::EventPage) -> EventPage {
        EventPage {
            events: p
                .events
                .into_iter()
                .map(|e| Event {
                    seq: e.record.seq,
                    session: e.record.session.to_string(),
                    stream_seq: e.record.stream_seq,
                    committed_at_ms: e.record.committed_at_ms,
                    kind: e.record.event.kind().name().into(),
                    detail: format!("{:?}", e.record.event),
                    chain_hash: e.chain_hash.to_hex(),
                })
                .collect(),
            next_seq: p.next_seq,
            has_more: p.has_more,
        }
    }
}

/// A durable commit, as subscribers hear of it.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct CommitNotice {
    /// First seq of the commit.
    pub first_seq: u64,
    /// Last seq of the commit.
    pub last_seq: u64,
    /// Sessions it touched.
    pub sessions: Vec<String>,
    /// Writer clock, unix ms.
    pub committed_at_ms: u64,
}

impl From<annal::CommitNotice> for CommitNotice {
    fn from(n: annal::CommitNotice) -> CommitNotice {
        CommitNotice {
            first_seq: n.first_seq,
            last_seq: n.last_seq,
            sessions: n.sessions.iter().map(|s| s.to_string()).collect(),
            committed_at_ms: n.committed_at_ms,
        }
    }
}

/// An execution lease as its holder sees it: present `token` as `fence=` on the commands
/// made under it.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct Lease {
    /// The session.
    pub session: String,
    /// The holder.
    pub owner: String,
    /// The fencing token: one larger than any the session had before this grant.
    pub token: u64,
    /// When it expires unless renewed (writer clock, unix ms).
    pub expires_at_ms: u64,
}

impl From<annal::Lease> for Lease {
    fn from(l: annal::Lease) -> Lease {
        Lease { session: l.session.to_string(), owner: l.owner, token: l.token, expires_at_ms: l.expires_at_ms }
    }
}

/// A session's execution lease as a reader sees it (`Database.lease`): the current token,
/// its holder and expiry, and whether the holder released it. Whether it still excludes
/// other owners depends on the writer's clock.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct LeaseState {
    /// The session.
    pub session: String,
    /// Who holds (or last held) it.
    pub owner: String,
    /// The session's current fencing token.
    pub token: u64,
    /// When it expires unless renewed (writer clock, unix ms), renewals included.
    pub expires_at_ms: u64,
    /// Whether its holder released it.
    pub released: bool,
}

impl LeaseState {
    /// The lease of `session`.
    pub fn of(session: annal::SessionId, l: annal::LeaseState) -> LeaseState {
        LeaseState {
            session: session.to_string(),
            owner: l.owner,
            token: l.token,
            expires_at_ms: l.expires_at_ms,
            released: l.released,
        }
    }
}

#[pymethods]
impl LeaseState {
    fn __repr__(&self) -> String {
        format!(
            "LeaseState(session={:?}, owner={:?}, token={}, expires_at_ms={}, released={})",
            self.session,
            self.owner,
            self.token,
            self.expires_at_ms,
            if self.released { "True" } else { "False" }
        )
    }
}

#[pymethods]
impl Lease {
    fn __repr__(&self) -> String {
        format!(
            "Lease(session={:?}, owner={:?}, token={}, expires_at_ms={})",
            self.session, self.owner, self.token, self.expires_at_ms
        )
    }

    fn __eq__(&self, other: &Lease) -> bool {
        self.session == other.session
            && self.owner == other.owner
            && self.token == other.token
            && self.expires_at_ms == other.expires_at_ms
    }
}

/// A streamed draft as read back: its segments from `first_segment`, as far as the byte
/// budget allowed.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct Draft {
    /// The session.
    pub session: String,
    /// The host's draft id.
    pub draft_id: String,
    /// Index of the first segment in `segments`.
    pub first_segment: u32,
    /// Segments, in order.
    pub segments: Vec<Vec<u8>>,
    /// Segments the draft holds.
    pub total_segments: u32,
    /// Bytes the draft holds.
    pub total_bytes: u64,
    /// When its first segment was appended (writer clock, unix ms).
    pub created_at_ms: u64,
    /// When its last segment was appended.
    pub updated_at_ms: u64,
    /// Whether `segments` holds every segment from `first_segment` to the end.
    pub complete: bool,
}

impl From<annal::Draft> for Draft {
    fn from(d: annal::Draft) -> Draft {
        let complete = d.is_complete();
        Draft {
            session: d.session.to_string(),
            draft_id: d.draft_id,
            first_segment: d.first_segment,
            segments: d.segments,
            total_segments: d.total_segments,
            total_bytes: d.total_bytes,
            created_at_ms: d.created_at_ms,
            updated_at_ms: d.updated_at_ms,
            complete,
        }
    }
}

#[pymethods]
impl Draft {
    /// The segments read, joined.
    fn data(&self) -> Vec<u8> {
        self.segments.concat()
    }

    fn __repr__(&self) -> String {
        format!(
            "Draft(session={:?}, draft_id={:?}, first_segment={}, segments={}, total_segments={})",
            self.session,
            self.draft_id,
            self.first_segment,
            self.segments.len(),
            self.total_segments
        )
    }
}

/// A draft's summary, without its bytes (what `Database.abandoned_drafts` lists).
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct DraftSummary {
    /// The session.
    pub session: String,
    /// The host's draft id.
    pub draft_id: String,
    /// Segments.
    pub segments: u32,
    /// Bytes.
    pub bytes: u64,
    /// When its first segment was appended (writer clock, unix ms).
    pub created_at_ms: u64,
    /// When its last segment was appended.
    pub updated_at_ms: u64,
}

impl From<annal::DraftSummary> for DraftSummary {
    fn from(d: annal::DraftSummary) -> DraftSummary {
        DraftSummary {
            session: d.session.to_string(),
            draft_id: d.draft_id,
            segments: d.segments,
            bytes: d.bytes,
            created_at_ms: d.created_at_ms,
            updated_at_ms: d.updated_at_ms,
        }
    }
}

#[pymethods]
impl DraftSummary {
    fn __repr__(&self) -> String {
        format!(
            "DraftSummary(session={:?}, draft_id={:?}, segments={}, bytes={})",
            self.session, self.draft_id, self.segments, self.bytes
        )
    }
}

pub fn input_kind_name(kind: annal::InputKind) -> &'static str {
    kind.name()
}

/// An input state's parts: its name, the claim holding it and that claim's expiry (while
/// claimed), the turn that consumed it, and the seq of the event that closed it.
type StateParts = (String, Option<u64>, Option<u64>, Option<String>, Option<u64>);

fn state_parts(state: annal::InputState) -> StateParts {
    let name = state.name().to_string();
    match state {
        annal::InputState::Pending => (name, None, None, None, None),
        annal::InputState::Claimed { claim, expires_at_ms } => (name, Some(claim), Some(expires_at_ms), None, None),
        annal::InputState::Completed { turn_id, seq } => (name, None, None, Some(turn_id), Some(seq)),
        annal::InputState::Cancelled { seq } => (name, None, None, None, Some(seq)),
    }
}

/// An open input of a session's inbox (pending, or held by a claim that may have
/// expired), with its message.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct QueuedInput {
    /// The host's input id.
    pub input_id: String,
    /// Seq of the event that queued it.
    pub seq: u64,
    /// `"next_turn"` or `"active_turn"`.
    pub kind: String,
    /// `"pending"` or `"claimed"`.
    pub state: String,
    /// The claim holding it, while claimed.
    pub claim: Option<u64>,
    /// When that claim expires (writer clock, unix ms), while claimed.
    pub expires_at_ms: Option<u64>,
    /// The message's role.
    pub role: String,
    /// The message's content type.
    pub content_type: String,
    /// The message's body.
    pub body: Vec<u8>,
    /// Content ids of the message's attachments (read them with `Database.content`).
    pub attachments: Vec<String>,
}

impl From<annal::QueuedInput> for QueuedInput {
    fn from(q: annal::QueuedInput) -> QueuedInput {
        let (state, claim, expires_at_ms, _, _) = state_parts(q.state);
        QueuedInput {
            input_id: q.input_id,
            seq: q.seq,
            kind: input_kind_name(q.kind).into(),
            state,
            claim,
            expires_at_ms,
            role: role_name(q.message.role).into(),
            content_type: q.message.content_type,
            body: q.message.body,
            attachments: q.message.attachments.iter().map(|a| a.to_hex()).collect(),
        }
    }
}

#[pymethods]
impl QueuedInput {
    /// The body decoded as UTF-8.
    fn text(&self) -> PyResult<String> {
        String::from_utf8(self.body.clone()).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }

    fn __repr__(&self) -> String {
        format!("QueuedInput(input_id={:?}, kind={:?}, state={:?})", self.input_id, self.kind, self.state)
    }
}

/// An input of a session's inbox, whatever its state (what `Database.input` returns).
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct InputRow {
    /// The host's input id.
    pub input_id: String,
    /// Seq of the event that queued it.
    pub seq: u64,
    /// Content id of the message object.
    pub message_id: String,
    /// `"next_turn"` or `"active_turn"`.
    pub kind: String,
    /// `"pending"`, `"claimed"`, `"completed"` or `"cancelled"`.
    pub state: String,
    /// The claim holding it, while claimed.
    pub claim: Option<u64>,
    /// When that claim expires (writer clock, unix ms), while claimed.
    pub expires_at_ms: Option<u64>,
    /// The turn that consumed it, once completed.
    pub turn_id: Option<String>,
    /// Seq of the event that completed or cancelled it.
    pub closed_seq: Option<u64>,
}

impl From<annal::InputRow> for InputRow {
    fn from(r: annal::InputRow) -> InputRow {
        let (state, claim, expires_at_ms, turn_id, closed_seq) = state_parts(r.state);
        InputRow {
            input_id: r.input_id,
            seq: r.seq,
            message_id: r.message.to_hex(),
            kind: input_kind_name(r.kind).into(),
            state,
            claim,
            expires_at_ms,
            turn_id,
            closed_seq,
        }
    }
}

#[pymethods]
impl InputRow {
    fn __repr__(&self) -> String {
        format!("InputRow(input_id={:?}, kind={:?}, state={:?})", self.input_id, self.kind, self.state)
    }
}

/// What `Database.claim_inputs` took.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct Claim {
    /// The claim (the session's stream seq of its `InputsClaimed`), or `None` when
    /// nothing was claimable (nothing was written).
    pub claim: Option<u64>,
    /// The inputs it holds, in queue order.
    pub inputs: Vec<String>,
    /// When it expires (writer clock, unix ms).
    pub expires_at_ms: u64,
}

impl From<annal::Claim> for Claim {
    fn from(c: annal::Claim) -> Claim {
        Claim { claim: c.claim, inputs: c.inputs, expires_at_ms: c.expires_at_ms }
    }
}

#[pymethods]
impl Claim {
    fn __repr__(&self) -> String {
        format!("Claim(claim={:?}, inputs={:?}, expires_at_ms={})", self.claim, self.inputs, self.expires_at_ms)
    }
}

/// A claim on queued inputs, as stored (what `Database.claim` returns).
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct ClaimRow {
    /// The claim: the session's stream seq of its `InputsClaimed`.
    pub claim: u64,
    /// Who holds it.
    pub owner: String,
    /// The lease token it was fenced with.
    pub token: u64,
    /// `"next_turn"` or `"active_turn"`.
    pub target: String,
    /// The live turn it is for (`target="active_turn"`).
    pub turn_id: Option<String>,
    /// The inputs it took.
    pub inputs: Vec<String>,
    /// When it expires (writer clock, unix ms).
    pub expires_at_ms: u64,
    /// Whether it still holds an input (not abandoned, not all consumed or re-claimed).
    pub open: bool,
}

impl From<annal::ClaimRow> for ClaimRow {
    fn from(c: annal::ClaimRow) -> ClaimRow {
        let (target, turn_id) = match c.target {
            annal::ClaimTarget::NextTurn => ("next_turn".to_string(), None),
            annal::ClaimTarget::Turn(turn) => ("active_turn".to_string(), Some(turn)),
        };
        ClaimRow {
            claim: c.claim,
            owner: c.owner,
            token: c.token,
            target,
            turn_id,
            inputs: c.inputs,
            expires_at_ms: c.expires_at_ms,
            open: c.open,
        }
    }
}

#[pymethods]
impl ClaimRow {
    fn __repr__(&self) -> String {
        format!(
            "ClaimRow(claim={}, owner={:?}, target={:?}, inputs={:?}, open={})",
            self.claim, self.owner, self.target, self.inputs, self.open
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Lease>()?;
    m.add_class::<LeaseState>()?;
    m.add_class::<Draft>()?;
    m.add_class::<DraftSummary>()?;
    m.add_class::<QueuedInput>()?;
    m.add_class::<InputRow>()?;
    m.add_class::<Claim>()?;
    m.add_class::<ClaimRow>()?;
    m.add_class::<Receipt>()?;
    m.add_class::<SessionReceipt>()?;
    m.add_class::<TurnResult>()?;
    m.add_class::<Head>()?;
    m.add_class::<SessionPage>()?;
    m.add_class::<StoredMessage>()?;
    m.add_class::<TranscriptPage>()?;
    m.add_class::<RevisionNode>()?;
    m.add_class::<RevisionPage>()?;
    m.add_class::<ContextEntry>()?;
    m.add_class::<UsageTotals>()?;
    m.add_class::<ToolOp>()?;
    m.add_class::<Event>()?;
    m.add_class::<EventPage>()?;
    m.add_class::<CommitNotice>()?;
    Ok(())
}
