//! annal, used the way its host guide says: one [`Engine`] shared by every thread,
//! default (durable) options, and writes that name the head they were computed from.
//!
//! The engine runs on redb's file backend wrapped in [`FaultyBackend`] with no faults
//! switched on. The wrapper only counts `sync_data` calls and the bytes written, so the
//! harness can report how many commits each fsync carried and what each file wrote.

use super::{fork_id, Cursor, Head, SessionStore, StoreKind};
use crate::workload::{Msg, Op, Role, Turn};
use crate::Result;
use annal::fault::{Faults, FaultyBackend};
use annal::{
    AppendContext, Command, CommitTurn, CreateSession, Durability, Engine, Expected, Fork, Message, Options,
    PageRequest, ProjectionSet, Restore, RevisionId, Rewrite, RewriteReason, SessionId,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The database file inside the store's directory.
pub const FILE: &str = "annal.redb";

/// annal behind the [`SessionStore`] trait.
pub struct AnnalStore {
    kind: StoreKind,
    engine: Engine,
    /// The counters of each file: the log file, the projections file, the journal (its
    /// two files together).
    files: [(&'static str, Faults); 3],
    forks: AtomicU64,
}

fn role(r: Role) -> annal::Role {
    match r {
        Role::System => annal::Role::System,
        Role::User => annal::Role::User,
        Role::Assistant => annal::Role::Assistant,
        Role::Tool => annal::Role::Tool,
    }
}

fn message(m: &Msg) -> Message {
    Message::new(role(m.role), m.content_type, m.body.clone())
}

fn turn_command(session: SessionId, t: &Turn, expected: Expected) -> CommitTurn {
    let mut c = CommitTurn::new(session, t.id.clone(), expected).usage("provider", "model", t.usage.0, t.usage.1);
    c.messages = t.messages.iter().map(message).collect();
    if let Some(key) = &t.apply_context {
        c = c.apply_context(key.clone());
    }
    c
}

/// What [`projection_footprint`] measures.
pub struct Footprint {
    /// Events in the log.
    pub events: u64,
    /// Rows of the projections table.
    pub rows: u64,
    /// The bytes of their keys and values (redb's `stored_bytes`: no page overhead or
    /// free space).
    pub bytes: u64,
    /// The bytes of each logical table's rows (physical key and value), largest first.
    pub by_table: Vec<(&'static str, u64)>,
}

/// The projections of the closed database in `dir`, for rows and bytes per event.
pub fn projection_footprint(dir: &Path) -> Result<Footprint> {
    use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};
    let path = dir.join(FILE);
    let events = annal::Reader::open(&path, annal::Limits::default(), None)?.tip()?.0;
    let db = redb::Builder::new().open_read_only(annal::projections_path(&path))?;
    let txn = db.begin_read()?;
    let table = txn.open_table(annal::tables::PROJECTIONS)?;
    let mut by_table = std::collections::BTreeMap::new();
    for row in table.iter()? {
        let (k, v) = row?;
        let name = annal::tables::logical_key(k.value()).map_or("(malformed)", |(t, _)| t.name());
        *by_table.entry(name).or_insert(0u64) += (k.value().len() + v.value().len()) as u64;
    }
    let mut by_table: Vec<_> = by_table.into_iter().collect();
    by_table.sort_by_key(|&(name, bytes)| (std::cmp::Reverse(bytes), name));
    Ok(Footprint { events, rows: table.len()?, bytes: table.stats()?.stored_bytes(), by_table })
}

impl AnnalStore {
    /// Opens (or creates) `dir/annal.redb`, its projections file and its journal with
    /// default options. Each file sits behind a [`Faults`] of its own (the journal's two
    /// files behind one), and the store's counters (fsyncs, bytes written) are their
    /// sums: the journal, the log and every checkpoint.
    pub fn open(dir: &Path) -> Result<AnnalStore> {
        AnnalStore::open_with(dir, Options::default())
    }

    /// Opens (or creates) the store with `options`.
    pub fn open_with(dir: &Path, options: Options) -> Result<AnnalStore> {
        let options_other_mode = options.multi_process_readers != Options::default().multi_process_readers;
        let zstd = options.compression == annal::Compression::Zstd;
        let files = [("log", Faults::new()), ("projections", Faults::new()), ("journal", Faults::new())];
        let backend = |path: &Path, faults: &Faults| -> Result<FaultyBackend<redb::backends::FileBackend>> {
            let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
            Ok(FaultyBackend::new(redb::backends::FileBackend::new(file)?, faults.clone()))
        };
        let log = backend(&dir.join(FILE), &files[0].1)?;
        let projections = backend(&annal::projections_path(dir.join(FILE)), &files[1].1)?;
        let [first, second] = annal::journal_paths(&dir.join(FILE));
        let journal = [backend(&first, &files[2].1)?, backend(&second, &files[2].1)?];
        let engine = Engine::open_with_journal(log, projections, journal, options)?;
        let kind = if zstd {
            StoreKind::AnnalZstd
        } else if options_other_mode {
            StoreKind::AnnalOtherMode
        } else {
            StoreKind::Annal
        };
        Ok(AnnalStore { kind, engine, files, forks: AtomicU64::new(0) })
    }
}

/// Creates the store in `dir` holding `ids.len()` sessions: session `i` gets the system
/// prompt and then `turns[i]`. The load runs through an engine opened with relaxed
/// durability, the mode annal documents for bulk import, in batches of 512 commands;
/// a final durable commit through a default engine then makes it all durable.
pub fn bulk_load(
    dir: &Path,
    ids: &[[u8; 16]],
    system: &Msg,
    turns: &[Vec<Turn>],
    compression: annal::Compression,
) -> Result<()> {
    const CHUNK: usize = 512;
    let options = Options { durability: Durability::Relaxed, compression, ..Options::default() };
    let loader = Engine::open_with(dir.join(FILE), options)?;
    for (id, session_turns) in ids.iter().zip(turns) {
        let session = SessionId(*id);
        let mut commands = vec![Command::CreateSession(CreateSession::with_id(session).message(message(system)))];
        for t in session_turns {
            commands.push(Command::CommitTurn(turn_command(session, t, Expected::Any)));
            if commands.len() == CHUNK {
                loader.batch(std::mem::take(&mut commands))?;
            }
        }
        if !commands.is_empty() {
            loader.batch(commands)?;
        }
    }
    loader.close()?;
    let store = AnnalStore::open_with(dir, Options { compression, ..Options::default() })?;
    store.create(super::fork_id(u64::MAX), system)?;
    Box::new(store).close()
}

impl SessionStore for AnnalStore {
    fn kind(&self) -> StoreKind {
        self.kind
    }

    fn create(&self, id: [u8; 16], system: &Msg) -> Result<Cursor> {
        let created = self.engine.create_session(CreateSession::with_id(SessionId(id)).message(message(system)))?;
        let revision = created.receipt.revision.0;
        Ok(Cursor { id, revision, before_compaction: revision })
    }

    fn apply(&self, cursor: &mut Cursor, op: &Op) -> Result<()> {
        let session = SessionId(cursor.id);
        let head = RevisionId(cursor.revision);
        match op {
            Op::Turn(t) => {
                let receipt = self.engine.commit_turn(turn_command(session, t, Expected::Exact(head)))?.receipt();
                cursor.revision = receipt.revision.0;
            }
            Op::Context { key, content } => {
                self.engine.append_context(AppendContext {
                    session,
                    key: key.clone(),
                    content: content.clone(),
                    source: "memory".into(),
                })?;
            }
            Op::Compact { start, end, summary } => {
                let receipt = self.engine.rewrite(Rewrite {
                    session,
                    expected: head,
                    start: *start,
                    end: *end,
                    replacement: vec![message(summary)],
                    reason: RewriteReason::Compaction,
                    note: "compaction".into(),
                    actor: "host".into(),
                })?;
                cursor.before_compaction = cursor.revision;
                cursor.revision = receipt.revision.0;
            }
            Op::Restore => {
                let receipt = self.engine.restore(Restore {
                    session,
                    expected: head,
                    target: RevisionId(cursor.before_compaction),
                    note: "undo compaction".into(),
                    actor: "host".into(),
                })?;
                cursor.revision = receipt.revision.0;
            }
            Op::Fork { index } => {
                let child = SessionId(fork_id(self.forks.fetch_add(1, Ordering::Relaxed)));
                self.engine.fork(Fork {
                    parent: session,
                    session: child,
                    index: *index,
                    replacement: None,
                    labels: None,
                })?;
            }
        }
        Ok(())
    }

    fn head(&self, id: [u8; 16]) -> Result<Head> {
        let head = self.engine.head(SessionId(id))?.ok_or("no such session")?;
        Ok(Head { message_count: head.message_count, events: head.stream_seq })
    }

    fn page(&self, id: [u8; 16], offset: u64, limit: u64) -> Result<u64> {
        let page = self.engine.transcript(SessionId(id), PageRequest::new(offset, limit))?;
        Ok(page.messages.iter().map(|m| m.message.body.len() as u64).sum())
    }

    fn rebuild(&self) -> Result<u64> {
        Ok(self.engine.rebuild(ProjectionSet::all())?.events)
    }

    fn syncs(&self) -> Option<u64> {
        Some(self.files.iter().map(|(_, f)| f.syncs()).sum())
    }

    fn written_bytes(&self) -> Option<u64> {
        Some(self.files.iter().map(|(_, f)| f.bytes_written()).sum())
    }

    fn written_bytes_by_file(&self) -> Vec<(&'static str, u64)> {
        self.files.iter().map(|(name, f)| (*name, f.bytes_written())).collect()
    }

    fn quiesce(&self) -> Result<()> {
        Ok(self.engine.checkpoint()?)
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.engine.close()?;
        Ok(())
    }
}

/// Measures recovery: the time from opening a database whose last checkpoint is a whole
/// delta behind the log (as after SIGKILL just before a checkpoint) to its first head
/// read. A live engine commits one event short of the default checkpoint policy's event
/// trigger (turns of the agent shape, 16 committers, durable), so nothing has been
/// checkpointed; both files are then copied while it is still open, which is what a
/// kill -9 leaves on disk, and the copy is opened and timed (median of 5).
pub fn recovery(dir: &Path, system: &Msg, seed: u64, report: &mut crate::report::Report) -> Result<()> {
    use crate::report::Entry;
    use crate::rng::SplitMix64;
    std::fs::create_dir_all(dir.join("live"))?;
    let live = dir.join("live").join(FILE);
    let policy = annal::CheckpointPolicy { interval: std::time::Duration::from_secs(3600), ..Default::default() };
    let events = policy.events - 1;
    let engine = Engine::open_with(&live, Options { checkpoint: policy, ..Options::default() })?;
    let committers = 16u64;
    let per = events / committers;
    let probe = SessionId(super::fork_id(0));
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..committers)
            .map(|c| {
                let engine = &engine;
                scope.spawn(move || -> Result<()> {
                    let session = if c == 0 { probe } else { SessionId(super::fork_id(c)) };
                    engine.create_session(CreateSession::with_id(session).message(message(system)))?;
                    let mut rng = SplitMix64::derive(seed ^ 0x5EC0, c);
                    for t in 1..per {
                        let turn = crate::workload::tiny_turn(&mut rng, c, t, 64);
                        engine.commit_turn(turn_command(session, &turn, Expected::Any))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "committer panicked")??;
        }
        Ok(())
    })?;
    let committed = engine.stats().events;
    if engine.stats().checkpoints != 0 {
        return Err("a checkpoint ran before the copy: the delta would not be full".into());
    }
    let mut times = Vec::new();
    for i in 0..5 {
        let copy = dir.join(format!("copy{i}"));
        std::fs::create_dir_all(&copy)?;
        for (from, to) in annal::database_files(&live).iter().zip(annal::database_files(&copy.join(FILE))) {
            if from.exists() {
                std::fs::copy(from, to)?;
            }
        }
        let t = std::time::Instant::now();
        let reopened = Engine::open(copy.join(FILE))?;
        let head = reopened.head(probe)?.ok_or("no head after recovery")?;
        times.push(t.elapsed());
        if head.stream_seq != per {
            return Err(format!("recovered head has {} events, expected {per}", head.stream_seq).into());
        }
        reopened.close()?;
    }
    engine.close()?;
    times.sort_unstable();
    let median = times[times.len() / 2];
    report.push(Entry::new("annal", "recovery_first_head_ms", None, median.as_secs_f64() * 1e3, "ms"));
    report.push(Entry::new("annal", "recovery_events", None, committed as f64, "events"));
    Ok(())
}
