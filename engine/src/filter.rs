//! The content-key filter: a Bloom filter over the keys of the content-id index, held in
//! memory by the engine that writes, so that the writer learns that a new object is not
//! stored without reading the index's bucket for it.
//!
//! Deduplication asks, for every object a command brings, whether the content-id index
//! lists a row under its key (`buckets::content_is_stored`). Almost every object
//! a turn brings is new, and each of those questions read a bucket of the index's rows
//! from the projections file: at 16 committers it was about a seventh of the writer
//! thread's time (`docs/benchmarks.md`, "The content-key filter"). The filter answers
//! most of them from memory: a key it never saw is in none of the index's rows.
//!
//! It never says "absent" for a key the rows hold. Every fold that adds an entry to the
//! index through the engine's views tells it ([`crate::store::Store::note_content_key`],
//! called by [`crate::buckets::content_add`]): the writer's commands, imports and copies.
//! It is built from a view taken at a batch boundary (every entry the rows hold up to
//! that view, and the additions the delta holds typed): by the writer itself for an index
//! of at most 4,096 keys, otherwise by a thread of its own while the writer already tells
//! it every key added after that view; only once built is it asked.
//! Entries removed from the index (a content collection, a purge) stay in it, and a
//! rebuild of the index folds the same keys again: either only makes it answer "may be
//! stored" more often, which costs the bucket read it would have cost anyway.
//!
//! It is sized for half as many keys again as the index holds when it is built, at
//! [`BITS_PER_KEY`] bits each (16: about one answer in 1,400 for a key not in the index
//! is "may be stored"), so 3 bytes a key of the index. Once it has seen twice the keys it
//! was sized for (one in 40 is "may be stored" then), a bigger one is built the same way,
//! and the old one answers until the new one is ready. A filter is at most
//! [`crate::Options::content_filter_bytes_max`] ([`FILTER_BYTES_MAX`] by default; 0
//! turns it off); an index too large for that is read without one (or with the filter
//! built before it grew, which goes on answering, less often "absent").

use crate::delta::View;
use crate::error::Result;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Bits a filter holds for each key it is sized for.
pub const BITS_PER_KEY: u64 = 16;

/// Bit positions each key sets.
const PROBES: u32 = 7;

/// The least number of keys a filter is sized for.
const KEYS_MIN: u64 = 1 << 16;

/// Keys of an index up to which the writer builds the filter itself, at once, rather
/// than on a thread of its own.
const SYNC_KEYS_MAX: u64 = 4_096;

/// The most memory one filter takes by default
/// ([`crate::Options::content_filter_bytes_max`]; 256 MiB: an index of about 89 million
/// keys).
pub const FILTER_BYTES_MAX: u64 = 256 << 20;

/// A Bloom filter over 64-bit content keys, written and read from any thread.
#[derive(Debug)]
pub(crate) struct KeyFilter {
    words: Box<[AtomicU64]>,
    /// Its bits (a multiple of 64).
    bits: u64,
    /// Keys it was sized for.
    capacity: u64,
    /// Keys inserted (a key inserted twice counts twice).
    inserted: AtomicU64,
}

impl KeyFilter {
    /// A filter for `keys` keys, or `None` if it would be larger than `bytes_max`.
    fn with_capacity(keys: u64, bytes_max: u64) -> Option<KeyFilter> {
        let capacity = keys.max(KEYS_MIN);
        let bits = capacity.checked_mul(BITS_PER_KEY)?.checked_next_multiple_of(64)?;
        if bits / 8 > bytes_max {
            return None;
        }
        let words = (0..bits / 64).map(|_| AtomicU64::new(0)).collect();
        Some(KeyFilter { words, bits, capacity, inserted: AtomicU64::new(0) })
    }

    /// The bit positions of `key`: double hashing over two mixes of the key (content
    /// keys are leading bytes of blake3 hashes, uniform already; the mixes decorrelate
    /// the positions from the index's bucket address, which the same bits give).
    fn positions(&self, key: u64) -> impl Iterator<Item = u64> + '_ {
        let h1 = key.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(31);
        let h2 = key.wrapping_mul(0xC2B2_AE3D_27D4_EB4F).rotate_left(17) | 1;
        // Each 64-bit hash scaled to the bit count (multiply-shift, no division).
        (0..PROBES as u64)
            .map(move |i| ((h1.wrapping_add(i.wrapping_mul(h2)) as u128 * self.bits as u128) >> 64) as u64)
    }

    fn insert(&self, key: u64) {
        for bit in self.positions(key) {
            self.words[(bit / 64) as usize].fetch_or(1 << (bit % 64), Ordering::Relaxed);
        }
        self.inserted.fetch_add(1, Ordering::Relaxed);
    }

    fn may_hold(&self, key: u64) -> bool {
        self.positions(key).all(|bit| self.words[(bit / 64) as usize].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0)
    }

    /// Whether it has seen twice the keys it was sized for.
    fn full(&self) -> bool {
        self.inserted.load(Ordering::Relaxed) > 2 * self.capacity
    }
}

/// The engine's content-key filter: the one that answers, and the one being built.
pub(crate) struct ContentFilter {
    filters: RwLock<Filters>,
    /// The most memory a filter takes ([`crate::Options::content_filter_bytes_max`]).
    bytes_max: u64,
    /// A build failed (the view could not be read), or the engine is closing: no other
    /// is started, and one under way gives up.
    stopped: AtomicBool,
    /// The thread building a filter, joined at close: its view holds snapshots of the
    /// engine's files.
    task: parking_lot::Mutex<Option<crate::pool::Task<()>>>,
}

impl std::fmt::Debug for ContentFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentFilter").field("filters", &*self.filters.read()).finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Filters {
    /// The filter that answers, once built.
    ready: Option<Arc<KeyFilter>>,
    /// The filter being built: told every key added meanwhile, asked nothing yet.
    building: Option<Arc<KeyFilter>>,
}

impl ContentFilter {
    /// No filter yet; none will take more than `bytes_max` bytes.
    pub fn new(bytes_max: u64) -> ContentFilter {
        ContentFilter {
            filters: RwLock::default(),
            bytes_max,
            stopped: AtomicBool::new(false),
            task: parking_lot::Mutex::new(None),
        }
    }

    /// Whether the index's rows surely hold no entry under `key`.
    pub fn absent(&self, key: u64) -> bool {
        self.filters.read().ready.as_ref().is_some_and(|f| !f.may_hold(key))
    }

    /// A fold added an entry under `key` to the index.
    pub fn note(&self, key: u64) {
        let filters = self.filters.read();
        for f in [&filters.ready, &filters.building].into_iter().flatten() {
            f.insert(key);
        }
    }

    /// At a batch boundary, on the writer's side: when there is no filter yet, or the
    /// one that answers is full, builds a bigger one from `view` (which must read every
    /// batch applied so far): here for an index of at most [`SYNC_KEYS_MAX`] keys, else
    /// on a thread of its own. `view` is taken only when a build starts. A filter larger
    /// than the bound is not built: the one that answers, if any, goes on answering.
    pub fn maintain(self: &Arc<Self>, view: impl FnOnce() -> View) {
        {
            let filters = self.filters.read();
            let due = filters.ready.as_ref().is_none_or(|f| f.full());
            if !due || filters.building.is_some() || self.stopped.load(Ordering::Acquire) {
                return;
            }
        }
        // The last build's thread is done (it cleared `building`).
        if let Some(task) = self.task.lock().take() {
            let _ = task.join();
        }
        let view = view();
        let keys = match crate::buckets::CONTENT.size(&view, &[]) {
            Ok(size) => size + view.content_adds_len() as u64,
            Err(_) => return self.stopped.store(true, Ordering::Release),
        };
        // Room for half as many keys again before it is full (at twice its capacity).
        let Some(filter) = KeyFilter::with_capacity(keys + keys / 2, self.bytes_max) else {
            return self.stopped.store(true, Ordering::Release);
        };
        let filter = Arc::new(filter);
        if keys <= SYNC_KEYS_MAX {
            // A small index is read here at once (a few hundred bucket reads at most).
            let built = fill(&view, &filter, &self.stopped).map(|()| filter);
            return self.settle(built);
        }
        self.filters.write().building = Some(filter.clone());
        let this = self.clone();
        let started = crate::pool::spawn(move || {
            let built = fill(&view, &filter, &this.stopped).map(|()| filter);
            drop(view);
            this.settle(built);
        });
        match started {
            Ok(task) => *self.task.lock() = Some(task),
            Err(e) => self.settle(Err(e.into())),
        }
    }

    /// The end of a build: the filter built answers from now on, or (the build failed)
    /// no other build is started.
    fn settle(&self, built: Result<Arc<KeyFilter>>) {
        let mut filters = self.filters.write();
        filters.building = None;
        match built {
            Ok(filter) => filters.ready = Some(filter),
            Err(_) => self.stopped.store(true, Ordering::Release),
        }
    }

    /// At close: stops a build under way and waits for its thread; none starts after.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().take() {
            let _ = task.join();
        }
    }

    /// Bytes the filter that answers takes (0 while none does).
    pub fn bytes(&self) -> u64 {
        self.filters.read().ready.as_ref().map_or(0, |f| f.words.len() as u64 * 8)
    }
}

/// Inserts every key of the content-id index that `view` reads: the rows' entries and
/// the additions its layers hold typed.
fn fill(view: &View, filter: &KeyFilter, stopped: &AtomicBool) -> Result<()> {
    crate::buckets::CONTENT.each(view, &[], &mut |key, _| {
        if stopped.load(Ordering::Relaxed) {
            return Err(crate::error::Error::Closed);
        }
        if let Ok(key) = <[u8; 8]>::try_from(key) {
            filter.insert(u64::from_be_bytes(key));
        }
        Ok(())
    })?;
    view.each_content_add(&mut |key| filter.insert(key));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_never_says_absent_for_a_key_it_holds_and_rarely_for_one_it_does_not() {
        let f = KeyFilter::with_capacity(10_000, FILTER_BYTES_MAX).unwrap();
        let key = |i: u64| *blake3::hash(&i.to_le_bytes()).as_bytes();
        let key = |i: u64| u64::from_be_bytes(key(i)[..8].try_into().unwrap());
        for i in 0..10_000 {
            f.insert(key(i));
        }
        assert!((0..10_000).all(|i| f.may_hold(key(i))));
        let false_positives = (10_000..110_000).filter(|i| f.may_hold(key(*i))).count();
        assert!(false_positives < 500, "{false_positives} of 100,000 absent keys may be held");
        assert!(!f.full());
    }

    #[test]
    fn a_filter_too_large_is_not_made() {
        assert!(KeyFilter::with_capacity(FILTER_BYTES_MAX, FILTER_BYTES_MAX).is_none());
        assert!(KeyFilter::with_capacity(1, FILTER_BYTES_MAX).is_some());
        assert!(KeyFilter::with_capacity(1, 64 << 10).is_none(), "the least filter takes 128 KiB");
    }
}
