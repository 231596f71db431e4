//! The `annal` command line: a thin clap layer over `annal_replay`.

use annal_replay::export::ImportOptions;
use annal_replay::graph::Format;
use annal_replay::inspect::LogQuery;
use annal_replay::rebuild::RebuildOptions;
use annal_replay::verify::VerifyOptions;
use annal_replay::{
    compact, demo, export, graph, inspect, open_reader, parse_session, purge, read_key_file, rebuild, stream, verify,
};
use annal_replay::{CliError, Exit, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
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
/// The writing commands (rebuild, import, migrate, purge, gc, compact) need the host
/// stopped; compact, purge and gc rewrite the file and need the readers gone too.
///
/// verify, export and stats also take the JetStream stream of a shared log in place of
/// the file: the whole stream is folded into a temporary host, and the command works on
/// that host's files (verify first checks every message of the stream). rebuild FILE
/// --from URL makes a host's files again from its stream. A stream URL reads:
///
///   tls://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][/STREAM][?KEY=VALUE&...]
///
/// for example tls://annal:secret@10.0.0.1:4222,10.0.0.2:4222/ANNAL?ca=/etc/annal/ca.pem
/// (nats:// for servers without TLS; the user and password may be percent-encoded; the
/// stream is ANNAL by default). Keys: ca (a PEM file of CAs to trust), cert and key (a
/// client certificate and its key, for mutual TLS), creds (a credentials file), nkey (a
/// file holding an NKey seed), token, prefix (the subject prefix), replicas, create,
/// timeout_ms. A command never creates the stream unless the URL says create=true. The
/// chain key (--key-file) is the hosts' one.
///
/// Exit codes: 0 ok, 1 a finding (corruption, failed verification, data that cannot be
/// imported, a forged or malformed message on a stream), 2 a usage error (bad arguments,
/// ids or paths, a stream that cannot be reached or refuses the credentials).
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

/// How `annal compact --compression` stores content.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum CompressionArg {
    /// lz4 from 128 bytes (the default of new writes)
    Lz4,
    /// zstd from 1 KiB, lz4 below: a quarter to a third smaller, more CPU
    Zstd,
    /// every object raw
    Off,
}

impl From<CompressionArg> for annal::Compression {
    fn from(c: CompressionArg) -> annal::Compression {
        match c {
            CompressionArg::Lz4 => annal::Compression::Lz4,
            CompressionArg::Zstd => annal::Compression::Zstd,
            CompressionArg::Off => annal::Compression::Off,
        }
    }
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
    ///
    /// Given a stream URL (see `annal --help` for its form), first walk the stream and
    /// check that it is dense and that every message authenticates under the chain key
    /// and decodes: a forged or malformed message, which every host voids, is a finding
    /// named by its stream sequence. Then fold the whole stream into a temporary host
    /// and verify its files as a file is verified (--deep and --expect-tip apply to
    /// them). --json prints {"clean", "stream": {url, messages, records, forged,
    /// malformed, tip}, "file": the file's report}.
    Verify {
        /// The database file, or a stream URL
        /// (tls://USER:PASSWORD@HOST:PORT[,HOST:PORT]/STREAM?ca=FILE).
        #[arg(value_name = "DB|URL")]
        db: PathBuf,
        #[command(flatten)]
        key: ChainKey,
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
    /// Drop projections and fold them again from the log.
    ///
    /// Every projection (the default) is folded into a new file beside the projections
    /// file (DB.projections.rebuild), which is renamed over DB.projections once its last
    /// commit is durable: readers see the old projections until the rename, and a failed
    /// rebuild leaves them as they were. Some projections (--projection) are written anew
    /// in the projections file itself, in one durable transaction.
    ///
    /// With --from URL, make a shared log's host's files again from its stream (see
    /// `annal --help` for the URL's form): the whole stream is folded into new files
    /// beside the host's, which are then renamed over the host's log file and its
    /// projections file. All or nothing: on a failure the old files are left as they
    /// were. The host may not exist yet; drafts, which never go to the stream, are not
    /// kept.
    Rebuild {
        /// The database file, or with --from the host's file (no other process may have
        /// it open).
        db: PathBuf,
        /// A projection to rebuild (repeatable): heads, transcript, graph, context,
        /// turns, usage, labels, tools, streams, content, inbox. All of them by default.
        #[arg(long = "projection", value_name = "NAME")]
        projections: Vec<String>,
        /// Rebuild the host's whole files from this stream
        /// (tls://USER:PASSWORD@HOST:PORT[,HOST:PORT]/STREAM?ca=FILE).
        #[arg(long, value_name = "URL", conflicts_with = "projections")]
        from: Option<String>,
        #[command(flatten)]
        key: ChainKey,
    },
    /// Upgrade a file written by an older release to this release's format, in place
    /// and all or nothing: every record is kept byte for byte.
    Migrate {
        /// The database file (no other process may have it open).
        db: PathBuf,
        #[command(flatten)]
        key: ChainKey,
    },
    /// Give the file's free pages back to the file system (after a rebuild or a bulk
    /// load); nothing else changes. With --compression, first store every content object
    /// the way that compression stores new ones (ids, records and the chain do not change).
    Compact {
        /// The database file (no other process may have it open, not even to read).
        db: PathBuf,
        #[command(flatten)]
        key: ChainKey,
        /// Recompress the content first: lz4, zstd or off.
        #[arg(long, value_enum)]
        compression: Option<CompressionArg>,
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
        #[command(flatten)]
        key: ChainKey,
    },
    /// Remove content that no session that is not purged reaches, and rewrite the files
    /// if any was removed.
    Gc {
        /// The database file (no other process may have it open).
        db: PathBuf,
        #[command(flatten)]
        key: ChainKey,
    },
    /// Write events as JSON Lines, one event per line, content inlined.
    ///
    /// Given a stream URL (see `annal --help` for its form), fold the whole stream into
    /// a temporary host and export its files: the records every host holds.
    Export {
        /// The database file, or a stream URL
        /// (tls://USER:PASSWORD@HOST:PORT[,HOST:PORT]/STREAM?ca=FILE).
        #[arg(value_name = "DB|URL")]
        db: PathBuf,
        /// Only this session (repeatable): a session export, which `annal import` copies
        /// into a database that holds other sessions.
        #[arg(long = "session", value_name = "ID")]
        sessions: Vec<String>,
        /// With --session: also the sessions it was forked from, transitively, so the
        /// copy has the parents its forks need.
        #[arg(long, requires = "sessions")]
        ancestry: bool,
        #[command(flatten)]
        key: ChainKey,
    },
    /// Append a full export to a database (created if missing), or copy the sessions of
    /// a session export into it; all or nothing.
    Import {
        /// The JSON Lines file, or - for standard input.
        file: PathBuf,
        /// The database file.
        db: PathBuf,
        #[command(flatten)]
        key: ChainKey,
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
        #[command(flatten)]
        key: ChainKey,
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
        #[command(flatten)]
        key: ChainKey,
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
        /// Messages to show at most (1 to 10,000, the page limit).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        key: ChainKey,
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
        #[command(flatten)]
        key: ChainKey,
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
        #[command(flatten)]
        key: ChainKey,
    },
    /// Count events by kind, content objects, bytes saved by deduplication, file size.
    ///
    /// Given a stream URL (see `annal --help` for its form), fold the whole stream into
    /// a temporary host and count its files; the stream's tip and message count come
    /// first (under "stream" with --json).
    Stats {
        /// The database file, or a stream URL
        /// (tls://USER:PASSWORD@HOST:PORT[,HOST:PORT]/STREAM?ca=FILE).
        #[arg(value_name = "DB|URL")]
        db: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        key: ChainKey,
    },
}

/// The chain key every command that reads or writes a log takes.
#[derive(Args, Debug)]
struct ChainKey {
    /// Key of a keyed chain (for import, the target's; for a stream, the hosts'): 32 raw
    /// bytes or 64 hex digits.
    #[arg(long)]
    key_file: Option<PathBuf>,
}

impl ChainKey {
    /// The key the file holds, if one was named.
    fn read(&self) -> Result<Option<[u8; 32]>> {
        self.key_file.as_deref().map(read_key_file).transpose()
    }
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

/// Ends a command whose outcome is known before its report is printed: `outcome` is the
/// exit code whether or not the report could all be written, so a reader that goes away
/// early (`annal verify DB | head -1`) does not turn a finding into a success.
fn report(printed: Result<()>, outcome: Exit) -> Result<Exit> {
    match printed {
        Err(e) if !e.is_closed_pipe() => Err(e),
        _ => Ok(outcome),
    }
}

/// [`report`] of a report printed as text or as JSON.
fn report_text_or_json(text: impl FnOnce() -> String, json: Option<serde_json::Value>, outcome: Exit) -> Result<Exit> {
    let printed = match json {
        Some(value) => print_json(&value),
        None => print(&text()),
    };
    report(printed, outcome)
}

/// Refuses a stream URL where a command takes only a database file.
fn file_only(db: &Path, command: &str) -> Result<()> {
    match stream::url_of(db) {
        Some(url) => Err(CliError::usage(format!(
            "{command} takes a database file, not a stream ({}); fold the stream into a host's files with \
             `annal rebuild FILE --from URL`",
            stream::redact(url)
        ))),
        None => Ok(()),
    }
}

fn run(cli: Cli) -> Result<Exit> {
    let file = match &cli.command {
        Command::Migrate { db, .. } => Some((db, "migrate")),
        Command::Compact { db, .. } => Some((db, "compact")),
        Command::Purge { db, .. } => Some((db, "purge")),
        Command::Gc { db, .. } => Some((db, "gc")),
        Command::Import { db, .. } => Some((db, "import")),
        Command::Sessions { db, .. } => Some((db, "sessions")),
        Command::Inspect { db, .. } => Some((db, "inspect")),
        Command::Transcript { db, .. } => Some((db, "transcript")),
        Command::Log { db, .. } => Some((db, "log")),
        Command::Graph { db, .. } => Some((db, "graph")),
        Command::Rebuild { db, from: None, .. } => Some((db, "rebuild")),
        Command::Rebuild { db, from: Some(_), .. } if stream::url_of(db).is_some() => {
            return Err(CliError::usage("rebuild --from URL takes the host's file, not a stream"));
        }
        _ => None,
    };
    if let Some((db, command)) = file {
        file_only(db, command)?;
    }
    match cli.command {
        Command::Demo { db, sessions } => {
            let demo = demo::demo(&demo::DemoOptions { db, sessions, progress: true })?;
            report(print(&demo.render()), if demo.verify.is_clean() { Exit::Ok } else { Exit::Finding })
        }
        Command::Verify { db, key, deep, expect_tip, json } => {
            let expect_tip = match expect_tip {
                None => None,
                Some(h) => Some(h.parse().map_err(|e| CliError::usage(format!("--expect-tip: {e}")))?),
            };
            let opts = VerifyOptions { key: key.read()?, deep, expect_tip, progress: true };
            if let Some(url) = stream::url_of(&db) {
                let verified = stream::verify(url, &opts)?;
                let outcome = if verified.is_clean() { Exit::Ok } else { Exit::Finding };
                return report_text_or_json(|| verified.render(), json.then(|| verified.to_json()), outcome);
            }
            let verified = verify::verify(&db, &opts)?;
            let outcome = if verified.is_clean() { Exit::Ok } else { Exit::Finding };
            report_text_or_json(|| verified.render(), json.then(|| verified.to_json()), outcome)
        }
        Command::Migrate { db, key } => {
            annal_replay::require_file(&db)?;
            let stats = annal::migrate(&db, key.read()?)?;
            if stats.from_format == annal::tables::FORMAT && stats.content_rows_listed == 0 {
                print(&format!("{} is already in format {}; nothing to do\n", db.display(), stats.from_format))?;
            } else if stats.from_format != 1 {
                print(&format!(
                    "migrated {} from format {} to {}: the ids of {} earlier content rows listed\n",
                    db.display(),
                    stats.from_format,
                    annal::tables::FORMAT,
                    stats.content_rows_listed
                ))?;
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
        Command::Compact { db, key, compression: None } => {
            print(&compact::render(&compact::compact(&db, key.read()?)?))?;
            Ok(Exit::Ok)
        }
        Command::Compact { db, key, compression: Some(compression) } => {
            let stats = compact::recompress(&db, key.read()?, compression.into(), true)?;
            print(&compact::render_recompress(&stats))?;
            Ok(Exit::Ok)
        }
        Command::Purge { db, session, reason, actor, descendants, key } => {
            let mut request = annal::PurgeRequest::new(parse_session(&session)?, reason, actor);
            request.descendants = descendants;
            print(&purge::render(&purge::purge(&db, key.read()?, &request)?))?;
            Ok(Exit::Ok)
        }
        Command::Gc { db, key } => {
            print(&purge::render(&purge::gc(&db, key.read()?)?))?;
            Ok(Exit::Ok)
        }
        Command::Rebuild { db, from: Some(url), key, .. } => {
            print(&stream::rebuild_from(&db, &url, key.read()?, true)?.render())?;
            Ok(Exit::Ok)
        }
        Command::Rebuild { db, projections, key, from: None } => {
            let projections = rebuild::parse_projections(&projections)?;
            let report = rebuild::rebuild(&db, &RebuildOptions { projections, key: key.read()?, progress: true })?;
            print(&report.render())?;
            Ok(Exit::Ok)
        }
        Command::Export { db, sessions, ancestry, key } => {
            let sessions = sessions.iter().map(|s| parse_session(s)).collect::<Result<Vec<_>>>()?;
            let key = key.read()?;
            let folded = stream::url_of(&db).map(|url| stream::fold(url, key, true)).transpose()?;
            if let Some(warning) = folded.as_ref().and_then(stream::Folded::warning) {
                eprintln!("annal: {warning}");
            }
            let db = folded.as_ref().map_or(db.as_path(), |f| f.path.as_path());
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            match sessions.is_empty() {
                true => export::export(db, key, &[], &mut out, true)?,
                false => export::export_sessions(db, key, &sessions, ancestry, &mut out, true)?,
            };
            Ok(Exit::Ok)
        }
        Command::Import { file, db, key, rechain } => {
            let opts = ImportOptions { key: key.read()?, rechain };
            let report = if file.as_os_str() == "-" {
                export::import(&db, &mut std::io::stdin().lock(), &opts)?
            } else {
                let f = std::fs::File::open(&file).map_err(|e| CliError::usage(format!("{}: {e}", file.display())))?;
                export::import(&db, &mut BufReader::new(f), &opts)?
            };
            print(&report.render())?;
            Ok(Exit::Ok)
        }
        Command::Sessions { db, labels, archived, recent, json, key } => {
            let labels = inspect::parse_labels(&labels)?;
            let heads = inspect::sessions(&open_reader(&db, key.read()?)?, &labels, archived, recent)?;
            if json {
                print_json(&inspect::sessions_json(&heads))?;
            } else {
                print(&inspect::render_sessions(&heads))?;
            }
            Ok(Exit::Ok)
        }
        Command::Inspect { db, session, json, key } => {
            let session = parse_session(&session)?;
            let inspection = inspect::inspect(&open_reader(&db, key.read()?)?, session)?;
            if json {
                print_json(&inspection.to_json())?;
            } else {
                print(&inspection.render())?;
            }
            Ok(Exit::Ok)
        }
        Command::Transcript { db, session, revision, offset, limit, json, key } => {
            let session = parse_session(&session)?;
            let revision = match revision {
                None => None,
                Some(r) => Some(r.parse().map_err(|e| CliError::usage(format!("--revision: {e}")))?),
            };
            let most = annal::Limits::default().page_items_max;
            if limit > most {
                return Err(CliError::usage(format!("--limit {limit}: a page holds at most {most} messages")));
            }
            let page = annal::PageRequest::new(offset, limit);
            let page = inspect::transcript(&open_reader(&db, key.read()?)?, session, revision, page)?;
            if json {
                print_json(&inspect::transcript_json(&page))?;
            } else {
                print(&inspect::render_transcript(&page))?;
            }
            Ok(Exit::Ok)
        }
        Command::Log { db, session, from, limit, json, key } => {
            let session = session.as_deref().map(parse_session).transpose()?;
            let reader = open_reader(&db, key.read()?)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            inspect::log(&reader, &LogQuery { session, from_seq: from, limit, json }, &mut out)?;
            out.flush()?;
            Ok(Exit::Ok)
        }
        Command::Graph { db, session, format, key } => {
            let session = parse_session(&session)?;
            let reader = open_reader(&db, key.read()?)?;
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
        Command::Stats { db, json, key } => {
            let key = key.read()?;
            let Some(url) = stream::url_of(&db) else {
                let stats = inspect::stats(&open_reader(&db, key)?, Path::new(&db))?;
                if json {
                    print_json(&stats.to_json())?;
                } else {
                    print(&stats.render())?;
                }
                return Ok(Exit::Ok);
            };
            let folded = stream::fold(url, key, true)?;
            if let Some(warning) = folded.warning() {
                eprintln!("annal: {warning}");
            }
            let stats = inspect::stats(&open_reader(&folded.path, key)?, &folded.path)?;
            if json {
                let mut value = stats.to_json();
                value["stream"] = serde_json::json!({
                    "url": stream::redact(url),
                    "tip": folded.tip,
                    "messages": folded.tip,
                    "records": folded.records,
                });
                print_json(&value)?;
            } else {
                print(&format!("{}{}", stream::render_tip(url, &folded), stats.render()))?;
            }
            Ok(Exit::Ok)
        }
    }
}

/// What the last panic said, where: kept by the panic hook for the report of a command
/// that panicked.
static PANICKED: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Ctrl-C removes the scratch directories of a demo or a fold before the process ends.
    // Without the handler the command still works; only its scratch may stay behind.
    let _ = annal_replay::interrupt::remove_scratch_on_signal();
    // The storage layer panics on some damaged pages. The library turns the panics it
    // meets into errors, but a command also reads through the storage layer itself; a
    // panic that gets that far is the command's finding (exit 1) with the panic's message
    // and place, never the runtime's report and its exit code 101.
    std::panic::set_hook(Box::new(|info| {
        let place = info.location().map(|l| format!(" ({}:{})", l.file(), l.line())).unwrap_or_default();
        let said = annal::error::panic_message(info.payload());
        *PANICKED.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{said}{place}"));
    }));
    let ran = std::panic::catch_unwind(|| run(cli)).unwrap_or_else(|payload| {
        let said = PANICKED.lock().unwrap_or_else(|e| e.into_inner()).take();
        let said = said.unwrap_or_else(|| annal::error::panic_message(payload.as_ref()));
        Err(CliError::finding(format!(
            "the command stopped on damaged data (`annal verify` reports what is damaged): {}",
            said.replace('\n', " ")
        )))
    });
    let exit = match ran {
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
