//! # annal-benches
//!
//! The side-by-side comparison harness: annal against the stores a host developer would
//! otherwise pick for agent sessions, in one run, on the same seeded workload, with the
//! same durability (every acknowledged commit is fsynced).
//!
//! - [`workload`]: deterministic agent-session shapes drawn by a seeded [`rng`].
//! - [`stores`]: annal, an SQLite event table with projections, one JSON Lines file
//!   per session, and a naive redb event store, behind one trait; beside them, probes
//!   that only commit: the floor of a group-committing log (alone, or with the log file's
//!   copy of its records, checkpoints of its projections, or both, behind it) and a bare
//!   redb insert.
//! - [`compare`]: the phases (commits at 1 to 64 committers, reads, rebuild, bytes on
//!   disk, open time, and the disk's fsync ceiling).
//! - [`report`]: `results.json`, `results.md` and SVG plots.
//! - [`codecs`]: lz4 against zstd (levels 1 to 3, with and without a trained
//!   dictionary) on the workload's content and on agent-transcript-shaped objects
//!   (`annal-benches codecs`).
//! - [`async_bench`]: the engine's async API against `spawn_blocking` around its
//!   blocking API, 1,000 tokio tasks at once (`annal-benches async`).
//!
//! `cargo run --release -p annal-benches -- compare [--quick] [--out docs/benchmarks]`
//! runs it from the command line; [`compare::run`] is the library entry point.
//!
//! ```no_run
//! use annal_benches::compare::{run, Config, Scale};
//! let report = run(&Config::new(Scale::quick(), "target/compare")).unwrap();
//! println!("{}", report.markdown());
//! ```
#![deny(missing_docs)]

pub mod async_bench;
pub mod codecs;
pub mod compare;
pub mod long;
pub mod report;
pub mod rng;
pub mod stores;
pub mod workload;

/// Errors of the harness: any store's error, boxed.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The harness's result type.
pub type Result<T> = std::result::Result<T, Error>;
