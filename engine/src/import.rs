//! Import: records exported from another database (for example by `annal export`),
//! appended exactly as they are, through the log's one appender, and folded by the same
//! `evolve`. Runs on the writer with the log to itself.

use crate::error::{Error, Limit, Rejection, Result};
use crate::evolve::evolve;
use crate::limits::Limits;
use crate::log::{Entry, Staged, StoredObject, Tip};
use crate::projection::ProjectionSet;
use crate::store::{Overlay, Store};
use crate::writer::{append, next_stream_seq, Shared};
use annal_codec::{ContentId, Record};
use redb::ReadableDatabase;
use std::collections::BTreeMap;

/// What an import appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportStats {
    /// Records appended.
    pub records: u64,
    /// New content objects stored.
    pub content_objects: u64,
    /// The log tip after the import.
    pub tip_seq: u64,
}

/// Objects offered with their stored form already made (encoding, stored bytes), by id:
/// what a shared log's message carries, so that its fold stores them as they came
/// instead of compressing them again.
pub(crate) type StoredForms = BTreeMap<ContentId, (u8, Vec<u8>)>;

/// The content a foreign record may bring: the objects by id, the stored forms made
/// already for some of them, and how to store the others.
#[derive(Clone, Copy)]
pub(crate) struct Offered<'a> {
    pub objects: &'a BTreeMap<ContentId, Vec<u8>>,
    pub stored: &'a StoredForms,
    pub compression: annal_codec::content::Compression,
}

fn import_error(seq: u64, reason: impl Into<String>) -> Error {
    Error::Rejected(Rejection::InvalidImport { seq, reason: reason.into() })
}

/// Appends exported records as they are, in one transaction: same seqs, stream seqs,
/// timestamps and so the same chain (under this database's key). Each record must follow
/// the tip densely, keep the clock monotonic, refer only to content it brings or that is
/// stored, and fold cleanly (the fold recomputes every `revision_after`). All or nothing.
pub(crate) fn import(
    shared: &Shared,
    tip: &mut Tip,
    records: Vec<Record>,
    content: Vec<Vec<u8>>,
) -> Result<ImportStats> {
    crate::writer::alone_on_the_log(shared, "import", || import_txn(shared, tip, records, content))
}

fn import_txn(shared: &Shared, tip: &mut Tip, records: Vec<Record>, content: Vec<Vec<u8>>) -> Result<ImportStats> {
    let limits = &shared.limits;
    let offered: BTreeMap<ContentId, Vec<u8>> =
        content.into_iter().map(|bytes| (annal_codec::content_id(&bytes), bytes)).collect();
    let view = shared.delta.view();
    let mut overlay = Overlay::new(&view);
    let mut entries = Vec::with_capacity(records.len());
    let mut expected = *tip;
    let mut stored_objects = 0u64;
    for record in records {
        let seq = record.seq;
        if seq != expected.seq + 1 {
            return Err(import_error(seq, format!("expected seq {}", expected.seq + 1)));
        }
        if record.committed_at_ms < expected.clock_ms {
            return Err(import_error(seq, "committed_at goes back in time"));
        }
        let next_stream = next_stream_seq(&overlay, &record.session)?;
        if record.stream_seq != next_stream {
            return Err(import_error(seq, format!("expected stream seq {next_stream}")));
        }
        let clock_ms = record.committed_at_ms;
        let offer = Offered { objects: &offered, stored: &StoredForms::new(), compression: shared.compression };
        let entry = fold_foreign(&mut overlay, Staged([&entries, &[]]), offer, record, seq, limits)?;
        stored_objects += entry.content.len() as u64;
        expected = Tip { seq, hash: expected.hash, clock_ms };
        entries.push(entry);
    }
    if entries.is_empty() {
        return Ok(ImportStats { records: 0, content_objects: 0, tip_seq: tip.seq });
    }
    let writes = overlay.into_writes();
    drop(view);
    let events = entries.len() as u64;
    *tip = append(shared, *tip, &entries, &Default::default())?;
    shared.delta.apply(writes, tip.seq, tip.hash, events, crate::delta::LogUpdate::File(shared.log_db.begin_read()?));
    Ok(ImportStats { records: events, content_objects: stored_objects, tip_seq: tip.seq })
}

/// Checks a record that comes from another database and folds it into `store`: a
/// turn's commit hash must recompute, every content object it refers to must be stored
/// or offered (the offered ones it is the first to refer to become its content row, in
/// the stored form the offer gives, or else stored as its compression makes them), and
/// `evolve` must accept it. Any failure but a storage error is
/// [`Rejection::InvalidImport`] at `source_seq`, the record's seq in the export.
pub(crate) fn fold_foreign<S: Store + ?Sized>(
    store: &mut S,
    staged: Staged<'_>,
    offered: Offered<'_>,
    record: Record,
    source_seq: u64,
    limits: &Limits,
) -> Result<Entry> {
    let invalid = |e: Error| match e {
        Error::Storage(s) => Error::Storage(s),
        Error::Corrupt { detail, .. } => import_error(source_seq, detail),
        Error::Rejected(Rejection::InvalidRequest { reason }) => import_error(source_seq, reason),
        other => import_error(source_seq, other.to_string()),
    };
    if let annal_codec::Event::TurnCommitted(e) = &record.event {
        if e.recomputed_hash() != e.commit_hash {
            return Err(import_error(source_seq, "commit hash does not recompute"));
        }
    }
    let mut introduced = Vec::new();
    for id in record.event.content_refs() {
        take_offered(offered, &*store, staged, &id, limits, &mut introduced).map_err(invalid)?;
    }
    introduced.sort_by_key(|o| o.id);
    let ids: Vec<ContentId> = introduced.iter().map(|o| o.id).collect();
    // The batch's records are in no view yet: a rewrite's fold reads their lists.
    evolve(&mut crate::store::WithRecords::write(store, &staged), &record, &ids, ProjectionSet::all())
        .map_err(invalid)?;
    Ok(Entry { record, content: introduced })
}

/// Makes sure content `id` is stored, taking it from `offered` if it is neither stored
/// nor already taken; message objects bring their attachments along.
fn take_offered<S: Store + ?Sized>(
    offered: Offered<'_>,
    store: &S,
    staged: Staged<'_>,
    id: &ContentId,
    limits: &Limits,
    taken: &mut Vec<StoredObject>,
) -> Result<()> {
    if taken.iter().any(|t| t.id == *id) || crate::buckets::content_is_stored(store, id, &|seq| staged.holds(seq, id))?
    {
        return Ok(());
    }
    let bytes = offered.objects.get(id).ok_or_else(|| {
        Error::Rejected(Rejection::InvalidRequest { reason: format!("content {id} is neither offered nor stored") })
    })?;
    // An imported object is stored as it is: bounded by the largest object a command could
    // have stored (a message object with its body at `content_bytes_max`).
    let size = bytes.len() as u64;
    if size > limits.message_object_bytes_max() {
        let rejection = Rejection::LimitExceeded {
            limit: Limit::ContentBytes,
            actual: size,
            max: limits.message_object_bytes_max(),
        };
        return Err(Error::Rejected(rejection));
    }
    taken.push(match offered.stored.get(id) {
        Some((encoding, form)) => StoredObject { id: *id, encoding: *encoding, bytes: form.clone() },
        None => StoredObject::encoded(*id, bytes, offered.compression),
    });
    if let Ok(attachments) = annal_codec::message_attachments(bytes, limits.message_object_bytes_max()) {
        for a in &attachments {
            take_offered(offered, store, staged, a, limits, taken)?;
        }
    }
    Ok(())
}
