//! Shared logs as command-line arguments: `annal verify`, `export` and `stats` take a
//! JetStream URL wherever they take a database file, and `annal rebuild FILE --from URL`
//! makes a host's files again from the stream (`docs/design.md` §13).
//!
//! A stream is read by folding it, from its first message to the tip it had when the
//! command started, into a fresh host ([`annal::Engine::open_shared`]) in a temporary
//! directory: the same fold, under the same void rule, that every host of the log runs.
//! The command then works on that host's file as on any other. `verify` first walks the
//! stream itself ([`annal::shared::verify_stream`]): a message that fails its MAC
//! (written without the chain key, or damaged) or does not decode is a finding, which
//! the fold alone would hide, since every host voids it.
//!
//! A URL has the form that `annal_jetstream::Options::from_url` reads.
//! Unless it says `create=true`, a command never creates the stream: a stream that does
//! not exist is a usage error. The functions that take a backend
//! ([`fold_backend`], [`verify_backend`], [`rebuild_from_backend`]) work on any
//! [`LogBackend`]; those that take a URL need the `jetstream` feature (on by default),
//! and without it fail with a usage error that says so.

use crate::interrupt::Scratch;
use crate::verify::{VerifyOptions, VerifyReport};
use crate::{CliError, Result};
use annal::backend::{BackendError, LogBackend};
use annal::codec::LogChain;
use annal::shared::StreamReport;
use annal::{Engine, Limits, Options};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a connection is tried again after an error that may pass (servers down, a
/// timeout, a leader election), before the command gives up.
pub const CONNECT_RETRY: Duration = Duration::from_secs(30);

/// How long the fold may go without taking in a message before the command gives up.
pub const FOLD_STALL_MAX: Duration = Duration::from_secs(600);

/// Whether a command-line argument names a stream (`tls://` or `nats://`) rather than a
/// file. True whether or not this build can reach one.
pub fn is_url(arg: &str) -> bool {
    arg.starts_with("tls://") || arg.starts_with("nats://")
}

/// The URL in `path`, if the argument is one.
pub fn url_of(path: &Path) -> Option<&str> {
    path.to_str().filter(|s| is_url(s))
}

/// `url` with its password and any token replaced by `***`, for messages and reports.
pub fn redact(url: &str) -> String {
    annal::backend::redact_url(url)
}

fn chain(key: Option<[u8; 32]>) -> LogChain {
    key.map_or_else(LogChain::plain, LogChain::keyed)
}

/// A backend failure as the command's error: a stream that is not dense, or a message
/// that cannot be read back, is a finding; servers that cannot be reached or refuse the
/// client are a usage error.
fn backend_error(what: &str, e: BackendError) -> CliError {
    match e {
        BackendError::Other(_) => CliError::finding(format!("{what}: {e}")),
        _ => CliError::usage(format!("{what}: {e}")),
    }
}

/// Connects to the stream at `url`, trying again for [`CONNECT_RETRY`] after errors that
/// may pass; refused credentials, a stream that does not exist or one configured
/// otherwise fail at once. The stream is not created unless the URL says `create=true`.
#[cfg(feature = "jetstream")]
pub fn connect(url: &str) -> Result<Arc<dyn LogBackend>> {
    use annal_jetstream::{Error, JetStreamLog};
    let shown = redact(url);
    let mut options =
        annal_jetstream::Options::from_url(url).map_err(|e| CliError::usage(e.to_string().replace(url, &shown)))?;
    let explicit_create = url
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| pair.split('=').next() == Some("create")));
    if !explicit_create {
        options.create = false;
    }
    let deadline = Instant::now() + CONNECT_RETRY;
    let mut pause = Duration::from_millis(250);
    loop {
        match JetStreamLog::connect(&options) {
            Ok(log) => return Ok(Arc::new(log)),
            Err(e @ (Error::Refused(_) | Error::StreamMismatch { .. } | Error::StreamNotFound(_))) => {
                return Err(CliError::usage(format!("{shown}: {e}")));
            }
            Err(e) if Instant::now() + pause >= deadline => {
                return Err(CliError::usage(format!("{shown}: {e} (gave up after {CONNECT_RETRY:?})")));
            }
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(4));
            }
        }
    }
}

/// Without the `jetstream` feature: a usage error, since this build cannot reach a
/// stream.
#[cfg(not(feature = "jetstream"))]
pub fn connect(url: &str) -> Result<Arc<dyn LogBackend>> {
    Err(CliError::usage(format!(
        "{}: this build of annal has no JetStream support (build it with the `jetstream` feature)",
        redact(url)
    )))
}

/// A fold of a stream into a host's files in a temporary directory, removed when this
/// is dropped.
#[derive(Debug)]
pub struct Folded {
    /// The directory that holds the host's files.
    pub dir: tempfile::TempDir,
    /// The host's log file (its projections file is beside it).
    pub path: PathBuf,
    /// The stream's tip when the fold started: the fold took in every message up to it.
    pub tip: u64,
    /// The records the fold applied (the host's last global sequence).
    pub records: u64,
    /// The directory's registration for removal on an interrupt.
    _scratch: Scratch,
}

impl Folded {
    /// A warning for stderr when the stream has messages but none applied, which is
    /// what a wrong (or missing) chain key gives.
    pub fn warning(&self) -> Option<String> {
        (self.tip > 0 && self.records == 0).then(|| {
            format!("warning: none of the stream's {} messages applied; is the chain key right (--key-file)?", self.tip)
        })
    }
}

/// A bar over the stream's messages, drawn on stderr only when `enabled` and stderr is a
/// terminal.
fn fold_bar(total: u64, enabled: bool) -> ProgressBar {
    if !(enabled && std::io::stderr().is_terminal()) {
        return ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template = "{spinner} fold [{bar:32}] {pos}/{len} messages, {per_sec}, eta {eta}";
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Folds `backend` up to stream sequence `tip` into a new host at `path`, which must not
/// hold a host already, then closes it. Returns the records applied. Fails if the fold
/// takes in nothing for [`FOLD_STALL_MAX`], or fails.
pub fn fold_at(
    backend: Arc<dyn LogBackend>,
    path: &Path,
    key: Option<[u8; 32]>,
    tip: u64,
    progress: bool,
) -> Result<u64> {
    let options = Options { chain_key: key, ..Options::default() };
    let engine = Engine::open_shared(path, options, backend)?;
    let bar = fold_bar(tip, progress);
    let mut last = (0, Instant::now());
    let reached = loop {
        if engine.wait_for_stream(tip, Duration::from_millis(200)) {
            break true;
        }
        if engine.is_poisoned() {
            break false;
        }
        let position = engine.host_status().map_or(0, |s| s.position);
        bar.set_position(position);
        if position > last.0 {
            last = (position, Instant::now());
        } else if last.1.elapsed() >= FOLD_STALL_MAX {
            break false;
        }
    };
    bar.finish_and_clear();
    let position = engine.host_status().map_or(0, |s| s.position);
    let poisoned = engine.is_poisoned();
    let records = engine.reader().tip().map(|(seq, _)| seq);
    engine.close()?;
    if poisoned {
        return Err(CliError::finding(format!("the fold failed at stream sequence {}", position + 1)));
    }
    if !reached {
        return Err(CliError::usage(format!(
            "the fold took in nothing for {FOLD_STALL_MAX:?} at stream sequence {position} of {tip}"
        )));
    }
    Ok(records?)
}

/// Reads the tip of `backend` and folds the whole stream into a fresh host in a
/// temporary directory (under `$TMPDIR`).
pub fn fold_backend(backend: Arc<dyn LogBackend>, key: Option<[u8; 32]>, progress: bool) -> Result<Folded> {
    let tip = backend.tip().map_err(|e| backend_error("reading the stream's tip", e))?;
    let dir = tempfile::Builder::new().prefix("annal-fold-").tempdir()?;
    let scratch = Scratch::new(dir.path());
    let path = dir.path().join("host.redb");
    let records = fold_at(backend, &path, key, tip, progress)?;
    Ok(Folded { dir, path, tip, records, _scratch: scratch })
}

/// Connects to the stream at `url` and folds it into a fresh host ([`fold_backend`]).
pub fn fold(url: &str, key: Option<[u8; 32]>, progress: bool) -> Result<Folded> {
    fold_backend(connect(url)?, key, progress)
}

/// What `annal verify URL` saw and found: the stream's own walk, and the verification
/// of a host's files folded from it.
#[derive(Clone, Debug)]
pub struct StreamVerifyReport {
    /// The stream's URL, its password redacted.
    pub url: String,
    /// The walk of the stream: messages, records, and the messages every host voids
    /// because they fail their MAC or do not decode.
    pub stream: StreamReport,
    /// The verification of the folded host's files.
    pub file: VerifyReport,
}

impl StreamVerifyReport {
    /// Whether every message authenticates and decodes, and the folded files verify.
    pub fn is_clean(&self) -> bool {
        self.stream.is_clean() && self.file.is_clean()
    }

    /// Findings of the stream's walk: its forged and malformed messages.
    pub fn stream_findings(&self) -> usize {
        self.stream.forged.len() + self.stream.malformed.len()
    }

    /// The report as text: the stream's findings and summary, then the file's report.
    pub fn render(&self) -> String {
        let s = &self.stream;
        let mut out = String::new();
        for seq in &s.forged {
            out.push_str(&format!(
                "FINDING stream seq {seq}: forged: its MAC does not hold under the chain key \
                 (written without the key, or damaged); every host voids it\n"
            ));
        }
        for (seq, why) in &s.malformed {
            out.push_str(&format!("FINDING stream seq {seq}: malformed: {why}; every host voids it\n"));
        }
        out.push_str(&format!(
            "stream {}: {} messages, {} records, tip {}; {}\n",
            self.url,
            s.messages,
            s.records,
            s.tip,
            match self.stream_findings() {
                0 => "clean".to_string(),
                1 => "1 finding".to_string(),
                n => format!("{n} findings"),
            }
        ));
        out.push_str("host files folded from the stream:\n");
        out.push_str(&self.file.render());
        out
    }

    /// The report as one JSON object: `clean`, `stream` (the walk) and `file` (the
    /// folded files' report, as `annal verify --json` prints it for a file).
    pub fn to_json(&self) -> serde_json::Value {
        let s = &self.stream;
        let malformed: Vec<_> =
            s.malformed.iter().map(|(seq, why)| serde_json::json!({"seq": seq, "detail": why})).collect();
        serde_json::json!({
            "clean": self.is_clean(),
            "stream": {
                "url": self.url,
                "clean": s.is_clean(),
                "messages": s.messages,
                "records": s.records,
                "forged": s.forged,
                "malformed": malformed,
                "tip": s.tip,
            },
            "file": self.file.to_json(),
        })
    }
}

/// Walks the stream on `backend` ([`annal::shared::verify_stream`]), folds it up to the
/// tip the walk started from into a fresh host, and verifies the host's files with
/// `opts` (its key is the chain key of both).
pub fn verify_backend(backend: Arc<dyn LogBackend>, url: &str, opts: &VerifyOptions) -> Result<StreamVerifyReport> {
    let stream = annal::shared::verify_stream(&*backend, &chain(opts.key), &Limits::default())
        .map_err(|e| backend_error("walking the stream", e))?;
    let dir = tempfile::Builder::new().prefix("annal-fold-").tempdir()?;
    let _scratch = Scratch::new(dir.path());
    let path = dir.path().join("host.redb");
    fold_at(backend, &path, opts.key, stream.tip, opts.progress)?;
    let file = crate::verify::verify(&path, opts)?;
    Ok(StreamVerifyReport { url: redact(url), stream, file })
}

/// Connects to the stream at `url` and verifies it ([`verify_backend`]).
pub fn verify(url: &str, opts: &VerifyOptions) -> Result<StreamVerifyReport> {
    verify_backend(connect(url)?, url, opts)
}

/// What `annal rebuild FILE --from URL` did.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamRebuildReport {
    /// The host's log file.
    pub path: PathBuf,
    /// The stream's URL, its password redacted.
    pub url: String,
    /// The stream's tip when the rebuild started: the files hold the fold up to it.
    pub tip: u64,
    /// Records the fold applied.
    pub records: u64,
    /// Whether the host had files before (they were replaced).
    pub replaced: bool,
    /// Wall time of the fold and the swap.
    pub elapsed: Duration,
}

impl StreamRebuildReport {
    /// A one-paragraph summary for humans.
    pub fn render(&self) -> String {
        format!(
            "{} {} and its projections from stream {}\n{} messages folded to {} records in {:.3} s\n",
            if self.replaced { "rebuilt" } else { "created" },
            self.path.display(),
            self.url,
            self.tip,
            self.records,
            self.elapsed.as_secs_f64(),
        )
    }
}

/// An exclusive lock on an existing file, held until dropped: the guard that no process
/// (a host, or a reader) has it open. redb takes a shared or exclusive lock of the same
/// kind on a file it opens; a file system without such locks passes.
fn lock_existing(path: &Path) -> Result<Option<std::fs::File>> {
    let file = match std::fs::OpenOptions::new().read(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CliError::usage(format!("{}: {e}", path.display()))),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => {
            Err(CliError::usage(format!("{} is open in another process; stop it first", path.display())))
        }
        Err(std::fs::TryLockError::Error(_)) => Ok(Some(file)),
    }
}

fn sync_file(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Makes the files of the host at `path` again from the stream on `backend`: folds the
/// whole stream into a new host in a temporary directory beside `path` (so that the
/// renames stay on one file system), fsyncs its files, renames its log file and its
/// projections file ([`annal::projections_path`]) over the old ones, and fsyncs the
/// directory. All or nothing: on a failure before the swap the old files are untouched,
/// and a rename that fails puts back what the swap had replaced; the temporary files
/// are removed either way. `path` may not exist yet (the host is then created); it must
/// not be an embedded database (one with a journal), and no process may have it open.
/// Drafts, which never go to the stream, are not kept.
pub fn rebuild_from_backend(
    path: &Path,
    backend: Arc<dyn LogBackend>,
    url: &str,
    key: Option<[u8; 32]>,
    progress: bool,
) -> Result<StreamRebuildReport> {
    let started = Instant::now();
    let (name, parent) = match (path.file_name(), path.parent()) {
        (Some(name), Some(parent)) => (name, if parent.as_os_str().is_empty() { Path::new(".") } else { parent }),
        _ => return Err(CliError::usage(format!("{} is not a file name", path.display()))),
    };
    let replaced = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => true,
        Ok(_) => return Err(CliError::usage(format!("{} is not a file", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(CliError::usage(format!("{}: {e}", path.display()))),
    };
    if annal::journal_paths(path).iter().any(|p| p.exists()) {
        return Err(CliError::usage(format!(
            "{} has a journal: it is an embedded database, not a host's",
            path.display()
        )));
    }
    let projections = annal::projections_path(path);
    let _locks = [lock_existing(path)?, lock_existing(&projections)?];
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".from-stream-");
    let scratch = tempfile::Builder::new()
        .prefix(&prefix)
        .tempdir_in(parent)
        .map_err(|e| CliError::usage(format!("cannot make a temporary directory in {}: {e}", parent.display())))?;
    let _scratch = Scratch::new(scratch.path());
    let new = scratch.path().join(name);
    let new_projections = annal::projections_path(&new);
    let tip = backend.tip().map_err(|e| backend_error("reading the stream's tip", e))?;
    let records = fold_at(backend, &new, key, tip, progress)?;
    sync_file(&new)?;
    sync_file(&new_projections)?;
    swap(scratch.path(), &[(&new, path), (&new_projections, &projections)])?;
    std::fs::File::open(parent)?.sync_all()?;
    drop(scratch);
    Ok(StreamRebuildReport {
        path: path.to_path_buf(),
        url: redact(url),
        tip,
        records,
        replaced,
        elapsed: started.elapsed(),
    })
}

/// Renames each `(from, to)` in order. Before the first, each `to` that exists is
/// hard-linked into `scratch`, so that if a rename fails the ones done are undone: the
/// old file linked back (or the new one removed where there was none).
fn swap(scratch: &Path, pairs: &[(&Path, &Path)]) -> Result<()> {
    let mut backups = Vec::new();
    for (i, (_, to)) in pairs.iter().enumerate() {
        let backup = scratch.join(format!("old.{i}"));
        let kept = match std::fs::hard_link(to, &backup) {
            Ok(()) => Some(backup),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(CliError::usage(format!("cannot keep {} aside: {e}", to.display()))),
        };
        backups.push(kept);
    }
    for (done, (from, to)) in pairs.iter().enumerate() {
        if let Err(e) = std::fs::rename(from, to) {
            for (j, (_, to)) in pairs[..done].iter().enumerate() {
                let _ = match &backups[j] {
                    Some(backup) => std::fs::rename(backup, to),
                    None => std::fs::remove_file(to),
                };
            }
            return Err(CliError::usage(format!("cannot rename {} to {}: {e}", from.display(), to.display())));
        }
    }
    Ok(())
}

/// Connects to the stream at `url` and rebuilds the host at `path` from it
/// ([`rebuild_from_backend`]).
pub fn rebuild_from(path: &Path, url: &str, key: Option<[u8; 32]>, progress: bool) -> Result<StreamRebuildReport> {
    rebuild_from_backend(path, connect(url)?, url, key, progress)
}

/// The stream's tip and message count, for `annal stats URL`.
pub fn render_tip(url: &str, folded: &Folded) -> String {
    format!(
        "stream {}: tip {}, {} messages folded to {} records\n",
        redact(url),
        folded.tip,
        folded.tip,
        folded.records
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use annal::backend::RedbStream;
    use annal::{CreateSession, Message};

    const KEY: [u8; 32] = [5; 32];

    /// A stream with two sessions written by a host in `dir`; returns the host's file.
    fn written(dir: &Path, stream: &RedbStream) -> PathBuf {
        let path = dir.join("writer.redb");
        let options = Options { chain_key: Some(KEY), ..Options::default() };
        let engine = Engine::open_shared(&path, options, Arc::new(stream.clone())).unwrap();
        for i in 0..2 {
            engine.create_session(CreateSession::new().message(Message::system(format!("session {i}")))).unwrap();
        }
        engine.close().unwrap();
        path
    }

    fn digests(path: &Path) -> (u64, Vec<annal::TableDigest>) {
        let reader = annal::Reader::open(path, Limits::default(), Some(KEY)).unwrap();
        (reader.tip().unwrap().0, reader.projection_digests().unwrap())
    }

    #[test]
    fn urls_are_told_from_files_and_passwords_are_redacted() {
        assert!(is_url("tls://h:1") && is_url("nats://h:1") && !is_url("/tmp/a.redb"));
        assert_eq!(redact("tls://u:secret@h:1,h:2/S?ca=/c.pem"), "tls://u:***@h:1,h:2/S?ca=/c.pem");
        assert_eq!(redact("nats://h:1?token=t&prefix=p"), "nats://h:1?token=***&prefix=p");
        assert_eq!(redact("tls://u@h:1"), "tls://u@h:1");
    }

    #[test]
    fn a_fold_verifies_and_a_rebuild_replaces_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let stream = RedbStream::memory().unwrap();
        let writer = written(dir.path(), &stream);
        let before = digests(&writer);
        let backend: Arc<dyn LogBackend> = Arc::new(stream.clone());
        let folded = fold_backend(backend.clone(), Some(KEY), false).unwrap();
        assert_eq!((folded.tip, folded.records, folded.warning()), (2, before.0, None));
        assert_eq!(digests(&folded.path), before);
        let unkeyed = fold_backend(backend.clone(), None, false).unwrap();
        assert!(unkeyed.warning().is_some(), "every message is void without the key");
        let opts = VerifyOptions { key: Some(KEY), deep: true, ..VerifyOptions::default() };
        let report = verify_backend(backend.clone(), "nats://h:1", &opts).unwrap();
        assert!(report.is_clean(), "{}", report.render());
        assert_eq!(report.to_json()["stream"]["messages"], 2);

        std::fs::write(annal::projections_path(&writer), b"garbage").unwrap();
        let report = rebuild_from_backend(&writer, backend.clone(), "nats://h:1", Some(KEY), false).unwrap();
        assert!(report.replaced);
        assert_eq!(digests(&writer), before);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "only the host's two files: {left:?}");

        // A file another process (here, an engine) has open is refused and left alone.
        let engine =
            Engine::open_shared(&writer, Options { chain_key: Some(KEY), ..Options::default() }, backend.clone())
                .unwrap();
        let refused = rebuild_from_backend(&writer, backend.clone(), "nats://h:1", Some(KEY), false).unwrap_err();
        assert!(refused.message.contains("open in another process"), "{refused}");
        engine.close().unwrap();

        // A new host is created where there was none.
        let fresh = dir.path().join("fresh.redb");
        let report = rebuild_from_backend(&fresh, backend, "nats://h:1", Some(KEY), false).unwrap();
        assert!(!report.replaced);
        assert_eq!(digests(&fresh), before);
    }

    #[test]
    fn a_failed_swap_puts_the_old_files_back() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir_in(dir.path()).unwrap();
        let (old_a, old_b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&old_a, b"old a").unwrap();
        let new_a = scratch.path().join("a");
        std::fs::write(&new_a, b"new a").unwrap();
        let missing = scratch.path().join("missing");
        let err = swap(scratch.path(), &[(&new_a, &old_a), (&missing, &old_b)]).unwrap_err();
        assert!(err.message.contains("cannot rename"), "{err}");
        assert_eq!(std::fs::read(&old_a).unwrap(), b"old a");
        assert!(!old_b.exists());
    }

    #[cfg(not(feature = "jetstream"))]
    #[test]
    fn without_the_feature_a_url_is_a_usage_error() {
        let Err(e) = connect("tls://u:pw@h:1") else { panic!("a stream without the feature") };
        assert_eq!(e.exit, crate::Exit::Usage);
        assert!(e.message.contains("no JetStream support") && !e.message.contains("pw"), "{e}");
    }
}
