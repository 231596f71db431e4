//! `annal compact`: give the file's free pages back to the file system.
//!
//! redb keeps the pages a transaction frees for later transactions; it never shrinks the
//! file by itself. A rebuild (which writes every projection anew), a bulk import or a
//! load in relaxed durability can leave much of a file free. Compaction moves the live
//! pages towards the start of the file and truncates it. The log, the content and the
//! projections are unchanged, byte for byte.

use crate::{require_file, CliError, Result};
use annal::{Engine, Options};
use std::path::Path;
use std::time::{Duration, Instant};

/// What a compaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactReport {
    /// The file's size before.
    pub bytes_before: u64,
    /// The file's size after.
    pub bytes_after: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl CompactReport {
    /// A one-line summary for humans.
    pub fn render(&self) -> String {
        format!(
            "compacted {} → {} ({} freed) in {:.3} s\n",
            crate::human_bytes(self.bytes_before),
            crate::human_bytes(self.bytes_after),
            crate::human_bytes(self.bytes_before.saturating_sub(self.bytes_after)),
            self.elapsed.as_secs_f64()
        )
    }
}

/// Compacts the database at `path`. It is first opened as an [`Engine`] (which checks
/// the format and the key and brings stale projections up to date) and closed; then
/// redb compacts it with the file held exclusively, so no other process may have it
/// open, not even for reading.
pub fn compact(path: &Path, key: Option<[u8; 32]>) -> Result<CompactReport> {
    require_file(path)?;
    Engine::open_with(path, Options { chain_key: key, ..Options::default() })
        .map_err(|e| match e {
            annal::Error::Storage(s) => CliError::usage(format!("cannot open {} for writing: {s}", path.display())),
            other => other.into(),
        })?
        .close()?;
    let bytes_before = std::fs::metadata(path)?.len();
    let started = Instant::now();
    let mut db = redb::Database::open(path)
        .map_err(|e| CliError::usage(format!("cannot open {} exclusively: {e}", path.display())))?;
    // Each pass can free the pages the previous one moved; stop when one frees nothing.
    for _ in 0..MAX_PASSES {
        if !db.compact().map_err(|e| CliError::usage(format!("compaction: {e}")))? {
            break;
        }
    }
    drop(db);
    Ok(CompactReport { bytes_before, bytes_after: std::fs::metadata(path)?.len(), elapsed: started.elapsed() })
}

/// Compaction passes at most.
const MAX_PASSES: usize = 8;
