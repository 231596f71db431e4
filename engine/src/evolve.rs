//! `evolve`: the one fold from events to projections, shared by the live writer and
//! replay. Each projection's fold reads and writes only its own tables (the transcript's
//! also reads the log's records, which no rebuild changes), so any subset of projections
//! can be rebuilt alone. The fold recomputes every `revision_after` and
//! checks the stream density; a mismatch is [`crate::Error::Corrupt`] at that seq.

use crate::buckets::REVISIONS;
use crate::error::{Error, Location, Result};
use crate::packed::{Misplaced, Packed};
use crate::projection::*;
use crate::store::{decode_row, keys, Store, StoreExt, Table};
use crate::transcript;
use annal_codec::{ContentId, Event, Record, RevisionId, StateDelta};

/// Folds one record into the projections in `set`. `introduced` lists the content
/// objects stored with the record (its content row, in order): the content-id index
/// points them at `record.seq`.
///
/// The transcript names its messages by the records whose message lists hold their ids
/// ([`crate::transcript`]): the fold of a rewrite and of a fork reads the lists of
/// records before `record` through [`Store::message_list`], so `store` must see them, as
/// a view of an engine does. To fold into a store of projection rows alone, wrap it with
/// the records' source ([`crate::store::WithRecords`], with a [`crate::View`] or any
/// [`crate::store::Records`]); without one, such a fold is [`crate::Error::Storage`].
pub fn evolve<S: Store + ?Sized>(
    store: &mut S,
    record: &Record,
    introduced: &[ContentId],
    set: ProjectionSet,
) -> Result<()> {
    for p in set.iter() {
        match p {
            Projection::Heads => fold_heads(store, record)?,
            Projection::Transcript => fold_transcript(store, record)?,
            Projection::Graph => fold_graph(store, record)?,
            Projection::Context => fold_context(store, record)?,
            Projection::Turns => fold_turns(store, record)?,
            Projection::Usage => fold_usage(store, record)?,
            Projection::Labels => fold_labels(store, record)?,
            Projection::Tools => fold_tools(store, record)?,
            Projection::Streams => fold_streams(store, record)?,
            Projection::Content => fold_content(store, record, introduced)?,
            Projection::Inbox => fold_inbox(store, record)?,
        }
    }
    Ok(())
}

fn corrupt(r: &Record, detail: impl Into<String>) -> Error {
    Error::corrupt(Location::Log { seq: r.seq }, detail)
}

fn need<T>(r: &Record, v: Option<T>, what: &str) -> Result<T> {
    v.ok_or_else(|| corrupt(r, format!("{} event for a session with no {what}", r.event.kind())))
}

/// An erased record, or a tombstone: the session was purged, so it has no head (its
/// creation was erased too); a tombstone leaves the purge marker.
fn fold_purged<S: Store + ?Sized>(store: &mut S, r: &Record, key: &[u8]) -> Result<()> {
    if store.contains(Table::Heads, key)? {
        return Err(corrupt(r, format!("{} of a session whose records are not erased", r.event.kind())));
    }
    if store.contains(Table::Purged, key)? {
        return Err(corrupt(r, "record after the session's tombstone"));
    }
    if let Event::SessionPurged(_) = &r.event {
        let marker = PurgedSession { seq: r.seq, stream_seq: r.stream_seq, purged_at_ms: r.committed_at_ms };
        store.put_row(Table::Purged, key, &marker)?;
    }
    Ok(())
}

fn fold_heads<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    let key = keys::session(&r.session);
    let mut head = match &r.event {
        Event::Erased(_) | Event::SessionPurged(_) => return fold_purged(store, r, &key),
        Event::SessionCreated(e) => {
            if store.contains(Table::Heads, &key)? || r.stream_seq != 1 {
                return Err(corrupt(r, "session created twice"));
            }
            if store.contains(Table::Purged, &key)? {
                return Err(corrupt(r, "session created after its tombstone"));
            }
            SessionHead {
                session: r.session,
                revision: e.revision_after,
                message_count: e.forked_from.as_ref().map_or(0, |f| f.message_count) + e.messages.len() as u64,
                archived: false,
                labels: e.labels.clone(),
                metadata: e.metadata.clone(),
                forked_from: e.forked_from.clone(),
                created_seq: r.seq,
                created_at_ms: r.committed_at_ms,
                last_seq: r.seq,
                stream_seq: 0,
                updated_at_ms: r.committed_at_ms,
                host_state: Default::default(),
                lease: None,
            }
        }
        event => {
            let mut head: SessionHead = need(r, store.tip_row(Table::Heads, &key)?, "head")?;
            match event {
                Event::TurnCommitted(e) => {
                    head.revision = e.revision_after;
                    head.message_count += e.messages.len() as u64;
                    fold_state(store, r, &mut head, &e.state)?;
                }
                Event::HostStateChanged(e) => fold_state(store, r, &mut head, &e.state)?,
                Event::MetadataSet(e) => head.metadata = e.metadata.clone(),
                Event::LeaseAcquired(e) => {
                    let last = head.lease.as_ref().map_or(0, |l| l.token);
                    if e.token != last + 1 {
                        return Err(corrupt(r, format!("lease token {} does not follow {last}", e.token)));
                    }
                    head.lease = Some(LeaseState {
                        owner: e.owner.clone(),
                        token: e.token,
                        expires_at_ms: e.expires_at_ms,
                        released: false,
                    });
                }
                Event::LeaseReleased(e) => match head.lease.as_mut() {
                    Some(lease) if lease.token == e.token && !lease.released => lease.released = true,
                    _ => return Err(corrupt(r, format!("release of lease token {} that is not held", e.token))),
                },
                Event::TranscriptRewritten(e) => {
                    if e.start > e.end || e.end > head.message_count {
                        return Err(corrupt(r, "rewrite range outside the transcript"));
                    }
                    head.revision = e.revision_after;
                    head.message_count = head.message_count - (e.end - e.start) + e.replacement.len() as u64;
                }
                Event::SessionArchived(_) => head.archived = true,
                Event::SessionRevived(_) => head.archived = false,
                Event::LabelsChanged(e) => {
                    for k in &e.remove {
                        head.labels.remove(k);
                    }
                    head.labels.extend(e.set.clone());
                }
                _ => {}
            }
            head
        }
    };
    if r.stream_seq != head.stream_seq + 1 {
        return Err(corrupt(r, format!("stream seq {} does not follow {}", r.stream_seq, head.stream_seq)));
    }
    head.stream_seq = r.stream_seq;
    head.last_seq = r.seq;
    head.updated_at_ms = r.committed_at_ms;
    store.put_tip_row(Table::Heads, &key, head)
}

/// Applies a host state change to the head and records each changed entry in the
/// history, under the event's stream seq. Removing a name the session does not hold
/// changes nothing (a turn records the removals its host asked for).
fn fold_state<S: Store + ?Sized>(store: &mut S, r: &Record, head: &mut SessionHead, delta: &StateDelta) -> Result<()> {
    for name in &delta.remove {
        if head.host_state.remove(name).is_none() {
            continue;
        }
        let none: Option<ContentId> = None;
        store.put_row(Table::HostStateLog, &keys::host_state_log(&r.session, name, r.stream_seq), &none)?;
    }
    for (name, id) in &delta.set {
        if delta.remove.contains(name) {
            return Err(corrupt(r, format!("host state entry {name:?} both set and removed")));
        }
        head.host_state.insert(name.clone(), *id);
        store.put_row(Table::HostStateLog, &keys::host_state_log(&r.session, name, r.stream_seq), &Some(*id))?;
    }
    Ok(())
}

fn check_revision(r: &Record, computed: RevisionId, claimed: RevisionId) -> Result<()> {
    if computed != claimed {
        return Err(corrupt(r, format!("revision_after {claimed} does not recompute (got {computed})")));
    }
    Ok(())
}

/// The run of `r`'s message list `list` (all of it), none when it is empty.
fn run(r: &Record, list: &[ContentId]) -> Option<transcript::Run> {
    (!list.is_empty()).then_some(transcript::Run { seq: r.seq, start: 0, count: list.len() as u64 })
}

fn fold_transcript<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    let tip_key = keys::session(&r.session);
    let tip = match &r.event {
        Event::SessionCreated(e) => {
            let (mut len, mut chain) = (0, RevisionId::empty());
            if let Some(f) = &e.forked_from {
                let parent: TranscriptTip =
                    need(r, store.tip_row(Table::TranscriptTip, &keys::session(&f.session))?, "parent transcript")?;
                if parent.revision != f.revision || f.message_count > parent.len {
                    return Err(corrupt(r, "fork origin is not the parent's head"));
                }
                transcript::copy_prefix(store, &f.session, &r.session, f.message_count)?;
                chain = transcript::chain_at(store, &f.session, f.message_count)?;
                len = f.message_count;
            }
            let chain = transcript::splice(store, &r.session, len, len, len, chain, run(r, &e.messages), &e.messages)?;
            check_revision(r, chain, e.revision_after)?;
            TranscriptTip { len: len + e.messages.len() as u64, revision: chain }
        }
        Event::TurnCommitted(e) => {
            let tip: TranscriptTip = need(r, store.tip_row(Table::TranscriptTip, &tip_key)?, "transcript")?;
            let chain = transcript::splice(
                store,
                &r.session,
                tip.len,
                tip.len,
                tip.len,
                tip.revision,
                run(r, &e.messages),
                &e.messages,
            )?;
            check_revision(r, chain, e.revision_after)?;
            TranscriptTip { len: tip.len + e.messages.len() as u64, revision: chain }
        }
        Event::TranscriptRewritten(e) => {
            let tip: TranscriptTip = need(r, store.tip_row(Table::TranscriptTip, &tip_key)?, "transcript")?;
            if tip.revision != e.parent_revision {
                return Err(corrupt(r, "rewrite parent is not the head"));
            }
            if e.start > e.end || e.end > tip.len {
                return Err(corrupt(r, "rewrite range outside the transcript"));
            }
            let mut after = transcript::spare_ids_from(&e.replacement);
            transcript::ids_into(store, &r.session, e.end, tip.len, &mut after)?;
            let base = transcript::chain_at(store, &r.session, e.start)?;
            let inserted = run(r, &e.replacement);
            let chain = transcript::splice(store, &r.session, e.start, e.end, tip.len, base, inserted, &after)?;
            check_revision(r, chain, e.revision_after)?;
            let len = e.start + after.len() as u64;
            transcript::recycle_ids(after);
            TranscriptTip { len, revision: chain }
        }
        _ => return Ok(()),
    };
    store.put_tip_row(Table::TranscriptTip, &tip_key, tip)
}

/// Nodes per row of the revision order: row `c` of a session holds the seqs of its nodes
/// `16c ..= 16c + 15` (the records that first produced them), in order, a u64 big-endian
/// each (small rows for the same reason as [`STREAM_CHUNK`]: a new node rewrites its
/// session's last row).
pub const REVISION_ORDER_CHUNK: u64 = 16;

/// The revision order: a session's nodes by ordinal, each as the seq of the record that
/// first produced it (whose `revision_after` is the node's revision), packed.
pub(crate) const REVISION_ORDER: Packed =
    Packed { table: Table::RevisionOrder, width: 8, per_row: REVISION_ORDER_CHUNK };

fn fold_graph<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    let tip_key = keys::session(&r.session);
    // A node keeps what its record does not hold (`StoredNode`): the recipe and the
    // origin are read from the record when the node is.
    let (tip, to, new_len) = match &r.event {
        Event::SessionCreated(e) => {
            if let Some(f) = &e.forked_from {
                let edge =
                    ForkEdge { child: r.session, revision: f.revision, message_count: f.message_count, seq: r.seq };
                store.put_row(Table::Forks, &keys::session_pair(&f.session, &r.session), &edge)?;
            }
            let len = e.forked_from.as_ref().map_or(0, |f| f.message_count) + e.messages.len() as u64;
            (None, e.revision_after, len)
        }
        // A turn with no messages (usage, applied context or tool references only)
        // leaves the revision where it is: no node, no edge.
        Event::TurnCommitted(e) if e.messages.is_empty() => return Ok(()),
        Event::TurnCommitted(e) => {
            let tip: GraphTip = need(r, store.tip_row(Table::GraphTip, &tip_key)?, "graph")?;
            (Some(tip), e.revision_after, tip.len + e.messages.len() as u64)
        }
        Event::TranscriptRewritten(e) => {
            let tip: GraphTip = need(r, store.tip_row(Table::GraphTip, &tip_key)?, "graph")?;
            if tip.head != e.parent_revision || e.start > e.end || e.end > tip.len {
                return Err(corrupt(r, "rewrite does not splice the graph head"));
            }
            (Some(tip), e.revision_after, tip.len - (e.end - e.start) + e.replacement.len() as u64)
        }
        _ => return Ok(()),
    };
    let from = tip.map(|t| (t.head, t.head_seq));
    let mut nodes = tip.map_or(0, |t| t.nodes);
    let node_key = keys::session_rev(&r.session, &to);
    let stored =
        REVISIONS.get(store, &r.session.0, &to.0, |v| decode_row::<StoredNode>(Table::Revisions, &node_key, v))?;
    let head_seq = match stored {
        Some(mut node) => {
            if let Some((_, f)) = from {
                if !node.parents.contains(&f) {
                    node.parents.push(f);
                    REVISIONS.insert(store, &r.session.0, &to.0, &crate::store::encode_row(&node)?)?;
                }
            }
            // A transition to a revision the session already had (a restore, or a
            // rewrite back to earlier content) is stored as an edge of its own; the
            // transition that first produced a node is the node itself
            // (`RevisionNode::creation_edge`).
            let origin = match &r.event {
                Event::TurnCommitted(e) => NodeOrigin::Turn { turn_id: e.turn_id.clone() },
                Event::TranscriptRewritten(e) => {
                    NodeOrigin::Rewrite { kind: e.kind.name().into(), note: e.note.clone(), actor: e.actor.clone() }
                }
                _ => NodeOrigin::Created,
            };
            let edge = RevisionEdge { seq: r.seq, from: from.map(|f| f.0), to, origin, at_ms: r.committed_at_ms };
            store.put_row(Table::RevisionEdges, &keys::session_u64(&r.session, r.seq), &edge)?;
            node.seq
        }
        None => {
            let node = StoredNode {
                ordinal: nodes,
                parents: from.map(|f| f.1).into_iter().collect(),
                seq: r.seq,
                message_count: new_len,
            };
            REVISIONS.insert(store, &r.session.0, &to.0, &crate::store::encode_row(&node)?)?;
            if let Err(m) = REVISION_ORDER.append(store, &r.session, nodes, &r.seq.to_be_bytes())? {
                return Err(corrupt(r, format!("revision order does not take node {nodes}: {m:?}")));
            }
            nodes += 1;
            r.seq
        }
    };
    store.put_tip_row(Table::GraphTip, &tip_key, GraphTip { head: to, head_seq, nodes, len: new_len })
}

fn fold_context<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    match &r.event {
        Event::ContextAppended(e) => {
            let key = keys::session_str(&r.session, &e.key);
            if store.contains(Table::Context, &key)? {
                return Err(corrupt(r, format!("context {} appended twice", e.key)));
            }
            let entry = ContextEntry {
                key: e.key.clone(),
                content: e.content,
                source: e.source.clone(),
                appended_seq: r.seq,
                state: ContextState::Pending,
            };
            store.put_row(Table::Context, &key, &entry)
        }
        Event::TurnCommitted(e) => {
            for k in &e.applied_context {
                let key = keys::session_str(&r.session, k);
                let mut entry: ContextEntry = need(r, store.row(Table::Context, &key)?, "context entry")?;
                if entry.state != ContextState::Pending {
                    return Err(corrupt(r, format!("context {k} applied twice")));
                }
                entry.state = ContextState::Applied { seq: r.seq, turn_id: e.turn_id.clone() };
                store.put_row(Table::Context, &key, &entry)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn fold_turns<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    if let Event::TurnCommitted(e) = &r.event {
        if !crate::buckets::turn_add(store, &r.session, &e.turn_id, r.seq)? {
            return Err(corrupt(r, format!("turn {} committed twice", e.turn_id)));
        }
    }
    Ok(())
}

fn fold_usage<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    if let Event::TurnCommitted(e) = &r.event {
        // A turn may report several entries for one model; it counts as one turn.
        let mut counted: Vec<Vec<u8>> = Vec::with_capacity(e.usage.len());
        for u in &e.usage {
            let key = keys::usage(&r.session, &u.provider, &u.model);
            let mut t: UsageTotals = store.tip_row(Table::Usage, &key)?.unwrap_or_else(|| UsageTotals {
                provider: u.provider.clone(),
                model: u.model.clone(),
                ..UsageTotals::default()
            });
            t.input = t.input.saturating_add(u.input);
            t.output = t.output.saturating_add(u.output);
            t.cache_read = t.cache_read.saturating_add(u.cache_read);
            t.cache_write = t.cache_write.saturating_add(u.cache_write);
            if !counted.contains(&key) {
                t.turns += 1;
                counted.push(key.clone());
            }
            store.put_tip_row(Table::Usage, &key, t)?;
        }
    }
    Ok(())
}

fn fold_labels<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    let key = keys::session(&r.session);
    match &r.event {
        // A purged session is listed nowhere: its creation was erased, so it never had a
        // row here.
        Event::Erased(_) | Event::SessionPurged(_) => return Ok(()),
        Event::SessionCreated(e) => {
            if store.contains(Table::LabelSessions, &key)? {
                return Err(corrupt(r, "session created twice"));
            }
            for (k, v) in &e.labels {
                store.put(Table::LabelIndex, &keys::label_index(k, v, r.seq, &r.session), &[])?;
                count_label(store, k, v, 1)?;
            }
            store.put_row(Table::CreationOrder, &keys::u64(r.seq), &r.session)?;
            store.put_row(
                Table::LabelSessions,
                &key,
                &LabelSession { created_seq: r.seq, labels: e.labels.clone() },
            )?;
        }
        event => {
            // Every event moves the session to the front of the recency order; only the
            // session's last seq is read for it (a row of its own, not the labels).
            let last = match store.get(Table::RecencyTip, &key)? {
                Some(v) => <[u8; 8]>::try_from(v.as_slice()).map(u64::from_be_bytes).map_err(|_| {
                    Error::corrupt(
                        Location::Projection { table: Table::RecencyTip.name(), key: crate::store::hex(&key) },
                        "bad recency tip",
                    )
                })?,
                None => return Err(corrupt(r, format!("{} event for a session with no recency tip", event.kind()))),
            };
            store.remove_fresh(Table::RecencyOrder, &keys::recency(last, &r.session), last)?;
            if let Event::LabelsChanged(e) = event {
                let mut ls: LabelSession = need(r, store.row(Table::LabelSessions, &key)?, "labels")?;
                for k in &e.remove {
                    if let Some(v) = ls.labels.remove(k) {
                        store.remove(Table::LabelIndex, &keys::label_index(k, &v, ls.created_seq, &r.session))?;
                        count_label(store, k, &v, -1)?;
                    }
                }
                for (k, v) in &e.set {
                    match ls.labels.insert(k.clone(), v.clone()) {
                        Some(old) if old == *v => continue,
                        Some(old) => {
                            store.remove(Table::LabelIndex, &keys::label_index(k, &old, ls.created_seq, &r.session))?;
                            count_label(store, k, &old, -1)?;
                        }
                        None => {}
                    }
                    store.put(Table::LabelIndex, &keys::label_index(k, v, ls.created_seq, &r.session), &[])?;
                    count_label(store, k, v, 1)?;
                }
                store.put_row(Table::LabelSessions, &key, &ls)?;
            }
        }
    }
    store.put(Table::RecencyOrder, &keys::recency(r.seq, &r.session), &[])?;
    store.put(Table::RecencyTip, &key, &r.seq.to_be_bytes())
}

/// Adds `delta` to the count of sessions holding label `key = value`; a count that
/// reaches zero is removed.
fn count_label<S: Store + ?Sized>(store: &mut S, key: &str, value: &str, delta: i64) -> Result<()> {
    let count_key = keys::label_prefix(key, value);
    let count: u64 = store.row(Table::LabelCounts, &count_key)?.unwrap_or(0);
    match count.checked_add_signed(delta) {
        Some(0) => store.remove(Table::LabelCounts, &count_key),
        Some(n) => store.put_row(Table::LabelCounts, &count_key, &n),
        None => Err(Error::corrupt(
            Location::Projection { table: Table::LabelCounts.name(), key: crate::store::hex(&count_key) },
            "label count below zero",
        )),
    }
}

fn fold_tools<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    match &r.event {
        Event::ToolCallRecorded(e) => {
            let key = keys::session_str(&r.session, &e.op_id);
            if store.contains(Table::ToolOps, &key)? {
                return Err(corrupt(r, format!("tool op {} called twice", e.op_id)));
            }
            let tip_key = keys::session(&r.session);
            let mut tip: ToolTip = store.tip_row(Table::ToolTip, &tip_key)?.unwrap_or_default();
            let op = ToolOp {
                session: r.session,
                op_id: e.op_id.clone(),
                ordinal: tip.count,
                call_id: e.call_id.clone(),
                tool_name: e.tool_name.clone(),
                args: e.args,
                parent_op: e.parent_op.clone(),
                turn_id: e.turn_id.clone(),
                recovery: e.recovery,
                call_seq: r.seq,
                called_at_ms: r.committed_at_ms,
                state: ToolState::Prepared,
            };
            store.put_row(Table::ToolOps, &key, &op)?;
            store.put_row(Table::ToolOrder, &keys::session_u64(&r.session, tip.count), &e.op_id)?;
            store.put_row(Table::Unsettled, &keys::session_u64(&r.session, r.seq), &e.op_id)?;
            store.put_row(Table::UnsettledAll, &keys::u64(r.seq), &(r.session, e.op_id.clone()))?;
            tip.count += 1;
            store.put_tip_row(Table::ToolTip, &tip_key, tip)
        }
        Event::ToolResultRecorded(e) => {
            let key = keys::session_str(&r.session, &e.op_id);
            let mut op: ToolOp = need(r, store.row(Table::ToolOps, &key)?, "tool call")?;
            if op.state != ToolState::Prepared {
                return Err(corrupt(r, format!("tool op {} settled twice", e.op_id)));
            }
            op.state =
                ToolState::Settled { outcome: e.outcome, result: e.result, seq: r.seq, at_ms: r.committed_at_ms };
            store.remove_fresh(Table::Unsettled, &keys::session_u64(&r.session, op.call_seq), op.call_seq)?;
            store.remove_fresh(Table::UnsettledAll, &keys::u64(op.call_seq), op.call_seq)?;
            store.put_row(Table::ToolOps, &key, &op)
        }
        _ => Ok(()),
    }
}

/// Stream seqs per row of the stream index: row `c` of a session holds the global seqs
/// of its stream seqs `16c + 1 ..= 16c + 16`, in order, each a u64 big-endian. Each event
/// rewrites its session's last row, and the delta keeps a version of it per batch: rows
/// of 16 keep that version about as large as the row of one seq it replaces (64 bytes
/// on average, against a key and 8 bytes).
pub const STREAM_CHUNK: u64 = 16;

/// The stream index: a session's global seqs by stream seq (entry `n - 1` for stream seq
/// `n`), packed.
pub(crate) const STREAM_INDEX: Packed = Packed { table: Table::StreamIndex, width: 8, per_row: STREAM_CHUNK };

fn fold_streams<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    let placed = match r.stream_seq.checked_sub(1) {
        Some(index) => STREAM_INDEX.append(store, &r.session, index, &r.seq.to_be_bytes())?,
        None => Err(Misplaced::Gap),
    };
    match placed {
        Ok(()) => Ok(()),
        Err(Misplaced::Repeated) => Err(corrupt(r, format!("stream seq {} used twice", r.stream_seq))),
        Err(Misplaced::Gap) => {
            Err(corrupt(r, format!("stream seq {} does not follow the session's stream", r.stream_seq)))
        }
        Err(Misplaced::BadRow(len)) => Err(corrupt(r, format!("stream index row of {len} bytes"))),
    }
}

/// The content-id index: every object stored with a record is listed under its key at
/// that record's seq, and every object a record refers to must already be stored, as far
/// as the index can tell (a row is listed under the id's key; whole ids are `verify`'s
/// and the writer's to check, which read the rows; attachments are checked where their
/// message is read).
fn fold_content<S: Store + ?Sized>(store: &mut S, r: &Record, introduced: &[ContentId]) -> Result<()> {
    for id in introduced {
        crate::buckets::content_add(store, id, r.seq)?;
    }
    for id in r.event.content_refs() {
        // What the record introduced was just indexed above.
        if !introduced.contains(&id) && !crate::buckets::content_may_be_stored(store, &id)? {
            return Err(corrupt(r, format!("refers to content {id}, which is not stored")));
        }
    }
    Ok(())
}

/// A content collection removed `removed` (each id with the seq of its row) from their
/// content rows: the content-id index forgets them, as a fold of those rows from the log
/// now gives (it indexes what a row holds), so a later command that brings the same bytes
/// stores them again.
pub(crate) fn content_collected<S: Store + ?Sized>(store: &mut S, removed: &[(ContentId, u64)]) -> Result<()> {
    for (id, seq) in removed {
        crate::buckets::content_remove(store, id, *seq)?;
    }
    Ok(())
}

fn input_row<S: Store + ?Sized>(store: &S, r: &Record, id: &str) -> Result<InputRow> {
    need(r, store.row(Table::Inputs, &keys::session_str(&r.session, id))?, "queued input")
}

/// Closes claim `claim` once no input is held by it any more.
fn close_if_empty<S: Store + ?Sized>(store: &mut S, r: &Record, tip: &mut InboxTip, claim: u64) -> Result<()> {
    let key = keys::session_u64(&r.session, claim);
    let mut row: ClaimRow = need(r, store.row(Table::Claims, &key)?, "claim")?;
    if !row.open {
        return Ok(());
    }
    for id in &row.inputs {
        if matches!(input_row(store, r, id)?.state, InputState::Claimed { claim: c, .. } if c == claim) {
            return Ok(());
        }
    }
    row.open = false;
    tip.claims.retain(|c| *c != claim);
    store.put_row(Table::Claims, &key, &row)
}

/// Ends an input's life in the inbox (completed or cancelled).
fn settle_input<S: Store + ?Sized>(
    store: &mut S,
    r: &Record,
    tip: &mut InboxTip,
    id: &str,
    state: InputState,
    allowed: fn(&InputState) -> bool,
) -> Result<()> {
    let key = keys::session_str(&r.session, id);
    let mut row = input_row(store, r, id)?;
    if !allowed(&row.state) {
        return Err(corrupt(r, format!("input {id:?} is {}", row.state.name())));
    }
    let held = match row.state {
        InputState::Claimed { claim, .. } => Some(claim),
        _ => None,
    };
    row.state = state;
    store.put_row(Table::Inputs, &key, &row)?;
    tip.open.retain(|o| o != id);
    if let Some(claim) = held {
        close_if_empty(store, r, tip, claim)?;
    }
    Ok(())
}

fn fold_inbox<S: Store + ?Sized>(store: &mut S, r: &Record) -> Result<()> {
    let tip_key = keys::session(&r.session);
    let mut tip: InboxTip = match &r.event {
        Event::InputEnqueued(_) | Event::InputsClaimed(_) | Event::ClaimAbandoned(_) | Event::InputCancelled(_) => {
            store.tip_row(Table::InboxTip, &tip_key)?.unwrap_or_default()
        }
        Event::TurnCommitted(e) if !e.inputs.is_empty() => {
            store.tip_row(Table::InboxTip, &tip_key)?.unwrap_or_default()
        }
        _ => return Ok(()),
    };
    match &r.event {
        Event::InputEnqueued(e) => {
            let key = keys::session_str(&r.session, &e.input_id);
            if store.contains(Table::Inputs, &key)? {
                return Err(corrupt(r, format!("input {:?} queued twice", e.input_id)));
            }
            let row = InputRow {
                input_id: e.input_id.clone(),
                seq: r.seq,
                message: e.message,
                kind: e.kind,
                state: InputState::Pending,
            };
            store.put_row(Table::Inputs, &key, &row)?;
            tip.open.push(e.input_id.clone());
        }
        Event::InputsClaimed(e) => {
            let mut previous = Vec::new();
            for id in &e.inputs {
                let key = keys::session_str(&r.session, id);
                let mut row = input_row(store, r, id)?;
                match row.state {
                    InputState::Pending => {}
                    InputState::Claimed { claim, .. } => previous.push(claim),
                    ref other => return Err(corrupt(r, format!("claim of input {id:?}, which is {}", other.name()))),
                }
                row.state = InputState::Claimed { claim: r.stream_seq, expires_at_ms: e.expires_at_ms };
                store.put_row(Table::Inputs, &key, &row)?;
            }
            let row = ClaimRow {
                claim: r.stream_seq,
                owner: e.owner.clone(),
                token: e.token,
                target: e.target.clone(),
                inputs: e.inputs.clone(),
                expires_at_ms: e.expires_at_ms,
                open: true,
            };
            store.put_row(Table::Claims, &keys::session_u64(&r.session, r.stream_seq), &row)?;
            tip.claims.push(r.stream_seq);
            for claim in previous {
                close_if_empty(store, r, &mut tip, claim)?;
            }
        }
        Event::ClaimAbandoned(e) => {
            let key = keys::session_u64(&r.session, e.claim);
            let mut claim: ClaimRow = need(r, store.row(Table::Claims, &key)?, "claim")?;
            if !claim.open {
                return Err(corrupt(r, format!("claim {} abandoned while closed", e.claim)));
            }
            for id in &claim.inputs {
                let mut row = input_row(store, r, id)?;
                if matches!(row.state, InputState::Claimed { claim: c, .. } if c == e.claim) {
                    row.state = InputState::Pending;
                    store.put_row(Table::Inputs, &keys::session_str(&r.session, id), &row)?;
                }
            }
            claim.open = false;
            store.put_row(Table::Claims, &key, &claim)?;
            tip.claims.retain(|c| *c != e.claim);
        }
        Event::InputCancelled(e) => {
            let allowed: fn(&InputState) -> bool = |s| matches!(s, InputState::Pending | InputState::Claimed { .. });
            settle_input(store, r, &mut tip, &e.input_id, InputState::Cancelled { seq: r.seq }, allowed)?;
        }
        Event::TurnCommitted(e) => {
            for id in &e.inputs {
                let state = InputState::Completed { turn_id: e.turn_id.clone(), seq: r.seq };
                settle_input(store, r, &mut tip, id, state, |s| matches!(s, InputState::Claimed { .. }))?;
            }
        }
        _ => {}
    }
    store.put_tip_row(Table::InboxTip, &tip_key, tip)
}
