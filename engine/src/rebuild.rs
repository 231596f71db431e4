//! Rebuilding projections: the checkpointer run from sequence 0 for the chosen
//! projections, with the same `evolve`, bounded memory and writes in physical key order
//! (`checkpoint::catch_up`). [`crate::Engine::rebuild`] runs it through the writer on a
//! live engine; [`rebuild_offline`] runs it on a database no process has open.

use crate::checkpoint::{self, Cursors};
use crate::engine::{projections_path, Options};
use crate::error::{fail_closed, Error, Result};
use crate::projection::{Projection, ProjectionSet};
use annal_codec::LogChain;
use redb::ReadableDatabase;
use std::path::Path;
use std::time::Duration;

/// What a rebuild did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebuildStats {
    /// Events folded.
    pub events: u64,
    /// Bytes of records read.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Called with (events done, events total) while a rebuild runs.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// redb's page cache for the log file an offline rebuild reads: the fold reads it once,
/// in order, so only its branch pages are read again.
pub const REBUILD_LOG_CACHE_BYTES: usize = 4 << 20;

/// redb's page cache for the projections file an offline rebuild writes. The fold reads
/// back only the rows of sessions it flushed earlier, and writes in bounded flushes; a
/// cache of redb's default size (1 GiB) filled with pages written once (on 1,000,000
/// events: peak RSS 2.2 GB against 149 MB, and 27 s against 23 s).
pub const REBUILD_PROJECTIONS_CACHE_BYTES: usize = 16 << 20;

/// Rebuilds the projections in `set` of the database at `path`, which no other process
/// may have open for writing: the log is opened read-only, the projections file for
/// writing, and the rebuild commits in one durable transaction (readers see the old
/// projections or the new ones). Projections outside `set` that are behind the log are
/// brought up to it in the same pass. Returns what the fold read.
pub fn rebuild_offline(
    path: impl AsRef<Path>,
    options: &Options,
    set: ProjectionSet,
    progress: Progress<'_>,
) -> Result<RebuildStats> {
    let chunks = Chunks { events: checkpoint::FOLD_CHUNK_EVENTS, held_bytes: checkpoint::FOLD_HELD_BYTES };
    rebuild_offline_in_chunks(path.as_ref(), options, set, progress, chunks)
}

/// Where a full rebuild hands its writes over: every `events` events, with the content-id
/// index's rows once they take more than `held_bytes` (and after the last event).
#[derive(Clone, Copy, Debug)]
struct Chunks {
    events: u64,
    held_bytes: usize,
}

/// [`rebuild_offline`], handing over the fold's writes at `chunks`.
fn rebuild_offline_in_chunks(
    path: &Path,
    options: &Options,
    set: ProjectionSet,
    progress: Progress<'_>,
    chunks: Chunks,
) -> Result<RebuildStats> {
    let chain = options.chain_key.map_or_else(LogChain::plain, LogChain::keyed);
    fail_closed("rebuild", || {
        let mut b = redb::Builder::new();
        b.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
        b.set_cache_size(REBUILD_LOG_CACHE_BYTES);
        let log = b.open_read_only(path)?;
        let log_txn = log.begin_read()?;
        let tip = match crate::log::check_log(&log_txn, &chain)? {
            crate::log::LogState::Ready => crate::log::load_tip(&log_txn, &chain)?,
            crate::log::LogState::New => return Err(Error::storage(format!("{} holds no log", path.display()))),
        };
        let final_path = projections_path(path);
        // Every projection from 0 (the usual rebuild): fold into a new file beside the
        // old one, written by a second thread, then put it in the old one's place.
        let all = ProjectionSet::all();
        if set == all {
            return rebuild_into_new_file(
                &LogSource { txn: &log_txn, chain: &chain, limits: &options.limits, tip: &tip },
                &final_path,
                progress,
                chunks,
            );
        }
        let projections = redb::Builder::new().set_cache_size(REBUILD_PROJECTIONS_CACHE_BYTES).create(&final_path)?;
        let current =
            checkpoint::read_cursors(&projections.begin_read()?, &log_txn, &Default::default(), &chain, &tip)?;
        let cursors = Cursors { seqs: [tip.seq; Projection::ALL.len()] }.reset(set).reset(current.behind(tip.seq));
        if cursors.behind(1) == all {
            drop(projections);
            return rebuild_into_new_file(
                &LogSource { txn: &log_txn, chain: &chain, limits: &options.limits, tip: &tip },
                &final_path,
                progress,
                chunks,
            );
        }
        checkpoint::catch_up(
            &projections,
            &log_txn,
            &chain,
            &options.limits,
            &tip,
            &cursors,
            redb::Durability::Immediate,
            progress,
            checkpoint::Folding::default(),
        )
    })
}

/// The file a full rebuild writes before it replaces the projections file.
pub fn rebuild_path(projections: &Path) -> std::path::PathBuf {
    let mut name = projections.as_os_str().to_owned();
    name.push(".rebuild");
    std::path::PathBuf::from(name)
}

/// The log a rebuild folds: a snapshot of it, its chain, limits and tip.
#[derive(Clone, Copy)]
struct LogSource<'a> {
    txn: &'a redb::ReadTransaction,
    chain: &'a LogChain,
    limits: &'a crate::limits::Limits,
    tip: &'a crate::log::Tip,
}

/// Chunks a full rebuild's fold runs ahead of the thread that writes them.
const CHUNKS_AHEAD: usize = 2;

/// What a full rebuild's fold reads under its overlay: the chunks folded but not yet
/// committed to the new file (newest first wins), then a snapshot of the file.
struct Folded {
    chunks: std::collections::VecDeque<std::sync::Arc<crate::store::Writes>>,
    snapshot: crate::delta::Checkpoint,
}

impl Folded {
    fn new(txn: redb::ReadTransaction) -> Result<Folded> {
        Ok(Folded { chunks: Default::default(), snapshot: crate::delta::Checkpoint::new(txn)? })
    }
}

impl crate::store::Store for Folded {
    fn read(&self, table: crate::Table, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>) -> Result<()>) -> Result<()> {
        crate::store::with_physical(table, key, |physical| {
            if let Some(v) = self.chunks.iter().rev().find_map(|c| c.get(physical)) {
                return f(v.as_deref().map(Vec::as_slice));
            }
            self.snapshot.read(physical, f)
        })
    }
    fn put(&mut self, _: crate::Table, _: &[u8], _: &[u8]) -> Result<()> {
        Err(Error::storage("the rebuild's folded rows are read-only"))
    }
    fn remove(&mut self, _: crate::Table, _: &[u8]) -> Result<()> {
        Err(Error::storage("the rebuild's folded rows are read-only"))
    }
}

/// A rebuild of every projection into a new file beside the projections file
/// ([`fold_into`]), which then replaces it by a rename: a reader sees the old projections
/// or the new ones. A rebuild that fails removes the new file and leaves the projections
/// file as it was; one that is killed leaves the new file, which the next rebuild
/// removes first.
fn rebuild_into_new_file(
    log: &LogSource<'_>,
    final_path: &Path,
    progress: Progress<'_>,
    chunks: Chunks,
) -> Result<RebuildStats> {
    let temp = rebuild_path(final_path);
    let remove_temp = || match std::fs::remove_file(&temp) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::storage_in(format_args!("remove {}", temp.display()), e)),
    };
    remove_temp()?;
    let rebuilt = fold_into(&temp, log, progress, chunks);
    if rebuilt.is_err() {
        // What the failed rebuild wrote goes; the projections file was never touched.
        let _ = remove_temp();
        return rebuilt;
    }
    std::fs::rename(&temp, final_path)
        .map_err(|e| Error::storage_in(format_args!("rename {} over {}", temp.display(), final_path.display()), e))?;
    crate::purge::sync_dir(final_path)?;
    rebuilt
}

/// The fold and the writes of [`rebuild_into_new_file`], into the new file at `temp`,
/// on four threads: a reading thread reads and decodes the log ahead of the fold; each
/// chunk of `handover.events` events ([`checkpoint::FOLD_CHUNK_EVENTS`]) folds on two
/// threads, as a catch-up's does ([`checkpoint::fold_chunk_on_two`]: [`checkpoint::SECOND_FOLD`]'s
/// projections on the second, every other one on this), each through a write-back
/// overlay; this thread then hands the chunk's writes over, except the content-id
/// index's rows, which are held until they take more than `handover.held_bytes`
/// ([`checkpoint::FOLD_HELD_BYTES`]) or the log ends (the index is hashed over the whole
/// log, so every chunk would rewrite nearly all of it); a writing thread sorts each chunk
/// in physical key order, writes it in a commit of its own with no fsync, and hands back
/// a snapshot of the file. Both folds read the held rows, then the chunks not yet
/// committed (newest first), then a snapshot, and run at most [`CHUNKS_AHEAD`] chunks
/// ahead (bounded memory). The last commit writes the cursors and the checkpoint mark at
/// the tip, durably.
fn fold_into(temp: &Path, log: &LogSource<'_>, progress: Progress<'_>, handover: Chunks) -> Result<RebuildStats> {
    use crate::store::{Writes, Written, WRITTEN_KEYS_MAX};
    use std::sync::Arc;

    let LogSource { txn: log_txn, chain, limits, tip } = *log;
    let started = std::time::Instant::now();
    let db = redb::Builder::new()
        .set_cache_size(REBUILD_PROJECTIONS_CACHE_BYTES)
        .create(temp)
        .map_err(|e| Error::storage_in(format_args!("create {}", temp.display()), e))?;
    {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::None)?;
        crate::tables::create_projection_tables(&txn)?;
        txn.commit()?;
    }
    let (to_writer, chunks) = crossbeam_channel::bounded::<Arc<Writes>>(CHUNKS_AHEAD + 1);
    let (to_fold, snapshots) = crossbeam_channel::unbounded::<Result<redb::ReadTransaction>>();
    let (events, bytes) = std::thread::scope(|scope| -> Result<(u64, u64)> {
        // Owned here, so that a fold that fails closes the channel and the writing
        // thread ends.
        let to_writer = to_writer;
        let db = &db;
        scope.spawn(move || {
            let mut written = Written::new(WRITTEN_KEYS_MAX);
            for writes in chunks {
                let committed = (|| -> Result<redb::ReadTransaction> {
                    let mut txn = db.begin_write()?;
                    txn.set_durability(redb::Durability::None)?;
                    crate::tables::RedbStore::open(&txn)?.apply(&writes, Some(&mut written))?;
                    txn.commit()?;
                    Ok(db.begin_read()?)
                })();
                let failed = committed.is_err();
                if to_fold.send(committed).is_err() || failed {
                    return;
                }
            }
        });
        let mut base = Folded::new(db.begin_read()?)?;
        // A third thread reads and decodes the log ahead of the fold, in batches.
        let mut next_entry = crate::log::read_ahead(
            scope,
            log_txn,
            chain,
            0,
            tip.seq,
            limits.record_bytes_max,
            limits.message_object_bytes_max(),
        );
        // The writing thread stops at its first failure, after handing it over: that
        // failure, not the closed channel, is what the rebuild reports.
        let stopped = || {
            snapshots
                .try_iter()
                .find_map(|s| s.err())
                .unwrap_or_else(|| Error::storage("the rebuild's writing thread stopped"))
        };
        let (mut events, mut bytes) = (0u64, 0u64);
        // The content-id index is held across the chunks, up to a bound.
        let mut held = crate::store::HeldRows::new(crate::Table::ContentIndex);
        // Every projection is folded from 0.
        let from_zero = Cursors { seqs: [0; Projection::ALL.len()] };
        // A rewrite's transcript fold reads the lists of records folded before it.
        let records = crate::log::FileRecords::new(log_txn, None, limits.record_bytes_max);
        loop {
            let folded = checkpoint::fold_chunk_on_two(
                &base,
                &mut held,
                &records,
                &from_zero,
                &mut next_entry,
                checkpoint::ChunkLimits {
                    events: handover.events,
                    held_bytes: handover.held_bytes,
                    left: log.tip.seq - events,
                },
            )?;
            let last = folded.events < handover.events;
            let writes = Arc::new(folded.writes);
            events += folded.events;
            bytes += folded.bytes;
            if !writes.is_empty() {
                base.chunks.push_back(writes.clone());
                to_writer.send(writes).map_err(|_| stopped())?;
            }
            progress(events, tip.seq);
            // Take every snapshot that is ready; wait while too many chunks are in
            // flight, or for all of them after the last.
            while !base.chunks.is_empty() {
                let snapshot = if last || base.chunks.len() > CHUNKS_AHEAD {
                    snapshots.recv().map_err(|_| stopped())?
                } else {
                    match snapshots.try_recv() {
                        Ok(s) => s,
                        Err(_) => break,
                    }
                };
                let chunks = std::mem::take(&mut base.chunks);
                base = Folded::new(snapshot?)?;
                base.chunks = chunks;
                base.chunks.pop_front();
            }
            if last {
                return Ok((events, bytes));
            }
        }
    })?;
    if events != tip.seq {
        return Err(Error::storage(format!("the rebuild folded {events} events of {}", tip.seq)));
    }
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    checkpoint::write_cursors(&txn, ProjectionSet::all(), tip.seq, &tip.hash)?;
    txn.commit()?;
    Ok(RebuildStats { events, bytes, elapsed: started.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Written;
    use crate::tables::{meta_keys, meta_u64, LOG, META};
    use crate::{CommitTurn, CreateSession, Engine, Expected, Location, Message};
    use redb::{ReadableDatabase, ReadableTable};

    /// The seq of a record of [`workload`] that brings content of its own: the turn of the
    /// second session in round 2 (6 creations, 6 turns a round, and 4 label changes after
    /// round 1's turns).
    const TURN_WITH_CONTENT: u64 = 24;

    /// Six sessions of seven turns each, turn after turn across the sessions, with tool
    /// calls and label changes between the rounds, so that a chunk of a few events reads
    /// the rows that earlier chunks wrote. Returns the live projections' digests and the
    /// tip.
    fn workload(path: &Path) -> (Vec<crate::query::TableDigest>, u64) {
        let engine = Engine::open(path).unwrap();
        let mut sessions = Vec::new();
        for i in 0..6 {
            let session = CreateSession::new().label("n", i.to_string()).message(Message::system("be brief"));
            let created = engine.create_session(session).unwrap();
            sessions.push((created.session, created.receipt.revision));
        }
        for round in 0..7 {
            for (session, revision) in sessions.iter_mut() {
                let turn = CommitTurn::new(*session, format!("turn-{round}"), Expected::Exact(*revision))
                    .message(Message::user(format!("question {round}")))
                    .message(Message::assistant(format!("answer {round} of {session:?}")))
                    .usage("provider", "model", 10, 20);
                *revision = engine.commit_turn(turn).unwrap().receipt().revision;
            }
            // Tool calls: settled at once by some sessions, rounds later by the others,
            // so that a settlement's removals fall in the chunk of the call and in a
            // later one.
            for (i, (session, _)) in sessions.iter().enumerate() {
                if round == 2 || round == 4 {
                    engine.record_tool_call(tool_call(*session, round, i)).unwrap();
                }
                if round == 2 && i % 2 == 0 {
                    engine.record_tool_result(tool_result(*session, round, i)).unwrap();
                }
                if round == 5 {
                    for called in [2, 4] {
                        if called != 2 || i % 2 == 1 {
                            engine.record_tool_result(tool_result(*session, called, i)).unwrap();
                        }
                    }
                }
                // Labels changed and removed in some rounds: the label index and the
                // counts lose rows written in this chunk and in earlier ones.
                if (round == 1 || round == 3) && i % 3 != 2 {
                    let set = [("phase".to_string(), round.to_string()), ("n".to_string(), format!("{i}-{round}"))];
                    let remove =
                        if round == 3 && i % 3 == 0 { ["tier".to_string()].into() } else { Default::default() };
                    let labels = crate::SetLabels { session: *session, set: set.into(), remove };
                    engine.set_labels(labels).unwrap();
                }
                if round == 2 && i % 3 == 0 {
                    let labels = crate::SetLabels {
                        session: *session,
                        set: [("tier".to_string(), "gold".to_string())].into(),
                        remove: ["phase".to_string()].into(),
                    };
                    engine.set_labels(labels).unwrap();
                }
            }
        }
        let digests = engine.projection_digests().unwrap();
        let tip = engine.tip().unwrap().0;
        engine.close().unwrap();
        (digests, tip)
    }

    fn tool_call(session: crate::SessionId, round: usize, i: usize) -> crate::RecordToolCall {
        crate::RecordToolCall {
            session,
            op_id: format!("op-{round}-{i}"),
            call_id: format!("call-{round}-{i}"),
            tool_name: "bash".into(),
            args: b"ls".to_vec(),
            parent_op: None,
            turn_id: None,
            recovery: crate::Recovery::ReplaySafe,
        }
    }

    fn tool_result(session: crate::SessionId, round: usize, i: usize) -> crate::RecordToolResult {
        crate::RecordToolResult {
            session,
            op_id: format!("op-{round}-{i}"),
            outcome: crate::ToolOutcome::Ok,
            result: b"done".to_vec(),
        }
    }

    /// Opens the database and checks its projections against `live`.
    fn assert_projections(path: &Path, live: &[crate::query::TableDigest]) {
        let engine = Engine::open(path).unwrap();
        assert_eq!(engine.projection_digests().unwrap(), live);
        engine.close().unwrap();
    }

    /// Changes the log file at `path` in one transaction.
    fn edit_log(path: &Path, edit: impl FnOnce(&redb::WriteTransaction)) {
        let db = redb::Database::open(path).unwrap();
        let txn = db.begin_write().unwrap();
        edit(&txn);
        txn.commit().unwrap();
    }

    /// Removes the content row of record `seq` (its pieces and its listed ids) from the
    /// log file at `path`.
    fn remove_content_row(path: &Path, seq: u64) {
        edit_log(path, |txn| {
            let mut rows = crate::pieces::ContentWriter::open(txn).unwrap();
            assert!(rows.get(seq).unwrap().is_some(), "record {seq} brought content");
            // The row and its listed ids.
            rows.remove(seq).unwrap();
        });
    }

    fn cursors(path: &Path) -> Vec<Option<u64>> {
        let db = redb::Database::open(projections_path(path)).unwrap();
        let txn = db.begin_read().unwrap();
        let meta = txn.open_table(META).unwrap();
        Projection::ALL
            .iter()
            .map(|p| meta.get(meta_keys::cursor(*p).as_str()).unwrap().and_then(|g| meta_u64(g.value())))
            .collect()
    }

    /// Chunks of four events, with the content-id index held to the end (the default's
    /// behaviour on a log this short), handed over with every chunk, and handed over once
    /// it outgrows a few of its rows.
    #[test]
    fn a_full_rebuild_in_many_chunks_writes_the_live_projections_and_their_cursors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.redb");
        let (live, tip) = workload(&path);
        for held_bytes in [usize::MAX, 0, 500] {
            let mut reported = Vec::new();
            let stats = rebuild_offline_in_chunks(
                &path,
                &Options::default(),
                ProjectionSet::all(),
                &mut |done, total| reported.push((done, total)),
                Chunks { events: 4, held_bytes },
            )
            .unwrap();
            assert_eq!(stats.events, tip);
            assert_eq!(reported.last(), Some(&(tip, tip)));
            assert!(reported.len() as u64 >= tip / 4, "a report per chunk: {reported:?}");
            assert_eq!(cursors(&path), vec![Some(tip); Projection::ALL.len()]);
            assert!(!rebuild_path(&projections_path(&path)).exists());
            assert_projections(&path, &live);
        }
    }

    #[test]
    fn what_an_interrupted_rebuild_left_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.redb");
        let (live, _) = workload(&path);
        let leftover = rebuild_path(&projections_path(&path));
        std::fs::write(&leftover, b"half of a rebuild").unwrap();
        rebuild_offline(&path, &Options::default(), ProjectionSet::all(), &mut |_, _| {}).unwrap();
        assert!(!leftover.exists());
        assert_projections(&path, &live);
    }

    #[test]
    fn removals_are_skipped_only_for_keys_never_written_until_too_many_were() {
        let mut written = Written::new(3);
        written.insert(b"a");
        written.insert(b"b");
        assert!(written.may_hold(b"a") && written.may_hold(b"b"));
        assert!(!written.may_hold(b"c"), "never written");
        written.insert(b"c");
        assert!(written.may_hold(b"c"));
        // A fourth key is past the bound: from then on every removal is made.
        written.insert(b"d");
        assert!(written.may_hold(b"d") && written.may_hold(b"e"));
    }

    /// A record whose content row is gone folds on the second folding thread (the
    /// content-id index), and its failure, not the thread's end, is what the rebuild
    /// reports, wherever the chunks end.
    #[test]
    fn a_failure_of_the_second_fold_is_the_rebuilds_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.redb");
        workload(&path);
        remove_content_row(&path, TURN_WITH_CONTENT);
        let projections = projections_path(&path);
        let before = std::fs::read(&projections).unwrap();
        for events in [4, 1 << 16] {
            let chunks = Chunks { events, held_bytes: 0 };
            let failed =
                rebuild_offline_in_chunks(&path, &Options::default(), ProjectionSet::all(), &mut |_, _| {}, chunks);
            match failed {
                Err(Error::Corrupt { location: Location::Log { seq: TURN_WITH_CONTENT }, detail }) => {
                    assert!(detail.contains("not stored"), "{detail}")
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(std::fs::read(&projections).unwrap(), before);
            assert!(!rebuild_path(&projections).exists());
        }
    }

    #[test]
    fn a_rebuild_that_fails_leaves_the_projections_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.redb");
        workload(&path);
        // A record in the middle of the log no longer matches its chain hash.
        edit_log(&path, |txn| {
            let mut log = txn.open_table(LOG).unwrap();
            let mut record = log.get(20).unwrap().unwrap().value().to_vec();
            let last = record.len() - 40;
            record[last] ^= 1;
            log.insert(20, record.as_slice()).unwrap();
        });
        let projections = projections_path(&path);
        let before = std::fs::read(&projections).unwrap();
        let chunks = Chunks { events: 4, held_bytes: 0 };
        let failed =
            rebuild_offline_in_chunks(&path, &Options::default(), ProjectionSet::all(), &mut |_, _| {}, chunks);
        assert!(matches!(failed, Err(Error::Decode { seq: 20, .. })), "{failed:?}");
        assert_eq!(std::fs::read(&projections).unwrap(), before);
        assert!(!rebuild_path(&projections).exists());
    }

    /// Runs a catch-up of the projections in `set` from 0 on the closed database at
    /// `path`, folding as `fold` says.
    fn catch_up_from_zero(path: &Path, set: ProjectionSet, fold: checkpoint::Folding) -> Result<RebuildStats> {
        let chain = LogChain::plain();
        let log = redb::Database::open(path).unwrap();
        let log_txn = log.begin_read().unwrap();
        let tip = crate::log::load_tip(&log_txn, &chain).unwrap();
        let projections = redb::Database::open(projections_path(path)).unwrap();
        let cursors = Cursors { seqs: [tip.seq; Projection::ALL.len()] }.reset(set);
        let limits = crate::limits::Limits::default();
        let durability = redb::Durability::Immediate;
        checkpoint::catch_up(&projections, &log_txn, &chain, &limits, &tip, &cursors, durability, &mut |_, _| {}, fold)
    }

    /// A catch-up (recovery at open, `Engine::rebuild`) folds on one thread or on two, in
    /// chunks of any size, and writes the live projections and their cursors whichever:
    /// of every projection, and of some of them (the others then stay as they were).
    #[test]
    fn a_catch_up_on_one_or_two_threads_in_any_chunks_writes_the_live_projections() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.redb");
        let (live, tip) = workload(&path);
        let some: ProjectionSet = [Projection::Content, Projection::Heads, Projection::Graph].into_iter().collect();
        for set in [ProjectionSet::all(), some] {
            for (chunk_events, second_thread_events) in
                [(4, 0), (7, 0), (1 << 16, 0), (4, u64::MAX), (1 << 16, u64::MAX)]
            {
                let fold = checkpoint::Folding { chunk_events, second_thread_events };
                let stats = catch_up_from_zero(&path, set, fold).unwrap();
                assert_eq!(stats.events, tip, "{fold:?}");
                assert_eq!(cursors(&path), vec![Some(tip); Projection::ALL.len()]);
                assert_projections(&path, &live);
            }
        }
    }

    /// The catch-up's second fold (the content-id index) meets a record whose content row
    /// is gone: its failure is the catch-up's error, on two threads as on one, and the
    /// projections file keeps what it held.
    #[test]
    fn a_failure_of_the_catch_ups_second_fold_is_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.redb");
        let (live, _) = workload(&path);
        remove_content_row(&path, TURN_WITH_CONTENT);
        let before = cursors(&path);
        for (chunk_events, second_thread_events) in [(4, 0), (1 << 16, 0), (4, u64::MAX)] {
            let fold = checkpoint::Folding { chunk_events, second_thread_events };
            match catch_up_from_zero(&path, ProjectionSet::all(), fold) {
                Err(Error::Corrupt { location: Location::Log { seq: TURN_WITH_CONTENT }, detail }) => {
                    assert!(detail.contains("not stored"), "{detail}")
                }
                other => panic!("{fold:?}: {other:?}"),
            }
            assert_eq!(cursors(&path), before, "nothing committed");
        }
        // The catch-up's transaction never committed: the projections are the live ones.
        assert_projections(&path, &live);
    }
}
