//! `annal-benches compare [--quick] [--out DIR] [--data-dir DIR] [--seed N] [--stores LIST]
//! [--levels LIST]`: runs the side-by-side comparison and writes `results.json`, `results.md` and SVG plots.
//!
//! `annal-benches async [--tasks N] [--commits N] [--rounds N] [--data-dir DIR]`: the
//! engine's async API against `spawn_blocking` around its blocking API; prints a
//! markdown table.
//!
//! `annal-benches codecs [--sessions N] [--ops N] [--root DIR]`: lz4 against zstd on the
//! comparison workload's content and on agent-transcript-shaped objects; prints
//! markdown tables.
//!
//! `annal-benches long [--sizes LIST] [--reps N] [--data-dir DIR]`: an edit, a compaction,
//! a restore, a fork and a deep page read on one session as it grows; prints a markdown
//! table of milliseconds.

use annal_benches::async_bench;
use annal_benches::codecs;
use annal_benches::compare::{run, Config, Scale};
use annal_benches::long;
use annal_benches::stores::StoreKind;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: annal-benches compare [--quick] [--out DIR] [--data-dir DIR] [--seed N]
                             [--stores annal,sqlite,jsonl,naive_redb] [--levels 1,4,16,64] [--commits N] [--commits-only]

  --quick        a smaller run (under two minutes), with a smaller open-time database
  --out DIR      where results.json, results.md and the SVG plots go (default docs/benchmarks)
  --data-dir DIR where the databases are created (default: the system's temporary directory);
                 the disk's fsync ceiling is measured there too
  --seed N       workload seed (default 42)
  --stores LIST  only these stores (for profiling one of them): annal, annal_other_mode,
                 annal_zstd, sqlite, jsonl, naive_redb, and the commit-phase-only floor and
                 redb_insert; floor_log, floor_checkpoint and floor_log_checkpoint (the floor
                 with the log file's copy, checkpoints, or both behind it) run only when named
  --levels LIST  only these numbers of concurrent committers
  --commits N    durable commits per store at each level (default 3000, 400 with --quick)
  --commits-only only the fsync ceiling and the commit phase (for profiling)

       annal-benches async [--tasks N] [--commits N] [--rounds N] [--data-dir DIR]

  --tasks N      tokio tasks committing at once (default 1000)
  --commits N    turns each task commits, one after another (default 10)
  --rounds N     rounds, each running every mode once (default 3)
  --data-dir DIR where the databases are created (default: the system's temporary directory)

       annal-benches codecs [--sessions N] [--ops N] [--root DIR]

  --sessions N   sessions of the comparison workload drawn for its corpus (default 400)
  --ops N        operations per session (default 40)
  --root DIR     the tree whose .rs and .md files make the transcript corpus (default .)

       annal-benches long [--sizes LIST] [--reps N] [--data-dir DIR]

  --sizes LIST   session sizes in messages (default 1001,10001,50001)
  --reps N       sessions per size; figures are medians over them (default 5)
  --data-dir DIR where the databases are created (default: the system's temporary directory)";

fn parse_async(args: &[String]) -> Result<async_bench::Config, String> {
    let mut config = async_bench::Config::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let mut value = || iter.next().cloned().ok_or(format!("{arg} needs a value"));
        let mut number = || value()?.parse::<usize>().map_err(|e| format!("{arg}: {e}"));
        match arg.as_str() {
            "--tasks" => config.tasks = number()?.max(1),
            "--commits" => config.commits_per_task = number()?.max(1),
            "--rounds" => config.rounds = number()?.max(1),
            "--data-dir" => config.data_dir = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(config)
}

fn usage_error(e: String) -> ExitCode {
    if !e.is_empty() {
        eprintln!("error: {e}");
    }
    eprintln!("{USAGE}");
    ExitCode::from(2)
}

fn main_async(args: &[String]) -> ExitCode {
    let config = match parse_async(args) {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    match async_bench::run(&config) {
        Ok(results) => {
            println!("{}", results.markdown());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn parse(args: &[String]) -> Result<Config, String> {
    let mut iter = args.iter();
    match iter.next().map(String::as_str) {
        Some("compare") => {}
        Some(other) => return Err(format!("unknown command {other:?}")),
        None => return Err("missing command".into()),
    }
    let mut config = Config::new(Scale::full(), "docs/benchmarks");
    while let Some(arg) = iter.next() {
        let mut value = || iter.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--quick" => config.scale = Scale { levels: config.scale.levels.clone(), ..Scale::quick() },
            "--commits-only" => config.commits_only = true,
            "--out" => config.out = PathBuf::from(value()?),
            "--data-dir" => config.data_dir = Some(PathBuf::from(value()?)),
            "--seed" => config.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--stores" => {
                let names = value()?;
                let mut stores = Vec::new();
                for name in names.split(',') {
                    let kind = StoreKind::known().find(|k| k.name() == name);
                    stores.push(kind.ok_or(format!("unknown store {name:?}"))?);
                }
                config.stores = stores;
            }
            "--levels" => {
                let levels: Result<Vec<usize>, _> = value()?.split(',').map(str::parse).collect();
                config.scale.levels = levels.map_err(|e| format!("--levels: {e}"))?;
            }
            "--commits" => {
                let commits = value()?.parse::<usize>().map_err(|e| format!("--commits: {e}"))?;
                config.scale.commits_per_level = commits.max(1);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(config)
}

fn main_codecs(args: &[String]) -> ExitCode {
    let (mut sessions, mut ops, mut root) = (400u64, 40usize, PathBuf::from("."));
    let mut iter = args.iter();
    while let Some(flag) = iter.next() {
        let value = iter.next();
        let parsed = match (flag.as_str(), value) {
            ("--sessions", Some(v)) => v.parse().map(|n| sessions = n).map_err(|e| format!("--sessions: {e}")),
            ("--ops", Some(v)) => v.parse().map(|n| ops = n).map_err(|e| format!("--ops: {e}")),
            ("--root", Some(v)) => {
                root = PathBuf::from(v);
                Ok(())
            }
            (other, _) => Err(format!("unknown option or missing value: {other:?}")),
        };
        if let Err(e) = parsed {
            return usage_error(e);
        }
    }
    let transcripts = match codecs::transcript_corpus(&root) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: reading {}: {e}", root.display());
            return ExitCode::from(1);
        }
    };
    for corpus in [codecs::workload_corpus(sessions, ops), transcripts] {
        let results = codecs::measure(&corpus);
        println!("{}", codecs::markdown(&corpus, &results));
    }
    ExitCode::SUCCESS
}

fn main_long(args: &[String]) -> ExitCode {
    let mut config = long::Config::default();
    let mut iter = args.iter();
    while let Some(flag) = iter.next() {
        let value = iter.next();
        let parsed = match (flag.as_str(), value) {
            ("--sizes", Some(v)) => {
                let sizes: Result<Vec<u64>, _> = v.split(',').map(str::parse).collect();
                sizes.map(|s| config.sizes = s).map_err(|e| format!("--sizes: {e}"))
            }
            ("--reps", Some(v)) => v.parse().map(|n| config.reps = n).map_err(|e| format!("--reps: {e}")),
            ("--data-dir", Some(v)) => {
                config.data_dir = Some(PathBuf::from(v));
                Ok(())
            }
            (other, _) => Err(format!("unknown option or missing value: {other:?}")),
        };
        if let Err(e) = parsed {
            return usage_error(e);
        }
    }
    if config.sizes.iter().any(|&n| n < 12) {
        return usage_error("--sizes: each size must be at least 12".into());
    }
    match long::run(&config) {
        Ok(rows) => {
            println!("{}", long::markdown(&rows));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("long") {
        return main_long(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("async") {
        return main_async(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("codecs") {
        return main_codecs(&args[1..]);
    }
    let config = match parse(&args) {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    match run(&config) {
        Ok(report) => {
            println!("{}", report.markdown());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
