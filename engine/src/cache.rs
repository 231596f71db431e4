//! The head cache: the latest committed row of the heads projection for recently used
//! sessions, so that a head read is a map lookup instead of a read transaction.
//!
//! It is a cache of projection rows, not a projection: the writer refreshes it from the
//! heads rows `evolve` wrote, after the commit is durable and before it replies, so a
//! caller that holds a receipt reads a head at least that new. Readers fill misses from
//! a snapshot; an entry is only ever replaced by a head with a larger `last_seq`, so a
//! reader holding an old snapshot cannot overwrite a newer head.

use crate::projection::SessionHead;
use annal_codec::SessionId;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

/// Sessions the head cache holds at most. Beyond it, new sessions are read from the
/// database; cached ones stay fresh.
pub const HEAD_CACHE_ENTRIES_MAX: usize = 65_536;

#[derive(Debug, Default)]
pub(crate) struct HeadCache {
    map: RwLock<HashMap<SessionId, Arc<SessionHead>>>,
}

impl HeadCache {
    pub(crate) fn get(&self, session: &SessionId) -> Option<Arc<SessionHead>> {
        self.map.read().get(session).cloned()
    }

    /// Stores `head` unless a newer one is cached. New sessions are admitted while there
    /// is room; `force` admits them regardless (the writer's own commits).
    pub(crate) fn offer(&self, head: SessionHead, force: bool) {
        let mut map = self.map.write();
        match map.get(&head.session) {
            Some(cached) if cached.last_seq >= head.last_seq => {}
            Some(_) => {
                map.insert(head.session, Arc::new(head));
            }
            None if force || map.len() < HEAD_CACHE_ENTRIES_MAX => {
                if map.len() >= HEAD_CACHE_ENTRIES_MAX {
                    // Make room without losing freshness: any entry can go, since a
                    // miss reads the database.
                    if let Some(victim) = map.keys().next().copied() {
                        map.remove(&victim);
                    }
                }
                map.insert(head.session, Arc::new(head));
            }
            None => {}
        }
    }

    /// Forgets everything (after a rebuild or an import).
    pub(crate) fn clear(&self) {
        self.map.write().clear();
    }
}
