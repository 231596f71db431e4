//! The async API against `spawn_blocking`: many tokio tasks commit at once, each its own
//! session, turn after turn, through
//!
//! - `async, current-thread`: the async twins ([`Engine::commit_turn_async`]) on a
//!   current-thread runtime (one thread, no blocking pool);
//! - `async, multi-thread`: the same on a multi-thread runtime with two workers;
//! - `spawn_blocking`: the blocking [`Engine::commit_turn`] inside
//!   `tokio::task::spawn_blocking`, on the same multi-thread runtime (tokio's default
//!   pool: at most 512 blocking threads), which is what a host without the async API
//!   does.
//!
//! Every mode runs on a fresh database with default (durable) options, in each round, the
//! modes alternating so that machine noise hits all of them; the report gives the median
//! of the rounds for each figure, and the ratios against `spawn_blocking` within the run.

use crate::compare::quantile;
use crate::Result;
use annal::{Command, CommitTurn, CreateSession, Engine, Expected, Message, SessionReceipt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Tasks committing at once.
    pub tasks: usize,
    /// Turns each task commits, one after another.
    pub commits_per_task: usize,
    /// Rounds (each runs every mode once).
    pub rounds: usize,
    /// Where the databases go (a temporary directory inside it); the system's temporary
    /// directory by default.
    pub data_dir: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config { tasks: 1_000, commits_per_task: 10, rounds: 3, data_dir: None }
    }
}

/// How the tasks reach the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `commit_turn_async` on a current-thread runtime.
    AsyncCurrentThread,
    /// `commit_turn_async` on a multi-thread runtime (two workers).
    AsyncMultiThread,
    /// `spawn_blocking(commit_turn)` on a multi-thread runtime (two workers).
    SpawnBlocking,
}

impl Mode {
    /// Every mode, in the order each round runs them.
    pub const ALL: [Mode; 3] = [Mode::AsyncCurrentThread, Mode::AsyncMultiThread, Mode::SpawnBlocking];

    /// The mode's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Mode::AsyncCurrentThread => "async, current-thread",
            Mode::AsyncMultiThread => "async, multi-thread",
            Mode::SpawnBlocking => "spawn_blocking, multi-thread",
        }
    }

    fn runtime(self) -> Result<tokio::runtime::Runtime> {
        Ok(match self {
            Mode::AsyncCurrentThread => tokio::runtime::Builder::new_current_thread().build()?,
            Mode::AsyncMultiThread | Mode::SpawnBlocking => {
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).build()?
            }
        })
    }
}

/// The figures of one mode in one round.
#[derive(Clone, Debug)]
pub struct Run {
    /// The mode.
    pub mode: Mode,
    /// Commits per second over the timed phase.
    pub commits_per_s: f64,
    /// Median commit latency, µs.
    pub p50_us: f64,
    /// 99th percentile commit latency, µs.
    pub p99_us: f64,
    /// Commits per log transaction (group commit).
    pub commits_per_txn: f64,
}

/// The rounds of a run.
#[derive(Clone, Debug)]
pub struct Results {
    /// The configuration.
    pub config: Config,
    /// Where the databases were.
    pub data_dir: PathBuf,
    /// Every mode's figures, round after round.
    pub runs: Vec<Run>,
}

fn turn(session: &SessionReceipt, task: usize, n: usize) -> CommitTurn {
    CommitTurn::new(session.session, format!("turn-{n}"), Expected::Any)
        .message(Message::user(format!(
            "task {task}, question {n}: what does the build log say about the failing test?"
        )))
        .message(Message::assistant(format!(
            "task {task}, answer {n}: the failure is in the storage check, line {}; the fix is to bound the page size",
            n * 7
        )))
        .usage("provider", "model", 1_800, 400)
}

/// One mode on a fresh database in `dir`.
fn run_mode(mode: Mode, config: &Config, dir: &Path) -> Result<Run> {
    let engine = Engine::open(dir.join(format!("{mode:?}.redb")))?;
    let creates: Vec<_> = (0..config.tasks)
        .map(|i| Command::CreateSession(CreateSession::new().message(Message::system(format!("task {i}")))))
        .collect();
    let sessions: Vec<SessionReceipt> = engine
        .batch(creates)?
        .into_iter()
        .map(|o| match o {
            annal::Outcome::Created { session, receipt } => Ok(SessionReceipt { session, receipt }),
            other => Err(format!("unexpected outcome {other:?}")),
        })
        .collect::<std::result::Result<_, _>>()?;
    let runtime = mode.runtime()?;
    let before = engine.stats();
    let commits = config.tasks * config.commits_per_task;
    let per_task = config.commits_per_task;
    let started = Instant::now();
    let latencies: Vec<Duration> = runtime.block_on(async {
        let tasks: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(task, session)| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(per_task);
                    for n in 0..per_task {
                        let turn = turn(&session, task, n);
                        let t = Instant::now();
                        match mode {
                            Mode::AsyncCurrentThread | Mode::AsyncMultiThread => {
                                engine.commit_turn_async(turn).await?;
                            }
                            Mode::SpawnBlocking => {
                                let engine = engine.clone();
                                tokio::task::spawn_blocking(move || engine.commit_turn(turn)).await??;
                            }
                        }
                        latencies.push(t.elapsed());
                    }
                    Ok::<_, crate::Error>(latencies)
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(commits);
        for task in tasks {
            latencies.extend(task.await??);
        }
        Ok::<_, crate::Error>(latencies)
    })?;
    let wall = started.elapsed();
    let after = engine.stats();
    drop(runtime);
    engine.close()?;
    let mut latencies = latencies;
    latencies.sort_unstable();
    let txns = (after.log_commits - before.log_commits).max(1);
    Ok(Run {
        mode,
        commits_per_s: commits as f64 / wall.as_secs_f64(),
        p50_us: quantile(&latencies, 0.5).as_secs_f64() * 1e6,
        p99_us: quantile(&latencies, 0.99).as_secs_f64() * 1e6,
        commits_per_txn: (after.events - before.events) as f64 / txns as f64,
    })
}

/// Runs every mode `config.rounds` times, alternating.
pub fn run(config: &Config) -> Result<Results> {
    let tmp = match &config.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            tempfile::Builder::new().prefix("annal-async-").tempdir_in(d)?
        }
        None => tempfile::Builder::new().prefix("annal-async-").tempdir()?,
    };
    let mut runs = Vec::new();
    for round in 0..config.rounds {
        for mode in Mode::ALL {
            let dir = tmp.path().join(format!("round-{round}"));
            std::fs::create_dir_all(&dir)?;
            eprintln!("[async] round {} of {}: {}", round + 1, config.rounds, mode.name());
            runs.push(run_mode(mode, config, &dir)?);
            std::fs::remove_dir_all(&dir)?;
        }
    }
    let data_dir = config.data_dir.clone().unwrap_or_else(std::env::temp_dir);
    Ok(Results { config: config.clone(), data_dir, runs })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n => xs[n / 2],
    }
}

impl Results {
    /// The median over the rounds of `figure` for `mode`.
    pub fn median(&self, mode: Mode, figure: impl Fn(&Run) -> f64) -> f64 {
        median(self.runs.iter().filter(|r| r.mode == mode).map(figure).collect())
    }

    /// A markdown table: the median of the rounds for each mode, and its ratio against
    /// `spawn_blocking`.
    pub fn markdown(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "{} tasks at once, {} turns each ({} commits per mode and round), {} rounds, databases in {}; \
             medians of the rounds.\n\n",
            c.tasks,
            c.commits_per_task,
            c.tasks * c.commits_per_task,
            c.rounds,
            self.data_dir.display()
        );
        out.push_str("| mode | commits/s | × spawn_blocking | p50 (µs) | p99 (µs) | p99 × spawn_blocking | commits per log transaction |\n");
        out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
        let base_rate = self.median(Mode::SpawnBlocking, |r| r.commits_per_s);
        let base_p99 = self.median(Mode::SpawnBlocking, |r| r.p99_us);
        for mode in Mode::ALL {
            let rate = self.median(mode, |r| r.commits_per_s);
            let p99 = self.median(mode, |r| r.p99_us);
            out.push_str(&format!(
                "| {} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} | {:.1} |\n",
                mode.name(),
                rate,
                rate / base_rate,
                self.median(mode, |r| r.p50_us),
                p99,
                p99 / base_p99,
                self.median(mode, |r| r.commits_per_txn),
            ));
        }
        out.push_str(
            "\nEvery round:\n\n| round | mode | commits/s | p50 (µs) | p99 (µs) | commits per log transaction |\n",
        );
        out.push_str("|---:|---|---:|---:|---:|---:|\n");
        for (i, r) in self.runs.iter().enumerate() {
            out.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} |\n",
                i / Mode::ALL.len() + 1,
                r.mode.name(),
                r.commits_per_s,
                r.p50_us,
                r.p99_us,
                r.commits_per_txn
            ));
        }
        out
    }
}
