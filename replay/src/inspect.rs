//! Read-only views: `sessions`, `inspect`, `transcript`, `log` and `stats`. Each view is
//! a value with a human-readable rendering and a JSON form for scripts.

use crate::export::{export_line, for_each_record};
use crate::{format_time_ms, human_bytes, CliError, Result};
use annal::codec::decode_header;
use annal::pieces::{ContentReader, PIECES};
use annal::query::{self, ListQuery, PageRequest};
use annal::tables::{CONTENT, LOG, META, PROJECTIONS};
use annal::{ContentId, ContextState, Event, EventKind, Reader, RevisionId, SessionHead, SessionId, ToolState};
use redb::{ReadableTable, ReadableTableMetadata, TableHandle};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

fn labels_text(labels: &BTreeMap<String, String>) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

fn head_json(h: &SessionHead) -> Value {
    json!({
        "session": h.session.to_string(),
        "revision": h.revision.to_hex(),
        "message_count": h.message_count,
        "archived": h.archived,
        "labels": h.labels,
        "metadata": crate::export::Bytes::of(&h.metadata),
        "host_state": h.host_state.iter().map(|(k, v)| (k.clone(), v.to_hex())).collect::<BTreeMap<_, _>>(),
        "forked_from": h.forked_from.as_ref().map(|f| json!({
            "session": f.session.to_string(), "revision": f.revision.to_hex(), "message_count": f.message_count,
        })),
        "created_seq": h.created_seq,
        "created_at_ms": h.created_at_ms,
        "last_seq": h.last_seq,
        "events": h.stream_seq,
        "updated_at_ms": h.updated_at_ms,
        "lease": h.lease.as_ref().map(|l| json!({
            "owner": l.owner, "token": l.token, "expires_at_ms": l.expires_at_ms, "released": l.released,
        })),
    })
}

/// Parses `k=v` label filters.
pub fn parse_labels(pairs: &[String]) -> Result<Vec<(String, String)>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(CliError::usage(format!("label filter {p:?} is not KEY=VALUE"))),
        })
        .collect()
}

/// Every session matching the label filters (AND, exact), in creation order or (with
/// `recent`) most recently updated first.
pub fn sessions(
    reader: &Reader,
    labels: &[(String, String)],
    archived: bool,
    recent: bool,
) -> Result<Vec<SessionHead>> {
    let mut q = ListQuery::new().page(0, reader.limits().page_items_max);
    if recent {
        q = q.recently_updated();
    }
    q.labels = labels.to_vec();
    q.include_archived = archived;
    let view = reader.snapshot()?;
    let mut out = Vec::new();
    loop {
        let page = query::list_sessions(&view, reader.limits(), &q)?;
        out.extend(page.items);
        if !page.has_more {
            return Ok(out);
        }
        q.offset = out.len() as u64;
    }
}

/// The session list as a table.
pub fn render_sessions(heads: &[SessionHead]) -> String {
    let mut out = format!(
        "{:<36}  {:<23}  {:>5}  {:>6}  {:<12}  {:<8}  labels\n",
        "session", "created (UTC)", "msgs", "events", "revision", "state"
    );
    for h in heads {
        let state = if h.archived { "archived" } else { "live" };
        let _ = writeln!(
            out,
            "{:<36}  {:<23}  {:>5}  {:>6}  {:<12}  {:<8}  {}",
            h.session.to_string(),
            format_time_ms(h.created_at_ms),
            h.message_count,
            h.stream_seq,
            h.revision.short(),
            state,
            labels_text(&h.labels)
        );
    }
    let _ = writeln!(out, "{} sessions", heads.len());
    out
}

/// The session list as JSON.
pub fn sessions_json(heads: &[SessionHead]) -> Value {
    Value::Array(heads.iter().map(head_json).collect())
}

/// Everything `inspect` shows about one session.
#[derive(Clone, Debug)]
pub struct Inspection {
    /// The head.
    pub head: SessionHead,
    /// Usage per (provider, model).
    pub usage: Vec<annal::UsageTotals>,
    /// Context entries, pending and applied.
    pub context: Vec<annal::ContextEntry>,
    /// Unsettled tool operations.
    pub unsettled: Vec<annal::ToolOp>,
    /// Tool operations recorded in all.
    pub tool_ops: u64,
    /// Revisions the session has held.
    pub revisions: u64,
    /// Sessions forked from this one.
    pub forks: Vec<annal::ForkEdge>,
    /// Host state entries at the head: name, value.
    pub host_state: Vec<(String, Vec<u8>)>,
}

fn not_found(session: &SessionId) -> CliError {
    CliError::usage(format!("session {session} not found"))
}

/// Reads one session's state from one snapshot.
pub fn inspect(reader: &Reader, session: SessionId) -> Result<Inspection> {
    let view = reader.snapshot()?;
    let limits = reader.limits();
    let head = query::head(&view, &session)?.ok_or_else(|| not_found(&session))?;
    let graph = query::graph(&view, &session)?;
    let total_ops = {
        let mut n = 0u64;
        let mut page = PageRequest::first(limits.page_items_max);
        loop {
            let p = query::tool_ops(&view, limits, &session, page)?;
            n += p.items.len() as u64;
            if !p.has_more || p.items.is_empty() {
                break n;
            }
            page.offset += p.items.len() as u64;
        }
    };
    let mut host_state = Vec::new();
    for name in head.host_state.keys() {
        let value = query::host_state(&view, limits, &session, name, None)?.unwrap_or_default();
        host_state.push((name.clone(), value));
    }
    Ok(Inspection {
        host_state,
        usage: query::usage(&view, &session)?,
        context: query::context(&view, &session)?,
        unsettled: query::unsettled(&view, &session)?,
        tool_ops: total_ops,
        revisions: graph.nodes.len() as u64,
        forks: graph.forks,
        head,
    })
}

impl Inspection {
    /// The inspection as text.
    pub fn render(&self) -> String {
        let h = &self.head;
        let mut out = String::new();
        let _ = writeln!(out, "session    {}", h.session);
        let _ = writeln!(out, "state      {}", if h.archived { "archived" } else { "live" });
        let _ = writeln!(out, "revision   {} ({} messages, {} revisions)", h.revision, h.message_count, self.revisions);
        let _ = writeln!(out, "labels     {}", labels_text(&h.labels));
        let _ = writeln!(out, "created    {} (seq {})", format_time_ms(h.created_at_ms), h.created_seq);
        let _ = writeln!(
            out,
            "updated    {} (seq {}, {} events)",
            format_time_ms(h.updated_at_ms),
            h.last_seq,
            h.stream_seq
        );
        if let Some(f) = &h.forked_from {
            let _ =
                writeln!(out, "forked     from {} at {} ({} messages)", f.session, f.revision.short(), f.message_count);
        }
        if !h.metadata.is_empty() {
            let _ = writeln!(out, "metadata   {}", preview(&h.metadata, 80));
        }
        for (name, value) in &self.host_state {
            let _ = writeln!(out, "host state {name} = {}", preview(value, 60));
        }
        if let Some(l) = &h.lease {
            let until = match l.released {
                true => "released".to_string(),
                false => format!("until {}", format_time_ms(l.expires_at_ms)),
            };
            let _ = writeln!(out, "lease      {} token {} {until}", l.owner, l.token);
        }
        for f in &self.forks {
            let _ = writeln!(out, "fork       {} took {} messages at {}", f.child, f.message_count, f.revision.short());
        }
        let _ = writeln!(out, "\nusage");
        if self.usage.is_empty() {
            let _ = writeln!(out, "  (none)");
        }
        for u in &self.usage {
            let _ = writeln!(
                out,
                "  {}/{}: {} turns, {} in, {} out, {} cache read, {} cache write",
                u.provider, u.model, u.turns, u.input, u.output, u.cache_read, u.cache_write
            );
        }
        let pending: Vec<_> = self.context.iter().filter(|c| c.state == ContextState::Pending).collect();
        let _ = writeln!(out, "\npending context ({} of {} entries)", pending.len(), self.context.len());
        for c in pending {
            let _ = writeln!(out, "  {} from {} (seq {})", c.key, c.source, c.appended_seq);
        }
        let _ = writeln!(out, "\nunsettled tools ({} of {} operations)", self.unsettled.len(), self.tool_ops);
        for op in &self.unsettled {
            let _ = writeln!(
                out,
                "  {} {} call {} (seq {}, {:?})",
                op.op_id, op.tool_name, op.call_id, op.call_seq, op.recovery
            );
        }
        out
    }

    /// The inspection as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "head": head_json(&self.head),
            "revisions": self.revisions,
            "usage": self.usage.iter().map(|u| json!({
                "provider": u.provider, "model": u.model, "turns": u.turns, "input": u.input, "output": u.output,
                "cache_read": u.cache_read, "cache_write": u.cache_write,
            })).collect::<Vec<_>>(),
            "context": self.context.iter().map(|c| json!({
                "key": c.key, "source": c.source, "content": c.content.to_hex(), "appended_seq": c.appended_seq,
                "state": match &c.state {
                    ContextState::Pending => json!("pending"),
                    ContextState::Applied { seq, turn_id } => json!({"applied": {"seq": seq, "turn_id": turn_id}}),
                },
            })).collect::<Vec<_>>(),
            "tool_ops": self.tool_ops,
            "unsettled": self.unsettled.iter().map(|op| json!({
                "op_id": op.op_id, "tool_name": op.tool_name, "call_id": op.call_id, "call_seq": op.call_seq,
                "args": op.args.to_hex(), "parent_op": op.parent_op, "turn_id": op.turn_id,
                "replay_safe": op.recovery == annal::Recovery::ReplaySafe,
                "settled": !matches!(op.state, ToolState::Prepared),
            })).collect::<Vec<_>>(),
            "forks": self.forks.iter().map(|f| json!({
                "child": f.child.to_string(), "revision": f.revision.to_hex(), "message_count": f.message_count,
                "seq": f.seq,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Up to `max_chars` of `bytes` as text on one line, or a size for binary bytes.
pub fn preview(bytes: &[u8], max_chars: usize) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
            if flat.chars().count() > max_chars {
                let mut s: String = flat.chars().take(max_chars.saturating_sub(1)).collect();
                s.push('…');
                s
            } else {
                flat
            }
        }
        Err(_) => format!("<{} binary>", human_bytes(bytes.len() as u64)),
    }
}

/// A page of a transcript, at the head or at `revision`.
pub fn transcript(
    reader: &Reader,
    session: SessionId,
    revision: Option<RevisionId>,
    page: PageRequest,
) -> Result<annal::TranscriptPage> {
    let view = reader.snapshot()?;
    if query::head(&view, &session)?.is_none() {
        return Err(not_found(&session));
    }
    let result = match revision {
        None => query::transcript(&view, reader.limits(), &session, page),
        Some(r) => query::transcript_at(&view, reader.limits(), &session, &r, page),
    };
    result.map_err(|e| match e {
        annal::Error::Rejected(r) => CliError::usage(r.to_string()),
        other => other.into(),
    })
}

/// The transcript page as text.
pub fn render_transcript(p: &annal::TranscriptPage) -> String {
    let mut out = format!(
        "session {} revision {}: messages {}..{} of {}\n",
        p.session,
        p.revision.short(),
        p.offset,
        p.offset + p.messages.len() as u64,
        p.total
    );
    for m in &p.messages {
        let attachments = match m.message.attachments.len() {
            0 => String::new(),
            n => format!(" [+{n} attachment{}]", if n == 1 { "" } else { "s" }),
        };
        let _ = writeln!(
            out,
            "{:>5}  {:<9} {:<16} {}{attachments}",
            m.position,
            m.message.role.name(),
            m.message.content_type,
            preview(&m.message.body, 100)
        );
    }
    if p.has_more && !p.messages.is_empty() {
        let _ = writeln!(out, "… more from offset {}", p.offset + p.messages.len() as u64);
    }
    out
}

/// The transcript page as JSON, bodies as text or base64.
pub fn transcript_json(p: &annal::TranscriptPage) -> Value {
    json!({
        "session": p.session.to_string(),
        "revision": p.revision.to_hex(),
        "total": p.total,
        "offset": p.offset,
        "limit": p.limit,
        "has_more": p.has_more,
        "messages": p.messages.iter().map(|m| json!({
            "position": m.position,
            "content_id": m.content_id.to_hex(),
            "chain": m.chain.to_hex(),
            "role": m.message.role.name(),
            "content_type": m.message.content_type,
            "body": crate::export::Bytes::of(&m.message.body),
            "attachments": m.message.attachments.iter().map(ContentId::to_hex).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// Which events `log` shows.
#[derive(Clone, Debug, Default)]
pub struct LogQuery {
    /// Only this session's events.
    pub session: Option<SessionId>,
    /// First global seq.
    pub from_seq: u64,
    /// Events at most (0: no limit).
    pub limit: u64,
    /// JSON Lines in the export schema instead of a table.
    pub json: bool,
}

fn summary(event: &Event) -> String {
    match event {
        Event::SessionCreated(e) => {
            let fork = e
                .forked_from
                .as_ref()
                .map_or(String::new(), |f| format!(" fork of {} at {} msgs,", f.session, f.message_count));
            let labels =
                if e.labels.is_empty() { String::new() } else { format!(", labels {}", labels_text(&e.labels)) };
            format!("{fork} {} msgs{labels} → {}", e.messages.len(), e.revision_after.short())
        }
        Event::TurnCommitted(e) => {
            let tokens: u64 = e.usage.iter().map(|u| u.input + u.output).sum();
            let ctx = if e.applied_context.is_empty() {
                String::new()
            } else {
                format!(", applies {}", e.applied_context.join(","))
            };
            let state = if e.state.is_empty() { String::new() } else { format!(", state {}", state_text(&e.state)) };
            format!(
                "{}: +{} msgs, {tokens} tokens{ctx}{state} → {}",
                e.turn_id,
                e.messages.len(),
                e.revision_after.short()
            )
        }
        Event::TranscriptRewritten(e) => format!(
            "{} {}..{} → {} msgs by {}: {} → {}",
            e.kind.name(),
            e.start,
            e.end,
            e.replacement.len(),
            e.actor,
            e.note,
            e.revision_after.short()
        ),
        Event::SessionArchived(e) => format!("reason: {}", e.reason),
        Event::SessionRevived(e) => format!("reason: {}", e.reason),
        Event::ContextAppended(e) => format!("{} from {} ({})", e.key, e.source, e.content.short()),
        Event::ToolCallRecorded(e) => format!("{} {} call {} ({:?})", e.op_id, e.tool_name, e.call_id, e.recovery),
        Event::ToolResultRecorded(e) => format!("{} {} ({})", e.op_id, e.outcome.name(), e.result.short()),
        Event::LabelsChanged(e) => {
            let set: Vec<String> = e.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
            set_and_remove(&set, e.remove.iter())
        }
        Event::MetadataSet(e) => format!("{} bytes", e.metadata.len()),
        Event::HostStateChanged(e) => state_text(&e.state),
        Event::LeaseAcquired(e) => format!("{} token {} until {}", e.owner, e.token, format_time_ms(e.expires_at_ms)),
        Event::LeaseReleased(e) => format!("token {}", e.token),
        Event::InputEnqueued(e) => {
            format!("{} for the {} ({})", e.input_id, e.kind.name().replace('_', " "), e.message.short())
        }
        Event::InputsClaimed(e) => {
            let target = match &e.target {
                annal::codec::ClaimTarget::Turn(t) => format!("turn {t}"),
                annal::codec::ClaimTarget::NextTurn => "the next turn".into(),
            };
            format!(
                "{} by {} (token {}) for {target} until {}",
                e.inputs.join(","),
                e.owner,
                e.token,
                format_time_ms(e.expires_at_ms)
            )
        }
        Event::ClaimAbandoned(e) => format!("claim {}", e.claim),
        Event::InputCancelled(e) => e.input_id.clone(),
        Event::SessionPurged(e) => format!("reason: {}, actor: {}", e.reason, e.actor),
        Event::Erased(e) => format!("erased ({} payload bytes)", e.payload_len),
    }
}

/// `set a=<id>,b=<id> remove c`.
fn state_text(state: &annal::codec::StateDelta) -> String {
    let set: Vec<String> = state.set.iter().map(|(k, v)| format!("{k}={}", v.short())).collect();
    set_and_remove(&set, state.remove.iter())
}

/// `set a=1,b=2 remove c`, each part only when it names something (`nothing` when
/// neither does).
fn set_and_remove<'a>(set: &[String], remove: impl Iterator<Item = &'a String>) -> String {
    let removed: Vec<&str> = remove.map(String::as_str).collect();
    let mut parts = Vec::new();
    if !set.is_empty() {
        parts.push(format!("set {}", set.join(",")));
    }
    if !removed.is_empty() {
        parts.push(format!("remove {}", removed.join(",")));
    }
    if parts.is_empty() {
        return "nothing".into();
    }
    parts.join(" ")
}

/// Writes decoded events to `out`.
pub fn log(reader: &Reader, q: &LogQuery, out: &mut dyn std::io::Write) -> Result<u64> {
    let view = reader.snapshot()?;
    let sessions: Vec<SessionId> = q.session.into_iter().collect();
    // An unknown session is an error before anything is written, the header included.
    for s in &sessions {
        if query::head(&view, s)?.is_none() {
            return Err(not_found(s));
        }
    }
    let mut shown = 0u64;
    if !q.json {
        writeln!(
            out,
            "{:>6}  {:<23}  {:<36}  {:>6}  {:<19}  summary",
            "seq", "time (UTC)", "session", "stream", "kind"
        )?;
    }
    for_each_record(reader, &view, q.from_seq, &sessions, |record, hash| {
        if q.json {
            let line = export_line(&view, reader.limits(), record, hash)?;
            let text = serde_json::to_string(&line).map_err(|e| CliError::finding(e.to_string()))?;
            writeln!(out, "{text}")?;
        } else {
            writeln!(
                out,
                "{:>6}  {:<23}  {:<36}  {:>6}  {:<19}  {}",
                record.seq,
                format_time_ms(record.committed_at_ms),
                record.session.to_string(),
                record.stream_seq,
                record.event.kind().name(),
                summary(&record.event)
            )?;
        }
        shown += 1;
        Ok(q.limit == 0 || shown < q.limit)
    })?;
    Ok(shown)
}

/// What `stats` reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Records.
    pub events: u64,
    /// What purges and content collections reclaimed over the database's life.
    pub reclaimed: annal::Reclaimed,
    /// Records per kind.
    pub by_kind: BTreeMap<String, u64>,
    /// Records that did not decode (counted, not fatal).
    pub undecodable: u64,
    /// Bytes of encoded records.
    pub record_bytes: u64,
    /// Sessions (live and archived).
    pub sessions: u64,
    /// Stored content objects.
    pub content_objects: u64,
    /// Bytes of stored content objects.
    pub content_bytes: u64,
    /// Content references in events (message attachments included).
    pub content_refs: u64,
    /// Bytes the references would take if every reference stored its own copy.
    pub referenced_bytes: u64,
    /// The database files' sizes (the log file, its projections file and its journal).
    pub file_bytes: u64,
    /// The bytes the file system allocated to those files (`du`): less than their sizes
    /// where redb grew a file with `set_len` and has not written its end yet.
    pub allocated_bytes: u64,
    /// How each redb table uses the file.
    pub tables: Vec<TableStorage>,
    /// Rows and bytes (key plus value) of each projection table.
    pub projections: BTreeMap<String, (u64, u64)>,
    /// Why the projections file could not be read, when it exists but is unusable
    /// (truncated or not a database). Every read command then folds the projections
    /// from the log, as these statistics do; only the file's own table is not counted.
    pub projections_file_unusable: Option<String>,
    /// How the stored content objects compress, per content type: a message object's
    /// `content_type`, or `(other objects)` for objects that are not messages
    /// (attachments, context, tool arguments and results, state values), or
    /// `(undecodable)` for an object whose stored bytes do not decode.
    pub by_content_type: BTreeMap<String, Compression>,
}

/// How a set of content objects is stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compression {
    /// Objects.
    pub objects: u64,
    /// Of them, stored compressed.
    pub compressed_objects: u64,
    /// Of the compressed ones, stored as zstd frames (the others are lz4 blocks).
    pub zstd_objects: u64,
    /// Bytes of their canonical encodings (what their ids hash).
    pub canonical_bytes: u64,
    /// Bytes as stored.
    pub stored_bytes: u64,
}

impl Compression {
    /// Stored bytes per canonical byte (1.0 when nothing compressed; 0 for no bytes).
    pub fn ratio(&self) -> f64 {
        match self.canonical_bytes {
            0 => 0.0,
            n => self.stored_bytes as f64 / n as f64,
        }
    }

    fn add(&mut self, other: &Compression) {
        self.objects += other.objects;
        self.compressed_objects += other.compressed_objects;
        self.zstd_objects += other.zstd_objects;
        self.canonical_bytes += other.canonical_bytes;
        self.stored_bytes += other.stored_bytes;
    }

    fn to_json(&self) -> Value {
        json!({
            "objects": self.objects,
            "compressed_objects": self.compressed_objects,
            "zstd_objects": self.zstd_objects,
            "canonical_bytes": self.canonical_bytes,
            "stored_bytes": self.stored_bytes,
            "ratio": self.ratio(),
        })
    }
}

/// How one redb table uses the file, from redb's own table statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableStorage {
    /// The redb table.
    pub name: String,
    /// Entries.
    pub entries: u64,
    /// Height of its B-tree.
    pub tree_height: u32,
    /// Leaf pages.
    pub leaf_pages: u64,
    /// Branch pages.
    pub branch_pages: u64,
    /// Bytes of keys and values.
    pub stored_bytes: u64,
    /// Bytes of page and entry metadata.
    pub metadata_bytes: u64,
    /// Bytes allocated to the table's pages but holding nothing.
    pub fragmented_bytes: u64,
}

impl TableStorage {
    fn of(name: &str, table: &impl ReadableTableMetadata) -> Result<TableStorage> {
        let stats = table.stats().map_err(redb::Error::from)?;
        Ok(TableStorage {
            name: name.to_string(),
            entries: table.len().map_err(redb::Error::from)?,
            tree_height: stats.tree_height(),
            leaf_pages: stats.leaf_pages(),
            branch_pages: stats.branch_pages(),
            stored_bytes: stats.stored_bytes(),
            metadata_bytes: stats.metadata_bytes(),
            fragmented_bytes: stats.fragmented_bytes(),
        })
    }

    /// Bytes the table's pages take in the file.
    pub fn allocated_bytes(&self) -> u64 {
        self.stored_bytes + self.metadata_bytes + self.fragmented_bytes
    }
}

impl Stats {
    /// Bytes deduplication saved: referenced bytes minus the bytes stored once.
    pub fn dedup_saved_bytes(&self) -> u64 {
        self.referenced_bytes.saturating_sub(self.content_bytes)
    }

    /// Logical bytes: records plus every referenced copy of content.
    pub fn logical_bytes(&self) -> u64 {
        self.record_bytes + self.referenced_bytes
    }

    /// Every content object's compression together.
    pub fn compression(&self) -> Compression {
        let mut all = Compression::default();
        for c in self.by_content_type.values() {
            all.add(c);
        }
        all
    }

    /// File bytes per logical byte.
    pub fn bytes_per_logical_byte(&self) -> f64 {
        self.file_bytes as f64 / (self.logical_bytes().max(1)) as f64
    }

    /// Sessions the log holds a purge's tombstone of (`SessionPurged` records), whichever
    /// file purged them: an imported copy of a purged database counts them too, while
    /// [`Stats::reclaimed`] counts the purges this file ran.
    pub fn sessions_purged(&self) -> u64 {
        self.by_kind.get(annal::codec::EventKind::SessionPurged.name()).copied().unwrap_or(0)
    }

    /// The statistics as text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ =
            writeln!(out, "events            {:>12}   ({} of records)", self.events, human_bytes(self.record_bytes));
        for (kind, n) in &self.by_kind {
            let _ = writeln!(out, "  {kind:<19} {n:>10}");
        }
        if self.undecodable > 0 {
            let _ = writeln!(out, "  {:<19} {:>10}", "(undecodable)", self.undecodable);
        }
        let _ = writeln!(
            out,
            "sessions          {:>12}   (live and archived; {} purged)",
            self.sessions,
            self.sessions_purged()
        );
        let _ = writeln!(
            out,
            "content objects   {:>12}   ({} stored once)",
            self.content_objects,
            human_bytes(self.content_bytes)
        );
        let _ = writeln!(
            out,
            "content refs      {:>12}   ({} if each kept its own copy)",
            self.content_refs,
            human_bytes(self.referenced_bytes)
        );
        let _ = writeln!(out, "dedup saved       {:>12}", human_bytes(self.dedup_saved_bytes()));
        let _ = writeln!(out, "logical bytes     {:>12}", human_bytes(self.logical_bytes()));
        let _ = writeln!(
            out,
            "file size         {:>12}   ({} allocated on disk)",
            human_bytes(self.file_bytes),
            human_bytes(self.allocated_bytes)
        );
        let r = &self.reclaimed;
        let _ = writeln!(
            out,
            "reclaimed         {:>12}   ({} sessions purged, {} records erased, {} content objects removed)",
            human_bytes(r.bytes),
            r.sessions,
            r.records,
            r.objects
        );
        let _ = writeln!(out, "bytes per logical byte  {:.2}", self.bytes_per_logical_byte());
        let all = self.compression();
        let _ = writeln!(
            out,
            "compression       {:>12.2}   ({} canonical stored in {}; {} of {} objects compressed, {} of them zstd)",
            all.ratio(),
            human_bytes(all.canonical_bytes),
            human_bytes(all.stored_bytes),
            all.compressed_objects,
            all.objects,
            all.zstd_objects
        );
        let _ = writeln!(
            out,
            "  {:<28} {:>9} {:>10} {:>10} {:>10} {:>6}",
            "content type", "objects", "compressed", "canonical", "stored", "ratio"
        );
        for (content_type, c) in &self.by_content_type {
            let _ = writeln!(
                out,
                "  {:<28} {:>9} {:>10} {:>10} {:>10} {:>6.2}",
                content_type,
                c.objects,
                c.compressed_objects,
                human_bytes(c.canonical_bytes),
                human_bytes(c.stored_bytes),
                c.ratio()
            );
        }
        let _ = writeln!(
            out,
            "{:<13} {:>10} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10}",
            "redb table", "entries", "height", "leaves", "branches", "stored", "metadata", "fragmented"
        );
        for t in &self.tables {
            let _ = writeln!(
                out,
                "{:<13} {:>10} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10}",
                t.name,
                t.entries,
                t.tree_height,
                t.leaf_pages,
                t.branch_pages,
                human_bytes(t.stored_bytes),
                human_bytes(t.metadata_bytes),
                human_bytes(t.fragmented_bytes)
            );
        }
        if let Some(why) = &self.projections_file_unusable {
            let _ = writeln!(
                out,
                "projections file unusable, not counted above ({why}); the rows below are folded from the log"
            );
        }
        let _ = writeln!(out, "{:<19} {:>10} {:>10}", "projection table", "rows", "bytes");
        for (name, (rows, bytes)) in &self.projections {
            let _ = writeln!(out, "{name:<19} {rows:>10} {:>10}", human_bytes(*bytes));
        }
        out
    }

    /// The statistics as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "events": self.events,
            "by_kind": self.by_kind,
            "undecodable": self.undecodable,
            "record_bytes": self.record_bytes,
            "sessions": self.sessions,
            "sessions_purged": self.sessions_purged(),
            "content_objects": self.content_objects,
            "content_bytes": self.content_bytes,
            "content_refs": self.content_refs,
            "referenced_bytes": self.referenced_bytes,
            "dedup_saved_bytes": self.dedup_saved_bytes(),
            "logical_bytes": self.logical_bytes(),
            "file_bytes": self.file_bytes,
            "allocated_bytes": self.allocated_bytes,
            "reclaimed": {
                "sessions_purged": self.reclaimed.sessions,
                "records_erased": self.reclaimed.records,
                "content_objects": self.reclaimed.objects,
                "content_bytes": self.reclaimed.bytes,
            },
            "bytes_per_logical_byte": self.bytes_per_logical_byte(),
            "compression": {
                "all": self.compression().to_json(),
                "by_content_type": self.by_content_type.iter()
                    .map(|(t, c)| (t.clone(), c.to_json()))
                    .collect::<serde_json::Map<_, _>>(),
            },
            "tables": self.tables.iter().map(|t| json!({
                "name": t.name,
                "entries": t.entries,
                "tree_height": t.tree_height,
                "leaf_pages": t.leaf_pages,
                "branch_pages": t.branch_pages,
                "stored_bytes": t.stored_bytes,
                "metadata_bytes": t.metadata_bytes,
                "fragmented_bytes": t.fragmented_bytes,
            })).collect::<Vec<_>>(),
            "projections": self.projections.iter().map(|(name, (rows, bytes))| {
                (name.clone(), json!({"rows": rows, "bytes": bytes}))
            }).collect::<serde_json::Map<_, _>>(),
            "projections_file_unusable": self.projections_file_unusable,
        })
    }
}

/// Counts events, content and bytes of the database at `path` (the log file, its
/// projections file and its journal, whose records count as the log's).
pub fn stats(reader: &Reader, path: &Path) -> Result<Stats> {
    let view = reader.snapshot()?;
    let txn = view.log();
    let limits = reader.limits();
    let projections_path = annal::projections_path(path);
    let mut s = Stats {
        file_bytes: annal::database_files(path).iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum(),
        allocated_bytes: {
            use std::os::unix::fs::MetadataExt;
            let files = annal::database_files(path);
            files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.blocks() * 512).sum()
        },
        reclaimed: annal::Reclaimed::read(txn)?,
        ..Stats::default()
    };
    for kind in EventKind::ALL {
        s.by_kind.insert(kind.name().to_string(), 0);
    }
    let content = ContentReader::open(txn)?;
    let mut sizes: HashMap<ContentId, u64> = HashMap::new();
    let mut attachments: HashMap<ContentId, Vec<ContentId>> = HashMap::new();
    // The log file's rows, then those the journal holds past them.
    for entry in content.iter()? {
        let (_, row) = entry?;
        count_content_row(&mut s, &mut sizes, &mut attachments, &row, limits);
    }
    for (_, _, row) in view.journalled_rows() {
        count_content_row(&mut s, &mut sizes, &mut attachments, row, limits);
    }
    let log = txn.open_table(LOG).map_err(redb::Error::from)?;
    for entry in log.iter().map_err(redb::Error::from)? {
        let (_, v) = entry.map_err(redb::Error::from)?;
        count_record(&mut s, &sizes, &attachments, v.value(), limits);
    }
    for (_, record, _) in view.journalled_rows() {
        count_record(&mut s, &sizes, &attachments, record, limits);
    }
    s.sessions = annal::tables::session_count(&view)?;
    let meta = txn.open_table(META).map_err(redb::Error::from)?;
    s.tables = vec![TableStorage::of(LOG.name(), &log)?];
    if let Ok(pieces) = txn.open_table(PIECES) {
        s.tables.push(TableStorage::of(PIECES.name(), &pieces)?);
    }
    // The whole content rows of a file written by an earlier format, if it has them.
    if let Ok(whole) = txn.open_table(CONTENT) {
        s.tables.push(TableStorage::of(CONTENT.name(), &whole)?);
    }
    // The ids listed beside the content rows (absent in a file of an earlier format).
    if let Ok(ids) = txn.open_table(annal::tables::CONTENT_IDS) {
        s.tables.push(TableStorage::of(annal::tables::CONTENT_IDS.name(), &ids)?);
    }
    s.tables.push(TableStorage::of(META.name(), &meta)?);
    // An empty file is unusable too (as `verify --deep` finds): no database opens there.
    if projections_path.exists() {
        match projections_table(&projections_path) {
            Ok(Some(table)) => s.tables.push(table),
            Ok(None) => {}
            Err(e) => s.projections_file_unusable = Some(format!("{}: {e}", projections_path.display())),
        }
    }
    for t in annal::Table::ALL {
        let mut row = (0u64, 0u64);
        view.scan(t, &[], |k, v| {
            row.0 += 1;
            row.1 += (k.len() + v.len()) as u64;
            Ok(true)
        })?;
        s.projections.insert(t.name().to_string(), row);
    }
    Ok(s)
}

/// The storage of the projections table of the projections file at `path` (`None`
/// when the file has none yet), or why the file cannot be read.
fn projections_table(path: &Path) -> std::result::Result<Option<TableStorage>, String> {
    crate::with_projections_table(path, annal::reader::READER_CACHE_BYTES, |table| {
        TableStorage::of(PROJECTIONS.name(), table).map_err(|e| e.to_string())
    })
}

/// Counts one content row's objects into `s`.
fn count_content_row(
    s: &mut Stats,
    sizes: &mut HashMap<ContentId, u64>,
    attachments: &mut HashMap<ContentId, Vec<ContentId>>,
    row: &[u8],
    limits: &annal::Limits,
) {
    for object in annal::codec::content::entries(row, limits.message_object_bytes_max()) {
        let Ok(object) = object else { break };
        sizes.insert(object.id, object.stored.len() as u64);
        s.content_objects += 1;
        s.content_bytes += object.stored.len() as u64;
        let max = limits.message_object_bytes_max();
        let compressed = object.encoding != annal::codec::content::ENCODING_RAW;
        let (content_type, canonical_bytes) = match object.canonical(max) {
            Ok(canonical) => match annal::codec::decode_message(&canonical, max) {
                Ok(m) => {
                    let content_type = m.content_type.clone();
                    if !m.attachments.is_empty() {
                        attachments.insert(object.id, m.attachments);
                    }
                    (content_type, canonical.len() as u64)
                }
                Err(_) => ("(other objects)".to_string(), canonical.len() as u64),
            },
            Err(_) => ("(undecodable)".to_string(), object.stored.len() as u64),
        };
        let c = s.by_content_type.entry(content_type).or_default();
        c.objects += 1;
        c.compressed_objects += u64::from(compressed);
        c.zstd_objects += u64::from(object.encoding == annal::codec::content::ENCODING_ZSTD);
        c.canonical_bytes += canonical_bytes;
        c.stored_bytes += object.stored.len() as u64;
    }
}

/// Counts one record, and the content it refers to, into `s`.
fn count_record(
    s: &mut Stats,
    sizes: &HashMap<ContentId, u64>,
    attachments: &HashMap<ContentId, Vec<ContentId>>,
    bytes: &[u8],
    limits: &annal::Limits,
) {
    s.events += 1;
    s.record_bytes += bytes.len() as u64;
    let Ok(header) = decode_header(bytes, limits.record_bytes_max) else {
        s.undecodable += 1;
        return;
    };
    *s.by_kind.entry(header.kind.name().to_string()).or_default() += 1;
    let Ok(decoded) = annal::codec::decode_record(bytes, limits.record_bytes_max) else { return };
    let messages = matches!(
        decoded.record.event,
        Event::SessionCreated(_) | Event::TurnCommitted(_) | Event::TranscriptRewritten(_)
    );
    for id in decoded.record.event.content_refs() {
        let mut ids = vec![id];
        if messages {
            ids.extend(attachments.get(&id).into_iter().flatten().copied());
        }
        for i in ids {
            s.content_refs += 1;
            s.referenced_bytes += sizes.get(&i).copied().unwrap_or(0);
        }
    }
}
