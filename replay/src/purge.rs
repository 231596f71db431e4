//! `annal purge` and `annal gc`: the engine's [`annal::purge()`] and
//! [`annal::collect_garbage`] with a short report.

use crate::{require_file, CliError, Result};
use annal::{ErasureReport, Options, PurgeRequest};
use std::path::Path;

/// A summary of a purge or a collection for humans.
pub fn render(report: &ErasureReport) -> String {
    let mut out = String::new();
    for (session, seq) in &report.purged {
        out.push_str(&format!("purged {session}: tombstone at seq {seq}\n"));
    }
    out.push_str(&format!(
        "erased {} records and {} content objects ({}); {} records sealed again\n",
        report.records_erased,
        report.objects_erased,
        crate::human_bytes(report.content_bytes_erased),
        report.records_resealed
    ));
    if report.purged.is_empty() && report.objects_erased == 0 {
        out.push_str("nothing to collect; the files were not rewritten\n");
    } else {
        out.push_str(&format!(
            "files {} → {}; erase {:.3} s, scrub {:.3} s, rebuild {:.3} s\n",
            crate::human_bytes(report.bytes_before),
            crate::human_bytes(report.bytes_after),
            report.erase_elapsed.as_secs_f64(),
            report.scrub_elapsed.as_secs_f64(),
            report.rebuild_elapsed.as_secs_f64()
        ));
    }
    out
}

fn storage_as_usage(path: &Path, what: &str) -> impl FnOnce(annal::Error) -> CliError {
    let path = path.display().to_string();
    let what = what.to_string();
    move |e| match e {
        annal::Error::Storage(s) => CliError::usage(format!("cannot {what} {path}: {s}")),
        other => other.into(),
    }
}

/// Purges `session` from the database at `path` (see [`annal::purge()`]): no other
/// process may have it open.
pub fn purge(path: &Path, key: Option<[u8; 32]>, request: &PurgeRequest) -> Result<ErasureReport> {
    require_file(path)?;
    annal::purge(path, Options { chain_key: key, ..Options::default() }, request)
        .map_err(storage_as_usage(path, "purge"))
}

/// Collects unreachable content in the database at `path` (see
/// [`annal::collect_garbage`]): no other process may have it open.
pub fn gc(path: &Path, key: Option<[u8; 32]>) -> Result<ErasureReport> {
    require_file(path)?;
    annal::collect_garbage(path, Options { chain_key: key, ..Options::default() })
        .map_err(storage_as_usage(path, "collect"))
}
