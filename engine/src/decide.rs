//! `decide`: validates a command against the current projections and returns the event
//! it causes, or a typed [`Rejection`]. Pure: it reads through [`Store`] and writes
//! nothing. Batches are sequenced by the writer, which decides each member against state
//! that includes the members before it.

use crate::command::*;
use crate::error::{Error, Limit, Location, Rejection, Result};
use crate::limits::Limits;
use crate::projection::*;
use crate::store::{keys, Store, StoreExt, Table};
use annal_codec::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a command leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
// A decision lives for one command on the writer's stack; boxing the event would cost an
// allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Decision {
    /// Append `event` to `session`'s stream; `content` holds objects it refers to.
    Write {
        /// The stream the event goes to.
        session: SessionId,
        /// The event.
        event: Event,
        /// Content objects (id, canonical bytes) the event refers to.
        content: Vec<(ContentId, Vec<u8>)>,
    },
    /// Nothing to write; the command is already satisfied.
    Noop(Outcome),
    /// Renew a held lease: the writer keeps the new expiry in memory (nothing is
    /// written to the log).
    Renew(Lease),
    /// Change a draft (nothing is written to the log).
    Draft {
        /// The change.
        change: crate::draft::DraftChange,
        /// The command's outcome.
        outcome: Outcome,
    },
}

/// A lease renewal the writer holds in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// The token renewed.
    pub token: u64,
    /// Its new expiry (writer clock, unix ms).
    pub expires_at_ms: u64,
}

/// Lease renewals by session.
pub type Renewals = HashMap<SessionId, Renewal>;

/// What `decide` is given beside the store: the writer's clock (never decreasing) and
/// the lease renewals the writer holds. Time is an input, so `decide` stays pure.
#[derive(Clone, Copy, Debug, Default)]
pub struct Now<'a> {
    /// The writer's clock, unix ms.
    pub ms: u64,
    /// Renewals held in memory, if any.
    pub renewals: Option<&'a Renewals>,
    /// The drafts, if any.
    pub drafts: Option<&'a crate::draft::DraftState>,
    /// The command's content ids, computed before it reached the writer, if any.
    pub prepared: Option<&'a Prepared>,
}

impl Now<'_> {
    /// At `ms`, with no renewals.
    pub fn at(ms: u64) -> Now<'static> {
        Now { ms, renewals: None, drafts: None, prepared: None }
    }

    /// When `lease` of `session` expires: its granted expiry, or a later renewal of the
    /// same token.
    pub fn expiry(&self, session: &SessionId, lease: &LeaseState) -> u64 {
        renewed_expiry(self.renewals, session, lease)
    }
}

/// When `lease` of `session` expires given `renewals`: its granted expiry, or a later
/// renewal of the same token.
pub fn renewed_expiry(renewals: Option<&Renewals>, session: &SessionId, lease: &LeaseState) -> u64 {
    match renewals.and_then(|r| r.get(session)) {
        Some(r) if r.token == lease.token => r.expires_at_ms.max(lease.expires_at_ms),
        _ => lease.expires_at_ms,
    }
}

fn reject<T>(r: Rejection) -> Result<T> {
    Err(Error::Rejected(r))
}

fn invalid<T>(reason: impl Into<String>) -> Result<T> {
    reject(Rejection::InvalidRequest { reason: reason.into() })
}

/// The content ids (and message objects) of one command, computed on the caller's
/// thread before the command reaches the writer, so the writer's `decide` takes them
/// instead of encoding and hashing every object again; with the stored form of each
/// object that compresses.
///
/// An object is found by the buffer it was computed from (its address and length in
/// the command): the command is neither changed nor dropped between `Prepared::new`
/// and `decide`, since the request that carries both owns it. An object it does not hold
/// (an empty buffer, a copy of the command) is encoded and hashed as usual, so a
/// `Prepared` changes no decision, only its cost. Only the engine builds a non-empty one.
#[derive(Debug, Default)]
pub struct Prepared {
    /// Raw objects (attachments, context, tool arguments and results, host state
    /// values): source buffer → id.
    raw: HashMap<Source, ContentId>,
    /// Message objects: the message's body buffer → (id, canonical bytes).
    messages: HashMap<Source, (ContentId, Vec<u8>)>,
    /// The encoding and stored form of the objects that compress, by id.
    compressed: BTreeMap<ContentId, (u8, Vec<u8>)>,
}

/// A buffer of the command: its address and length (never empty).
type Source = (usize, usize);

fn source(bytes: &[u8]) -> Option<Source> {
    (!bytes.is_empty()).then_some((bytes.as_ptr() as usize, bytes.len()))
}

impl Prepared {
    /// Hashes every content object of `command` (within the limits), and compresses the
    /// ones that compress under `compression` (`annal_codec::content::compress_object`).
    pub(crate) fn new(command: &Command, limits: &Limits, compression: annal_codec::content::Compression) -> Prepared {
        let mut prepared = Prepared::default();
        let keep = |canonical: &[u8], id: ContentId, compressed: &mut BTreeMap<ContentId, (u8, Vec<u8>)>| {
            if let std::collections::btree_map::Entry::Vacant(slot) = compressed.entry(id) {
                if let Some(stored) = annal_codec::content::compress_object(canonical, compression) {
                    slot.insert(stored);
                }
            }
        };
        each_content_object(command, limits, &mut |object| match object {
            Object::Raw(bytes) => {
                let id = content_id(bytes);
                if let Some(key) = source(bytes) {
                    prepared.raw.insert(key, id);
                }
                keep(bytes, id, &mut prepared.compressed);
            }
            Object::Message(m, canonical, attachments) => {
                for (a, id) in m.attachments.iter().zip(attachments) {
                    if let Some(key) = source(a) {
                        prepared.raw.insert(key, id);
                    }
                    keep(a, id, &mut prepared.compressed);
                }
                let id = content_id(&canonical);
                keep(&canonical, id, &mut prepared.compressed);
                if let Some(key) = source(&m.body) {
                    prepared.messages.insert(key, (id, canonical));
                }
            }
        });
        prepared
    }

    /// The stored form of `id` if it compresses.
    pub(crate) fn compressed(&self, id: &ContentId) -> Option<&(u8, Vec<u8>)> {
        self.compressed.get(id)
    }
}

/// Collects content objects for one command, deduplicated.
struct ContentSet<'a> {
    objects: BTreeMap<ContentId, Vec<u8>>,
    prepared: Option<&'a Prepared>,
}

impl<'a> ContentSet<'a> {
    fn new(now: &Now<'a>) -> ContentSet<'a> {
        ContentSet { objects: BTreeMap::new(), prepared: now.prepared }
    }

    fn add(&mut self, limits: &Limits, bytes: &[u8]) -> Result<ContentId> {
        limits.check(Limit::ContentBytes, bytes.len() as u64)?;
        let known = self.prepared.and_then(|p| p.raw.get(&source(bytes)?)).copied();
        let id = known.unwrap_or_else(|| content_id(bytes));
        self.objects.entry(id).or_insert_with(|| bytes.to_vec());
        Ok(id)
    }

    fn message(&mut self, limits: &Limits, m: &Message) -> Result<ContentId> {
        // A prepared object passed these very checks on the caller's thread.
        if let Some((id, canonical)) = self.prepared.and_then(|p| p.messages.get(&source(&m.body)?)) {
            for a in &m.attachments {
                self.add(limits, a)?;
            }
            self.objects.entry(*id).or_insert_with(|| canonical.clone());
            return Ok(*id);
        }
        let bytes = message_object(limits, m, &mut |a| self.add(limits, a))?;
        let id = content_id(&bytes);
        self.objects.entry(id).or_insert(bytes);
        Ok(id)
    }

    fn messages(&mut self, limits: &Limits, ms: &[Message]) -> Result<Vec<ContentId>> {
        limits.check(Limit::MessagesPerCommand, ms.len() as u64)?;
        ms.iter().map(|m| self.message(limits, m)).collect()
    }

    fn into_vec(self) -> Vec<(ContentId, Vec<u8>)> {
        self.objects.into_iter().collect()
    }
}

/// The canonical bytes of message `m`'s object, checked against the limits; `attach`
/// takes each attachment and gives its id (what `decide` and the callers' compression
/// pass do with attachments differs, the rest is this).
fn message_object(limits: &Limits, m: &Message, attach: &mut dyn FnMut(&[u8]) -> Result<ContentId>) -> Result<Vec<u8>> {
    limits.check_id("content type", &m.content_type)?;
    limits.check(Limit::AttachmentsPerMessage, m.attachments.len() as u64)?;
    let attachments = m.attachments.iter().map(|a| attach(a)).collect::<Result<Vec<ContentId>>>()?;
    // The limit applies to what the host sends, the body; the stored object adds at
    // most `message_object_bytes_max() - content_bytes_max` bytes to it.
    limits.check(Limit::ContentBytes, m.body.len() as u64)?;
    encode_message_parts(m.role, &m.content_type, &m.body, &attachments, limits.message_object_bytes_max())
        .map_err(|e| Error::Rejected(Rejection::InvalidRequest { reason: format!("message: {e}") }))
}

/// A content object of a command, as [`each_content_object`] hands it over.
enum Object<'a> {
    /// Stored as they are: an attachment, a context text, tool arguments or a result, a
    /// host state value (borrowed from the command).
    Raw(&'a [u8]),
    /// A message, its object (encoded exactly as `decide` encodes it) and the ids of its
    /// attachments, in order.
    Message(&'a Message, Vec<u8>, Vec<ContentId>),
}

/// Hands `f` every content object `command` brings (message objects with their
/// attachments, context texts, tool arguments and results, host state values). An object
/// may come more than once. Objects over a limit are left out: `decide` rejects them.
fn each_content_object<'a>(command: &'a Command, limits: &Limits, f: &mut dyn FnMut(Object<'a>)) {
    let raw = |f: &mut dyn FnMut(Object<'a>), bytes: &'a [u8]| {
        if limits.check(Limit::ContentBytes, bytes.len() as u64).is_ok() {
            f(Object::Raw(bytes));
        }
    };
    let messages: &[Message] = match command {
        Command::CreateSession(c) => &c.messages,
        Command::CommitTurn(c) => {
            c.state.set.values().for_each(|v| raw(f, v));
            &c.messages
        }
        Command::SetHostState(c) => return c.state.set.values().for_each(|v| raw(f, v)),
        Command::Rewrite(c) => &c.replacement,
        Command::Fork(c) => c.replacement.as_slice(),
        Command::AppendContext(c) => return raw(f, &c.content),
        Command::RecordToolCall(c) => return raw(f, &c.args),
        Command::RecordToolResult(c) => return raw(f, &c.result),
        Command::Batch(commands) => return commands.iter().for_each(|c| each_content_object(c, limits, f)),
        Command::Fenced { command, .. } => return each_content_object(command, limits, f),
        Command::EnqueueInput(c) => std::slice::from_ref(&c.message),
        Command::ClaimInputs(_) | Command::AbandonClaim { .. } | Command::CancelInput { .. } => &[],
        Command::AcquireLease(_)
        | Command::RenewLease(_)
        | Command::ReleaseLease { .. }
        | Command::AppendDraft(_)
        | Command::DiscardDraft { .. } => &[],
        Command::Restore(_)
        | Command::Archive { .. }
        | Command::Revive { .. }
        | Command::SetLabels(_)
        | Command::SetMetadata(_) => &[],
    };
    for m in messages {
        let mut attachments = Vec::with_capacity(m.attachments.len());
        let object = message_object(limits, m, &mut |a| {
            limits.check(Limit::ContentBytes, a.len() as u64)?;
            let id = content_id(a);
            attachments.push(id);
            Ok(id)
        });
        if let Ok(bytes) = object {
            f(Object::Message(m, bytes, attachments));
        }
    }
}

fn check_note(limits: &Limits, note: &str) -> Result<()> {
    Ok(limits.check(Limit::NoteBytes, note.len() as u64)?)
}

fn check_label(limits: &Limits, key: &str, value: Option<&str>) -> Result<()> {
    if key.is_empty() {
        return invalid("label keys must not be empty");
    }
    limits.check(Limit::LabelKeyBytes, key.len() as u64)?;
    if let Some(v) = value {
        limits.check(Limit::LabelValueBytes, v.len() as u64)?;
    }
    Ok(())
}

fn check_labels(limits: &Limits, labels: &BTreeMap<String, String>) -> Result<()> {
    limits.check(Limit::LabelsPerSession, labels.len() as u64)?;
    labels.iter().try_for_each(|(k, v)| check_label(limits, k, Some(v)))
}

fn head<S: Store + ?Sized>(store: &S, session: &SessionId) -> Result<SessionHead> {
    match store.row(Table::Heads, &keys::session(session))? {
        Some(h) => Ok(h),
        None => reject(absent(store, session)?),
    }
}

/// Why `session` has no head: `Purged` when it has a tombstone, else `NotFound`.
pub(crate) fn absent<S: Store + ?Sized>(store: &S, session: &SessionId) -> Result<Rejection> {
    Ok(match store.row::<PurgedSession>(Table::Purged, &keys::session(session))? {
        Some(p) => Rejection::Purged { session: *session, seq: p.seq },
        None => Rejection::NotFound { session: *session },
    })
}

fn live_head<S: Store + ?Sized>(store: &S, session: &SessionId) -> Result<SessionHead> {
    let h = head(store, session)?;
    live(&h, session)?;
    Ok(h)
}

/// `Archived` unless `h` is live.
fn live(h: &SessionHead, session: &SessionId) -> Result<()> {
    if h.archived {
        return reject(Rejection::Archived { session: *session });
    }
    Ok(())
}

/// Checks a write's expectation against the head: the revision, the stream seq, or
/// nothing.
fn expect(head: &SessionHead, expected: &Expected) -> Result<()> {
    match expected {
        Expected::Exact(revision) => expect_revision(head, revision),
        Expected::Version(version) if *version != head.stream_seq => {
            reject(Rejection::VersionConflict { expected: *version, actual: head.stream_seq })
        }
        Expected::Version(_) | Expected::Any => Ok(()),
    }
}

fn expect_revision(head: &SessionHead, expected: &RevisionId) -> Result<()> {
    if *expected != head.revision {
        return reject(Rejection::RevisionConflict { expected: *expected, actual: head.revision });
    }
    Ok(())
}

use crate::transcript::chain_at;

/// Rebuilds the message list of any revision a session has held, from the revision
/// graph's recipes. Costs O(the session's events), never O(the whole log), and where the
/// store keeps revisions' lists ([`Store::cached_revision`]: an engine's view, a
/// reader's), O(the events since the nearest revision a walk rebuilt before) plus the
/// list's length; the list is kept for the next walk. `None` when the session never
/// held `revision`. A node's recipe is in the record that first
/// produced it, so `store` must see the log (a view, or an overlay over one): a store of
/// projection rows alone answers with [`Error::Storage`].
pub fn materialize<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    revision: &RevisionId,
) -> Result<Option<Vec<ContentId>>> {
    match follow_recipes(store, session, revision)? {
        Some(list) => {
            check_materialized(revision, RevisionId::of(&list))?;
            // Checked: the next walk that reaches `revision` may stop there.
            store.keep_revision(revision, &list);
            Ok(Some(list))
        }
        None => Ok(None),
    }
}

/// A materialised list must hash to the revision it was materialised for.
fn check_materialized(revision: &RevisionId, computed: RevisionId) -> Result<()> {
    if computed != *revision {
        return Err(Error::corrupt(
            Location::Projection { table: Table::Revisions.name(), key: revision.to_hex() },
            "materialized revision does not hash to its id",
        ));
    }
    Ok(())
}

/// [`materialize`]'s message list, before its hash is checked. Each node's recipe is in
/// the record that first produced it, which `store` reads (within a batch, the writer's
/// store answers for the batch's own records first: `store::WithRecords`). The walk
/// goes back from `revision` until a root, or until a node whose list the store's
/// revision cache holds (one that an earlier walk rebuilt and checked): a restore, say,
/// walks back to the revision the previous restore went to, not to the session's
/// creation.
fn follow_recipes<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    revision: &RevisionId,
) -> Result<Option<Vec<ContentId>>> {
    use crate::projection::{node_location, node_record, origin_and_recipe, stored_node};
    let mut splices = Vec::new();
    let (mut s, mut r) = (*session, *revision);
    let mut bound = u64::MAX;
    // The size of the nodes' map of the session the walk is in: read again only when a
    // fork takes the walk into its parent.
    let mut sized = (s, crate::buckets::REVISIONS.size(store, &s.0)?);
    // The record of the node the walk goes to next, read to learn that node's id.
    let mut next: Option<annal_codec::Record> = None;
    let base = loop {
        if sized.0 != s {
            sized = (s, crate::buckets::REVISIONS.size(store, &s.0)?);
        }
        let node = match stored_node(store, &s, sized.1, &r)? {
            Some(n) => n,
            None if splices.is_empty() && s == *session => return Ok(None),
            None => return Err(Error::corrupt(node_location(&s, &r), "recipe refers to a missing revision")),
        };
        if let Some(list) = store.cached_revision(&r) {
            break Base::Cached(list);
        }
        if node.seq >= bound {
            return Err(Error::corrupt(Location::Log { seq: node.seq }, "revision recipe does not go back in time"));
        }
        bound = node.seq;
        let record = match next.take() {
            Some(record) if record.seq == node.seq => record,
            Some(_) => {
                return Err(Error::corrupt(node_location(&s, &r), "a parent's node is not at the seq its child names"))
            }
            None => node_record(store, &s, Some(&r), node.seq)?.1,
        };
        // A splice's parent is the node's first parent: its id is what its record produced.
        let parent = match (&record.event, node.parents.first()) {
            (annal_codec::Event::SessionCreated(_), _) | (_, None) => None,
            (_, Some(&p)) => {
                let (id, parent_record) = node_record(store, &s, None, p)?;
                next = Some(parent_record);
                Some(id)
            }
        };
        match origin_and_recipe(&s, &r, &node, record, parent)?.1 {
            Recipe::Splice { parent, start, end, replacement } => {
                splices.push((start, end, replacement));
                r = parent;
            }
            Recipe::Root { fork: None, messages } => break Base::Root(messages),
            Recipe::Root { fork: Some(f), messages } => {
                splices.push((f.message_count, u64::MAX, messages));
                s = f.session;
                r = f.revision;
                next = None;
            }
        }
    };
    // The list never holds more than the root's messages and every replacement: room
    // for that at once, so that a long walk of appends does not grow it step by step.
    let room: usize = splices.iter().map(|(_, _, replacement)| replacement.len()).sum();
    let base = match &base {
        Base::Root(messages) => messages.as_slice(),
        Base::Cached(list) => list,
    };
    let mut list = crate::transcript::spare_ids();
    list.reserve_exact(base.len() + room);
    list.extend_from_slice(base);
    for (start, end, replacement) in splices.into_iter().rev() {
        let len = list.len() as u64;
        let end = end.min(len);
        if start > end {
            return Err(Error::corrupt(
                Location::Projection { table: Table::Revisions.name(), key: revision.to_hex() },
                "recipe splice out of range",
            ));
        }
        list.splice(start as usize..end as usize, replacement);
    }
    Ok(Some(list))
}

/// Where [`follow_recipes`]' walk ended: at a root, with its messages, or at a node whose
/// list the revision cache held.
enum Base {
    Root(Vec<ContentId>),
    Cached(std::sync::Arc<[ContentId]>),
}

/// Decides one non-batch command at the writer's time `now`. It reads `store`'s
/// projections, and for a turn id the session has committed, that turn's record
/// ([`Store::record_at`], or the batch's own records in `now`): a store of projection
/// rows alone answers such a retry with [`Error::Storage`].
pub fn decide<S: Store + ?Sized>(store: &S, command: &Command, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    let decision = decide_command(store, command, limits, now)?;
    if let Decision::Write { event, .. } = &decision {
        let size = record_len(event)
            .map_err(|e| Error::Rejected(Rejection::InvalidRequest { reason: format!("{}: {e}", event.kind()) }))?;
        limits.check(Limit::RecordBytes, size)?;
    }
    Ok(decision)
}

fn decide_command<S: Store + ?Sized>(store: &S, command: &Command, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check(Limit::CommandBytes, command.approx_bytes())?;
    match command {
        Command::Fenced { fence, command } => {
            check_fence(store, fence)?;
            decide_command(store, command, limits, now)
        }
        Command::AcquireLease(c) => acquire_lease(store, c, limits, now),
        Command::RenewLease(c) => renew_lease(store, c, now),
        Command::ReleaseLease { session, token } => release_lease(store, session, *token),
        Command::AppendDraft(c) => append_draft(store, c, limits, now),
        Command::DiscardDraft { session, draft_id } => discard_draft(store, session, draft_id, limits, now),
        Command::EnqueueInput(c) => enqueue_input(store, c, limits, now),
        Command::ClaimInputs(c) => claim_inputs(store, c, limits, now),
        Command::AbandonClaim { session, claim } => abandon_claim(store, session, *claim),
        Command::CancelInput { session, input_id } => cancel_input(store, session, input_id, limits, now),
        Command::CreateSession(c) => create(store, c, limits, now),
        Command::CommitTurn(c) => commit_turn(store, c, limits, now),
        Command::Rewrite(c) => rewrite(store, c, limits, now),
        Command::Restore(c) => restore(store, c, limits),
        Command::Fork(c) => fork(store, c, limits, now),
        Command::Archive { session, reason } => {
            check_note(limits, reason)?;
            if head(store, session)?.archived {
                return Ok(Decision::Noop(Outcome::Archived { seq: None }));
            }
            let event = Event::SessionArchived(SessionArchived { reason: reason.clone() });
            Ok(Decision::Write { session: *session, event, content: Vec::new() })
        }
        Command::Revive { session, reason } => {
            check_note(limits, reason)?;
            if !head(store, session)?.archived {
                return reject(Rejection::NotArchived { session: *session });
            }
            let event = Event::SessionRevived(SessionRevived { reason: reason.clone() });
            Ok(Decision::Write { session: *session, event, content: Vec::new() })
        }
        Command::AppendContext(c) => append_context(store, c, limits, now),
        Command::RecordToolCall(c) => tool_call(store, c, limits, now),
        Command::RecordToolResult(c) => tool_result(store, c, limits, now),
        Command::SetLabels(c) => set_labels(store, c, limits),
        Command::SetMetadata(c) => set_metadata(store, c, limits),
        Command::SetHostState(c) => set_host_state(store, c, limits, now),
        Command::Batch(_) => invalid("a batch cannot be decided as one command; nested batches are not allowed"),
    }
}

fn create<S: Store + ?Sized>(store: &S, c: &CreateSession, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    check_labels(limits, &c.labels)?;
    limits.check(Limit::MetadataBytes, c.metadata.len() as u64)?;
    let mut content = ContentSet::new(now);
    let messages = content.messages(limits, &c.messages)?;
    if store.contains(Table::Heads, &keys::session(&c.session))? {
        return reject(Rejection::AlreadyExists { session: c.session });
    }
    if let rejection @ Rejection::Purged { .. } = absent(store, &c.session)? {
        return reject(rejection);
    }
    let event = Event::SessionCreated(SessionCreated {
        labels: c.labels.clone(),
        metadata: c.metadata.clone(),
        forked_from: None,
        revision_after: RevisionId::of(&messages),
        messages,
    });
    Ok(Decision::Write { session: c.session, event, content: content.into_vec() })
}

fn check_unique(what: &str, items: &[String]) -> Result<()> {
    let set: BTreeSet<&String> = items.iter().collect();
    if set.len() != items.len() {
        return invalid(format!("duplicate {what}"));
    }
    Ok(())
}

fn commit_turn<S: Store + ?Sized>(store: &S, c: &CommitTurn, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check_id("turn id", &c.turn_id)?;
    if let Some(draft) = &c.draft {
        limits.check_id("draft id", draft)?;
    }
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
        limits.check_id("run id", run)?;
    }
    for list in [&c.applied_context, &c.tool_ops] {
        limits.check(Limit::ListItems, list.len() as u64)?;
        list.iter().try_for_each(|k| limits.check_id("key", k))?;
    }
    check_unique("context keys", &c.applied_context)?;
    check_unique("tool operations", &c.tool_ops)?;
    limits.check(Limit::ListItems, c.inputs.len() as u64)?;
    c.inputs.iter().try_for_each(|k| limits.check_id("input id", k))?;
    check_unique("inputs", &c.inputs)?;
    limits.check(Limit::ListItems, c.usage.len() as u64)?;
    for u in &c.usage {
        limits.check_id("provider", &u.provider)?;
        limits.check_id("model", &u.model)?;
    }
    let mut content = ContentSet::new(now);
    let messages = content.messages(limits, &c.messages)?;
    let state = state_delta(limits, &mut content, &c.state)?;
    let h = head(store, &c.session)?;
    let commit_hash =
        turn_commit_hash_with_inputs(&messages, &c.usage, &c.applied_context, &c.tool_ops, &state, &c.inputs);
    if let Some(seq) = crate::buckets::turn_seq(store, &c.session, &c.turn_id)? {
        let (committed_hash, receipt) = committed_turn(store, &c.session, &c.turn_id, seq)?;
        if committed_hash == commit_hash {
            return Ok(Decision::Noop(Outcome::AlreadyCommitted(receipt)));
        }
        return reject(Rejection::TurnConflict { turn_id: c.turn_id.clone() });
    }
    if h.archived {
        return reject(Rejection::Archived { session: c.session });
    }
    expect(&h, &c.expected)?;
    for key in &c.applied_context {
        let entry: Option<ContextEntry> = store.row(Table::Context, &keys::session_str(&c.session, key))?;
        if !matches!(entry, Some(ContextEntry { state: ContextState::Pending, .. })) {
            return reject(Rejection::ContextNotPending { key: key.clone() });
        }
    }
    for op in &c.tool_ops {
        if !store.contains(Table::ToolOps, &keys::session_str(&c.session, op))? {
            return reject(Rejection::UnknownToolOp { op_id: op.clone() });
        }
    }
    check_state_count(limits, &h, &state)?;
    // The inputs it consumes must be claimed (a claim that expired counts: the lease
    // fence, not the claim, keeps a stale worker out).
    for id in &c.inputs {
        match store.row::<InputRow>(Table::Inputs, &keys::session_str(&c.session, id))? {
            None => return reject(Rejection::UnknownInput { input_id: id.clone() }),
            Some(InputRow { state: InputState::Claimed { .. }, .. }) => {}
            Some(row) => return reject(Rejection::InputState { input_id: id.clone(), state: row.state.name() }),
        }
    }
    let event = Event::TurnCommitted(TurnCommitted {
        turn_id: c.turn_id.clone(),
        commit_hash,
        revision_after: h.revision.extend_all(&messages),
        messages,
        usage: c.usage.clone(),
        applied_context: c.applied_context.clone(),
        tool_ops: c.tool_ops.clone(),
        run_id: c.run_id.clone(),
        state,
        inputs: c.inputs.clone(),
    });
    Ok(Decision::Write { session: c.session, event, content: content.into_vec() })
}

fn rewrite<S: Store + ?Sized>(store: &S, c: &Rewrite, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    check_note(limits, &c.note)?;
    check_note(limits, &c.actor)?;
    let mut content = ContentSet::new(now);
    let replacement = content.messages(limits, &c.replacement)?;
    let h = live_head(store, &c.session)?;
    expect_revision(&h, &c.expected)?;
    if c.start > c.end || c.end > h.message_count {
        return reject(Rejection::InvalidRange { start: c.start, end: c.end, len: h.message_count });
    }
    let base = chain_at(store, &c.session, c.start)?;
    let mut after_splice = crate::transcript::spare_ids_from(&replacement);
    crate::transcript::ids_into(store, &c.session, c.end, h.message_count, &mut after_splice)?;
    let after = crate::transcript::remember_chain(base, after_splice);
    if after == h.revision {
        return reject(Rejection::NoChange);
    }
    let kind = match c.reason {
        RewriteReason::Edit => RewriteKind::Edit,
        RewriteReason::Compaction => RewriteKind::Compaction,
        RewriteReason::Redaction => RewriteKind::Redaction,
    };
    let event = Event::TranscriptRewritten(TranscriptRewritten {
        parent_revision: h.revision,
        start: c.start,
        end: c.end,
        replacement,
        kind,
        note: c.note.clone(),
        actor: c.actor.clone(),
        revision_after: after,
    });
    Ok(Decision::Write { session: c.session, event, content: content.into_vec() })
}

fn restore<S: Store + ?Sized>(store: &S, c: &Restore, limits: &Limits) -> Result<Decision> {
    check_note(limits, &c.note)?;
    check_note(limits, &c.actor)?;
    let h = live_head(store, &c.session)?;
    expect_revision(&h, &c.expected)?;
    let Some(target) = follow_recipes(store, &c.session, &c.target)? else {
        return reject(Rejection::UnknownRevision { revision: c.target });
    };
    let chains = crate::transcript::hash_chain(RevisionId::empty(), &target);
    check_materialized(&c.target, chains.last().copied().unwrap_or(RevisionId::empty()))?;
    store.keep_revision(&c.target, &target);
    if c.target == h.revision {
        return reject(Rejection::NoChange);
    }
    // The smallest splice that turns the head into the target: skip the common prefix
    // and the common suffix.
    let (prefix, suffix) = crate::transcript::common_ends(store, &c.session, h.message_count, &target)?;
    let replacement = target[prefix..target.len() - suffix].to_vec();
    // The fold hashes the target's list from the splice on again: keep its chain values.
    crate::transcript::remember(RevisionId::empty(), target, chains);
    let event = Event::TranscriptRewritten(TranscriptRewritten {
        parent_revision: h.revision,
        start: prefix as u64,
        end: h.message_count - suffix as u64,
        replacement,
        kind: RewriteKind::Restore { target: c.target },
        note: c.note.clone(),
        actor: c.actor.clone(),
        revision_after: c.target,
    });
    Ok(Decision::Write { session: c.session, event, content: Vec::new() })
}

fn fork<S: Store + ?Sized>(store: &S, c: &Fork, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    if let Some(labels) = &c.labels {
        check_labels(limits, labels)?;
    }
    let mut content = ContentSet::new(now);
    let messages = match &c.replacement {
        Some(m) => vec![content.message(limits, m)?],
        None => Vec::new(),
    };
    let parent = head(store, &c.parent)?;
    let len = parent.message_count;
    let out_of_bounds = match c.replacement {
        Some(_) => c.index >= len,
        None => c.index > len,
    };
    if out_of_bounds {
        return reject(Rejection::IndexOutOfBounds { index: c.index, len });
    }
    if store.contains(Table::Heads, &keys::session(&c.session))? {
        return reject(Rejection::AlreadyExists { session: c.session });
    }
    if let rejection @ Rejection::Purged { .. } = absent(store, &c.session)? {
        return reject(rejection);
    }
    let base = chain_at(store, &c.parent, c.index)?;
    let event = Event::SessionCreated(SessionCreated {
        labels: c.labels.clone().unwrap_or_else(|| parent.labels.clone()),
        metadata: parent.metadata.clone(),
        forked_from: Some(ForkOrigin { session: c.parent, revision: parent.revision, message_count: c.index }),
        revision_after: base.extend_all(&messages),
        messages,
    });
    Ok(Decision::Write { session: c.session, event, content: content.into_vec() })
}

fn is_blank(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.trim().is_empty(),
        Err(_) => bytes.is_empty(),
    }
}

fn append_context<S: Store + ?Sized>(store: &S, c: &AppendContext, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check_id("context key", &c.key)?;
    check_note(limits, &c.source)?;
    if is_blank(&c.content) {
        return invalid("context content is blank");
    }
    let mut content = ContentSet::new(now);
    let id = content.add(limits, &c.content)?;
    let h = head(store, &c.session)?;
    let entry = store.row::<ContextEntry>(Table::Context, &keys::session_str(&c.session, &c.key))?;
    // An exact retry answers as a retry whatever the session's state (§6 retries).
    if entry.as_ref().is_some_and(|e| e.content == id) {
        return Ok(Decision::Noop(Outcome::Duplicate));
    }
    live(&h, &c.session)?;
    if entry.is_some() {
        return reject(Rejection::ContextConflict { key: c.key.clone() });
    }
    let event = Event::ContextAppended(ContextAppended { key: c.key.clone(), content: id, source: c.source.clone() });
    Ok(Decision::Write { session: c.session, event, content: content.into_vec() })
}

fn tool_call<S: Store + ?Sized>(store: &S, c: &RecordToolCall, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check_id("op id", &c.op_id)?;
    limits.check_id("call id", &c.call_id)?;
    limits.check_id("tool name", &c.tool_name)?;
    if let Some(p) = &c.parent_op {
        limits.check_id("parent op", p)?;
        if *p == c.op_id {
            return invalid("a tool operation cannot be its own parent");
        }
    }
    if let Some(t) = &c.turn_id {
        limits.check_id("turn id", t)?;
    }
    let mut content = ContentSet::new(now);
    let args = content.add(limits, &c.args)?;
    let h = head(store, &c.session)?;
    let existing = store.row::<ToolOp>(Table::ToolOps, &keys::session_str(&c.session, &c.op_id))?;
    let exact = |op: &ToolOp| {
        op.tool_name == c.tool_name
            && op.args == args
            && op.parent_op == c.parent_op
            && op.call_id == c.call_id
            && op.turn_id == c.turn_id
            && op.recovery == c.recovery
    };
    // An exact retry answers as a retry whatever the session's state (§6 retries).
    if existing.as_ref().is_some_and(exact) {
        return Ok(Decision::Noop(Outcome::Tool { created: false, seq: None }));
    }
    live(&h, &c.session)?;
    if let Some(op) = existing {
        let field = if op.tool_name != c.tool_name {
            Some("tool_name")
        } else if op.args != args {
            Some("args")
        } else if op.parent_op != c.parent_op {
            Some("parent_op")
        } else if op.call_id != c.call_id {
            Some("call_id")
        } else if op.turn_id != c.turn_id {
            Some("turn_id")
        } else if op.recovery != c.recovery {
            Some("recovery")
        } else {
            None
        };
        return match field {
            Some(field) => reject(Rejection::ToolConflict { op_id: c.op_id.clone(), field }),
            None => Ok(Decision::Noop(Outcome::Tool { created: false, seq: None })),
        };
    }
    if let Some(p) = &c.parent_op {
        if !store.contains(Table::ToolOps, &keys::session_str(&c.session, p))? {
            return reject(Rejection::UnknownToolOp { op_id: p.clone() });
        }
    }
    let event = Event::ToolCallRecorded(ToolCallRecorded {
        op_id: c.op_id.clone(),
        call_id: c.call_id.clone(),
        tool_name: c.tool_name.clone(),
        args,
        parent_op: c.parent_op.clone(),
        turn_id: c.turn_id.clone(),
        recovery: c.recovery,
    });
    Ok(Decision::Write { session: c.session, event, content: content.into_vec() })
}

fn tool_result<S: Store + ?Sized>(store: &S, c: &RecordToolResult, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check_id("op id", &c.op_id)?;
    let mut content = ContentSet::new(now);
    let result = content.add(limits, &c.result)?;
    let h = head(store, &c.session)?;
    let op = store.row::<ToolOp>(Table::ToolOps, &keys::session_str(&c.session, &c.op_id))?;
    // An exact retry answers as a retry whatever the session's state (§6 retries).
    if let Some(ToolState::Settled { outcome, result: stored, .. }) = op.as_ref().map(|op| &op.state) {
        if *outcome == c.outcome && *stored == result {
            return Ok(Decision::Noop(Outcome::Tool { created: false, seq: None }));
        }
    }
    live(&h, &c.session)?;
    let Some(op) = op else {
        return reject(Rejection::ToolOrphan { op_id: c.op_id.clone() });
    };
    if let ToolState::Settled { outcome, .. } = op.state {
        let field = if outcome != c.outcome { "outcome" } else { "result" };
        return reject(Rejection::ToolConflict { op_id: c.op_id.clone(), field });
    }
    let event = Event::ToolResultRecorded(ToolResultRecorded { op_id: c.op_id.clone(), outcome: c.outcome, result });
    Ok(Decision::Write { session: c.session, event, content: content.into_vec() })
}

fn set_labels<S: Store + ?Sized>(store: &S, c: &SetLabels, limits: &Limits) -> Result<Decision> {
    limits.check(Limit::LabelsPerSession, c.set.len() as u64)?;
    limits.check(Limit::LabelsPerSession, c.remove.len() as u64)?;
    c.set.iter().try_for_each(|(k, v)| check_label(limits, k, Some(v)))?;
    c.remove.iter().try_for_each(|k| check_label(limits, k, None))?;
    if c.set.keys().any(|k| c.remove.contains(k)) {
        return invalid("a label key is both set and removed");
    }
    let h = head(store, &c.session)?;
    let set: BTreeMap<String, String> =
        c.set.iter().filter(|(k, v)| h.labels.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let remove: BTreeSet<String> = c.remove.iter().filter(|k| h.labels.contains_key(*k)).cloned().collect();
    // A request that changes nothing (an exact retry) answers as a retry whatever the
    // session's state (§6 retries).
    if set.is_empty() && remove.is_empty() {
        return Ok(Decision::Noop(Outcome::Labels { seq: None }));
    }
    live(&h, &c.session)?;
    let mut after = h.labels.clone();
    remove.iter().for_each(|k| {
        after.remove(k);
    });
    after.extend(set.clone());
    limits.check(Limit::LabelsPerSession, after.len() as u64)?;
    let event = Event::LabelsChanged(LabelsChanged { set, remove });
    Ok(Decision::Write { session: c.session, event, content: Vec::new() })
}

/// Validates host state changes and adds their values to `content`: names of 1 to
/// `host_state_name_bytes_max` bytes, at most `host_state_entries_max` of each kind, no
/// name both set and removed. Returns the delta as the event records it.
fn state_delta(limits: &Limits, content: &mut ContentSet, changes: &StateChanges) -> Result<StateDelta> {
    limits.check(Limit::HostStateEntries, changes.set.len() as u64)?;
    limits.check(Limit::HostStateEntries, changes.remove.len() as u64)?;
    for name in changes.set.keys().chain(&changes.remove) {
        if name.is_empty() {
            return invalid("host state names must not be empty");
        }
        limits.check(Limit::HostStateNameBytes, name.len() as u64)?;
    }
    if changes.set.keys().any(|k| changes.remove.contains(k)) {
        return invalid("a host state entry is both set and removed");
    }
    let mut set = BTreeMap::new();
    for (name, value) in &changes.set {
        set.insert(name.clone(), content.add(limits, value)?);
    }
    Ok(StateDelta { set, remove: changes.remove.clone() })
}

/// The host state `h` holds after `delta`.
pub(crate) fn state_after(h: &SessionHead, delta: &StateDelta) -> BTreeMap<String, ContentId> {
    let mut after = h.host_state.clone();
    for name in &delta.remove {
        after.remove(name);
    }
    after.extend(delta.set.iter().map(|(k, v)| (k.clone(), *v)));
    after
}

fn check_state_count(limits: &Limits, h: &SessionHead, delta: &StateDelta) -> Result<()> {
    if delta.is_empty() {
        return Ok(());
    }
    Ok(limits.check(Limit::HostStateEntries, state_after(h, delta).len() as u64)?)
}

fn set_metadata<S: Store + ?Sized>(store: &S, c: &SetMetadata, limits: &Limits) -> Result<Decision> {
    limits.check(Limit::MetadataBytes, c.metadata.len() as u64)?;
    let h = head(store, &c.session)?;
    // Metadata that is already the session's (an exact retry) answers as a retry
    // whatever the session's state (§6 retries).
    if h.metadata == c.metadata {
        return Ok(Decision::Noop(Outcome::Metadata { seq: None }));
    }
    live(&h, &c.session)?;
    expect(&h, &c.expected)?;
    let event = Event::MetadataSet(MetadataSet { metadata: c.metadata.clone() });
    Ok(Decision::Write { session: c.session, event, content: Vec::new() })
}

fn set_host_state<S: Store + ?Sized>(store: &S, c: &SetHostState, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    let mut content = ContentSet::new(now);
    let requested = state_delta(limits, &mut content, &c.state)?;
    let h = head(store, &c.session)?;
    // Only what changes is recorded; a request that changes nothing (an exact retry)
    // answers as a retry whatever the session's state (§6 retries).
    let set: BTreeMap<String, ContentId> =
        requested.set.into_iter().filter(|(k, v)| h.host_state.get(k) != Some(v)).collect();
    let remove: BTreeSet<String> = requested.remove.into_iter().filter(|k| h.host_state.contains_key(k)).collect();
    let delta = StateDelta { set, remove };
    if delta.is_empty() {
        return Ok(Decision::Noop(Outcome::HostState { seq: None }));
    }
    live(&h, &c.session)?;
    expect(&h, &c.expected)?;
    check_state_count(limits, &h, &delta)?;
    let content: Vec<(ContentId, Vec<u8>)> =
        content.into_vec().into_iter().filter(|(id, _)| delta.set.values().any(|v| v == id)).collect();
    let event = Event::HostStateChanged(HostStateChanged { state: delta });
    Ok(Decision::Write { session: c.session, event, content })
}

/// `Fenced` unless `fence.token` is the current lease token of `fence.session`.
pub fn check_fence<S: Store + ?Sized>(store: &S, fence: &Fence) -> Result<()> {
    let current = head(store, &fence.session)?.lease.map_or(0, |l| l.token);
    if fence.token != current {
        return reject(Rejection::Fenced { presented: fence.token, current });
    }
    Ok(())
}

/// Refuses a ttl outside `1..=LEASE_TTL_MS_MAX`; `what` names what it is the ttl of (a
/// lease, a claim).
fn check_ttl(what: &str, ttl_ms: u64) -> Result<()> {
    if ttl_ms == 0 || ttl_ms > LEASE_TTL_MS_MAX {
        return invalid(format!("{what} ttl {ttl_ms} ms is outside 1..={LEASE_TTL_MS_MAX}"));
    }
    Ok(())
}

fn acquire_lease<S: Store + ?Sized>(store: &S, c: &AcquireLease, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check_id("lease owner", &c.owner)?;
    check_ttl("lease", c.ttl_ms)?;
    let h = live_head(store, &c.session)?;
    let expires_at_ms = now.ms.saturating_add(c.ttl_ms);
    if let Some(lease) = &h.lease {
        let until = now.expiry(&c.session, lease);
        if lease.holds(until, now.ms) {
            if lease.owner != c.owner {
                return reject(Rejection::Busy { holder: lease.owner.clone(), expires_at_ms: until });
            }
            let renewed = Lease {
                session: c.session,
                owner: c.owner.clone(),
                token: lease.token,
                expires_at_ms: expires_at_ms.max(until),
            };
            return Ok(Decision::Renew(renewed));
        }
    }
    let token = h.lease.as_ref().map_or(0, |l| l.token) + 1;
    let event = Event::LeaseAcquired(LeaseAcquired { owner: c.owner.clone(), token, expires_at_ms });
    Ok(Decision::Write { session: c.session, event, content: Vec::new() })
}

fn renew_lease<S: Store + ?Sized>(store: &S, c: &RenewLease, now: &Now<'_>) -> Result<Decision> {
    check_ttl("lease", c.ttl_ms)?;
    let h = head(store, &c.session)?;
    match &h.lease {
        Some(lease) if lease.token == c.token && !lease.released => Ok(Decision::Renew(Lease {
            session: c.session,
            owner: lease.owner.clone(),
            token: lease.token,
            expires_at_ms: now.ms.saturating_add(c.ttl_ms).max(now.expiry(&c.session, lease)),
        })),
        lease => reject(Rejection::Fenced { presented: c.token, current: lease.as_ref().map_or(0, |l| l.token) }),
    }
}

fn release_lease<S: Store + ?Sized>(store: &S, session: &SessionId, token: u64) -> Result<Decision> {
    let h = head(store, session)?;
    match &h.lease {
        Some(lease) if lease.token == token && lease.released => {
            Ok(Decision::Noop(Outcome::LeaseReleased { seq: None }))
        }
        Some(lease) if lease.token == token => {
            let event = Event::LeaseReleased(LeaseReleased { token });
            Ok(Decision::Write { session: *session, event, content: Vec::new() })
        }
        lease => reject(Rejection::Fenced { presented: token, current: lease.as_ref().map_or(0, |l| l.token) }),
    }
}

fn append_draft<S: Store + ?Sized>(store: &S, c: &AppendDraft, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check_id("draft id", &c.draft_id)?;
    if c.segment.is_empty() {
        return invalid("a draft segment must not be empty");
    }
    live_head(store, &c.session)?;
    let (segments, bytes) = now.drafts.and_then(|d| d.draft(&c.session, &c.draft_id)).unwrap_or((0, 0));
    let n = c.segment.len() as u64;
    if segments == u32::MAX {
        return reject(Rejection::LimitExceeded { limit: Limit::DraftBytes, actual: u64::MAX, max: u32::MAX as u64 });
    }
    limits.check(Limit::DraftBytes, bytes + n)?;
    limits.check(Limit::SessionDraftBytes, now.drafts.map_or(0, |d| d.session_bytes(&c.session)) + n)?;
    limits.check(Limit::DraftBytesTotal, now.drafts.map_or(0, |d| d.total_bytes()) + n)?;
    let key = (c.session, c.draft_id.clone());
    let change = crate::draft::DraftChange::Append { key, index: segments, segment: c.segment.clone() };
    Ok(Decision::Draft { change, outcome: Outcome::DraftAppended { index: segments, draft_bytes: bytes + n } })
}

fn discard_draft<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    draft_id: &str,
    limits: &Limits,
    now: &Now<'_>,
) -> Result<Decision> {
    limits.check_id("draft id", draft_id)?;
    head(store, session)?;
    if now.drafts.and_then(|d| d.draft(session, draft_id)).is_none() {
        return Ok(Decision::Noop(Outcome::DraftDiscarded { existed: false }));
    }
    let change = crate::draft::DraftChange::Discard { key: (*session, draft_id.to_string()) };
    Ok(Decision::Draft { change, outcome: Outcome::DraftDiscarded { existed: true } })
}

fn inbox_tip<S: Store + ?Sized>(store: &S, session: &SessionId) -> Result<InboxTip> {
    Ok(store.row(Table::InboxTip, &keys::session(session))?.unwrap_or_default())
}

fn input_row<S: Store + ?Sized>(store: &S, session: &SessionId, id: &str) -> Result<Option<InputRow>> {
    store.row(Table::Inputs, &keys::session_str(session, id))
}

fn enqueue_input<S: Store + ?Sized>(store: &S, c: &EnqueueInput, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check_id("input id", &c.input_id)?;
    let mut content = ContentSet::new(now);
    let message = content.message(limits, &c.message)?;
    let h = head(store, &c.session)?;
    if let Some(row) = input_row(store, &c.session, &c.input_id)? {
        if row.message == message && row.kind == c.kind {
            return Ok(Decision::Noop(Outcome::Enqueued { seq: None }));
        }
        return reject(Rejection::InputConflict { input_id: c.input_id.clone() });
    }
    live(&h, &c.session)?;
    limits.check(Limit::InboxInputs, inbox_tip(store, &c.session)?.open.len() as u64 + 1)?;
    let event = Event::InputEnqueued(InputEnqueued { input_id: c.input_id.clone(), message, kind: c.kind });
    Ok(Decision::Write { session: c.session, event, content: content.into_vec() })
}

/// The commit hash and the receipt of turn `turn_id` of `session`, which the record at
/// `seq` committed (the turns projection says): taken from that record
/// ([`Store::record_at`]: within a batch, the writer's store answers for the batch's own
/// records first). A record that is not that turn's is a corrupt projection; a store
/// that cannot read the log cannot answer.
fn committed_turn<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    turn_id: &str,
    seq: u64,
) -> Result<(CommitHash, Receipt)> {
    let record = store
        .record_at(seq)?
        .ok_or_else(|| Error::storage(format!("the record of turn {turn_id} (seq {seq}) cannot be read here")))?;
    match &record.event {
        Event::TurnCommitted(e) if record.session == *session && e.turn_id == turn_id && record.seq == seq => {
            Ok((e.commit_hash, Receipt { seq, revision: e.revision_after, committed_at_ms: record.committed_at_ms }))
        }
        _ => Err(Error::corrupt(
            Location::Projection { table: Table::Turns.name(), key: hex(&keys::session_str(session, turn_id)) },
            format!("turn entry names seq {seq}, which is not that turn's record"),
        )),
    }
}

fn turn_committed<S: Store + ?Sized>(store: &S, session: &SessionId, turn_id: &str) -> Result<bool> {
    crate::buckets::TURNS.contains(store, &session.0, turn_id.as_bytes())
}

fn claim_inputs<S: Store + ?Sized>(store: &S, c: &ClaimInputs, limits: &Limits, now: &Now<'_>) -> Result<Decision> {
    limits.check_id("claim owner", &c.owner)?;
    check_ttl("claim", c.ttl_ms)?;
    if c.max == 0 {
        return invalid("a claim must take at least one input");
    }
    limits.check(Limit::ListItems, c.max)?;
    if let ClaimTarget::Turn(turn) = &c.target {
        limits.check_id("turn id", turn)?;
    }
    let h = live_head(store, &c.session)?;
    let current = h.lease.as_ref().map_or(0, |l| l.token);
    if c.token != current {
        return reject(Rejection::Fenced { presented: c.token, current });
    }
    let tip = inbox_tip(store, &c.session)?;
    let wanted = match &c.target {
        ClaimTarget::Turn(turn) => {
            if turn_committed(store, &c.session, turn)? {
                return reject(Rejection::TurnNotLive { turn_id: turn.clone() });
            }
            InputKind::ActiveTurn
        }
        ClaimTarget::NextTurn => {
            for claim in &tip.claims {
                let Some(row) = store.row::<ClaimRow>(Table::Claims, &keys::session_u64(&c.session, *claim))? else {
                    continue;
                };
                if let ClaimTarget::Turn(turn) = &row.target {
                    if row.expires_at_ms > now.ms && !turn_committed(store, &c.session, turn)? {
                        return reject(Rejection::NotIdle { turn_id: turn.clone() });
                    }
                }
            }
            InputKind::NextTurn
        }
    };
    let mut inputs = Vec::new();
    for id in &tip.open {
        if inputs.len() as u64 == c.max {
            break;
        }
        if let Some(row) = input_row(store, &c.session, id)? {
            if row.kind == wanted && row.state.claimable(now.ms) {
                inputs.push(id.clone());
            }
        }
    }
    if inputs.is_empty() {
        return Ok(Decision::Noop(Outcome::Claimed { seq: None, claim: None, inputs, expires_at_ms: 0 }));
    }
    let event = Event::InputsClaimed(InputsClaimed {
        owner: c.owner.clone(),
        token: c.token,
        target: c.target.clone(),
        inputs,
        expires_at_ms: now.ms.saturating_add(c.ttl_ms),
    });
    Ok(Decision::Write { session: c.session, event, content: Vec::new() })
}

fn abandon_claim<S: Store + ?Sized>(store: &S, session: &SessionId, claim: u64) -> Result<Decision> {
    let h = head(store, session)?;
    let Some(row) = store.row::<ClaimRow>(Table::Claims, &keys::session_u64(session, claim))? else {
        return reject(Rejection::UnknownClaim { claim });
    };
    if !row.open {
        return Ok(Decision::Noop(Outcome::ClaimAbandoned { seq: None }));
    }
    live(&h, session)?;
    Ok(Decision::Write {
        session: *session,
        event: Event::ClaimAbandoned(ClaimAbandoned { claim }),
        content: Vec::new(),
    })
}

fn cancel_input<S: Store + ?Sized>(
    store: &S,
    session: &SessionId,
    input_id: &str,
    limits: &Limits,
    now: &Now<'_>,
) -> Result<Decision> {
    limits.check_id("input id", input_id)?;
    let h = head(store, session)?;
    let Some(row) = input_row(store, session, input_id)? else {
        return reject(Rejection::UnknownInput { input_id: input_id.to_string() });
    };
    match row.state {
        InputState::Cancelled { .. } => return Ok(Decision::Noop(Outcome::InputCancelled { seq: None })),
        ref state if !state.claimable(now.ms) => {
            return reject(Rejection::InputState { input_id: input_id.to_string(), state: state.name() })
        }
        _ => {}
    }
    live(&h, session)?;
    let event = Event::InputCancelled(InputCancelled { input_id: input_id.to_string() });
    Ok(Decision::Write { session: *session, event, content: Vec::new() })
}

/// The outcome of a command whose event was committed as `record`.
pub fn outcome_of(record: &Record) -> Outcome {
    let receipt = |rev: RevisionId| Receipt { seq: record.seq, revision: rev, committed_at_ms: record.committed_at_ms };
    match &record.event {
        Event::SessionCreated(e) => Outcome::Created { session: record.session, receipt: receipt(e.revision_after) },
        Event::TurnCommitted(e) => Outcome::Committed(receipt(e.revision_after)),
        Event::TranscriptRewritten(e) => Outcome::Rewritten(receipt(e.revision_after)),
        Event::SessionArchived(_) => Outcome::Archived { seq: Some(record.seq) },
        Event::SessionRevived(_) => Outcome::Revived { seq: record.seq },
        Event::ContextAppended(_) => Outcome::Staged { seq: record.seq },
        Event::ToolCallRecorded(_) | Event::ToolResultRecorded(_) => {
            Outcome::Tool { created: true, seq: Some(record.seq) }
        }
        Event::LabelsChanged(_) => Outcome::Labels { seq: Some(record.seq) },
        Event::MetadataSet(_) => Outcome::Metadata { seq: Some(record.seq) },
        Event::HostStateChanged(_) => Outcome::HostState { seq: Some(record.seq) },
        Event::LeaseAcquired(e) => Outcome::Lease {
            lease: Lease {
                session: record.session,
                owner: e.owner.clone(),
                token: e.token,
                expires_at_ms: e.expires_at_ms,
            },
            seq: Some(record.seq),
        },
        Event::LeaseReleased(_) => Outcome::LeaseReleased { seq: Some(record.seq) },
        Event::InputEnqueued(_) => Outcome::Enqueued { seq: Some(record.seq) },
        Event::InputsClaimed(e) => {
            let (seq, claim) = (Some(record.seq), Some(record.stream_seq));
            Outcome::Claimed { seq, claim, inputs: e.inputs.clone(), expires_at_ms: e.expires_at_ms }
        }
        Event::ClaimAbandoned(_) => Outcome::ClaimAbandoned { seq: Some(record.seq) },
        Event::InputCancelled(_) => Outcome::InputCancelled { seq: Some(record.seq) },
        Event::SessionPurged(_) | Event::Erased(_) => Outcome::Purged { seq: record.seq },
    }
}
