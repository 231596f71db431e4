//! `annal rebuild`: drop projections and fold them again from the log with the engine's
//! own `evolve`: every projection into a new projections file that replaces the old one,
//! some of them in one durable transaction on the projections file.

use crate::{progress, require_file, CliError, Result};
use annal::{Engine, Options, Projection, ProjectionSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// What to rebuild.
#[derive(Clone, Debug, Default)]
pub struct RebuildOptions {
    /// Projections to rebuild; empty means all of them.
    pub projections: Vec<Projection>,
    /// The chain key of a keyed database.
    pub key: Option<[u8; 32]>,
    /// Show a progress bar on a terminal.
    pub progress: bool,
}

/// What a rebuild did.
#[derive(Clone, Debug, PartialEq)]
pub struct RebuildReport {
    /// Names of the projections rebuilt.
    pub projections: Vec<&'static str>,
    /// Events folded.
    pub events: u64,
    /// Sessions in the rebuilt heads.
    pub sessions: u64,
    /// Bytes of records read.
    pub bytes: u64,
    /// Wall time of the fold and commit.
    pub elapsed: Duration,
}

impl RebuildReport {
    /// Events folded per second.
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// A one-paragraph summary for humans.
    pub fn render(&self) -> String {
        format!(
            "rebuilt {} ({} projections)\n{} events, {} sessions, {} of records in {:.3} s: {:.0} events/s\n",
            self.projections.join(", "),
            self.projections.len(),
            self.events,
            self.sessions,
            crate::human_bytes(self.bytes),
            self.elapsed.as_secs_f64(),
            self.events_per_sec(),
        )
    }
}

/// Parses projection names given on the command line.
pub fn parse_projections(names: &[String]) -> Result<Vec<Projection>> {
    names
        .iter()
        .map(|n| {
            Projection::from_name(n).ok_or_else(|| {
                let all: Vec<_> = Projection::ALL.iter().map(|p| p.name()).collect();
                CliError::usage(format!("unknown projection {n:?} (one of: {})", all.join(", ")))
            })
        })
        .collect()
}

/// Rebuilds the chosen projections of the database at `path`.
///
/// The log file is first brought to where an open for writing brings it
/// ([`annal::recover_log`]: an interrupted erasure finished, the format upgraded, the
/// key checked, the journal a crash left appended), without folding anything. A rebuild
/// of some projections, or one after an interrupted content collection, then opens the
/// database as an [`Engine`], which brings the other projections up to the log (the
/// rebuild reads their cursors), and closes it. The rebuild itself is the engine's
/// [`annal::rebuild_offline`], the checkpointer run from sequence 0. A rebuild of every
/// projection folds into a new file beside the projections file
/// ([`annal::rebuild::rebuild_path`]) and renames it over the projections file once its
/// last commit is durable; a rebuild that fails removes the new file and leaves the
/// projections file as it was. A rebuild of some projections writes them anew in the
/// projections file in one durable transaction. Either way readers see the old
/// projections or the new ones. The writing host must not be running.
pub fn rebuild(path: &Path, opts: &RebuildOptions) -> Result<RebuildReport> {
    require_file(path)?;
    let set: ProjectionSet =
        if opts.projections.is_empty() { ProjectionSet::all() } else { opts.projections.iter().copied().collect() };
    let options = Options { chain_key: opts.key, ..Options::default() };
    let for_writing = |e: annal::Error| match e {
        annal::Error::Storage(s) => CliError::usage(format!("cannot open {} for writing: {s}", path.display())),
        other => other.into(),
    };
    let recovered = annal::recover_log(path, &options).map_err(for_writing)?;
    if set != ProjectionSet::all() || recovered.collection_interrupted {
        Engine::open_with(path, options.clone()).map_err(for_writing)?.close()?;
    }
    let total = recovered.tip_seq;
    let bar = progress::bar(total, "rebuild", opts.progress);
    let started = Instant::now();
    // An interrupt removes the new projections file, not the one it was to replace.
    let _scratch = crate::interrupt::Scratch::new(&annal::rebuild::rebuild_path(&annal::projections_path(path)));
    let stats = annal::rebuild_offline(path, &options, set, &mut |done, _| bar.set_position(done))?;
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let reader = crate::open_reader(path, opts.key)?;
    let sessions = annal::tables::session_count(&reader.snapshot()?)?;
    Ok(RebuildReport {
        projections: set.iter().map(|p| p.name()).collect(),
        events: stats.events,
        sessions,
        bytes: stats.bytes,
        elapsed,
    })
}
