//! The reference model: an in-memory statement of SPEC §6 that shares no rule with the
//! engine. It keeps whole message lists per revision and recomputes every revision id
//! with `RevisionId::of`, so it never relies on the engine's chain rows, recipes or
//! fold. It answers every command with the outcome or the rejection the engine must
//! give, and every query with the page the engine must return.
//!
//! Rejections are checked in the order `decide` checks them: the command's byte size,
//! then the shape of the request (ids, limits, content), then the session (`NotFound`),
//! then whether it is an exact retry (answered as one even when the session is
//! archived), then `Archived`, then the state-dependent rules.
//!
//! Commit times come from the writer's clock, which the model cannot predict; the
//! harness tells it the time of every seq it reads back from the log (`clock`).

use annal::codec::{content_id, encode_message};
use annal::*;
use std::collections::{BTreeMap, BTreeSet};

/// A command's answer: the outcome, or the rejection.
pub type Reply<T> = std::result::Result<T, Rejection>;

/// A message as stored: its content id and the object the id hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    /// Content id of the canonical encoding.
    pub id: ContentId,
    /// The message object.
    pub object: MessageObject,
}

/// A revision a session has held.
#[derive(Clone, Debug)]
pub struct Node {
    /// Its id.
    pub id: RevisionId,
    /// Every head it was reached from, in order of first transition.
    pub parents: Vec<RevisionId>,
    /// How it first came to be.
    pub origin: NodeOrigin,
    /// The event that first produced it.
    pub seq: u64,
    /// Its messages.
    pub messages: Vec<Msg>,
}

/// A head transition.
#[derive(Clone, Debug)]
pub struct Transition {
    seq: u64,
    from: Option<RevisionId>,
    to: RevisionId,
    origin: NodeOrigin,
}

/// A staged context entry.
#[derive(Clone, Debug)]
pub struct Ctx {
    content: ContentId,
    source: String,
    appended_seq: u64,
    /// The applying turn's seq and id.
    applied: Option<(u64, String)>,
}

/// What makes two turns with one id the same turn.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TurnContent {
    messages: Vec<ContentId>,
    usage: Vec<Usage>,
    applied_context: Vec<String>,
    tool_ops: Vec<String>,
    state: (BTreeMap<String, ContentId>, BTreeSet<String>),
    inputs: Vec<String>,
}

#[derive(Clone, Debug)]
struct Turn {
    content: TurnContent,
    seq: u64,
    revision: RevisionId,
}

#[derive(Clone, Debug)]
struct Tool {
    op_id: String,
    call_id: String,
    tool_name: String,
    args: ContentId,
    parent_op: Option<String>,
    turn_id: Option<String>,
    recovery: Recovery,
    call_seq: u64,
    /// Outcome, result and the result event's seq.
    settled: Option<(ToolOutcome, ContentId, u64)>,
}

#[derive(Clone, Debug, Default)]
struct Totals {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    turns: u64,
}

/// One session of the model.
#[derive(Clone, Debug)]
pub struct Session {
    id: SessionId,
    created_seq: u64,
    archived: bool,
    labels: BTreeMap<String, String>,
    metadata: Vec<u8>,
    forked_from: Option<ForkOrigin>,
    /// The current transcript.
    pub messages: Vec<Msg>,
    /// Events in the session's stream.
    pub stream_seq: u64,
    last_seq: u64,
    /// Distinct revisions, in order of first appearance.
    pub nodes: Vec<Node>,
    transitions: Vec<Transition>,
    /// child → (parent revision, prefix length, seq of the fork).
    forks: BTreeMap<SessionId, (RevisionId, u64, u64)>,
    context: BTreeMap<String, Ctx>,
    turns: BTreeMap<String, Turn>,
    usage: BTreeMap<(String, String), Totals>,
    /// In call order.
    tools: Vec<Tool>,
    /// Host state entries: name → value id.
    host_state: BTreeMap<String, ContentId>,
    /// Every change of a host state entry: (stream seq, name, value or removal).
    state_history: Vec<(u64, String, Option<ContentId>)>,
    /// The execution lease as the log records it.
    lease: Option<LeaseState>,
    /// The inbox: every input queued, by id.
    inputs: BTreeMap<String, InputRow>,
    /// Open inputs in queue order.
    open_inputs: Vec<String>,
    /// Every claim, by the stream seq of its event.
    claims: BTreeMap<u64, ClaimRow>,
}

impl Session {
    /// Input `id`, whatever its state.
    pub fn input(&self, id: &str) -> Option<InputRow> {
        self.inputs.get(id).cloned()
    }

    /// Closes claim `claim` once no input is held by it any more.
    fn close_claim_if_empty(&mut self, claim: u64) {
        let Some(row) = self.claims.get(&claim) else { return };
        let holds = row
            .inputs
            .iter()
            .any(|i| matches!(self.inputs[i].state, InputState::Claimed { claim: c, .. } if c == claim));
        if !holds {
            self.claims.get_mut(&claim).expect("present").open = false;
        }
    }
}

fn ids(messages: &[Msg]) -> Vec<ContentId> {
    messages.iter().map(|m| m.id).collect()
}

fn revision_of(messages: &[Msg]) -> RevisionId {
    RevisionId::of(&ids(messages))
}

impl Session {
    /// The current head revision.
    pub fn revision(&self) -> RevisionId {
        revision_of(&self.messages)
    }

    /// Moves the head to `messages` through the event at `seq`.
    fn advance(&mut self, seq: u64, origin: NodeOrigin, messages: Vec<Msg>) -> RevisionId {
        let from = self.revision();
        let to = revision_of(&messages);
        match self.nodes.iter_mut().find(|n| n.id == to) {
            Some(node) => {
                if !node.parents.contains(&from) {
                    node.parents.push(from);
                }
            }
            None => self.nodes.push(Node {
                id: to,
                parents: vec![from],
                origin: origin.clone(),
                seq,
                messages: messages.clone(),
            }),
        }
        self.transitions.push(Transition { seq, from: Some(from), to, origin });
        self.messages = messages;
        to
    }

    /// Applies a host state change made by the event at `stream_seq`.
    fn apply_state(&mut self, stream_seq: u64, state: &(BTreeMap<String, ContentId>, BTreeSet<String>)) {
        for name in &state.1 {
            if self.host_state.remove(name).is_some() {
                self.state_history.push((stream_seq, name.clone(), None));
            }
        }
        for (name, id) in &state.0 {
            self.host_state.insert(name.clone(), *id);
            self.state_history.push((stream_seq, name.clone(), Some(*id)));
        }
    }

    /// The value id of entry `name` as of `stream_seq`.
    pub fn state_at(&self, name: &str, stream_seq: u64) -> Option<ContentId> {
        self.state_history.iter().rev().find(|(at, n, _)| *at <= stream_seq && n == name).and_then(|(_, _, v)| *v)
    }

    /// Host state entry names the session has ever held.
    pub fn state_names(&self) -> BTreeSet<String> {
        self.state_history.iter().map(|(_, n, _)| n.clone()).collect()
    }

    /// Context keys staged and not yet applied.
    pub fn pending_keys(&self) -> Vec<String> {
        self.context.iter().filter(|(_, c)| c.applied.is_none()).map(|(k, _)| k.clone()).collect()
    }

    /// Tool operation ids, settled or not, in call order.
    pub fn op_ids(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.op_id.clone()).collect()
    }

    /// The session id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// Whether the session is archived.
    pub fn archived(&self) -> bool {
        self.archived
    }

    fn tool(&self, op_id: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.op_id == op_id)
    }
}

/// A revision node without its recipe (how the engine stores it is its own business;
/// `transcript_at` checks that it materializes the right messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// Revision id.
    pub revision: RevisionId,
    /// Order of first appearance.
    pub ordinal: u64,
    /// Heads it was reached from.
    pub parents: Vec<RevisionId>,
    /// First origin.
    pub origin: NodeOrigin,
    /// First seq.
    pub seq: u64,
    /// Messages.
    pub message_count: u64,
    /// Time of the first seq.
    pub created_at_ms: u64,
}

impl From<&RevisionNode> for NodeView {
    fn from(n: &RevisionNode) -> NodeView {
        NodeView {
            revision: n.revision,
            ordinal: n.ordinal,
            parents: n.parents.clone(),
            origin: n.origin.clone(),
            seq: n.seq,
            message_count: n.message_count,
            created_at_ms: n.created_at_ms,
        }
    }
}

/// A revision page with recipe-free nodes.
pub type RevisionView = (RevisionId, u64, Page<NodeView>);

/// A whole revision graph with recipe-free nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphView {
    /// Session.
    pub session: SessionId,
    /// Head.
    pub head: RevisionId,
    /// Nodes, oldest first.
    pub nodes: Vec<NodeView>,
    /// Transitions, in seq order.
    pub edges: Vec<RevisionEdge>,
    /// Forks taken from the session, by child id.
    pub forks: Vec<ForkEdge>,
    /// Where the session came from.
    pub forked_from: Option<ForkOrigin>,
}

/// The engine's revision page without recipes.
pub fn revision_view(p: RevisionPage) -> RevisionView {
    let items = p.page.items.iter().map(NodeView::from).collect();
    (p.head, p.total, Page { items, offset: p.page.offset, limit: p.page.limit, has_more: p.page.has_more })
}

impl From<RevisionGraph> for GraphView {
    fn from(g: RevisionGraph) -> GraphView {
        GraphView {
            session: g.session,
            head: g.head,
            nodes: g.nodes.iter().map(NodeView::from).collect(),
            edges: g.edges,
            forks: g.forks,
            forked_from: g.forked_from,
        }
    }
}

/// The whole model.
#[derive(Clone, Debug)]
pub struct Model {
    /// Limits in force.
    pub limits: Limits,
    /// Last global seq.
    pub seq: u64,
    /// Every session.
    pub sessions: BTreeMap<SessionId, Session>,
    /// Every event written: (session, stream seq, kind), at index seq - 1.
    pub log: Vec<(SessionId, u64, EventKind)>,
    /// Every content object written.
    pub content: BTreeMap<ContentId, Vec<u8>>,
    /// Commit time of each seq, as the log reports it.
    pub clock: BTreeMap<u64, u64>,
    /// Purged sessions: the seq of each one's tombstone.
    pub purged: BTreeMap<SessionId, u64>,
    /// The writer's clock: the harness gives the engine this clock and moves it.
    pub time: ManualClock,
    /// Lease renewals the writer holds in memory: session → (token, expiry). A reopen
    /// forgets them.
    pub renewals: BTreeMap<SessionId, (u64, u64)>,
    /// Streamed drafts: (session, draft id) → segments, created at, updated at.
    pub drafts: BTreeMap<(SessionId, String), DraftModel>,
}

/// A draft in the model: its segments, when it was created and last appended to.
pub type DraftModel = (Vec<Vec<u8>>, u64, u64);

/// Where the writer's clock starts in a model run.
pub const EPOCH_MS: u64 = 1_767_225_600_000;

type Staged = Vec<(ContentId, Vec<u8>)>;

fn invalid<T>(reason: &str) -> Reply<T> {
    Err(Rejection::InvalidRequest { reason: reason.to_string() })
}

fn rejected<T>(r: Rejection) -> annal::Result<T> {
    Err(Error::Rejected(r))
}

/// Empty, or nothing but whitespace when read as text.
fn blank(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.chars().all(char::is_whitespace),
        Err(_) => bytes.is_empty(),
    }
}

/// Checks a write's expectation against the session: its revision, its stream seq, or
/// nothing.
fn expect(s: &Session, expected: &Expected) -> Reply<()> {
    match *expected {
        Expected::Exact(expected) if expected != s.revision() => {
            Err(Rejection::RevisionConflict { expected, actual: s.revision() })
        }
        Expected::Version(expected) if expected != s.stream_seq => {
            Err(Rejection::VersionConflict { expected, actual: s.stream_seq })
        }
        _ => Ok(()),
    }
}

/// The message object a host message becomes, and its canonical bytes.
pub fn message_object(m: &Message) -> (MessageObject, Vec<u8>) {
    let attachments = m.attachments.iter().map(|a| content_id(a)).collect();
    let object =
        MessageObject { role: m.role, content_type: m.content_type.clone(), body: m.body.clone(), attachments };
    let bytes = encode_message(&object, u64::MAX).expect("a message always encodes without a limit");
    (object, bytes)
}

/// Every content object a command carries (whether or not it is valid).
pub fn carried_content(command: &Command) -> Vec<ContentId> {
    let mut out = Vec::new();
    let messages = |ms: &[Message], out: &mut Vec<ContentId>| {
        for m in ms {
            out.extend(m.attachments.iter().map(|a| content_id(a)));
            out.push(content_id(&message_object(m).1));
        }
    };
    match command {
        Command::CreateSession(c) => messages(&c.messages, &mut out),
        Command::CommitTurn(c) => {
            messages(&c.messages, &mut out);
            out.extend(c.state.set.values().map(|v| content_id(v)));
        }
        Command::SetHostState(c) => out.extend(c.state.set.values().map(|v| content_id(v))),
        Command::Rewrite(c) => messages(&c.replacement, &mut out),
        Command::Fork(c) => messages(c.replacement.as_slice(), &mut out),
        Command::AppendContext(c) => out.push(content_id(&c.content)),
        Command::RecordToolCall(c) => out.push(content_id(&c.args)),
        Command::RecordToolResult(c) => out.push(content_id(&c.result)),
        Command::Batch(cs) => cs.iter().for_each(|c| out.extend(carried_content(c))),
        Command::Fenced { command, .. } => out.extend(carried_content(command)),
        Command::EnqueueInput(c) => messages(std::slice::from_ref(&c.message), &mut out),
        Command::AcquireLease(_)
        | Command::RenewLease(_)
        | Command::ReleaseLease { .. }
        | Command::AppendDraft(_)
        | Command::DiscardDraft { .. }
        | Command::ClaimInputs(_)
        | Command::AbandonClaim { .. }
        | Command::CancelInput { .. } => {}
        Command::Restore(_)
        | Command::Archive { .. }
        | Command::Revive { .. }
        | Command::SetLabels(_)
        | Command::SetMetadata(_) => {}
    }
    out
}

fn state_bytes(state: &StateChanges) -> u64 {
    state.set.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum::<u64>()
        + state.remove.iter().map(|k| k.len() as u64).sum::<u64>()
}

fn message_bytes(m: &Message) -> u64 {
    (m.body.len() + m.content_type.len() + m.attachments.iter().map(Vec::len).sum::<usize>()) as u64
}

fn label_bytes(labels: &BTreeMap<String, String>) -> u64 {
    labels.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
}

/// The size a command counts against `command_bytes_max`: the bytes it carries.
pub fn command_bytes(command: &Command) -> u64 {
    let messages = |ms: &[Message]| ms.iter().map(message_bytes).sum::<u64>();
    let strings = |ss: &[String]| ss.iter().map(|s| s.len() as u64).sum::<u64>();
    match command {
        Command::CreateSession(c) => messages(&c.messages) + label_bytes(&c.labels) + c.metadata.len() as u64,
        Command::CommitTurn(c) => {
            messages(&c.messages)
                + c.turn_id.len() as u64
                + strings(&c.applied_context)
                + strings(&c.tool_ops)
                + c.usage.iter().map(|u| (u.provider.len() + u.model.len() + 32) as u64).sum::<u64>()
                + state_bytes(&c.state)
                + strings(&c.inputs)
        }
        Command::SetMetadata(c) => c.metadata.len() as u64,
        Command::SetHostState(c) => state_bytes(&c.state),
        Command::Rewrite(c) => messages(&c.replacement) + (c.note.len() + c.actor.len()) as u64,
        Command::Restore(c) => (c.note.len() + c.actor.len()) as u64,
        Command::Fork(c) => messages(c.replacement.as_slice()) + c.labels.as_ref().map_or(0, label_bytes),
        Command::Archive { reason, .. } | Command::Revive { reason, .. } => reason.len() as u64,
        Command::AppendContext(c) => (c.content.len() + c.key.len() + c.source.len()) as u64,
        Command::RecordToolCall(c) => (c.args.len() + c.op_id.len() + c.call_id.len() + c.tool_name.len()) as u64,
        Command::RecordToolResult(c) => (c.result.len() + c.op_id.len()) as u64,
        Command::SetLabels(c) => label_bytes(&c.set) + c.remove.iter().map(|k| k.len() as u64).sum::<u64>(),
        Command::Batch(cs) => cs.iter().map(command_bytes).sum(),
        Command::AcquireLease(c) => c.owner.len() as u64,
        Command::RenewLease(_) | Command::ReleaseLease { .. } => 0,
        Command::AppendDraft(c) => (c.segment.len() + c.draft_id.len()) as u64,
        Command::DiscardDraft { draft_id, .. } => draft_id.len() as u64,
        Command::EnqueueInput(c) => c.input_id.len() as u64 + message_bytes(&c.message),
        Command::ClaimInputs(c) => c.owner.len() as u64,
        Command::AbandonClaim { .. } => 0,
        Command::CancelInput { input_id, .. } => input_id.len() as u64,
        Command::Fenced { command, .. } => command_bytes(command),
    }
}

impl Model {
    /// An empty database.
    pub fn new(limits: Limits) -> Model {
        Model {
            limits,
            seq: 0,
            sessions: BTreeMap::new(),
            log: Vec::new(),
            content: BTreeMap::new(),
            clock: BTreeMap::new(),
            purged: BTreeMap::new(),
            time: ManualClock::new(EPOCH_MS),
            renewals: BTreeMap::new(),
            drafts: BTreeMap::new(),
        }
    }

    /// The commit time of `seq`; `u64::MAX` if the log never reported it (which makes
    /// any comparison fail loudly).
    pub fn ms(&self, seq: u64) -> u64 {
        self.clock.get(&seq).copied().unwrap_or(u64::MAX)
    }

    fn receipt(&self, seq: u64, revision: RevisionId) -> Receipt {
        Receipt { seq, revision, committed_at_ms: self.ms(seq) }
    }

    // ----- size rules -------------------------------------------------------------

    fn limit(&self, limit: Limit, actual: u64) -> Reply<()> {
        let max = self.limits.max(limit);
        if actual > max {
            return Err(Rejection::LimitExceeded { limit, actual, max });
        }
        Ok(())
    }

    fn id(&self, what: &str, id: &str) -> Reply<()> {
        if id.is_empty() {
            return invalid(&format!("{what} must not be empty"));
        }
        self.limit(Limit::IdBytes, id.len() as u64)
    }

    fn note(&self, note: &str) -> Reply<()> {
        self.limit(Limit::NoteBytes, note.len() as u64)
    }

    fn label(&self, key: &str, value: Option<&str>) -> Reply<()> {
        if key.is_empty() {
            return invalid("label keys must not be empty");
        }
        self.limit(Limit::LabelKeyBytes, key.len() as u64)?;
        match value {
            Some(v) => self.limit(Limit::LabelValueBytes, v.len() as u64),
            None => Ok(()),
        }
    }

    fn labels(&self, labels: &BTreeMap<String, String>) -> Reply<()> {
        self.limit(Limit::LabelsPerSession, labels.len() as u64)?;
        labels.iter().try_for_each(|(k, v)| self.label(k, Some(v)))
    }

    fn blob(&self, bytes: &[u8], staged: &mut Staged) -> Reply<ContentId> {
        self.limit(Limit::ContentBytes, bytes.len() as u64)?;
        let id = content_id(bytes);
        staged.push((id, bytes.to_vec()));
        Ok(id)
    }

    fn message(&self, m: &Message, staged: &mut Staged) -> Reply<Msg> {
        self.id("content type", &m.content_type)?;
        self.limit(Limit::AttachmentsPerMessage, m.attachments.len() as u64)?;
        for a in &m.attachments {
            self.blob(a, staged)?;
        }
        // The limit bounds the body the host sends, not the stored object.
        self.limit(Limit::ContentBytes, m.body.len() as u64)?;
        let (object, bytes) = message_object(m);
        let id = content_id(&bytes);
        staged.push((id, bytes));
        Ok(Msg { id, object })
    }

    fn messages(&self, ms: &[Message], staged: &mut Staged) -> Reply<Vec<Msg>> {
        self.limit(Limit::MessagesPerCommand, ms.len() as u64)?;
        ms.iter().map(|m| self.message(m, staged)).collect()
    }

    // ----- session lookups --------------------------------------------------------

    fn existing(&self, id: &SessionId) -> Reply<&Session> {
        self.sessions.get(id).ok_or_else(|| self.absent(id))
    }

    /// Why a session that is not in `sessions` is not: purged, or never created.
    pub fn absent(&self, id: &SessionId) -> Rejection {
        match self.purged.get(id) {
            Some(seq) => Rejection::Purged { session: *id, seq: *seq },
            None => Rejection::NotFound { session: *id },
        }
    }

    /// `Purged` if `id` names a purged session (a create or fork under it is refused).
    fn not_purged(&self, id: &SessionId) -> Reply<()> {
        match self.purged.get(id) {
            Some(seq) => Err(Rejection::Purged { session: *id, seq: *seq }),
            None => Ok(()),
        }
    }

    /// A purge of `id` (SPEC: purge): the sessions it purges, each with its tombstone's
    /// seq, or the rejection. Each tombstone is an event of its session; the purged
    /// sessions leave `sessions`, and every content object no remaining session reaches
    /// leaves `content`.
    // The simulator shares this model and purges nothing.
    #[allow(dead_code)]
    pub fn purge(&mut self, id: &SessionId, descendants: bool) -> Reply<Vec<(SessionId, u64)>> {
        self.existing(id)?;
        let mut order = vec![*id];
        let mut forks = Vec::new();
        let mut i = 0;
        while i < order.len() {
            let mut children: Vec<(u64, SessionId)> =
                self.sessions[&order[i]].forks.iter().map(|(c, (_, _, seq))| (*seq, *c)).collect();
            children.sort();
            for (_, c) in children {
                if self.sessions.contains_key(&c) {
                    forks.push(c);
                    order.push(c);
                }
            }
            i += 1;
        }
        if !forks.is_empty() && !descendants {
            return Err(Rejection::HasForks { session: *id, forks });
        }
        let mut out = Vec::new();
        for s in order {
            let session = self.sessions.remove(&s).expect("a session to purge");
            self.seq += 1;
            self.log.push((s, session.stream_seq + 1, EventKind::SessionPurged));
            self.purged.insert(s, self.seq);
            for other in self.sessions.values_mut() {
                other.forks.remove(&s);
            }
            out.push((s, self.seq));
        }
        let mut reached: BTreeSet<ContentId> = BTreeSet::new();
        for s in self.sessions.values() {
            for node in &s.nodes {
                for m in &node.messages {
                    reached.insert(m.id);
                    reached.extend(m.object.attachments.iter().copied());
                }
            }
            reached.extend(s.context.values().map(|c| c.content));
            for t in &s.tools {
                reached.insert(t.args);
                reached.extend(t.settled.map(|(_, result, _)| result));
            }
            reached.extend(s.state_history.iter().filter_map(|(_, _, v)| *v));
            // Queued inputs are message objects: their attachments are reached too.
            for row in s.inputs.values() {
                reached.insert(row.message);
                if let Some(m) =
                    self.content.get(&row.message).and_then(|b| annal::codec::decode_message(b, u64::MAX).ok())
                {
                    reached.extend(m.attachments);
                }
            }
        }
        self.content.retain(|id, _| reached.contains(id));
        // A purged session's drafts go with it.
        let sessions = &self.sessions;
        self.drafts.retain(|(s, _), _| sessions.contains_key(s));
        Ok(out)
    }

    fn live(&self, id: &SessionId) -> Reply<&Session> {
        let s = self.existing(id)?;
        if s.archived {
            return Err(Rejection::Archived { session: *id });
        }
        Ok(s)
    }

    /// Host state entry `name` of `id` at its head (`at` is `None`) or as of stream seq
    /// `at`, as `Reader::host_state_at` answers.
    pub fn host_state(&self, id: &SessionId, name: &str, at: Option<u64>) -> annal::Result<Option<Vec<u8>>> {
        let s = self.found_session(id)?;
        let value = match at {
            Some(at) if at < s.stream_seq => s.state_at(name, at),
            _ => s.host_state.get(name).copied(),
        };
        Ok(value.map(|v| self.content.get(&v).expect("a stored value").clone()))
    }

    /// Host state entry names `id` has ever held.
    pub fn state_names(&self, id: &SessionId) -> BTreeSet<String> {
        self.sessions.get(id).map(Session::state_names).unwrap_or_default()
    }

    fn session_mut(&mut self, id: &SessionId) -> &mut Session {
        self.sessions.get_mut(id).expect("the command was validated against this session")
    }

    /// Appends an event to `id`'s stream; returns its seq.
    fn emit(&mut self, id: SessionId, kind: EventKind) -> u64 {
        self.seq += 1;
        let seq = self.seq;
        let s = self.session_mut(&id);
        s.stream_seq += 1;
        s.last_seq = seq;
        let stream_seq = s.stream_seq;
        self.log.push((id, stream_seq, kind));
        seq
    }

    fn keep(&mut self, staged: Staged) {
        for (id, bytes) in staged {
            self.content.entry(id).or_insert(bytes);
        }
    }

    // ----- commands ---------------------------------------------------------------

    /// Applies a command; on a rejection nothing changes.
    pub fn apply(&mut self, command: &Command) -> Reply<Outcome> {
        match command {
            Command::Batch(members) => self.batch(members),
            single => self.single(single),
        }
    }

    fn batch(&mut self, members: &[Command]) -> Reply<Outcome> {
        self.limit(Limit::BatchCommands, members.len() as u64)?;
        self.limit(Limit::CommandBytes, members.iter().map(command_bytes).sum())?;
        let before = self.clone();
        let mut outcomes = Vec::with_capacity(members.len());
        for (index, member) in members.iter().enumerate() {
            let result = match member.unfenced() {
                Command::Batch(_) => invalid("nested batch"),
                Command::AcquireLease(_) | Command::RenewLease(_) => {
                    invalid("lease acquisitions and renewals cannot be part of a batch")
                }
                Command::AppendDraft(_) | Command::DiscardDraft { .. } => invalid("drafts cannot be part of a batch"),
                _ => self.single(member),
            };
            match result {
                Ok(o) => outcomes.push(o),
                Err(rejection) => {
                    *self = before;
                    return Err(Rejection::Batch { index, rejection: Box::new(rejection) });
                }
            }
        }
        Ok(Outcome::Batch(outcomes))
    }

    fn single(&mut self, command: &Command) -> Reply<Outcome> {
        self.limit(Limit::CommandBytes, command_bytes(command))?;
        match command {
            Command::CreateSession(c) => self.create(c),
            Command::CommitTurn(c) => self.commit(c),
            Command::Rewrite(c) => self.rewrite(c),
            Command::Restore(c) => self.restore(c),
            Command::Fork(c) => self.fork(c),
            Command::Archive { session, reason } => self.archive(session, reason),
            Command::Revive { session, reason } => self.revive(session, reason),
            Command::AppendContext(c) => self.append_context(c),
            Command::RecordToolCall(c) => self.tool_call(c),
            Command::RecordToolResult(c) => self.tool_result(c),
            Command::SetLabels(c) => self.set_labels(c),
            Command::SetMetadata(c) => self.set_metadata(c),
            Command::SetHostState(c) => self.set_host_state(c),
            Command::AcquireLease(c) => self.acquire_lease(c),
            Command::RenewLease(c) => self.renew_lease(c),
            Command::ReleaseLease { session, token } => self.release_lease(session, *token),
            Command::AppendDraft(c) => self.append_draft(c),
            Command::DiscardDraft { session, draft_id } => self.discard_draft(session, draft_id),
            Command::EnqueueInput(c) => self.enqueue_input(c),
            Command::ClaimInputs(c) => self.claim_inputs(c),
            Command::AbandonClaim { session, claim } => self.abandon_claim(session, *claim),
            Command::CancelInput { session, input_id } => self.cancel_input(session, input_id),
            Command::Fenced { fence, command } => {
                self.fence(fence)?;
                self.apply(command)
            }
            Command::Batch(_) => invalid("a batch cannot be decided as one command; nested batches are not allowed"),
        }
    }

    // ----- leases -------------------------------------------------------------------

    /// When the lease of `id` expires: its granted expiry, or a later renewal of its token.
    fn expiry(&self, id: &SessionId, lease: &LeaseState) -> u64 {
        match self.renewals.get(id) {
            Some((token, until)) if *token == lease.token => (*until).max(lease.expires_at_ms),
            _ => lease.expires_at_ms,
        }
    }

    fn current_token(s: &Session) -> u64 {
        s.lease.as_ref().map_or(0, |l| l.token)
    }

    fn fence(&self, fence: &Fence) -> Reply<()> {
        let current = Model::current_token(self.existing(&fence.session)?);
        if fence.token != current {
            return Err(Rejection::Fenced { presented: fence.token, current });
        }
        Ok(())
    }

    fn ttl(what: &str, ttl_ms: u64) -> Reply<()> {
        if ttl_ms == 0 || ttl_ms > LEASE_TTL_MS_MAX {
            return invalid(&format!("{what} ttl {ttl_ms} ms is outside 1..={LEASE_TTL_MS_MAX}"));
        }
        Ok(())
    }

    fn acquire_lease(&mut self, c: &AcquireLease) -> Reply<Outcome> {
        self.id("lease owner", &c.owner)?;
        Model::ttl("lease", c.ttl_ms)?;
        let now = self.time.now_ms();
        let s = self.live(&c.session)?;
        let expires_at_ms = now.saturating_add(c.ttl_ms);
        if let Some(lease) = &s.lease {
            let until = self.expiry(&c.session, lease);
            if !lease.released && now < until {
                if lease.owner != c.owner {
                    return Err(Rejection::Busy { holder: lease.owner.clone(), expires_at_ms: until });
                }
                let lease = Lease {
                    session: c.session,
                    owner: c.owner.clone(),
                    token: lease.token,
                    expires_at_ms: expires_at_ms.max(until),
                };
                self.renewals.insert(c.session, (lease.token, lease.expires_at_ms));
                return Ok(Outcome::Lease { lease, seq: None });
            }
        }
        let token = Model::current_token(s) + 1;
        self.session_mut(&c.session).lease =
            Some(LeaseState { owner: c.owner.clone(), token, expires_at_ms, released: false });
        let seq = self.emit(c.session, EventKind::LeaseAcquired);
        let lease = Lease { session: c.session, owner: c.owner.clone(), token, expires_at_ms };
        Ok(Outcome::Lease { lease, seq: Some(seq) })
    }

    fn renew_lease(&mut self, c: &RenewLease) -> Reply<Outcome> {
        Model::ttl("lease", c.ttl_ms)?;
        let now = self.time.now_ms();
        let s = self.existing(&c.session)?;
        match &s.lease {
            Some(lease) if lease.token == c.token && !lease.released => {
                let lease = Lease {
                    session: c.session,
                    owner: lease.owner.clone(),
                    token: lease.token,
                    expires_at_ms: now.saturating_add(c.ttl_ms).max(self.expiry(&c.session, lease)),
                };
                self.renewals.insert(c.session, (lease.token, lease.expires_at_ms));
                Ok(Outcome::Lease { lease, seq: None })
            }
            _ => Err(Rejection::Fenced { presented: c.token, current: Model::current_token(s) }),
        }
    }

    fn release_lease(&mut self, session: &SessionId, token: u64) -> Reply<Outcome> {
        let s = self.existing(session)?;
        match &s.lease {
            Some(lease) if lease.token == token && lease.released => Ok(Outcome::LeaseReleased { seq: None }),
            Some(lease) if lease.token == token => {
                if let Some(lease) = self.session_mut(session).lease.as_mut() {
                    lease.released = true;
                }
                Ok(Outcome::LeaseReleased { seq: Some(self.emit(*session, EventKind::LeaseReleased)) })
            }
            _ => Err(Rejection::Fenced { presented: token, current: Model::current_token(s) }),
        }
    }

    // ----- the inbox ----------------------------------------------------------------

    fn enqueue_input(&mut self, c: &EnqueueInput) -> Reply<Outcome> {
        self.id("input id", &c.input_id)?;
        let mut staged = Staged::new();
        let message = self.message(&c.message, &mut staged)?;
        let s = self.existing(&c.session)?;
        if let Some(row) = s.inputs.get(&c.input_id) {
            if row.message == message.id && row.kind == c.kind {
                return Ok(Outcome::Enqueued { seq: None });
            }
            return Err(Rejection::InputConflict { input_id: c.input_id.clone() });
        }
        let s = self.live(&c.session)?;
        self.limit(Limit::InboxInputs, s.open_inputs.len() as u64 + 1)?;
        let seq = self.seq + 1;
        let s = self.session_mut(&c.session);
        let row = InputRow {
            input_id: c.input_id.clone(),
            seq,
            message: message.id,
            kind: c.kind,
            state: InputState::Pending,
        };
        s.inputs.insert(c.input_id.clone(), row);
        s.open_inputs.push(c.input_id.clone());
        self.emit(c.session, EventKind::InputEnqueued);
        self.keep(staged);
        Ok(Outcome::Enqueued { seq: Some(seq) })
    }

    fn claim_inputs(&mut self, c: &ClaimInputs) -> Reply<Outcome> {
        self.id("claim owner", &c.owner)?;
        Model::ttl("claim", c.ttl_ms)?;
        if c.max == 0 {
            return invalid("a claim must take at least one input");
        }
        self.limit(Limit::ListItems, c.max)?;
        if let ClaimTarget::Turn(turn) = &c.target {
            self.id("turn id", turn)?;
        }
        let now = self.time.now_ms();
        let s = self.live(&c.session)?;
        let current = Model::current_token(s);
        if c.token != current {
            return Err(Rejection::Fenced { presented: c.token, current });
        }
        let wanted = match &c.target {
            ClaimTarget::Turn(turn) => {
                if s.turns.contains_key(turn) {
                    return Err(Rejection::TurnNotLive { turn_id: turn.clone() });
                }
                InputKind::ActiveTurn
            }
            ClaimTarget::NextTurn => {
                for claim in s.claims.values().filter(|c| c.open) {
                    if let ClaimTarget::Turn(turn) = &claim.target {
                        if claim.expires_at_ms > now && !s.turns.contains_key(turn) {
                            return Err(Rejection::NotIdle { turn_id: turn.clone() });
                        }
                    }
                }
                InputKind::NextTurn
            }
        };
        let inputs: Vec<String> = s
            .open_inputs
            .iter()
            .filter(|id| s.inputs[*id].kind == wanted && s.inputs[*id].state.claimable(now))
            .take(c.max as usize)
            .cloned()
            .collect();
        if inputs.is_empty() {
            return Ok(Outcome::Claimed { seq: None, claim: None, inputs, expires_at_ms: 0 });
        }
        let expires_at_ms = now.saturating_add(c.ttl_ms);
        let s = self.session_mut(&c.session);
        let claim = s.stream_seq + 1;
        let mut previous = BTreeSet::new();
        for id in &inputs {
            let row = s.inputs.get_mut(id).expect("an open input");
            if let InputState::Claimed { claim, .. } = row.state {
                previous.insert(claim);
            }
            row.state = InputState::Claimed { claim, expires_at_ms };
        }
        let row = ClaimRow {
            claim,
            owner: c.owner.clone(),
            token: c.token,
            target: c.target.clone(),
            inputs: inputs.clone(),
            expires_at_ms,
            open: true,
        };
        s.claims.insert(claim, row);
        for old in previous {
            s.close_claim_if_empty(old);
        }
        let seq = self.emit(c.session, EventKind::InputsClaimed);
        Ok(Outcome::Claimed { seq: Some(seq), claim: Some(claim), inputs, expires_at_ms })
    }

    fn abandon_claim(&mut self, session: &SessionId, claim: u64) -> Reply<Outcome> {
        let s = self.existing(session)?;
        let Some(row) = s.claims.get(&claim) else {
            return Err(Rejection::UnknownClaim { claim });
        };
        if !row.open {
            return Ok(Outcome::ClaimAbandoned { seq: None });
        }
        self.live(session)?;
        let s = self.session_mut(session);
        let row = s.claims.get_mut(&claim).expect("checked above");
        row.open = false;
        for id in row.inputs.clone() {
            let input = s.inputs.get_mut(&id).expect("a claimed input");
            if matches!(input.state, InputState::Claimed { claim: c, .. } if c == claim) {
                input.state = InputState::Pending;
            }
        }
        Ok(Outcome::ClaimAbandoned { seq: Some(self.emit(*session, EventKind::ClaimAbandoned)) })
    }

    fn cancel_input(&mut self, session: &SessionId, input_id: &str) -> Reply<Outcome> {
        self.id("input id", input_id)?;
        let now = self.time.now_ms();
        let s = self.existing(session)?;
        let Some(row) = s.inputs.get(input_id) else {
            return Err(Rejection::UnknownInput { input_id: input_id.to_string() });
        };
        match &row.state {
            InputState::Cancelled { .. } => return Ok(Outcome::InputCancelled { seq: None }),
            state if !state.claimable(now) => {
                return Err(Rejection::InputState { input_id: input_id.to_string(), state: state.name() })
            }
            _ => {}
        }
        self.live(session)?;
        let seq = self.seq + 1;
        let s = self.session_mut(session);
        let row = s.inputs.get_mut(input_id).expect("checked above");
        let held = match row.state {
            InputState::Claimed { claim, .. } => Some(claim),
            _ => None,
        };
        row.state = InputState::Cancelled { seq };
        s.open_inputs.retain(|o| o != input_id);
        if let Some(claim) = held {
            s.close_claim_if_empty(claim);
        }
        self.emit(*session, EventKind::InputCancelled);
        Ok(Outcome::InputCancelled { seq: Some(seq) })
    }

    /// The open inputs of `id`, as the engine's `inbox` reads them.
    pub fn inbox(&self, id: &SessionId) -> annal::Result<Vec<QueuedInput>> {
        let Some(s) = self.sessions.get(id) else { return Ok(Vec::new()) };
        Ok(s.open_inputs
            .iter()
            .map(|i| {
                let row = &s.inputs[i];
                let bytes = &self.content[&row.message];
                QueuedInput {
                    input_id: row.input_id.clone(),
                    seq: row.seq,
                    kind: row.kind,
                    state: row.state.clone(),
                    message: annal::codec::decode_message(bytes, u64::MAX).expect("a stored message"),
                }
            })
            .collect())
    }

    /// Every input of `id`, whatever its state.
    pub fn input_ids(&self, id: &SessionId) -> Vec<String> {
        self.sessions.get(id).map(|s| s.inputs.keys().cloned().collect()).unwrap_or_default()
    }

    /// Claimed inputs of `id`, and the claims of `id`.
    pub fn claimed_inputs(&self, id: &SessionId) -> (Vec<String>, Vec<u64>) {
        let Some(s) = self.sessions.get(id) else { return (Vec::new(), Vec::new()) };
        let claimed = s.inputs.values().filter(|r| matches!(r.state, InputState::Claimed { .. }));
        (claimed.map(|r| r.input_id.clone()).collect(), s.claims.keys().copied().collect())
    }

    // ----- drafts -------------------------------------------------------------------

    fn draft_bytes(&self, pick: impl Fn(&(SessionId, String)) -> bool) -> u64 {
        self.drafts.iter().filter(|(k, _)| pick(k)).map(|(_, d)| d.0.iter().map(|s| s.len() as u64).sum::<u64>()).sum()
    }

    fn append_draft(&mut self, c: &AppendDraft) -> Reply<Outcome> {
        self.id("draft id", &c.draft_id)?;
        if c.segment.is_empty() {
            return invalid("a draft segment must not be empty");
        }
        self.live(&c.session)?;
        let key = (c.session, c.draft_id.clone());
        let n = c.segment.len() as u64;
        let bytes = self.draft_bytes(|k| *k == key);
        self.limit(Limit::DraftBytes, bytes + n)?;
        self.limit(Limit::SessionDraftBytes, self.draft_bytes(|k| k.0 == c.session) + n)?;
        self.limit(Limit::DraftBytesTotal, self.draft_bytes(|_| true) + n)?;
        let now = self.time.now_ms();
        let d = self.drafts.entry(key).or_insert_with(|| (Vec::new(), now, now));
        d.0.push(c.segment.clone());
        d.2 = now;
        Ok(Outcome::DraftAppended { index: d.0.len() as u32 - 1, draft_bytes: bytes + n })
    }

    fn discard_draft(&mut self, session: &SessionId, draft_id: &str) -> Reply<Outcome> {
        self.id("draft id", draft_id)?;
        self.existing(session)?;
        let existed = self.drafts.remove(&(*session, draft_id.to_string())).is_some();
        Ok(Outcome::DraftDiscarded { existed })
    }

    /// The drafts of `id` as the engine reads them whole.
    pub fn drafts_of(&self, id: &SessionId) -> Vec<Draft> {
        self.drafts
            .iter()
            .filter(|(k, _)| k.0 == *id)
            .map(|(k, (segments, created, updated))| Draft {
                session: k.0,
                draft_id: k.1.clone(),
                first_segment: 0,
                segments: segments.clone(),
                total_segments: segments.len() as u32,
                total_bytes: segments.iter().map(|s| s.len() as u64).sum(),
                created_at_ms: *created,
                updated_at_ms: *updated,
            })
            .collect()
    }

    /// The current lease token of `id` (0 when it has none or does not exist).
    pub fn lease_token(&self, id: &SessionId) -> u64 {
        self.sessions.get(id).map_or(0, Model::current_token)
    }

    /// The lease of `id` as the engine's reader shows it (renewals included).
    pub fn lease(&self, id: &SessionId) -> Option<LeaseState> {
        let s = self.sessions.get(id)?;
        s.lease.clone().map(|mut lease| {
            lease.expires_at_ms = self.expiry(id, &lease);
            lease
        })
    }

    /// Creates a session holding `messages`; returns the creating seq and revision.
    fn found(
        &mut self,
        id: SessionId,
        labels: BTreeMap<String, String>,
        metadata: Vec<u8>,
        forked_from: Option<ForkOrigin>,
        messages: Vec<Msg>,
    ) -> (u64, RevisionId) {
        let seq = self.seq + 1;
        let revision = revision_of(&messages);
        let node =
            Node { id: revision, parents: Vec::new(), origin: NodeOrigin::Created, seq, messages: messages.clone() };
        let created = Transition { seq, from: None, to: revision, origin: NodeOrigin::Created };
        let session = Session {
            id,
            created_seq: seq,
            archived: false,
            labels,
            metadata,
            forked_from,
            messages,
            stream_seq: 0,
            last_seq: 0,
            nodes: vec![node],
            transitions: vec![created],
            forks: BTreeMap::new(),
            context: BTreeMap::new(),
            turns: BTreeMap::new(),
            usage: BTreeMap::new(),
            tools: Vec::new(),
            host_state: BTreeMap::new(),
            state_history: Vec::new(),
            lease: None,
            inputs: BTreeMap::new(),
            open_inputs: Vec::new(),
            claims: BTreeMap::new(),
        };
        self.sessions.insert(id, session);
        self.emit(id, EventKind::SessionCreated);
        (seq, revision)
    }

    fn create(&mut self, c: &CreateSession) -> Reply<Outcome> {
        self.labels(&c.labels)?;
        self.limit(Limit::MetadataBytes, c.metadata.len() as u64)?;
        let mut staged = Staged::new();
        let messages = self.messages(&c.messages, &mut staged)?;
        if self.sessions.contains_key(&c.session) {
            return Err(Rejection::AlreadyExists { session: c.session });
        }
        self.not_purged(&c.session)?;
        let (seq, revision) = self.found(c.session, c.labels.clone(), c.metadata.clone(), None, messages);
        self.keep(staged);
        Ok(Outcome::Created { session: c.session, receipt: self.receipt(seq, revision) })
    }

    fn commit(&mut self, c: &CommitTurn) -> Reply<Outcome> {
        self.id("turn id", &c.turn_id)?;
        if let Some(draft) = &c.draft {
            self.id("draft id", draft)?;
        }
        let outcome = self.commit_checked(c)?;
        // An accepted turn (a retry too) removes the draft it finalizes.
        if let Some(draft) = &c.draft {
            self.drafts.remove(&(c.session, draft.clone()));
        }
        Ok(outcome)
    }

    fn commit_checked(&mut self, c: &CommitTurn) -> Reply<Outcome> {
        if c.messages.is_empty()
            && c.usage.is_empty()
            && c.applied_context.is_empty()
            && c.tool_ops.is_empty()
            && c.state.is_empty()
            && c.inputs.is_empty()
        {
            return invalid(
                "a turn with no messages must record usage, apply context, reference tool operations, change host state or consume inputs",
            );
        }
        if let Some(run) = &c.run_id {
            self.id("run id", run)?;
        }
        for list in [&c.applied_context, &c.tool_ops] {
            self.limit(Limit::ListItems, list.len() as u64)?;
            list.iter().try_for_each(|k| self.id("key", k))?;
        }
        if c.applied_context.iter().collect::<BTreeSet<_>>().len() != c.applied_context.len() {
            return invalid("duplicate context keys");
        }
        if c.tool_ops.iter().collect::<BTreeSet<_>>().len() != c.tool_ops.len() {
            return invalid("duplicate tool operations");
        }
        self.limit(Limit::ListItems, c.inputs.len() as u64)?;
        c.inputs.iter().try_for_each(|k| self.id("input id", k))?;
        if c.inputs.iter().collect::<BTreeSet<_>>().len() != c.inputs.len() {
            return invalid("duplicate inputs");
        }
        self.limit(Limit::ListItems, c.usage.len() as u64)?;
        for u in &c.usage {
            self.id("provider", &u.provider)?;
            self.id("model", &u.model)?;
        }
        let mut staged = Staged::new();
        let messages = self.messages(&c.messages, &mut staged)?;
        let state = self.state(&c.state, &mut staged)?;
        let s = self.existing(&c.session)?;
        let content = TurnContent {
            messages: ids(&messages),
            usage: c.usage.clone(),
            applied_context: c.applied_context.clone(),
            tool_ops: c.tool_ops.clone(),
            state: state.clone(),
            inputs: c.inputs.clone(),
        };
        if let Some(turn) = s.turns.get(&c.turn_id) {
            if turn.content == content {
                return Ok(Outcome::AlreadyCommitted(self.receipt(turn.seq, turn.revision)));
            }
            return Err(Rejection::TurnConflict { turn_id: c.turn_id.clone() });
        }
        if s.archived {
            return Err(Rejection::Archived { session: c.session });
        }
        expect(s, &c.expected)?;
        for key in &c.applied_context {
            if !matches!(s.context.get(key), Some(Ctx { applied: None, .. })) {
                return Err(Rejection::ContextNotPending { key: key.clone() });
            }
        }
        if let Some(op) = c.tool_ops.iter().find(|op| s.tool(op).is_none()) {
            return Err(Rejection::UnknownToolOp { op_id: op.clone() });
        }
        self.state_fits(s, &state)?;
        for id in &c.inputs {
            match s.inputs.get(id) {
                None => return Err(Rejection::UnknownInput { input_id: id.clone() }),
                Some(InputRow { state: InputState::Claimed { .. }, .. }) => {}
                Some(row) => return Err(Rejection::InputState { input_id: id.clone(), state: row.state.name() }),
            }
        }
        let seq = self.seq + 1;
        let s = self.session_mut(&c.session);
        for id in &c.inputs {
            let row = s.inputs.get_mut(id).expect("checked above");
            let held = match row.state {
                InputState::Claimed { claim, .. } => claim,
                _ => unreachable!("checked above"),
            };
            row.state = InputState::Completed { turn_id: c.turn_id.clone(), seq };
            s.open_inputs.retain(|o| o != id);
            s.close_claim_if_empty(held);
        }
        // A turn without messages moves the stream, not the revision.
        let revision = if messages.is_empty() {
            s.revision()
        } else {
            let mut after = s.messages.clone();
            after.extend(messages);
            s.advance(seq, NodeOrigin::Turn { turn_id: c.turn_id.clone() }, after)
        };
        for key in &c.applied_context {
            let ctx = s.context.get_mut(key).expect("checked pending above");
            ctx.applied = Some((seq, c.turn_id.clone()));
        }
        let mut reported = BTreeSet::new();
        for u in &c.usage {
            let t = s.usage.entry((u.provider.clone(), u.model.clone())).or_default();
            t.input = t.input.saturating_add(u.input);
            t.output = t.output.saturating_add(u.output);
            t.cache_read = t.cache_read.saturating_add(u.cache_read);
            t.cache_write = t.cache_write.saturating_add(u.cache_write);
            if reported.insert((u.provider.clone(), u.model.clone())) {
                t.turns += 1;
            }
        }
        s.turns.insert(c.turn_id.clone(), Turn { content, seq, revision });
        let stream_seq = s.stream_seq + 1;
        s.apply_state(stream_seq, &state);
        self.emit(c.session, EventKind::TurnCommitted);
        self.keep(staged);
        Ok(Outcome::Committed(self.receipt(seq, revision)))
    }

    fn rewrite(&mut self, c: &Rewrite) -> Reply<Outcome> {
        self.note(&c.note)?;
        self.note(&c.actor)?;
        let mut staged = Staged::new();
        let replacement = self.messages(&c.replacement, &mut staged)?;
        let s = self.live(&c.session)?;
        if c.expected != s.revision() {
            return Err(Rejection::RevisionConflict { expected: c.expected, actual: s.revision() });
        }
        let len = s.messages.len() as u64;
        if c.start > c.end || c.end > len {
            return Err(Rejection::InvalidRange { start: c.start, end: c.end, len });
        }
        let mut after = s.messages[..c.start as usize].to_vec();
        after.extend(replacement);
        after.extend_from_slice(&s.messages[c.end as usize..]);
        if revision_of(&after) == s.revision() {
            return Err(Rejection::NoChange);
        }
        let kind = match c.reason {
            RewriteReason::Edit => "edit",
            RewriteReason::Compaction => "compaction",
            RewriteReason::Redaction => "redaction",
        };
        let origin = NodeOrigin::Rewrite { kind: kind.into(), note: c.note.clone(), actor: c.actor.clone() };
        let seq = self.seq + 1;
        let revision = self.session_mut(&c.session).advance(seq, origin, after);
        self.emit(c.session, EventKind::TranscriptRewritten);
        self.keep(staged);
        Ok(Outcome::Rewritten(self.receipt(seq, revision)))
    }

    fn restore(&mut self, c: &Restore) -> Reply<Outcome> {
        self.note(&c.note)?;
        self.note(&c.actor)?;
        let s = self.live(&c.session)?;
        if c.expected != s.revision() {
            return Err(Rejection::RevisionConflict { expected: c.expected, actual: s.revision() });
        }
        let Some(target) = s.nodes.iter().find(|n| n.id == c.target) else {
            return Err(Rejection::UnknownRevision { revision: c.target });
        };
        if c.target == s.revision() {
            return Err(Rejection::NoChange);
        }
        let after = target.messages.clone();
        let origin = NodeOrigin::Rewrite { kind: "restore".into(), note: c.note.clone(), actor: c.actor.clone() };
        let seq = self.seq + 1;
        let revision = self.session_mut(&c.session).advance(seq, origin, after);
        self.emit(c.session, EventKind::TranscriptRewritten);
        Ok(Outcome::Rewritten(self.receipt(seq, revision)))
    }

    fn fork(&mut self, c: &Fork) -> Reply<Outcome> {
        if let Some(labels) = &c.labels {
            self.labels(labels)?;
        }
        let mut staged = Staged::new();
        let replacement = match &c.replacement {
            Some(m) => Some(self.message(m, &mut staged)?),
            None => None,
        };
        let parent = self.existing(&c.parent)?;
        let len = parent.messages.len() as u64;
        let fits = match replacement {
            Some(_) => c.index < len,
            None => c.index <= len,
        };
        if !fits {
            return Err(Rejection::IndexOutOfBounds { index: c.index, len });
        }
        if self.sessions.contains_key(&c.session) {
            return Err(Rejection::AlreadyExists { session: c.session });
        }
        self.not_purged(&c.session)?;
        let mut messages = parent.messages[..c.index as usize].to_vec();
        messages.extend(replacement);
        let labels = c.labels.clone().unwrap_or_else(|| parent.labels.clone());
        let metadata = parent.metadata.clone();
        let parent_revision = parent.revision();
        let origin = ForkOrigin { session: c.parent, revision: parent_revision, message_count: c.index };
        let seq = self.seq + 1;
        self.session_mut(&c.parent).forks.insert(c.session, (parent_revision, c.index, seq));
        let (seq, revision) = self.found(c.session, labels, metadata, Some(origin), messages);
        self.keep(staged);
        Ok(Outcome::Created { session: c.session, receipt: self.receipt(seq, revision) })
    }

    fn archive(&mut self, session: &SessionId, reason: &str) -> Reply<Outcome> {
        self.note(reason)?;
        if self.existing(session)?.archived {
            return Ok(Outcome::Archived { seq: None });
        }
        self.session_mut(session).archived = true;
        Ok(Outcome::Archived { seq: Some(self.emit(*session, EventKind::SessionArchived)) })
    }

    fn revive(&mut self, session: &SessionId, reason: &str) -> Reply<Outcome> {
        self.note(reason)?;
        if !self.existing(session)?.archived {
            return Err(Rejection::NotArchived { session: *session });
        }
        self.session_mut(session).archived = false;
        Ok(Outcome::Revived { seq: self.emit(*session, EventKind::SessionRevived) })
    }

    fn append_context(&mut self, c: &AppendContext) -> Reply<Outcome> {
        self.id("context key", &c.key)?;
        self.note(&c.source)?;
        if blank(&c.content) {
            return invalid("context content is blank");
        }
        let mut staged = Staged::new();
        let content = self.blob(&c.content, &mut staged)?;
        // Retries first: an exact retry answers as one even after archive.
        if self.existing(&c.session)?.context.get(&c.key).is_some_and(|ctx| ctx.content == content) {
            return Ok(Outcome::Duplicate);
        }
        let s = self.live(&c.session)?;
        if s.context.contains_key(&c.key) {
            return Err(Rejection::ContextConflict { key: c.key.clone() });
        }
        let ctx = Ctx { content, source: c.source.clone(), appended_seq: self.seq + 1, applied: None };
        self.session_mut(&c.session).context.insert(c.key.clone(), ctx);
        let seq = self.emit(c.session, EventKind::ContextAppended);
        self.keep(staged);
        Ok(Outcome::Staged { seq })
    }

    fn tool_call(&mut self, c: &RecordToolCall) -> Reply<Outcome> {
        self.id("op id", &c.op_id)?;
        self.id("call id", &c.call_id)?;
        self.id("tool name", &c.tool_name)?;
        if let Some(parent) = &c.parent_op {
            self.id("parent op", parent)?;
            if *parent == c.op_id {
                return invalid("a tool operation cannot be its own parent");
            }
        }
        if let Some(turn) = &c.turn_id {
            self.id("turn id", turn)?;
        }
        let mut staged = Staged::new();
        let args = self.blob(&c.args, &mut staged)?;
        let exact = self.existing(&c.session)?.tool(&c.op_id).is_some_and(|op| {
            op.tool_name == c.tool_name
                && op.args == args
                && op.parent_op == c.parent_op
                && op.call_id == c.call_id
                && op.turn_id == c.turn_id
                && op.recovery == c.recovery
        });
        if exact {
            return Ok(Outcome::Tool { created: false, seq: None });
        }
        let s = self.live(&c.session)?;
        if let Some(op) = s.tool(&c.op_id) {
            let drift = [
                ("tool_name", op.tool_name != c.tool_name),
                ("args", op.args != args),
                ("parent_op", op.parent_op != c.parent_op),
                ("call_id", op.call_id != c.call_id),
                ("turn_id", op.turn_id != c.turn_id),
                ("recovery", op.recovery != c.recovery),
            ];
            return match drift.iter().find(|(_, differs)| *differs) {
                Some((field, _)) => Err(Rejection::ToolConflict { op_id: c.op_id.clone(), field }),
                None => Ok(Outcome::Tool { created: false, seq: None }),
            };
        }
        if let Some(parent) = c.parent_op.as_ref().filter(|p| s.tool(p).is_none()) {
            return Err(Rejection::UnknownToolOp { op_id: parent.clone() });
        }
        let tool = Tool {
            op_id: c.op_id.clone(),
            call_id: c.call_id.clone(),
            tool_name: c.tool_name.clone(),
            args,
            parent_op: c.parent_op.clone(),
            turn_id: c.turn_id.clone(),
            recovery: c.recovery,
            call_seq: self.seq + 1,
            settled: None,
        };
        self.session_mut(&c.session).tools.push(tool);
        let seq = self.emit(c.session, EventKind::ToolCallRecorded);
        self.keep(staged);
        Ok(Outcome::Tool { created: true, seq: Some(seq) })
    }

    fn tool_result(&mut self, c: &RecordToolResult) -> Reply<Outcome> {
        self.id("op id", &c.op_id)?;
        let mut staged = Staged::new();
        let result = self.blob(&c.result, &mut staged)?;
        let settled = self.existing(&c.session)?.tool(&c.op_id).and_then(|op| op.settled);
        if settled.is_some_and(|(outcome, stored, _)| outcome == c.outcome && stored == result) {
            return Ok(Outcome::Tool { created: false, seq: None });
        }
        let s = self.live(&c.session)?;
        let Some(op) = s.tool(&c.op_id) else {
            return Err(Rejection::ToolOrphan { op_id: c.op_id.clone() });
        };
        if let Some((outcome, stored, _)) = op.settled {
            return match (outcome == c.outcome, stored == result) {
                (true, true) => Ok(Outcome::Tool { created: false, seq: None }),
                (false, _) => Err(Rejection::ToolConflict { op_id: c.op_id.clone(), field: "outcome" }),
                (true, false) => Err(Rejection::ToolConflict { op_id: c.op_id.clone(), field: "result" }),
            };
        }
        let seq = self.seq + 1;
        let s = self.session_mut(&c.session);
        let op = s.tools.iter_mut().find(|t| t.op_id == c.op_id).expect("found above");
        op.settled = Some((c.outcome, result, seq));
        self.emit(c.session, EventKind::ToolResultRecorded);
        self.keep(staged);
        Ok(Outcome::Tool { created: true, seq: Some(seq) })
    }

    /// Validates host state changes in `decide`'s order and stages their values.
    fn state(
        &self,
        changes: &StateChanges,
        staged: &mut Staged,
    ) -> Reply<(BTreeMap<String, ContentId>, BTreeSet<String>)> {
        self.limit(Limit::HostStateEntries, changes.set.len() as u64)?;
        self.limit(Limit::HostStateEntries, changes.remove.len() as u64)?;
        for name in changes.set.keys().chain(&changes.remove) {
            if name.is_empty() {
                return invalid("host state names must not be empty");
            }
            self.limit(Limit::HostStateNameBytes, name.len() as u64)?;
        }
        if changes.set.keys().any(|k| changes.remove.contains(k)) {
            return invalid("a host state entry is both set and removed");
        }
        let mut set = BTreeMap::new();
        for (name, value) in &changes.set {
            set.insert(name.clone(), self.blob(value, staged)?);
        }
        Ok((set, changes.remove.clone()))
    }

    /// `LimitExceeded` if the session would hold more entries than allowed.
    fn state_fits(&self, s: &Session, state: &(BTreeMap<String, ContentId>, BTreeSet<String>)) -> Reply<()> {
        if state.0.is_empty() && state.1.is_empty() {
            return Ok(());
        }
        let mut after = s.host_state.clone();
        for k in &state.1 {
            after.remove(k);
        }
        after.extend(state.0.clone());
        self.limit(Limit::HostStateEntries, after.len() as u64)
    }

    fn set_metadata(&mut self, c: &SetMetadata) -> Reply<Outcome> {
        self.limit(Limit::MetadataBytes, c.metadata.len() as u64)?;
        if self.existing(&c.session)?.metadata == c.metadata {
            return Ok(Outcome::Metadata { seq: None });
        }
        let s = self.live(&c.session)?;
        expect(s, &c.expected)?;
        self.session_mut(&c.session).metadata = c.metadata.clone();
        Ok(Outcome::Metadata { seq: Some(self.emit(c.session, EventKind::MetadataSet)) })
    }

    fn set_host_state(&mut self, c: &SetHostState) -> Reply<Outcome> {
        let mut staged = Staged::new();
        let (set, remove) = self.state(&c.state, &mut staged)?;
        let s = self.existing(&c.session)?;
        let set: BTreeMap<String, ContentId> =
            set.into_iter().filter(|(k, v)| s.host_state.get(k) != Some(v)).collect();
        let remove: BTreeSet<String> = remove.into_iter().filter(|k| s.host_state.contains_key(k)).collect();
        if set.is_empty() && remove.is_empty() {
            return Ok(Outcome::HostState { seq: None });
        }
        let s = self.live(&c.session)?;
        expect(s, &c.expected)?;
        let state = (set, remove);
        self.state_fits(s, &state)?;
        let s = self.session_mut(&c.session);
        let stream_seq = s.stream_seq + 1;
        s.apply_state(stream_seq, &state);
        let seq = self.emit(c.session, EventKind::HostStateChanged);
        staged.retain(|(id, _)| state.0.values().any(|v| v == id));
        self.keep(staged);
        Ok(Outcome::HostState { seq: Some(seq) })
    }

    fn set_labels(&mut self, c: &SetLabels) -> Reply<Outcome> {
        self.limit(Limit::LabelsPerSession, c.set.len() as u64)?;
        self.limit(Limit::LabelsPerSession, c.remove.len() as u64)?;
        c.set.iter().try_for_each(|(k, v)| self.label(k, Some(v)))?;
        c.remove.iter().try_for_each(|k| self.label(k, None))?;
        if c.set.keys().any(|k| c.remove.contains(k)) {
            return invalid("a label key is both set and removed");
        }
        let s = self.existing(&c.session)?;
        let mut after = s.labels.clone();
        for k in &c.remove {
            after.remove(k);
        }
        after.extend(c.set.clone());
        if after == s.labels {
            return Ok(Outcome::Labels { seq: None });
        }
        self.live(&c.session)?;
        self.limit(Limit::LabelsPerSession, after.len() as u64)?;
        self.session_mut(&c.session).labels = after;
        Ok(Outcome::Labels { seq: Some(self.emit(c.session, EventKind::LabelsChanged)) })
    }

    // ----- queries ----------------------------------------------------------------

    fn page_size(&self, limit: u64) -> annal::Result<()> {
        self.limit(Limit::PageItems, limit).map_err(Error::Rejected)
    }

    fn found_session(&self, id: &SessionId) -> annal::Result<&Session> {
        self.existing(id).map_err(Error::Rejected)
    }

    /// The head of `id`.
    pub fn head(&self, id: &SessionId) -> Option<SessionHead> {
        let s = self.sessions.get(id)?;
        Some(SessionHead {
            session: s.id,
            revision: s.revision(),
            message_count: s.messages.len() as u64,
            archived: s.archived,
            labels: s.labels.clone(),
            metadata: s.metadata.clone(),
            forked_from: s.forked_from.clone(),
            created_seq: s.created_seq,
            created_at_ms: self.ms(s.created_seq),
            last_seq: s.last_seq,
            stream_seq: s.stream_seq,
            updated_at_ms: self.ms(s.last_seq),
            host_state: s.host_state.clone(),
            lease: s.lease.clone(),
        })
    }

    /// Lists sessions in creation order.
    pub fn list(&self, q: &ListQuery) -> annal::Result<Page<SessionHead>> {
        let limit = if q.limit == 0 { self.limits.page_items_max } else { q.limit };
        self.page_size(limit)?;
        let mut matching: Vec<&Session> = self
            .sessions
            .values()
            .filter(|s| q.include_archived || !s.archived)
            .filter(|s| q.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect();
        match q.order {
            ListOrder::Created => matching.sort_by_key(|s| s.created_seq),
            ListOrder::RecentlyUpdated => matching.sort_by_key(|s| std::cmp::Reverse(s.last_seq)),
        }
        let rest: Vec<&Session> = matching.into_iter().skip(q.offset as usize).collect();
        let items = rest.iter().take(limit as usize).filter_map(|s| self.head(&s.id)).collect();
        Ok(Page { items, offset: q.offset, limit, has_more: rest.len() as u64 > limit })
    }

    fn page_of(&self, id: &SessionId, revision: RevisionId, messages: &[Msg], page: PageRequest) -> TranscriptPage {
        let total = messages.len() as u64;
        let from = page.offset.min(total);
        let to = from.saturating_add(page.limit).min(total);
        let all = ids(messages);
        let messages = (from..to)
            .map(|p| StoredMessage {
                position: p,
                content_id: all[p as usize],
                chain: RevisionId::of(&all[..=p as usize]),
                message: messages[p as usize].object.clone(),
            })
            .collect();
        TranscriptPage {
            session: *id,
            revision,
            total,
            offset: from,
            limit: page.limit,
            messages,
            has_more: to < total,
        }
    }

    /// A page of the current transcript.
    pub fn transcript(&self, id: &SessionId, page: PageRequest) -> annal::Result<TranscriptPage> {
        self.page_size(page.limit)?;
        let s = self.found_session(id)?;
        Ok(self.page_of(id, s.revision(), &s.messages, page))
    }

    /// A page of any revision the session has held.
    pub fn transcript_at(
        &self,
        id: &SessionId,
        revision: &RevisionId,
        page: PageRequest,
    ) -> annal::Result<TranscriptPage> {
        self.page_size(page.limit)?;
        let s = self.found_session(id)?;
        match s.nodes.iter().find(|n| n.id == *revision) {
            Some(node) => Ok(self.page_of(id, *revision, &node.messages, page)),
            None => rejected(Rejection::UnknownRevision { revision: *revision }),
        }
    }

    fn node_view(&self, ordinal: usize, n: &Node) -> NodeView {
        NodeView {
            revision: n.id,
            ordinal: ordinal as u64,
            parents: n.parents.clone(),
            origin: n.origin.clone(),
            seq: n.seq,
            message_count: n.messages.len() as u64,
            created_at_ms: self.ms(n.seq),
        }
    }

    /// A page of the session's revisions, oldest first.
    pub fn revisions(&self, id: &SessionId, page: PageRequest) -> annal::Result<RevisionView> {
        self.page_size(page.limit)?;
        let s = self.found_session(id)?;
        let total = s.nodes.len() as u64;
        let offset = page.offset.min(total);
        let end = offset.saturating_add(page.limit).min(total);
        let items = (offset..end).map(|o| self.node_view(o as usize, &s.nodes[o as usize])).collect();
        Ok((s.revision(), total, Page { items, offset, limit: page.limit, has_more: end < total }))
    }

    /// The session's whole revision graph.
    pub fn graph(&self, id: &SessionId) -> annal::Result<GraphView> {
        let s = self.found_session(id)?;
        let edges = s
            .transitions
            .iter()
            .map(|t| RevisionEdge {
                seq: t.seq,
                from: t.from,
                to: t.to,
                origin: t.origin.clone(),
                at_ms: self.ms(t.seq),
            })
            .collect();
        let forks = s
            .forks
            .iter()
            .map(|(child, (revision, message_count, seq))| ForkEdge {
                child: *child,
                revision: *revision,
                message_count: *message_count,
                seq: *seq,
            })
            .collect();
        Ok(GraphView {
            session: *id,
            head: s.revision(),
            nodes: s.nodes.iter().enumerate().map(|(i, n)| self.node_view(i, n)).collect(),
            edges,
            forks,
            forked_from: s.forked_from.clone(),
        })
    }

    /// Every context entry, in key order.
    pub fn context(&self, id: &SessionId) -> annal::Result<Vec<ContextEntry>> {
        let s = self.found_session(id)?;
        let entry = |(key, c): (&String, &Ctx)| ContextEntry {
            key: key.clone(),
            content: c.content,
            source: c.source.clone(),
            appended_seq: c.appended_seq,
            state: match &c.applied {
                None => ContextState::Pending,
                Some((seq, turn_id)) => ContextState::Applied { seq: *seq, turn_id: turn_id.clone() },
            },
        };
        Ok(s.context.iter().map(entry).collect())
    }

    /// Pending context entries, in key order.
    pub fn pending_context(&self, id: &SessionId) -> annal::Result<Vec<ContextEntry>> {
        let mut all = self.context(id)?;
        all.retain(|e| e.state == ContextState::Pending);
        Ok(all)
    }

    /// Usage totals per (provider, model).
    pub fn usage(&self, id: &SessionId) -> annal::Result<Vec<UsageTotals>> {
        let s = self.found_session(id)?;
        Ok(s.usage
            .iter()
            .map(|((provider, model), t)| UsageTotals {
                provider: provider.clone(),
                model: model.clone(),
                input: t.input,
                output: t.output,
                cache_read: t.cache_read,
                cache_write: t.cache_write,
                turns: t.turns,
            })
            .collect())
    }

    fn tool_view(&self, s: &Session, ordinal: usize, t: &Tool) -> ToolOp {
        ToolOp {
            session: s.id,
            op_id: t.op_id.clone(),
            ordinal: ordinal as u64,
            call_id: t.call_id.clone(),
            tool_name: t.tool_name.clone(),
            args: t.args,
            parent_op: t.parent_op.clone(),
            turn_id: t.turn_id.clone(),
            recovery: t.recovery,
            call_seq: t.call_seq,
            called_at_ms: self.ms(t.call_seq),
            state: match t.settled {
                None => ToolState::Prepared,
                Some((outcome, result, seq)) => ToolState::Settled { outcome, result, seq, at_ms: self.ms(seq) },
            },
        }
    }

    fn tool_views(&self, s: &Session) -> Vec<ToolOp> {
        s.tools.iter().enumerate().map(|(i, t)| self.tool_view(s, i, t)).collect()
    }

    /// One tool operation.
    pub fn tool_op(&self, id: &SessionId, op_id: &str) -> annal::Result<Option<ToolOp>> {
        let s = self.found_session(id)?;
        Ok(self.tool_views(s).into_iter().find(|t| t.op_id == op_id))
    }

    /// Unsettled operations of the session, in call order.
    pub fn unsettled(&self, id: &SessionId) -> annal::Result<Vec<ToolOp>> {
        let s = self.found_session(id)?;
        let mut open: Vec<ToolOp> = self.tool_views(s).into_iter().filter(|t| t.state == ToolState::Prepared).collect();
        open.sort_by_key(|t| t.call_seq);
        Ok(open)
    }

    /// Unsettled operations of every session, in call order.
    pub fn unsettled_all(&self, page: PageRequest) -> annal::Result<Page<ToolOp>> {
        self.page_size(page.limit)?;
        let mut open: Vec<ToolOp> = self
            .sessions
            .values()
            .flat_map(|s| self.tool_views(s))
            .filter(|t| t.state == ToolState::Prepared)
            .collect();
        open.sort_by_key(|t| t.call_seq);
        let rest: Vec<ToolOp> = open.into_iter().skip(page.offset as usize).collect();
        let has_more = rest.len() as u64 > page.limit;
        let items = rest.into_iter().take(page.limit as usize).collect();
        Ok(Page { items, offset: page.offset, limit: page.limit, has_more })
    }

    /// The session's operations in the order recorded.
    pub fn tool_ops(&self, id: &SessionId, page: PageRequest) -> annal::Result<Page<ToolOp>> {
        self.page_size(page.limit)?;
        let s = self.found_session(id)?;
        let all = self.tool_views(s);
        let total = all.len() as u64;
        let offset = page.offset.min(total);
        let end = offset.saturating_add(page.limit).min(total);
        let items = all[offset as usize..end as usize].to_vec();
        Ok(Page { items, offset, limit: page.limit, has_more: end < total })
    }

    /// Sessions in creation order.
    pub fn by_creation(&self) -> Vec<&Session> {
        let mut all: Vec<&Session> = self.sessions.values().collect();
        all.sort_by_key(|s| s.created_seq);
        all
    }

    /// (session, op id) of every unsettled tool operation, in call order.
    pub fn unsettled_ops(&self) -> Vec<(SessionId, String)> {
        let mut open: Vec<(u64, SessionId, String)> = self
            .sessions
            .values()
            .flat_map(|s| s.tools.iter().filter(|t| t.settled.is_none()).map(|t| (t.call_seq, s.id, t.op_id.clone())))
            .collect();
        open.sort();
        open.into_iter().map(|(_, s, op)| (s, op)).collect()
    }

    /// Every revision id any session holds, in creation then ordinal order.
    pub fn all_revisions(&self) -> Vec<RevisionId> {
        self.by_creation().into_iter().flat_map(|s| s.nodes.iter().map(|n| n.id)).collect()
    }
}
