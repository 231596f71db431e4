//! # annal-replay
//!
//! Offline folds over an annal log, and the `annal` command line built on them.
//!
//! Every operation of the command line is a function here, so tests and fuzz targets
//! can call it without a process:
//!
//! - [`verify::verify`]: sequence density, the record chain (plain or keyed), schema
//!   versions, content ids, `revision_after` recomputed by the engine's own `evolve`,
//!   the meta tip, and with `deep` a byte-for-byte comparison of every projection table
//!   with a scratch fold. Findings carry their location; verification never stops at
//!   the first one and never panics on damaged data.
//! - [`rebuild::rebuild`]: drop projections and fold them again from the log.
//! - [`export::export`] and [`export::import`]: JSON Lines with content inlined, exact
//!   round trip; [`export::export_sessions`] writes whole sessions that [`export::import`]
//!   copies into a database holding others.
//! - [`inspect`]: sessions, one session's state, transcripts, the decoded log, stats.
//! - [`graph`]: a session's revision graph as DOT, SVG or text.
//! - [`demo::demo`]: a realistic agent workload through the public API.
//!
//! The binary (`src/main.rs`) is a thin clap layer. Its exit codes are [`Exit`]: 0 for
//! ok, 1 for a finding (corruption, a failed verification, a rejected import), 2 for a
//! usage error (bad arguments, ids or paths).
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let db = dir.path().join("demo.redb");
//! let report = annal_replay::demo::demo(&annal_replay::demo::DemoOptions {
//!     db: Some(db.clone()),
//!     sessions: 2,
//!     progress: false,
//! })
//! .unwrap();
//! assert!(report.verify.findings.is_empty());
//! let opts = annal_replay::verify::VerifyOptions { deep: true, ..Default::default() };
//! assert!(annal_replay::verify::verify(&db, &opts).unwrap().findings.is_empty());
//! ```
#![deny(missing_docs)]

pub mod compact;
pub mod demo;
pub mod export;
pub mod graph;
pub mod inspect;
pub mod interrupt;
pub mod progress;
pub mod purge;
pub mod rebuild;
pub mod stream;
pub mod verify;

use annal::{Limits, Reader};
use std::fmt;
use std::path::Path;

/// The process exit code of an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Everything is fine.
    Ok = 0,
    /// A finding: corruption, a failed verification, data that cannot be imported.
    Finding = 1,
    /// A usage error: bad arguments, ids or paths.
    Usage = 2,
}

/// An error of an operation, with the exit code it maps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CliError {
    /// Which exit code the process should end with.
    pub exit: Exit,
    /// What went wrong, for a human.
    pub message: String,
}

impl CliError {
    /// A usage error (exit 2).
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError { exit: Exit::Usage, message: message.into() }
    }

    /// A finding (exit 1).
    pub fn finding(message: impl Into<String>) -> CliError {
        CliError { exit: Exit::Finding, message: message.into() }
    }

    /// The reader of the output went away (`annal log DB | head`): no message, and exit 0
    /// unless the command's outcome says otherwise (see [`CliError::is_closed_pipe`]).
    pub fn closed_pipe() -> CliError {
        CliError { exit: Exit::Ok, message: String::new() }
    }

    /// Whether this is [`CliError::closed_pipe`]: the output could not all be written
    /// because its reader went away. A command whose outcome is a finding still ends
    /// with that outcome; one whose only product is its output ends quietly.
    pub fn is_closed_pipe(&self) -> bool {
        self.exit == Exit::Ok && self.message.is_empty()
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

impl From<annal::Error> for CliError {
    fn from(e: annal::Error) -> CliError {
        use annal::{Error, Rejection};
        let exit = match &e {
            Error::Corrupt { .. } | Error::Decode { .. } | Error::OversizedRecord { .. } => Exit::Finding,
            Error::UnsupportedFormat { .. } => Exit::Finding,
            Error::Rejected(
                Rejection::InvalidImport { .. }
                | Rejection::SessionConflict { .. }
                | Rejection::ForkParentMissing { .. }
                | Rejection::ForkParentMoved { .. },
            ) => Exit::Finding,
            _ => Exit::Usage,
        };
        CliError { exit, message: e.to_string() }
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> CliError {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            // The reader went away (`annal log | head`): not an error worth a word.
            return CliError::closed_pipe();
        }
        CliError::usage(format!("i/o: {e}"))
    }
}

impl From<redb::Error> for CliError {
    fn from(e: redb::Error) -> CliError {
        CliError::usage(format!("storage: {e}"))
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

/// Reads a chain key: a file of exactly 32 raw bytes, or 64 hex digits (surrounding
/// whitespace ignored).
pub fn read_key_file(path: &Path) -> Result<[u8; 32]> {
    let bytes = std::fs::read(path).map_err(|e| CliError::usage(format!("key file {}: {e}", path.display())))?;
    parse_key(&bytes)
        .ok_or_else(|| CliError::usage(format!("key file {}: expected 32 raw bytes or 64 hex digits", path.display())))
}

/// Parses key bytes: 32 raw bytes, or 64 hex digits with optional surrounding whitespace.
pub fn parse_key(bytes: &[u8]) -> Option<[u8; 32]> {
    if bytes.len() == 32 {
        if let Some(k) = parse_hex_key(bytes) {
            return Some(k);
        }
        let mut k = [0u8; 32];
        k.copy_from_slice(bytes);
        return Some(k);
    }
    parse_hex_key(bytes)
}

fn parse_hex_key(bytes: &[u8]) -> Option<[u8; 32]> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    if text.len() != 64 {
        return None;
    }
    text.parse::<annal::ChainHash>().ok().map(|h| h.0)
}

/// Fails with a usage error unless `path` names an existing file that is not empty. An
/// empty file is no database: a command that writes would otherwise make a new one in
/// its place, so every command refuses it and leaves it as it is.
pub fn require_file(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == 0 => {
            Err(CliError::usage(format!("{} is empty: not an annal database", path.display())))
        }
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(CliError::usage(format!("{} is not a file", path.display()))),
        Err(e) => Err(CliError::usage(format!("{}: {e}", path.display()))),
    }
}

/// Runs `f` on the table of rows of the projections file at `path`, opened read-only (a
/// file its writer did not close over an in-memory repair, `annal::unclean`): `None`
/// when the file has no such table yet (its host was stopped before it made it; an open
/// folds from nothing then, as with no file), or why the file cannot be read. `verify
/// --deep` and `stats` ask this one question of the file.
pub fn with_projections_table<T>(
    path: &Path,
    cache_bytes: usize,
    f: impl FnOnce(&redb::ReadOnlyTable<&'static [u8], &'static [u8]>) -> std::result::Result<T, String>,
) -> std::result::Result<Option<T>, String> {
    let db = annal::unclean::open_read_only(path, cache_bytes).map_err(|e| e.to_string())?;
    let txn = redb::ReadableDatabase::begin_read(&*db).map_err(|e| e.to_string())?;
    match txn.open_table(annal::tables::PROJECTIONS) {
        Ok(table) => f(&table).map(Some),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// What a read past a file's end means, said after the storage layer's words.
pub const CUT_SHORT: &str = "(the file ends before the pages it names: it was cut short)";

/// A storage error's message, with what it means where redb's words do not say it: a
/// read past the file's end (a storage failure of kind `UnexpectedEof`) is a file cut
/// short.
pub fn storage_hint(e: &annal::Error) -> String {
    match e.io_kind() {
        Some(std::io::ErrorKind::UnexpectedEof) => format!("{e} {CUT_SHORT}"),
        _ => e.to_string(),
    }
}

/// Opens an existing database read-only. Works beside a live writer in another process.
pub fn open_reader(path: &Path, key: Option<[u8; 32]>) -> Result<Reader> {
    require_file(path)?;
    Reader::open(path, Limits::default(), key).map_err(|e| match e {
        annal::Error::Storage(_) | annal::Error::KeyMismatch { .. } | annal::Error::MigrationRequired { .. } => {
            CliError::usage(format!("cannot open {} read-only: {}", path.display(), storage_hint(&e)))
        }
        // The log itself is damaged: a finding.
        other => CliError::from(other),
    })
}

/// Parses a session id (32 hex digits, hyphens allowed), as a usage error on failure.
pub fn parse_session(text: &str) -> Result<annal::SessionId> {
    text.parse().map_err(|e| CliError::usage(format!("{e}")))
}

pub use annal::codec::hex;

/// A byte count for humans: `512 B`, `1.5 KiB`, `3.2 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS.mmm` UTC.
pub fn format_time_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}", rem / 3600, rem % 3600 / 60, rem % 60, ms % 1000)
}

/// Days since 1970-01-01 to a (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_from_raw_and_hex() {
        assert_eq!(parse_key(&[7u8; 32]), Some([7u8; 32]));
        let hex_key = format!("{}\n", "ab".repeat(32));
        assert_eq!(parse_key(hex_key.as_bytes()), Some([0xab; 32]));
        assert_eq!(parse_key(b"short"), None);
    }

    #[test]
    fn times_format_as_utc() {
        assert_eq!(format_time_ms(0), "1970-01-01 00:00:00.000");
        assert_eq!(format_time_ms(1_700_000_000_123), "2023-11-14 22:13:20.123");
    }

    #[test]
    fn bytes_format_for_humans() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
