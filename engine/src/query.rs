//! Read-side queries over a redb read transaction. Reads never block writes or each
//! other (MVCC) and see one consistent snapshot.

use crate::decide::materialize;
use crate::delta::View;
use crate::error::{Error, Limit, Location, Rejection, Result};
use crate::limits::Limits;
use crate::projection::*;
use crate::store::{decode_row, keys, Store, StoreExt, Table};
use crate::tables;
use annal_codec::*;

/// Which slice of a list to return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    /// Items to skip (clamped to the list's length).
    pub offset: u64,
    /// Items to return at most (at most `page_items_max`).
    pub limit: u64,
    /// Bytes of message bodies a transcript page returns at most (at most
    /// `page_bytes_max`, which `None` stands for). Other lists ignore it.
    pub max_bytes: Option<u64>,
}

impl PageRequest {
    /// `limit` items from `offset`.
    pub fn new(offset: u64, limit: u64) -> PageRequest {
        PageRequest { offset, limit, max_bytes: None }
    }

    /// The first `limit` items.
    pub fn first(limit: u64) -> PageRequest {
        PageRequest { offset: 0, limit, max_bytes: None }
    }

    /// The same request with a transcript byte budget of its own, below the configured
    /// `page_bytes_max`: a page stops before the message that would take it over, and a
    /// first message larger than it is [`Error::OversizedMessage`].
    pub fn with_max_bytes(self, max_bytes: u64) -> PageRequest {
        PageRequest { max_bytes: Some(max_bytes), ..self }
    }

    /// The byte budget of a transcript page: the request's, which may not exceed the
    /// configured one.
    fn byte_budget(&self, limits: &Limits) -> Result<u64> {
        match self.max_bytes {
            None => Ok(limits.page_bytes_max),
            Some(n) => {
                limits.check(Limit::PageBytes, n)?;
                Ok(n)
            }
        }
    }
}

/// A page of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// The offset used (clamped).
    pub offset: u64,
    /// The limit asked for (echoed).
    pub limit: u64,
    /// Whether more items follow.
    pub has_more: bool,
}

/// Filter and page for listing sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Every label must match exactly (AND).
    pub labels: Vec<(String, String)>,
    /// Include archived sessions.
    pub include_archived: bool,
    /// Matches to skip.
    pub offset: u64,
    /// Matches to return at most; 0 means `page_items_max`.
    pub limit: u64,
    /// The order of the list.
    pub order: ListOrder,
}

/// The order sessions are listed in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ListOrder {
    /// Oldest first, by the creating event.
    #[default]
    Created,
    /// Most recently updated first, by the session's last event (for resume pickers).
    RecentlyUpdated,
}

impl ListQuery {
    /// Lists most recently updated first.
    pub fn recently_updated(mut self) -> ListQuery {
        self.order = ListOrder::RecentlyUpdated;
        self
    }

    /// Every live session, first page of 100.
    pub fn new() -> ListQuery {
        ListQuery { limit: 100, ..ListQuery::default() }
    }

    /// Adds a label filter.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> ListQuery {
        self.labels.push((key.into(), value.into()));
        self
    }

    /// Includes archived sessions.
    pub fn include_archived(mut self) -> ListQuery {
        self.include_archived = true;
        self
    }

    /// Sets offset and limit.
    pub fn page(mut self, offset: u64, limit: u64) -> ListQuery {
        self.offset = offset;
        self.limit = limit;
        self
    }
}

/// A message read back from a transcript.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    /// Position in the transcript, from 0.
    pub position: u64,
    /// Content id of the message object.
    pub content_id: ContentId,
    /// Chain value through this message.
    pub chain: RevisionId,
    /// The decoded message.
    pub message: MessageObject,
}

/// A page of a transcript.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranscriptPage {
    /// The session.
    pub session: SessionId,
    /// The revision read.
    pub revision: RevisionId,
    /// Messages in that revision.
    pub total: u64,
    /// Offset used (clamped to `total`).
    pub offset: u64,
    /// Limit asked for (echoed).
    pub limit: u64,
    /// The messages.
    pub messages: Vec<StoredMessage>,
    /// Whether messages follow this page.
    pub has_more: bool,
}

/// A page of a session's revisions, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionPage {
    /// The current head (always reported).
    pub head: RevisionId,
    /// Distinct revisions the session has held.
    pub total: u64,
    /// The nodes.
    pub page: Page<RevisionNode>,
}

/// A session's whole revision graph, with forks in and out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionGraph {
    /// The session.
    pub session: SessionId,
    /// Current head.
    pub head: RevisionId,
    /// Nodes, oldest first.
    pub nodes: Vec<RevisionNode>,
    /// Head transitions, in commit order.
    pub edges: Vec<RevisionEdge>,
    /// Sessions forked from this one.
    pub forks: Vec<ForkEdge>,
    /// Where this session was forked from.
    pub forked_from: Option<ForkOrigin>,
}

/// A log record as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    /// The record.
    pub record: Record,
    /// Encoded size in bytes.
    pub size: u64,
    /// Schema version found on disk.
    pub schema_version: u16,
    /// `h(seq)`.
    pub chain_hash: ChainHash,
}

/// Which events to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventQuery {
    /// First global seq (1-based).
    pub from_seq: u64,
    /// Events at most.
    pub max_events: u64,
    /// Bytes at most. A single record over it is `OversizedRecord`.
    pub max_bytes: u64,
}

/// A page of events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventPage {
    /// The events, in seq order.
    pub events: Vec<StoredEvent>,
    /// Where the next page starts.
    pub next_seq: u64,
    /// Whether events follow.
    pub has_more: bool,
}

fn check_page(limits: &Limits, limit: u64) -> Result<()> {
    Ok(limits.check(Limit::PageItems, limit)?)
}

fn head_of(store: &View, session: &SessionId) -> Result<SessionHead> {
    match store.row(Table::Heads, &keys::session(session))? {
        Some(head) => Ok(head),
        None => Err(Error::Rejected(crate::decide::absent(store, session)?)),
    }
}

/// The head of `session`, if it exists. A purged session is
/// [`Rejection::Purged`]`{ session, seq }`.
pub fn head(view: &View, session: &SessionId) -> Result<Option<SessionHead>> {
    match view.row(Table::Heads, &keys::session(session))? {
        Some(head) => Ok(Some(head)),
        None => purged_check(view, session).map(|()| None),
    }
}

/// `Err(Purged { session, seq })` when `session` was purged.
pub fn purged_check(view: &View, session: &SessionId) -> Result<()> {
    match crate::decide::absent(view, session)? {
        rejection @ Rejection::Purged { .. } => Err(Error::Rejected(rejection)),
        _ => Ok(()),
    }
}

/// The value of host state entry `name` of `session` at its head, or as of stream seq
/// `at`: what the session's events up to and including `at` left it (`None` if it was
/// not set then, or had been removed). A stream seq past the head reads the head.
pub fn host_state(
    view: &View,
    limits: &Limits,
    session: &SessionId,
    name: &str,
    at: Option<u64>,
) -> Result<Option<Vec<u8>>> {
    let head = head_of(view, session)?;
    let id = match at {
        Some(at) if at < head.stream_seq => {
            let mut found: Option<ContentId> = None;
            let prefix = keys::host_state_name(session, name);
            view.scan_from(Table::HostStateLog, &prefix, &keys::host_state_log(session, name, at), |k, v| {
                found = decode_row::<Option<ContentId>>(Table::HostStateLog, k, v)?;
                Ok(false)
            })?;
            found
        }
        _ => head.host_state.get(name).copied(),
    };
    match id {
        None => Ok(None),
        Some(id) => Ok(Some(
            content(view, limits, &id)?
                .ok_or_else(|| Error::corrupt(Location::Content { id: id.to_hex() }, "missing host state value"))?,
        )),
    }
}

/// Sessions holding label `key = value`, from its count row.
fn label_count(store: &View, key: &str, value: &str) -> Result<u64> {
    Ok(store.row::<u64>(Table::LabelCounts, &keys::label_prefix(key, value))?.unwrap_or(0))
}

/// Calls `f` for every session holding label `key = value`, in creation order.
fn scan_label(store: &View, key: &str, value: &str, f: &mut dyn FnMut(SessionId) -> Result<bool>) -> Result<()> {
    let prefix = keys::label_prefix(key, value);
    store.scan(Table::LabelIndex, &prefix, |k, _| {
        let tail = &k[prefix.len()..];
        if tail.len() != 24 {
            return Err(Error::corrupt(
                Location::Projection { table: Table::LabelIndex.name(), key: crate::store::hex(k) },
                "bad index key",
            ));
        }
        let mut s = [0u8; 16];
        s.copy_from_slice(&tail[8..]);
        f(SessionId(s))
    })
}

/// The session of a recency index key (`!last_seq ‖ session`).
fn recency_session(key: &[u8]) -> Result<SessionId> {
    match <[u8; 16]>::try_from(key.get(8..).unwrap_or_default()) {
        Ok(s) if key.len() == 24 => Ok(SessionId(s)),
        _ => Err(Error::corrupt(
            Location::Projection { table: Table::RecencyOrder.name(), key: crate::store::hex(key) },
            "bad index key",
        )),
    }
}

/// Lists sessions, in creation order or most recently updated first.
pub fn list_sessions(view: &View, limits: &Limits, q: &ListQuery) -> Result<Page<SessionHead>> {
    let limit = if q.limit == 0 { limits.page_items_max } else { q.limit };
    check_page(limits, limit)?;
    let store = view;
    let mut items = Vec::new();
    let mut skipped = 0u64;
    let mut has_more = false;
    let mut consider = |session: SessionId| -> Result<bool> {
        let head = head_of(store, &session)?;
        if head.archived && !q.include_archived {
            return Ok(true);
        }
        if !q.labels.iter().all(|(k, v)| head.labels.get(k) == Some(v)) {
            return Ok(true);
        }
        if skipped < q.offset {
            skipped += 1;
            return Ok(true);
        }
        if items.len() as u64 == limit {
            has_more = true;
            return Ok(false);
        }
        items.push(head);
        Ok(true)
    };
    // The most selective label filter drives (its index holds the fewest sessions); the
    // others are checked on each candidate's head.
    let mut driver: Option<(&(String, String), u64)> = None;
    for label in &q.labels {
        let count = label_count(store, &label.0, &label.1)?;
        if driver.is_none_or(|(_, best)| count < best) {
            driver = Some((label, count));
        }
    }
    match (q.order, driver) {
        (_, Some((_, 0))) => {}
        (ListOrder::Created, None) => {
            store.scan(Table::CreationOrder, &[], |k, v| {
                let session: SessionId = decode_row(Table::CreationOrder, k, v)?;
                consider(session)
            })?;
        }
        (ListOrder::RecentlyUpdated, None) => {
            store.scan(Table::RecencyOrder, &[], |k, _| consider(recency_session(k)?))?;
        }
        (ListOrder::Created, Some(((k, v), _))) => {
            scan_label(store, k, v, &mut |s| consider(s))?;
        }
        (ListOrder::RecentlyUpdated, Some(((k, v), _))) => {
            // The label's index is in creation order: gather its sessions, newest update
            // first, then page. O(sessions with the most selective label).
            let mut found = Vec::new();
            scan_label(store, k, v, &mut |s| {
                found.push(s);
                Ok(true)
            })?;
            let mut heads = Vec::with_capacity(found.len());
            for s in found {
                heads.push(head_of(store, &s)?);
            }
            heads.sort_by_key(|h| std::cmp::Reverse(h.last_seq));
            for h in heads {
                if !consider(h.session)? {
                    break;
                }
            }
        }
    }
    Ok(Page { items, offset: q.offset, limit, has_more })
}

fn load_message(view: &View, limits: &Limits, id: &ContentId) -> Result<MessageObject> {
    let max = limits.message_object_bytes_max();
    let decoded = view.with_content(id, max, |bytes| {
        decode_message(bytes, max)
            .map_err(|e| Error::corrupt(Location::Content { id: id.to_hex() }, format!("not a message: {e}")))
    })?;
    decoded.ok_or_else(|| Error::corrupt(Location::Content { id: id.to_hex() }, "missing content object"))
}

/// Loads the messages of `rows` (position, content id, chain) into `page`, stopping
/// before the message whose body would take the page over `max_bytes`; a first message
/// over it by itself is `OversizedMessage`.
fn fill_page(
    view: &View,
    limits: &Limits,
    max_bytes: u64,
    mut page: TranscriptPage,
    rows: Vec<(u64, ContentId, RevisionId)>,
) -> Result<TranscriptPage> {
    let mut bytes = 0u64;
    for (position, content_id, chain) in rows {
        let message = load_message(view, limits, &content_id)?;
        let size = message.body.len() as u64;
        if bytes + size > max_bytes {
            if page.messages.is_empty() {
                return Err(Error::OversizedMessage { position, size, max_bytes });
            }
            break;
        }
        bytes += size;
        page.messages.push(StoredMessage { position, content_id, chain, message });
    }
    page.has_more = page.offset + (page.messages.len() as u64) < page.total;
    Ok(page)
}

fn empty_page(session: SessionId, revision: RevisionId, total: u64, offset: u64, limit: u64) -> TranscriptPage {
    TranscriptPage { session, revision, total, offset, limit, messages: Vec::new(), has_more: false }
}

/// A page of the current transcript of `session`.
pub fn transcript(view: &View, limits: &Limits, session: &SessionId, page: PageRequest) -> Result<TranscriptPage> {
    check_page(limits, page.limit)?;
    let store = view;
    let head = head_of(store, session)?;
    let total = head.message_count;
    let from = page.offset.min(total);
    let to = from.saturating_add(page.limit).min(total);
    let rows = crate::transcript::rows(store, session, from, to)?
        .into_iter()
        .zip(from..)
        .map(|(row, position)| (position, row.content, row.chain))
        .collect();
    fill_page(
        view,
        limits,
        page.byte_budget(limits)?,
        empty_page(*session, head.revision, total, from, page.limit),
        rows,
    )
}

/// A page of any revision `session` has held.
pub fn transcript_at(
    view: &View,
    limits: &Limits,
    session: &SessionId,
    revision: &RevisionId,
    page: PageRequest,
) -> Result<TranscriptPage> {
    check_page(limits, page.limit)?;
    let store = view;
    let head = head_of(store, session)?;
    if head.revision == *revision {
        return transcript(view, limits, session, page);
    }
    let ids = materialize(store, session, revision)?
        .ok_or(Error::Rejected(Rejection::UnknownRevision { revision: *revision }))?;
    let total = ids.len() as u64;
    let from = page.offset.min(total);
    let to = from.saturating_add(page.limit).min(total);
    let mut chain = RevisionId::empty().extend_all(&ids[..from as usize]);
    let rows = (from..to)
        .map(|p| {
            let id = ids[p as usize];
            chain = chain.extend(&id);
            (p, id, chain)
        })
        .collect();
    fill_page(view, limits, page.byte_budget(limits)?, empty_page(*session, *revision, total, from, page.limit), rows)
}

/// The revisions of `session`, oldest first.
pub fn revisions(view: &View, limits: &Limits, session: &SessionId, page: PageRequest) -> Result<RevisionPage> {
    check_page(limits, page.limit)?;
    let store = view;
    head_of(store, session)?;
    let tip: GraphTip = store.row(Table::GraphTip, &keys::session(session))?.ok_or_else(|| {
        Error::corrupt(
            Location::Projection { table: Table::GraphTip.name(), key: session.to_string() },
            "missing graph",
        )
    })?;
    let offset = page.offset.min(tip.nodes);
    let end = tip.nodes.min(offset.saturating_add(page.limit));
    let order = crate::evolve::REVISION_ORDER;
    // The seqs of nodes `offset..end`, one revision order row at a time.
    let mut seqs = Vec::new();
    let mut ordinal = offset;
    while ordinal < end {
        let (key, slot) = order.slot(session, ordinal);
        let want = (order.per_row - slot).min(end - ordinal);
        let row = store.get(order.table, &key)?.unwrap_or_default();
        let entries = order.entries(&row).ok_or_else(|| bad_order_row(&key))?;
        let before = seqs.len();
        seqs.extend(entries.skip(slot as usize).take(want as usize).map(order_seq));
        if (seqs.len() - before) as u64 != want {
            return Err(bad_order_row(&key));
        }
        ordinal += want;
    }
    let items = nodes_at(store, session, seqs)?;
    let has_more = offset + (items.len() as u64) < tip.nodes;
    Ok(RevisionPage { head: tip.head, total: tip.nodes, page: Page { items, offset, limit: page.limit, has_more } })
}

fn bad_order_row(key: &[u8]) -> Error {
    Error::corrupt(
        Location::Projection { table: crate::evolve::REVISION_ORDER.table.name(), key: crate::store::hex(key) },
        "bad or missing revision order row",
    )
}

/// The nodes of `session` whose records are at `seqs` (entries of its revision order):
/// each record read once, and each parent's id taken from these nodes where it is one.
fn nodes_at(store: &View, session: &SessionId, seqs: Vec<u64>) -> Result<Vec<RevisionNode>> {
    let size = crate::buckets::REVISIONS.size(store, &session.0)?;
    let mut read = Vec::with_capacity(seqs.len());
    for seq in seqs {
        let (rev, record) = crate::projection::node_record(store, session, None, seq)?;
        let node = crate::projection::stored_node(store, session, size, &rev)?.filter(|n| n.seq == seq);
        let node =
            node.ok_or_else(|| Error::corrupt(crate::projection::node_location(session, &rev), "missing node"))?;
        read.push((rev, node, record));
    }
    let known: std::collections::HashMap<u64, RevisionId> = read.iter().map(|(r, n, _)| (n.seq, *r)).collect();
    read.into_iter()
        .map(|(rev, node, record)| crate::projection::full_node(store, session, &rev, node, record, &known))
        .collect()
}

/// The whole revision graph of `session`.
pub fn graph(view: &View, session: &SessionId) -> Result<RevisionGraph> {
    let store = view;
    let head = head_of(store, session)?;
    let prefix = keys::session(session);
    let order = crate::evolve::REVISION_ORDER;
    let mut seqs = Vec::new();
    store.scan(order.table, &prefix, |k, v| {
        seqs.extend(order.entries(v).ok_or_else(|| bad_order_row(k))?.map(order_seq));
        Ok(true)
    })?;
    let nodes = nodes_at(store, session, seqs)?;
    // Every node's creation is a transition; the other transitions are stored edges.
    let mut edges: Vec<RevisionEdge> = nodes.iter().map(RevisionNode::creation_edge).collect();
    store.scan(Table::RevisionEdges, &prefix, |k, v| {
        edges.push(decode_row(Table::RevisionEdges, k, v)?);
        Ok(true)
    })?;
    edges.sort_by_key(|e| e.seq);
    let mut forks = Vec::new();
    store.scan(Table::Forks, &prefix, |k, v| {
        forks.push(decode_row(Table::Forks, k, v)?);
        Ok(true)
    })?;
    Ok(RevisionGraph { session: *session, head: head.revision, nodes, edges, forks, forked_from: head.forked_from })
}

/// Every context entry of `session`, pending and applied, in key order.
pub fn context(view: &View, session: &SessionId) -> Result<Vec<ContextEntry>> {
    let store = view;
    head_of(store, session)?;
    let mut out = Vec::new();
    store.scan(Table::Context, &keys::session(session), |k, v| {
        out.push(decode_row(Table::Context, k, v)?);
        Ok(true)
    })?;
    Ok(out)
}

/// Usage totals of `session` per (provider, model).
pub fn usage(view: &View, session: &SessionId) -> Result<Vec<UsageTotals>> {
    let store = view;
    head_of(store, session)?;
    let mut out: Vec<UsageTotals> = Vec::new();
    store.scan(Table::Usage, &keys::session(session), |k, v| {
        out.push(decode_row(Table::Usage, k, v)?);
        Ok(true)
    })?;
    out.sort_by(|a, b| (&a.provider, &a.model).cmp(&(&b.provider, &b.model)));
    Ok(out)
}

/// One tool operation.
pub fn tool_op(view: &View, session: &SessionId, op_id: &str) -> Result<Option<ToolOp>> {
    let store = view;
    head_of(store, session)?;
    store.row(Table::ToolOps, &keys::session_str(session, op_id))
}

fn op_by_id(store: &View, session: &SessionId, op_id: &str) -> Result<ToolOp> {
    store.row(Table::ToolOps, &keys::session_str(session, op_id))?.ok_or_else(|| {
        Error::corrupt(
            Location::Projection { table: Table::ToolOps.name(), key: op_id.to_string() },
            "index refers to a missing op",
        )
    })
}

/// Unsettled operations of `session`, in call order.
pub fn unsettled(view: &View, session: &SessionId) -> Result<Vec<ToolOp>> {
    let store = view;
    head_of(store, session)?;
    let mut ids = Vec::new();
    store.scan(Table::Unsettled, &keys::session(session), |k, v| {
        ids.push(decode_row::<String>(Table::Unsettled, k, v)?);
        Ok(true)
    })?;
    ids.iter().map(|id| op_by_id(store, session, id)).collect()
}

/// A page of `session`'s unsettled operations, in call order: only the page's
/// operations are read.
pub fn unsettled_page(view: &View, limits: &Limits, session: &SessionId, page: PageRequest) -> Result<Page<ToolOp>> {
    check_page(limits, page.limit)?;
    head_of(view, session)?;
    scan_page(view, Table::Unsettled, &keys::session(session), page, |k, v| {
        op_by_id(view, session, &decode_row::<String>(Table::Unsettled, k, v)?)
    })
}

/// Unsettled operations across all sessions, in call order.
pub fn unsettled_all(view: &View, limits: &Limits, page: PageRequest) -> Result<Page<ToolOp>> {
    check_page(limits, page.limit)?;
    scan_page(view, Table::UnsettledAll, &[], page, |k, v| {
        let (session, op_id): (SessionId, String) = decode_row(Table::UnsettledAll, k, v)?;
        op_by_id(view, &session, &op_id)
    })
}

/// The `page` of the rows of `table` under `prefix`, in key order, each made an item by
/// `item`: the rows before the page are skipped unread, and one past it tells
/// `has_more`.
fn scan_page<T>(
    view: &View,
    table: Table,
    prefix: &[u8],
    page: PageRequest,
    mut item: impl FnMut(&[u8], &[u8]) -> Result<T>,
) -> Result<Page<T>> {
    let mut items = Vec::new();
    let mut has_more = false;
    let mut skipped = 0u64;
    view.scan(table, prefix, |k, v| {
        if skipped < page.offset {
            skipped += 1;
            return Ok(true);
        }
        if items.len() as u64 == page.limit {
            has_more = true;
            return Ok(false);
        }
        items.push(item(k, v)?);
        Ok(true)
    })?;
    Ok(Page { items, offset: page.offset, limit: page.limit, has_more })
}

/// Tool operations of `session` in the order recorded, nested ones included.
pub fn tool_ops(view: &View, limits: &Limits, session: &SessionId, page: PageRequest) -> Result<Page<ToolOp>> {
    check_page(limits, page.limit)?;
    let store = view;
    head_of(store, session)?;
    let count = store.row::<ToolTip>(Table::ToolTip, &keys::session(session))?.unwrap_or_default().count;
    let offset = page.offset.min(count);
    let mut items = Vec::new();
    for ordinal in offset..count.min(offset.saturating_add(page.limit)) {
        let key = keys::session_u64(session, ordinal);
        let op_id: String = store.row(Table::ToolOrder, &key)?.ok_or_else(|| {
            Error::corrupt(
                Location::Projection { table: Table::ToolOrder.name(), key: crate::store::hex(&key) },
                "missing op",
            )
        })?;
        items.push(op_by_id(store, session, &op_id)?);
    }
    let has_more = offset + (items.len() as u64) < count;
    Ok(Page { items, offset, limit: page.limit, has_more })
}

/// Reads one record and verifies its chain link from `prev`.
fn read_event(
    view: &View,
    chain: &LogChain,
    limits: &Limits,
    seq: u64,
    prev: &ChainHash,
) -> Result<Option<StoredEvent>> {
    let Some(bytes) = view.raw_record(seq)? else {
        return Ok(None);
    };
    let bytes = bytes.as_slice();
    let chain_hash = verify_chain(bytes, prev, chain, seq).map_err(|source| Error::Decode { seq, source })?;
    let decoded = decode_record(bytes, limits.record_bytes_max).map_err(|source| Error::Decode { seq, source })?;
    if decoded.record.seq != seq {
        return Err(Error::corrupt(Location::Log { seq }, "record seq differs from its key"));
    }
    Ok(Some(StoredEvent {
        record: decoded.record,
        size: bytes.len() as u64,
        schema_version: decoded.schema_version,
        chain_hash,
    }))
}

fn prev_hash(view: &View, chain: &LogChain, seq: u64) -> Result<ChainHash> {
    if seq <= 1 {
        return Ok(chain.genesis());
    }
    let prev = seq - 1;
    match view.raw_record(prev)? {
        Some(bytes) => {
            stored_chain_hash(&bytes).ok_or_else(|| Error::corrupt(Location::Log { seq: prev }, "record too short"))
        }
        None => Err(Error::corrupt(Location::Log { seq: prev }, "missing record")),
    }
}

fn check_event_query(limits: &Limits, q: &EventQuery) -> Result<()> {
    check_page(limits, q.max_events)?;
    Ok(limits.check(Limit::PageBytes, q.max_bytes)?)
}

fn push_event(out: &mut EventPage, bytes: &mut u64, event: StoredEvent, q: &EventQuery) -> Result<bool> {
    if *bytes + event.size > q.max_bytes {
        if out.events.is_empty() {
            return Err(Error::OversizedRecord { seq: event.record.seq, size: event.size, max_bytes: q.max_bytes });
        }
        out.has_more = true;
        return Ok(false);
    }
    *bytes += event.size;
    out.events.push(event);
    Ok(true)
}

/// A page of the global log; every record's chain link is verified.
pub fn events(view: &View, chain: &LogChain, limits: &Limits, q: &EventQuery) -> Result<EventPage> {
    check_event_query(limits, q)?;
    let log = view;
    let from = q.from_seq.max(1);
    let last = view.seq();
    if from > last {
        // Past the tip: nothing to read yet, and no chain link to check.
        return Ok(EventPage { events: Vec::new(), next_seq: from, has_more: false });
    }
    let mut prev = prev_hash(log, chain, from)?;
    let mut out = EventPage { events: Vec::new(), next_seq: from, has_more: false };
    let mut bytes = 0;
    let mut seq = from;
    while seq <= last && (out.events.len() as u64) < q.max_events {
        let event = read_event(log, chain, limits, seq, &prev)?
            .ok_or_else(|| Error::corrupt(Location::Log { seq }, "missing record"))?;
        let hash = event.chain_hash;
        if !push_event(&mut out, &mut bytes, event, q)? {
            break;
        }
        prev = hash;
        seq += 1;
    }
    out.next_seq = seq;
    out.has_more = out.has_more || seq <= last;
    Ok(out)
}

/// A page of one session's events, by stream seq (1-based `from`).
pub fn session_events(
    view: &View,
    chain: &LogChain,
    limits: &Limits,
    session: &SessionId,
    q: &EventQuery,
) -> Result<EventPage> {
    check_event_query(limits, q)?;
    let log = view;
    let from = q.from_seq.max(1);
    let mut out = EventPage { events: Vec::new(), next_seq: from, has_more: false };
    let mut bytes = 0;
    let mut next = from;
    let mut failure = None;
    let index = crate::evolve::STREAM_INDEX;
    let (first, _) = index.slot(session, from - 1);
    view.scan_from(index.table, &keys::session(session), &first, |k, v| {
        // A damaged key could name a row past any stream: its seqs must not overflow.
        let row = <[u8; 8]>::try_from(&k[16..]).ok().map(u64::from_be_bytes);
        let (Some(base), Some(seqs)) = (row.and_then(|r| index.first_index(r)), index.entries(v)) else {
            return Err(bad_stream_row(session, k));
        };
        for (i, b) in seqs.enumerate() {
            let stream_seq = base.checked_add(i as u64 + 1).ok_or_else(|| bad_stream_row(session, k))?;
            if stream_seq < from {
                continue;
            }
            let seq = u64::from_be_bytes(b.try_into().map_err(|_| bad_stream_row(session, k))?);
            if (out.events.len() as u64) == q.max_events {
                out.has_more = true;
                return Ok(false);
            }
            let prev = prev_hash(log, chain, seq)?;
            let event = read_event(log, chain, limits, seq, &prev)?
                .ok_or_else(|| Error::corrupt(Location::Log { seq }, "missing record"))?;
            if event.record.session != *session || event.record.stream_seq != stream_seq {
                failure = Some(Error::corrupt(
                    Location::SessionLog { session: *session, stream_seq },
                    "index and record disagree",
                ));
                return Ok(false);
            }
            if !push_event(&mut out, &mut bytes, event, q)? {
                return Ok(false);
            }
            next = stream_seq + 1;
        }
        Ok(true)
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    out.next_seq = next;
    Ok(out)
}

/// A seq from an entry of the revision order (8 bytes by construction).
fn order_seq(entry: &[u8]) -> u64 {
    let mut seq = [0; 8];
    seq.copy_from_slice(entry);
    u64::from_be_bytes(seq)
}

fn bad_stream_row(session: &SessionId, key: &[u8]) -> Error {
    Error::corrupt(
        Location::Projection { table: Table::StreamIndex.name(), key: format!("{session}/{}", crate::store::hex(key)) },
        "bad stream index row",
    )
}

/// A verified content object.
pub fn content(view: &View, limits: &Limits, id: &ContentId) -> Result<Option<Vec<u8>>> {
    view.content(id, limits.message_object_bytes_max())
}

/// Digest of one projection table: row count and blake3 over every key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableDigest {
    /// Table name.
    pub table: &'static str,
    /// Rows.
    pub rows: u64,
    /// blake3 over `len(k) ‖ k ‖ len(v) ‖ v` for every row in key order.
    pub digest: [u8; 32],
}

/// Digests of every projection table, for byte-level comparison of two states.
pub fn projection_digests(view: &View) -> Result<Vec<TableDigest>> {
    // One pass: each logical table's rows come in its own key order (see tables.rs).
    let mut hashers: Vec<(RowHasher, u64)> = Table::ALL.iter().map(|_| (RowHasher::default(), 0)).collect();
    view.scan_physical(&[], &mut |k, v| {
        let (t, logical) = tables::logical_key(k).ok_or_else(|| tables::bad_physical(k))?;
        let (h, rows) = &mut hashers[t.index()];
        h.row(&logical, v);
        *rows += 1;
        Ok(true)
    })?;
    Ok(Table::ALL
        .iter()
        .zip(hashers)
        .map(|(t, (h, rows))| TableDigest { table: t.name(), rows, digest: h.finish() })
        .collect())
}

/// Digests of the projections held in a [`crate::MemStore`], comparable with
/// [`projection_digests`].
pub fn mem_digests(store: &crate::MemStore) -> Vec<TableDigest> {
    Table::ALL
        .iter()
        .map(|t| {
            let mut h = RowHasher::default();
            let mut rows = 0;
            if let Some(rows_map) = store.tables.get(t) {
                for (k, v) in rows_map {
                    h.row(k, v);
                    rows += 1;
                }
            }
            TableDigest { table: t.name(), rows, digest: h.finish() }
        })
        .collect()
}

/// Length-prefixed row hashing, so row boundaries are unambiguous.
#[derive(Default)]
struct RowHasher(blake3::Hasher);

impl RowHasher {
    fn row(&mut self, k: &[u8], v: &[u8]) {
        self.0.update(&(k.len() as u64).to_le_bytes());
        self.0.update(k);
        self.0.update(&(v.len() as u64).to_le_bytes());
        self.0.update(v);
    }

    fn finish(self) -> [u8; 32] {
        *self.0.finalize().as_bytes()
    }
}

/// An input of a session's inbox, with its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedInput {
    /// The host's input id.
    pub input_id: String,
    /// The event that queued it.
    pub seq: u64,
    /// Which turn it is for.
    pub kind: InputKind,
    /// Where it stands (pending, or held by a claim, which may have expired).
    pub state: InputState,
    /// The message.
    pub message: MessageObject,
}

/// The open inputs of `session` (queued, neither consumed nor cancelled) whose state
/// `keep` accepts, in queue order; only those have their message read.
pub fn inbox(
    view: &View,
    limits: &Limits,
    session: &SessionId,
    keep: impl Fn(&InputState) -> bool,
) -> Result<Vec<QueuedInput>> {
    let Some(tip) = view.row::<InboxTip>(Table::InboxTip, &keys::session(session))? else {
        purged_check(view, session)?;
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(tip.open.len());
    for id in &tip.open {
        let key = keys::session_str(session, id);
        let row: InputRow = view.row(Table::Inputs, &key)?.ok_or_else(|| {
            Error::corrupt(
                Location::Projection { table: Table::Inputs.name(), key: crate::store::hex(&key) },
                "missing row",
            )
        })?;
        if !keep(&row.state) {
            continue;
        }
        let message = load_message(view, limits, &row.message)?;
        out.push(QueuedInput { input_id: row.input_id, seq: row.seq, kind: row.kind, state: row.state, message });
    }
    Ok(out)
}

/// What a claim took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The claim (the session's stream seq of its `InputsClaimed`), or `None` when
    /// nothing was claimable.
    pub claim: Option<u64>,
    /// The inputs it holds, in queue order.
    pub inputs: Vec<String>,
    /// When it expires (writer clock, unix ms).
    pub expires_at_ms: u64,
}
