//! The content cache: content objects already read and verified, kept in memory by id,
//! so that a message read again (a transcript page an agent host reads at every turn,
//! say) costs a lookup instead of the content index, the content row, decompression and
//! hashing.
//!
//! A content object never changes under its id, so a cached object is right for every
//! view that can see it: each entry keeps the seq of the record that stored the object,
//! and a view older than that seq does not take it. What a content collection removes is
//! forgotten ([`ContentCache::forget`]); a purge reopens the engine, and with it the
//! cache. Only an engine's own views use the cache: read-only openers (`annal` beside a
//! host) read the files every time.

use crate::store::RowHasher;
use annal_codec::ContentId;
use std::sync::Arc;

/// Bytes an entry costs beyond its object (the map slot, the id, the seq, the `Arc`).
const ENTRY_OVERHEAD_BYTES: u64 = 96;

/// An object as the cache holds it.
#[derive(Clone)]
struct Cached {
    /// The seq of the record that stored it.
    seq: u64,
    /// Its canonical bytes, verified against its id.
    bytes: Arc<[u8]>,
}

#[derive(Clone)]
struct Weight;

impl quick_cache::Weighter<ContentId, Cached> for Weight {
    fn weight(&self, _: &ContentId, value: &Cached) -> u64 {
        value.bytes.len() as u64 + ENTRY_OVERHEAD_BYTES
    }
}

/// Verified content objects by id, bounded by their bytes
/// ([`crate::Options::content_cache_bytes`]); quick_cache's eviction (a variant of
/// CLOCK-Pro, which a scan does not flush) picks what leaves.
pub(crate) struct ContentCache {
    objects: quick_cache::sync::Cache<ContentId, Cached, Weight, RowHasher>,
    /// Objects larger than this are not kept (one would push out many others).
    object_bytes_max: u64,
}

impl ContentCache {
    /// A cache of at most `bytes` (none for 0).
    pub fn new(bytes: u64) -> Option<ContentCache> {
        if bytes == 0 {
            return None;
        }
        let items = (bytes / 2048).max(16) as usize;
        let objects = quick_cache::sync::Cache::with(items, bytes, Weight, RowHasher::default(), Default::default());
        Some(ContentCache { objects, object_bytes_max: bytes / 16 })
    }

    /// The object `id` if it is cached and was stored at or before `seq`.
    pub fn get(&self, id: &ContentId, seq: u64) -> Option<Arc<[u8]>> {
        self.objects.get(id).filter(|c| c.seq <= seq).map(|c| c.bytes)
    }

    /// Keeps `bytes`, the verified object `id` stored by record `seq`.
    pub fn put(&self, id: ContentId, seq: u64, bytes: &[u8]) {
        if bytes.len() as u64 <= self.object_bytes_max {
            self.objects.insert(id, Cached { seq, bytes: Arc::from(bytes) });
        }
    }

    /// Forgets `ids` (a content collection removed them).
    pub fn forget(&self, ids: &[ContentId]) {
        for id in ids {
            self.objects.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ContentId {
        ContentId([n; 32])
    }

    #[test]
    fn an_object_is_served_only_to_views_that_see_its_record() {
        let cache = ContentCache::new(1 << 20).unwrap();
        cache.put(id(1), 10, b"hello");
        assert_eq!(cache.get(&id(1), 10).as_deref(), Some(&b"hello"[..]));
        assert_eq!(cache.get(&id(1), 9), None);
        assert_eq!(cache.get(&id(2), 10), None);
        cache.forget(&[id(1)]);
        assert_eq!(cache.get(&id(1), 10), None);
    }

    #[test]
    fn the_cache_keeps_to_its_bytes() {
        assert!(ContentCache::new(0).is_none());
        let cache = ContentCache::new(64 << 10).unwrap();
        // Larger than a sixteenth of the cache: not kept.
        cache.put(id(1), 1, &[7u8; 8 << 10]);
        assert_eq!(cache.get(&id(1), 1), None);
        for n in 0..200u8 {
            cache.put(id(n), 1, &[n; 2 << 10]);
        }
        let held: u64 = (0..200u8).filter_map(|n| cache.get(&id(n), 1)).map(|b| b.len() as u64).sum();
        assert!(held <= 64 << 10, "{held} bytes held");
        assert!(held > 0);
    }
}
