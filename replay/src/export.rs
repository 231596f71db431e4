//! `annal export` and `annal import`: JSON Lines, one event per line, content inlined.
//!
//! # Schema
//!
//! Every line is one object:
//!
//! ```text
//! {"seq":1,"session":"<uuid>","stream_seq":1,"committed_at_ms":1700000000000,
//!  "chain_hash":"<64 hex>","event":{"kind":"TurnCommitted", ...}}
//! ```
//!
//! `event` holds the fields of the event catalogue under their own names, with `kind`
//! naming the event. Ids and hashes are lower-case hex. Every byte field is either
//! `{"text":"..."}` (the bytes are valid UTF-8) or `{"base64":"..."}` (standard
//! alphabet, padded). Content ids are replaced by the content itself, with its id:
//!
//! - a message (`messages`, `replacement`): `{"id":..,"role":"user","content_type":..,
//!   "body":{"text":..},"attachments":[{"id":..,"bytes":{"base64":..}}]}`
//! - other content (`content`, `args`, `result`): `{"id":..,"bytes":{"text":..}}`
//!
//! A rewrite's kind is `{"type":"compaction"}` (or `edit`, `redaction`) or
//! `{"type":"restore","target":"<revision>"}`. Recovery is `replay_safe` or
//! `not_replay_safe`; a tool outcome is `ok`, `error` or `cancelled`. An erased record
//! of a purged session is `{"kind":"Erased","erased_kind":..,"schema_version":..,
//! "payload_len":..,"payload_digest":"<64 hex>"}`, and it imports as the same erased
//! record.
//!
//! # Round trip
//!
//! A full export imported into an empty database appends the same records in the same
//! order ([`annal::Engine::import`]): the same sequence numbers, stream sequences,
//! timestamps, revision ids and, under the same key, the same chain hashes. Exporting
//! the copy gives identical bytes. Import checks every content id and every chain hash
//! before writing anything; a chain that does not reproduce (another key, an edited
//! file) is refused unless `rechain` is set.
//!
//! # Session exports
//!
//! An export of selected sessions ([`export_sessions`], `annal export --session ID
//! [--ancestry]`) copies them into another database. Its first line is a header that
//! marks it as such and says what it holds, parents before forks:
//!
//! ```text
//! {"annal":"sessions","version":1,"ancestry":true,
//!  "sessions":[{"id":"<uuid>","events":12},{"id":"<uuid>","events":3}]}
//! ```
//!
//! Every other line is a record line as above, the source's `seq` and `chain_hash`
//! included (for reading; a copy assigns new ones). [`import`] of such a file copies the
//! sessions in with [`annal::Engine::copy_in`]: appended at the target's tip, whatever
//! else it holds; sessions it holds with the same events are reported as already
//! present; any other history of the same id is refused, as is a fork whose parent is
//! missing. A file whose lines do not match its header (cut short, or edited) is refused
//! before anything is written.

use crate::{open_reader, progress, CliError, Result};
use annal::codec::{encode_message, encode_record, ClaimTarget, InputKind, LogChain, Record};
use annal::query::{self, EventQuery};
use annal::{
    ChainHash, ContentId, Engine, Event, EventKind, ForkOrigin, Limits, MessageObject, Options, Reader, Recovery,
    RevisionId, Role, SessionId, ToolOutcome, Usage,
};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// A byte string: UTF-8 text as it is, anything else as base64.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Bytes {
    /// Valid UTF-8.
    #[serde(rename = "text")]
    Text(String),
    /// Any other bytes, standard base64 with padding.
    #[serde(rename = "base64")]
    Base64(String),
}

impl Bytes {
    /// The representation of `bytes`: text when they are UTF-8.
    pub fn of(bytes: &[u8]) -> Bytes {
        match std::str::from_utf8(bytes) {
            Ok(text) => Bytes::Text(text.to_string()),
            Err(_) => Bytes::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }

    /// The bytes.
    pub fn decode(&self) -> std::result::Result<Vec<u8>, String> {
        match self {
            Bytes::Text(t) => Ok(t.as_bytes().to_vec()),
            Bytes::Base64(b) => {
                base64::engine::general_purpose::STANDARD.decode(b).map_err(|e| format!("bad base64: {e}"))
            }
        }
    }
}

/// A content object that is not a message: its id and bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Blob {
    /// The content id, hex.
    pub id: String,
    /// The bytes.
    pub bytes: Bytes,
}

/// Host state changes, values inlined.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateJson {
    /// Entries set: name → value.
    pub set: BTreeMap<String, Blob>,
    /// Entry names removed.
    pub remove: BTreeSet<String>,
}

impl StateJson {
    /// Whether it changes nothing (then a turn's export line leaves it out).
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

/// A message object, inlined.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageJson {
    /// The content id of the message object, hex.
    pub id: String,
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The media type.
    pub content_type: String,
    /// The body.
    pub body: Bytes,
    /// Attachments, each a content object.
    pub attachments: Vec<Blob>,
}

/// Usage of one model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageJson {
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
}

/// Where a fork branched from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkJson {
    /// Parent session.
    pub session: String,
    /// Parent revision, hex.
    pub revision: String,
    /// Prefix length.
    pub message_count: u64,
}

/// Why a transcript was rewritten.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RewriteJson {
    /// An edit.
    Edit,
    /// A compaction.
    Compaction,
    /// A redaction.
    Redaction,
    /// A restore of `target`.
    Restore {
        /// The revision restored, hex.
        target: String,
    },
}

/// Whether a tool call may be re-run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryJson {
    /// Harmless to re-run.
    ReplaySafe,
    /// Could repeat a side effect.
    NotReplaySafe,
}

/// How a tool call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeJson {
    /// Succeeded.
    Ok,
    /// Failed.
    Error,
    /// Cancelled.
    Cancelled,
}

/// An event with its content inlined; `kind` names the event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
#[allow(missing_docs)]
pub enum EventJson {
    /// See [`annal::codec::SessionCreated`].
    SessionCreated {
        labels: BTreeMap<String, String>,
        metadata: Bytes,
        forked_from: Option<ForkJson>,
        messages: Vec<MessageJson>,
        revision_after: String,
    },
    /// See [`annal::codec::TurnCommitted`].
    TurnCommitted {
        turn_id: String,
        commit_hash: String,
        messages: Vec<MessageJson>,
        usage: Vec<UsageJson>,
        applied_context: Vec<String>,
        tool_ops: Vec<String>,
        run_id: Option<String>,
        revision_after: String,
        /// Absent in exports of turns that change no host state (and in older exports).
        #[serde(default, skip_serializing_if = "StateJson::is_empty")]
        state: StateJson,
        /// Absent in exports of turns that consume no queued input (and in older exports).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        inputs: Vec<String>,
    },
    /// See [`annal::codec::TranscriptRewritten`].
    TranscriptRewritten {
        parent_revision: String,
        start: u64,
        end: u64,
        replacement: Vec<MessageJson>,
        rewrite: RewriteJson,
        note: String,
        actor: String,
        revision_after: String,
    },
    /// See [`annal::codec::SessionArchived`].
    SessionArchived { reason: String },
    /// See [`annal::codec::SessionRevived`].
    SessionRevived { reason: String },
    /// See [`annal::codec::ContextAppended`].
    ContextAppended { key: String, content: Blob, source: String },
    /// See [`annal::codec::ToolCallRecorded`].
    ToolCallRecorded {
        op_id: String,
        call_id: String,
        tool_name: String,
        args: Blob,
        parent_op: Option<String>,
        turn_id: Option<String>,
        recovery: RecoveryJson,
    },
    /// See [`annal::codec::ToolResultRecorded`].
    ToolResultRecorded { op_id: String, outcome: OutcomeJson, result: Blob },
    /// See [`annal::codec::LabelsChanged`].
    LabelsChanged { set: BTreeMap<String, String>, remove: BTreeSet<String> },
    /// See [`annal::codec::MetadataSet`].
    MetadataSet { metadata: Bytes },
    /// See [`annal::codec::HostStateChanged`].
    HostStateChanged { state: StateJson },
    /// See [`annal::codec::LeaseAcquired`].
    LeaseAcquired { owner: String, token: u64, expires_at_ms: u64 },
    /// See [`annal::codec::LeaseReleased`].
    LeaseReleased { token: u64 },
    /// See [`annal::codec::InputEnqueued`].
    InputEnqueued { input_id: String, message: MessageJson, input_kind: InputKind },
    /// See [`annal::codec::InputsClaimed`].
    InputsClaimed { owner: String, token: u64, target: ClaimTarget, inputs: Vec<String>, expires_at_ms: u64 },
    /// See [`annal::codec::ClaimAbandoned`].
    ClaimAbandoned { claim: u64 },
    /// See [`annal::codec::InputCancelled`].
    InputCancelled { input_id: String },
    /// See [`annal::codec::SessionPurged`].
    SessionPurged { reason: String, actor: String, with_ancestor: Option<String> },
    /// An erased record of a purged session (see [`annal::codec::Erased`]): the kind,
    /// schema version and payload length of the event that was there, and its payload
    /// digest (hex). It is imported as the same erased record, so the chain reproduces.
    Erased { erased_kind: String, schema_version: u16, payload_len: u32, payload_digest: String },
}

/// One line of an export.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportLine {
    /// Global sequence number.
    pub seq: u64,
    /// Session id, UUID form.
    pub session: String,
    /// Per-session sequence number.
    pub stream_seq: u64,
    /// Commit time, unix ms.
    pub committed_at_ms: u64,
    /// The record's chain hash `h(seq)` in the source database, hex.
    pub chain_hash: String,
    /// The event.
    pub event: EventJson,
}

/// Reads content objects for the export, verified against their ids.
struct ContentSource<'a> {
    txn: &'a annal::View,
    limits: &'a Limits,
}

impl ContentSource<'_> {
    fn bytes(&self, id: &ContentId) -> Result<Vec<u8>> {
        query::content(self.txn, self.limits, id)?
            .ok_or_else(|| CliError::finding(format!("content {id}: missing (cannot export)")))
    }

    fn blob(&self, id: &ContentId) -> Result<Blob> {
        Ok(Blob { id: id.to_hex(), bytes: Bytes::of(&self.bytes(id)?) })
    }

    fn state(&self, delta: &annal::codec::StateDelta) -> Result<StateJson> {
        let set = delta.set.iter().map(|(k, id)| Ok((k.clone(), self.blob(id)?))).collect::<Result<_>>()?;
        Ok(StateJson { set, remove: delta.remove.clone() })
    }

    fn message(&self, id: &ContentId) -> Result<MessageJson> {
        let bytes = self.bytes(id)?;
        let m = annal::codec::decode_message(&bytes, self.limits.message_object_bytes_max())
            .map_err(|e| CliError::finding(format!("content {id}: not a message object: {e}")))?;
        Ok(MessageJson {
            id: id.to_hex(),
            role: m.role.name().to_string(),
            content_type: m.content_type,
            body: Bytes::of(&m.body),
            attachments: m.attachments.iter().map(|a| self.blob(a)).collect::<Result<_>>()?,
        })
    }

    fn messages(&self, ids: &[ContentId]) -> Result<Vec<MessageJson>> {
        ids.iter().map(|id| self.message(id)).collect()
    }
}

fn event_json(event: &Event, src: &ContentSource<'_>) -> Result<EventJson> {
    Ok(match event {
        Event::SessionCreated(e) => EventJson::SessionCreated {
            labels: e.labels.clone(),
            metadata: Bytes::of(&e.metadata),
            forked_from: e.forked_from.as_ref().map(|f| ForkJson {
                session: f.session.to_string(),
                revision: f.revision.to_hex(),
                message_count: f.message_count,
            }),
            messages: src.messages(&e.messages)?,
            revision_after: e.revision_after.to_hex(),
        },
        Event::TurnCommitted(e) => EventJson::TurnCommitted {
            turn_id: e.turn_id.clone(),
            commit_hash: e.commit_hash.to_hex(),
            messages: src.messages(&e.messages)?,
            usage: e
                .usage
                .iter()
                .map(|u| UsageJson {
                    provider: u.provider.clone(),
                    model: u.model.clone(),
                    input: u.input,
                    output: u.output,
                    cache_read: u.cache_read,
                    cache_write: u.cache_write,
                })
                .collect(),
            applied_context: e.applied_context.clone(),
            tool_ops: e.tool_ops.clone(),
            run_id: e.run_id.clone(),
            revision_after: e.revision_after.to_hex(),
            state: src.state(&e.state)?,
            inputs: e.inputs.clone(),
        },
        Event::TranscriptRewritten(e) => EventJson::TranscriptRewritten {
            parent_revision: e.parent_revision.to_hex(),
            start: e.start,
            end: e.end,
            replacement: src.messages(&e.replacement)?,
            rewrite: match &e.kind {
                annal::codec::RewriteKind::Edit => RewriteJson::Edit,
                annal::codec::RewriteKind::Compaction => RewriteJson::Compaction,
                annal::codec::RewriteKind::Redaction => RewriteJson::Redaction,
                annal::codec::RewriteKind::Restore { target } => RewriteJson::Restore { target: target.to_hex() },
            },
            note: e.note.clone(),
            actor: e.actor.clone(),
            revision_after: e.revision_after.to_hex(),
        },
        Event::SessionArchived(e) => EventJson::SessionArchived { reason: e.reason.clone() },
        Event::SessionRevived(e) => EventJson::SessionRevived { reason: e.reason.clone() },
        Event::ContextAppended(e) => {
            EventJson::ContextAppended { key: e.key.clone(), content: src.blob(&e.content)?, source: e.source.clone() }
        }
        Event::ToolCallRecorded(e) => EventJson::ToolCallRecorded {
            op_id: e.op_id.clone(),
            call_id: e.call_id.clone(),
            tool_name: e.tool_name.clone(),
            args: src.blob(&e.args)?,
            parent_op: e.parent_op.clone(),
            turn_id: e.turn_id.clone(),
            recovery: match e.recovery {
                Recovery::ReplaySafe => RecoveryJson::ReplaySafe,
                Recovery::NotReplaySafe => RecoveryJson::NotReplaySafe,
            },
        },
        Event::ToolResultRecorded(e) => EventJson::ToolResultRecorded {
            op_id: e.op_id.clone(),
            outcome: match e.outcome {
                ToolOutcome::Ok => OutcomeJson::Ok,
                ToolOutcome::Error => OutcomeJson::Error,
                ToolOutcome::Cancelled => OutcomeJson::Cancelled,
            },
            result: src.blob(&e.result)?,
        },
        Event::LabelsChanged(e) => EventJson::LabelsChanged { set: e.set.clone(), remove: e.remove.clone() },
        Event::MetadataSet(e) => EventJson::MetadataSet { metadata: Bytes::of(&e.metadata) },
        Event::HostStateChanged(e) => EventJson::HostStateChanged { state: src.state(&e.state)? },
        Event::LeaseAcquired(e) => {
            EventJson::LeaseAcquired { owner: e.owner.clone(), token: e.token, expires_at_ms: e.expires_at_ms }
        }
        Event::LeaseReleased(e) => EventJson::LeaseReleased { token: e.token },
        Event::InputEnqueued(e) => EventJson::InputEnqueued {
            input_id: e.input_id.clone(),
            message: src.message(&e.message)?,
            input_kind: e.kind,
        },
        Event::InputsClaimed(e) => EventJson::InputsClaimed {
            owner: e.owner.clone(),
            token: e.token,
            target: e.target.clone(),
            inputs: e.inputs.clone(),
            expires_at_ms: e.expires_at_ms,
        },
        Event::ClaimAbandoned(e) => EventJson::ClaimAbandoned { claim: e.claim },
        Event::InputCancelled(e) => EventJson::InputCancelled { input_id: e.input_id.clone() },
        Event::SessionPurged(e) => EventJson::SessionPurged {
            reason: e.reason.clone(),
            actor: e.actor.clone(),
            with_ancestor: e.with_ancestor.map(|s| s.to_string()),
        },
        Event::Erased(e) => EventJson::Erased {
            erased_kind: e.kind.name().to_string(),
            schema_version: e.schema_version,
            payload_len: e.payload_len,
            payload_digest: annal::codec::hex(&e.payload_digest),
        },
    })
}

/// The export line of a stored record, content read from `txn`.
pub fn export_line(txn: &annal::View, limits: &Limits, record: &Record, chain_hash: &ChainHash) -> Result<ExportLine> {
    let src = ContentSource { txn, limits };
    Ok(ExportLine {
        seq: record.seq,
        session: record.session.to_string(),
        stream_seq: record.stream_seq,
        committed_at_ms: record.committed_at_ms,
        chain_hash: chain_hash.to_hex(),
        event: event_json(&record.event, &src)?,
    })
}

/// What an export wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportStats {
    /// Lines written.
    pub events: u64,
}

/// Events read per page while exporting.
const EXPORT_PAGE_EVENTS: u64 = 4096;

/// Calls `f` with every record of one snapshot in sequence order (chain-verified), and
/// its chain hash. Only records of `sessions` when it is not empty.
pub fn for_each_record(
    reader: &Reader,
    txn: &annal::View,
    from_seq: u64,
    sessions: &[SessionId],
    mut f: impl FnMut(&Record, &ChainHash) -> Result<bool>,
) -> Result<()> {
    let limits = reader.limits();
    for s in sessions {
        if query::head(txn, s)?.is_none() {
            return Err(CliError::usage(format!("session {s} not found")));
        }
    }
    let wanted: HashSet<SessionId> = sessions.iter().copied().collect();
    let mut q =
        EventQuery { from_seq: from_seq.max(1), max_events: EXPORT_PAGE_EVENTS, max_bytes: limits.page_bytes_max };
    loop {
        let page = query::events(txn, reader.chain(), limits, &q)?;
        for ev in &page.events {
            if (wanted.is_empty() || wanted.contains(&ev.record.session)) && !f(&ev.record, &ev.chain_hash)? {
                return Ok(());
            }
        }
        if !page.has_more || page.events.is_empty() {
            return Ok(());
        }
        q.from_seq = page.next_seq;
    }
}

/// Writes every event of the database at `path` to `out` as JSON Lines: a full export,
/// which [`import`] appends as it is. With `sessions`, only their events, for reading
/// (their sequence numbers are not dense, so [`import`] refuses it); [`export_sessions`]
/// writes sessions to copy into another database.
pub fn export(
    path: &Path,
    key: Option<[u8; 32]>,
    sessions: &[SessionId],
    out: &mut dyn Write,
    show_progress: bool,
) -> Result<ExportStats> {
    let reader = open_reader(path, key)?;
    let txn = reader.snapshot()?;
    let total = reader.tip()?.0;
    let bar = progress::bar(total, "export", show_progress);
    let mut events = 0u64;
    for_each_record(&reader, &txn, 1, sessions, |record, hash| {
        let line = export_line(&txn, reader.limits(), record, hash)?;
        let text = serde_json::to_string(&line).map_err(|e| CliError::finding(format!("seq {}: {e}", record.seq)))?;
        writeln!(out, "{text}")?;
        events += 1;
        if record.seq.is_multiple_of(progress::TICK_ITEMS) {
            bar.set_position(record.seq);
        }
        Ok(true)
    })?;
    bar.finish_and_clear();
    out.flush()?;
    Ok(ExportStats { events })
}

/// One session of a session export's header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderSession {
    /// The session id, UUID form.
    pub id: String,
    /// How many record lines of the file belong to it: its whole stream.
    pub events: u64,
}

/// The first line of a session export (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsHeader {
    /// Always [`SESSIONS_MARK`]: names the kind of file.
    pub annal: String,
    /// The version of the session export format, [`SESSIONS_VERSION`].
    pub version: u32,
    /// Whether the sessions the requested ones were forked from are included.
    pub ancestry: bool,
    /// Every session the file holds, in creation order (parents before forks).
    pub sessions: Vec<HeaderSession>,
}

/// The `annal` field of a session export's header.
pub const SESSIONS_MARK: &str = "sessions";

/// The session export format this binary writes and reads.
pub const SESSIONS_VERSION: u32 = 1;

/// Writes `sessions` of the database at `path` (and with `ancestry` the sessions they
/// were forked from, transitively) to `out` as a session export: the header line, then
/// every record of those sessions in sequence order, chain-verified, content inlined. It
/// reads the sessions' own records (through the stream index), not the whole log.
pub fn export_sessions(
    path: &Path,
    key: Option<[u8; 32]>,
    sessions: &[SessionId],
    ancestry: bool,
    out: &mut dyn Write,
    show_progress: bool,
) -> Result<ExportStats> {
    let reader = open_reader(path, key)?;
    let view = reader.snapshot()?;
    let not_found = |e: annal::Error| match e {
        annal::Error::Rejected(annal::Rejection::NotFound { session }) => {
            CliError::usage(format!("session {session} not found"))
        }
        other => other.into(),
    };
    let set = annal::copy::lineage(&view, sessions, ancestry).map_err(not_found)?;
    let events = annal::copy::session_events(&view, reader.chain(), reader.limits(), &set)?;
    let mut counts: BTreeMap<SessionId, u64> = BTreeMap::new();
    for e in &events {
        *counts.entry(e.record.session).or_default() += 1;
    }
    let header = SessionsHeader {
        annal: SESSIONS_MARK.into(),
        version: SESSIONS_VERSION,
        ancestry,
        sessions: set
            .iter()
            .map(|s| HeaderSession { id: s.to_string(), events: counts.get(s).copied().unwrap_or(0) })
            .collect(),
    };
    let text = serde_json::to_string(&header).map_err(|e| CliError::finding(e.to_string()))?;
    writeln!(out, "{text}")?;
    let bar = progress::bar(events.len() as u64, "export", show_progress);
    for (i, e) in events.iter().enumerate() {
        let line = export_line(&view, reader.limits(), &e.record, &e.chain_hash)?;
        let text =
            serde_json::to_string(&line).map_err(|err| CliError::finding(format!("seq {}: {err}", e.record.seq)))?;
        writeln!(out, "{text}")?;
        if (i as u64 + 1).is_multiple_of(progress::TICK_ITEMS) {
            bar.set_position(i as u64 + 1);
        }
    }
    bar.finish_and_clear();
    out.flush()?;
    Ok(ExportStats { events: events.len() as u64 })
}

/// A parsed import: records, the content they bring, and each record's line.
#[derive(Clone, Debug, Default)]
pub struct ParsedImport {
    /// The records, in file order.
    pub records: Vec<Record>,
    /// The chain hash each line claims.
    pub chain_hashes: Vec<ChainHash>,
    /// The 1-based line number of each record.
    pub lines: Vec<u64>,
    /// The canonical bytes of every content object, once each.
    pub content: Vec<Vec<u8>>,
    /// The header of a session export (its first line), or `None` for a full export.
    pub header: Option<SessionsHeader>,
}

fn parse_hex<T: std::str::FromStr>(text: &str, what: &str) -> std::result::Result<T, String> {
    text.parse().map_err(|_| format!("{what} {text:?} is not valid hex"))
}

struct ContentSink<'a> {
    seen: &'a mut HashSet<ContentId>,
    content: &'a mut Vec<Vec<u8>>,
}

impl ContentSink<'_> {
    fn keep(&mut self, claimed: &str, bytes: Vec<u8>) -> std::result::Result<ContentId, String> {
        let id: ContentId = parse_hex(claimed, "content id")?;
        let actual = annal::codec::content_id(&bytes);
        if actual != id {
            return Err(format!("content {claimed} does not match its bytes (they hash to {actual})"));
        }
        if self.seen.insert(id) {
            self.content.push(bytes);
        }
        Ok(id)
    }

    fn blob(&mut self, b: &Blob) -> std::result::Result<ContentId, String> {
        self.keep(&b.id, b.bytes.decode()?)
    }

    fn state(&mut self, s: &StateJson) -> std::result::Result<annal::codec::StateDelta, String> {
        let set =
            s.set.iter().map(|(k, b)| Ok((k.clone(), self.blob(b)?))).collect::<std::result::Result<_, String>>()?;
        Ok(annal::codec::StateDelta { set, remove: s.remove.clone() })
    }

    fn message(&mut self, m: &MessageJson) -> std::result::Result<ContentId, String> {
        let role = Role::from_name(&m.role).ok_or_else(|| format!("unknown role {:?}", m.role))?;
        let attachments = m.attachments.iter().map(|a| self.blob(a)).collect::<std::result::Result<_, _>>()?;
        let object = MessageObject { role, content_type: m.content_type.clone(), body: m.body.decode()?, attachments };
        let bytes = encode_message(&object, u64::MAX).map_err(|e| format!("message {}: {e}", m.id))?;
        self.keep(&m.id, bytes)
    }

    fn messages(&mut self, ms: &[MessageJson]) -> std::result::Result<Vec<ContentId>, String> {
        ms.iter().map(|m| self.message(m)).collect()
    }
}

fn event_of(json: &EventJson, sink: &mut ContentSink<'_>) -> std::result::Result<Event, String> {
    use annal::codec as c;
    Ok(match json {
        EventJson::SessionCreated { labels, metadata, forked_from, messages, revision_after } => {
            Event::SessionCreated(c::SessionCreated {
                labels: labels.clone(),
                metadata: metadata.decode()?,
                forked_from: match forked_from {
                    None => None,
                    Some(f) => Some(ForkOrigin {
                        session: f.session.parse().map_err(|e| format!("{e}"))?,
                        revision: parse_hex(&f.revision, "revision")?,
                        message_count: f.message_count,
                    }),
                },
                messages: sink.messages(messages)?,
                revision_after: parse_hex(revision_after, "revision")?,
            })
        }
        EventJson::TurnCommitted {
            turn_id,
            commit_hash,
            messages,
            usage,
            applied_context,
            tool_ops,
            run_id,
            revision_after,
            state,
            inputs,
        } => Event::TurnCommitted(c::TurnCommitted {
            turn_id: turn_id.clone(),
            commit_hash: parse_hex(commit_hash, "commit hash")?,
            messages: sink.messages(messages)?,
            usage: usage
                .iter()
                .map(|u| Usage {
                    provider: u.provider.clone(),
                    model: u.model.clone(),
                    input: u.input,
                    output: u.output,
                    cache_read: u.cache_read,
                    cache_write: u.cache_write,
                })
                .collect(),
            applied_context: applied_context.clone(),
            tool_ops: tool_ops.clone(),
            run_id: run_id.clone(),
            revision_after: parse_hex(revision_after, "revision")?,
            state: sink.state(state)?,
            inputs: inputs.clone(),
        }),
        EventJson::TranscriptRewritten {
            parent_revision,
            start,
            end,
            replacement,
            rewrite,
            note,
            actor,
            revision_after,
        } => Event::TranscriptRewritten(c::TranscriptRewritten {
            parent_revision: parse_hex(parent_revision, "revision")?,
            start: *start,
            end: *end,
            replacement: sink.messages(replacement)?,
            kind: match rewrite {
                RewriteJson::Edit => c::RewriteKind::Edit,
                RewriteJson::Compaction => c::RewriteKind::Compaction,
                RewriteJson::Redaction => c::RewriteKind::Redaction,
                RewriteJson::Restore { target } => {
                    c::RewriteKind::Restore { target: parse_hex::<RevisionId>(target, "revision")? }
                }
            },
            note: note.clone(),
            actor: actor.clone(),
            revision_after: parse_hex(revision_after, "revision")?,
        }),
        EventJson::SessionArchived { reason } => Event::SessionArchived(c::SessionArchived { reason: reason.clone() }),
        EventJson::SessionRevived { reason } => Event::SessionRevived(c::SessionRevived { reason: reason.clone() }),
        EventJson::ContextAppended { key, content, source } => Event::ContextAppended(c::ContextAppended {
            key: key.clone(),
            content: sink.blob(content)?,
            source: source.clone(),
        }),
        EventJson::ToolCallRecorded { op_id, call_id, tool_name, args, parent_op, turn_id, recovery } => {
            Event::ToolCallRecorded(c::ToolCallRecorded {
                op_id: op_id.clone(),
                call_id: call_id.clone(),
                tool_name: tool_name.clone(),
                args: sink.blob(args)?,
                parent_op: parent_op.clone(),
                turn_id: turn_id.clone(),
                recovery: match recovery {
                    RecoveryJson::ReplaySafe => Recovery::ReplaySafe,
                    RecoveryJson::NotReplaySafe => Recovery::NotReplaySafe,
                },
            })
        }
        EventJson::ToolResultRecorded { op_id, outcome, result } => Event::ToolResultRecorded(c::ToolResultRecorded {
            op_id: op_id.clone(),
            outcome: match outcome {
                OutcomeJson::Ok => ToolOutcome::Ok,
                OutcomeJson::Error => ToolOutcome::Error,
                OutcomeJson::Cancelled => ToolOutcome::Cancelled,
            },
            result: sink.blob(result)?,
        }),
        EventJson::LabelsChanged { set, remove } => {
            Event::LabelsChanged(c::LabelsChanged { set: set.clone(), remove: remove.clone() })
        }
        EventJson::MetadataSet { metadata } => Event::MetadataSet(c::MetadataSet { metadata: metadata.decode()? }),
        EventJson::HostStateChanged { state } => {
            Event::HostStateChanged(c::HostStateChanged { state: sink.state(state)? })
        }
        EventJson::LeaseAcquired { owner, token, expires_at_ms } => Event::LeaseAcquired(c::LeaseAcquired {
            owner: owner.clone(),
            token: *token,
            expires_at_ms: *expires_at_ms,
        }),
        EventJson::LeaseReleased { token } => Event::LeaseReleased(c::LeaseReleased { token: *token }),
        EventJson::InputEnqueued { input_id, message, input_kind } => Event::InputEnqueued(c::InputEnqueued {
            input_id: input_id.clone(),
            message: sink.message(message)?,
            kind: *input_kind,
        }),
        EventJson::InputsClaimed { owner, token, target, inputs, expires_at_ms } => {
            Event::InputsClaimed(c::InputsClaimed {
                owner: owner.clone(),
                token: *token,
                target: target.clone(),
                inputs: inputs.clone(),
                expires_at_ms: *expires_at_ms,
            })
        }
        EventJson::ClaimAbandoned { claim } => Event::ClaimAbandoned(c::ClaimAbandoned { claim: *claim }),
        EventJson::InputCancelled { input_id } => {
            Event::InputCancelled(c::InputCancelled { input_id: input_id.clone() })
        }
        EventJson::SessionPurged { reason, actor, with_ancestor } => Event::SessionPurged(c::SessionPurged {
            reason: reason.clone(),
            actor: actor.clone(),
            with_ancestor: with_ancestor.as_deref().map(|s| parse_hex::<SessionId>(s, "session")).transpose()?,
        }),
        EventJson::Erased { erased_kind, schema_version, payload_len, payload_digest } => {
            let kind =
                EventKind::from_name(erased_kind).ok_or_else(|| format!("unknown event kind {erased_kind:?}"))?;
            let digest: ChainHash = parse_hex(payload_digest, "payload digest")?;
            if *schema_version > kind.current_version() || *schema_version < kind.oldest_version() {
                return Err(format!("{kind}: unsupported schema version {schema_version}"));
            }
            Event::Erased(c::Erased {
                kind,
                schema_version: *schema_version,
                payload_len: *payload_len,
                payload_digest: digest.0,
            })
        }
    })
}

/// The record of one export line; content goes to `sink`.
fn record_of(line: &ExportLine, sink: &mut ContentSink<'_>) -> std::result::Result<(Record, ChainHash), String> {
    let event = event_of(&line.event, sink)?;
    let record = Record {
        seq: line.seq,
        session: line.session.parse().map_err(|e| format!("{e}"))?,
        stream_seq: line.stream_seq,
        committed_at_ms: line.committed_at_ms,
        event,
    };
    Ok((record, parse_hex(&line.chain_hash, "chain hash")?))
}

/// Parses a whole export. The first malformed line is an error naming its number.
pub fn parse_import(input: &mut dyn BufRead) -> Result<ParsedImport> {
    let mut parsed = ParsedImport::default();
    let mut seen = HashSet::new();
    let mut text = String::new();
    let mut line_no = 0u64;
    let mut blank = None;
    loop {
        text.clear();
        let n = input.read_line(&mut text).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => CliError::finding(format!("line {}: not UTF-8", line_no + 1)),
            _ => CliError::usage(format!("reading line {}: {e}", line_no + 1)),
        })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let body = text.strip_suffix('\n').unwrap_or(&text);
        let body = body.strip_suffix('\r').unwrap_or(body);
        let malformed = |why: String| CliError::finding(format!("line {line_no}: {why}"));
        // Blank lines may end the file (an editor's or a shell's last newline); one
        // between events is damage.
        if body.trim().is_empty() {
            blank.get_or_insert(line_no);
            continue;
        }
        if let Some(blank) = blank {
            return Err(CliError::finding(format!("line {blank}: empty line")));
        }
        if line_no == 1 && is_header(body) {
            let header: SessionsHeader = serde_json::from_str(body).map_err(|e| malformed(e.to_string()))?;
            if header.annal != SESSIONS_MARK || header.version != SESSIONS_VERSION {
                return Err(malformed(format!(
                    "a header of kind {:?} version {}; this binary reads {SESSIONS_MARK:?} version {SESSIONS_VERSION}",
                    header.annal, header.version
                )));
            }
            parsed.header = Some(header);
            continue;
        }
        let line: ExportLine = serde_json::from_str(body).map_err(|e| malformed(e.to_string()))?;
        let mut sink = ContentSink { seen: &mut seen, content: &mut parsed.content };
        let (record, hash) = record_of(&line, &mut sink).map_err(malformed)?;
        parsed.records.push(record);
        parsed.chain_hashes.push(hash);
        parsed.lines.push(line_no);
    }
    Ok(parsed)
}

/// Whether a first line is a session export's header: an object with an `annal` field
/// (record lines never have one).
fn is_header(body: &str) -> bool {
    matches!(serde_json::from_str::<serde_json::Value>(body), Ok(serde_json::Value::Object(o)) if o.contains_key("annal"))
}

/// How to import.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// The chain key of the target database.
    pub key: Option<[u8; 32]>,
    /// Accept a chain that does not reproduce the exported chain hashes (for example an
    /// export from a keyed database into a plain one).
    pub rechain: bool,
}

/// What an import appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportReport {
    /// Records appended.
    pub records: u64,
    /// New content objects stored.
    pub content_objects: u64,
    /// The log tip after the import.
    pub tip_seq: u64,
    /// Whether every chain hash reproduced the exported one.
    pub chain_reproduced: bool,
}

/// Checks that the records follow `tip` densely, and which chain hashes reproduce.
fn check_sequence(parsed: &ParsedImport, tip: (u64, ChainHash), chain: &LogChain) -> Result<bool> {
    let (mut seq, mut prev) = tip;
    let mut reproduced = true;
    for ((record, claimed), line) in parsed.records.iter().zip(&parsed.chain_hashes).zip(&parsed.lines) {
        if record.seq != seq + 1 {
            return Err(CliError::finding(format!(
                "line {line}: seq {} does not follow seq {seq}: only a full export imports as it is, into a \
                 database whose tip it follows (to copy sessions into a database that holds others, export them \
                 with --session)",
                record.seq
            )));
        }
        let (_, hash) = encode_record(record, &prev, chain, Limits::default().record_bytes_max)
            .map_err(|e| CliError::finding(format!("line {line}: {e}")))?;
        reproduced &= hash == *claimed;
        seq = record.seq;
        prev = hash;
    }
    Ok(reproduced)
}

/// What [`import`] did, by the kind of file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Imported {
    /// A full export, appended as it is.
    Log(ImportReport),
    /// A session export, copied in.
    Sessions(annal::CopyOutcome),
}

impl Imported {
    /// The report for a human, one or more lines.
    pub fn render(&self) -> String {
        match self {
            Imported::Log(report) => format!(
                "imported {} records and {} content objects; tip seq {}; chain {}\n",
                report.records,
                report.content_objects,
                report.tip_seq,
                if report.chain_reproduced { "reproduced exactly" } else { "rewritten under the target's key" }
            ),
            Imported::Sessions(outcome) => {
                let mut text = format!(
                    "copied {} sessions ({} records, {} new content objects), {} already present; tip seq {}\n",
                    outcome.copied.len(),
                    outcome.records,
                    outcome.content_objects,
                    outcome.already_present.len(),
                    outcome.tip_seq
                );
                for s in &outcome.copied {
                    text.push_str(&format!("copied           {s}\n"));
                }
                for s in &outcome.already_present {
                    text.push_str(&format!("already present  {s}\n"));
                }
                text
            }
        }
    }
}

/// Checks that the records of a session export are what its header lists: the same
/// sessions, each with its count of events.
fn check_header(parsed: &ParsedImport, header: &SessionsHeader) -> Result<()> {
    let mut counts: Vec<(SessionId, u64)> = Vec::new();
    for r in &parsed.records {
        match counts.iter_mut().find(|(s, _)| *s == r.session) {
            Some((_, n)) => *n += 1,
            None => counts.push((r.session, 1)),
        }
    }
    let mut listed = Vec::with_capacity(header.sessions.len());
    for s in &header.sessions {
        let id: SessionId = s.id.parse().map_err(|e| CliError::finding(format!("line 1: session {:?}: {e}", s.id)))?;
        listed.push((id, s.events));
    }
    counts.sort();
    listed.sort();
    if counts != listed {
        return Err(CliError::finding(
            "the records do not match the header's sessions and event counts (the file was cut short or edited)",
        ));
    }
    Ok(())
}

/// Imports an export into the database at `path` (created if missing).
///
/// A full export is appended as it is: nothing is written unless every line parses,
/// every content id matches its bytes, the records follow the tip densely, the chain
/// reproduces (or `rechain`), and the engine accepts every record.
///
/// A session export (see the module docs) is copied in with
/// [`annal::Engine::copy_in`], whatever else the database holds: nothing is written
/// unless every line parses, every content id matches its bytes, the records match the
/// header, and the engine accepts the copy. `rechain` does not apply: a copy is always
/// chained under the target's key.
///
/// An input with no records (an empty file, or empty standard input) is a usage error, and
/// nothing is opened or created. An import that fails into a database that did not exist
/// removes every file of it that the import created.
pub fn import(path: &Path, input: &mut dyn BufRead, opts: &ImportOptions) -> Result<Imported> {
    let parsed = parse_import(input)?;
    if let Some(header) = &parsed.header {
        check_header(&parsed, header)?;
    }
    if parsed.records.is_empty() {
        return Err(CliError::usage("no records to import: the input holds no record lines"));
    }
    // An existing file must be a database (`crate::require_file`: an empty one is
    // refused, not made into a new database).
    if path.exists() {
        crate::require_file(path)?;
        return import_opened(path, parsed, opts);
    }
    // A database this import creates is removed again if it fails: every file of it
    // (the log file, its projections file, its journal) that was not there before.
    let absent: Vec<PathBuf> = annal::database_files(path).into_iter().filter(|f| !f.exists()).collect();
    let result = import_opened(path, parsed, opts);
    if result.is_err() {
        for file in &absent {
            let _ = std::fs::remove_file(file);
        }
    }
    result
}

/// Opens the database at `path` (created if missing), imports `parsed` into it and
/// closes it.
fn import_opened(path: &Path, parsed: ParsedImport, opts: &ImportOptions) -> Result<Imported> {
    let options = Options { chain_key: opts.key, ..Options::default() };
    let engine = Engine::open_with(path, options).map_err(|e| match e {
        annal::Error::Storage(s) => CliError::usage(format!("cannot open {}: {s}", path.display())),
        other => other.into(),
    })?;
    let result = match parsed.header {
        Some(_) => copy_into(&engine, parsed).map(Imported::Sessions),
        None => import_into(&engine, parsed, opts).map(Imported::Log),
    };
    let closed = engine.close();
    let imported = result?;
    closed?;
    Ok(imported)
}

fn import_into(engine: &Engine, parsed: ParsedImport, opts: &ImportOptions) -> Result<ImportReport> {
    let chain = opts.key.map_or_else(LogChain::plain, LogChain::keyed);
    let reproduced = check_sequence(&parsed, engine.tip()?, &chain)?;
    if !reproduced && !opts.rechain {
        return Err(CliError::finding(
            "the chain hashes do not reproduce (the export comes from a database with another key, or was \
             edited); pass --rechain to import with a new chain",
        ));
    }
    let lines: BTreeMap<u64, u64> = parsed.records.iter().zip(&parsed.lines).map(|(r, l)| (r.seq, *l)).collect();
    let stats = engine.import(parsed.records, parsed.content).map_err(|e| match &e {
        annal::Error::Rejected(annal::Rejection::InvalidImport { seq, reason }) => match lines.get(seq) {
            Some(line) => CliError::finding(format!("line {line} (seq {seq}): {reason}")),
            None => CliError::from(e.clone()),
        },
        _ => CliError::from(e.clone()),
    })?;
    Ok(ImportReport {
        records: stats.records,
        content_objects: stats.content_objects,
        tip_seq: stats.tip_seq,
        chain_reproduced: reproduced,
    })
}

fn copy_into(engine: &Engine, parsed: ParsedImport) -> Result<annal::CopyOutcome> {
    let lines: BTreeMap<u64, u64> = parsed.records.iter().zip(&parsed.lines).map(|(r, l)| (r.seq, *l)).collect();
    let export = annal::SessionExport { records: parsed.records, content: parsed.content };
    engine.copy_in(export).map_err(|e| match &e {
        annal::Error::Rejected(annal::Rejection::InvalidImport { seq, reason }) => match lines.get(seq) {
            Some(line) => CliError::finding(format!("line {line} (seq {seq}): {reason}")),
            None => CliError::from(e.clone()),
        },
        _ => CliError::from(e.clone()),
    })
}

/// The kind name of an export line's event.
pub fn kind_of(line: &ExportLine) -> EventKind {
    match line.event {
        EventJson::SessionCreated { .. } => EventKind::SessionCreated,
        EventJson::TurnCommitted { .. } => EventKind::TurnCommitted,
        EventJson::TranscriptRewritten { .. } => EventKind::TranscriptRewritten,
        EventJson::SessionArchived { .. } => EventKind::SessionArchived,
        EventJson::SessionRevived { .. } => EventKind::SessionRevived,
        EventJson::ContextAppended { .. } => EventKind::ContextAppended,
        EventJson::ToolCallRecorded { .. } => EventKind::ToolCallRecorded,
        EventJson::ToolResultRecorded { .. } => EventKind::ToolResultRecorded,
        EventJson::LabelsChanged { .. } => EventKind::LabelsChanged,
        EventJson::MetadataSet { .. } => EventKind::MetadataSet,
        EventJson::HostStateChanged { .. } => EventKind::HostStateChanged,
        EventJson::LeaseAcquired { .. } => EventKind::LeaseAcquired,
        EventJson::LeaseReleased { .. } => EventKind::LeaseReleased,
        EventJson::InputEnqueued { .. } => EventKind::InputEnqueued,
        EventJson::InputsClaimed { .. } => EventKind::InputsClaimed,
        EventJson::ClaimAbandoned { .. } => EventKind::ClaimAbandoned,
        EventJson::InputCancelled { .. } => EventKind::InputCancelled,
        EventJson::SessionPurged { .. } => EventKind::SessionPurged,
        EventJson::Erased { ref erased_kind, .. } => {
            EventKind::from_name(erased_kind).unwrap_or(EventKind::SessionPurged)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_prefer_text_and_fall_back_to_base64() {
        assert_eq!(Bytes::of(b"hi"), Bytes::Text("hi".into()));
        assert_eq!(Bytes::of(&[0xff, 0x00]), Bytes::Base64("/wA=".into()));
        assert_eq!(Bytes::of(&[0xff, 0x00]).decode().unwrap(), vec![0xff, 0x00]);
        assert_eq!(serde_json::to_string(&Bytes::of(b"x")).unwrap(), r#"{"text":"x"}"#);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let line = r#"{"seq":1,"session":"00000000000000000000000000000001","stream_seq":1,"committed_at_ms":0,
            "chain_hash":"00","event":{"kind":"SessionArchived","reason":"x","extra":1}}"#;
        assert!(serde_json::from_str::<ExportLine>(&line.replace('\n', "")).is_err());
        let ok = line.replace(",\"extra\":1", "");
        assert!(serde_json::from_str::<ExportLine>(&ok.replace('\n', "")).is_ok());
    }

    #[test]
    fn a_session_header_is_read_from_the_first_line_only() {
        let header = r#"{"annal":"sessions","version":1,"ancestry":false,"sessions":[]}"#;
        let parsed = parse_import(&mut format!("{header}\n").as_bytes()).unwrap();
        assert_eq!(parsed.header.unwrap().annal, SESSIONS_MARK);
        assert!(parsed.records.is_empty());
        assert!(parse_import(&mut "".as_bytes()).unwrap().header.is_none());

        let newer = header.replace("\"version\":1", "\"version\":2");
        let err = parse_import(&mut format!("{newer}\n").as_bytes()).unwrap_err();
        assert!(err.message.starts_with("line 1:") && err.message.contains("version 2"), "{}", err.message);
        let unknown = header.replace("\"ancestry\"", "\"extra\":0,\"ancestry\"");
        assert!(parse_import(&mut format!("{unknown}\n").as_bytes()).unwrap_err().message.starts_with("line 1:"));
        // A second header is not a record line.
        let twice = format!("{header}\n{header}\n");
        assert!(parse_import(&mut twice.as_bytes()).unwrap_err().message.starts_with("line 2:"));
    }

    #[test]
    fn blank_lines_may_end_an_export_but_not_split_it() {
        let header = r#"{"annal":"sessions","version":1,"ancestry":false,"sessions":[]}"#;
        let parsed = parse_import(&mut format!("{header}\n\n \r\n").as_bytes()).unwrap();
        assert!(parsed.header.is_some() && parsed.records.is_empty());
        let split = format!("{header}\n\n{header}\n");
        assert_eq!(parse_import(&mut split.as_bytes()).unwrap_err().message, "line 2: empty line");
    }

    #[test]
    fn a_malformed_line_names_its_number() {
        let text = "{\"seq\":1}\n";
        let err = parse_import(&mut text.as_bytes()).unwrap_err();
        assert!(err.message.starts_with("line 1:"), "{}", err.message);
    }
}
