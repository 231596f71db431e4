//! `annal compact`: the engine's [`annal::compact()`] with a one-line report.

use crate::{require_file, CliError, Result};
use annal::{CompactStats, Options};
use std::path::Path;

/// A one-line summary of a compaction for humans.
pub fn render(stats: &CompactStats) -> String {
    format!(
        "compacted {} → {} ({} freed) in {:.3} s\n",
        crate::human_bytes(stats.bytes_before),
        crate::human_bytes(stats.bytes_after),
        crate::human_bytes(stats.bytes_before.saturating_sub(stats.bytes_after)),
        stats.elapsed.as_secs_f64()
    )
}

/// Compacts the database at `path` (see [`annal::compact()`]): no other process may have
/// it open, not even for reading.
pub fn compact(path: &Path, key: Option<[u8; 32]>) -> Result<CompactStats> {
    require_file(path)?;
    annal::compact(path, Options { chain_key: key, ..Options::default() }).map_err(|e| match e {
        annal::Error::Storage(s) => CliError::usage(format!("cannot compact {}: {s}", path.display())),
        other => other.into(),
    })
}
