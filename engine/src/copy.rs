//! Copying sessions between databases.
//!
//! [`export`] (or [`crate::Reader::export_sessions`]) reads whole sessions out of one
//! database: their records in that database's order and the content objects they refer
//! to. [`crate::Engine::copy_in`] appends them to another database that may hold other
//! sessions. The copied records get new global sequence numbers at the target's tip
//! (densely, chained under the target's key), and keep their session id, stream
//! sequence numbers and events byte for byte, so every `revision_after`, commit hash and
//! content id stays valid and the same `evolve` folds and checks them. Their
//! `committed_at` is the original time, or the target's clock where the original would go
//! back in time (`max(original, previous)`): the clock of the target never decreases.
//!
//! A session the target already holds with exactly the same events (the same stream of
//! `(stream seq, event)`) is skipped and reported as already present; one it holds with
//! any other history is [`Rejection::SessionConflict`]. A forked session needs its parent
//! in the target, or earlier in the copy ([`Rejection::ForkParentMissing`]), with the
//! parent's head still at the revision the fork was taken from when the fork is folded
//! ([`Rejection::ForkParentMoved`]). Records of the copy are folded in the order of the
//! export, which is the source's, so a parent copied with its fork is at the fork's
//! revision when the fork is created, as it was in the source. The whole copy is one
//! transaction and one fsync on the writer thread: all or nothing.

use crate::delta::View;
use crate::error::{Error, Location, Rejection, Result};
use crate::import::fold_foreign;
use crate::limits::Limits;
use crate::log::Tip;
use crate::query::{self, EventQuery, StoredEvent};
use crate::store::Overlay;
use crate::writer::{append, CommitNotice, Shared};
use annal_codec::{ContentId, Event, LogChain, Record, SessionId};
use redb::ReadableDatabase;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Whole sessions read from one database, to be copied into another with
/// [`crate::Engine::copy_in`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionExport {
    /// Every record of the exported sessions, in the source's global order, as the
    /// source stored them. Their `seq` and `committed_at_ms` are the source's: a copy
    /// assigns new sequence numbers, and uses `seq` only to keep the order and to name a
    /// record in errors ([`Rejection::InvalidImport`]).
    pub records: Vec<Record>,
    /// The canonical bytes of every content object the records refer to, message
    /// attachments included, each once.
    pub content: Vec<Vec<u8>>,
}

impl SessionExport {
    /// The sessions the export holds, in the order of their first record.
    pub fn sessions(&self) -> Vec<SessionId> {
        let mut seen = HashSet::new();
        self.records.iter().filter(|r| seen.insert(r.session)).map(|r| r.session).collect()
    }
}

/// What [`crate::Engine::copy_in`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyOutcome {
    /// Sessions appended, in the order of their first record.
    pub copied: Vec<SessionId>,
    /// Sessions skipped because the target holds them with exactly the same events.
    pub already_present: Vec<SessionId>,
    /// Records appended.
    pub records: u64,
    /// New content objects stored (objects the target held already are not stored again).
    pub content_objects: u64,
    /// The target's global seq of the first record appended, if any.
    pub first_seq: Option<u64>,
    /// The log tip after the copy.
    pub tip_seq: u64,
}

/// The sessions an export of `sessions` holds: each of them and, with `ancestry`, the
/// sessions they were forked from, transitively. Ordered by creation, so a parent comes
/// before its forks. An unknown session is [`Rejection::NotFound`].
pub fn lineage(view: &View, sessions: &[SessionId], ancestry: bool) -> Result<Vec<SessionId>> {
    let mut found: HashMap<SessionId, u64> = HashMap::new();
    let mut pending: Vec<SessionId> = sessions.to_vec();
    while let Some(session) = pending.pop() {
        if found.contains_key(&session) {
            continue;
        }
        let head = query::head(view, &session)?.ok_or(Error::Rejected(Rejection::NotFound { session }))?;
        found.insert(session, head.created_seq);
        if let (true, Some(fork)) = (ancestry, &head.forked_from) {
            pending.push(fork.session);
        }
    }
    let mut ordered: Vec<(u64, SessionId)> = found.into_iter().map(|(s, seq)| (seq, s)).collect();
    ordered.sort();
    Ok(ordered.into_iter().map(|(_, s)| s).collect())
}

/// Every record of `sessions`, chain-verified, in global order (read through the
/// per-session stream index, so the cost follows the sessions, not the log).
pub fn session_events(
    view: &View,
    chain: &LogChain,
    limits: &Limits,
    sessions: &[SessionId],
) -> Result<Vec<StoredEvent>> {
    let mut out = Vec::new();
    for session in sessions {
        let mut q = EventQuery { from_seq: 1, max_events: limits.page_items_max, max_bytes: limits.page_bytes_max };
        loop {
            let page = query::session_events(view, chain, limits, session, &q)?;
            let done = page.events.is_empty() || !page.has_more;
            q.from_seq = page.next_seq;
            out.extend(page.events);
            if done {
                break;
            }
        }
    }
    out.sort_by_key(|e| e.record.seq);
    Ok(out)
}

/// Reads `sessions` (and with `ancestry` the sessions they were forked from) for a copy:
/// every record, and the content objects they refer to with their attachments, each read
/// back and verified against its id.
pub fn export(
    view: &View,
    chain: &LogChain,
    limits: &Limits,
    sessions: &[SessionId],
    ancestry: bool,
) -> Result<SessionExport> {
    let set = lineage(view, sessions, ancestry)?;
    let records: Vec<Record> = session_events(view, chain, limits, &set)?.into_iter().map(|e| e.record).collect();
    let max = limits.message_object_bytes_max();
    let mut seen = HashSet::new();
    let mut content = Vec::new();
    for record in &records {
        let mut wanted = record.event.content_refs();
        while let Some(id) = wanted.pop() {
            if !seen.insert(id) {
                continue;
            }
            let bytes = view.content(&id, max)?.ok_or_else(|| {
                Error::corrupt(
                    Location::Content { id: id.to_hex() },
                    format!("referred to by seq {} but not stored", record.seq),
                )
            })?;
            if let Ok(attachments) = annal_codec::message_attachments(&bytes, max) {
                wanted.extend(attachments);
            }
            content.push(bytes);
        }
    }
    Ok(SessionExport { records, content })
}

/// Copies `export` in on the writer, with the log to itself. `clock_ms` is the writer's
/// clock: no record gets an earlier `committed_at`.
pub(crate) fn copy_in(
    shared: &Shared,
    tip: &mut Tip,
    clock_ms: u64,
    export: SessionExport,
) -> Result<(CopyOutcome, Option<CommitNotice>)> {
    crate::writer::alone_on_the_log(shared, "copy", || copy_txn(shared, tip, clock_ms, export))
}

fn invalid(seq: u64, reason: impl Into<String>) -> Error {
    Error::Rejected(Rejection::InvalidImport { seq, reason: reason.into() })
}

/// The sessions of an export with the indexes of their records, in the order of their
/// first record. Checks that the records keep the source's order and that each session's
/// stream is whole: stream seqs 1, 2, ... with none missing.
fn streams(records: &[Record]) -> Result<Vec<(SessionId, Vec<usize>)>> {
    let mut order: Vec<(SessionId, Vec<usize>)> = Vec::new();
    let mut index: HashMap<SessionId, usize> = HashMap::new();
    let mut previous = None;
    for (i, r) in records.iter().enumerate() {
        if previous.is_some_and(|p| r.seq <= p) {
            return Err(invalid(r.seq, "records are not in the order of their source"));
        }
        previous = Some(r.seq);
        let at = *index.entry(r.session).or_insert_with(|| {
            order.push((r.session, Vec::new()));
            order.len() - 1
        });
        let stream = &mut order[at].1;
        let expected = stream.len() as u64 + 1;
        if r.stream_seq != expected {
            return Err(invalid(
                r.seq,
                format!(
                    "stream seq {} of session {} where {expected} was expected: a copy holds whole sessions",
                    r.stream_seq, r.session
                ),
            ));
        }
        stream.push(i);
    }
    Ok(order)
}

/// Whether the target holds `session` with exactly the events of `ours`, in stream order.
fn same_stream(view: &View, shared: &Shared, session: &SessionId, stream_seq: u64, ours: &[&Record]) -> Result<bool> {
    if stream_seq != ours.len() as u64 {
        return Ok(false);
    }
    let limits = &shared.limits;
    let mut q = EventQuery { from_seq: 1, max_events: limits.page_items_max, max_bytes: limits.page_bytes_max };
    let mut at = 0;
    loop {
        let page = query::session_events(view, &shared.chain, limits, session, &q)?;
        if page.events.is_empty() {
            return Ok(at == ours.len());
        }
        for event in &page.events {
            let Some(mine) = ours.get(at) else {
                return Ok(false);
            };
            if event.record.stream_seq != mine.stream_seq || event.record.event != mine.event {
                return Ok(false);
            }
            at += 1;
        }
        if !page.has_more {
            return Ok(at == ours.len());
        }
        q.from_seq = page.next_seq;
    }
}

fn copy_txn(
    shared: &Shared,
    tip: &mut Tip,
    clock_ms: u64,
    export: SessionExport,
) -> Result<(CopyOutcome, Option<CommitNotice>)> {
    let SessionExport { records, content } = export;
    let limits = &shared.limits;
    let streams = streams(&records)?;
    let view = shared.delta.view();

    // Which sessions the target holds already, and whether with the same events.
    let mut outcome = CopyOutcome { tip_seq: tip.seq, ..CopyOutcome::default() };
    for (session, indexes) in &streams {
        match query::head(&view, session)? {
            None => outcome.copied.push(*session),
            Some(head) => {
                let ours: Vec<&Record> = indexes.iter().map(|&i| &records[i]).collect();
                if !same_stream(&view, shared, session, head.stream_seq, &ours)? {
                    return Err(Error::Rejected(Rejection::SessionConflict { session: *session }));
                }
                outcome.already_present.push(*session);
            }
        }
    }

    // A fork copied without its parent needs the parent here, at the fork's revision.
    let copied: HashSet<SessionId> = outcome.copied.iter().copied().collect();
    for (session, indexes) in &streams {
        let first = &records[indexes[0]];
        let Event::SessionCreated(created) = &first.event else {
            continue;
        };
        let Some(fork) = created.forked_from.as_ref().filter(|_| copied.contains(session)) else {
            continue;
        };
        if copied.contains(&fork.session) {
            continue;
        }
        match query::head(&view, &fork.session)? {
            None => {
                return Err(Error::Rejected(Rejection::ForkParentMissing { session: *session, parent: fork.session }));
            }
            Some(parent) if parent.revision != fork.revision || parent.message_count < fork.message_count => {
                return Err(Error::Rejected(Rejection::ForkParentMoved { session: *session, parent: fork.session }));
            }
            Some(_) => {}
        }
    }

    // Re-sequence and fold the records of the sessions copied, in the export's order.
    let offered: BTreeMap<ContentId, Vec<u8>> =
        content.into_iter().map(|bytes| (annal_codec::content_id(&bytes), bytes)).collect();
    let mut overlay = Overlay::new(&view);
    let mut entries = Vec::new();
    let mut clock = clock_ms.max(tip.clock_ms);
    let ours = records.into_iter().filter(|r| copied.contains(&r.session));
    for (seq, record) in (tip.seq + 1..).zip(ours) {
        let source_seq = record.seq;
        clock = clock.max(record.committed_at_ms);
        let record = Record { seq, committed_at_ms: clock, ..record };
        let stored = Default::default();
        let offer = crate::import::Offered { objects: &offered, stored: &stored, compression: shared.compression };
        let entry = fold_foreign(&mut overlay, crate::log::Staged([&entries, &[]]), offer, record, source_seq, limits)?;
        outcome.content_objects += entry.content.len() as u64;
        entries.push(entry);
    }
    if entries.is_empty() {
        return Ok((outcome, None));
    }
    let writes = overlay.into_writes();
    drop(view);
    let events = entries.len() as u64;
    *tip = append(shared, *tip, &entries, &Default::default())?;
    shared.delta.apply(writes, tip.seq, tip.hash, events, crate::delta::LogUpdate::File(shared.log_db.begin_read()?));
    outcome.records = events;
    outcome.first_seq = Some(tip.seq + 1 - events);
    outcome.tip_seq = tip.seq;
    let notice = CommitNotice {
        first_seq: tip.seq + 1 - events,
        last_seq: tip.seq,
        sessions: outcome.copied.clone(),
        committed_at_ms: tip.clock_ms,
    };
    Ok((outcome, Some(notice)))
}
