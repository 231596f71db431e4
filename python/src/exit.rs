//! The interpreter's exit, and the threads that take the GIL back around it.
//!
//! Once CPython starts to finalize, a thread other than the one finalizing that asks for
//! the GIL is ended with `pthread_exit`. Unwinding that way through this module's Rust
//! frames aborts the process ("FATAL: exception not rethrown"). Two kinds of thread ask
//! for the GIL from Rust: a Python thread coming back from an engine call it made
//! without the GIL (a daemon thread still committing when the program ends), and the
//! completion thread that resolves the async methods' futures, whose Python calls may let
//! go of the GIL and take it back (`call_soon_threadsafe` writes to a socket).
//!
//! So every such region is counted ([`enter`], closed when its [`Region`] drops), and an `atexit` hook
//! ([`interpreter_exiting`]) marks the exit and waits, without the GIL, until no region is
//! open. A region entered after the mark is refused: the completion thread drops its
//! answers (no future can be awaited any more), and a thread back from an engine call
//! waits for the process to end instead of taking the GIL ([`detached`]), as CPython 3.14
//! itself does with such threads. The finalizing thread, which may still run Python code
//! that calls the engine, is never refused.

use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;
use std::thread::ThreadId;
use std::time::Duration;

/// Set by the `atexit` hook: the interpreter is about to finalize.
static EXITING: AtomicBool = AtomicBool::new(false);

/// The thread that ran the hook, which goes on to finalize the interpreter.
static EXITING_THREAD: OnceLock<ThreadId> = OnceLock::new();

/// Regions open now: threads that are taking the GIL, or holding it across Python calls
/// that may let it go, from Rust.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// True once the `atexit` hook has run.
pub(crate) fn exiting() -> bool {
    EXITING.load(SeqCst)
}

/// An open region: closed when dropped.
pub(crate) struct Region(());

impl Drop for Region {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, SeqCst);
    }
}

/// Opens a region that takes the GIL (or holds it across Python calls that may let it
/// go), until the returned [`Region`] drops; `None`, with nothing opened, once the
/// interpreter exits, unless this is the thread that finalizes it.
pub(crate) fn enter() -> Option<Region> {
    // Counted first, then the mark read (the hook marks, then reads the count): one of
    // the two sees the other.
    OPEN.fetch_add(1, SeqCst);
    let region = Region(());
    if EXITING.load(SeqCst) && EXITING_THREAD.get() != Some(&std::thread::current().id()) {
        return None;
    }
    Some(region)
}

/// Runs `f` without the GIL (`Python::detach`) and takes the GIL back after it, unless
/// the interpreter began to exit meanwhile: then this thread waits for the process to
/// end, since CPython would end it in a way that aborts the process.
pub(crate) fn detached<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    // The region opens before the GIL is taken back and closes once it is held.
    let (out, _region) = py.detach(move || {
        let out = f();
        let Some(region) = enter() else {
            loop {
                std::thread::park();
            }
        };
        (out, region)
    });
    out
}

/// Marks the interpreter as exiting (registered with `atexit`), then waits until no
/// region is open. It waits without the GIL, which an open region may need to close.
#[pyfunction]
pub(crate) fn interpreter_exiting(py: Python<'_>) {
    let _ = EXITING_THREAD.set(std::thread::current().id());
    py.detach(|| {
        EXITING.store(true, SeqCst);
        while OPEN.load(SeqCst) > 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    });
}
