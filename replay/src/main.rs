//! The `annal` command line: a thin clap layer over `annal_replay`.

use annal_replay::export::ImportOptions;
use annal_replay::graph::Format;
use annal_replay::inspect::LogQuery;
use annal_replay::rebuild::RebuildOptions;
use annal_replay::verify::VerifyOptions;
use annal_replay::{
    compact, demo, export, graph, inspect, open_reader, parse_session, purge, read_key_file, rebuild, verify,
};
use annal_replay::{CliError, Exit, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The command's memory comes from mimalloc. `verify` decodes records on one thread and
/// frees them on another (its fold), where the system allocator's arena locks cost about
/// a third of its time (`docs/benchmarks.md`). The library leaves the allocator to the
/// host.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Operate an annal session database: verify, rebuild, export, import, inspect.
///
/// Read-only commands (verify, sessions, inspect, transcript, log, graph, stats, export)
/// open the file read-only and work beside a live host that has it open for writing.
/// rebuild, import and compact need the file to themselves.
///
/// Exit codes: 0 ok, 1 a finding (corruption, failed verification, data that cannot be
/// imported), 2 a usage error (bad arguments, ids or paths).
#[derive(Parser, Debug)]
#[command(name = "annal", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum GraphFormat {
    /// Graphviz DOT
    Dot,
    /// SVG, laid out by the built-in renderer
    Svg,
    /// A text timeline
    Text,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a realistic agent workload, then rebuild, verify --deep and summarise.
    Demo {
        /// Write the database here (must not exist); a temporary file otherwise.
        #[arg(long)]
        db: Option<PathBuf>,
        /// Top-level agent sessions to run (forks come on top).
        #[arg(long, default_value_t = demo::DEFAULT_SESSIONS)]
        sessions: u64,
    },
    /// Check sequence density, the record chain, schema versions, content ids,
    /// recomputed revisions and the meta tip; report every finding with its location.
    Verify {
        /// The database file.
        db: PathBuf,
        /// Key of a keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
        /// Also fold every projection and compare every projection table byte for byte
        /// with the fresh fold.
        #[arg(long)]
        deep: bool,
        /// The chain hash (hex) the last record must carry; catches tail truncation.
        #[arg(long, value_name = "HASH")]
        expect_tip: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drop projections and fold them again from the log, in one durable transaction.
    Rebuild {
        /// The database file (no other process may have it open).
        db: PathBuf,
        /// A projection to rebuild (repeatable): heads, transcript, graph, context,
        /// turns, usage, labels, tools. All of them by default.
        #[arg(long = "projection", value_name = "NAME")]
        projections: Vec<String>,
        /// Key of a keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Upgrade a file written by an older release to this release's format, in place
    /// and all or nothing: every record is kept byte for byte.
    Migrate {
        /// The database file (no other process may have it open).
        db: PathBuf,
        /// Key of a keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Give the file's free pages back to the file system (after a rebuild or a bulk
    /// load); nothing else changes.
    Compact {
        /// The database file (no other process may have it open, not even to read).
        db: PathBuf,
        /// Key of a keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Erase a session for good: a tombstone is appended, the session's records keep
    /// only their headers and payload digests (the chain still verifies), content that
    /// no other session reaches is removed, and both files are rewritten so that no
    /// erased byte is left in them.
    Purge {
        /// The database file (no other process may have it open).
        db: PathBuf,
        /// The session id.
        session: String,
        /// Why, kept in the tombstone.
        #[arg(long, default_value = "")]
        reason: String,
        /// Who asked, kept in the tombstone.
        #[arg(long, default_value = "operator")]
        actor: String,
        /// Also purge the session's fork descendants (refused without it when it has any).
        #[arg(long)]
        descendants: bool,
        /// Key of a keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Remove content that no session that is not purged reaches, and rewrite the files
    /// if any was removed.
    Gc {
        /// The database file (no other process may have it open).
        db: PathBuf,
        /// Key of a keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Write events as JSON Lines, one event per line, content inlined.
    Export {
        /// The database file.
        db: PathBuf,
        /// Only this session (repeatable): a session export, which `annal import` copies
        /// into a database that holds other sessions.
        #[arg(long = "session", value_name = "ID")]
        sessions: Vec<String>,
        /// With --session: also the sessions it was forked from, transitively, so the
        /// copy has the parents its forks need.
        #[arg(long, requires = "sessions")]
        ancestry: bool,
        /// Key of a keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Append a full export to a database (created if missing), or copy the sessions of
    /// a session export into it; all or nothing.
    Import {
        /// The JSON Lines file, or - for standard input.
        file: PathBuf,
        /// The database file.
        db: PathBuf,
        /// Key of the target's keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
        /// Accept chain hashes that differ from the export's (another key). A session
        /// export is always chained under the target's key.
        #[arg(long)]
        rechain: bool,
    },
    /// List sessions in creation order.
    Sessions {
        /// The database file.
        db: PathBuf,
        /// Only sessions with this label (repeatable, all must match).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Include archived sessions.
        #[arg(long)]
        archived: bool,
        /// Most recently updated first (default: creation order).
        #[arg(long)]
        recent: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a session's head, usage, pending context and unsettled tool calls.
    Inspect {
        /// The database file.
        db: PathBuf,
        /// The session id.
        session: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a page of a session's transcript, at the head or at any revision it held.
    Transcript {
        /// The database file.
        db: PathBuf,
        /// The session id.
        session: String,
        /// A revision id (hex) the session has held.
        #[arg(long)]
        revision: Option<String>,
        /// Messages to skip.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Messages to show at most.
        #[arg(long, default_value_t = 100)]
        limit: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show decoded events of the log.
    Log {
        /// The database file.
        db: PathBuf,
        /// Only this session's events.
        #[arg(long)]
        session: Option<String>,
        /// First global sequence number.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Events to show at most (0: all).
        #[arg(long, default_value_t = 0)]
        limit: u64,
        /// JSON Lines in the export schema.
        #[arg(long)]
        json: bool,
        /// Key of a keyed chain: 32 raw bytes or 64 hex digits.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Draw a session's revision graph, forks included.
    Graph {
        /// The database file.
        db: PathBuf,
        /// The session id.
        session: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "dot")]
        format: GraphFormat,
    },
    /// Count events by kind, content objects, bytes saved by deduplication, file size.
    Stats {
        /// The database file.
        db: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn key(path: &Option<PathBuf>) -> Result<Option<[u8; 32]>> {
    path.as_deref().map(read_key_file).transpose()
}

fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

fn print_json(value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| CliError::finding(e.to_string()))?;
    print(&format!("{text}\n"))
}

fn run(cli: Cli) -> Result<Exit> {
    match cli.command {
        Command::Demo { db, sessions } => {
            let report = demo::demo(&demo::DemoOptions { db, sessions, progress: true })?;
            print(&report.render())?;
            Ok(if report.verify.is_clean() { Exit::Ok } else { Exit::Finding })
        }
        Command::Verify { db, key_file, deep, expect_tip, json } => {
            let expect_tip = match expect_tip {
                None => None,
                Some(h) => Some(h.parse().map_err(|e| CliError::usage(format!("--expect-tip: {e}")))?),
            };
            let opts = VerifyOptions { key: key(&key_file)?, deep, expect_tip, progress: true };
            let report = verify::verify(&db, &opts)?;
            if json {
                print_json(&report.to_json())?;
            } else {
                print(&report.render())?;
            }
            Ok(if report.is_clean() { Exit::Ok } else { Exit::Finding })
        }
        Command::Migrate { db, key_file } => {
            annal_replay::require_file(&db)?;
            let stats = annal::migrate(&db, key(&key_file)?)?;
            if stats.from_format == annal::tables::FORMAT {
                print(&format!("{} is already in format {}; nothing to do\n", db.display(), stats.from_format))?;
            } else {
                print(&format!(
                    "migrated {} from format {} to {}: {} records kept byte for byte, {} content objects moved\n",
                    db.display(),
                    stats.from_format,
                    annal::tables::FORMAT,
                    stats.records,
                    stats.content_objects
                ))?;
            }
            Ok(Exit::Ok)
        }
        Command::Compact { db, key_file } => {
            print(&compact::render(&compact::compact(&db, key(&key_file)?)?))?;
            Ok(Exit::Ok)
        }
        Command::Purge { db, session, reason, actor, descendants, key_file } => {
            let mut request = annal::PurgeRequest::new(parse_session(&session)?, reason, actor);
            request.descendants = descendants;
            print(&purge::render(&purge::purge(&db, key(&key_file)?, &request)?))?;
            Ok(Exit::Ok)
        }
        Command::Gc { db, key_file } => {
            print(&purge::render(&purge::gc(&db, key(&key_file)?)?))?;
            Ok(Exit::Ok)
        }
        Command::Rebuild { db, projections, key_file } => {
            let projections = rebuild::parse_projections(&projections)?;
            let report = rebuild::rebuild(&db, &RebuildOptions { projections, key: key(&key_file)?, progress: true })?;
            print(&report.render())?;
            Ok(Exit::Ok)
        }
        Command::Export { db, sessions, ancestry, key_file } => {
            let sessions = sessions.iter().map(|s| parse_session(s)).collect::<Result<Vec<_>>>()?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            match sessions.is_empty() {
                true => export::export(&db, key(&key_file)?, &[], &mut out, true)?,
                false => export::export_sessions(&db, key(&key_file)?, &sessions, ancestry, &mut out, true)?,
            };
            Ok(Exit::Ok)
        }
        Command::Import { file, db, key_file, rechain } => {
            let opts = ImportOptions { key: key(&key_file)?, rechain };
            let report = if file.as_os_str() == "-" {
                export::import(&db, &mut std::io::stdin().lock(), &opts)?
            } else {
                let f = std::fs::File::open(&file).map_err(|e| CliError::usage(format!("{}: {e}", file.display())))?;
                export::import(&db, &mut BufReader::new(f), &opts)?
            };
            print(&report.render())?;
            Ok(Exit::Ok)
        }
        Command::Sessions { db, labels, archived, recent, json } => {
            let labels = inspect::parse_labels(&labels)?;
            let heads = inspect::sessions(&open_reader(&db, None)?, &labels, archived, recent)?;
            if json {
                print_json(&inspect::sessions_json(&heads))?;
            } else {
                print(&inspect::render_sessions(&heads))?;
            }
            Ok(Exit::Ok)
        }
        Command::Inspect { db, session, json } => {
            let session = parse_session(&session)?;
            let inspection = inspect::inspect(&open_reader(&db, None)?, session)?;
            if json {
                print_json(&inspection.to_json())?;
            } else {
                print(&inspection.render())?;
            }
            Ok(Exit::Ok)
        }
        Command::Transcript { db, session, revision, offset, limit, json } => {
            let session = parse_session(&session)?;
            let revision = match revision {
                None => None,
                Some(r) => Some(r.parse().map_err(|e| CliError::usage(format!("--revision: {e}")))?),
            };
            let page = annal::PageRequest::new(offset, limit);
            let page = inspect::transcript(&open_reader(&db, None)?, session, revision, page)?;
            if json {
                print_json(&inspect::transcript_json(&page))?;
            } else {
                print(&inspect::render_transcript(&page))?;
            }
            Ok(Exit::Ok)
        }
        Command::Log { db, session, from, limit, json, key_file } => {
            let session = session.as_deref().map(parse_session).transpose()?;
            let reader = open_reader(&db, key(&key_file)?)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            inspect::log(&reader, &LogQuery { session, from_seq: from, limit, json }, &mut out)?;
            out.flush()?;
            Ok(Exit::Ok)
        }
        Command::Graph { db, session, format } => {
            let session = parse_session(&session)?;
            let reader = open_reader(&db, None)?;
            let g = reader.graph(session).map_err(|e| match e {
                annal::Error::Rejected(r) => CliError::usage(r.to_string()),
                other => other.into(),
            })?;
            let format = match format {
                GraphFormat::Dot => Format::Dot,
                GraphFormat::Svg => Format::Svg,
                GraphFormat::Text => Format::Text,
            };
            print(&graph::render(&g, format)?)?;
            Ok(Exit::Ok)
        }
        Command::Stats { db, json } => {
            let stats = inspect::stats(&open_reader(&db, None)?, Path::new(&db))?;
            if json {
                print_json(&stats.to_json())?;
            } else {
                print(&stats.render())?;
            }
            Ok(Exit::Ok)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let exit = match run(cli) {
        Ok(exit) => exit,
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("annal: {}", e.message);
            }
            e.exit
        }
    };
    ExitCode::from(exit as u8)
}
