//! The engine's background threads (the writer, the checkpointer, the absorber) come
//! from a process-wide pool of idle threads, so that opening an engine does not create
//! threads and closing one does not wait for threads to exit.
//!
//! A task runs on an idle pooled thread if there is one, else on a new thread. When the
//! task ends, its thread waits up to [`IDLE_FOR`] for the next one, then exits; at most
//! [`IDLE_MAX`] threads wait at once. [`Task::join`] waits for the task, not for its
//! thread: everything the task's closure owned is dropped before `join` returns, as it
//! would be by a thread's exit.
//!
//! Creating a thread and joining it costs about 55 µs on a two-core virtual machine
//! (`docs/benchmarks.md`), and each engine runs three.

use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::Mutex;
use std::time::Duration;

/// How long a thread waits for a task before it exits.
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(10);
/// At most this many threads wait for a task; a thread whose task ends when as many
/// already wait exits.
pub(crate) const IDLE_MAX: usize = 16;

type Job = Box<dyn FnOnce() + Send>;

/// The threads waiting for a task, each by the sender of its task channel.
static IDLE: Mutex<Vec<Sender<Job>>> = Mutex::new(Vec::new());

/// A task started by [`spawn`].
pub(crate) struct Task<T> {
    done: Receiver<std::thread::Result<T>>,
}

impl<T> Task<T> {
    /// Waits for the task to end: its result, or the payload of its panic.
    pub(crate) fn join(self) -> std::thread::Result<T> {
        // The sender is dropped without a send only if the thread died outside the task's
        // `catch_unwind`, which nothing in `run` can cause; it still reads as a panic.
        self.done.recv().unwrap_or_else(|_| Err(Box::new("the pooled thread ended without its task's result")))
    }
}

/// Runs `f` on a pooled thread. Errs only if a new thread was needed and the system
/// refused to create it.
pub(crate) fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<Task<T>> {
    let (tx, done) = bounded(1);
    let mut job: Job = Box::new(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(result);
    });
    // A waiting thread leaves the list only under the lock, and never once it is popped
    // here, so the send reaches it; the fallback keeps a lost race harmless.
    while let Some(to) = IDLE.lock().pop() {
        match to.send(job) {
            Ok(()) => return Ok(Task { done }),
            Err(crossbeam_channel::SendError(back)) => job = back,
        }
    }
    std::thread::Builder::new().name("annal-worker".into()).spawn(move || run(job))?;
    Ok(Task { done })
}

/// A pooled thread: runs its first task, then each task sent to it, until it has waited
/// [`IDLE_FOR`] for one or there are enough waiting threads.
fn run(first: Job) {
    let (to, tasks) = bounded::<Job>(1);
    let mut job = first;
    loop {
        job();
        {
            let mut idle = IDLE.lock();
            if idle.len() >= IDLE_MAX {
                return;
            }
            idle.push(to.clone());
        }
        job = loop {
            match tasks.recv_timeout(IDLE_FOR) {
                Ok(next) => break next,
                Err(_) => {
                    let mut idle = IDLE.lock();
                    if let Some(i) = idle.iter().position(|w| w.same_channel(&to)) {
                        idle.swap_remove(i);
                        return;
                    }
                    // A spawner popped this thread: its task is on the way.
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_returns_its_result_and_drops_what_it_owned() {
        let owned = std::sync::Arc::new(());
        let held = owned.clone();
        let task = spawn(move || {
            let _held = held;
            7
        })
        .unwrap();
        assert_eq!(task.join().unwrap(), 7);
        assert_eq!(std::sync::Arc::strong_count(&owned), 1, "the closure's captures are gone after join");
    }

    #[test]
    fn a_panicking_task_reports_its_panic_and_its_thread_goes_on() {
        let task = spawn(|| -> u32 { panic!("planted") }).unwrap();
        let payload = task.join().unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"planted"));
        // Later tasks still run (on that thread or another).
        assert_eq!(spawn(|| 3).unwrap().join().unwrap(), 3);
    }

    #[test]
    fn threads_are_reused() {
        // Sequential tasks: a thread whose task ended waits for the next one.
        let ids: std::collections::HashSet<_> =
            (0..50).map(|_| spawn(|| std::thread::current().id()).unwrap().join().unwrap()).collect();
        assert!(ids.len() < 50, "every one of 50 tasks in a row ran on a new thread");
    }

    #[test]
    fn many_tasks_at_once_all_run() {
        let tasks: Vec<_> = (0..40u32)
            .map(|i| {
                spawn(move || {
                    std::thread::sleep(Duration::from_millis(2));
                    i
                })
                .unwrap()
            })
            .collect();
        let sum: u32 = tasks.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(sum, (0..40).sum());
        assert!(IDLE.lock().len() <= IDLE_MAX);
    }
}
