//! Compaction: giving a file's free pages back to the file system, offline.
//!
//! redb keeps the pages a transaction frees for later transactions and never shrinks the
//! file by itself. A rebuild (which writes every projection anew), a bulk import or a
//! load in relaxed durability can leave much of a file free. Compaction moves the live
//! pages towards the start of the file and truncates it; no row changes.

use crate::engine::{Engine, Options};
use crate::error::{fail_closed, Error, Result};
use std::path::Path;
use std::time::{Duration, Instant};

/// Compaction passes at most; each can free the pages the previous one moved.
const PASSES_MAX: usize = 8;

/// What a compaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactStats {
    /// The file's size before.
    pub bytes_before: u64,
    /// The file's size after.
    pub bytes_after: u64,
    /// Wall time of the compaction itself.
    pub elapsed: Duration,
}

/// Compacts the database at `path`: the log file and its projections file. It is first
/// opened as an [`Engine`] with `options` (which checks the format and the chain key,
/// brings the projections up to the log and checkpoints them at close); then redb
/// compacts each file with it held exclusively, so no other process may have it open,
/// not even for reading (that is an [`Error::Storage`], and the file is left as it was).
/// The sizes reported are of both files together.
pub fn compact(path: impl AsRef<Path>, options: Options) -> Result<CompactStats> {
    let path = path.as_ref();
    Engine::open_with(path, options)?.close()?;
    let files = [path.to_path_buf(), crate::engine::projections_path(path)];
    let size = || -> Result<u64> {
        files.iter().map(|f| std::fs::metadata(f).map(|m| m.len()).map_err(|e| Error::Storage(e.to_string()))).sum()
    };
    let bytes_before = size()?;
    let started = Instant::now();
    for file in &files {
        fail_closed("compact", || {
            let mut db = redb::Database::open(file).map_err(|e| Error::Storage(format!("open exclusively: {e}")))?;
            for _ in 0..PASSES_MAX {
                if !db.compact().map_err(|e| Error::Storage(format!("compaction: {e}")))? {
                    break;
                }
            }
            Ok(())
        })?;
    }
    Ok(CompactStats { bytes_before, bytes_after: size()?, elapsed: started.elapsed() })
}
