//! The content cache: content objects already read and verified, kept in memory by id,
//! so that a message read again (a transcript page an agent host reads at every turn,
//! say) costs a lookup instead of the content index, the content row, decompression and
//! hashing; and the message lists of records ([`crate::transcript::message_list`]) by
//! seq, which the transcript's runs name, so that a page read again costs no record
//! decode. Beside it, the revision cache ([`RevisionCache`]): the message lists of
//! revisions that a restore or a read of a past revision rebuilt from the graph's
//! recipes, by revision id, so that the next such walk stops there instead of going back
//! to the session's first record.
//!
//! A record never changes under its seq while an engine is open (a purge reopens it), so
//! a cached list is right for every view that sees its record.
//!
//! A content object never changes under its id, so a cached object is right for every
//! view that can see it: each entry keeps the seq of the record that stored the object,
//! and a view older than that seq does not take it. What a content collection removes is
//! forgotten ([`ContentCache::forget`]), once new views no longer find it, and an object
//! that a view taken before the collection reads from its older snapshot is not kept; a
//! purge reopens the engine, and with it the cache. Only an engine's own views use the
//! cache: read-only openers (`annal` beside a host) read the files every time.

use crate::store::RowHasher;
use annal_codec::{ContentId, RevisionId};
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

/// The weight of a list of ids, whatever it is kept by (a record's seq, a revision id).
#[derive(Clone)]
struct ListWeight;

impl<K> quick_cache::Weighter<K, Arc<[ContentId]>> for ListWeight {
    fn weight(&self, _: &K, value: &Arc<[ContentId]>) -> u64 {
        (value.len() * std::mem::size_of::<ContentId>()) as u64 + ENTRY_OVERHEAD_BYTES
    }
}

/// A cache of lists in one shard. quick_cache splits a cache into shards (four a core by
/// default) and refuses an entry heavier than one shard holds, so a sharded cache would
/// keep lists of a fraction of the length its owner promises, fewer the more cores the
/// machine has; the lists are read far more often than kept, and a read takes the
/// shard's lock shared.
fn one_shard<K: Eq + std::hash::Hash + Clone>(
    items: usize,
    bytes: u64,
) -> quick_cache::sync::Cache<K, Arc<[ContentId]>, ListWeight, RowHasher> {
    let options = quick_cache::OptionsBuilder::new()
        .estimated_items_capacity(items)
        .weight_capacity(bytes)
        .shards(1)
        .build()
        .expect("a capacity and a shard count are all the options need");
    quick_cache::sync::Cache::with_options(options, ListWeight, RowHasher::default(), Default::default())
}

/// Verified content objects by id and records' message lists by seq, bounded by their
/// bytes (of [`crate::Options::content_cache_bytes`], three quarters for the objects and
/// three sixteenths for the lists; the last sixteenth is the [`RevisionCache`]'s);
/// quick_cache's eviction (a variant of CLOCK-Pro, which a scan does not flush) picks
/// what leaves.
pub(crate) struct ContentCache {
    objects: quick_cache::sync::Cache<ContentId, Cached, Weight, RowHasher>,
    /// Objects larger than this are not kept (one would push out many others).
    object_bytes_max: u64,
    lists: quick_cache::sync::Cache<u64, Arc<[ContentId]>, ListWeight, RowHasher>,
    /// Lists of more ids than this are not kept.
    list_ids_max: usize,
    /// Content collections so far ([`ContentCache::forget`]): an object read by a view
    /// taken before the last one is not kept (the view's snapshot may still hold what
    /// the collection removed).
    collections: std::sync::atomic::AtomicU64,
}

impl ContentCache {
    /// The content cache of an engine whose [`crate::Options::content_cache_bytes`] is
    /// `bytes` (none for 0): three quarters for the objects, three sixteenths for the
    /// lists (the last sixteenth is for [`RevisionCache::of_content_cache`]).
    pub fn new(bytes: u64) -> Option<ContentCache> {
        if bytes == 0 {
            return None;
        }
        let (object_bytes, list_bytes) = (bytes - bytes / 4, (bytes / 4 - bytes / 16).max(1));
        let items = (object_bytes / 2048).max(16) as usize;
        let objects =
            quick_cache::sync::Cache::with(items, object_bytes, Weight, RowHasher::default(), Default::default());
        let lists = one_shard((list_bytes / 512).max(16) as usize, list_bytes);
        let list_ids_max = (list_bytes / 4) as usize / std::mem::size_of::<ContentId>();
        Some(ContentCache {
            objects,
            object_bytes_max: object_bytes / 16,
            lists,
            list_ids_max,
            collections: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The message list of the record at `seq`, if it is cached.
    pub fn list(&self, seq: u64) -> Option<Arc<[ContentId]>> {
        self.lists.get(&seq)
    }

    /// Keeps `list`, the message list of the record at `seq`.
    pub fn put_list(&self, seq: u64, list: &Arc<[ContentId]>) {
        if list.len() <= self.list_ids_max {
            self.lists.insert(seq, list.clone());
        }
    }

    /// The object `id` if it is cached and was stored at or before `seq`.
    pub fn get(&self, id: &ContentId, seq: u64) -> Option<Arc<[u8]>> {
        self.objects.get(id).filter(|c| c.seq <= seq).map(|c| c.bytes)
    }

    /// How many content collections this cache has forgotten objects for: a view takes
    /// it when it is taken, and hands it to [`ContentCache::put`].
    pub fn collections(&self) -> u64 {
        self.collections.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Keeps `bytes`, the verified object `id` stored by record `seq`, read by a view
    /// taken when the cache had seen `collections` collections: none since, or the
    /// object is not kept.
    pub fn put(&self, id: ContentId, seq: u64, bytes: &[u8], collections: u64) {
        if bytes.len() as u64 <= self.object_bytes_max && collections == self.collections() {
            self.objects.insert(id, Cached { seq, bytes: Arc::from(bytes) });
            // A collection that forgot objects meanwhile may have missed this one.
            if collections != self.collections() {
                self.objects.remove(&id);
            }
        }
    }

    /// Forgets `ids` (a content collection removed them, and new views no longer find
    /// them): objects that views taken before read after this are not kept.
    pub fn forget(&self, ids: &[ContentId]) {
        self.collections.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        for id in ids {
            self.objects.remove(id);
        }
    }
}

/// The message lists of revisions by revision id, bounded by their bytes, which
/// [`crate::decide::materialize`]'s walk over the recipes (a restore, a read of a past
/// revision) stops at and keeps what it rebuilt in.
///
/// A revision id is the chain value over its list, so a revision's list is the same in
/// every session, every view and every file that holds the revision, and nothing a purge,
/// a content collection or a later commit does changes it: a kept list never goes stale.
/// A walk takes one only at a node its session's graph holds, and hashes the list it ends
/// with against the revision it was asked for either way. The lists hold ids, no content,
/// so read-only openers keep one too ([`crate::reader::READER_REVISION_CACHE_BYTES`]).
pub(crate) struct RevisionCache {
    lists: quick_cache::sync::Cache<RevisionId, Arc<[ContentId]>, ListWeight, RowHasher>,
    /// Lists of more ids than this are not kept.
    ids_max: usize,
}

impl RevisionCache {
    /// A cache of at most `bytes` (none for 0); a list larger than half of it is not
    /// kept.
    pub fn new(bytes: u64) -> Option<RevisionCache> {
        if bytes == 0 {
            return None;
        }
        let lists = one_shard((bytes / 4096).max(16) as usize, bytes);
        Some(RevisionCache { lists, ids_max: (bytes / 2) as usize / std::mem::size_of::<ContentId>() })
    }

    /// The revision cache of an engine whose [`crate::Options::content_cache_bytes`] is
    /// `bytes`: a sixteenth of it (none for 0).
    pub fn of_content_cache(bytes: u64) -> Option<RevisionCache> {
        RevisionCache::new(bytes / 16)
    }

    /// The message list of revision `revision`, if it is kept.
    pub fn get(&self, revision: &RevisionId) -> Option<Arc<[ContentId]>> {
        self.lists.get(revision)
    }

    /// Keeps `list`, the message list of revision `revision`, which the caller hashed to
    /// it. A revision kept already is left as it is (its list cannot differ), without a
    /// copy of `list`.
    pub fn put(&self, revision: RevisionId, list: &[ContentId]) {
        if list.len() <= self.ids_max && !self.lists.contains_key(&revision) {
            self.lists.insert(revision, Arc::from(list));
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
        cache.put(id(1), 10, b"hello", 0);
        assert_eq!(cache.get(&id(1), 10).as_deref(), Some(&b"hello"[..]));
        assert_eq!(cache.get(&id(1), 9), None);
        assert_eq!(cache.get(&id(2), 10), None);
        cache.forget(&[id(1)]);
        assert_eq!(cache.get(&id(1), 10), None);
        // A view taken before that collection (it saw none) reads the object from its
        // older snapshot: it is not kept for the views after.
        cache.put(id(1), 10, b"hello", 0);
        assert_eq!(cache.get(&id(1), 10), None);
        cache.put(id(2), 10, b"other", cache.collections());
        assert_eq!(cache.get(&id(2), 10).as_deref(), Some(&b"other"[..]));
    }

    #[test]
    fn message_lists_are_kept_by_seq_within_their_share() {
        let cache = ContentCache::new(64 << 10).unwrap();
        let list: Arc<[ContentId]> = (0..10u8).map(id).collect();
        cache.put_list(7, &list);
        assert_eq!(cache.list(7).as_deref(), Some(&list[..]));
        assert_eq!(cache.list(8), None);
        // A list larger than a quarter of the lists' share is not kept.
        let long: Arc<[ContentId]> = (0..200u8).map(id).collect();
        cache.put_list(9, &long);
        assert_eq!(cache.list(9), None);
        for seq in 100..400 {
            cache.put_list(seq, &list);
        }
        let held = (100..400).filter(|s| cache.list(*s).is_some()).count() as u64;
        // Within the lists' share: three sixteenths of the cache.
        assert!(held * (10 * 32 + ENTRY_OVERHEAD_BYTES) <= 12 << 10, "{held} lists held");
        assert!(held > 0);
    }

    #[test]
    fn revisions_lists_are_kept_by_id_within_their_bytes() {
        assert!(RevisionCache::new(0).is_none());
        let cache = RevisionCache::new(4 << 10).unwrap();
        let revision = |n: u64| RevisionId(*blake3::hash(&n.to_le_bytes()).as_bytes());
        let list: Vec<ContentId> = (0..10u8).map(id).collect();
        cache.put(revision(1), &list);
        assert_eq!(cache.get(&revision(1)).as_deref(), Some(&list[..]));
        assert_eq!(cache.get(&revision(2)), None);
        // A list larger than half the cache is not kept.
        let long: Vec<ContentId> = (0..100u8).map(id).collect();
        cache.put(revision(3), &long);
        assert_eq!(cache.get(&revision(3)), None);
        for n in 100..400 {
            cache.put(revision(n), &list);
        }
        let held = (100..400).filter(|n| cache.get(&revision(*n)).is_some()).count() as u64;
        assert!(held * (10 * 32 + ENTRY_OVERHEAD_BYTES) <= 4 << 10, "{held} lists held");
        assert!(held > 0);
    }

    /// The longest lists the caches promise are kept whatever the machine's cores: an
    /// engine's default revision cache keeps a list of 60,000 ids, and its records'
    /// lists one of 90,000.
    #[test]
    fn the_longest_lists_promised_are_kept() {
        let default = crate::CONTENT_CACHE_BYTES as u64;
        let long: Vec<ContentId> =
            (0..60_000u32).map(|n| ContentId(*blake3::hash(&n.to_le_bytes()).as_bytes())).collect();
        let revisions = RevisionCache::of_content_cache(default).unwrap();
        assert!(revisions.ids_max >= long.len());
        revisions.put(RevisionId([1; 32]), &long);
        assert_eq!(revisions.get(&RevisionId([1; 32])).map(|l| l.len()), Some(long.len()));
        let longer: Arc<[ContentId]> = long.iter().cycle().take(90_000).copied().collect();
        let content = ContentCache::new(default).unwrap();
        assert!(content.list_ids_max >= longer.len());
        content.put_list(7, &longer);
        assert_eq!(content.list(7).map(|l| l.len()), Some(longer.len()));
    }

    #[test]
    fn the_cache_keeps_to_its_bytes() {
        assert!(ContentCache::new(0).is_none());
        let cache = ContentCache::new(64 << 10).unwrap();
        // Larger than a sixteenth of the cache: not kept.
        cache.put(id(1), 1, &[7u8; 8 << 10], 0);
        assert_eq!(cache.get(&id(1), 1), None);
        for n in 0..200u8 {
            cache.put(id(n), 1, &[n; 2 << 10], 0);
        }
        let held: u64 = (0..200u8).filter_map(|n| cache.get(&id(n), 1)).map(|b| b.len() as u64).sum();
        assert!(held <= 64 << 10, "{held} bytes held");
        assert!(held > 0);
    }
}
