//! `annal compact`: the engine's [`annal::compact()`] with a one-line report, and with
//! `--compression` its [`annal::recompress()`] first.

use crate::{require_file, CliError, Result};
use annal::{CompactStats, Options, RecompressStats};
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

/// A summary of a recompression for humans: what changed, then the compaction's line.
pub fn render_recompress(stats: &RecompressStats) -> String {
    let mut out = format!(
        "recompressed {} of {} content objects in {} of {} rows: {} → {} stored\n",
        stats.objects_changed,
        stats.objects,
        stats.rows_rewritten,
        stats.rows,
        crate::human_bytes(stats.stored_bytes_before),
        crate::human_bytes(stats.stored_bytes_after),
    );
    if stats.objects_damaged > 0 {
        out.push_str(&format!(
            "{} objects left as they were: their bytes do not hash to their ids (run `annal verify`)\n",
            stats.objects_damaged
        ));
    }
    out.push_str(&render(&stats.compact));
    out
}

/// Recompresses the content of the database at `path` (see [`annal::recompress()`]),
/// then compacts it: no other process may have it open, not even for reading.
/// Draws a progress bar over the log's seqs when `progress` is set and stderr is a
/// terminal.
pub fn recompress(
    path: &Path,
    key: Option<[u8; 32]>,
    compression: annal::Compression,
    progress: bool,
) -> Result<RecompressStats> {
    require_file(path)?;
    let bar = crate::progress::bar(0, "recompress", progress);
    let stats =
        annal::recompress(path, compression, Options { chain_key: key, ..Options::default() }, &mut |done, tip| {
            bar.set_length(tip);
            bar.set_position(done);
        });
    bar.finish_and_clear();
    stats.map_err(|e| match e {
        annal::Error::Storage(s) => CliError::usage(format!("cannot recompress {}: {s}", path.display())),
        other => other.into(),
    })
}
