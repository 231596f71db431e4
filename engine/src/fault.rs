//! A fault-injecting redb storage backend, for testing what the engine does when the
//! disk fails: fail the Nth write, the Nth `sync_data`, or reads, and return short reads.
//!
//! ```
//! use annal::fault::{FaultyBackend, Faults};
//! let file = tempfile::tempfile().unwrap();
//! let faults = Faults::new();
//! let backend = FaultyBackend::new(redb::backends::FileBackend::new(file).unwrap(), faults.clone());
//! let engine = annal::Engine::open_with_backend(backend, annal::Options::default()).unwrap();
//! faults.fail_sync_after(0); // the next fsync fails
//! let err = engine.create_session(annal::CreateSession::new()).unwrap_err();
//! assert!(matches!(err, annal::Error::Storage(_)));
//! assert!(engine.is_poisoned());
//! ```
//!
//! [`disk`] holds the simulated disk of the deterministic simulation (power loss, torn
//! and reordered writes, failing calls), and [`SharedMemory`] a plain in-memory file.

pub mod disk;

use redb::StorageBackend;
use std::io;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const NEVER: u64 = u64::MAX;

/// Shared switches that decide which operations fail. Clone it to keep a handle after
/// the backend moves into the database.
#[derive(Clone, Debug, Default)]
pub struct Faults(Arc<FaultState>);

#[derive(Debug)]
struct FaultState {
    writes_until_failure: AtomicU64,
    syncs_until_failure: AtomicU64,
    fail_reads: AtomicBool,
    short_reads: AtomicBool,
    writes: AtomicU64,
    written_bytes: AtomicU64,
    syncs: AtomicU64,
    /// Writes and `sync_data` calls that failed by injection.
    failures: AtomicU64,
    /// Writes and `sync_data` calls asked for after the first injected failure (the
    /// failing one excluded).
    writes_after_failure: AtomicU64,
    syncs_after_failure: AtomicU64,
    /// The kind of error an injected failure of a write or a `sync_data` is.
    kind: parking_lot::Mutex<io::ErrorKind>,
}

impl Default for FaultState {
    fn default() -> Self {
        FaultState {
            writes_until_failure: AtomicU64::new(NEVER),
            syncs_until_failure: AtomicU64::new(NEVER),
            fail_reads: AtomicBool::new(false),
            short_reads: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            kind: parking_lot::Mutex::new(io::ErrorKind::Other),
            failures: AtomicU64::new(0),
            writes_after_failure: AtomicU64::new(0),
            syncs_after_failure: AtomicU64::new(0),
        }
    }
}

fn countdown(counter: &AtomicU64) -> bool {
    let mut current = counter.load(Ordering::Acquire);
    loop {
        if current == NEVER {
            return false;
        }
        if current == 0 {
            return true;
        }
        match counter.compare_exchange(current, current - 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return false,
            Err(now) => current = now,
        }
    }
}

impl Faults {
    /// No faults.
    pub fn new() -> Faults {
        Faults::default()
    }

    /// Let `n` more writes succeed, then fail every write.
    pub fn fail_write_after(&self, n: u64) {
        self.0.writes_until_failure.store(n, Ordering::Release);
    }

    /// Let `n` more `sync_data` calls succeed, then fail every one.
    pub fn fail_sync_after(&self, n: u64) {
        self.0.syncs_until_failure.store(n, Ordering::Release);
    }

    /// Makes the injected failures of writes and `sync_data` errors of `kind` (by
    /// default [`io::ErrorKind::Other`]; [`io::ErrorKind::StorageFull`] is a full disk).
    pub fn fail_as(&self, kind: io::ErrorKind) {
        *self.0.kind.lock() = kind;
    }

    /// Makes every read fail (on) or succeed (off).
    pub fn fail_reads(&self, on: bool) {
        self.0.fail_reads.store(on, Ordering::Release);
    }

    /// Return reads that fill only half the buffer and report an error.
    pub fn short_reads(&self, on: bool) {
        self.0.short_reads.store(on, Ordering::Release);
    }

    /// Clear every fault.
    pub fn heal(&self) {
        self.fail_write_after(NEVER);
        self.fail_sync_after(NEVER);
        self.fail_reads(false);
        self.short_reads(false);
    }

    /// Writes that reached the inner backend.
    pub fn writes(&self) -> u64 {
        self.0.writes.load(Ordering::Acquire)
    }

    /// Bytes written to the inner backend by the writes counted in [`Faults::writes`].
    pub fn bytes_written(&self) -> u64 {
        self.0.written_bytes.load(Ordering::Acquire)
    }

    /// `sync_data` calls that reached the inner backend.
    pub fn syncs(&self) -> u64 {
        self.0.syncs.load(Ordering::Acquire)
    }

    /// Writes and `sync_data` calls that failed by injection.
    pub fn failures(&self) -> u64 {
        self.0.failures.load(Ordering::Acquire)
    }

    /// (writes, `sync_data` calls) asked for after the first injected failure, the
    /// failing call excluded, whether they failed too or not: what an engine that retries
    /// or carries on after a failed write or fsync would call.
    pub fn calls_after_failure(&self) -> (u64, u64) {
        (self.0.writes_after_failure.load(Ordering::Acquire), self.0.syncs_after_failure.load(Ordering::Acquire))
    }

    /// Counts a write or `sync_data` call asked for (in `after` if a call failed
    /// before it), and whether it fails by injection (`failing`).
    fn asked(&self, after: &AtomicU64, failing: bool) {
        if self.0.failures.load(Ordering::Acquire) > 0 {
            after.fetch_add(1, Ordering::AcqRel);
        }
        if failing {
            self.0.failures.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Wraps a backend and injects the faults switched on in [`Faults`].
#[derive(Debug)]
pub struct FaultyBackend<B: StorageBackend> {
    inner: B,
    faults: Faults,
}

impl<B: StorageBackend> FaultyBackend<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, faults: Faults) -> FaultyBackend<B> {
        FaultyBackend { inner, faults }
    }
}

impl Faults {
    /// An injected failure of `what`, of the kind [`Faults::fail_as`] set.
    fn injected(&self, what: &str) -> io::Error {
        io::Error::new(*self.0.kind.lock(), format!("injected {what} failure"))
    }
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected {what} failure"))
}

impl<B: StorageBackend> StorageBackend for FaultyBackend<B> {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        if self.faults.0.fail_reads.load(Ordering::Acquire) {
            return Err(injected("read"));
        }
        if self.faults.0.short_reads.load(Ordering::Acquire) && out.len() > 1 {
            let half = out.len() / 2;
            self.inner.read(offset, &mut out[..half])?;
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "injected short read"));
        }
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let failing = countdown(&self.faults.0.syncs_until_failure);
        self.faults.asked(&self.faults.0.syncs_after_failure, failing);
        if failing {
            return Err(self.faults.injected("sync_data"));
        }
        self.faults.0.syncs.fetch_add(1, Ordering::AcqRel);
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let failing = countdown(&self.faults.0.writes_until_failure);
        self.faults.asked(&self.faults.0.writes_after_failure, failing);
        if failing {
            return Err(self.faults.injected("write"));
        }
        self.faults.0.writes.fetch_add(1, Ordering::AcqRel);
        self.faults.0.written_bytes.fetch_add(data.len() as u64, Ordering::AcqRel);
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

/// An in-memory storage backend whose clones share the same bytes, so that a database can
/// be closed and opened again on it, or read back after the engine that wrote it is gone
/// (tests and fuzz targets).
#[derive(Clone, Debug, Default)]
pub struct SharedMemory(Arc<redb::backends::InMemoryBackend>);

impl SharedMemory {
    /// An empty file.
    pub fn new() -> SharedMemory {
        SharedMemory::default()
    }
}

impl StorageBackend for SharedMemory {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.0.write(offset, data)
    }
}
