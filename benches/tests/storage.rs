//! The storage cost of rewrite history, in bytes (never in time).
//!
//! One session of 400 turns (a user message of about 300 B and an assistant message of
//! about 1 KiB, deterministic pseudo-random text) is committed with and without
//! rewrites. The bytes annal stores are the keys and values of the log file's two
//! authoritative tables, read with a raw redb read of the closed file: `log` (seq →
//! record) and the content rows ((seq, piece) → the objects that record introduced, each
//! behind a 37-byte entry header, its bytes compressed when that pays, the row cut into
//! pieces of at most `annal::pieces::PIECE_BYTES` bytes). The projections file
//! beside it is disposable (a rebuild recreates it from the log), so it is reported but
//! not counted. What the rewrites add is what keeping rewrite history costs. A naive
//! audit trail would keep one record per rewrite holding the full bodies of the
//! transcript before and after it; annal stores only the splice and the new content, so
//! its history must cost at most 1/20 of the naive one.
//!
//! The test also checks the layout those figures rest on: the log file holds only the
//! log, the content rows and meta; every content row parses and every object in it
//! decodes and hashes to its id; each distinct object is stored exactly once (a rewrite
//! stores only the replacement objects not stored before, so eighty redactions store one
//! `[redacted]` object per role); and the content-id index, a projection, points every
//! stored object at the row that holds it.
//!
//! Run with `--nocapture` to see the figures.

use annal::pieces::{ContentReader, PIECES};
use annal::tables::{CONTENT_IDS, LOG, META};
use annal::{
    CommitTurn, ContentId, CreateSession, Durability, Engine, Expected, Limits, Message, Options, Reader, RevisionId,
    Rewrite, RewriteReason, Role,
};
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Turns in the session.
const TURNS: u64 = 400;
/// Bytes of a user message, about.
const USER_BYTES: usize = 300;
/// Bytes of an assistant message, about.
const ASSISTANT_BYTES: usize = 1024;
/// A compaction runs after every this many turns.
const COMPACTION_EVERY_TURNS: u64 = 40;
/// Messages a compaction keeps at the end of the transcript.
const COMPACTION_KEEP_MESSAGES: usize = 10;
/// Bytes of a compaction summary.
const SUMMARY_BYTES: usize = 2048;
/// A redaction runs after every this many turns.
const REDACTION_EVERY_TURNS: u64 = 5;
/// The body a redaction leaves in place of a message.
const REDACTED: &str = "[redacted]";
/// annal's rewrite history may cost at most 1/this of the naive audit trail.
const NAIVE_OVER_ANNAL_MIN: u64 = 20;

/// splitmix64: a small deterministic generator, so every run writes the same bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Text of `bytes` bytes (about: words are not split) drawn from a small vocabulary.
    fn text(&mut self, bytes: usize) -> String {
        const WORDS: [&str; 24] = [
            "the",
            "build",
            "fails",
            "in",
            "storage",
            "check",
            "because",
            "commit",
            "writer",
            "batch",
            "turn",
            "session",
            "revision",
            "compaction",
            "summary",
            "tool",
            "result",
            "returned",
            "error",
            "fixed",
            "test",
            "passes",
            "now",
            "again",
        ];
        let mut out = String::with_capacity(bytes + 16);
        while out.len() < bytes {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(WORDS[self.below(WORDS.len() as u64) as usize]);
            if self.below(8) == 0 {
                out.push_str(&self.below(100_000).to_string());
            }
        }
        out
    }
}

/// Which rewrites a run performs on top of the turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rewrites {
    compaction: bool,
    redaction: bool,
}

impl Rewrites {
    const NONE: Rewrites = Rewrites { compaction: false, redaction: false };

    fn name(self) -> &'static str {
        match (self.compaction, self.redaction) {
            (false, false) => "no rewrites",
            (true, false) => "compaction every 40 turns",
            (false, true) => "redaction every 5 turns",
            (true, true) => "compaction every 40 + redaction every 5",
        }
    }
}

/// What one run stored, and what a naive audit trail would have stored.
#[derive(Debug)]
struct Measured {
    rewrites: u64,
    log_bytes: u64,
    content_bytes: u64,
    /// Content objects stored (entries across every content row).
    content_objects: u64,
    /// Distinct replacement messages the rewrites wrote (role, type, body).
    distinct_replacements: u64,
    file_bytes: u64,
    projections_file_bytes: u64,
    naive_audit_bytes: u64,
}

impl Measured {
    fn stored_bytes(&self) -> u64 {
        self.log_bytes + self.content_bytes
    }
}

fn body_bytes(transcript: &[Message]) -> u64 {
    transcript.iter().map(|m| m.body.len() as u64).sum()
}

/// The host's side of a session: the engine plus a mirror of the transcript.
struct Session<'a> {
    engine: &'a Engine,
    id: annal::SessionId,
    revision: RevisionId,
    transcript: Vec<Message>,
    rewrites: u64,
    naive_audit_bytes: u64,
    /// Every replacement message written, as (role, content type, body).
    replacements: BTreeSet<(Role, String, Vec<u8>)>,
}

impl Session<'_> {
    /// Replaces `start..end` with `replacement`, in the engine and in the mirror, and
    /// counts what a naive audit record of the rewrite would hold.
    fn rewrite(&mut self, start: usize, end: usize, replacement: Message, reason: RewriteReason) {
        let before = body_bytes(&self.transcript);
        let receipt = self
            .engine
            .rewrite(Rewrite {
                session: self.id,
                expected: self.revision,
                start: start as u64,
                end: end as u64,
                replacement: vec![replacement.clone()],
                reason,
                note: format!("{reason:?}"),
                actor: "host".into(),
            })
            .expect("rewrite");
        self.revision = receipt.revision;
        self.replacements.insert((replacement.role, replacement.content_type.clone(), replacement.body.clone()));
        self.transcript.splice(start..end, [replacement]);
        self.naive_audit_bytes += before + body_bytes(&self.transcript);
        self.rewrites += 1;
    }

    fn compact(&mut self, rng: &mut Rng) {
        let end = self.transcript.len().saturating_sub(COMPACTION_KEEP_MESSAGES);
        let summary = Message::system(rng.text(SUMMARY_BYTES));
        self.rewrite(0, end, summary, RewriteReason::Compaction);
    }

    /// Redacts one message that is neither a summary nor already redacted.
    fn redact(&mut self, rng: &mut Rng) {
        let candidates: Vec<usize> = (0..self.transcript.len())
            .filter(|&i| {
                let m = &self.transcript[i];
                m.role != annal::Role::System && m.body != REDACTED.as_bytes()
            })
            .collect();
        let at = candidates[rng.below(candidates.len() as u64) as usize];
        let redacted = Message::new(self.transcript[at].role, "text/plain", REDACTED);
        self.rewrite(at, at + 1, redacted, RewriteReason::Redaction);
    }
}

/// Runs the workload into a new database at `path` and measures it once closed.
fn run(path: &Path, rewrites: Rewrites) -> Measured {
    let options = Options { durability: Durability::Relaxed, ..Options::default() };
    let engine = Engine::open_with(path, options).expect("open");
    let created = engine.create_session(CreateSession::new().label("workload", "storage")).expect("create");
    let mut session = Session {
        engine: &engine,
        id: created.session,
        revision: created.receipt.revision,
        transcript: Vec::new(),
        rewrites: 0,
        naive_audit_bytes: 0,
        replacements: BTreeSet::new(),
    };
    // Separate generators: the turns are the same bytes whatever rewrites run.
    let mut turn_rng = Rng(0x5eed_0001);
    let mut rewrite_rng = Rng(0x5eed_0002);
    for t in 1..=TURNS {
        let user = Message::user(turn_rng.text(USER_BYTES));
        let assistant = Message::assistant(turn_rng.text(ASSISTANT_BYTES));
        let turn = CommitTurn::new(session.id, format!("turn-{t}"), Expected::Exact(session.revision))
            .message(user.clone())
            .message(assistant.clone())
            .usage("anthropic", "claude", 2_000 + t, 300);
        session.revision = engine.commit_turn(turn).expect("commit turn").receipt().revision;
        session.transcript.extend([user, assistant]);
        if rewrites.redaction && t.is_multiple_of(REDACTION_EVERY_TURNS) {
            session.redact(&mut rewrite_rng);
        }
        if rewrites.compaction && t.is_multiple_of(COMPACTION_EVERY_TURNS) {
            session.compact(&mut rewrite_rng);
        }
    }
    let head = engine.head(session.id).expect("head").expect("session exists");
    assert_eq!(head.message_count, session.transcript.len() as u64, "the engine's head follows the host's mirror");
    assert_eq!(head.revision, session.revision);
    let (rewrite_count, naive_audit_bytes) = (session.rewrites, session.naive_audit_bytes);
    let distinct_replacements = session.replacements.len() as u64;
    engine.close().expect("close");

    let (measured, objects) = {
        let db = redb::Database::open(path).expect("reopen raw");
        let txn = db.begin_read().expect("read");
        let tables: BTreeSet<String> = txn.list_tables().expect("list tables").map(|t| t.name().to_string()).collect();
        let expected: BTreeSet<String> =
            [LOG.name(), PIECES.name(), CONTENT_IDS.name(), META.name()].map(String::from).into();
        assert_eq!(tables, expected, "the log file holds only the log, the content rows and their ids, and meta");
        let objects = content_objects(&txn);
        let measured = Measured {
            rewrites: rewrite_count,
            log_bytes: table_bytes(&txn, LOG),
            // The rows and the ids listed beside them.
            content_bytes: table_bytes(&txn, PIECES) + table_bytes(&txn, CONTENT_IDS),
            content_objects: objects.len() as u64,
            distinct_replacements,
            file_bytes: std::fs::metadata(path).expect("file size").len(),
            projections_file_bytes: std::fs::metadata(annal::projections_path(path))
                .expect("projections file size")
                .len(),
            naive_audit_bytes,
        };
        (measured, objects)
    };
    check_content_index(path, &objects);
    measured
}

/// The content-id index (a projection, read through a reader of the closed database)
/// lists, under the first 8 bytes of each stored object's id, the content row that holds
/// it, and nothing else.
fn check_content_index(path: &Path, objects: &BTreeMap<ContentId, u64>) {
    let reader = Reader::open(path, Limits::default(), None).expect("open reader");
    let view = reader.snapshot().expect("view");
    let index: BTreeMap<Vec<u8>, Vec<u64>> = annal::buckets::CONTENT
        .all(&view, &[])
        .expect("content index entries")
        .into_iter()
        .map(|(k, v)| {
            let mut rest = v.as_slice();
            let mut seqs = Vec::new();
            while !rest.is_empty() {
                let n = rest.iter().position(|b| b & 0x80 == 0).expect("a whole varint") + 1;
                seqs.push(rest[..n].iter().rev().fold(0u64, |acc, b| (acc << 7) | u64::from(b & 0x7f)));
                rest = &rest[n..];
            }
            (k, seqs)
        })
        .collect();
    let mut expected: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
    for (id, seq) in objects {
        expected.entry(id.0[..annal::buckets::CONTENT_KEY_BYTES].to_vec()).or_default().push(*seq);
    }
    expected.values_mut().for_each(|seqs| seqs.sort_unstable());
    assert_eq!(index, expected, "the content-id index lists every stored object's row under its key");
}

/// Every object in the content rows, by id, with the seq of the row that holds it. Every
/// row must parse, every object must hash to its id, and no id may be stored twice.
fn content_objects(txn: &redb::ReadTransaction) -> BTreeMap<ContentId, u64> {
    let table = ContentReader::open(txn).expect("open content rows");
    let mut objects = BTreeMap::new();
    for row in table.iter().expect("iterate") {
        let (seq, row) = row.expect("row");
        let mut entries = 0;
        for entry in annal::codec::content::entries(&row, Limits::default().content_bytes_max) {
            let entry = entry.unwrap_or_else(|e| panic!("content row {seq}: {e}"));
            let canonical = entry.verify(Limits::default().content_bytes_max);
            assert!(canonical.is_some(), "content row {seq}: object {} decodes and hashes to its id", entry.id);
            assert!(objects.insert(entry.id, seq).is_none(), "object {} is stored twice", entry.id);
            entries += 1;
        }
        assert!(entries > 0, "content row {seq} is empty");
    }
    objects
}

/// Bytes of every key and value in a table.
fn table_bytes<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> u64 {
    let table = txn.open_table(def).expect("open table");
    let mut total = 0u64;
    for entry in table.iter().expect("iterate") {
        let (k, v) = entry.expect("entry");
        total += K::as_bytes(&k.value()).as_ref().len() as u64 + V::as_bytes(&v.value()).as_ref().len() as u64;
    }
    total
}

#[test]
fn rewrite_history_costs_a_small_fraction_of_a_naive_audit_trail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let baseline = run(&dir.path().join("none.redb"), Rewrites::NONE);
    assert_eq!(baseline.rewrites, 0);
    assert_eq!(baseline.content_objects, 2 * TURNS, "every turn stores its two messages, once");
    println!(
        "{:<42} | {:>8} | {:>12} | {:>12} | {:>12} | {:>12} | {:>10} | {:>10}",
        "workload (400 turns)",
        "rewrites",
        "log+content",
        "history",
        "naive audit",
        "naive/annal",
        "log file",
        "proj file"
    );
    println!(
        "{:<42} | {:>8} | {:>12} | {:>12} | {:>12} | {:>12} | {:>10} | {:>10}",
        Rewrites::NONE.name(),
        0,
        baseline.stored_bytes(),
        0,
        0,
        "-",
        baseline.file_bytes,
        baseline.projections_file_bytes
    );
    let variants = [
        Rewrites { compaction: true, redaction: false },
        Rewrites { compaction: false, redaction: true },
        Rewrites { compaction: true, redaction: true },
    ];
    for (i, rewrites) in variants.into_iter().enumerate() {
        let m = run(&dir.path().join(format!("variant{i}.redb")), rewrites);
        assert!(m.rewrites > 0);
        assert_eq!(
            m.content_objects,
            baseline.content_objects + m.distinct_replacements,
            "{}: the rewrites store each distinct replacement once, and nothing else",
            rewrites.name()
        );
        let history = m.stored_bytes().checked_sub(baseline.stored_bytes()).expect("rewrites never shrink the log");
        println!(
            "{:<42} | {:>8} | {:>12} | {:>12} | {:>12} | {:>11.1}x | {:>10} | {:>10}",
            rewrites.name(),
            m.rewrites,
            m.stored_bytes(),
            history,
            m.naive_audit_bytes,
            m.naive_audit_bytes as f64 / history.max(1) as f64,
            m.file_bytes,
            m.projections_file_bytes
        );
        println!(
            "    log {} B (baseline {} B), content {} B in {} objects (baseline {} B in {})",
            m.log_bytes,
            baseline.log_bytes,
            m.content_bytes,
            m.content_objects,
            baseline.content_bytes,
            baseline.content_objects
        );
        assert!(
            history * NAIVE_OVER_ANNAL_MIN <= m.naive_audit_bytes,
            "{}: rewrite history costs {history} B, more than 1/{NAIVE_OVER_ANNAL_MIN} of the naive {} B",
            rewrites.name(),
            m.naive_audit_bytes
        );
    }
}
