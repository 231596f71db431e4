//! `annal verify`: check a database end to end and report every finding with its place.
//!
//! One read snapshot is checked by three threads at once. The walk reads the log in
//! sequence order; for each record: the global sequence is dense, the chain link from
//! the previous record holds (plain or keyed), the record decodes with a supported
//! schema version, its per-session stream sequence is dense, and the clock never goes
//! back. It hands the decoded records, in order, to the fold thread, where a turn's
//! commit hash recomputes and the engine's own `evolve` folds each record into scratch
//! state (the transcript fold, which recomputes every `revision_after`; with `deep`,
//! every fold). The third thread scans the content table in key order, hashes every
//! object and notes which ones decode as message objects. Then every content id the log
//! refers to must exist and hash to its id (message references: decode as messages, and
//! their attachments too), `session_log` must index exactly the records walked, the meta
//! tip must name the last record, and `--expect-tip` must match it. With `deep`, every
//! projection table is also compared byte for byte with the scratch fold.
//!
//! Every table is read sequentially, never by random lookups. Memory grows with the
//! number of content objects (about 50 bytes each) and records (about 40 bytes each),
//! plus the scratch fold.
//!
//! Verification keeps going after a finding wherever it can, and never panics on
//! damaged data: every decode is bounded and fallible, and a panic raised inside redb by
//! a damaged page ends only the phase that met it, as a `storage` finding.

use crate::{open_reader, progress, CliError, Result};
use annal::codec::{decode_message, decode_record, stored_chain_hash, verify_chain, DecodeError, LogChain};
use annal::query::{mem_digests, projection_digests};
use annal::tables::{self, meta_keys, CONTENT, LOG, META, SESSION_LOG};
use annal::{evolve, ChainHash, ContentId, Event, EventKind, Limits, MemStore, ProjectionSet, SessionId, Table};
use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::Path;

/// What to check.
#[derive(Clone, Debug, Default)]
pub struct VerifyOptions {
    /// The 32-byte key of a keyed chain.
    pub key: Option<[u8; 32]>,
    /// Also hash every content object and compare every projection table with a fold.
    pub deep: bool,
    /// The chain hash the last record must carry (detects tail truncation).
    pub expect_tip: Option<ChainHash>,
    /// Show a progress bar on a terminal.
    pub progress: bool,
}

/// One problem found, with its location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Records are missing: the next record after `expected - 1` is `found`.
    Gap {
        /// The first missing sequence number.
        expected: u64,
        /// The sequence number of the next record present.
        found: u64,
    },
    /// The stored chain hash does not follow from the previous record.
    ChainMismatch {
        /// The record.
        seq: u64,
    },
    /// The record's kind has a schema version this binary does not read.
    UnsupportedSchema {
        /// The record.
        seq: u64,
        /// Its kind.
        kind: EventKind,
        /// The version found.
        found: u16,
        /// The newest version supported.
        supported: u16,
    },
    /// The record does not decode.
    Undecodable {
        /// The record.
        seq: u64,
        /// The codec's reason.
        error: DecodeError,
    },
    /// The sequence number inside the record differs from its key.
    SeqMismatch {
        /// The key.
        seq: u64,
        /// The number inside the record.
        inner: u64,
    },
    /// A session's stream sequence is not dense.
    StreamGap {
        /// The record.
        seq: u64,
        /// The session.
        session: SessionId,
        /// The stream sequence expected.
        expected: u64,
        /// The stream sequence found.
        found: u64,
    },
    /// `session_log` disagrees with the log.
    SessionIndex {
        /// The session.
        session: SessionId,
        /// The stream sequence.
        stream_seq: u64,
        /// What is wrong.
        detail: String,
    },
    /// `committed_at` went back in time.
    ClockBackwards {
        /// The record.
        seq: u64,
        /// Its time.
        at_ms: u64,
        /// The previous record's time.
        previous_ms: u64,
    },
    /// A content id an event refers to is not stored.
    MissingContent {
        /// The first record referring to it.
        seq: u64,
        /// The id.
        id: ContentId,
    },
    /// A content object's bytes do not hash to its id.
    ContentHash {
        /// The first record referring to it, if any.
        seq: Option<u64>,
        /// The id.
        id: ContentId,
    },
    /// A message reference points at bytes that are not a message object.
    NotAMessage {
        /// The first record referring to it.
        seq: u64,
        /// The id.
        id: ContentId,
        /// The decoder's reason.
        detail: String,
    },
    /// A turn's commit hash does not recompute.
    CommitHash {
        /// The record.
        seq: u64,
    },
    /// The fold rejected the record, for example a `revision_after` that does not recompute.
    Fold {
        /// The record.
        seq: u64,
        /// The session.
        session: SessionId,
        /// The fold's reason.
        detail: String,
    },
    /// The meta table is missing something or disagrees with the log.
    Meta {
        /// The meta key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// The last record's chain hash differs from `--expect-tip`.
    ExpectedTip {
        /// What was expected.
        expected: ChainHash,
        /// The last record's stored hash (none for an empty log).
        actual: Option<ChainHash>,
        /// The last record's seq.
        seq: u64,
    },
    /// A stored projection row differs from the scratch fold.
    Projection {
        /// The table.
        table: &'static str,
        /// The first differing key, hex.
        key: String,
        /// How it differs.
        detail: &'static str,
    },
    /// The storage layer failed while reading.
    Storage {
        /// Where.
        location: String,
        /// The error.
        detail: String,
    },
}

impl Finding {
    /// Where the finding is, as shown in reports: `log seq 42`, `content <id>`, ...
    pub fn location(&self) -> String {
        match self {
            Finding::Gap { expected, .. } => format!("log seq {expected}"),
            Finding::ChainMismatch { seq }
            | Finding::UnsupportedSchema { seq, .. }
            | Finding::Undecodable { seq, .. }
            | Finding::SeqMismatch { seq, .. }
            | Finding::ClockBackwards { seq, .. }
            | Finding::CommitHash { seq } => format!("log seq {seq}"),
            Finding::StreamGap { seq, session, .. } | Finding::Fold { seq, session, .. } => {
                format!("log seq {seq} (session {session})")
            }
            Finding::SessionIndex { session, stream_seq, .. } => format!("session_log {session}/{stream_seq}"),
            Finding::MissingContent { id, .. } | Finding::ContentHash { id, .. } | Finding::NotAMessage { id, .. } => {
                format!("content {id}")
            }
            Finding::Meta { key, .. } => format!("meta {key}"),
            Finding::ExpectedTip { seq, .. } => format!("log tip (seq {seq})"),
            Finding::Projection { table, key, .. } => format!("projection {table} key {key}"),
            Finding::Storage { location, .. } => location.clone(),
        }
    }

    /// The log record the finding is about, if it is about one.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Finding::Gap { expected: seq, .. }
            | Finding::ChainMismatch { seq }
            | Finding::UnsupportedSchema { seq, .. }
            | Finding::Undecodable { seq, .. }
            | Finding::SeqMismatch { seq, .. }
            | Finding::StreamGap { seq, .. }
            | Finding::ClockBackwards { seq, .. }
            | Finding::MissingContent { seq, .. }
            | Finding::NotAMessage { seq, .. }
            | Finding::CommitHash { seq }
            | Finding::Fold { seq, .. } => Some(*seq),
            Finding::ContentHash { seq, .. } => *seq,
            _ => None,
        }
    }

    /// A short machine-readable name of the finding's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Finding::Gap { .. } => "gap",
            Finding::ChainMismatch { .. } => "chain_mismatch",
            Finding::UnsupportedSchema { .. } => "unsupported_schema",
            Finding::Undecodable { .. } => "undecodable",
            Finding::SeqMismatch { .. } => "seq_mismatch",
            Finding::StreamGap { .. } => "stream_gap",
            Finding::SessionIndex { .. } => "session_index",
            Finding::ClockBackwards { .. } => "clock_backwards",
            Finding::MissingContent { .. } => "missing_content",
            Finding::ContentHash { .. } => "content_hash",
            Finding::NotAMessage { .. } => "not_a_message",
            Finding::CommitHash { .. } => "commit_hash",
            Finding::Fold { .. } => "fold",
            Finding::Meta { .. } => "meta",
            Finding::ExpectedTip { .. } => "expected_tip",
            Finding::Projection { .. } => "projection",
            Finding::Storage { .. } => "storage",
        }
    }

    fn detail(&self) -> String {
        match self {
            Finding::Gap { expected, found } if *found == expected + 1 => {
                format!("record {expected} is missing (next record is {found})")
            }
            Finding::Gap { expected, found } => {
                format!("records {expected}..={} are missing (next record is {found})", found - 1)
            }
            Finding::ChainMismatch { .. } => "chain hash does not follow from the previous record".into(),
            Finding::UnsupportedSchema { kind, found, supported, .. } => {
                format!("{kind}: unsupported schema version {found} (this binary supports up to {supported})")
            }
            Finding::Undecodable { error, .. } => format!("does not decode: {error}"),
            Finding::SeqMismatch { inner, .. } => format!("record says seq {inner}"),
            Finding::StreamGap { expected, found, .. } => format!("stream seq {found}, expected {expected}"),
            Finding::SessionIndex { detail, .. } | Finding::Meta { detail, .. } => detail.clone(),
            Finding::ClockBackwards { at_ms, previous_ms, .. } => {
                format!("committed_at {at_ms} ms is before the previous record's {previous_ms} ms")
            }
            Finding::MissingContent { seq, .. } => format!("missing, referred to by log seq {seq}"),
            Finding::ContentHash { seq: Some(seq), .. } => {
                format!("bytes do not hash to the id (referred to by log seq {seq})")
            }
            Finding::ContentHash { seq: None, .. } => "bytes do not hash to the id".into(),
            Finding::NotAMessage { seq, detail, .. } => {
                format!("not a message object (referred to by log seq {seq}): {detail}")
            }
            Finding::CommitHash { .. } => "turn commit hash does not recompute".into(),
            Finding::Fold { detail, .. } => detail.clone(),
            Finding::ExpectedTip { expected, actual: Some(a), .. } => {
                format!("last chain hash is {a}, expected {expected}")
            }
            Finding::ExpectedTip { expected, actual: None, .. } => format!("the log is empty, expected {expected}"),
            Finding::Projection { detail, .. } => (*detail).into(),
            Finding::Storage { detail, .. } => detail.clone(),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location(), self.detail())
    }
}

/// What a verification saw and found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Records walked.
    pub records: u64,
    /// Distinct sessions seen.
    pub sessions: u64,
    /// Distinct content objects checked.
    pub content_objects: u64,
    /// The last record's seq and stored chain hash.
    pub tip: Option<(u64, ChainHash)>,
    /// Whether the chain was checked in keyed mode.
    pub keyed: bool,
    /// With `deep`: projection tables compared, or why the comparison was skipped.
    pub deep: Option<std::result::Result<usize, String>>,
    /// Every finding, in the order found.
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// The report as text, one finding per line, then a summary line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            out.push_str(&format!("FINDING {f}\n"));
        }
        let chain = if self.keyed { "keyed chain" } else { "plain chain" };
        out.push_str(&format!(
            "checked {} records, {} sessions, {} content objects ({chain})",
            self.records, self.sessions, self.content_objects
        ));
        if let Some((seq, hash)) = self.tip {
            out.push_str(&format!("; tip seq {seq} {hash}"));
        }
        out.push('\n');
        match &self.deep {
            Some(Ok(n)) => out.push_str(&format!("deep: {n} projection tables compared with a fresh fold\n")),
            Some(Err(why)) => out.push_str(&format!("deep: comparison skipped: {why}\n")),
            None => {}
        }
        match self.findings.len() {
            0 => out.push_str("clean\n"),
            n => out.push_str(&format!("{n} finding{}\n", if n == 1 { "" } else { "s" })),
        }
        out
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let findings: Vec<_> = self
            .findings
            .iter()
            .map(|f| serde_json::json!({"kind": f.kind(), "location": f.location(), "detail": f.detail()}))
            .collect();
        serde_json::json!({
            "clean": self.is_clean(),
            "records": self.records,
            "sessions": self.sessions,
            "content_objects": self.content_objects,
            "keyed": self.keyed,
            "tip": self.tip.map(|(seq, h)| serde_json::json!({"seq": seq, "chain_hash": h.to_hex()})),
            "deep": self.deep.as_ref().map(|d| match d {
                Ok(n) => serde_json::json!({"tables": n}),
                Err(why) => serde_json::json!({"skipped": why}),
            }),
            "findings": findings,
        })
    }
}

/// Verifies the database at `path`, read-only (works beside a live writer).
pub fn verify(path: &Path, opts: &VerifyOptions) -> Result<VerifyReport> {
    let reader = open_reader(path, opts.key)?;
    let txn = reader.snapshot()?;
    verify_snapshot(&txn, &Limits::default(), opts)
}

/// Runs one phase of verification. redb panics on some damaged pages; such a panic
/// becomes a storage finding at `location` instead of ending the process.
fn guarded<T>(location: &str, f: impl FnOnce() -> T) -> std::result::Result<T, Finding> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        storage(location, format!("the storage layer panicked: {}", annal::error::panic_message(panic.as_ref())))
    })
}

fn storage(location: &str, e: impl fmt::Display) -> Finding {
    Finding::Storage { location: location.to_string(), detail: e.to_string() }
}

/// Checks the chain key against the one the file recognises. A keyed database without a
/// key, or a key for a plain one, is a usage error.
fn check_key(txn: &ReadTransaction, chain: &LogChain) -> Result<()> {
    let meta = txn.open_table(META).map_err(|e| CliError::usage(format!("not an annal database: {e}")))?;
    let stored = meta.get(meta_keys::KEY_CHECK).map_err(|e| CliError::finding(format!("meta: {e}")))?;
    match (stored.map(|g| g.value().to_vec()), chain.key_check()) {
        (None, None) => Ok(()),
        (Some(_), None) => Err(CliError::usage("the database has a keyed chain: pass --key-file")),
        (None, Some(_)) => Err(CliError::usage("the database has a plain chain: verify it without --key-file")),
        (Some(s), Some(k)) if s[..] != k[..] => Err(CliError::usage("the key does not match the database's key")),
        _ => Ok(()),
    }
}

/// Verifies one read snapshot. Errors only for usage problems (wrong key, not an annal
/// database); everything wrong with the data is a finding in the report.
pub fn verify_snapshot(txn: &ReadTransaction, limits: &Limits, opts: &VerifyOptions) -> Result<VerifyReport> {
    let chain = opts.key.map_or_else(LogChain::plain, LogChain::keyed);
    let mut walk = Walk::new(txn, limits, chain.clone(), opts)?;
    match guarded("table meta", || check_key(txn, &chain)) {
        Ok(checked) => checked?,
        Err(finding) => {
            walk.find(finding);
            return Ok(walk.report);
        }
    }
    let fold = Fold::new(walk.fold_set);
    let (batches, folded) = std::sync::mpsc::sync_channel::<Vec<Item>>(FOLD_QUEUE);
    let (walked, scan, fold) = std::thread::scope(|s| {
        let scan = s.spawn(|| guarded("table content", || scan_content(txn, limits)));
        let fold = s.spawn(move || fold.run(folded));
        let walked = guarded("table log", || walk.run(batches));
        (walked, scan.join(), fold.join())
    });
    if let Err(finding) = walked {
        walk.fold_failed = true;
        walk.find(finding);
    }
    match fold {
        Ok(fold) => walk.merge_fold(fold),
        Err(_) => {
            walk.fold_failed = true;
            walk.find(storage("fold", "the fold thread failed"));
        }
    }
    match scan {
        Ok(Ok(scan)) => {
            if let Err(finding) = guarded("table content", || walk.check_content(&scan)) {
                walk.find(finding);
            }
        }
        Ok(Err(finding)) => walk.find(finding),
        Err(_) => walk.find(storage("table content", "the content scan failed")),
    }
    if let Err(finding) = guarded("table session_log", || walk.check_session_index()) {
        walk.find(finding);
    }
    if let Err(finding) = guarded("table meta", || walk.check_meta()) {
        walk.find(finding);
    }
    if opts.deep {
        if let Err(finding) = guarded("projections", || walk.deep()) {
            walk.find(finding);
        }
    }
    let mut report = walk.report;
    report.keyed = opts.key.is_some();
    report.sessions = walk.streams.len() as u64;
    Ok(report)
}

/// Which stored bytes a content reference must be. `Message` sorts first, so among the
/// references to one id, sorted by (id, shape, seq), the first is the one that decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    Message,
    Bytes,
}

fn ref_shape(event: &Event) -> Shape {
    match event {
        Event::SessionCreated(_) | Event::TurnCommitted(_) | Event::TranscriptRewritten(_) => Shape::Message,
        _ => Shape::Bytes,
    }
}

/// What the content scan learnt about one stored object.
#[derive(Clone, Copy)]
struct Object {
    /// The bytes hash to the key.
    hash_ok: bool,
    /// The bytes decode as a message object.
    message: bool,
}

/// The result of scanning the content table once, in key order.
#[derive(Default)]
struct ContentScan {
    /// Every stored object, in key order (the order the scan reads them).
    objects: Vec<(ContentId, Object)>,
    /// Attachments of message objects that have any.
    attachments: HashMap<ContentId, Vec<ContentId>>,
    /// Objects whose bytes do not hash to their id, in key order.
    bad: Vec<ContentId>,
    /// Storage errors met on the way.
    findings: Vec<Finding>,
}

/// Scans every content object: hashes it, and notes whether it decodes as a message.
fn scan_content(txn: &ReadTransaction, limits: &Limits) -> ContentScan {
    let mut scan = ContentScan::default();
    let table = match txn.open_table(CONTENT) {
        Ok(t) => t,
        Err(e) => {
            scan.findings.push(storage("table content", e));
            return scan;
        }
    };
    scan.objects.reserve(table.len().unwrap_or(0) as usize);
    let iter = match table.iter() {
        Ok(i) => i,
        Err(e) => {
            scan.findings.push(storage("table content", e));
            return scan;
        }
    };
    let message_max = limits.content_bytes_max.saturating_add(1024);
    for entry in iter {
        let (k, v) = match entry {
            Ok(kv) => kv,
            Err(e) => {
                scan.findings.push(storage("table content", e));
                break;
            }
        };
        let (id, bytes) = (ContentId(k.value()), v.value());
        let hash_ok = annal::codec::content_id(bytes) == id;
        if !hash_ok {
            scan.bad.push(id);
        }
        let message = match decode_message(bytes, message_max) {
            Ok(m) => {
                if !m.attachments.is_empty() {
                    scan.attachments.insert(id, m.attachments);
                }
                true
            }
            Err(_) => false,
        };
        scan.objects.push((id, Object { hash_ok, message }));
    }
    scan
}

/// Content references gathered before the first reduction to one per id: a log with
/// fewer references is sorted once, at the end.
const REFS_REDUCE_MIN: usize = 1 << 22;

/// Sorts content references by (id, shape, seq) and keeps the first per id: the first
/// record that needs the id to be a message if any does, else the first record. Reducing
/// an already reduced list again keeps the same entries, so it can run at any time.
fn reduce_refs(refs: &mut Vec<(ContentId, Shape, u64)>) {
    refs.sort_unstable();
    refs.dedup_by(|later, first| later.0 == first.0);
}

impl ContentScan {
    fn object(&self, id: &ContentId) -> Option<Object> {
        self.objects.binary_search_by(|(k, _)| k.cmp(id)).ok().map(|i| self.objects[i].1)
    }
}

/// Decoded records handed from the log walk to the fold, per message.
const FOLD_BATCH: usize = 512;
/// Batches in flight between the walk and the fold.
const FOLD_QUEUE: usize = 8;

/// What the log walk hands to the fold thread.
// Nearly every item is a record; boxing it would add an allocation per record.
#[allow(clippy::large_enum_variant)]
enum Item {
    /// A decoded record, in log order.
    Record(annal::Record),
    /// A session whose record did not decode: it is not folded further.
    Broken(SessionId),
}

/// The fold side of the walk, on its own thread: commit hashes and the engine's
/// `evolve` into scratch state.
struct Fold {
    store: MemStore,
    /// Sessions whose fold failed: their later records are not folded (no cascades).
    broken: HashSet<SessionId>,
    failed: bool,
    set: ProjectionSet,
    findings: Vec<Finding>,
}

impl Fold {
    fn new(set: ProjectionSet) -> Fold {
        Fold { store: MemStore::default(), broken: HashSet::new(), failed: false, set, findings: Vec::new() }
    }

    fn run(mut self, batches: std::sync::mpsc::Receiver<Vec<Item>>) -> Fold {
        for batch in batches {
            for item in batch {
                match item {
                    Item::Record(r) => self.record(r),
                    Item::Broken(session) => {
                        self.broken.insert(session);
                    }
                }
            }
        }
        self
    }

    fn record(&mut self, r: annal::Record) {
        let seq = r.seq;
        if let Event::TurnCommitted(e) = &r.event {
            if annal::codec::turn_commit_hash(&e.messages, &e.usage, &e.applied_context, &e.tool_ops) != e.commit_hash {
                self.findings.push(Finding::CommitHash { seq });
            }
        }
        if let Event::SessionCreated(annal::codec::SessionCreated { forked_from: Some(f), .. }) = &r.event {
            if self.broken.contains(&f.session) {
                // The parent's state is already known to be wrong; so is the fork's.
                self.broken.insert(r.session);
            }
        }
        if self.broken.contains(&r.session) {
            return;
        }
        if let Err(e) = evolve(&mut self.store, &r, self.set) {
            self.failed = true;
            self.broken.insert(r.session);
            let detail = match e {
                annal::Error::Corrupt { detail, .. } => detail,
                other => other.to_string(),
            };
            self.findings.push(Finding::Fold { seq, session: r.session, detail });
        }
    }
}

struct Walk<'a> {
    txn: &'a ReadTransaction,
    limits: &'a Limits,
    chain: LogChain,
    opts: &'a VerifyOptions,
    report: VerifyReport,
    /// The scratch fold, once the fold thread is done.
    store: MemStore,
    fold_failed: bool,
    /// Records decoded and not yet handed to the fold thread.
    batch: Vec<Item>,
    streams: HashMap<SessionId, u64>,
    /// (seq, session, stream seq) of every record that names them, in seq order.
    walked: Vec<(u64, SessionId, u64)>,
    /// Every content reference in the log: (id, how, the record that makes it). Sorted
    /// and merged with the content scan once both are done: a join of two sorted lists
    /// instead of a hash lookup per reference.
    refs: Vec<(ContentId, Shape, u64)>,
    /// `refs` is reduced to one entry per id when it reaches this length.
    refs_reduce_at: usize,
    /// The projections folded: the transcript alone recomputes the revisions; `deep`
    /// folds them all to compare with the stored tables.
    fold_set: ProjectionSet,
    /// The last record walked, and its stored chain hash.
    last_seq: Option<(u64, Option<ChainHash>)>,
}

impl<'a> Walk<'a> {
    fn new(txn: &'a ReadTransaction, limits: &'a Limits, chain: LogChain, opts: &'a VerifyOptions) -> Result<Walk<'a>> {
        Ok(Walk {
            txn,
            limits,
            chain,
            opts,
            report: VerifyReport::default(),
            store: MemStore::default(),
            fold_failed: false,
            batch: Vec::with_capacity(FOLD_BATCH),
            streams: HashMap::new(),
            walked: Vec::new(),
            refs: Vec::new(),
            refs_reduce_at: REFS_REDUCE_MIN,
            fold_set: if opts.deep {
                ProjectionSet::all()
            } else {
                // The transcript fold is the one that recomputes every revision_after.
                ProjectionSet::none().with(annal::Projection::Transcript)
            },
            last_seq: None,
        })
    }

    fn find(&mut self, f: Finding) {
        self.report.findings.push(f);
    }

    /// Hands the current batch to the fold thread (which stops early only if it died).
    fn hand_over(&mut self, fold: &std::sync::mpsc::SyncSender<Vec<Item>>) {
        if !self.batch.is_empty() {
            let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(FOLD_BATCH));
            let _ = fold.send(batch);
        }
    }

    /// Takes the fold thread's scratch state and findings; findings of the log walk are
    /// kept in sequence order.
    fn merge_fold(&mut self, fold: Fold) {
        self.store = fold.store;
        self.fold_failed |= fold.failed;
        self.report.findings.extend(fold.findings);
        self.report.findings.sort_by_key(|f| f.seq().unwrap_or(u64::MAX));
    }

    fn run(&mut self, fold: std::sync::mpsc::SyncSender<Vec<Item>>) {
        let log = match self.txn.open_table(LOG) {
            Ok(t) => t,
            Err(e) => return self.find(storage("table log", e)),
        };
        let total = log.len().unwrap_or(0);
        self.walked.reserve(total as usize);
        let bar = progress::bar(total, "verify", self.opts.progress);
        let iter = match log.iter() {
            Ok(i) => i,
            Err(e) => return self.find(storage("table log", e)),
        };
        let mut expected = 1u64;
        let mut prev: Option<ChainHash> = Some(self.chain.genesis());
        let mut clock = 0u64;
        for entry in iter {
            let (key, value) = match entry {
                Ok(kv) => kv,
                Err(e) => {
                    self.find(storage(&format!("log after seq {}", expected - 1), e));
                    break;
                }
            };
            let seq = key.value();
            let bytes = value.value();
            if seq != expected {
                self.find(Finding::Gap { expected, found: seq });
                // The link across a gap cannot be checked; resume from this record's hash.
                prev = None;
            }
            expected = seq.saturating_add(1);
            self.report.records += 1;
            if let Some(p) = prev {
                if let Err(e) = verify_chain(bytes, &p, &self.chain, seq) {
                    self.find(match e {
                        DecodeError::ChainMismatch { .. } => Finding::ChainMismatch { seq },
                        error => Finding::Undecodable { seq, error },
                    });
                }
            }
            prev = stored_chain_hash(bytes);
            self.last_seq = Some((seq, prev));
            self.record(seq, bytes, &mut clock);
            if self.batch.len() >= FOLD_BATCH {
                self.hand_over(&fold);
            }
            if self.report.records.is_multiple_of(progress::TICK_ITEMS) {
                bar.set_position(self.report.records);
            }
        }
        self.hand_over(&fold);
        bar.finish_and_clear();
        self.report.tip = self.last_seq.and_then(|(seq, h)| h.map(|h| (seq, h)));
    }

    fn record(&mut self, seq: u64, bytes: &[u8], clock: &mut u64) {
        let decoded = match decode_record(bytes, self.limits.record_bytes_max) {
            Ok(d) => d,
            Err(error) => {
                self.fold_failed = true;
                self.undecodable(seq, bytes);
                return self.find(match error {
                    DecodeError::UnsupportedVersion { kind, found, supported } => {
                        Finding::UnsupportedSchema { seq, kind, found, supported }
                    }
                    error => Finding::Undecodable { seq, error },
                });
            }
        };
        let r = decoded.record;
        if r.seq != seq {
            self.find(Finding::SeqMismatch { seq, inner: r.seq });
        }
        let last = self.streams.entry(r.session).or_insert(0);
        if r.stream_seq != *last + 1 {
            let expected = *last + 1;
            *last = r.stream_seq;
            self.find(Finding::StreamGap { seq, session: r.session, expected, found: r.stream_seq });
        } else {
            *last = r.stream_seq;
        }
        self.walked.push((seq, r.session, r.stream_seq));
        if r.committed_at_ms < *clock {
            self.find(Finding::ClockBackwards { seq, at_ms: r.committed_at_ms, previous_ms: *clock });
        }
        *clock = (*clock).max(r.committed_at_ms);
        let shape = ref_shape(&r.event);
        self.refs.extend(r.event.content_refs().into_iter().map(|id| (id, shape, seq)));
        if self.refs.len() >= self.refs_reduce_at {
            // Keep memory in proportion to the distinct ids, not to every reference.
            reduce_refs(&mut self.refs);
            self.refs_reduce_at = (2 * self.refs.len()).max(REFS_REDUCE_MIN);
        }
        self.batch.push(Item::Record(r));
    }

    /// A record that does not decode: if its envelope still names a session and stream
    /// sequence, account for them, so the session's later records are checked against
    /// the right stream position and its fold is not blamed again for this record.
    fn undecodable(&mut self, seq: u64, bytes: &[u8]) {
        if bytes.len() < annal::codec::HEADER_LEN || bytes[..4] != annal::codec::MAGIC {
            return;
        }
        let mut session = [0u8; 16];
        session.copy_from_slice(&bytes[16..32]);
        let mut stream = [0u8; 8];
        stream.copy_from_slice(&bytes[32..40]);
        let (session, stream_seq) = (SessionId(session), u64::from_le_bytes(stream));
        let last = self.streams.entry(session).or_insert(0);
        if stream_seq == *last + 1 {
            *last = stream_seq;
            self.walked.push((seq, session, stream_seq));
            self.batch.push(Item::Broken(session));
        }
    }

    /// Every content id the log refers to against the scan: present, hashing to its id,
    /// and for message references a message object whose attachments pass too. Then
    /// every damaged object nothing refers to.
    fn check_content(&mut self, scan: &ContentScan) {
        self.report.findings.extend(scan.findings.iter().cloned());
        self.report.content_objects = scan.objects.len() as u64;
        // A message reference to an object first referred to as plain bytes must still be
        // a message: `reduce_refs` keeps the reference that decides.
        let mut refs = std::mem::take(&mut self.refs);
        reduce_refs(&mut refs);
        let referenced = |id: &ContentId| refs.binary_search_by(|r| r.0.cmp(id)).is_ok();
        let mut found = Vec::new();
        let mut attachments_checked = HashSet::new();
        let mut objects = scan.objects.iter().peekable();
        for &(id, shape, seq) in &refs {
            // Both lists are in id order: advance the scan to this id.
            while objects.next_if(|(k, _)| *k < id).is_some() {}
            let object = objects.peek().filter(|(k, _)| *k == id).map(|(_, o)| *o);
            let mut pending = vec![(id, shape, object)];
            while let Some((id, shape, object)) = pending.pop() {
                let Some(object) = object else {
                    found.push(Finding::MissingContent { seq, id });
                    continue;
                };
                if !object.hash_ok {
                    found.push(Finding::ContentHash { seq: Some(seq), id });
                    continue;
                }
                if shape != Shape::Message {
                    continue;
                }
                if !object.message {
                    let detail = self.message_error(id);
                    found.push(Finding::NotAMessage { seq, id, detail });
                    continue;
                }
                for a in scan.attachments.get(&id).into_iter().flatten() {
                    if !referenced(a) && attachments_checked.insert(*a) {
                        pending.push((*a, Shape::Bytes, scan.object(a)));
                    }
                }
            }
        }
        for id in &scan.bad {
            if !referenced(id) && !attachments_checked.contains(id) {
                found.push(Finding::ContentHash { seq: None, id: *id });
            }
        }
        // In log order; objects nothing refers to last, in key order.
        found.sort_by_key(|f| f.seq().unwrap_or(u64::MAX));
        self.report.findings.extend(found);
    }

    /// Why the object `id` does not decode as a message (read again: findings are rare).
    fn message_error(&self, id: ContentId) -> String {
        let limit = self.limits.content_bytes_max.saturating_add(1024);
        match self.txn.open_table(CONTENT).map(|t| t.get(id.0)) {
            Ok(Ok(Some(g))) => decode_message(g.value(), limit).err().map_or_else(String::new, |e| e.to_string()),
            Ok(Ok(None)) => "missing".into(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        }
    }

    /// `session_log` must index exactly the records walked: every entry points at a
    /// record of that session and stream seq, and every record has its entry.
    fn check_session_index(&mut self) {
        let table = match self.txn.open_table(SESSION_LOG) {
            Ok(t) => t,
            Err(e) => return self.find(storage("table session_log", e)),
        };
        let iter = match table.iter() {
            Ok(i) => i,
            Err(e) => return self.find(storage("table session_log", e)),
        };
        let walked = std::mem::take(&mut self.walked);
        let mut indexed = vec![false; walked.len()];
        for entry in iter {
            let (k, v) = match entry {
                Ok(kv) => kv,
                Err(e) => return self.find(storage("table session_log", e)),
            };
            let (session, stream_seq, points_to) = (SessionId(k.value().0), k.value().1, v.value());
            match walked.binary_search_by_key(&points_to, |w| w.0) {
                Ok(i) if walked[i].1 == session && walked[i].2 == stream_seq => indexed[i] = true,
                _ => self.find(Finding::SessionIndex {
                    session,
                    stream_seq,
                    detail: format!("points to seq {points_to}, which holds no such record"),
                }),
            }
        }
        for (&(seq, session, stream_seq), _) in walked.iter().zip(&indexed).filter(|(_, done)| !**done) {
            self.find(Finding::SessionIndex { session, stream_seq, detail: format!("missing (record seq {seq})") });
        }
    }

    fn check_meta(&mut self) {
        let meta = match self.txn.open_table(META) {
            Ok(t) => t,
            Err(e) => return self.find(storage("table meta", e)),
        };
        match meta.get(meta_keys::FORMAT) {
            Ok(Some(g)) if tables::meta_u64(g.value()) == Some(tables::FORMAT as u64) => {}
            Ok(Some(g)) => self.find(Finding::Meta {
                key: meta_keys::FORMAT.into(),
                detail: format!("format {:?}, this binary reads {}", tables::meta_u64(g.value()), tables::FORMAT),
            }),
            Ok(None) => self.find(Finding::Meta { key: meta_keys::FORMAT.into(), detail: "missing".into() }),
            Err(e) => self.find(storage("meta format", e)),
        }
        let stored = match meta.get(meta_keys::TIP) {
            Ok(g) => g.map(|g| tables::decode_tip(g.value())),
            Err(e) => return self.find(storage("meta tip", e)),
        };
        let last = self.report.tip;
        let tip_finding = |detail: String| Finding::Meta { key: meta_keys::TIP.into(), detail };
        match (stored, last) {
            (None, None) => {}
            (None, Some((seq, _))) => self.find(tip_finding(format!("missing, the log ends at seq {seq}"))),
            (Some(Err(e)), _) => self.find(tip_finding(e.to_string())),
            (Some(Ok((seq, _))), None) => {
                if seq != 0 || self.last_seq.is_some() {
                    self.find(tip_finding(format!("names seq {seq}, the log is empty")));
                }
            }
            (Some(Ok((seq, hash))), Some((last_seq, last_hash))) => {
                if seq != last_seq {
                    self.find(tip_finding(format!("names seq {seq}, the last record is seq {last_seq}")));
                } else if hash != last_hash {
                    self.find(tip_finding(format!("chain hash {hash} differs from the last record's {last_hash}")));
                }
            }
        }
        if let Some(expected) = self.opts.expect_tip {
            let actual = last.map(|(_, h)| h);
            if actual != Some(expected) {
                self.find(Finding::ExpectedTip { expected, actual, seq: last.map_or(0, |(s, _)| s) });
            }
        }
    }

    fn deep(&mut self) {
        if self.fold_failed {
            self.report.deep = Some(Err("the log does not fold cleanly (see the findings above)".into()));
            return;
        }
        let stored = match projection_digests(self.txn) {
            Ok(d) => d,
            Err(e) => {
                self.report.deep = Some(Err(format!("cannot read the projections: {e}")));
                return self.find(storage("projections", e));
            }
        };
        let fresh = mem_digests(&self.store);
        for (s, f) in stored.iter().zip(&fresh) {
            if s != f {
                let table = Table::ALL.into_iter().find(|t| t.name() == s.table);
                match table {
                    Some(t) => self.first_difference(t),
                    None => self.find(Finding::Projection { table: s.table, key: String::new(), detail: "differs" }),
                }
            }
        }
        self.report.deep = Some(Ok(stored.len()));
    }

    /// Reports the first key where the stored table and the fresh fold differ.
    fn first_difference(&mut self, t: Table) {
        let empty = BTreeMap::new();
        let fresh = self.store.tables.get(&t).unwrap_or(&empty);
        let stored = match tables::projection_rows(self.txn, t) {
            Ok(rows) => rows,
            Err(e) => return self.find(storage(t.name(), e)),
        };
        let mut fresh_iter = fresh.iter();
        let mut stored_iter = stored.into_iter();
        let finding = |key: &[u8], detail| Finding::Projection { table: t.name(), key: crate::hex(key), detail };
        loop {
            let s = stored_iter.next();
            let f = fresh_iter.next();
            let found = match (s, f) {
                (None, None) => return,
                (Some((k, _)), None) => finding(&k, "stored row that the fold does not produce"),
                (None, Some((k, _))) => finding(k, "row missing from the stored table"),
                (Some((sk, sv)), Some((fk, fv))) => {
                    if sk == *fk && sv == *fv {
                        continue;
                    }
                    match sk.cmp(fk) {
                        std::cmp::Ordering::Equal => finding(&sk, "stored value differs from the fold"),
                        std::cmp::Ordering::Less => finding(&sk, "stored row that the fold does not produce"),
                        std::cmp::Ordering::Greater => finding(fk, "row missing from the stored table"),
                    }
                }
            };
            return self.find(found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reducing_references_keeps_the_deciding_one_per_id_at_any_time() {
        let (a, b) = (annal::codec::content_id(b"a"), annal::codec::content_id(b"b"));
        let refs = vec![
            (a, Shape::Bytes, 3),
            (b, Shape::Bytes, 9),
            (a, Shape::Message, 7),
            (b, Shape::Bytes, 4),
            (a, Shape::Message, 5),
        ];
        let mut once = refs.clone();
        reduce_refs(&mut once);
        let mut expected = vec![(a, Shape::Message, 5), (b, Shape::Bytes, 4)];
        expected.sort_unstable();
        assert_eq!(once, expected, "a message reference decides over an earlier plain one; else the first");
        // Reducing part of the list, appending the rest and reducing again gives the same.
        let mut twice = refs[..3].to_vec();
        reduce_refs(&mut twice);
        twice.extend_from_slice(&refs[3..]);
        reduce_refs(&mut twice);
        assert_eq!(twice, once);
    }
}
