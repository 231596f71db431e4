//! Commands on one long session: what an edit, a compaction, a restore, a fork and a deep
//! page read cost as a session grows. A command's cost should follow what it changes, not
//! the session's length.
//!
//! For each size N the bench builds sessions of N messages (one first message, then turns
//! of 100 messages) on a fresh database with default (durable) options, then times, on
//! each session in turn:
//!
//! - `fork at the end`: a fork of the whole session;
//! - `deep page read`: a page of 50 messages from the middle (the median of 20 reads);
//! - `edit of message 1`: a rewrite of position 1 (the first after the first message);
//! - `restore`: back to the revision before that edit;
//! - `compaction of all but 10`: every message but the last 10 replaced by one summary.
//!
//! Each figure is the median over the sessions (`--reps`), in milliseconds, and includes
//! the durable commit.

use crate::Result;
use annal::{CommitTurn, CreateSession, Engine, Expected, Message, PageRequest, Restore, Rewrite, RewriteReason};
use annal_codec::SessionId;
use std::path::PathBuf;
use std::time::Instant;

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Session sizes in messages.
    pub sizes: Vec<u64>,
    /// Sessions per size (the figures are medians over them).
    pub reps: usize,
    /// Where the databases go (a temporary directory inside it).
    pub data_dir: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config { sizes: vec![1_001, 10_001, 50_001], reps: 5, data_dir: None }
    }
}

/// Medians for one size, in milliseconds.
#[derive(Clone, Debug)]
pub struct Row {
    /// Messages in the session.
    pub n: u64,
    /// Rewrite of message 1.
    pub edit_ms: f64,
    /// Compaction of all but the last 10 messages.
    pub compaction_ms: f64,
    /// Restore of the revision before the edit.
    pub restore_ms: f64,
    /// Fork of the whole session.
    pub fork_ms: f64,
    /// A 50-message page from the middle.
    pub deep_page_ms: f64,
}

const TURN: u64 = 100;

fn body(session: u64, pos: u64) -> String {
    format!(
        "session {session} message {pos}: the agent read the file, ran the tests and found that \
         {} of them failed; it will look at the parser next.",
        pos % 97
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn build(engine: &Engine, tag: u64, n: u64) -> Result<SessionId> {
    let receipt = engine.create_session(CreateSession::new().message(Message::user(body(tag, 0))))?;
    let session = receipt.session;
    let mut pos = 1;
    let mut turn = 0;
    while pos < n {
        let count = TURN.min(n - pos);
        let mut c = CommitTurn::new(session, format!("t{turn}"), Expected::Any);
        c.messages = (pos..pos + count).map(|p| Message::assistant(body(tag, p))).collect();
        engine.commit_turn(c)?;
        pos += count;
        turn += 1;
    }
    Ok(session)
}

/// Runs every size; one database per size.
pub fn run(config: &Config) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &n in &config.sizes {
        let dir = match &config.data_dir {
            Some(d) => tempfile::tempdir_in(d)?,
            None => tempfile::tempdir()?,
        };
        let engine = Engine::open(dir.path().join("long.annal"))?;
        let (mut edit, mut compaction, mut restore, mut fork, mut page) = (vec![], vec![], vec![], vec![], vec![]);
        for rep in 0..config.reps.max(1) {
            let session = build(&engine, rep as u64, n)?;
            let before = engine.reader().head(session)?.ok_or("the session has no head")?.revision;

            let t = Instant::now();
            engine.fork_at(session, n)?;
            fork.push(ms(t));

            let mut reads = Vec::new();
            for _ in 0..20 {
                let t = Instant::now();
                let p = engine.reader().transcript(session, PageRequest::new(n / 2, 50))?;
                reads.push(ms(t));
                assert_eq!(p.messages.len() as u64, 50.min(n - n / 2));
            }
            page.push(median(reads));

            let t = Instant::now();
            let edited = engine.rewrite(Rewrite {
                session,
                expected: before,
                start: 1,
                end: 2,
                replacement: vec![Message::assistant(format!("message 1, edited in round {rep}"))],
                reason: RewriteReason::Edit,
                note: String::new(),
                actor: String::new(),
            })?;
            edit.push(ms(t));

            let t = Instant::now();
            let restored = engine.restore(Restore {
                session,
                expected: edited.revision,
                target: before,
                note: String::new(),
                actor: String::new(),
            })?;
            restore.push(ms(t));

            let t = Instant::now();
            engine.rewrite(Rewrite {
                session,
                expected: restored.revision,
                start: 0,
                end: n - 10,
                replacement: vec![Message::assistant(format!("summary of {} messages", n - 10))],
                reason: RewriteReason::Compaction,
                note: String::new(),
                actor: String::new(),
            })?;
            compaction.push(ms(t));
        }
        engine.close()?;
        rows.push(Row {
            n,
            edit_ms: median(edit),
            compaction_ms: median(compaction),
            restore_ms: median(restore),
            fork_ms: median(fork),
            deep_page_ms: median(page),
        });
    }
    Ok(rows)
}

/// The rows as a markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| N | edit of message 1 | compaction of all but 10 | restore | fork at the end | deep page read |\n\
         |---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} |\n",
            r.n, r.edit_ms, r.compaction_ms, r.restore_ms, r.fork_ms, r.deep_page_ms
        ));
    }
    s
}
