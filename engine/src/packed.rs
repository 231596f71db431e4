//! Per-session lists of fixed-width entries, several to a projection row.
//!
//! The stream index (a session's global seqs, in stream order) and the revision order (the
//! seqs of the records that first produced a session's revision nodes, in ordinal order)
//! are such lists. Entry `i` of a session
//! lives in row `i / per_row` (key `session ‖ row`, u64 big-endian), at slot
//! `i % per_row`; every row of a session but its last is full, and an append rewrites the
//! last row. `evolve` appends through [`Packed::append`]; the queries read rows through
//! [`Packed::entries`], which refuses a row that is not whole entries.

use crate::error::{Error, Location, Result};
use crate::store::{keys, Store, Table};
use annal_codec::SessionId;

/// One packed list: its table, the width of an entry and the entries a row holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packed {
    pub table: Table,
    pub width: usize,
    pub per_row: u64,
}

/// Why [`Packed::append`] did not append.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Misplaced {
    /// The list already holds the entry's index.
    Repeated,
    /// Entries before the index are missing.
    Gap,
    /// The row holding the index is not a whole number of entries (its length).
    BadRow(usize),
}

impl Packed {
    /// The key of `session`'s row `row`.
    pub fn key(&self, session: &SessionId, row: u64) -> Vec<u8> {
        keys::session_u64(session, row)
    }

    /// The key of the row holding entry `index`, and the entry's slot in it.
    pub fn slot(&self, session: &SessionId, index: u64) -> (Vec<u8>, u64) {
        (self.key(session, index / self.per_row), index % self.per_row)
    }

    /// The index of the first entry of row `row`, if it is one a list can reach.
    pub fn first_index(&self, row: u64) -> Option<u64> {
        row.checked_mul(self.per_row)
    }

    /// Entries a row of these bytes holds: `None` unless it is whole entries, at most a
    /// row's worth (an absent row, empty, holds none).
    fn held(&self, row: &[u8]) -> Option<u64> {
        (row.len().is_multiple_of(self.width) && row.len() as u64 <= self.per_row * self.width as u64)
            .then_some((row.len() / self.width) as u64)
    }

    /// The entries of a stored row, in order; `None` when it is empty, not whole entries
    /// or more than a row's worth.
    pub fn entries<'a>(&self, row: &'a [u8]) -> Option<std::slice::ChunksExact<'a, u8>> {
        (!row.is_empty() && self.held(row).is_some()).then(|| row.chunks_exact(self.width))
    }

    /// Appends `entry` (of the list's width) as entry `index` of `session`'s list:
    /// every earlier slot of its row must be taken, and a new row starts only once the one
    /// before it is full.
    pub fn append<S: Store + ?Sized>(
        &self,
        store: &mut S,
        session: &SessionId,
        index: u64,
        entry: &[u8],
    ) -> Result<std::result::Result<(), Misplaced>> {
        debug_assert_eq!(entry.len(), self.width);
        let (key, slot) = self.slot(session, index);
        // In the store's own buffer where it holds one (a fold's overlay, the row written
        // by an earlier record of its chunk): a row that takes the entry at its end gets
        // it there. A store that holds none (the writer's, which stages its commands)
        // answers without a lookup, and the row is copied and written back.
        let mut placed = false;
        store.update_in_place(self.table, &key, &mut |row| {
            placed = slot > 0 && self.held(row) == Some(slot);
            if placed {
                row.extend_from_slice(entry);
            }
            Ok(placed)
        })?;
        if placed {
            return Ok(Ok(()));
        }
        let mut row = store.get(self.table, &key)?.unwrap_or_default();
        let Some(held) = self.held(&row) else {
            return Ok(Err(Misplaced::BadRow(row.len())));
        };
        if held > slot {
            return Ok(Err(Misplaced::Repeated));
        }
        let before_full = |store: &S| -> Result<bool> {
            let before = store.get(self.table, &self.key(session, index / self.per_row - 1))?;
            Ok(before.is_some_and(|b| self.held(&b) == Some(self.per_row)))
        };
        if held < slot || (slot == 0 && index > 0 && !before_full(store)?) {
            return Ok(Err(Misplaced::Gap));
        }
        row.extend_from_slice(entry);
        store.put_vec(self.table, &key, row)?;
        Ok(Ok(()))
    }

    /// The number of entries of `session`'s list, found in O(log n) row lookups: the
    /// last row is the last key present from 0 (the rows are dense), and it says how many
    /// entries it holds.
    pub fn len<S: Store + ?Sized>(&self, store: &S, session: &SessionId) -> Result<u64> {
        let row = |r: u64| store.get(self.table, &self.key(session, r));
        if row(0)?.is_none() {
            return Ok(0);
        }
        let (mut lo, mut hi) = (0u64, 1u64);
        while row(hi)?.is_some() && hi < u64::MAX / 2 {
            lo = hi;
            hi *= 2;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if row(mid)?.is_some() {
                lo = mid
            } else {
                hi = mid
            }
        }
        let bad = |detail: &str| {
            Error::corrupt(
                Location::Projection { table: self.table.name(), key: crate::store::hex(&self.key(session, lo)) },
                detail.to_string(),
            )
        };
        let held = row(lo)?.and_then(|r| self.held(&r)).ok_or_else(|| bad("not whole entries"))?;
        self.first_index(lo).and_then(|n| n.checked_add(held)).ok_or_else(|| bad("a row past any list"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    const LIST: Packed = Packed { table: Table::StreamIndex, width: 2, per_row: 3 };

    #[test]
    fn entries_append_densely_across_rows_and_anything_else_is_misplaced() {
        appends_densely(&mut MemStore::default());
        // An overlay with no command staged appends in the buffer it holds the row in.
        let base = MemStore::default();
        let mut overlay = crate::store::Overlay::new(&base);
        appends_densely(&mut overlay);
        let mut in_place = false;
        overlay
            .update_in_place(LIST.table, &LIST.key(&SessionId([1; 16]), 0), &mut |_| {
                in_place = true;
                Ok(false)
            })
            .unwrap();
        assert!(in_place, "the overlay holds its rows in buffers of its own");
        // Staged, it copies them, and a discarded command leaves the rows as they were.
        let s = SessionId([3; 16]);
        LIST.append(&mut overlay, &s, 0, &[1, 1]).unwrap().unwrap();
        overlay.stage();
        LIST.append(&mut overlay, &s, 1, &[2, 2]).unwrap().unwrap();
        overlay.discard();
        assert_eq!(overlay.get(LIST.table, &LIST.key(&s, 0)).unwrap(), Some(vec![1, 1]));
    }

    fn appends_densely<S: Store>(store: &mut S) {
        let (s, other) = (SessionId([1; 16]), SessionId([2; 16]));
        for i in 0..10u64 {
            assert_eq!(LIST.len(store, &s).unwrap(), i);
            assert_eq!(LIST.append(store, &s, i + 1, &[9, 9]).unwrap(), Err(Misplaced::Gap), "{i}");
            LIST.append(store, &s, i, &[i as u8, 0]).unwrap().unwrap();
            assert_eq!(LIST.append(store, &s, i, &[9, 9]).unwrap(), Err(Misplaced::Repeated), "{i}");
            LIST.append(store, &other, i / 2, &[0, 0]).ok();
        }
        assert_eq!(LIST.len(store, &s).unwrap(), 10);
        let rows: Vec<Vec<u8>> = (0..4).map(|r| store.get(LIST.table, &LIST.key(&s, r)).unwrap().unwrap()).collect();
        assert_eq!(rows[0], [0, 0, 1, 0, 2, 0]);
        assert_eq!(rows[3], [9, 0]);
        assert_eq!(LIST.entries(&rows[1]).unwrap().map(|e| e[0]).collect::<Vec<_>>(), [3, 4, 5]);
        // A row that is not whole entries is refused by readers and appends alike.
        for bad in [&[][..], &[1][..], &[0; 8][..]] {
            assert!(LIST.entries(bad).is_none(), "{bad:?}");
        }
        store.put(LIST.table, &LIST.key(&s, 3), &[1, 2, 3]).unwrap();
        assert_eq!(LIST.append(store, &s, 10, &[0, 0]).unwrap(), Err(Misplaced::BadRow(3)));
        assert_eq!(store.get(LIST.table, &LIST.key(&s, 3)).unwrap(), Some(vec![1, 2, 3]), "nothing appended");
        assert!(LIST.len(store, &s).is_err());
        // A new row before the last one is full is a gap.
        let s = SessionId([4; 16]);
        LIST.append(store, &s, 0, &[0, 0]).unwrap().unwrap();
        store.put(LIST.table, &LIST.key(&s, 1), &[]).unwrap();
        assert_eq!(LIST.append(store, &s, 3, &[0, 0]).unwrap(), Err(Misplaced::Gap));
    }
}
