//! Online content collection: removing, beside a live host, the content objects that no
//! record of a session that is not purged reaches (`docs/design.md` §7f).
//!
//! [`crate::Engine::collect_garbage`] runs it in two phases:
//!
//! 1. **Mark**, on the caller's thread, on a snapshot at the tip `T`: every record up to
//!    `T` that is not erased names the objects it reaches (a message object also reaches
//!    its attachments, read from the object). Commits go on meanwhile.
//! 2. **Sweep**, in batches, each one a request to the writer, so no commit interleaves
//!    with it: the writer first marks what the records committed since the last batch
//!    reach (a commit may reach an old object again through deduplication), then
//!    rewrites up to `rows` content rows at or below `T` without the objects nothing
//!    marked, in one durable transaction that also adds to `meta.erased` and sets the
//!    `content_collecting` mark; then the fold forgets those objects in the content-id
//!    index (`evolve::content_collected`), so a later command that brings the
//!    same bytes stores them again.
//!
//! At the end the writer checkpoints the delta, commits the projections file durably,
//! and clears the mark. A crash before that leaves the mark; the next open then folds
//! the content projection again from the log (whose rows no longer hold what was
//! removed) before anything else.
//!
//! Unlike a purge, a collection does not rewrite the files: the rows it removes leave
//! free pages that redb reuses, and the old bytes stay in them until it does. Erasure
//! that must leave no trace is [`crate::purge()`]'s job.

use crate::delta::View;
use crate::error::{Error, Location, Result};
use crate::pieces::ContentWriter;
use crate::tables::{meta_keys, META};
use annal_codec::{decode_record, message_attachments, ContentId};
use std::collections::HashSet;

/// What an online collection did ([`crate::Engine::collect_garbage`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CollectReport {
    /// The log tip the mark phase started from: rows introduced after it were not swept.
    pub through_seq: u64,
    /// Objects found reachable (at the end, counting what later commits reached).
    pub reachable: u64,
    /// Content rows read by the sweep.
    pub rows_swept: u64,
    /// Content rows rewritten (or removed, when nothing in them was reachable).
    pub rows_rewritten: u64,
    /// Objects removed.
    pub objects_removed: u64,
    /// Their stored bytes.
    pub bytes_removed: u64,
    /// Sweep batches (writer requests).
    pub batches: u64,
}

/// The reachable set, and how far the log has been read into it.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    reached: HashSet<ContentId>,
    /// The message objects whose attachments were added.
    messages: HashSet<ContentId>,
    /// The last seq read.
    pub(crate) through: u64,
}

impl Marks {
    /// Marks what the records after `self.through` up to `to` reach, reading them and
    /// the message objects through `view` (which must hold seq `to`).
    pub(crate) fn read(&mut self, view: &View, to: u64, record_max: u64, object_max: u64) -> Result<()> {
        if to <= self.through {
            return Ok(());
        }
        let mut new_messages = Vec::new();
        for seq in self.through + 1..=to {
            let bytes = view.raw_record(seq)?.ok_or_else(|| Error::corrupt(Location::Log { seq }, "missing record"))?;
            let record = decode_record(&bytes, record_max).map_err(|source| Error::Decode { seq, source })?.record;
            let mut messages = HashSet::new();
            let mut others = HashSet::new();
            crate::purge::collect_refs(&record.event, &mut messages, &mut others);
            self.reached.extend(others);
            for m in messages {
                self.reached.insert(m);
                if self.messages.insert(m) {
                    new_messages.push(m);
                }
            }
        }
        for id in new_messages {
            let Some(bytes) = view.content(&id, object_max)? else {
                return Err(Error::corrupt(
                    Location::Content { id: id.to_hex() },
                    "a record refers to it, it is not stored",
                ));
            };
            if let Ok(attachments) = message_attachments(&bytes, object_max) {
                self.reached.extend(attachments);
            }
        }
        self.through = to;
        Ok(())
    }

    /// Objects marked.
    pub(crate) fn len(&self) -> u64 {
        self.reached.len() as u64
    }
}

/// One sweep batch, as the writer runs it on an idle log.
pub(crate) struct Sweep {
    /// The first content row (by seq) to read.
    pub from: u64,
    /// The last row the collection sweeps (the mark phase's tip).
    pub through: u64,
    /// Rows to read in this batch at most.
    pub rows: usize,
}

/// What a sweep batch did.
#[derive(Debug, Default)]
pub(crate) struct Swept {
    /// Where the next batch starts, if any row is left.
    pub next: Option<u64>,
    /// The objects removed, each with the seq of the row it was in.
    pub removed: Vec<(ContentId, u64)>,
    pub rows_read: u64,
    pub rows_rewritten: u64,
    pub bytes: u64,
}

/// Rewrites the rows of one batch in `txn` without the objects `marks` does not hold.
pub(crate) fn sweep_rows(txn: &redb::WriteTransaction, marks: &Marks, sweep: &Sweep, object_max: u64) -> Result<Swept> {
    let mut out = Swept::default();
    let mut content = ContentWriter::open(txn)?;
    let mut rewrites: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut last = None;
    for item in content.range(sweep.from..=sweep.through)?.take(sweep.rows.max(1)) {
        let (seq, row) = item?;
        last = Some(seq);
        out.rows_read += 1;
        if let Some((row, removed, bytes)) =
            crate::purge::filter_row(seq, &row, object_max, |id| marks.reached.contains(id))?
        {
            out.removed.extend(removed.into_iter().map(|id| (id, seq)));
            out.bytes += bytes;
            rewrites.push((seq, row));
        }
    }
    for (seq, row) in &rewrites {
        content.put(*seq, row)?;
    }
    out.rows_rewritten = rewrites.len() as u64;
    out.next = match last {
        Some(seq) if seq < sweep.through => Some(seq + 1),
        _ => None,
    };
    if !out.removed.is_empty() {
        let reclaimed =
            crate::purge::Reclaimed { objects: out.removed.len() as u64, bytes: out.bytes, ..Default::default() };
        reclaimed.add_to(txn)?;
        txn.open_table(META)?.insert(meta_keys::CONTENT_COLLECTING, [1u8].as_slice())?;
    }
    Ok(out)
}

/// Whether a snapshot of a log file holds the mark of a collection that has not
/// finished (its index removals may not be in the projections file).
pub(crate) fn collecting_in(txn: &redb::ReadTransaction) -> bool {
    let Ok(meta) = txn.open_table(META) else { return false };
    matches!(meta.get(meta_keys::CONTENT_COLLECTING), Ok(Some(_)))
}

/// Clears the mark (after the projections file holds every removal durably).
pub(crate) fn clear_mark(log: &redb::Database) -> Result<()> {
    let mut txn = log.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    txn.open_table(META)?.remove(meta_keys::CONTENT_COLLECTING)?;
    txn.commit()?;
    Ok(())
}

/// Makes every earlier commit of the projections file durable.
pub(crate) fn sync_projections(projections: &redb::Database) -> Result<()> {
    let mut txn = projections.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    txn.commit()?;
    Ok(())
}
