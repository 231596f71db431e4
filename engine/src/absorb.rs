//! The absorber thread: appends the journal's rows to the log file, behind the commits.
//!
//! A durable commit is a frame in the journal (`crate::journal`); views read its rows
//! from memory (the delta's [`crate::journal::Tail`]). When the writer turns to the
//! other journal file, it hands the absorber the tip it has reached and the draft
//! changes journalled since the last request. The absorber appends every journalled
//! record and content row up to that tip to the log file with the one appender
//! ([`crate::log::append_sealed`]), writes the draft changes, and commits durably, in
//! one transaction; then new views read those rows from the file, and the journal file
//! they came from may be written again. The writer never waits for it, except when the
//! journal holds [`crate::journal::JOURNAL_BYTES_MAX`] (backpressure) and before work
//! that needs the log file to itself (import, copy, collection, rebuild, close).
//!
//! A failed absorption poisons the engine, as a failed commit does: the journal still
//! holds every frame, and the next open appends them.

use crate::draft::DraftWrites;
use crate::error::{Error, Result};
use crate::log::Tip;
use crate::writer::Shared;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use redb::ReadableDatabase;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One request: absorb everything journalled up to `tip`, with `drafts`.
struct Request {
    tip: Tip,
    drafts: Vec<DraftWrites>,
    done: Option<oneshot::Sender<Result<()>>>,
}

/// How far the absorber has gone: requests are done in the order they were sent, so a
/// count says which.
#[derive(Default)]
struct Progress {
    /// Requests done, each in a durable transaction of the log file.
    done: Mutex<u64>,
    changed: Condvar,
}

/// The writer's handle on the absorber thread.
pub(crate) struct Absorber {
    tx: Option<Sender<Request>>,
    /// Requests sent: the last one's number (they are numbered from 1).
    sent: u64,
    progress: Arc<Progress>,
    handle: Option<crate::pool::Task<()>>,
}

impl Absorber {
    /// Starts the thread.
    pub fn start(shared: Arc<Shared>) -> Result<Absorber> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let progress = Arc::new(Progress::default());
        let thread_progress = progress.clone();
        let handle = crate::pool::spawn(move || run(shared, rx, thread_progress))?;
        Ok(Absorber { tx: Some(tx), sent: 0, progress, handle: Some(handle) })
    }

    /// How many requests are done: every one numbered up to it.
    pub fn done(&self) -> u64 {
        *self.progress.done.lock()
    }

    /// Asks for everything journalled up to `tip` to go into the log file, with
    /// `drafts`, without waiting; returns the request's number.
    pub fn request(&mut self, tip: Tip, drafts: Vec<DraftWrites>) -> u64 {
        self.sent += 1;
        if let Some(tx) = &self.tx {
            let _ = tx.send(Request { tip, drafts, done: None });
        }
        self.sent
    }

    /// Puts everything journalled up to `tip` into the log file, and waits for it.
    pub fn absorb_all(&mut self, tip: Tip, drafts: Vec<DraftWrites>) -> Result<()> {
        let (done, wait) = oneshot::channel();
        let tx = self.tx.as_ref().ok_or(Error::Closed)?;
        tx.send(Request { tip, drafts, done: Some(done) }).map_err(|_| Error::Closed)?;
        self.sent += 1;
        wait.recv().map_err(|_| Error::Poisoned)?
    }

    /// Waits until request `request` is done, or the engine is poisoned.
    pub fn wait_for(&self, request: u64, shared: &Shared) {
        let mut done = self.progress.done.lock();
        while *done < request && !shared.poisoned.load(Ordering::Acquire) {
            self.progress.changed.wait_for(&mut done, std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Absorber {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

fn run(shared: Arc<Shared>, rx: Receiver<Request>, progress: Arc<Progress>) {
    while let Ok(request) = rx.recv() {
        let result = match shared.poisoned.load(Ordering::Acquire) {
            true => Err(Error::Poisoned),
            false => crate::error::fail_closed("absorb the journal", || absorb(&shared, &request)),
        };
        match &result {
            Ok(()) => {
                *progress.done.lock() += 1;
                shared.stats.absorptions.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => shared.poisoned.set(e),
        }
        progress.changed.notify_all();
        if let Some(done) = request.done {
            let _ = done.send(result);
        }
    }
}

/// One absorption: the journalled rows past the log file's tip up to the request's tip,
/// and its draft changes, in one durable transaction of the log file. (The log file's
/// tip is read each time: work that had the log to itself may have appended to it.)
fn absorb(shared: &Shared, request: &Request) -> Result<()> {
    let tip = request.tip;
    let file_seq = crate::log::load_tip(&shared.log_db.begin_read()?, &shared.chain)?.seq;
    if tip.seq <= file_seq && request.drafts.is_empty() {
        return Ok(());
    }
    let tail = shared.delta.tail();
    let rows = tail.batches().flat_map(|b| b.rows.iter()).filter(|r| r.seq > file_seq && r.seq <= tip.seq);
    let mut txn = shared.log_db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    // Draft changes alone leave the log and its tip as they are.
    if tip.seq > file_seq {
        let written = crate::log::append_sealed(&txn, file_seq, rows, &tip)?;
        if file_seq + written.records < tip.seq {
            return Err(Error::storage(format!("absorb: the journal's rows end before seq {}", tip.seq)));
        }
    }
    for drafts in &request.drafts {
        crate::draft::write(&txn, drafts)?;
    }
    txn.commit()?;
    shared.delta.absorbed(shared.log_db.begin_read()?, tip.seq);
    Ok(())
}
