//! The side-by-side run: every store through the same phases, on the same workload,
//! with the same durability, in one process.
//!
//! Phases, in order:
//! 0. the disk's ceiling: `write` + `fdatasync` calls per second in the data directory;
//! 1. durable commits at each number of concurrent committers (each committer owns one
//!    session and runs its plan of turns, context appends, compactions, restores and
//!    forks), interleaving the stores level by level so machine noise hits all of them;
//! 2. head reads and transcript-page reads on the sessions phase 1 wrote;
//! 3. a rebuild of every projection from the log phase 1 wrote;
//! 4. bytes on disk per logical byte, for an append-only and a compaction-heavy workload;
//! 5. the time to open a bulk-loaded database and serve the first head read.

use crate::report::{Entry, Report};
use crate::rng::SplitMix64;
use crate::stores::{allocated_bytes, disk_bytes, Cursor, SessionStore, StoreKind};
use crate::workload::{self, Msg, Op, Shape};
use crate::Result;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Rebuilds of each store's commit-phase files; the figure is their median.
pub const REBUILD_ROUNDS: usize = 5;

/// How much work each phase does.
#[derive(Clone, Debug)]
pub struct Scale {
    /// A name for the report (`full`, `quick`, ...).
    pub label: String,
    /// Numbers of concurrent committers.
    pub levels: Vec<usize>,
    /// Durable commits per store at each level (spread over the committers).
    pub commits_per_level: usize,
    /// Head reads per store.
    pub head_reads: usize,
    /// Transcript-page reads per store.
    pub page_reads: usize,
    /// Messages per transcript page.
    pub page_limit: u64,
    /// Sessions (and committers) of the bytes-on-disk workloads.
    pub bytes_sessions: usize,
    /// Ops per session of the bytes-on-disk workloads.
    pub bytes_ops_per_session: usize,
    /// Sessions of the open-time database.
    pub open_sessions: usize,
    /// Events per session of the open-time database (its creation included).
    pub open_events_per_session: usize,
    /// Opens timed per store; the median is reported.
    pub open_repeats: usize,
    /// `fdatasync` calls timed for the ceiling.
    pub fsync_probes: usize,
}

impl Scale {
    /// The full run: about 1,000,000 events in the open-time database.
    pub fn full() -> Scale {
        Scale {
            label: "full".into(),
            levels: vec![1, 4, 16, 64],
            commits_per_level: 3000,
            head_reads: 50_000,
            page_reads: 10_000,
            page_limit: 20,
            bytes_sessions: 16,
            bytes_ops_per_session: 80,
            open_sessions: 1000,
            open_events_per_session: 1000,
            open_repeats: 3,
            fsync_probes: 3000,
        }
    }

    /// `--quick`: the same phases, smaller (an open-time database of 20,000 events).
    pub fn quick() -> Scale {
        Scale {
            label: "quick".into(),
            commits_per_level: 400,
            head_reads: 5_000,
            page_reads: 1_000,
            bytes_ops_per_session: 24,
            open_sessions: 100,
            open_events_per_session: 200,
            open_repeats: 3,
            fsync_probes: 300,
            ..Scale::full()
        }
    }

    /// A smoke-test size: every phase runs, on very little data.
    pub fn tiny() -> Scale {
        Scale {
            label: "tiny".into(),
            commits_per_level: 128,
            head_reads: 200,
            page_reads: 100,
            bytes_sessions: 4,
            bytes_ops_per_session: 10,
            open_sessions: 10,
            open_events_per_session: 20,
            open_repeats: 1,
            fsync_probes: 20,
            ..Scale::quick()
        }
    }

    /// Events in the open-time database.
    pub fn open_events(&self) -> usize {
        self.open_sessions * self.open_events_per_session
    }
}

/// What to run and where to write.
#[derive(Clone, Debug)]
pub struct Config {
    /// Sizes.
    pub scale: Scale,
    /// Where results, tables and plots go.
    pub out: PathBuf,
    /// Where the databases go (a temporary directory beside the system's by default).
    /// Use the disk you care about: the fsync ceiling is measured here too.
    pub data_dir: Option<PathBuf>,
    /// Workload seed.
    pub seed: u64,
    /// Stores to compare (annal first: ratios are taken against it).
    pub stores: Vec<StoreKind>,
    /// Run only the fsync ceiling and the commit phase (for profiling commits).
    pub commits_only: bool,
}

impl Config {
    /// Every store, seed 42, data in a temporary directory.
    pub fn new(scale: Scale, out: impl Into<PathBuf>) -> Config {
        Config {
            scale,
            out: out.into(),
            data_dir: None,
            seed: 42,
            stores: StoreKind::ALL.to_vec(),
            commits_only: false,
        }
    }
}

fn progress(msg: &str) {
    eprintln!("[compare] {msg}");
}

/// Runs every phase and writes `results.json`, `results.md` and the SVG plots into
/// `config.out`. Returns the report.
pub fn run(config: &Config) -> Result<Report> {
    let started = Instant::now();
    let tmp = match &config.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            tempfile::Builder::new().prefix("annal-compare-").tempdir_in(d)?
        }
        None => tempfile::Builder::new().prefix("annal-compare-").tempdir()?,
    };
    let data = tmp.path();
    let scale = &config.scale;
    let mut report = Report::new(scale, config.seed);
    let system = workload::system_prompt(&Shape::agent(), config.seed);

    progress("fsync ceiling");
    fsync_ceiling(data, scale.fsync_probes, &mut report)?;

    let mut stores: Vec<Box<dyn SessionStore>> = Vec::new();
    for kind in &config.stores {
        stores.push(kind.open(&data.join("commit").join(kind.name()))?);
    }
    let mut sessions: Vec<[u8; 16]> = Vec::new();
    for (level_index, &level) in scale.levels.iter().enumerate() {
        let ops = scale.commits_per_level.div_ceil(level);
        let plans: Vec<Vec<Op>> = (0..level)
            .map(|i| workload::session_plan(&Shape::agent(), config.seed, (level_index * 1000 + i) as u64, ops))
            .collect();
        let ids: Vec<[u8; 16]> = (0..level).map(|i| session_id(1, level_index, i)).collect();
        for store in &stores {
            progress(&format!("commits: {} at {level} committers", store.kind().name()));
            commit_level(store.as_ref(), &ids, &system, &plans, &mut report)?;
        }
        sessions.extend(ids);
    }

    // The floor (and any store like it) only commits.
    let (probes, stores): (Vec<_>, Vec<_>) = stores.into_iter().partition(|s| s.kind().commits_only());
    for store in probes {
        store.close()?;
    }
    let kinds: Vec<StoreKind> = config.stores.iter().copied().filter(|k| !k.commits_only()).collect();
    if config.commits_only {
        for store in stores {
            store.close()?;
        }
        return finish(report, config, started);
    }
    for store in &stores {
        progress(&format!("reads: {}", store.kind().name()));
        reads(store.as_ref(), &sessions, scale, config.seed, &mut report)?;
    }
    // Each store rebuilds REBUILD_ROUNDS times, the stores taking turns, and the figure is
    // the median: one rebuild of the commit phase's files takes a tenth of a second or
    // so, and a single one moved by a tenth or more from run to run. Each round starts
    // one store further on, so that no store always rebuilds right after the same other
    // one (whose rebuild leaves the process's heap and the disk in its own state).
    let mut rebuilds: Vec<(u64, Vec<f64>)> = vec![(0, Vec::new()); stores.len()];
    for round in 1..=REBUILD_ROUNDS {
        let mut turns: Vec<_> = stores.iter().zip(rebuilds.iter_mut()).collect();
        turns.rotate_left((round - 1) % stores.len());
        for (store, (events, rates)) in turns {
            progress(&format!("rebuild {round}/{REBUILD_ROUNDS}: {}", store.kind().name()));
            let t = Instant::now();
            *events = store.rebuild()?;
            rates.push(*events as f64 / t.elapsed().as_secs_f64());
        }
    }
    for (store, (events, mut rates)) in stores.iter().zip(rebuilds) {
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        report.push(Entry::new(store.kind().name(), "rebuild_events_per_s", None, median, "events/s"));
        report.push(Entry::new(store.kind().name(), "rebuild_events", None, events as f64, "events"));
    }
    for store in stores {
        store.close()?;
    }
    std::fs::remove_dir_all(data.join("commit"))?;

    for (name, shape) in [("append_only", Shape::append_only()), ("compaction_heavy", Shape::compaction_heavy())] {
        for kind in &kinds {
            progress(&format!("bytes on disk: {} {name}", kind.name()));
            bytes_on_disk(
                *kind,
                &data.join("bytes").join(name),
                name,
                &shape,
                &system,
                scale,
                config.seed,
                &mut report,
            )?;
        }
    }
    std::fs::remove_dir_all(data.join("bytes"))?;

    open_time(&kinds, &data.join("open"), &system, scale, config.seed, &mut report)?;
    if config.stores.contains(&StoreKind::Annal) {
        progress("recovery: annal with a full delta unflushed");
        crate::stores::annal_store::recovery(&data.join("recovery"), &system, config.seed, &mut report)?;
        std::fs::remove_dir_all(data.join("recovery"))?;
    }
    finish(report, config, started)
}

fn finish(mut report: Report, config: &Config, started: Instant) -> Result<Report> {
    report.elapsed = started.elapsed();
    std::fs::create_dir_all(&config.out)?;
    report.write(&config.out)?;
    progress(&format!("done in {:.1} s; results in {}", report.elapsed.as_secs_f64(), config.out.display()));
    Ok(report)
}

/// A harness session id: `phase`, then the level index, then the session index.
fn session_id(phase: u8, group: usize, index: usize) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[0] = phase;
    id[1..8].copy_from_slice(&(group as u64).to_be_bytes()[1..]);
    id[8..].copy_from_slice(&(index as u64).to_be_bytes());
    id
}

fn fsync_ceiling(dir: &Path, probes: usize, report: &mut Report) -> Result<()> {
    let path = dir.join("fsync-probe");
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
    let block = vec![0x5Au8; 4096];
    file.write_all_at(&block, 0)?;
    file.sync_all()?;
    let t = Instant::now();
    for i in 0..probes {
        file.write_all_at(&block[..(i % 7) + 1], 0)?;
        file.sync_data()?;
    }
    let overwrite = probes as f64 / t.elapsed().as_secs_f64();
    let mut offset = 4096u64;
    let t = Instant::now();
    for _ in 0..probes {
        file.write_all_at(&block[..512], offset)?;
        offset += 512;
        file.sync_data()?;
    }
    let append = probes as f64 / t.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    report.fsync_per_s = overwrite;
    report.push(Entry::new("machine", "fdatasync_per_s", None, overwrite, "calls/s"));
    report.push(Entry::new("machine", "append_fdatasync_per_s", None, append, "calls/s"));
    Ok(())
}

fn commit_level(
    store: &dyn SessionStore,
    ids: &[[u8; 16]],
    system: &Msg,
    plans: &[Vec<Op>],
    report: &mut Report,
) -> Result<()> {
    let level = ids.len();
    let mut cursors = Vec::with_capacity(level);
    for id in ids {
        cursors.push(store.create(*id, system)?);
    }
    let syncs_before = store.syncs();
    let written_before = store.written_bytes();
    let by_file_before = store.written_bytes_by_file();
    let io_before = process_write_bytes();
    let barrier = Barrier::new(level + 1);
    let (wall, results) = std::thread::scope(|scope| {
        let handles: Vec<_> = cursors
            .into_iter()
            .zip(plans)
            .map(|(cursor, plan)| {
                let barrier = &barrier;
                scope.spawn(move || committer(store, cursor, plan, barrier))
            })
            .collect();
        barrier.wait();
        let t = Instant::now();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().map_err(|_| "committer panicked")).collect();
        (t.elapsed(), results)
    });
    let mut latencies = Vec::new();
    for r in results {
        latencies.extend(r??);
    }
    let name = store.kind().name();
    let commits = latencies.len();
    let c = Some(level as u32);
    report.push(Entry::new(name, "commits_per_s", c, commits as f64 / wall.as_secs_f64(), "commits/s"));
    latencies.sort_unstable();
    for (metric, q) in [("commit_p50_us", 0.5), ("commit_p99_us", 0.99), ("commit_p999_us", 0.999)] {
        report.push(Entry::new(name, metric, c, quantile(&latencies, q).as_secs_f64() * 1e6, "us"));
    }
    // Checkpoints run behind the commits: finish them before counting the bytes.
    store.quiesce()?;
    if let (Some(before), Some(after)) = (syncs_before, store.syncs()) {
        let syncs = (after - before).max(1);
        report.push(Entry::new(name, "commits_per_fsync", c, commits as f64 / syncs as f64, "commits/fsync"));
    }
    if let (Some(before), Some(after)) = (written_before, store.written_bytes()) {
        let per_commit = (after - before) as f64 / commits.max(1) as f64;
        report.push(Entry::new(name, "written_bytes_per_commit", c, per_commit, "bytes"));
    }
    for ((file, before), (_, after)) in by_file_before.iter().zip(store.written_bytes_by_file()) {
        let per_commit = (after - before) as f64 / commits.max(1) as f64;
        report.push(Entry::new(name, &format!("written_bytes_per_commit_{file}"), c, per_commit, "bytes"));
    }
    if let (Some(before), Some(after)) = (io_before, process_write_bytes()) {
        let per_commit = after.saturating_sub(before) as f64 / commits.max(1) as f64;
        report.push(Entry::new(name, "io_bytes_per_commit", c, per_commit, "bytes"));
    }
    report.latencies.insert((name.to_string(), level as u32), latencies);
    Ok(())
}

/// Bytes this process has caused to be written to storage, from `/proc/self/io` (Linux).
fn process_write_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines().find_map(|l| l.strip_prefix("write_bytes:")).and_then(|v| v.trim().parse().ok())
}

fn committer(store: &dyn SessionStore, mut cursor: Cursor, plan: &[Op], barrier: &Barrier) -> Result<Vec<Duration>> {
    let mut latencies = Vec::with_capacity(plan.len());
    barrier.wait();
    for op in plan {
        let t = Instant::now();
        store.apply(&mut cursor, op)?;
        latencies.push(t.elapsed());
    }
    Ok(latencies)
}

/// The `q` quantile of sorted `xs` (nearest rank).
pub fn quantile(xs: &[Duration], q: f64) -> Duration {
    if xs.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

fn reads(store: &dyn SessionStore, sessions: &[[u8; 16]], scale: &Scale, seed: u64, report: &mut Report) -> Result<()> {
    let name = store.kind().name();
    let mut counts = Vec::with_capacity(sessions.len());
    for id in sessions {
        counts.push(store.head(*id)?.message_count);
    }
    let mut rng = SplitMix64::derive(seed, 0xEAD);
    let t = Instant::now();
    let mut seen = 0u64;
    for _ in 0..scale.head_reads {
        let i = (rng.next_u64() % sessions.len() as u64) as usize;
        seen += store.head(sessions[i])?.message_count;
    }
    let head = scale.head_reads as f64 / t.elapsed().as_secs_f64();
    std::hint::black_box(seen);
    let t = Instant::now();
    let mut bytes = 0u64;
    for _ in 0..scale.page_reads {
        let i = (rng.next_u64() % sessions.len() as u64) as usize;
        let offset = rng.range(0, counts[i].saturating_sub(scale.page_limit));
        bytes += store.page(sessions[i], offset, scale.page_limit)?;
    }
    let page = scale.page_reads as f64 / t.elapsed().as_secs_f64();
    report.push(Entry::new(name, "head_reads_per_s", None, head, "reads/s"));
    report.push(Entry::new(name, "page_reads_per_s", None, page, "reads/s"));
    report.push(Entry::new(name, "page_bytes_read", None, bytes as f64, "bytes"));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bytes_on_disk(
    kind: StoreKind,
    root: &Path,
    name: &str,
    shape: &Shape,
    system: &Msg,
    scale: &Scale,
    seed: u64,
    report: &mut Report,
) -> Result<()> {
    let dir = root.join(kind.name());
    let store = kind.open(&dir)?;
    let plans: Vec<Vec<Op>> = (0..scale.bytes_sessions)
        .map(|i| workload::session_plan(shape, seed ^ 0xB17E5, i as u64, scale.bytes_ops_per_session))
        .collect();
    let mut logical = 0u64;
    let mut cursors = Vec::new();
    for i in 0..scale.bytes_sessions {
        cursors.push(store.create(session_id(2, 0, i), system)?);
        logical += system.body.len() as u64;
    }
    logical += plans.iter().flatten().map(Op::logical_bytes).sum::<u64>();
    std::thread::scope(|scope| -> Result<()> {
        let store = store.as_ref();
        let handles: Vec<_> = cursors
            .into_iter()
            .zip(&plans)
            .map(|(mut cursor, plan)| {
                scope.spawn(move || -> Result<()> {
                    for op in plan {
                        store.apply(&mut cursor, op)?;
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
    store.close()?;
    if kind == StoreKind::Annal {
        // Issue 13's targets are per event of this workload: rows and bytes of projection.
        let crate::stores::annal_store::Footprint { events, rows, bytes, by_table } =
            crate::stores::annal_store::projection_footprint(&dir)?;
        let per_event = |n: u64| n as f64 / events.max(1) as f64;
        let tables: Vec<String> =
            by_table.iter().take(8).map(|(name, b)| format!("{name} {:.0}", per_event(*b))).collect();
        progress(&format!("projection bytes per event ({name}), by table: {}", tables.join(", ")));
        report.push(Entry::new(
            kind.name(),
            &format!("projection_rows_per_event_{name}"),
            None,
            per_event(rows),
            "rows",
        ));
        report.push(Entry::new(
            kind.name(),
            &format!("projection_bytes_per_event_{name}"),
            None,
            per_event(bytes),
            "bytes",
        ));
    }
    let on_disk = disk_bytes(&dir)?;
    let allocated = allocated_bytes(&dir)?;
    let metric = format!("bytes_per_logical_byte_{name}");
    report.push(Entry::new(kind.name(), &metric, None, on_disk as f64 / logical as f64, "ratio"));
    report.push(Entry::new(
        kind.name(),
        &format!("allocated_bytes_per_logical_byte_{name}"),
        None,
        allocated as f64 / logical as f64,
        "ratio",
    ));
    report.push(Entry::new(kind.name(), &format!("disk_bytes_{name}"), None, on_disk as f64, "bytes"));
    report.push(Entry::new(kind.name(), &format!("logical_bytes_{name}"), None, logical as f64, "bytes"));
    // The same files after the store's own tool gave their free space back.
    kind.compact(&dir)?;
    let compacted = disk_bytes(&dir)?;
    report.push(Entry::new(
        kind.name(),
        &format!("{metric}_compacted"),
        None,
        compacted as f64 / logical as f64,
        "ratio",
    ));
    Ok(())
}

fn open_time(
    kinds: &[StoreKind],
    root: &Path,
    system: &Msg,
    scale: &Scale,
    seed: u64,
    report: &mut Report,
) -> Result<()> {
    let ids: Vec<[u8; 16]> = (0..scale.open_sessions).map(|i| session_id(3, 0, i)).collect();
    let turns: Vec<Vec<workload::Turn>> = (0..scale.open_sessions)
        .map(|s| {
            let mut rng = SplitMix64::derive(seed ^ 0x0BE7, s as u64);
            (1..scale.open_events_per_session).map(|t| workload::tiny_turn(&mut rng, s as u64, t as u64, 64)).collect()
        })
        .collect();
    let probe = ids[ids.len() / 2];
    for kind in kinds {
        let dir = root.join(kind.name());
        progress(&format!("open: bulk-loading {} events into {}", scale.open_events(), kind.name()));
        let t = Instant::now();
        kind.bulk_load(&dir, &ids, system, &turns)?;
        let load = t.elapsed();
        let mut times = Vec::new();
        for _ in 0..scale.open_repeats.max(1) {
            let t = Instant::now();
            let store = kind.open(&dir)?;
            let head = store.head(probe)?;
            times.push(t.elapsed());
            if head.events != scale.open_events_per_session as u64 {
                return Err(format!("{}: head has {} events", kind.name(), head.events).into());
            }
            store.close()?;
        }
        times.sort_unstable();
        let median = times[times.len() / 2];
        let name = kind.name();
        report.push(Entry::new(name, "open_first_head_ms", None, median.as_secs_f64() * 1e3, "ms"));
        report.push(Entry::new(name, "open_events", None, scale.open_events() as f64, "events"));
        report.push(Entry::new(name, "open_disk_bytes", None, disk_bytes(&dir)? as f64, "bytes"));
        report.push(Entry::new(name, "bulk_load_s", None, load.as_secs_f64(), "s"));
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}
