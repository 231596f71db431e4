//! `annal verify`: check a database end to end and report every finding with its place.
//!
//! verify opens the log file read-only itself, so a damaged log is reported, never
//! refused, and checks one read snapshot of it with four threads at once (a log of at
//! most 512 records, which the walk would hand to the fold in one batch at its end, is
//! checked on the caller's thread, one phase after the other):
//!
//! - The walk reads `log` in sequence order. For each record: the global sequence is
//!   dense, the record decodes with a supported schema version and names its own seq,
//!   its per-session stream sequence is dense, and the clock never goes back. It hands
//!   each decoded record to the fold, its bytes to the chain thread and its content
//!   references to the content scan; with `deep`, it reads the content rows in step with the log
//!   (`annal::pieces`: the ids of each row only) and hands over the ids each record's
//!   row introduced too, which the content-id fold needs.
//! - The chain thread checks that each record's chain link from the record before it
//!   holds (plain or keyed).
//! - The fold recomputes each turn's commit hash and runs the engine's own `evolve` into
//!   scratch state: the transcript fold, which recomputes every `revision_after`, and
//!   with `deep` every fold (the stream index and the content-id index included).
//! - The content scan reads the content rows in seq order. A row that is empty, does not
//!   parse, has its pieces out of order or is stored both whole and in pieces is a finding (the entries before the damage are still checked). Beside the
//!   rows it reads the ids listed for them (`annal::tables::CONTENT_IDS`): a listing of
//!   other ids than its row's, an empty one for a row that parses, a row the file lists
//!   without its listing, and a listing of a seq with no row are findings. Every entry
//!   must use a known encoding and its bytes must hash to its id (a damaged object is
//!   named with the row that holds it); the scan notes which objects decode as message
//!   objects, and their attachments. As it reads the row at a seq, it takes the content
//!   references of the records up to that seq (the walk hands them over in log order):
//!   a reference of the record at that seq to an object of that row is noted on the
//!   object, and the others are kept. An id stored twice is a finding, and so is a
//!   content row at a seq that holds no record (matched against the walk's seqs once
//!   both are done).
//!
//! Then the content references kept are sorted and merged, in id order, with the objects
//! and the references noted on them: every id the log refers to must be stored, hash to its id, and
//! be introduced by a content row at or before the first record that refers to it. A
//! message reference must name a message object, whose attachments must be stored and
//! hash to their ids too, and be introduced with the message or earlier. A damaged
//! object nothing refers to is a finding as well. Finally `meta` must hold format 2 and
//! a tip that names the last record, and `--expect-tip` must match its chain hash.
//!
//! With `deep`, every projection table as a reader sees it is compared byte for byte
//! with the scratch fold. The stored projections are read through `Reader::open`: the
//! projections file's checkpoint plus the log past it, folded in memory by the engine.
//! (Where the projections file is missing or unusable, a reader folds the whole log, so
//! the comparison then checks that fold.) If the reader cannot be opened, that is a
//! `storage` finding at `projections`; when the walk has already found the log itself
//! damaged and the reader fails on the log, the failure is shown as the reason the
//! comparison was skipped instead. The comparison is also skipped, with the reason
//! shown and no finding, when the log does not fold cleanly, and when the reader's view
//! is at another seq (or chain hash) than the walk's snapshot: a live writer appended
//! records between the walk's snapshot and the reader's open, so the two states are not
//! comparable; run verify again, or verify a copy.
//!
//! Every table is read sequentially, never by random lookups. Memory grows with the
//! number of distinct content objects (about 50 bytes each) and the content references
//! kept, those not answered by their own record's row (about 56 bytes each, reduced to
//! one per id whenever the list doubles past 4 Mi entries), plus the scratch fold; the
//! references the walk has handed over and the scan has not reached wait in memory too.
//!
//! Verification keeps going after a finding wherever it can, and never panics on
//! damaged data: every decode is bounded and fallible, and a panic raised inside redb by
//! a damaged page ends only the phase that met it, as a `storage` finding.

use crate::{progress, require_file, CliError, Result};
use annal::codec::content::entries;
use annal::codec::{
    decode_message, decode_record, message_attachments, stored_chain_hash, verify_chain, DecodeError, LogChain,
};
use annal::pieces::ContentReader;
use annal::query::{mem_digests, projection_digests};
use annal::store::Typed;
use annal::tables::{self, meta_keys, LOG, META};
use annal::{
    evolve, ChainHash, ContentId, Event, EventKind, HashStore, Limits, Location, MemStore, Projection, ProjectionSet,
    Reader, SessionId, Store, Table, View,
};
use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// What to check.
#[derive(Clone, Debug, Default)]
pub struct VerifyOptions {
    /// The 32-byte key of a keyed chain.
    pub key: Option<[u8; 32]>,
    /// Also fold every projection and compare every projection table with the fold.
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
    /// `committed_at` went back in time.
    ClockBackwards {
        /// The record.
        seq: u64,
        /// Its time.
        at_ms: u64,
        /// The previous record's time.
        previous_ms: u64,
    },
    /// A content row is empty or does not parse.
    ContentRow {
        /// The row's seq.
        row: u64,
        /// What is wrong.
        detail: String,
    },
    /// A session has erased records but no tombstone: its payloads were removed by
    /// something other than a purge.
    ErasedWithoutPurge {
        /// Its first erased record.
        seq: u64,
        /// The session.
        session: SessionId,
    },
    /// A content row at a seq that holds no log record.
    StrayContentRow {
        /// The row's seq.
        row: u64,
    },
    /// A content object is stored more than once.
    DuplicateContent {
        /// The id.
        id: ContentId,
        /// The row that stores it first.
        first_row: u64,
        /// The row that stores it again.
        row: u64,
    },
    /// The ids listed for a content row (`annal::tables::CONTENT_IDS`) are not its ids:
    /// other ids, none for a row that parses, no listing for a row the file lists, or a
    /// listing for a seq that has no content row.
    ContentIds {
        /// The seq of the content row, or of the listing.
        row: u64,
        /// What is wrong.
        detail: String,
    },
    /// A content id an event refers to is not stored.
    MissingContent {
        /// The first record referring to it.
        seq: u64,
        /// The id.
        id: ContentId,
    },
    /// A content object is introduced after something refers to it: after the first
    /// record that refers to it, or (an attachment) after its message object.
    ContentAfterReference {
        /// The id.
        id: ContentId,
        /// The content row that introduces it.
        row: u64,
        /// The first record referring to it; for an attachment, the content row of its
        /// message.
        seq: u64,
        /// For an attachment, the message object that names it.
        message: Option<ContentId>,
    },
    /// A content object's bytes, decompressed if they are stored compressed, do not hash to
    /// its id (or it uses an unknown encoding).
    ContentHash {
        /// The first record referring to it, if any.
        seq: Option<u64>,
        /// The id.
        id: ContentId,
        /// The content row that holds the bytes.
        row: u64,
        /// The stored encoding byte (0 is raw).
        encoding: u8,
    },
    /// A message reference points at bytes that are not a message object.
    NotAMessage {
        /// The first record referring to it as a message.
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
    /// The drafts tables (outside the chain) are malformed or do not add up.
    Drafts {
        /// What is wrong.
        detail: String,
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
            Finding::StreamGap { seq, session, .. }
            | Finding::Fold { seq, session, .. }
            | Finding::ErasedWithoutPurge { seq, session } => format!("log seq {seq} (session {session})"),
            Finding::ContentRow { row, .. } | Finding::StrayContentRow { row } => format!("content row {row}"),
            Finding::ContentIds { row, .. } => format!("content ids {row}"),
            Finding::MissingContent { id, .. }
            | Finding::DuplicateContent { id, .. }
            | Finding::ContentAfterReference { id, .. }
            | Finding::ContentHash { id, .. }
            | Finding::NotAMessage { id, .. } => format!("content {id}"),
            Finding::Meta { key, .. } => format!("meta {key}"),
            Finding::ExpectedTip { seq, .. } => format!("log tip (seq {seq})"),
            Finding::Drafts { .. } => "tables drafts and draft_index".into(),
            Finding::Projection { table, key, .. } => format!("projection {table} key {key}"),
            Finding::Storage { location, .. } => location.clone(),
        }
    }

    /// The log seq the finding is about, if it is about one: the record, the record
    /// that refers to an object, or the seq of a content row.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Finding::Gap { expected: seq, .. }
            | Finding::ChainMismatch { seq }
            | Finding::UnsupportedSchema { seq, .. }
            | Finding::Undecodable { seq, .. }
            | Finding::SeqMismatch { seq, .. }
            | Finding::StreamGap { seq, .. }
            | Finding::ClockBackwards { seq, .. }
            | Finding::ContentRow { row: seq, .. }
            | Finding::StrayContentRow { row: seq }
            | Finding::ContentIds { row: seq, .. }
            | Finding::DuplicateContent { row: seq, .. }
            | Finding::MissingContent { seq, .. }
            | Finding::ContentAfterReference { seq, .. }
            | Finding::NotAMessage { seq, .. }
            | Finding::CommitHash { seq }
            | Finding::ErasedWithoutPurge { seq, .. }
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
            Finding::ClockBackwards { .. } => "clock_backwards",
            Finding::ContentRow { .. } => "content_row",
            Finding::StrayContentRow { .. } => "stray_content_row",
            Finding::ContentIds { .. } => "content_ids",
            Finding::ErasedWithoutPurge { .. } => "erased_without_purge",
            Finding::DuplicateContent { .. } => "duplicate_content",
            Finding::MissingContent { .. } => "missing_content",
            Finding::ContentAfterReference { .. } => "content_after_reference",
            Finding::ContentHash { .. } => "content_hash",
            Finding::NotAMessage { .. } => "not_a_message",
            Finding::CommitHash { .. } => "commit_hash",
            Finding::Fold { .. } => "fold",
            Finding::Meta { .. } => "meta",
            Finding::ExpectedTip { .. } => "expected_tip",
            Finding::Drafts { .. } => "drafts",
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
            Finding::ClockBackwards { at_ms, previous_ms, .. } => {
                format!("committed_at {at_ms} ms is before the previous record's {previous_ms} ms")
            }
            Finding::ContentRow { detail, .. }
            | Finding::ContentIds { detail, .. }
            | Finding::Meta { detail, .. }
            | Finding::Drafts { detail } => detail.clone(),
            Finding::StrayContentRow { .. } => "no log record has this seq".into(),
            Finding::ErasedWithoutPurge { .. } => "the record is erased, but the session has no tombstone".into(),
            Finding::DuplicateContent { first_row, row, .. } if first_row == row => {
                format!("stored twice in content row {row}")
            }
            Finding::DuplicateContent { first_row, row, .. } => {
                format!("stored again in content row {row} (first stored in content row {first_row})")
            }
            Finding::MissingContent { seq, .. } => format!("missing, referred to by log seq {seq}"),
            Finding::ContentAfterReference { row, seq, message: None, .. } => {
                format!("introduced by content row {row}, after log seq {seq} refers to it")
            }
            Finding::ContentAfterReference { row, seq, message: Some(m), .. } => {
                format!("attachment introduced by content row {row}, after its message {m} (content row {seq})")
            }
            Finding::ContentHash { seq, row, encoding, .. } => {
                let what = match encoding {
                    0 => "bytes do not hash to the id".to_string(),
                    1 => "lz4 object does not decompress to bytes that hash to the id".to_string(),
                    2 => "zstd object does not decompress to bytes that hash to the id".to_string(),
                    e => format!("unknown encoding {e}"),
                };
                match seq {
                    Some(seq) => format!("{what} (content row {row}, referred to by log seq {seq})"),
                    None => format!("{what} (content row {row})"),
                }
            }
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
    /// Records erased by purges (reported, not findings: erased is not corrupt).
    pub erased_records: u64,
    /// Sessions purged (tombstones).
    pub purged_sessions: u64,
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
        if self.purged_sessions > 0 || self.erased_records > 0 {
            out.push_str(&format!(
                "; {} sessions purged, {} records erased (payloads removed, chain intact)",
                self.purged_sessions, self.erased_records
            ));
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
            "erased_records": self.erased_records,
            "purged_sessions": self.purged_sessions,
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

/// Verifies the database at `path`, read-only (works beside a live writer). The log file
/// is opened here, not through the engine, so a log the engine would refuse is still
/// walked and its damage reported; with `deep`, the stored projections are read through
/// [`Reader::open`].
pub fn verify(path: &Path, opts: &VerifyOptions) -> Result<VerifyReport> {
    require_file(path)?;
    let limits = Limits::default();
    let (_db, txn) = match open_log(path) {
        Ok(opened) => opened,
        Err(Refused::Usage(e)) => return Err(e),
        Err(Refused::Damaged(finding)) => {
            let mut report = VerifyReport { keyed: opts.key.is_some(), ..VerifyReport::default() };
            report.findings.push(finding);
            if opts.deep {
                report.deep = Some(Err("the log file cannot be opened".into()));
            }
            return Ok(report);
        }
    };
    let chain = opts.key.map_or_else(LogChain::plain, LogChain::keyed);
    let (txn, journal) = with_journal(path, &*_db, txn, &chain)?;
    let stored = || {
        projections_readable(path)?;
        Reader::open(path, limits.clone(), opts.key)?.snapshot()
    };
    verify_log(&txn, &journal, &limits, opts, &stored)
}

/// Whether the projections file beside `path`, if there is one, opens and its table of
/// rows reads (`crate::with_projections_table`). A reader treats a projections file it
/// cannot use as absent and folds the whole log instead, which is right for a query and
/// wrong for `--deep`: the tables it would compare would be that fresh fold, not what is
/// stored.
fn projections_readable(path: &Path) -> annal::Result<()> {
    let projections = annal::projections_path(path);
    if !projections.exists() {
        return Ok(());
    }
    let len = |table: &redb::ReadOnlyTable<&'static [u8], &'static [u8]>| {
        redb::ReadableTableMetadata::len(table).map_err(|e| e.to_string())
    };
    crate::with_projections_table(&projections, VERIFY_CACHE_BYTES, len)
        .map(drop)
        .map_err(|e| annal::Error::Storage(annal::StorageFailure::new(format!("the projections file: {e}"))))
}

/// The journal files beside `path`, read right after `txn` was taken. If they do not
/// continue that snapshot (a live writer moved the journal into the log file meanwhile),
/// a new snapshot of `db` and both files are read again; a journal that still does not
/// continue the log is walked anyway, and reported.
fn with_journal(
    path: &Path,
    db: &dyn redb::ReadableDatabase,
    mut txn: ReadTransaction,
    chain: &LogChain,
) -> Result<(ReadTransaction, Vec<Vec<u8>>)> {
    let mut tries = 1;
    loop {
        let journal = annal::journal::read_journal(path)?;
        let continues = guarded("journal", || {
            let (seq, hash) = last_record(&txn, chain);
            annal::journal::rows_after(&journal, seq, &hash, chain).is_ok()
        });
        if continues.unwrap_or(true) || tries >= annal::journal::JOURNAL_READ_TRIES_MAX {
            return Ok((txn, journal));
        }
        tries += 1;
        txn = match db.begin_read() {
            Ok(txn) => txn,
            Err(_) => return Ok((txn, journal)),
        };
    }
}

/// The last record of the log file's `log` table: its seq and stored chain hash (seq 0
/// and the genesis hash for an empty or unreadable table, whose damage the walk reports).
fn last_record(txn: &ReadTransaction, chain: &LogChain) -> (u64, ChainHash) {
    let last = || -> Option<(u64, ChainHash)> {
        let log = txn.open_table(LOG).ok()?;
        let (k, v) = log.last().ok()??;
        Some((k.value(), stored_chain_hash(v.value())?))
    };
    last().unwrap_or((0, chain.genesis()))
}

/// Why the log file was not opened.
enum Refused {
    /// Not something verify can read: a usage error.
    Usage(CliError),
    /// redb found the file damaged: a finding.
    Damaged(Finding),
}

/// redb's page cache for the log file verify walks. Every phase reads its table once,
/// in key order, so the cache only has to keep the branch pages: a reader's 64 MiB
/// filled with leaves read once and cost fresh memory (on 200,000 events, RSS 173 MB
/// against 100 MB, and 3 to 30% more CPU).
const VERIFY_CACHE_BYTES: usize = 4 << 20;

/// Opens the log file read-only, as a reader beside a live writer does (a file its
/// writer left unclean, after a crash, over a view that takes redb's repair in memory:
/// `annal::unclean`), and takes the snapshot verify checks. A file cut short is damage,
/// as a corrupted one is; a file that cannot be read at all is a usage error.
fn open_log(path: &Path) -> std::result::Result<(annal::unclean::ReadOnly, ReadTransaction), Refused> {
    let opened = guarded("file", || -> std::result::Result<_, redb::Error> {
        let db = annal::unclean::open_read_only(path, VERIFY_CACHE_BYTES)?;
        let txn = db.begin_read()?;
        // The first read, the log's last record (the journal's check reads it next): one
        // that fails (a file cut short) fails here with its own error; redb answers every
        // read after it with "a previous I/O error occurred".
        match txn.open_table(LOG) {
            Ok(log) => drop(log.last()?),
            Err(redb::TableError::Storage(e)) => return Err(e.into()),
            Err(_) => {}
        }
        Ok((db, txn))
    });
    let cut_short = |e: &redb::Error| match e {
        redb::Error::Io(io) => io.kind() == std::io::ErrorKind::UnexpectedEof,
        _ => false,
    };
    match opened {
        Ok(Ok(opened)) => Ok(opened),
        Ok(Err(redb::Error::Corrupted(detail))) => {
            Err(Refused::Damaged(storage("file", format!("cannot be opened: {detail}"))))
        }
        Ok(Err(e)) if cut_short(&e) => {
            let e = format!("{e} {}", crate::CUT_SHORT);
            Err(Refused::Damaged(storage("file", format!("cannot be opened: {e}"))))
        }
        Ok(Err(e)) => Err(Refused::Usage(CliError::usage(format!("cannot open {} read-only: {e}", path.display())))),
        Err(finding) => Err(Refused::Damaged(finding)),
    }
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

/// Checks what makes the file unreadable for this verify rather than damaged: a
/// projections file instead of a log file, no `meta` table, format 1 (which `annal
/// migrate` upgrades), or a chain key other than the one the file recognises. Anything else wrong in `meta` is left to the meta check.
fn check_file(txn: &ReadTransaction, chain: &LogChain) -> Result<()> {
    let names: Vec<String> = match txn.list_tables() {
        Ok(tables) => tables.map(|t| redb::TableHandle::name(&t).to_string()).collect(),
        Err(_) => Vec::new(),
    };
    let has = |t: &str| names.iter().any(|n| n == t);
    if has(redb::TableHandle::name(&tables::PROJECTIONS)) && !has(redb::TableHandle::name(&LOG)) {
        return Err(CliError::usage("this is a projections file: verify the log file beside it"));
    }
    let meta = txn.open_table(META).map_err(|e| CliError::usage(format!("not an annal database: {e}")))?;
    if let Ok(Some(g)) = meta.get(meta_keys::FORMAT) {
        if tables::meta_u64(g.value()) == Some(1) {
            return Err(CliError::usage(format!(
                "the database is in format 1; `annal migrate` upgrades it to format {}",
                tables::FORMAT
            )));
        }
    }
    let Ok(stored) = meta.get(meta_keys::KEY_CHECK) else {
        return Ok(());
    };
    match (stored.map(|g| g.value().to_vec()), chain.key_check()) {
        (None, None) => Ok(()),
        (Some(_), None) => Err(CliError::usage("the database has a keyed chain: pass --key-file")),
        (None, Some(_)) => Err(CliError::usage("the database has a plain chain: verify it without --key-file")),
        (Some(s), Some(k)) if s[..] != k[..] => Err(CliError::usage("the key does not match the database's key")),
        _ => Ok(()),
    }
}

/// Where `--deep` gets the stored projections: a view at the tip, as a reader sees it.
pub type StoredProjections<'a> = &'a dyn Fn() -> annal::Result<View>;

/// Verifies one read snapshot of a log file. `stored` is called only with `deep`, once
/// the scratch fold is done, for the projections to compare with it ([`verify`] opens a
/// [`Reader`] on the same path). Errors only for usage problems (wrong key, not an annal
/// database, format 1); everything wrong with the data is a finding in the report.
pub fn verify_snapshot(
    txn: &ReadTransaction,
    limits: &Limits,
    opts: &VerifyOptions,
    stored: StoredProjections<'_>,
) -> Result<VerifyReport> {
    verify_log(txn, &[], limits, opts, stored)
}

/// [`verify_snapshot`] of a log file's snapshot and the journal beside it (`journal`,
/// the bytes of its files, [`annal::journal::read_journal`]): the records the journal
/// holds past the log file's last one are walked, folded and checked as the log's.
pub fn verify_log(
    txn: &ReadTransaction,
    journal: &[Vec<u8>],
    limits: &Limits,
    opts: &VerifyOptions,
    stored: StoredProjections<'_>,
) -> Result<VerifyReport> {
    let chain = opts.key.map_or_else(LogChain::plain, LogChain::keyed);
    let mut walk = Walk::new(txn, limits, chain.clone(), opts);
    match guarded("table meta", || check_file(txn, &chain)) {
        Ok(checked) => checked?,
        Err(finding) => {
            walk.find(finding);
            return Ok(walk.finish());
        }
    }
    let (seq, hash) = guarded("table log", || last_record(txn, &chain)).unwrap_or((0, chain.genesis()));
    let journal_rows = match journal.iter().all(|f| f.is_empty()) {
        true => Vec::new(),
        false => match annal::journal::rows_after(journal, seq, &hash, &chain) {
            Ok(rows) => rows,
            Err(e) => {
                walk.find(storage("journal", e));
                Vec::new()
            }
        },
    };
    // The log's length sizes the lists of content references and objects.
    let records = guarded("table log", || txn.open_table(LOG).and_then(|t| Ok(t.len()?))).ok().and_then(Result::ok);
    let records = records.unwrap_or(0) + journal_rows.len() as u64;
    let fold = Fold::new(walk.fold_set, annal::FileRecords::over_rows(txn, &journal_rows, limits.record_bytes_max));
    let (walked, scan, fold, links) = if seq.saturating_add(journal_rows.len() as u64) <= FOLD_BATCH as u64 {
        // The walk hands a log this short to the fold as one batch, at its end: a fold
        // thread would only wait for it, so everything runs here, one phase after the other.
        let mut handed = Vec::new();
        let walked = guarded("table log", || walk.run(&mut |batch| handed.push(batch), &journal_rows));
        let mut findings = Vec::new();
        let mut refs = std::collections::VecDeque::new();
        for batch in &mut handed {
            check_links(&mut batch.checks, &chain, &mut findings);
            refs.push_back(std::mem::take(&mut batch.refs));
        }
        let fold = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let mut fold = fold;
            handed.iter().for_each(|batch| fold.take(&batch.items));
            fold
        }));
        let scan = guarded("content rows", || {
            scan_content(txn, &journal_rows, limits, records, &mut || refs.pop_front(), None)
        });
        (walked, Ok(scan), fold.map_err(drop), Ok(findings))
    } else {
        // Four threads on the cores there are: the walk (reading and decoding), the fold,
        // the chain links and the content scan, each a fair share of the work.
        let (batches, folded) = sync_channel::<Vec<Item>>(FOLD_QUEUE);
        let (spent, spare) = sync_channel::<Vec<Item>>(FOLD_QUEUE);
        let (checks_spent, checks_spare) = sync_channel::<Checks>(FOLD_QUEUE);
        let (refs_spent, refs_spare) = sync_channel::<Vec<Ref>>(FOLD_QUEUE);
        walk.spent = Some(Spare { items: spare, checks: checks_spare, refs: refs_spare });
        let (to_check, checked) = sync_channel::<Checks>(FOLD_QUEUE);
        let (to_scan, scanned) = std::sync::mpsc::channel::<RefBatch>();
        std::thread::scope(|s| {
            let rows = &journal_rows;
            let scan = s.spawn(move || {
                guarded("content rows", || {
                    scan_content(txn, rows, limits, records, &mut || scanned.recv().ok(), Some(refs_spent))
                })
            });
            let fold = s.spawn(move || fold.run(folded, spent));
            let chain = &chain;
            let links = s.spawn(move || {
                let mut findings = Vec::new();
                for mut checks in checked {
                    check_links(&mut checks, chain, &mut findings);
                    // Back to the walk to fill again; one it has no room for is freed here.
                    let _ = checks_spent.try_send(checks);
                }
                findings
            });
            let walked = guarded("table log", || {
                walk.run(
                    &mut |batch| {
                        // A thread stops early only if it died.
                        let _ = to_check.send(batch.checks);
                        let _ = to_scan.send(batch.refs);
                        let _ = batches.send(batch.items);
                    },
                    &journal_rows,
                )
            });
            drop(batches);
            drop(to_check);
            drop(to_scan);
            (walked, scan.join().map_err(drop), fold.join().map_err(drop), links.join().map_err(drop))
        })
    };
    match links {
        Ok(findings) => walk.report.findings.extend(findings),
        Err(_) => walk.find(storage("log", "the chain check failed")),
    }
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
        Ok(Ok(mut scan)) => {
            walk.check_strays(&scan.rows);
            let refs = std::mem::take(&mut scan.refs);
            if let Err(finding) = guarded("content rows", || walk.check_content(&scan, refs)) {
                walk.find(finding);
            }
        }
        Ok(Err(finding)) => walk.find(finding),
        Err(_) => walk.find(storage("content rows", "the content scan failed")),
    }
    if let Err(finding) = guarded("table meta", || walk.check_meta()) {
        walk.find(finding);
    }
    // Drafts live outside the chain: only their structure is checked.
    match guarded("table drafts", || annal::draft::check_structure(txn)) {
        Ok(Ok(_)) => {}
        Ok(Err(detail)) => walk.find(Finding::Drafts { detail }),
        Err(finding) => walk.find(finding),
    }
    if let Some(finding) = walk.content_fold_error.take() {
        // The content checks above explain every way the content-id fold can fail; if
        // they found nothing, the fold's own reason is the finding.
        if walk.report.findings.is_empty() {
            walk.find(finding);
        }
    }
    if opts.deep {
        if let Err(finding) = guarded("projections", || walk.deep(stored)) {
            walk.report.deep.get_or_insert_with(|| Err("the comparison failed (see the findings above)".into()));
            walk.find(finding);
        }
    }
    Ok(walk.finish())
}

/// Which stored bytes a content reference must be. `Message` sorts first, so among the
/// references to one id, sorted, the first is the one that decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    Message,
    Bytes,
}

/// Appends every content reference of `event` (at `seq`) to `refs`, with the shape it
/// needs: message lists refer to message objects; context, tool payloads and host state
/// values are raw bytes.
fn push_refs(event: &Event, seq: u64, refs: &mut Vec<Ref>) {
    let messages = match event {
        Event::SessionCreated(e) => e.messages.len(),
        Event::TurnCommitted(e) => e.messages.len(),
        Event::TranscriptRewritten(e) => e.replacement.len(),
        _ => 0,
    };
    // `each_content_ref` gives the messages first; the rest are bytes.
    let mut n = 0;
    event.each_content_ref(|id| {
        let shape = if n < messages { Shape::Message } else { Shape::Bytes };
        n += 1;
        refs.push(Ref { id, shape, seq, first: seq });
    });
}

/// The content references of the log that the content scan kept (those that no object
/// of their own record's row answers, see [`Matcher`]), for the merge by id.
struct Refs {
    refs: Vec<Ref>,
    /// The list is reduced to one entry per id when it reaches this length.
    reduce_at: usize,
}

impl Refs {
    /// An empty list with room for about two references a record of a log of `records`,
    /// up to the first reduction: growing it by doubling copied it and faulted in its
    /// pages again at each step.
    fn new(records: u64) -> Refs {
        let expected = usize::try_from(records).unwrap_or(usize::MAX).saturating_mul(2).min(REFS_REDUCE_MIN);
        Refs { refs: Vec::with_capacity(expected), reduce_at: REFS_REDUCE_MIN }
    }

    /// Takes one reference.
    fn push(&mut self, r: Ref) {
        self.refs.push(r);
        if self.refs.len() >= self.reduce_at {
            // Keep memory in proportion to the distinct ids, not to every reference.
            reduce_refs(&mut self.refs);
            self.reduce_at = (2 * self.refs.len()).max(REFS_REDUCE_MIN);
        }
    }

    /// The references, in no particular order: `check_content` sorts them, on both
    /// cores, once every thread is done.
    fn into_list(self) -> Vec<Ref> {
        self.refs
    }
}

/// A content reference of the log, or (reduced) every reference to one id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Ref {
    id: ContentId,
    /// What the deciding reference needs the object to be.
    shape: Shape,
    /// The deciding reference: the first record that needs a message if any does, else
    /// the first record.
    seq: u64,
    /// The first record that refers to the id at all.
    first: u64,
}

/// Content references gathered before the first reduction to one per id: a log with
/// fewer references is sorted once, at the end.
const REFS_REDUCE_MIN: usize = 1 << 22;

/// Sorts content references by (id, shape, seq) and keeps one per id: the first record
/// that needs the id to be a message if any does, else the first record, with the first
/// record of all. Reducing an already reduced list again keeps the same entries, so it
/// can run at any time.
fn reduce_refs(refs: &mut Vec<Ref>) {
    refs.sort_unstable_by(ref_order);
    refs.dedup_by(|later, kept| {
        if later.id != kept.id {
            return false;
        }
        kept.first = kept.first.min(later.first);
        true
    });
}

/// The order of references: by id, then shape, then seq (`Ref`'s own order), the id's
/// first eight bytes compared as a number first (see [`id_prefix`]).
fn ref_order(a: &Ref, b: &Ref) -> std::cmp::Ordering {
    id_prefix(&a.id).cmp(&id_prefix(&b.id)).then_with(|| a.cmp(b))
}

/// Lists of references at least this long are sorted in two halves at once.
const HALVES_MIN: usize = 1 << 16;

/// Sorts `refs` in two halves, each in [`ref_order`], one of them on a thread of its own
/// (a list this long is sorted after every other thread of verify is done, so the second
/// core is free); a short list is sorted whole, as the first half.
fn sort_in_halves(refs: &mut [Ref]) -> (&[Ref], &[Ref]) {
    let mid = if refs.len() >= HALVES_MIN { refs.len() / 2 } else { refs.len() };
    let (a, b) = refs.split_at_mut(mid);
    std::thread::scope(|s| {
        if !b.is_empty() {
            s.spawn(|| b.sort_unstable_by(ref_order));
        }
        a.sort_unstable_by(ref_order);
    });
    (a, b)
}

/// One reference per id, in id order, from two lists each in [`ref_order`]: what
/// [`reduce_refs`] keeps of the two together. The first of an id's references in that
/// order decides, and `first` is the earliest of them all.
struct Reduced<'a> {
    sides: [std::iter::Peekable<std::iter::Copied<std::slice::Iter<'a, Ref>>>; 2],
}

impl<'a> Reduced<'a> {
    /// The references of `a` and `b`, each sorted.
    fn new(a: &'a [Ref], b: &'a [Ref]) -> Reduced<'a> {
        Reduced { sides: [a.iter().copied().peekable(), b.iter().copied().peekable()] }
    }
}

impl Iterator for Reduced<'_> {
    type Item = Ref;

    fn next(&mut self) -> Option<Ref> {
        let mut from: Option<(usize, Ref)> = None;
        for (i, side) in self.sides.iter_mut().enumerate() {
            if let Some(r) = side.peek() {
                if from.is_none_or(|(_, kept)| ref_order(r, &kept) == std::cmp::Ordering::Less) {
                    from = Some((i, *r));
                }
            }
        }
        let (i, _) = from?;
        let mut kept = self.sides[i].next()?;
        for side in &mut self.sides {
            while let Some(r) = side.next_if(|r| r.id == kept.id) {
                kept.first = kept.first.min(r.first);
            }
        }
        Some(kept)
    }
}

/// Calls `check` once for every referenced id, in id order, with the reference that
/// decides (see [`Reduced`]) and the id's object if there is one. `objects` are the
/// content scan's, in id order, one per id, each with the references noted on it at its
/// row ([`Object::intro`], a reference at the row's seq); `a` and `b` are the kept
/// references, each sorted in [`ref_order`]. One pass over the objects: the noted
/// references are not gathered into a list of their own first.
fn deciding_refs(objects: &[(ContentId, Object)], a: &[Ref], b: &[Ref], check: &mut dyn FnMut(Ref, Option<Object>)) {
    let mut kept = Reduced::new(a, b).peekable();
    for (id, object) in objects {
        let before = |r: &Ref| (id_prefix(&r.id), &r.id) < (id_prefix(id), id);
        // References to ids no object has, before this one.
        while let Some(r) = kept.next_if(before) {
            check(r, None);
        }
        let noted = object.intro.map(|shape| Ref { id: *id, shape, seq: object.row, first: object.row });
        let deciding = match (noted, kept.next_if(|r| r.id == *id)) {
            (None, None) => continue,
            (Some(r), None) | (None, Some(r)) => r,
            (Some(noted), Some(kept)) => {
                let first = noted.first.min(kept.first);
                Ref { first, ..std::cmp::min_by(noted, kept, ref_order) }
            }
        };
        check(deciding, Some(*object));
    }
    kept.for_each(|r| check(r, None));
}

/// The first eight bytes of `id` as a number. Ordering by it and then by the whole id is
/// the id's own order, and for ids that are hashes it nearly always decides on its own,
/// without a call to compare 32 bytes: the two sorts of ids in `verify` are a tenth of its
/// work otherwise.
fn id_prefix(id: &ContentId) -> u64 {
    let mut head = [0; 8];
    head.copy_from_slice(&id.0[..8]);
    u64::from_be_bytes(head)
}

/// What the content scan learnt about one stored object.
#[derive(Clone, Copy, Debug)]
struct Object {
    /// The seq of the content row that holds it (its first copy, if stored twice).
    row: u64,
    /// Its place in that row: with the row, it orders the copies of an id.
    place: u32,
    /// The stored encoding byte.
    encoding: u8,
    /// The encoding is known and the bytes hash to the id.
    hash_ok: bool,
    /// What the bytes decode as.
    decoded: Decoded,
    /// The record at the seq of the row that holds this copy refers to it, and the shape
    /// its references need (`Message` if any needs a message): a reference checked
    /// here, not kept in the list of references.
    intro: Option<Shape>,
}

/// What a stored object's bytes decode as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decoded {
    /// Not a message object (or bytes that do not hash to their id).
    Bytes,
    /// A message object without attachments.
    Message,
    /// A message object with attachments ([`ContentScan::attachments`]).
    Attached,
}

/// The result of scanning the content rows once, in seq order.
#[derive(Default)]
struct ContentScan {
    /// Every stored object once, in id order.
    objects: Vec<(ContentId, Object)>,
    /// Attachments of message objects that have any, by (id, row).
    attachments: HashMap<(ContentId, u64), Vec<ContentId>>,
    /// Every damaged copy: (id, row, encoding).
    bad: Vec<(ContentId, u64, u8)>,
    /// Rows that do not parse, ids stored twice, storage errors met on the way.
    findings: Vec<Finding>,
    /// The seq of every content row of the log file read, in order (the journal's rows
    /// come with their records), for the rows that no record holds.
    rows: Vec<u64>,
    /// The content references of the log that no object of their own record's row
    /// answers (see [`Object::intro`]), in no particular order.
    refs: Vec<Ref>,
}

impl ContentScan {
    fn object(&self, id: &ContentId) -> Option<Object> {
        self.objects.binary_search_by(|(k, _)| k.cmp(id)).ok().map(|i| self.objects[i].1)
    }

    fn attachments(&self, id: &ContentId, object: &Object) -> &[ContentId] {
        match object.decoded {
            // Most messages have none: no lookup.
            Decoded::Attached => self.attachments.get(&(*id, object.row)).map_or(&[], Vec::as_slice),
            Decoded::Bytes | Decoded::Message => &[],
        }
    }
}

/// The most objects of a row [`Matcher::row`] searches one by one for each reference.
const ROW_SCAN_MAX: usize = 32;

/// The log's content references, as the walk hands them over in log order, taken by the
/// content scan as it reads the rows in seq order: a reference whose own record's row
/// holds its id is noted on that object ([`Object::intro`]); the others are kept for the
/// merge by id. Most references are of objects their record introduced, so the list that
/// is kept, sorted and merged is a fraction of them.
struct Matcher<'s> {
    /// The next batch of references, `None` once the walk is done.
    source: &'s mut dyn FnMut() -> Option<RefBatch>,
    /// References taken from the source and not yet matched, in log order: the batches
    /// as they came, each with the place of its first reference not taken yet.
    pending: std::collections::VecDeque<(Vec<Ref>, usize)>,
    /// Where a batch's list goes once every reference of it is taken: back to the walk,
    /// which fills it again (a list freed on this thread and allocated afresh on the
    /// walk's cost the kernel's zeroing of fresh pages).
    spent: Option<SyncSender<Vec<Ref>>>,
    /// Every reference of a record at or before this seq has been taken.
    through: u64,
    done: bool,
    kept: Refs,
}

impl<'s> Matcher<'s> {
    fn new(
        source: &'s mut dyn FnMut() -> Option<RefBatch>,
        records: u64,
        spent: Option<SyncSender<Vec<Ref>>>,
    ) -> Matcher<'s> {
        let pending = std::collections::VecDeque::new();
        // Room for a reference every two records: most are matched at their row.
        Matcher { source, pending, spent, through: 0, done: false, kept: Refs::new(records / 4) }
    }

    /// The next pending reference if it is of a record at or before `seq`.
    fn next_through(&mut self, seq: u64) -> Option<Ref> {
        loop {
            let (refs, at) = self.pending.front_mut()?;
            match refs.get(*at) {
                Some(r) if r.seq <= seq => {
                    *at += 1;
                    return Some(*r);
                }
                Some(_) => return None,
                None => {
                    let (mut refs, _) = self.pending.pop_front()?;
                    if let Some(spent) = &self.spent {
                        refs.clear();
                        // One the walk has no room for is freed here.
                        let _ = spent.try_send(refs);
                    }
                }
            }
        }
    }

    /// Takes batches until every reference at or before `seq` is pending.
    fn take_through(&mut self, seq: u64) {
        while !self.done && self.through < seq {
            match (self.source)() {
                Some(batch) => {
                    self.through = batch.through;
                    self.pending.push_back((batch.refs, 0));
                }
                None => self.done = true,
            }
        }
    }

    /// Matches the references of the record at `seq` with `objects`, the objects of the
    /// content row at `seq`, and keeps the references of earlier records (their records
    /// have no row, or it does not hold their id).
    fn row(&mut self, seq: u64, objects: &mut [(ContentId, Object)]) {
        self.take_through(seq);
        // A long row is searched through its ids sorted (with their places, so that the
        // first copy of an id the row repeats comes first).
        let mut sorted = Vec::new();
        if objects.len() > ROW_SCAN_MAX {
            sorted.extend(objects.iter().enumerate().map(|(i, (id, _))| (*id, i)));
            sorted.sort_unstable();
        }
        while let Some(r) = self.next_through(seq) {
            // The first copy in the row: the one the merge keeps if the row repeats it.
            let place = match (r.seq == seq, objects.len() > ROW_SCAN_MAX) {
                (false, _) => None,
                (true, false) => objects.iter().position(|(id, _)| *id == r.id),
                (true, true) => {
                    let at = sorted.partition_point(|(id, _)| *id < r.id);
                    sorted.get(at).filter(|(id, _)| *id == r.id).map(|(_, i)| *i)
                }
            };
            match place {
                Some(i) => {
                    let o = &mut objects[i].1;
                    o.intro = Some(o.intro.map_or(r.shape, |s| s.min(r.shape)));
                }
                None => self.kept.push(r),
            }
        }
    }

    /// Keeps every reference not matched yet, and returns all that were kept.
    fn finish(mut self) -> Vec<Ref> {
        self.take_through(u64::MAX);
        while let Some(r) = self.next_through(u64::MAX) {
            self.kept.push(r);
        }
        self.kept.into_list()
    }
}

/// The most objects [`scan_content`] makes room for before it reads (768 MiB of
/// entries): a longer list grows as it goes.
const OBJECTS_RESERVE_MAX: usize = 1 << 24;

/// Scans every content row: parses it, checks every object against its id, and notes
/// which objects decode as messages. `records`, the log's length, sizes the list.
fn scan_content(
    txn: &ReadTransaction,
    journal: &[annal::journal::JournalRow],
    limits: &Limits,
    records: u64,
    refs: &mut dyn FnMut() -> Option<RefBatch>,
    spent: Option<SyncSender<Vec<Ref>>>,
) -> ContentScan {
    let mut scan = ContentScan::default();
    let mut matcher = Matcher::new(refs, records, spent);
    if let Err(e) = scan_rows(&mut scan, &mut matcher, txn, journal, limits, records) {
        scan.findings.push(storage("content rows", e));
    }
    // Every reference the rows did not answer, taken to the walk's end.
    let mut refs = matcher.finish();
    sort_objects(&mut scan.objects);
    let findings = &mut scan.findings;
    scan.objects.dedup_by(|later, kept| {
        if later.0 != kept.0 {
            return false;
        }
        findings.push(Finding::DuplicateContent { id: kept.0, first_row: kept.1.row, row: later.1.row });
        // A reference answered by a later copy is merged with the kept one.
        if let Some(shape) = later.1.intro {
            let seq = later.1.row;
            refs.push(Ref { id: later.0, shape, seq, first: seq });
        }
        true
    });
    scan.refs = refs;
    scan
}

/// Sorts the content scan's objects in id order, each id's copies in the order stored
/// (the first copy is the one kept). Row and place order the copies of an id, so the
/// unstable sort, which needs no scratch copy of the list, gives one order. A long list
/// is split in place by the top bit of its ids and the two parts sorted at once, one on a
/// thread of its own: the scan is the longest of verify's threads, so the other core is
/// free by then.
fn sort_objects(objects: &mut [(ContentId, Object)]) {
    let order = |(a, x): &(ContentId, Object), (b, y): &(ContentId, Object)| {
        id_prefix(a).cmp(&id_prefix(b)).then_with(|| a.cmp(b)).then((x.row, x.place).cmp(&(y.row, y.place)))
    };
    if objects.len() < HALVES_MIN {
        return objects.sort_unstable_by(order);
    }
    let high = |(id, _): &(ContentId, Object)| id.0[0] & 0x80 != 0;
    // Every object with the top bit clear before every one with it set.
    let (mut low_end, mut end) = (0, objects.len());
    while low_end < end {
        if high(&objects[low_end]) {
            end -= 1;
            objects.swap(low_end, end);
        } else {
            low_end += 1;
        }
    }
    let (low, high) = objects.split_at_mut(low_end);
    std::thread::scope(|s| {
        s.spawn(|| high.sort_unstable_by(order));
        low.sort_unstable_by(order);
    });
}

/// Reads every content row of the log file in seq order, then `journal`'s, into `scan`,
/// matching the references of each row's record on the way.
fn scan_rows(
    scan: &mut ContentScan,
    matcher: &mut Matcher<'_>,
    txn: &ReadTransaction,
    journal: &[annal::journal::JournalRow],
    limits: &Limits,
    records: u64,
) -> std::result::Result<(), String> {
    let table = ContentReader::open(txn).map_err(|e| e.to_string())?;
    let mut iter = table.iter().map_err(|e| e.to_string())?.lenient();
    let mut listed = Listed::open(txn)?;
    // Room for about two objects a record (of the `records` in the log): growing the list
    // by doubling copied it and faulted its pages in again at each step.
    scan.objects.reserve((records as usize).saturating_mul(2).min(OBJECTS_RESERVE_MAX));
    let mut canonical = Vec::new();
    while let Some(entry) = iter.next() {
        let (seq, row) = entry.map_err(|e| e.to_string())?;
        let damage = iter.take_damage();
        let whole = damage.is_none();
        if let Some((row, detail)) = damage {
            scan.findings.push(Finding::ContentRow { row, detail });
        }
        scan.rows.push(seq);
        let first = scan.objects.len();
        let parsed = scan_row(scan, matcher, &mut canonical, seq, &row, limits);
        let ids = scan.objects[first..].iter().map(|(id, _)| id);
        listed.check(seq, whole && parsed, ids, &mut scan.findings)?;
    }
    listed.finish(&mut scan.findings)?;
    for row in journal.iter().filter(|r| !r.content.is_empty()) {
        scan_row(scan, matcher, &mut canonical, row.seq, &row.content, limits);
    }
    Ok(())
}

/// The seq of a content row and the ids listed for it, in their page.
type Listing = (u64, redb::AccessGuard<'static, &'static [u8]>);

/// The ids listed for the content rows (`annal::tables::CONTENT_IDS`), read in seq order
/// beside the rows and checked against them.
struct Listed {
    rows: Option<redb::Range<'static, u64, &'static [u8]>>,
    /// The next listing read and not checked yet, in its page.
    next: Option<Listing>,
    /// Every content row from this seq on must have its ids listed.
    from: u64,
}

impl Listed {
    fn open(txn: &ReadTransaction) -> std::result::Result<Listed, String> {
        let from = match txn.open_table(META) {
            Ok(meta) => meta
                .get(meta_keys::CONTENT_IDS_FROM)
                .map_err(|e| e.to_string())?
                .and_then(|g| tables::meta_u64(g.value())),
            Err(_) => None,
        };
        let rows = match txn.open_table(tables::CONTENT_IDS) {
            Ok(t) => Some(t.range(0..=u64::MAX).map_err(|e| e.to_string())?),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.to_string()),
        };
        Ok(Listed { rows, next: None, from: from.unwrap_or(u64::MAX) })
    }

    /// The next listing at or below `seq`, if any.
    fn next_through(&mut self, seq: u64) -> std::result::Result<Option<Listing>, String> {
        if self.next.is_none() {
            self.next = match self.rows.as_mut().and_then(Iterator::next) {
                Some(Ok((k, v))) => Some((k.value(), v)),
                Some(Err(e)) => return Err(e.to_string()),
                None => None,
            };
        }
        Ok(self.next.take_if(|(s, _)| *s <= seq))
    }

    /// Checks the listing of content row `seq`, whose ids are `ids` (all of them if
    /// `parsed`), and every listing before it, which no row has.
    fn check<'a>(
        &mut self,
        seq: u64,
        parsed: bool,
        ids: impl Iterator<Item = &'a ContentId>,
        findings: &mut Vec<Finding>,
    ) -> std::result::Result<(), String> {
        let mut own = None;
        while let Some((s, value)) = self.next_through(seq)? {
            match s == seq {
                true => own = Some(value),
                false => findings.push(stray_listing(s)),
            }
        }
        let value = own.as_ref().map(|g| g.value());
        // A row that does not read whole or parse is a finding of its own: its listing is
        // only checked to be a list.
        let detail = match value {
            None if seq >= self.from => {
                Some(format!("no ids listed for the content row (listed from seq {})", self.from))
            }
            None => None,
            Some(v) if !v.len().is_multiple_of(32) => Some(format!("{} bytes are no list of 32-byte ids", v.len())),
            Some(_) if !parsed => None,
            Some([]) => Some("lists no ids for a content row that parses".to_string()),
            Some(v) => {
                let same = v.chunks_exact(32).eq(ids.map(|id| &id.0[..]));
                (!same).then(|| "lists other ids than its content row's".to_string())
            }
        };
        if let Some(detail) = detail {
            findings.push(Finding::ContentIds { row: seq, detail });
        }
        Ok(())
    }

    /// Every listing past the last row: none has a row.
    fn finish(mut self, findings: &mut Vec<Finding>) -> std::result::Result<(), String> {
        while let Some((s, _)) = self.next_through(u64::MAX)? {
            findings.push(stray_listing(s));
        }
        Ok(())
    }
}

fn stray_listing(seq: u64) -> Finding {
    Finding::ContentIds { row: seq, detail: "lists ids for a seq that has no content row".into() }
}

/// Scans content row `row`: parses it, checks every object against its id (decompressing
/// into `canonical`, one buffer reused from object to object), and notes which objects
/// decode as messages.
fn scan_row(
    scan: &mut ContentScan,
    matcher: &mut Matcher<'_>,
    canonical: &mut Vec<u8>,
    row: u64,
    bytes: &[u8],
    limits: &Limits,
) -> bool {
    let message_max = limits.message_object_bytes_max();
    let first = scan.objects.len();
    let mut parsed = true;
    {
        if bytes.is_empty() {
            scan.findings.push(Finding::ContentRow { row, detail: "empty row".into() });
            matcher.row(row, &mut []);
            return false;
        }
        for (n, entry) in entries(bytes, message_max).enumerate() {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    let detail = format!("does not parse after {n} object{}: {e}", if n == 1 { "" } else { "s" });
                    scan.findings.push(Finding::ContentRow { row, detail });
                    parsed = false;
                    break;
                }
            };
            let (id, encoding) = (entry.id, entry.encoding);
            let canonical = entry.verify_into(message_max, canonical);
            let hash_ok = canonical.is_some();
            if !hash_ok {
                scan.bad.push((id, row, encoding));
            }
            let decoded = match canonical.map(|bytes| message_attachments(bytes, message_max)) {
                Some(Ok(attachments)) if attachments.is_empty() => Decoded::Message,
                Some(Ok(attachments)) => {
                    scan.attachments.entry((id, row)).or_insert(attachments);
                    Decoded::Attached
                }
                _ => Decoded::Bytes,
            };
            let place = u32::try_from(n).unwrap_or(u32::MAX);
            scan.objects.push((id, Object { row, place, encoding, hash_ok, decoded, intro: None }));
        }
    }
    matcher.row(row, &mut scan.objects[first..]);
    parsed
}

/// Decoded records handed from the log walk to the fold, per message.
const FOLD_BATCH: usize = 512;
/// Batches in flight between the walk and the fold.
const FOLD_QUEUE: usize = 8;

/// Where the log walk hands its batches: the fold thread's channel, or the fold itself.
type Sink<'a> = &'a mut dyn FnMut(Batch);

/// What the log walk hands over at a time: decoded records for the fold thread, the
/// chain links for the chain thread, and the content references for the content scan.
struct Batch {
    items: Vec<Item>,
    checks: Checks,
    refs: RefBatch,
}

impl Batch {
    fn with_capacity(records: usize) -> Batch {
        Batch::with_parts(None, None, None, records)
    }

    /// An empty batch for `records` that fills the lists given, which the threads they
    /// went to are done with, and fresh ones for the others.
    fn with_parts(items: Option<Vec<Item>>, checks: Option<Checks>, refs: Option<Vec<Ref>>, records: usize) -> Batch {
        let mut items = items.unwrap_or_else(|| Vec::with_capacity(records));
        items.clear();
        let mut checks = checks
            .unwrap_or_else(|| Checks { links: Vec::with_capacity(records), bytes: Vec::with_capacity(records * 256) });
        checks.links.clear();
        checks.bytes.clear();
        let mut refs = refs.unwrap_or_else(|| Vec::with_capacity(records * 2));
        refs.clear();
        Batch { items, checks, refs: RefBatch { through: 0, refs } }
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty() && self.checks.links.is_empty() && self.refs.refs.is_empty()
    }
}

/// The lists of batches the other threads are done with, handed back to the walk to fill
/// again: the fold's records (which the walk, whose thread allocated them, frees), the
/// chain thread's links and bytes, and the content thread's references. A list freed on
/// the thread it went to, and a fresh one allocated on the walk's for each batch, cost
/// the kernel's zeroing of fresh pages again and again.
struct Spare {
    items: Receiver<Vec<Item>>,
    checks: Receiver<Checks>,
    refs: Receiver<Vec<Ref>>,
}

/// Chain links to check, with the bytes of their records one after the other.
struct Checks {
    links: Vec<Link>,
    bytes: Vec<u8>,
}

/// The content references of the records of one batch of the walk, in log order, for the
/// content scan: every reference of a record at or before `through` is in this batch or
/// an earlier one.
#[derive(Default)]
struct RefBatch {
    through: u64,
    refs: Vec<Ref>,
}

/// Checks every chain link of `checks` (the two blake3 passes a record were a third of
/// the walk's work, and then a third of the fold's).
fn check_links(checks: &mut Checks, chain: &LogChain, findings: &mut Vec<Finding>) {
    for link in &checks.links {
        if let Err(e) = verify_chain(&checks.bytes[link.start..link.end], &link.prev, chain, link.seq) {
            let seq = link.seq;
            findings.push(match e {
                DecodeError::ChainMismatch { .. } => Finding::ChainMismatch { seq },
                error => Finding::Undecodable { seq, error },
            });
        }
    }
}

/// A record's chain link to check: its bytes are `bytes[start..end]` of its batch, and
/// `prev` the stored chain hash of the record before it.
struct Link {
    seq: u64,
    prev: ChainHash,
    start: usize,
    end: usize,
}

/// What the log walk hands to the fold thread.
// Nearly every item is a record; boxing it would add an allocation per record.
#[allow(clippy::large_enum_variant)]
enum Item {
    /// A decoded record, in log order, with the ids of its content row.
    Record(annal::Record, Vec<ContentId>),
    /// A session whose record did not decode: it is not folded further.
    Broken(SessionId),
}

/// The fold's scratch state: the projection rows, which `evolve` needs in no order
/// (`HashStore`), and the log's records for their message lists. A transcript names its
/// messages by the records whose lists hold their ids
/// ([`annal::transcript::message_list`]), and the fold of a rewrite or a fork reads the
/// lists of records before it, which `records` reads from the log when asked.
struct Scratch<'a> {
    rows: HashStore,
    /// The log's records, read by seq when the fold asks for a list (most logs' folds ask
    /// for none: only rewrites and forks read lists).
    records: annal::FileRecords<'a>,
}

impl Store for Scratch<'_> {
    fn read(
        &self,
        table: Table,
        key: &[u8],
        f: &mut dyn FnMut(Option<&[u8]>) -> annal::error::Result<()>,
    ) -> annal::error::Result<()> {
        self.rows.read(table, key, f)
    }
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> annal::error::Result<()> {
        self.rows.put(table, key, value)
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> annal::error::Result<()> {
        self.rows.remove(table, key)
    }
    fn put_vec(&mut self, table: Table, key: &[u8], value: Vec<u8>) -> annal::error::Result<()> {
        self.rows.put_vec(table, key, value)
    }
    fn update_in_place(
        &mut self,
        table: Table,
        key: &[u8],
        f: &mut dyn FnMut(&mut Vec<u8>) -> annal::error::Result<bool>,
    ) -> annal::error::Result<bool> {
        self.rows.update_in_place(table, key, f)
    }
    fn message_list(&self, seq: u64) -> annal::error::Result<Option<std::sync::Arc<[ContentId]>>> {
        // A page that makes redb panic is a storage error of this record; the walk reports
        // the page itself.
        guarded("table log", || annal::store::Records::message_list(&self.records, seq))
            .unwrap_or_else(|finding| Err(annal::Error::Storage(annal::StorageFailure::new(finding.to_string()))))
    }
}

/// The fold side of the walk, on its own thread: commit hashes and the engine's
/// `evolve` into scratch state.
struct Fold<'a> {
    /// Scratch state, heads and tips held typed ([`Typed`]); `deep` puts its rows in key
    /// order once, at the end, to compare them with the stored tables.
    store: Typed<Scratch<'a>>,
    /// Sessions whose fold failed: their later records are not folded (no cascades).
    broken: HashSet<SessionId>,
    failed: bool,
    /// The session-scoped folds.
    set: ProjectionSet,
    /// Whether the content-id index is folded. It is global, so it folds every record,
    /// broken session or not, and its failures are explained by the content checks.
    content: bool,
    /// Why the content-id fold first failed.
    content_error: Option<Finding>,
    findings: Vec<Finding>,
}

impl<'a> Fold<'a> {
    fn new(set: ProjectionSet, records: annal::FileRecords<'a>) -> Fold<'a> {
        Fold {
            store: Typed::new(Scratch { rows: HashStore::default(), records }),
            broken: HashSet::new(),
            failed: false,
            set: set.iter().filter(|p| *p != Projection::Content).collect(),
            content: set.contains(Projection::Content),
            content_error: None,
            findings: Vec::new(),
        }
    }

    /// Folds the walk's batches until it is done, and hands each back to it: the walk,
    /// whose thread allocated the records, frees them (the fold is the longer share of
    /// the work, and freeing on the allocating thread is the cheaper way).
    fn run(mut self, batches: Receiver<Vec<Item>>, spent: SyncSender<Vec<Item>>) -> Fold<'a> {
        for batch in batches {
            self.take(&batch);
            // A batch the walk has no room for is freed here.
            let _ = spent.try_send(batch);
        }
        self
    }

    /// Folds one batch of the walk.
    fn take(&mut self, batch: &[Item]) {
        for item in batch {
            match item {
                Item::Record(r, introduced) => self.record(r, introduced),
                Item::Broken(session) => {
                    self.broken.insert(*session);
                }
            }
        }
    }

    fn record(&mut self, r: &annal::Record, introduced: &[ContentId]) {
        let seq = r.seq;
        if let Event::TurnCommitted(e) = &r.event {
            if e.recomputed_hash() != e.commit_hash {
                self.findings.push(Finding::CommitHash { seq });
            }
        }
        if self.content {
            let content = ProjectionSet::none().with(Projection::Content);
            if let Err(e) = evolve(&mut self.store, r, introduced, content) {
                self.failed = true;
                if self.content_error.is_none() {
                    self.content_error = Some(Finding::Fold { seq, session: r.session, detail: fold_detail(e) });
                }
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
        if let Err(e) = evolve(&mut self.store, r, introduced, self.set) {
            self.failed = true;
            self.broken.insert(r.session);
            self.findings.push(Finding::Fold { seq, session: r.session, detail: fold_detail(e) });
        }
    }
}

fn fold_detail(e: annal::Error) -> String {
    match e {
        annal::Error::Corrupt { detail, .. } => detail,
        other => other.to_string(),
    }
}

/// The walk's reader of the content rows, in step with the log: the ids of the row at each
/// record's seq, which only the content-id fold needs (`deep`). It stops quietly at the
/// first error (the content scan reports it) and says so in `lost`.
struct ContentRows {
    iter: Option<annal::pieces::Rows<'static>>,
    /// The next row not yet matched to a record.
    next: Option<(u64, Vec<ContentId>)>,
    object_bytes_max: u64,
    lost: bool,
}

impl ContentRows {
    fn open(txn: &ReadTransaction, object_bytes_max: u64) -> ContentRows {
        let iter = guarded("content rows", || {
            ContentReader::open(txn).and_then(|t| Ok(t.range_owned(0..=u64::MAX)?.lenient()))
        });
        let (iter, lost) = match iter {
            Ok(Ok(iter)) => (Some(iter), false),
            _ => (None, true),
        };
        ContentRows { iter, next: None, object_bytes_max, lost }
    }

    /// Reads the next row into `next`, if there is one.
    fn advance(&mut self) {
        let Some(iter) = self.iter.as_mut() else {
            return;
        };
        let max = self.object_bytes_max;
        let read = guarded("content rows", || {
            iter.next().map(|entry| {
                entry.map(|(seq, row)| {
                    let ids = entries(&row, max).map_while(|e| e.ok()).map(|e| e.id).collect();
                    (seq, ids)
                })
            })
        });
        match read {
            Ok(Some(Ok(row))) => self.next = Some(row),
            Ok(None) => self.iter = None,
            Ok(Some(Err(_))) | Err(_) => {
                self.iter = None;
                self.lost = true;
            }
        }
    }

    /// The ids of the row at `seq` (none if it has no row). Rows before it hold no
    /// record (the content scan reports them).
    fn at(&mut self, seq: u64) -> Vec<ContentId> {
        loop {
            if self.next.is_none() {
                self.advance();
            }
            match self.next.take() {
                None => return Vec::new(),
                Some((row, _)) if row < seq => {}
                Some((row, ids)) if row == seq => return ids,
                later => {
                    self.next = later;
                    return Vec::new();
                }
            }
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
    /// The content rows could not all be read in step with the log, so the content-id
    /// fold is incomplete.
    rows_lost: bool,
    /// Why the content-id fold failed, if it did (see [`Fold::content`]).
    content_fold_error: Option<Finding>,
    /// Records decoded and not yet handed to the fold thread.
    batch: Batch,
    /// What the other threads are done with, for the walk to fill again.
    spent: Option<Spare>,
    streams: HashMap<SessionId, u64>,
    /// Sessions with erased records, and the first of them.
    erased: HashMap<SessionId, u64>,
    /// Sessions with a tombstone.
    purged: HashSet<SessionId>,
    /// The projections folded: the transcript alone recomputes the revisions; `deep`
    /// folds them all to compare with the stored tables.
    fold_set: ProjectionSet,
    /// The last record walked, and its stored chain hash.
    last_seq: Option<(u64, Option<ChainHash>)>,
    /// The last record of the log file itself (what `meta.tip` must name).
    file_tip: Option<(u64, ChainHash)>,
    /// The seqs of the log file's records walked, as runs `(first, last)` in order.
    walked: Vec<(u64, u64)>,
    /// The walk read the log file to its end.
    walked_whole: bool,
}

impl<'a> Walk<'a> {
    fn new(txn: &'a ReadTransaction, limits: &'a Limits, chain: LogChain, opts: &'a VerifyOptions) -> Walk<'a> {
        Walk {
            txn,
            limits,
            chain,
            opts,
            report: VerifyReport { keyed: opts.key.is_some(), ..VerifyReport::default() },
            store: MemStore::default(),
            fold_failed: false,
            rows_lost: false,
            content_fold_error: None,
            batch: Batch::with_capacity(FOLD_BATCH),
            spent: None,
            streams: HashMap::new(),
            erased: HashMap::new(),
            purged: HashSet::new(),
            fold_set: if opts.deep {
                ProjectionSet::all()
            } else {
                // The transcript fold is the one that recomputes every revision_after.
                ProjectionSet::none().with(Projection::Transcript)
            },
            last_seq: None,
            file_tip: None,
            walked: Vec::new(),
            walked_whole: false,
        }
    }

    fn find(&mut self, f: Finding) {
        self.report.findings.push(f);
    }

    fn finish(mut self) -> VerifyReport {
        self.report.sessions = self.streams.len() as u64;
        self.report.purged_sessions = self.purged.len() as u64;
        let mut unpurged: Vec<_> =
            self.erased.iter().filter(|(s, _)| !self.purged.contains(*s)).map(|(s, seq)| (*seq, *s)).collect();
        unpurged.sort();
        for (seq, session) in unpurged {
            self.report.findings.push(Finding::ErasedWithoutPurge { seq, session });
        }
        self.report.findings.sort_by_key(|f| f.seq().unwrap_or(u64::MAX));
        self.report
    }

    /// Hands the current batch to the fold.
    fn hand_over(&mut self, fold: Sink<'_>) {
        if !self.batch.is_empty() {
            let next = match self.spent.as_ref() {
                Some(spare) => Batch::with_parts(
                    spare.items.try_recv().ok(),
                    spare.checks.try_recv().ok(),
                    spare.refs.try_recv().ok(),
                    FOLD_BATCH,
                ),
                None => Batch::with_capacity(FOLD_BATCH),
            };
            let mut batch = std::mem::replace(&mut self.batch, next);
            batch.refs.through = self.last_seq.map_or(0, |(seq, _)| seq);
            fold(batch);
        }
    }

    /// Takes the fold thread's scratch state and findings; findings of the log walk are
    /// kept in sequence order.
    fn merge_fold(&mut self, fold: Fold<'_>) {
        self.fold_failed |= fold.failed;
        if self.opts.deep {
            match fold.store.into_inner() {
                Ok(scratch) => self.store = scratch.rows.into_ordered(),
                // A typed row that does not encode (past the row size limit): the fold's
                // state cannot be compared.
                Err(_) => self.fold_failed = true,
            }
        }
        self.content_fold_error = fold.content_error;
        self.report.findings.extend(fold.findings);
        self.report.findings.sort_by_key(|f| f.seq().unwrap_or(u64::MAX));
    }

    /// Walks the log file's records, then `journal`'s: the rows the journal holds past
    /// the log file's last record.
    fn run(&mut self, fold: Sink<'_>, journal: &[annal::journal::JournalRow]) {
        let log = match self.txn.open_table(LOG) {
            Ok(t) => t,
            Err(e) => return self.find(storage("table log", e)),
        };
        let total = log.len().unwrap_or(0);
        let bar = progress::bar(total, "verify", self.opts.progress);
        let iter = match log.iter() {
            Ok(i) => i,
            Err(e) => return self.find(storage("table log", e)),
        };
        // Only the content-id fold needs the ids each record introduced; the content scan
        // reads every row anyway, so the walk reads them only for it.
        let mut rows = match self.fold_set.contains(Projection::Content) {
            true => Some(ContentRows::open(self.txn, self.limits.message_object_bytes_max())),
            false => None,
        };
        let mut expected = 1u64;
        let mut prev: Option<ChainHash> = Some(self.chain.genesis());
        let mut clock = 0u64;
        let mut complete = true;
        for entry in iter {
            let (key, value) = match entry {
                Ok(kv) => kv,
                Err(e) => {
                    self.find(storage(&format!("log after seq {}", expected - 1), e));
                    complete = false;
                    break;
                }
            };
            let seq = key.value();
            match self.walked.last_mut() {
                Some((_, last)) if last.checked_add(1) == Some(seq) => *last = seq,
                _ => self.walked.push((seq, seq)),
            }
            let introduced = rows.as_mut().map_or_else(Vec::new, |rows| rows.at(seq));
            self.step(seq, value.value(), introduced, (&mut expected, &mut prev, &mut clock), fold);
            if self.report.records.is_multiple_of(progress::TICK_ITEMS) {
                bar.set_position(self.report.records);
            }
        }
        self.file_tip = self.last_seq.and_then(|(seq, h)| h.map(|h| (seq, h)));
        self.walked_whole = complete;
        if complete {
            let max = self.limits.message_object_bytes_max();
            for row in journal {
                let introduced = entries(&row.content, max).map_while(|e| e.ok()).map(|e| e.id).collect();
                self.step(row.seq, &row.record, introduced, (&mut expected, &mut prev, &mut clock), fold);
            }
        }
        self.rows_lost = rows.is_some_and(|rows| rows.lost);
        self.hand_over(fold);
        bar.finish_and_clear();
        self.report.tip = self.last_seq.and_then(|(seq, h)| h.map(|h| (seq, h)));
    }

    /// One record of the walk, in log order: density, the chain link, then the record.
    fn step(
        &mut self,
        seq: u64,
        bytes: &[u8],
        introduced: Vec<ContentId>,
        (expected, prev, clock): (&mut u64, &mut Option<ChainHash>, &mut u64),
        fold: Sink<'_>,
    ) {
        if seq != *expected {
            self.find(Finding::Gap { expected: *expected, found: seq });
            // The link across a gap cannot be checked; resume from this record's hash.
            *prev = None;
        }
        *expected = seq.saturating_add(1);
        self.report.records += 1;
        if let Some(prev) = *prev {
            // Checked on the chain thread (`check_links`).
            let links = &mut self.batch.checks;
            let start = links.bytes.len();
            links.bytes.extend_from_slice(bytes);
            links.links.push(Link { seq, prev, start, end: links.bytes.len() });
        }
        *prev = stored_chain_hash(bytes);
        self.last_seq = Some((seq, *prev));
        self.record(seq, bytes, clock, introduced);
        if self.batch.checks.links.len() >= FOLD_BATCH || self.batch.items.len() >= FOLD_BATCH {
            self.hand_over(fold);
        }
    }

    fn record(&mut self, seq: u64, bytes: &[u8], clock: &mut u64, introduced: Vec<ContentId>) {
        let decoded = match decode_record(bytes, self.limits.record_bytes_max) {
            Ok(d) => d,
            Err(error) => {
                self.fold_failed = true;
                self.undecodable(bytes);
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
        if r.committed_at_ms < *clock {
            self.find(Finding::ClockBackwards { seq, at_ms: r.committed_at_ms, previous_ms: *clock });
        }
        *clock = (*clock).max(r.committed_at_ms);
        match &r.event {
            Event::Erased(_) => {
                self.report.erased_records += 1;
                self.erased.entry(r.session).or_insert(seq);
            }
            Event::SessionPurged(_) => drop(self.purged.insert(r.session)),
            _ => {}
        }
        push_refs(&r.event, seq, &mut self.batch.refs.refs);
        self.batch.items.push(Item::Record(r, introduced));
    }

    /// A record that does not decode: if its envelope still names a session and stream
    /// sequence, account for them, so the session's later records are checked against
    /// the right stream position and its fold is not blamed again for this record.
    fn undecodable(&mut self, bytes: &[u8]) {
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
            self.batch.items.push(Item::Broken(session));
        }
    }

    /// Every content row of the log file at a seq that holds no record (`rows`, in order):
    /// up to the last record walked, or past it too when the walk read the whole log.
    fn check_strays(&mut self, rows: &[u64]) {
        let end = match (self.walked_whole, self.walked.last()) {
            (true, _) => u64::MAX,
            (false, Some(&(_, last))) => last,
            (false, None) => 0,
        };
        let mut runs = self.walked.iter().peekable();
        for &row in rows.iter().take_while(|&&row| row <= end) {
            while runs.next_if(|&&(_, last)| last < row).is_some() {}
            if runs.peek().is_none_or(|&&(first, _)| first > row) {
                self.report.findings.push(Finding::StrayContentRow { row });
            }
        }
    }

    /// Every content id the log refers to against the scan: stored, hashing to its id,
    /// introduced no later than its first reference, and for message references a
    /// message object whose attachments pass too and are introduced with it or earlier.
    /// Then every damaged copy nothing refers to.
    fn check_content(&mut self, scan: &ContentScan, mut refs: Vec<Ref>) {
        self.report.content_objects = scan.objects.len() as u64;
        // A message reference to an object first referred to as plain bytes must still be
        // a message: `Reduced` keeps the reference that decides.
        let (first_half, second_half) = sort_in_halves(&mut refs);
        let referenced = |id: &ContentId| {
            [first_half, second_half].iter().any(|half| half.binary_search_by(|r| r.id.cmp(id)).is_ok())
                || scan.object(id).is_some_and(|o| o.intro.is_some())
        };
        let mut found = scan.findings.clone();
        let mut attachments_checked = HashSet::new();
        let mut late_attachments = HashSet::new();
        let mut reported_bad = HashSet::new();
        // (id, shape, object, whether the log refers to it directly)
        let mut pending = Vec::new();
        let this = &*self;
        // Checks the object `object` of the deciding reference `r` (one per id, in id
        // order), and the attachments of a message that no reference names.
        let mut check = |r: Ref, object: Option<Object>| {
            pending.push((r.id, r.shape, object, true));
            while let Some((id, shape, object, direct)) = pending.pop() {
                let Some(object) = object else {
                    found.push(Finding::MissingContent { seq: r.first, id });
                    continue;
                };
                if direct && object.row > r.first {
                    found.push(Finding::ContentAfterReference { id, row: object.row, seq: r.first, message: None });
                }
                if !object.hash_ok {
                    reported_bad.insert((id, object.row));
                    let (row, encoding) = (object.row, object.encoding);
                    found.push(Finding::ContentHash { seq: Some(r.first), id, row, encoding });
                    continue;
                }
                if shape != Shape::Message {
                    continue;
                }
                if object.decoded == Decoded::Bytes {
                    let detail = this.message_error(id, object.row);
                    found.push(Finding::NotAMessage { seq: r.seq, id, detail });
                    continue;
                }
                for a in scan.attachments(&id, &object) {
                    let attachment = scan.object(a);
                    if let Some(o) = attachment.filter(|o| o.row > object.row) {
                        if late_attachments.insert(*a) {
                            let message = Some(id);
                            found.push(Finding::ContentAfterReference { id: *a, row: o.row, seq: object.row, message });
                        }
                    }
                    if !referenced(a) && attachments_checked.insert(*a) {
                        pending.push((*a, Shape::Bytes, attachment, false));
                    }
                }
            }
        };
        deciding_refs(&scan.objects, first_half, second_half, &mut check);
        for &(id, row, encoding) in &scan.bad {
            if !reported_bad.contains(&(id, row)) {
                found.push(Finding::ContentHash { seq: None, id, row, encoding });
            }
        }
        // In log order; damaged objects nothing refers to last, in id order.
        found.sort_by_key(|f| f.seq().unwrap_or(u64::MAX));
        self.report.findings.extend(found);
    }

    /// Why the object `id` in content row `row` does not decode as a message (read
    /// again: findings are rare).
    fn message_error(&self, id: ContentId, row: u64) -> String {
        let limit = self.limits.message_object_bytes_max();
        let table = match ContentReader::open(self.txn) {
            Ok(t) => t,
            Err(e) => return e.to_string(),
        };
        let bytes = match table.get(row) {
            Ok(Some(row)) => row,
            Ok(None) => return "missing".into(),
            Err(e) => return e.to_string(),
        };
        match annal::codec::content::find(&bytes, &id, self.limits.message_object_bytes_max()) {
            Ok(Some(entry)) => match entry.canonical(limit) {
                Ok(canonical) => decode_message(&canonical, limit).err().map_or_else(String::new, |e| e.to_string()),
                Err(e) => e.to_string(),
            },
            Ok(None) => "missing".into(),
            Err(e) => e.to_string(),
        }
    }

    fn check_meta(&mut self) {
        let meta = match self.txn.open_table(META) {
            Ok(t) => t,
            Err(e) => return self.find(storage("table meta", e)),
        };
        let from = meta.get(meta_keys::CONTENT_IDS_FROM).map(|g| g.map(|g| tables::meta_u64(g.value())));
        let ids_finding =
            |detail: &str| Finding::Meta { key: meta_keys::CONTENT_IDS_FROM.into(), detail: detail.into() };
        match meta.get(meta_keys::FORMAT) {
            Ok(Some(g)) if tables::meta_u64(g.value()) == Some(tables::FORMAT as u64) => match from {
                Ok(Some(Some(_))) => {}
                Ok(Some(None)) => self.find(ids_finding("not a seq")),
                Ok(None) => self.find(ids_finding("missing")),
                Err(e) => self.find(storage("meta content_ids_from", e)),
            },
            Ok(Some(g)) if tables::meta_u64(g.value()).is_some_and(tables::readable_format) => {}
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
        let last = self.file_tip;
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
            let last = self.report.tip;
            let actual = last.map(|(_, h)| h);
            if actual != Some(expected) {
                self.find(Finding::ExpectedTip { expected, actual, seq: last.map_or(0, |(s, _)| s) });
            }
        }
    }

    /// Compares the stored projections, as a reader sees them, with the scratch fold.
    fn deep(&mut self, stored: StoredProjections<'_>) {
        if self.fold_failed {
            self.report.deep = Some(Err("the log does not fold cleanly (see the findings above)".into()));
            return;
        }
        if self.rows_lost {
            let why = "the content rows could not be read with the log (see the findings above)";
            self.report.deep = Some(Err(why.into()));
            return;
        }
        let view = match guarded("projections", stored) {
            Ok(Ok(view)) => view,
            Ok(Err(e)) => return self.unreadable(&e),
            Err(finding) => {
                self.report.deep = Some(Err("the stored projections cannot be read (see the findings above)".into()));
                return self.find(finding);
            }
        };
        let walked = self.report.tip.unwrap_or((0, self.chain.genesis()));
        if (view.seq(), view.hash()) != walked {
            let why = if view.seq() > walked.0 {
                format!(
                    "a writer appended records {}..={} while verify ran, so the stored projections (at seq {}) \
                     and the fresh fold (at seq {}) are not comparable; run verify again, or verify a copy",
                    walked.0 + 1,
                    view.seq(),
                    view.seq(),
                    walked.0
                )
            } else {
                format!(
                    "the stored projections are read at seq {} ({}), the walk ended at seq {} ({})",
                    view.seq(),
                    view.hash(),
                    walked.0,
                    walked.1
                )
            };
            self.report.deep = Some(Err(why));
            return;
        }
        let stored = match projection_digests(&view) {
            Ok(d) => d,
            Err(e) => return self.unreadable(&e),
        };
        let fresh = mem_digests(&self.store);
        for (s, f) in stored.iter().zip(&fresh) {
            if s != f {
                let table = Table::ALL.into_iter().find(|t| t.name() == s.table);
                match table {
                    Some(t) => self.first_difference(&view, t),
                    None => self.find(Finding::Projection { table: s.table, key: String::new(), detail: "differs" }),
                }
            }
        }
        self.report.deep = Some(Ok(stored.len()));
    }

    /// The stored projections cannot be read. A finding, unless the reader failed on the
    /// log and the walk has already reported the log damaged: then it is why the
    /// comparison was skipped.
    fn unreadable(&mut self, e: &annal::Error) {
        let on_the_log = match e {
            annal::Error::Decode { .. } | annal::Error::OversizedRecord { .. } => true,
            annal::Error::Corrupt { location, .. } => {
                matches!(location, Location::Log { .. } | Location::Content { .. } | Location::Meta { .. })
            }
            _ => false,
        };
        if on_the_log && !self.report.findings.is_empty() {
            let why =
                format!("the stored projections cannot be read over the damaged log (see the findings above): {e}");
            self.report.deep = Some(Err(why));
        } else {
            self.report.deep = Some(Err(format!("the stored projections cannot be read: {e}")));
            self.find(storage("projections", format!("cannot be read: {e}")));
        }
    }

    /// Reports the first key where the stored table and the fresh fold differ.
    fn first_difference(&mut self, view: &View, t: Table) {
        let empty = BTreeMap::new();
        let fresh = self.store.tables.get(&t).unwrap_or(&empty);
        let stored = match tables::projection_rows(view, t) {
            Ok(rows) => rows,
            Err(e) => return self.find(storage(&format!("projection {}", t.name()), e)),
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
    use annal::{CommitTurn, CreateSession, Engine, Expected, Message};

    /// A closed database of one session and ten turns at `dir/name`.
    fn small_database(dir: &Path, name: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        let engine = Engine::open(&path).unwrap();
        let session = engine.create_session(CreateSession::new().message(Message::system("hi"))).unwrap().session;
        for i in 0..10 {
            let turn = CommitTurn::new(session, format!("t{i}"), Expected::Any).message(Message::user(format!("{i}")));
            engine.commit_turn(turn).unwrap();
        }
        engine.close().unwrap();
        path
    }

    fn deep() -> VerifyOptions {
        VerifyOptions { deep: true, ..VerifyOptions::default() }
    }

    #[test]
    fn a_database_whose_writer_was_killed_verifies_and_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.redb");
        let engine = Engine::open(&path).unwrap();
        let session = engine.create_session(CreateSession::new().message(Message::system("hi"))).unwrap().session;
        engine.commit_turn(CommitTurn::new(session, "t1", Expected::Any).message(Message::user("one"))).unwrap();
        engine.checkpoint().unwrap();
        engine.commit_turn(CommitTurn::new(session, "t2", Expected::Any).message(Message::user("two"))).unwrap();
        // Every file as a SIGKILL of the host leaves it: taken while it is open.
        let crashed = dir.path().join("crashed.redb");
        for (from, to) in annal::database_files(&path).iter().zip(annal::database_files(&crashed)) {
            if from.exists() {
                std::fs::copy(from, to).unwrap();
            }
        }
        engine.close().unwrap();
        let bytes = || annal::database_files(&crashed).map(|f| std::fs::read(f).ok());
        let before = bytes();
        let report = verify(&crashed, &deep()).expect("a crashed database verifies");
        assert!(report.is_clean(), "{}", report.render());
        assert_eq!(report.records, 3);
        assert!(matches!(report.deep, Some(Ok(_))), "{:?}", report.deep);
        assert!(bytes() == before, "verify writes nothing to a crashed database");
    }

    #[test]
    fn a_log_file_cut_short_is_a_finding() {
        let dir = tempfile::tempdir().unwrap();
        let path = small_database(dir.path(), "cut.redb");
        let len = std::fs::metadata(&path).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len / 2).unwrap();
        let report = verify(&path, &VerifyOptions::default()).expect("a damaged file is a report, not an error");
        assert!(report.findings.iter().any(|f| f.kind() == "storage" && f.location() == "file"), "{}", report.render());
    }

    #[test]
    fn deep_reports_a_projections_file_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = small_database(dir.path(), "garbage.redb");
        let projections = annal::projections_path(&path);
        let len = std::fs::metadata(&projections).unwrap().len() as usize;
        std::fs::write(&projections, (0..len).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>()).unwrap();
        let report = verify(&path, &deep()).unwrap();
        assert!(matches!(&report.deep, Some(Err(why)) if why.contains("projections file")), "{:?}", report.deep);
        assert!(report.findings.iter().any(|f| f.location() == "projections"), "{}", report.render());
        // Without --deep the projections are not verify's business.
        assert!(verify(&path, &VerifyOptions::default()).unwrap().is_clean());
    }

    #[test]
    fn deep_is_skipped_when_the_reader_sees_another_tip() {
        let dir = tempfile::tempdir().unwrap();
        let (db, ahead) = (dir.path().join("db.redb"), dir.path().join("ahead.redb"));
        let engine = Engine::open(&db).unwrap();
        let session = engine.create_session(CreateSession::new().message(Message::system("hi"))).unwrap().session;
        engine.commit_turn(CommitTurn::new(session, "t1", Expected::Any).message(Message::user("one"))).unwrap();
        engine.close().unwrap();
        // The same log, two records further on: what a reader opened after a live writer
        // appended would see.
        std::fs::copy(&db, &ahead).unwrap();
        std::fs::copy(annal::projections_path(&db), annal::projections_path(&ahead)).unwrap();
        let engine = Engine::open(&ahead).unwrap();
        for turn in ["t2", "t3"] {
            engine.commit_turn(CommitTurn::new(session, turn, Expected::Any).message(Message::user(turn))).unwrap();
        }
        engine.close().unwrap();

        let Ok((_log, txn)) = open_log(&db) else { panic!("the log opens") };
        let limits = Limits::default();
        let opts = VerifyOptions { deep: true, ..VerifyOptions::default() };
        let stored = || Reader::open(&ahead, limits.clone(), None)?.snapshot();
        let report = verify_snapshot(&txn, &limits, &opts, &stored).unwrap();
        assert!(report.is_clean(), "{}", report.render());
        let why = match &report.deep {
            Some(Err(why)) => why.clone(),
            other => panic!("the comparison is skipped: {other:?}"),
        };
        assert!(why.starts_with("a writer appended records 3..=4 while verify ran"), "{why}");
        assert!(report.render().contains("deep: comparison skipped: a writer appended"), "{}", report.render());

        // The same snapshot against its own projections compares every table.
        let stored = || Reader::open(&db, limits.clone(), None)?.snapshot();
        let report = verify_snapshot(&txn, &limits, &opts, &stored).unwrap();
        assert!(report.is_clean(), "{}", report.render());
        assert_eq!(report.deep, Some(Ok(Table::ALL.len())));
    }

    fn r(id: ContentId, shape: Shape, seq: u64) -> Ref {
        Ref { id, shape, seq, first: seq }
    }

    #[test]
    fn reducing_references_keeps_the_deciding_one_per_id_at_any_time() {
        let (a, b) = (annal::codec::content_id(b"a"), annal::codec::content_id(b"b"));
        let refs = vec![
            r(a, Shape::Bytes, 3),
            r(b, Shape::Bytes, 9),
            r(a, Shape::Message, 7),
            r(b, Shape::Bytes, 4),
            r(a, Shape::Message, 5),
        ];
        let mut once = refs.clone();
        reduce_refs(&mut once);
        let mut expected = vec![
            Ref { id: a, shape: Shape::Message, seq: 5, first: 3 },
            Ref { id: b, shape: Shape::Bytes, seq: 4, first: 4 },
        ];
        expected.sort_unstable();
        assert_eq!(once, expected, "a message reference decides over an earlier plain one; else the first");
        // Reducing part of the list, appending the rest and reducing again gives the same.
        let mut twice = refs[..3].to_vec();
        reduce_refs(&mut twice);
        twice.extend_from_slice(&refs[3..]);
        reduce_refs(&mut twice);
        assert_eq!(twice, once);
    }

    /// A list of objects long enough to be split by the top bit of its ids and sorted in
    /// two parts comes out in the order one sort gives, copies of an id included.
    #[test]
    fn objects_sorted_in_two_parts_are_in_one_sorts_order() {
        let object = |row: u64, place: u32| Object {
            row,
            place,
            encoding: 0,
            hash_ok: true,
            decoded: Decoded::Bytes,
            intro: None,
        };
        let mut objects: Vec<(ContentId, Object)> = (0..HALVES_MIN as u64 + 5_000)
            .map(|i| {
                // Every tenth id is stored again, at a later row and another place.
                let n = if i % 10 == 9 { i - 1 } else { i };
                (annal::codec::content_id(&n.to_le_bytes()), object(1 + i / 3, (i % 3) as u32))
            })
            .collect();
        assert!(objects.iter().any(|(id, _)| id.0[0] & 0x80 != 0) && objects.iter().any(|(id, _)| id.0[0] < 0x80));
        let mut one = objects.clone();
        one.sort_unstable_by(|(a, x), (b, y)| a.cmp(b).then((x.row, x.place).cmp(&(y.row, y.place))));
        sort_objects(&mut objects);
        let key = |v: &[(ContentId, Object)]| v.iter().map(|(id, o)| (*id, o.row, o.place)).collect::<Vec<_>>();
        assert_eq!(key(&objects), key(&one));
    }

    /// A xorshift generator from `seed`: each call gives a number below its argument.
    fn below(mut state: u64) -> impl FnMut(u64) -> u64 {
        move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        }
    }

    /// The deciding reference of every id, from the objects' noted references and the
    /// kept ones, is what one reduction of all of them gives, each with its object: ids
    /// referred to only by kept references, only at their row, by both, and not at all.
    #[test]
    fn deciding_references_are_one_reductions_of_noted_and_kept_ones() {
        let ids: Vec<ContentId> = (0..12u8).map(|i| annal::codec::content_id(&[i])).collect();
        let mut next = below(0x9e37_79b9_7f4a_7c15u64);
        let shape = |n: u64| if n == 0 { Shape::Message } else { Shape::Bytes };
        for round in 0..200 {
            // Objects of about half the ids, some with references noted at their row.
            let mut objects: Vec<(ContentId, Object)> = Vec::new();
            for id in &ids {
                if next(2) == 0 {
                    let row = 1 + next(30);
                    let intro = (next(3) != 0).then(|| shape(next(2)));
                    let o = Object { row, place: 0, encoding: 0, hash_ok: true, decoded: Decoded::Message, intro };
                    objects.push((*id, o));
                }
            }
            objects.sort_unstable_by_key(|(id, _)| *id);
            let kept: Vec<Ref> = (0..next(20))
                .map(|_| {
                    let seq = 1 + next(40);
                    Ref { id: ids[next(12) as usize], shape: shape(next(2)), seq, first: seq.saturating_sub(next(3)) }
                })
                .collect();
            let mut all = kept.clone();
            all.extend(
                objects
                    .iter()
                    .filter_map(|(id, o)| o.intro.map(|s| Ref { id: *id, shape: s, seq: o.row, first: o.row })),
            );
            reduce_refs(&mut all);
            let expected: Vec<(Ref, Option<u64>)> =
                all.iter().map(|r| (*r, objects.iter().find(|(id, _)| *id == r.id).map(|(_, o)| o.row))).collect();
            let mut sorted = kept.clone();
            let mid = next(sorted.len() as u64 + 1) as usize;
            let (a, b) = sorted.split_at_mut(mid);
            a.sort_unstable_by(ref_order);
            b.sort_unstable_by(ref_order);
            let mut got = Vec::new();
            deciding_refs(&objects, a, b, &mut |r, o| got.push((r, o.map(|o| o.row))));
            assert_eq!(got, expected, "round {round}");
        }
    }

    /// Two halves sorted apart and reduced together as they are merged keep what one
    /// reduction of the whole list keeps, wherever the list is cut.
    #[test]
    fn halves_reduced_as_they_merge_keep_what_one_reduction_keeps() {
        let ids: Vec<ContentId> = (0..7u8).map(|i| annal::codec::content_id(&[i])).collect();
        let mut next = below(0x2545_f491_4f6c_dd1du64);
        for len in [0, 1, 2, 5, 17, 64] {
            let refs: Vec<Ref> = (0..len)
                .map(|_| {
                    let shape = if next(2) == 0 { Shape::Message } else { Shape::Bytes };
                    let seq = next(40);
                    Ref { id: ids[next(7) as usize], shape, seq, first: seq.saturating_sub(next(3)) }
                })
                .collect();
            let mut whole = refs.clone();
            reduce_refs(&mut whole);
            for mid in 0..=refs.len() {
                let mut cut = refs.clone();
                let (a, b) = cut.split_at_mut(mid);
                a.sort_unstable_by(ref_order);
                b.sort_unstable_by(ref_order);
                let merged: Vec<Ref> = Reduced::new(a, b).collect();
                assert_eq!(merged, whole, "{len} references cut at {mid}");
            }
            let mut sorted = refs.clone();
            let (a, b) = sort_in_halves(&mut sorted);
            assert_eq!(Reduced::new(a, b).collect::<Vec<_>>(), whole);
        }
    }
}
