//! The `annal` Python package's native module, `annal._annal`.
//!
//! Every engine call runs with the GIL released (`Python::detach`), so Python threads
//! that commit at the same time reach the writer together and share its group commit.
//! The `_async` methods queue the command at once and return an `asyncio.Future`; one
//! completion thread waits for the engine's replies and resolves the futures on their
//! event loops, so the engine's writer never touches the GIL.

mod convert;
mod errors;
mod exit;

use annal::{
    AppendContext, ClaimInputs, ClaimTarget, Command, CommitTurn, CreateSession, Durability, Engine, EventQuery,
    Expected, Fence, Fork, InputKind, ListQuery, Options, Outcome, PageRequest, RecordToolCall, RecordToolResult,
    Recovery, Restore, RevisionId, Rewrite, RewriteReason, Role, SessionId, SetHostState, SetLabels, SetMetadata,
    StateChanges, ToolOutcome, Usage,
};
use convert::*;
use errors::to_py;
use pyo3::exceptions::{PyFileNotFoundError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyMapping, PyString};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{mpsc, Arc, OnceLock, RwLock};
use std::time::Duration;

/// A message as the host hands it in: a role, a content type, a body and attachments.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct Message {
    /// `"system"`, `"user"`, `"assistant"` or `"tool"`.
    pub role: String,
    /// A short media type, e.g. `text/plain`.
    pub content_type: String,
    /// The host's serialized message.
    pub body: Vec<u8>,
    /// Attachment bytes; each is stored once as its own content object.
    pub attachments: Vec<Vec<u8>>,
}

/// The bytes of an argument that takes bytes, a bytearray or a str (its UTF-8); anything
/// else, a list of ints included, is a `TypeError`.
fn bytes_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = value.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = value.cast::<pyo3::types::PyByteArray>() {
        return Ok(b.to_vec());
    }
    match value.cast::<PyString>() {
        Ok(s) => Ok(s.to_str()?.as_bytes().to_vec()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{what} must be bytes, bytearray or str, not {}",
            value.get_type().name()?
        ))),
    }
}

fn parse_role(role: &str) -> PyResult<Role> {
    match role {
        "system" => Ok(Role::System),
        "user" => Ok(Role::User),
        "assistant" => Ok(Role::Assistant),
        "tool" => Ok(Role::Tool),
        other => Err(PyValueError::new_err(format!("unknown role {other:?}: system, user, assistant or tool"))),
    }
}

#[pymethods]
impl Message {
    #[new]
    #[pyo3(signature = (role, body, content_type = "text/plain", attachments = Vec::new()))]
    fn new(
        role: &str,
        body: &Bound<'_, PyAny>,
        content_type: &str,
        attachments: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Message> {
        parse_role(role)?;
        let attachments = attachments.iter().map(|a| bytes_arg(a, "an attachment")).collect::<PyResult<_>>()?;
        Ok(Message {
            role: role.to_string(),
            content_type: content_type.to_string(),
            body: bytes_arg(body, "body")?,
            attachments,
        })
    }

    /// A `text/plain` message from the user.
    #[staticmethod]
    fn user(text: &str) -> Message {
        Message::plain("user", text)
    }

    /// A `text/plain` message from the assistant.
    #[staticmethod]
    fn assistant(text: &str) -> Message {
        Message::plain("assistant", text)
    }

    /// A `text/plain` system message.
    #[staticmethod]
    fn system(text: &str) -> Message {
        Message::plain("system", text)
    }

    /// A `text/plain` tool message.
    #[staticmethod]
    fn tool(text: &str) -> Message {
        Message::plain("tool", text)
    }

    /// The body decoded as UTF-8.
    fn text(&self) -> PyResult<String> {
        String::from_utf8(self.body.clone()).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    fn __repr__(&self) -> String {
        format!("Message(role={:?}, content_type={:?}, body=<{} bytes>)", self.role, self.content_type, self.body.len())
    }

    fn __eq__(&self, other: &Message) -> bool {
        self.role == other.role
            && self.content_type == other.content_type
            && self.body == other.body
            && self.attachments == other.attachments
    }
}

impl Message {
    fn plain(role: &str, text: &str) -> Message {
        Message {
            role: role.into(),
            content_type: "text/plain".into(),
            body: text.as_bytes().to_vec(),
            attachments: vec![],
        }
    }

    fn to_engine(&self) -> PyResult<annal::Message> {
        Ok(annal::Message {
            role: parse_role(&self.role)?,
            content_type: self.content_type.clone(),
            body: self.body.clone(),
            attachments: self.attachments.clone(),
        })
    }
}

fn messages(ms: &[PyRef<'_, Message>]) -> PyResult<Vec<annal::Message>> {
    ms.iter().map(|m| m.to_engine()).collect()
}

fn session_id(text: &str) -> PyResult<SessionId> {
    text.parse().map_err(|e| PyValueError::new_err(format!("{e}")))
}

/// The fence on `session` with lease token `token`, if one is given.
fn fence(session: SessionId, token: Option<u64>) -> Option<Fence> {
    token.map(|t| Fence::new(session, t))
}

/// The engine handle a command runs on: `e` itself, or a handle fenced by `fence`.
fn fenced_run<T>(e: &Engine, fence: Option<Fence>, f: impl FnOnce(&Engine) -> T) -> T {
    match fence {
        Some(fence) => f(&e.fenced(fence)),
        None => f(e),
    }
}

fn parse_input_kind(kind: &str) -> PyResult<InputKind> {
    match kind {
        "next_turn" => Ok(InputKind::NextTurn),
        "active_turn" => Ok(InputKind::ActiveTurn),
        other => Err(PyValueError::new_err(format!("unknown input kind {other:?}: next_turn or active_turn"))),
    }
}

fn parse_claim_target(target: &str, turn_id: Option<String>) -> PyResult<ClaimTarget> {
    match (target, turn_id) {
        ("next_turn", None) => Ok(ClaimTarget::NextTurn),
        ("next_turn", Some(_)) => Err(PyValueError::new_err("a next_turn claim takes no turn_id")),
        ("active_turn", Some(turn)) => Ok(ClaimTarget::Turn(turn)),
        ("active_turn", None) => Err(PyValueError::new_err("an active_turn claim needs the live turn's turn_id")),
        (other, _) => Err(PyValueError::new_err(format!("unknown claim target {other:?}: next_turn or active_turn"))),
    }
}

fn lease_ref(lease: &Lease) -> PyResult<annal::Lease> {
    Ok(annal::Lease {
        session: session_id(&lease.session)?,
        owner: lease.owner.clone(),
        token: lease.token,
        expires_at_ms: lease.expires_at_ms,
    })
}

fn revision_id(text: &str) -> PyResult<RevisionId> {
    text.parse().map_err(|e| PyValueError::new_err(format!("{e}")))
}

/// `None` → any head; `str` → that revision; `int` → that stream seq.
fn expected(value: Option<&Bound<'_, PyAny>>) -> PyResult<Expected> {
    let Some(value) = value else { return Ok(Expected::Any) };
    if value.is_none() {
        return Ok(Expected::Any);
    }
    if let Ok(text) = value.extract::<String>() {
        return Ok(Expected::Exact(revision_id(&text)?));
    }
    // `bool` is an `int` to Python: `True` would be stream seq 1.
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(
            "expected must be None, a revision id (str) or a stream seq (int), not a bool",
        ));
    }
    if value.is_instance_of::<pyo3::types::PyInt>() {
        return value.extract::<u64>().map(Expected::Version).map_err(|_| {
            PyValueError::new_err(format!("expected: a stream seq is an int from 0 to 2**64 - 1, not {value}"))
        });
    }
    Err(PyTypeError::new_err("expected must be None, a revision id (str) or a stream seq (int)"))
}

fn usage(items: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<Usage>> {
    items
        .iter()
        .map(|item| {
            if let Ok((provider, model, input, output)) = item.extract::<(String, String, u64, u64)>() {
                return Ok(Usage { provider, model, input, output, cache_read: 0, cache_write: 0 });
            }
            let (provider, model, input, output, cache_read, cache_write) =
                item.extract::<(String, String, u64, u64, u64, u64)>().map_err(|_| {
                    PyTypeError::new_err(
                        "usage items are (provider, model, input, output[, cache_read, cache_write]) tuples",
                    )
                })?;
            Ok(Usage { provider, model, input, output, cache_read, cache_write })
        })
        .collect()
}

/// The `(key, value)` pairs of a `dict` or of any other mapping.
fn mapping_items<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    if let Ok(d) = obj.cast::<PyDict>() {
        return Ok(d.iter().collect());
    }
    let m = obj.cast::<PyMapping>().map_err(|_| PyTypeError::new_err(format!("{what} must be a mapping")))?;
    m.items()?.iter().map(|item| item.extract()).collect()
}

/// `Mapping[str, str]` (labels): a `dict` or any other mapping.
#[derive(Default)]
struct StrMap(BTreeMap<String, String>);

impl<'a, 'py> FromPyObject<'a, 'py> for StrMap {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<StrMap> {
        let items = mapping_items(&obj, "labels")?;
        items.into_iter().map(|(k, v)| Ok((k.extract()?, v.extract()?))).collect::<PyResult<_>>().map(StrMap)
    }
}

/// A collection of `str` (a list, tuple, set, ...), but not a `str` itself.
#[derive(Default)]
struct StrSet(BTreeSet<String>);

impl<'a, 'py> FromPyObject<'a, 'py> for StrSet {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<StrSet> {
        if obj.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err("expected a collection of str, not a str"));
        }
        obj.try_iter()?.map(|item| item?.extract::<String>()).collect::<PyResult<_>>().map(StrSet)
    }
}

/// `{name: bytes}` sets, `{name: None}` removes (a `dict` or any other mapping).
fn state_changes(state: Option<&Bound<'_, PyAny>>) -> PyResult<StateChanges> {
    let mut changes = StateChanges::default();
    if let Some(state) = state.filter(|s| !s.is_none()) {
        for (name, value) in mapping_items(state, "state")? {
            let name: String = name.extract()?;
            if value.is_none() {
                changes.remove.insert(name);
            } else {
                changes.set.insert(name, bytes_arg(&value, "a host state value")?);
            }
        }
    }
    Ok(changes)
}

struct Pending {
    reply: std::pin::Pin<Box<annal::Reply<Outcome>>>,
    waiter: Waiter,
}

struct Waiter {
    future: Py<PyAny>,
    event_loop: Py<PyAny>,
    convert: fn(Python<'_>, Outcome) -> PyResult<Py<PyAny>>,
}

/// The completion thread: waits for the queued replies in turn (replies arrive in about
/// commit order, so waiting in order costs nothing), takes every later one that is
/// answered already (a group commit answers many at once), and resolves them all with
/// one hold of the GIL and one `call_soon_threadsafe` per event loop.
fn completions() -> &'static mpsc::Sender<Pending> {
    static SENDER: OnceLock<mpsc::Sender<Pending>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Pending>();
        std::thread::Builder::new()
            .name("annal-py-completions".into())
            .spawn(move || {
                let mut carry: Option<Pending> = None;
                loop {
                    let first = match carry.take() {
                        Some(p) => p,
                        None => match rx.recv() {
                            Ok(p) => p,
                            Err(_) => return,
                        },
                    };
                    let mut done = vec![(first.waiter, block_on(first.reply))];
                    while let Ok(mut next) = rx.try_recv() {
                        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                        match std::future::Future::poll(next.reply.as_mut(), &mut cx) {
                            std::task::Poll::Ready(result) => done.push((next.waiter, result)),
                            std::task::Poll::Pending => {
                                carry = Some(next);
                                break;
                            }
                        }
                    }
                    resolve_all(done);
                }
            })
            .expect("spawn the completion thread");
        tx
    })
}

/// Resolves answered futures on their event loops. Once the interpreter exits (or is no
/// longer initialized) the answers are dropped: their futures can no longer be awaited.
fn resolve_all(done: Vec<(Waiter, annal::Result<Outcome>)>) {
    let Some(_region) = exit::enter() else {
        return;
    };
    // `None`: the interpreter is not initialized; the answers go.
    let _ = Python::try_attach(move |py| {
        // Per event loop: (future, ok, value or exception) of each answered command.
        type Answers = Vec<(Py<PyAny>, bool, Py<PyAny>)>;
        let mut by_loop: Vec<(Py<PyAny>, Answers)> = Vec::new();
        for (waiter, result) in done {
            let (ok, value) = match result.map_err(|e| to_py(py, e)).and_then(|o| (waiter.convert)(py, o)) {
                Ok(value) => (true, value),
                Err(err) => (false, err.into_value(py).into_any()),
            };
            match by_loop.iter_mut().find(|(l, _)| l.as_ptr() == waiter.event_loop.as_ptr()) {
                Some((_, items)) => items.push((waiter.future, ok, value)),
                None => by_loop.push((waiter.event_loop, vec![(waiter.future, ok, value)])),
            }
        }
        let resolve = match py.import("annal._resolve").and_then(|m| m.getattr("resolve_many")) {
            Ok(f) => f,
            Err(e) => return e.write_unraisable(py, None),
        };
        for (event_loop, items) in by_loop {
            if let Err(e) = event_loop.call_method1(py, "call_soon_threadsafe", (&resolve, items)) {
                // A closed loop: nobody waits for these futures any more, and the answers
                // go quietly. Anything else is reported, as an error nobody can catch.
                let closed = event_loop.call_method0(py, "is_closed").and_then(|c| c.is_truthy(py)).unwrap_or(false);
                if !closed {
                    e.write_unraisable(py, None);
                }
            }
        }
    });
}

struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = std::task::Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// An open annal database: the log file at `path` and its projections file beside it.
/// `Database(path)` opens it, creating it if it does not exist.
///
/// `durable=False` opens with relaxed durability: commits are acknowledged before
/// they are on disk, so a crash can lose recent acknowledged commits (never half of
/// one), and the file is held exclusively (no other process can read it while it is
/// open). It is meant for tests and bulk imports.
///
/// `compress` says how new content is stored: `True` (lz4, the default), `"zstd"` (a
/// quarter to a third smaller, for more CPU), `"lz4"`, or `False` / `"off"`
/// (uncompressed). Content written under any of them reads back under every other.
///
/// Thread-safe: share one `Database` between threads (and asyncio tasks). Every call
/// releases the GIL while the engine works, so concurrent commits are group-committed.
#[pyclass(module = "annal", frozen, weakref)]
pub struct Database {
    engine: RwLock<Option<Engine>>,
    path: String,
    options: OpenOptions,
}

impl Drop for Database {
    /// A database dropped without `close()` (collected) closes here, and like `close()`
    /// without the GIL: its shutdown (the last checkpoint, the journal's absorption) lets
    /// other threads run meanwhile. Once the interpreter is exiting it only drops the
    /// engine, as a thread must not attach to a finalizing interpreter.
    fn drop(&mut self) {
        let engine = match self.engine.get_mut() {
            Ok(engine) => engine.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(engine) = engine else { return };
        if exit::exiting() {
            return drop(engine);
        }
        // `None` (no interpreter to detach from): the closure and the engine are dropped.
        let _ = Python::try_attach(move |py| exit::detached(py, move || drop(engine.close())));
    }
}

#[derive(Clone)]
struct OpenOptions {
    durable: bool,
    compression: annal::Compression,
}

impl OpenOptions {
    fn engine_options(&self) -> Options {
        Options {
            durability: if self.durable { Durability::Durable } else { Durability::Relaxed },
            compression: self.compression,
            ..Options::default()
        }
    }
}

/// `compress=`: a flag (the default compression, or none) or a codec's name.
#[derive(FromPyObject)]
enum Compress {
    Flag(bool),
    Codec(String),
}

impl Compress {
    fn compression(self) -> PyResult<annal::Compression> {
        Ok(match self {
            Compress::Flag(true) => annal::Compression::default(),
            Compress::Flag(false) => annal::Compression::Off,
            Compress::Codec(name) => match name.as_str() {
                "lz4" => annal::Compression::Lz4,
                "zstd" => annal::Compression::Zstd,
                "off" => annal::Compression::Off,
                other => {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "compress must be True, False, \"lz4\", \"zstd\" or \"off\", not {other:?}"
                    )))
                }
            },
        })
    }
}

impl Database {
    /// Runs `f` on the engine without the GIL. The engine's read lock is taken without
    /// the GIL too, and held for the call, so a purge (which takes the write lock) waits
    /// for the calls in flight and the calls made meanwhile wait for it.
    fn run<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&Engine) -> annal::Result<T> + Send) -> PyResult<T> {
        exit::detached(py, || {
            let guard = self.engine.read().map_err(|_| annal::Error::Closed)?;
            let engine = guard.as_ref().ok_or(annal::Error::Closed)?;
            f(engine)
        })
        .map_err(|e| to_py(py, e))
    }

    fn submit(
        &self,
        py: Python<'_>,
        command: Command,
        fence: Option<Fence>,
        convert: fn(Python<'_>, Outcome) -> PyResult<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let asyncio = py.import("asyncio")?;
        let event_loop = asyncio.call_method0("get_running_loop")?;
        let future = event_loop.call_method0("create_future")?;
        // Queuing compresses the content and may wait for room in the queue: no GIL.
        let reply = self.run(py, move |e| Ok(fenced_run(e, fence, |e| e.execute_async(command))))?;
        completions()
            .send(Pending {
                reply: Box::pin(reply),
                waiter: Waiter { future: future.clone().unbind(), event_loop: event_loop.unbind(), convert },
            })
            .map_err(|_| to_py(py, annal::Error::Closed))?;
        Ok(future.unbind())
    }
}

#[pymethods]
impl Database {
    /// Opens (or creates) the database at `path` (see the class documentation for
    /// `durable` and `compress`).
    #[new]
    #[pyo3(signature = (path, *, durable = true, compress = Compress::Flag(true)))]
    fn open(py: Python<'_>, path: std::path::PathBuf, durable: bool, compress: Compress) -> PyResult<Database> {
        let options = OpenOptions { durable, compression: compress.compression()? };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
            // What `open()` raises for a file in a directory that does not exist.
            return Err(PyFileNotFoundError::new_err((
                2,
                "No such file or directory",
                dir.to_string_lossy().into_owned(),
            )));
        }
        let engine_options = options.engine_options();
        let open_path = path.clone();
        let engine =
            exit::detached(py, move || Engine::open_with(&open_path, engine_options)).map_err(|e| to_py(py, e))?;
        Ok(Database { engine: RwLock::new(Some(engine)), path: path.to_string_lossy().into_owned(), options })
    }

    /// The path of the log file.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Whether commits are acknowledged only once they are on disk.
    #[getter]
    fn durable(&self) -> bool {
        self.options.durable
    }

    /// Whether the database is closed.
    #[getter]
    fn closed(&self) -> bool {
        match self.engine.try_read() {
            Ok(guard) => guard.is_none(),
            // A purge holds the engine: it is reopened when the purge ends.
            Err(std::sync::TryLockError::WouldBlock) => false,
            Err(std::sync::TryLockError::Poisoned(_)) => true,
        }
    }

    /// The failure that poisoned the engine, as the `annal.errors` instance it raised
    /// (a full disk is `errors.Storage` with `kind == "StorageFull"`), or `None` while
    /// the engine is not poisoned. Reopen the database to write again.
    fn poison_cause(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let cause = self.run(py, |e| Ok(e.poison_cause()))?;
        Ok(cause.map(|e| to_py(py, e).into_value(py).into_any()))
    }

    /// Flushes and stops the writer; later calls raise `Closed`. Closing twice is fine.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        exit::detached(py, || {
            let engine = self.engine.write().map_err(|_| annal::Error::Closed)?.take();
            match engine {
                Some(engine) => engine.close(),
                None => Ok(()),
            }
        })
        .map_err(|e| to_py(py, e))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _ty: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    // ----- commands -----

    /// Creates a session with optional labels, metadata and initial messages.
    #[pyo3(signature = (*, labels = None, metadata = None, messages = Vec::new(), session = None))]
    fn create_session(
        &self,
        py: Python<'_>,
        labels: Option<StrMap>,
        metadata: Option<Vec<u8>>,
        messages: Vec<PyRef<'_, Message>>,
        session: Option<&str>,
    ) -> PyResult<SessionReceipt> {
        let c = create_command(labels, metadata, &messages, session)?;
        let r = self.run(py, move |e| e.create_session(c))?;
        Ok(SessionReceipt::from(r))
    }

    /// `create_session`, queued now; await the returned future for its receipt.
    #[pyo3(signature = (*, labels = None, metadata = None, messages = Vec::new(), session = None))]
    fn create_session_async(
        &self,
        py: Python<'_>,
        labels: Option<StrMap>,
        metadata: Option<Vec<u8>>,
        messages: Vec<PyRef<'_, Message>>,
        session: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let c = create_command(labels, metadata, &messages, session)?;
        self.submit(py, Command::CreateSession(c), None, outcome_session)
    }

    /// Commits a turn: messages, usage, host state changes, applied context and tool
    /// operations, atomically. `turn_id` is the idempotency key: an exact retry returns
    /// the original receipt with `already_committed=True`.
    ///
    /// `expected`: `None` (any head), a revision id (`str`) or a stream seq (`int`).
    /// `state`: `{name: bytes}` sets an entry, `{name: None}` removes it.
    /// `usage`: `(provider, model, input, output[, cache_read, cache_write])` tuples.
    /// `finalizes`: the streamed draft this turn's final message ends; the commit removes
    /// it atomically. `inputs`: claimed inbox inputs this turn consumes (completed in its
    /// event). `fence`: a lease token; the turn is accepted only while it is the
    /// session's current one (else `errors.Fenced`, nothing written).
    #[pyo3(signature = (session, turn_id, messages = Vec::new(), *, expected = None, usage = Vec::new(), state = None, applied_context = Vec::new(), tool_ops = Vec::new(), run_id = None, finalizes = None, inputs = Vec::new(), fence = None))]
    #[allow(clippy::too_many_arguments)]
    fn commit_turn(
        &self,
        py: Python<'_>,
        session: &str,
        turn_id: String,
        messages: Vec<PyRef<'_, Message>>,
        expected: Option<Bound<'_, PyAny>>,
        usage: Vec<Bound<'_, PyAny>>,
        state: Option<Bound<'_, PyAny>>,
        applied_context: Vec<String>,
        tool_ops: Vec<String>,
        run_id: Option<String>,
        finalizes: Option<String>,
        inputs: Vec<String>,
        fence: Option<u64>,
    ) -> PyResult<TurnResult> {
        let c = turn_command(
            session,
            turn_id,
            &messages,
            expected.as_ref(),
            usage,
            state.as_ref(),
            applied_context,
            tool_ops,
            run_id,
            finalizes,
            inputs,
        )?;
        let fence = self::fence(c.session, fence);
        let outcome = self.run(py, move |e| fenced_run(e, fence, |e| e.commit_turn(c)))?;
        Ok(TurnResult::from(outcome))
    }

    /// `commit_turn`, queued now; await the returned future for its `TurnResult`.
    #[pyo3(signature = (session, turn_id, messages = Vec::new(), *, expected = None, usage = Vec::new(), state = None, applied_context = Vec::new(), tool_ops = Vec::new(), run_id = None, finalizes = None, inputs = Vec::new(), fence = None))]
    #[allow(clippy::too_many_arguments)]
    fn commit_turn_async(
        &self,
        py: Python<'_>,
        session: &str,
        turn_id: String,
        messages: Vec<PyRef<'_, Message>>,
        expected: Option<Bound<'_, PyAny>>,
        usage: Vec<Bound<'_, PyAny>>,
        state: Option<Bound<'_, PyAny>>,
        applied_context: Vec<String>,
        tool_ops: Vec<String>,
        run_id: Option<String>,
        finalizes: Option<String>,
        inputs: Vec<String>,
        fence: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        let c = turn_command(
            session,
            turn_id,
            &messages,
            expected.as_ref(),
            usage,
            state.as_ref(),
            applied_context,
            tool_ops,
            run_id,
            finalizes,
            inputs,
        )?;
        let fence = self::fence(c.session, fence);
        self.submit(py, Command::CommitTurn(c), fence, outcome_turn)
    }

    /// Replaces messages `start..end` of the head (computed against revision `expected`)
    /// with `replacement`. `reason`: `"edit"`, `"compaction"` or `"redaction"`.
    /// `fence`: a lease token the rewrite is fenced by (see `commit_turn`).
    #[pyo3(signature = (session, expected, start, end, replacement = Vec::new(), *, reason = "edit", note = String::new(), actor = String::new(), fence = None))]
    #[allow(clippy::too_many_arguments)]
    fn rewrite(
        &self,
        py: Python<'_>,
        session: &str,
        expected: &str,
        start: u64,
        end: u64,
        replacement: Vec<PyRef<'_, Message>>,
        reason: &str,
        note: String,
        actor: String,
        fence: Option<u64>,
    ) -> PyResult<Receipt> {
        let reason = match reason {
            "edit" => RewriteReason::Edit,
            "compaction" => RewriteReason::Compaction,
            "redaction" => RewriteReason::Redaction,
            other => return Err(PyValueError::new_err(format!("unknown reason {other:?}"))),
        };
        let c = Rewrite {
            session: session_id(session)?,
            expected: revision_id(expected)?,
            start,
            end,
            replacement: messages(&replacement)?,
            reason,
            note,
            actor,
        };
        let fence = self::fence(c.session, fence);
        Ok(Receipt::from(self.run(py, move |e| fenced_run(e, fence, |e| e.rewrite(c)))?))
    }

    /// Brings back a revision the session held before (decided against `expected`).
    /// `fence`: a lease token the restore is fenced by (see `commit_turn`).
    #[pyo3(signature = (session, expected, target, *, note = String::new(), actor = String::new(), fence = None))]
    #[allow(clippy::too_many_arguments)]
    fn restore(
        &self,
        py: Python<'_>,
        session: &str,
        expected: &str,
        target: &str,
        note: String,
        actor: String,
        fence: Option<u64>,
    ) -> PyResult<Receipt> {
        let c = Restore {
            session: session_id(session)?,
            expected: revision_id(expected)?,
            target: revision_id(target)?,
            note,
            actor,
        };
        let fence = self::fence(c.session, fence);
        Ok(Receipt::from(self.run(py, move |e| fenced_run(e, fence, |e| e.restore(c)))?))
    }

    /// Branches a new session from `parent`'s head, keeping its first `index` messages
    /// (all of them by default); with `replacement`, message `index` is replaced by it.
    /// `labels=None` keeps the parent's labels. No content is copied. `fence`: a lease
    /// token of the parent the fork is fenced by (see `commit_turn`).
    #[pyo3(signature = (parent, index = None, *, replacement = None, labels = None, session = None, fence = None))]
    #[allow(clippy::too_many_arguments)]
    fn fork(
        &self,
        py: Python<'_>,
        parent: &str,
        index: Option<u64>,
        replacement: Option<PyRef<'_, Message>>,
        labels: Option<StrMap>,
        session: Option<&str>,
        fence: Option<u64>,
    ) -> PyResult<SessionReceipt> {
        let parent = session_id(parent)?;
        let index = match index {
            Some(i) => i,
            None => self.run(py, move |e| e.head(parent))?.map(|h| h.message_count).unwrap_or(0),
        };
        let c = Fork {
            parent,
            session: match session {
                Some(s) => session_id(s)?,
                None => annal::new_session_id(),
            },
            index,
            replacement: replacement.map(|m| m.to_engine()).transpose()?,
            labels: labels.map(|l| l.0),
        };
        let fence = self::fence(parent, fence);
        Ok(SessionReceipt::from(self.run(py, move |e| fenced_run(e, fence, |e| e.fork(c)))?))
    }

    /// Archives a session (it leaves default listings and refuses writes until revived).
    /// Returns whether an event was written (`False` if it already was archived).
    /// `fence`: a lease token it is fenced by (see `commit_turn`).
    #[pyo3(signature = (session, reason = String::new(), *, fence = None))]
    fn archive(&self, py: Python<'_>, session: &str, reason: String, fence: Option<u64>) -> PyResult<bool> {
        let s = session_id(session)?;
        let fence = self::fence(s, fence);
        self.run(py, move |e| fenced_run(e, fence, |e| e.archive(s, reason)))
    }

    /// Revives an archived session; returns the event's seq. `fence`: a lease token it is
    /// fenced by (see `commit_turn`).
    #[pyo3(signature = (session, reason = String::new(), *, fence = None))]
    fn revive(&self, py: Python<'_>, session: &str, reason: String, fence: Option<u64>) -> PyResult<u64> {
        let s = session_id(session)?;
        let fence = self::fence(s, fence);
        self.run(py, move |e| fenced_run(e, fence, |e| e.revive(s, reason)))
    }

    /// Stages system context under `key` for a later turn (`applied_context=[key]`).
    /// Returns the event's seq, or `None` for an exact duplicate. `fence`: a lease token
    /// it is fenced by (see `commit_turn`).
    #[pyo3(signature = (session, key, content, *, source = String::new(), fence = None))]
    fn append_context(
        &self,
        py: Python<'_>,
        session: &str,
        key: String,
        content: &Bound<'_, PyAny>,
        source: String,
        fence: Option<u64>,
    ) -> PyResult<Option<u64>> {
        let c = AppendContext { session: session_id(session)?, key, content: bytes_arg(content, "content")?, source };
        let fence = self::fence(c.session, fence);
        let outcome = self.run(py, move |e| fenced_run(e, fence, |e| e.append_context(c)))?;
        Ok(match outcome {
            annal::ContextOutcome::Staged(seq) => Some(seq),
            annal::ContextOutcome::Duplicate => None,
        })
    }

    /// Records a tool call before it is dispatched. `call_id` is the model's id of the
    /// call (required, not empty). Returns whether an event was written (`False` for an
    /// exact retry). `fence`: a lease token it is fenced by (see `commit_turn`).
    #[pyo3(signature = (session, op_id, tool_name, args, *, call_id, parent_op = None, turn_id = None, replay_safe = false, fence = None))]
    #[allow(clippy::too_many_arguments)]
    fn record_tool_call(
        &self,
        py: Python<'_>,
        session: &str,
        op_id: String,
        tool_name: String,
        args: &Bound<'_, PyAny>,
        call_id: String,
        parent_op: Option<String>,
        turn_id: Option<String>,
        replay_safe: bool,
        fence: Option<u64>,
    ) -> PyResult<bool> {
        let c = RecordToolCall {
            session: session_id(session)?,
            op_id,
            call_id,
            tool_name,
            args: bytes_arg(args, "args")?,
            parent_op,
            turn_id,
            recovery: if replay_safe { Recovery::ReplaySafe } else { Recovery::NotReplaySafe },
        };
        let fence = self::fence(c.session, fence);
        Ok(self.run(py, move |e| fenced_run(e, fence, |e| e.record_tool_call(c)))?.created)
    }

    /// Records a tool call's result. `outcome`: `"ok"`, `"error"` or `"cancelled"`.
    /// `fence`: a lease token it is fenced by (see `commit_turn`).
    #[pyo3(signature = (session, op_id, result, *, outcome = "ok", fence = None))]
    fn record_tool_result(
        &self,
        py: Python<'_>,
        session: &str,
        op_id: String,
        result: &Bound<'_, PyAny>,
        outcome: &str,
        fence: Option<u64>,
    ) -> PyResult<bool> {
        let outcome = match outcome {
            "ok" => ToolOutcome::Ok,
            "error" => ToolOutcome::Error,
            "cancelled" => ToolOutcome::Cancelled,
            other => return Err(PyValueError::new_err(format!("unknown outcome {other:?}"))),
        };
        let c =
            RecordToolResult { session: session_id(session)?, op_id, outcome, result: bytes_arg(result, "result")? };
        let fence = self::fence(c.session, fence);
        Ok(self.run(py, move |e| fenced_run(e, fence, |e| e.record_tool_result(c)))?.created)
    }

    /// Sets (`set`, a mapping) and removes (`remove`, a list, tuple or set of names)
    /// labels. Returns the event's seq, or `None` if nothing changed. `fence`: a lease
    /// token it is fenced by (see `commit_turn`).
    #[pyo3(signature = (session, set = StrMap::default(), remove = StrSet::default(), *, fence = None))]
    fn set_labels(
        &self,
        py: Python<'_>,
        session: &str,
        set: StrMap,
        remove: StrSet,
        fence: Option<u64>,
    ) -> PyResult<Option<u64>> {
        let s = session_id(session)?;
        let c = SetLabels { session: s, set: set.0, remove: remove.0 };
        let fence = self::fence(s, fence);
        self.run(py, move |e| fenced_run(e, fence, |e| e.set_labels(c)))
    }

    /// Replaces the session's metadata blob. `fence`: a lease token it is fenced by (see
    /// `commit_turn`).
    #[pyo3(signature = (session, metadata, *, expected = None, fence = None))]
    fn set_metadata(
        &self,
        py: Python<'_>,
        session: &str,
        metadata: Vec<u8>,
        expected: Option<Bound<'_, PyAny>>,
        fence: Option<u64>,
    ) -> PyResult<Option<u64>> {
        let s = session_id(session)?;
        let c = SetMetadata { session: s, metadata, expected: self::expected(expected.as_ref())? };
        let fence = self::fence(s, fence);
        self.run(py, move |e| fenced_run(e, fence, |e| e.set_metadata(c)))
    }

    /// Sets (`{name: bytes}`) and removes (`{name: None}`) host state entries. `fence`: a
    /// lease token it is fenced by (see `commit_turn`).
    #[pyo3(signature = (session, state, *, expected = None, fence = None))]
    fn set_host_state(
        &self,
        py: Python<'_>,
        session: &str,
        state: Bound<'_, PyAny>,
        expected: Option<Bound<'_, PyAny>>,
        fence: Option<u64>,
    ) -> PyResult<Option<u64>> {
        let c = SetHostState {
            session: session_id(session)?,
            state: state_changes(Some(&state))?,
            expected: self::expected(expected.as_ref())?,
        };
        let fence = self::fence(c.session, fence);
        self.run(py, move |e| fenced_run(e, fence, |e| e.set_host_state(c)))
    }

    // ----- execution leases -----

    /// Takes the execution lease of `session` for `owner`, for `ttl_ms` (writer clock;
    /// 1 ms to one day). Granted with a token one larger than any the session had when
    /// nobody holds a live lease; `errors.Busy` (with `holder`, `expires_at_ms`) while
    /// another owner does. The holder asking again renews and keeps its token. Pass the
    /// lease's `token` as `fence=` to the commands made under it.
    fn acquire_lease(&self, py: Python<'_>, session: &str, owner: String, ttl_ms: u64) -> PyResult<Lease> {
        let s = session_id(session)?;
        let ttl = Duration::from_millis(ttl_ms);
        Ok(Lease::from(self.run(py, move |e| e.acquire_lease(s, owner, ttl))?))
    }

    /// Renews a held lease for `ttl_ms` from now (kept in memory: no write). A token that
    /// is no longer the session's current one, or a released lease, is `errors.Fenced`.
    fn renew_lease(&self, py: Python<'_>, lease: PyRef<'_, Lease>, ttl_ms: u64) -> PyResult<Lease> {
        let l = lease_ref(&lease)?;
        let ttl = Duration::from_millis(ttl_ms);
        Ok(Lease::from(self.run(py, move |e| e.renew_lease(&l, ttl))?))
    }

    /// Releases a held lease, so another owner may take it at once. Returns `False` if
    /// it was released already; a stale token is `errors.Fenced`.
    fn release_lease(&self, py: Python<'_>, lease: PyRef<'_, Lease>) -> PyResult<bool> {
        let l = lease_ref(&lease)?;
        self.run(py, move |e| e.release_lease(&l))
    }

    /// The session's lease (its current token, holder and expiry, renewals included, and
    /// whether it was released), or `None` if no lease was ever granted. A missing session
    /// is `errors.NotFound`.
    fn lease(&self, py: Python<'_>, session: &str) -> PyResult<Option<LeaseState>> {
        let s = session_id(session)?;
        // `lease` answers `None` both for a session with no lease and for a missing one:
        // only then is the head read to tell them apart.
        let found = self.run(py, move |e| match e.lease(s)? {
            None if e.head(s)?.is_none() => Err(annal::Error::Rejected(annal::Rejection::NotFound { session: s })),
            found => Ok(found),
        })?;
        Ok(found.map(|l| LeaseState::of(s, l)))
    }

    // ----- streamed drafts -----

    /// Appends `segment` to draft `draft_id` of `session` (creating the draft); returns
    /// the segment's index. Readers see it at once; it reaches the file with the next
    /// commit or within the draft flush interval. The turn that carries the final
    /// message names the draft (`commit_turn(..., finalizes=draft_id)`).
    #[pyo3(signature = (session, draft_id, segment, *, fence = None))]
    fn append_draft(
        &self,
        py: Python<'_>,
        session: &str,
        draft_id: String,
        segment: &Bound<'_, PyAny>,
        fence: Option<u64>,
    ) -> PyResult<u32> {
        let s = session_id(session)?;
        let segment = bytes_arg(segment, "segment")?;
        let fence = self::fence(s, fence);
        self.run(py, move |e| fenced_run(e, fence, |e| e.append_draft(s, draft_id, segment)))
    }

    /// Discards a draft and its segments (written at once). Returns `False` if there was
    /// none.
    #[pyo3(signature = (session, draft_id, *, fence = None))]
    fn discard_draft(&self, py: Python<'_>, session: &str, draft_id: String, fence: Option<u64>) -> PyResult<bool> {
        let s = session_id(session)?;
        let fence = self::fence(s, fence);
        self.run(py, move |e| fenced_run(e, fence, |e| e.discard_draft(s, draft_id)))
    }

    /// The drafts of `session`, in draft id order, each with its segments as far as
    /// `max_bytes` of segments allows (`Draft.complete` says whether all are there; read
    /// the rest with `draft`).
    #[pyo3(signature = (session, *, max_bytes = 64 << 20))]
    fn drafts(&self, py: Python<'_>, session: &str, max_bytes: u64) -> PyResult<Vec<Draft>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| Ok(e.drafts(s, max_bytes)))?.into_iter().map(Draft::from).collect())
    }

    /// One draft, from segment `from_segment`, as far as `max_bytes` allows; `None` if
    /// there is no such draft.
    #[pyo3(signature = (session, draft_id, from_segment = 0, *, max_bytes = 64 << 20))]
    fn draft(
        &self,
        py: Python<'_>,
        session: &str,
        draft_id: String,
        from_segment: u32,
        max_bytes: u64,
    ) -> PyResult<Option<Draft>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| Ok(e.draft(s, &draft_id, from_segment, max_bytes)))?.map(Draft::from))
    }

    /// The drafts the file held when the database opened: partial output of turns that
    /// never committed. Resume them (append, then commit the turn that finalizes them)
    /// or discard them; nothing removes them by itself.
    fn abandoned_drafts(&self, py: Python<'_>) -> PyResult<Vec<DraftSummary>> {
        Ok(self.run(py, |e| Ok(e.abandoned_drafts().to_vec()))?.into_iter().map(DraftSummary::from).collect())
    }

    /// Writes every draft change still in memory to disk now (durably, unless the
    /// database was opened with `durable=False`).
    fn flush_drafts(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |e| e.flush_drafts())
    }

    // ----- the input inbox -----

    /// Queues `message` in `session`'s inbox as input `input_id`, for the live turn
    /// (`kind="active_turn"`) or the next one (`kind="next_turn"`). Returns the event's
    /// seq, or `None` for an exact retry (the same id with another message or kind is
    /// `errors.InputConflict`).
    #[pyo3(signature = (session, input_id, message, *, kind = "next_turn"))]
    fn enqueue_input(
        &self,
        py: Python<'_>,
        session: &str,
        input_id: String,
        message: PyRef<'_, Message>,
        kind: &str,
    ) -> PyResult<Option<u64>> {
        let s = session_id(session)?;
        let kind = parse_input_kind(kind)?;
        let m = message.to_engine()?;
        self.run(py, move |e| e.enqueue_input(s, input_id, m, kind))
    }

    /// The inputs a claim may take now: queued, and held by no live claim, in queue
    /// order.
    fn pending_inputs(&self, py: Python<'_>, session: &str) -> PyResult<Vec<QueuedInput>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| e.pending_inputs(s))?.into_iter().map(QueuedInput::from).collect())
    }

    /// The open inputs of `session`'s inbox (neither consumed nor cancelled), in queue
    /// order, pending or claimed (a claim may have expired).
    fn inbox(&self, py: Python<'_>, session: &str) -> PyResult<Vec<QueuedInput>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| e.inbox(s))?.into_iter().map(QueuedInput::from).collect())
    }

    /// An input of `session`, whatever its state (completed and cancelled ones too), or
    /// `None`.
    fn input(&self, py: Python<'_>, session: &str, input_id: String) -> PyResult<Option<InputRow>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| e.input(s, &input_id))?.map(InputRow::from))
    }

    /// A claim of `session` by its number (`Claim.claim`), or `None`.
    fn claim(&self, py: Python<'_>, session: &str, claim: u64) -> PyResult<Option<ClaimRow>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| e.claim(s, claim))?.map(ClaimRow::from))
    }

    /// Claims up to `max` inputs for `owner` for `ttl_ms`, fenced by `token`, the
    /// session's current lease token (`errors.Fenced` otherwise). `target="next_turn"`
    /// takes next-turn inputs while the session is idle (`errors.NotIdle` otherwise);
    /// `target="active_turn"` with `turn_id` takes active-turn inputs for that live turn
    /// (`errors.TurnNotLive` if it is committed). Claiming nothing writes nothing
    /// (`Claim.claim` is `None`). Commit the turn with `inputs=` to consume them.
    #[pyo3(signature = (session, *, token, owner, target = "next_turn", turn_id = None, ttl_ms = 60_000, max = 64))]
    #[allow(clippy::too_many_arguments)]
    fn claim_inputs(
        &self,
        py: Python<'_>,
        session: &str,
        token: u64,
        owner: String,
        target: &str,
        turn_id: Option<String>,
        ttl_ms: u64,
        max: u64,
    ) -> PyResult<Claim> {
        let c = ClaimInputs {
            session: session_id(session)?,
            token,
            owner,
            target: parse_claim_target(target, turn_id)?,
            ttl_ms,
            max,
        };
        Ok(Claim::from(self.run(py, move |e| e.claim_inputs(c))?))
    }

    /// Gives claim `claim` up: its inputs no turn consumed are queued again. Returns
    /// `False` if it was closed already; an unknown claim is `errors.UnknownClaim`.
    #[pyo3(signature = (session, claim, *, fence = None))]
    fn abandon_claim(&self, py: Python<'_>, session: &str, claim: u64, fence: Option<u64>) -> PyResult<bool> {
        let s = session_id(session)?;
        let fence = self::fence(s, fence);
        self.run(py, move |e| fenced_run(e, fence, |e| e.abandon_claim(s, claim)))
    }

    /// Withdraws an input no live claim holds. Returns `False` if it was cancelled
    /// already; a consumed or live-claimed input is `errors.InputState`.
    fn cancel_input(&self, py: Python<'_>, session: &str, input_id: String) -> PyResult<bool> {
        let s = session_id(session)?;
        self.run(py, move |e| e.cancel_input(s, input_id))
    }

    // ----- queries -----

    /// The head of a session, or `None`.
    fn head(&self, py: Python<'_>, session: &str) -> PyResult<Option<Head>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| e.head(s))?.map(Head::from))
    }

    /// Lists sessions: every label in `labels` must match. `recent=True` orders by last
    /// update (newest first) instead of creation. `limit=0` (the default) returns as many
    /// as a page may hold (the engine's page item limit, 10 000 by default); a larger
    /// `limit` is `errors.LimitExceeded`.
    #[pyo3(signature = (*, labels = StrMap::default(), include_archived = false, offset = 0, limit = 0, recent = false))]
    fn list_sessions(
        &self,
        py: Python<'_>,
        labels: StrMap,
        include_archived: bool,
        offset: u64,
        limit: u64,
        recent: bool,
    ) -> PyResult<SessionPage> {
        let mut q = ListQuery::new().page(offset, limit);
        for (k, v) in labels.0 {
            q = q.label(k, v);
        }
        if include_archived {
            q = q.include_archived();
        }
        if recent {
            q = q.recently_updated();
        }
        let page = self.run(py, move |e| e.list_sessions(&q))?;
        Ok(SessionPage {
            items: page.items.into_iter().map(Head::from).collect(),
            offset: page.offset,
            limit: page.limit,
            has_more: page.has_more,
        })
    }

    /// A page of the transcript at the head, or at `revision`. `limit=0` returns no
    /// messages (the page still reports `total` and `has_more`).
    #[pyo3(signature = (session, offset = 0, limit = 100, *, revision = None))]
    fn transcript(
        &self,
        py: Python<'_>,
        session: &str,
        offset: u64,
        limit: u64,
        revision: Option<&str>,
    ) -> PyResult<TranscriptPage> {
        let s = session_id(session)?;
        let page = PageRequest::new(offset, limit);
        let revision = revision.map(revision_id).transpose()?;
        let t = self.run(py, move |e| match revision {
            Some(r) => e.transcript_at(s, r, page),
            None => e.transcript(s, page),
        })?;
        Ok(TranscriptPage::from(t))
    }

    /// The revisions a session has held, oldest first: the nodes of one page only
    /// (`revision_page` also reports the head, the total and `has_more`). `limit=0`
    /// returns no revisions.
    #[pyo3(signature = (session, offset = 0, limit = 100))]
    fn revisions(&self, py: Python<'_>, session: &str, offset: u64, limit: u64) -> PyResult<Vec<RevisionNode>> {
        Ok(self.revision_page(py, session, offset, limit)?.items.into_items())
    }

    /// A page of the revisions a session has held, oldest first, with the session's
    /// current head, the number of revisions and whether more follow. `limit=0` returns
    /// no revisions (the page still reports the head, `total` and `has_more`).
    #[pyo3(signature = (session, offset = 0, limit = 100))]
    fn revision_page(&self, py: Python<'_>, session: &str, offset: u64, limit: u64) -> PyResult<RevisionPage> {
        let s = session_id(session)?;
        Ok(RevisionPage::from(self.run(py, move |e| e.revisions(s, PageRequest::new(offset, limit)))?))
    }

    /// Every context entry of a session (`pending=True`: only those not applied yet).
    #[pyo3(signature = (session, *, pending = false))]
    fn context(&self, py: Python<'_>, session: &str, pending: bool) -> PyResult<Vec<ContextEntry>> {
        let s = session_id(session)?;
        let entries = self.run(py, move |e| if pending { e.pending_context(s) } else { e.context(s) })?;
        Ok(entries.into_iter().map(ContextEntry::from).collect())
    }

    /// Token usage totals by provider and model.
    fn usage(&self, py: Python<'_>, session: &str) -> PyResult<Vec<UsageTotals>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| e.usage(s))?.into_iter().map(UsageTotals::from).collect())
    }

    /// One tool operation, or `None`.
    fn tool_op(&self, py: Python<'_>, session: &str, op_id: String) -> PyResult<Option<ToolOp>> {
        let s = session_id(session)?;
        Ok(self.run(py, move |e| e.tool_op(s, &op_id))?.map(ToolOp::from))
    }

    /// A session's tool operations in call order, `limit` of them (100 if `None`) from
    /// `offset`. `unsettled=True`: only those without a result, the ones a restarted host
    /// must resolve, from `offset`, and all of them unless `limit` is given.
    #[pyo3(signature = (session, *, unsettled = false, offset = 0, limit = None))]
    fn tool_ops(
        &self,
        py: Python<'_>,
        session: &str,
        unsettled: bool,
        offset: u64,
        limit: Option<u64>,
    ) -> PyResult<Vec<ToolOp>> {
        let s = session_id(session)?;
        let ops = self.run(py, move |e| {
            if unsettled {
                match limit {
                    Some(limit) => e.unsettled_page(s, PageRequest::new(offset, limit)).map(|p| p.items),
                    None => {
                        let ops = e.unsettled(s)?.into_iter();
                        Ok(ops.skip(usize::try_from(offset).unwrap_or(usize::MAX)).collect())
                    }
                }
            } else {
                e.tool_ops(s, PageRequest::new(offset, limit.unwrap_or(100))).map(|p| p.items)
            }
        })?;
        Ok(ops.into_iter().map(ToolOp::from).collect())
    }

    /// A host state entry at the head, or as of stream seq `at`.
    #[pyo3(signature = (session, name, *, at = None))]
    fn host_state<'py>(
        &self,
        py: Python<'py>,
        session: &str,
        name: String,
        at: Option<u64>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let s = session_id(session)?;
        let value = self.run(py, move |e| match at {
            Some(n) => e.host_state_at(s, &name, n),
            None => e.host_state(s, &name),
        })?;
        Ok(value.map(|v| PyBytes::new(py, &v)))
    }

    /// A content object (message object, attachment, context text, tool arguments or
    /// result) by its id, verified against it; `None` if the database has none.
    fn content<'py>(&self, py: Python<'py>, content_id: &str) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let id: annal::ContentId = content_id.parse().map_err(|e| PyValueError::new_err(format!("{e}")))?;
        let value = self.run(py, move |e| e.content(id))?;
        Ok(value.map(|v| PyBytes::new(py, &v)))
    }

    /// Several content objects in one call (the GIL released once): `None` for any
    /// missing. Content never changes under its id, so the objects agree whichever
    /// commits land meanwhile.
    fn contents<'py>(&self, py: Python<'py>, content_ids: Vec<String>) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
        let ids = content_ids
            .iter()
            .map(|c| c.parse::<annal::ContentId>().map_err(|e| PyValueError::new_err(format!("{e}"))))
            .collect::<PyResult<Vec<_>>>()?;
        let values = self.run(py, move |e| ids.iter().map(|id| e.content(*id)).collect::<annal::Result<Vec<_>>>())?;
        Ok(values.into_iter().map(|v| v.map(|v| PyBytes::new(py, &v))).collect())
    }

    /// Events of the log from `from_seq` (1-based), or of one session's stream.
    #[pyo3(signature = (from_seq = 1, max_events = 1000, *, session = None))]
    fn events(&self, py: Python<'_>, from_seq: u64, max_events: u64, session: Option<&str>) -> PyResult<EventPage> {
        let s = session.map(session_id).transpose()?;
        let q = EventQuery { from_seq, max_events, max_bytes: 64 << 20 };
        let page = self.run(py, move |e| match s {
            Some(s) => e.session_events(s, q),
            None => e.events(q),
        })?;
        Ok(EventPage::from(page))
    }

    /// The log's last seq and its chain hash.
    fn tip(&self, py: Python<'_>) -> PyResult<(u64, String)> {
        let (seq, hash) = self.run(py, |e| e.tip())?;
        Ok((seq, hash.to_hex()))
    }

    /// A subscription to commit notices, from now on.
    fn subscribe(&self, py: Python<'_>) -> PyResult<Subscription> {
        Ok(Subscription { rx: self.run(py, |e| Ok(e.subscribe()))? })
    }

    /// Counters of the engine's durable work since it opened: `log_commits` (group
    /// commits: one journal frame and one fsync each), `events`, `appended_bytes`,
    /// `journal_bytes`, `absorptions` (moves of the journal into the log file),
    /// `checkpoints`, `checkpoint_rows`, `backpressure_waits`, `caller_commits` (group
    /// commits a lone caller ran on its own thread), `delta_bytes`, `content_filter_bytes`
    /// (the memory of the filter that finds new content objects without reading the
    /// content-id index; 0 while it is being built).
    fn stats(&self, py: Python<'_>) -> PyResult<BTreeMap<&'static str, u64>> {
        let s = self.run(py, |e| Ok(e.stats()))?;
        Ok(BTreeMap::from([
            ("log_commits", s.log_commits),
            ("journal_bytes", s.journal_bytes),
            ("absorptions", s.absorptions),
            ("events", s.events),
            ("appended_bytes", s.appended_bytes),
            ("checkpoints", s.checkpoints),
            ("checkpoint_rows", s.checkpoint_rows),
            ("backpressure_waits", s.backpressure_waits),
            ("caller_commits", s.caller_commits),
            ("delta_bytes", s.delta_bytes),
            ("content_filter_bytes", s.content_filter_bytes),
        ]))
    }

    /// Erases a session for good (and, with `descendants=True`, its fork descendants):
    /// every byte the host supplied for it, while the log's chain still verifies. Queries
    /// on it then raise `errors.Purged`. Content other sessions reach stays.
    ///
    /// A purge rewrites the files, so it needs them to itself: the request is decided on
    /// the open database (a rejection such as `NotFound`, `Purged` or `HasForks` leaves it
    /// untouched); then the database is closed, purged and opened again with the same
    /// options. Calls from other threads wait meanwhile; subscriptions end (open new
    /// ones). `reason` and `actor` are kept in the tombstone.
    #[pyo3(signature = (session, *, reason, actor, descendants = false))]
    fn purge(
        &self,
        py: Python<'_>,
        session: &str,
        reason: String,
        actor: String,
        descendants: bool,
    ) -> PyResult<ErasureReport> {
        let request = annal::PurgeRequest { session: session_id(session)?, reason, actor, descendants };
        let report = exit::detached(py, || {
            let mut guard = self.engine.write().map_err(|_| annal::Error::Closed)?;
            let engine = guard.take().ok_or(annal::Error::Closed)?;
            // An outer error left no engine: the database stays closed.
            let (engine, answer) = engine.purge(&request)?;
            *guard = Some(engine);
            answer
        });
        report.map(ErasureReport::from).map_err(|e| to_py(py, e))
    }

    /// Removes content objects that nothing live reaches any more, online, in batches
    /// of `rows_per_batch` content rows between commits. Returns its counters
    /// (`objects_removed`, `bytes_removed`, ...).
    #[pyo3(signature = (rows_per_batch = 256))]
    fn collect_garbage(&self, py: Python<'_>, rows_per_batch: usize) -> PyResult<BTreeMap<&'static str, u64>> {
        let r = self.run(py, move |e| e.collect_garbage(rows_per_batch))?;
        Ok(BTreeMap::from([
            ("through_seq", r.through_seq),
            ("reachable", r.reachable),
            ("rows_swept", r.rows_swept),
            ("rows_rewritten", r.rows_rewritten),
            ("objects_removed", r.objects_removed),
            ("bytes_removed", r.bytes_removed),
            ("batches", r.batches),
        ]))
    }

    /// Writes the projections up to the last commit (normally done in the background).
    fn checkpoint(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |e| e.checkpoint())
    }

    fn __repr__(&self) -> String {
        format!("Database({:?})", self.path)
    }
}

fn create_command(
    labels: Option<StrMap>,
    metadata: Option<Vec<u8>>,
    messages: &[PyRef<'_, Message>],
    session: Option<&str>,
) -> PyResult<CreateSession> {
    let mut c = match session {
        Some(s) => CreateSession::with_id(session_id(s)?),
        None => CreateSession::new(),
    };
    c.labels = labels.unwrap_or_default().0;
    c.metadata = metadata.unwrap_or_default();
    c.messages = self::messages(messages)?;
    Ok(c)
}

#[allow(clippy::too_many_arguments)]
fn turn_command(
    session: &str,
    turn_id: String,
    messages: &[PyRef<'_, Message>],
    expected: Option<&Bound<'_, PyAny>>,
    usage: Vec<Bound<'_, PyAny>>,
    state: Option<&Bound<'_, PyAny>>,
    applied_context: Vec<String>,
    tool_ops: Vec<String>,
    run_id: Option<String>,
    finalizes: Option<String>,
    inputs: Vec<String>,
) -> PyResult<CommitTurn> {
    let mut c = CommitTurn::new(session_id(session)?, turn_id, self::expected(expected)?);
    c.messages = self::messages(messages)?;
    c.usage = self::usage(usage)?;
    c.state = state_changes(state)?;
    c.applied_context = applied_context;
    c.tool_ops = tool_ops;
    c.run_id = run_id;
    c.draft = finalizes;
    c.inputs = inputs;
    Ok(c)
}

fn outcome_turn(py: Python<'_>, outcome: Outcome) -> PyResult<Py<PyAny>> {
    let result = match outcome {
        Outcome::Committed(r) => TurnResult::from(annal::TurnOutcome::Committed(r)),
        Outcome::AlreadyCommitted(r) => TurnResult::from(annal::TurnOutcome::AlreadyCommitted(r)),
        other => return Err(PyValueError::new_err(format!("unexpected outcome {other:?}"))),
    };
    Ok(Py::new(py, result)?.into_any())
}

fn outcome_session(py: Python<'_>, outcome: Outcome) -> PyResult<Py<PyAny>> {
    match outcome {
        Outcome::Created { session, receipt } => {
            Ok(Py::new(py, SessionReceipt::from(annal::SessionReceipt { session, receipt }))?.into_any())
        }
        other => Err(PyValueError::new_err(format!("unexpected outcome {other:?}"))),
    }
}

/// What a purge erased.
#[pyclass(module = "annal", frozen, get_all)]
#[derive(Clone)]
pub struct ErasureReport {
    /// Each session purged and the seq of its tombstone, in log order.
    pub purged: Vec<(String, u64)>,
    /// Records replaced by their erased form.
    pub records_erased: u64,
    /// Records whose payload was resealed.
    pub records_resealed: u64,
    /// Content objects erased.
    pub objects_erased: u64,
    /// Bytes of content erased.
    pub content_bytes_erased: u64,
    /// Drafts erased.
    pub drafts_erased: u64,
    /// Size of both files before.
    pub bytes_before: u64,
    /// Size of both files after.
    pub bytes_after: u64,
}

impl From<annal::ErasureReport> for ErasureReport {
    fn from(r: annal::ErasureReport) -> ErasureReport {
        ErasureReport {
            purged: r.purged.into_iter().map(|(s, seq)| (s.to_string(), seq)).collect(),
            records_erased: r.records_erased,
            records_resealed: r.records_resealed,
            objects_erased: r.objects_erased,
            content_bytes_erased: r.content_bytes_erased,
            drafts_erased: r.drafts_erased,
            bytes_before: r.bytes_before,
            bytes_after: r.bytes_after,
        }
    }
}

#[pymethods]
impl ErasureReport {
    fn __repr__(&self) -> String {
        format!("ErasureReport(purged={:?}, objects_erased={})", self.purged, self.objects_erased)
    }
}

/// How long a subscription's wait runs between two checks for signals (a Ctrl-C).
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// Commit notices from `Database.subscribe()`: iterate, or `recv(timeout)`.
#[pyclass(module = "annal", frozen)]
pub struct Subscription {
    rx: crossbeam_channel::Receiver<annal::CommitNotice>,
}

#[pymethods]
impl Subscription {
    /// The next notice; waits up to `timeout` seconds (forever if `None`, or if it is too
    /// long to represent, such as `float("inf")`; a negative or NaN timeout does not
    /// wait). Returns `None` on timeout or once the database is closed. The wait takes
    /// signals between slices of [`SIGNAL_SLICE`]: Ctrl-C raises `KeyboardInterrupt`.
    #[pyo3(signature = (timeout = None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<CommitNotice>> {
        // `max` turns NaN and negative timeouts into 0; a deadline too far to represent
        // is none.
        let deadline = match timeout.map(|t| Duration::try_from_secs_f64(t.max(0.0)).ok()) {
            Some(Some(t)) => std::time::Instant::now().checked_add(t),
            Some(None) | None => None,
        };
        loop {
            let slice = deadline
                .map_or(SIGNAL_SLICE, |d| d.saturating_duration_since(std::time::Instant::now()).min(SIGNAL_SLICE));
            let rx = self.rx.clone();
            match exit::detached(py, move || rx.recv_timeout(slice)) {
                Ok(notice) => return Ok(Some(CommitNotice::from(notice))),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(None),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<CommitNotice>> {
        self.recv(py, None)
    }
}

/// The content id of `data` (blake3, hex): equal bytes have equal ids, and an attachment
/// or other content object is stored once per id.
#[pyfunction]
fn content_id(data: &[u8]) -> String {
    annal::codec::content_id(data).to_hex()
}

/// Compacts a closed database (the log file and its projections file): redb gives the
/// free space back. Returns `(bytes_before, bytes_after)` of both files together. No
/// `Database` (and no other process) may have it open. With `compression` (`"lz4"`,
/// `"zstd"` or `"off"`), every content object is first stored the way that compression
/// stores new ones (ids, records and queries do not change). A missing `path` is
/// `FileNotFoundError` (nothing is created).
#[pyfunction]
#[pyo3(signature = (path, *, compression = None))]
fn compact(py: Python<'_>, path: std::path::PathBuf, compression: Option<String>) -> PyResult<(u64, u64)> {
    if let Err(e) = std::fs::metadata(&path) {
        return Err(match e.kind() {
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err((
                e.raw_os_error().unwrap_or(2),
                "No such file or directory",
                path.to_string_lossy().into_owned(),
            )),
            _ => e.into(),
        });
    }
    let stats = match compression {
        None => exit::detached(py, move || annal::compact(&path, Options::default())).map_err(|e| to_py(py, e))?,
        Some(name) => {
            let compression = match name.as_str() {
                "lz4" | "zstd" | "off" => Compress::Codec(name).compression()?,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "compression must be \"lz4\", \"zstd\" or \"off\", not {other:?}"
                    )))
                }
            };
            exit::detached(py, move || annal::recompress(&path, compression, Options::default(), &mut |_, _| {}))
                .map_err(|e| to_py(py, e))?
                .compact
        }
    };
    Ok((stats.bytes_before, stats.bytes_after))
}

/// A fresh session id (UUIDv7: ids sort by creation time).
#[pyfunction]
fn new_session_id() -> String {
    annal::new_session_id().to_string()
}

#[pymodule]
fn _annal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Database>()?;
    m.add_class::<Message>()?;
    m.add_class::<Subscription>()?;
    m.add_class::<ErasureReport>()?;
    convert::register(m)?;
    m.add_function(wrap_pyfunction!(content_id, m)?)?;
    m.add_function(wrap_pyfunction!(new_session_id, m)?)?;
    m.add_function(wrap_pyfunction!(compact, m)?)?;
    // The limits every database opened from Python has (annal's defaults), by name.
    let limits = pyo3::types::PyDict::new(m.py());
    let defaults = annal::Limits::default();
    for limit in annal::Limit::ALL {
        limits.set_item(limit.to_string(), defaults.max(limit))?;
    }
    m.add("LIMITS", limits)?;
    let exiting = wrap_pyfunction!(exit::interpreter_exiting, m)?;
    m.py().import("atexit")?.call_method1("register", (exiting,))?;
    Ok(())
}
