//! Migration of files written by format 1, where the log file also held the projections,
//! a per-session index and content keyed by id.
//!
//! [`migrate`] rewrites such a file in place, in one durable transaction: every record
//! stays byte for byte (so the chain and every id stay the same), each content object
//! moves into the content row of the first record that refers to it (a message's
//! attachments with it), compressed where that pays, and the format-1 tables and
//! projection metadata are dropped.
//! The projections file is folded at the next open. An engine refuses a format-1 file
//! with [`crate::Error::MigrationRequired`], which names `annal migrate`.
//!
//! A file of format 2 to 5 opens as it is, and its first open for writing lists the ids
//! of the content rows written from then on ([`crate::tables::CONTENT_IDS`]). [`migrate`]
//! upgrades such a file too, and lists the ids of its earlier rows, so that a fold reads
//! none of its content rows.

use crate::error::{fail_closed, Error, Location, Result};
use crate::pieces::ContentWriter;
use crate::projection::Projection;
use crate::tables::{self, legacy, meta_keys, LOG, META};
use annal_codec::content::{encode_object, push_stored};
use annal_codec::{decode_record, message_attachments, verify_chain, ContentId, Event, LogChain};
use redb::{ReadableDatabase, ReadableTable};
use std::collections::HashSet;
use std::path::Path;

/// What a migration did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrateStats {
    /// The format found.
    pub from_format: u32,
    /// Records carried over (byte for byte).
    pub records: u64,
    /// Content objects moved into content rows.
    pub content_objects: u64,
    /// Content rows of a file of format 2 to 6 whose ids were listed beside them
    /// ([`crate::tables::CONTENT_IDS`]): those written before the file's listing began.
    pub content_rows_listed: u64,
}

/// Migrates the database at `path` to the current format, in place and all or nothing.
/// A file already in the current format is left alone. No other process may have it
/// open. `chain_key` is the key of a keyed chain: the migration verifies the chain of
/// every record it carries over.
pub fn migrate(path: impl AsRef<Path>, chain_key: Option<[u8; 32]>) -> Result<MigrateStats> {
    let path = path.as_ref();
    let chain = chain_key.map_or_else(LogChain::plain, LogChain::keyed);
    fail_closed("migrate", || {
        // Read-only first: an open for writing writes the file's header, and a
        // projections file named in place of its log must be left as it is.
        crate::log::refuse_projections_file(&crate::unclean::open_read_only(path, 1 << 20)?.begin_read()?)?;
        let db = redb::Database::open(path)?;
        let format = {
            let txn = db.begin_read()?;
            let meta = txn.open_table(META)?;
            let format = meta.get(meta_keys::FORMAT)?.and_then(|g| tables::meta_u64(g.value()));
            format.ok_or_else(|| Error::corrupt(Location::Meta { key: meta_keys::FORMAT.into() }, "no format"))?
        };
        match format {
            1 => migrate_v1(&db, &chain),
            f if tables::readable_format(f) => {
                crate::log::check_log(&db.begin_read()?, &chain)?;
                crate::log::upgrade_format(&db)?;
                let content_rows_listed = list_content_ids(&db)?;
                Ok(MigrateStats { from_format: f as u32, content_rows_listed, ..MigrateStats::default() })
            }
            f => Err(Error::UnsupportedFormat { found: f as u32, supported: tables::FORMAT }),
        }
    })
}

/// Seqs whose content rows one transaction of [`list_content_ids`] lists, so that what a
/// transaction dirties stays small whatever the file's length (the process's memory is
/// then redb's read cache: 440 MB while listing the 700,030 rows of the replay bench's
/// 1,000,000 events, in one transaction or in eight).
const LIST_TXN_SEQS: u64 = 1 << 17;

/// Lists the ids of every content row written before the file's listing began (the rows
/// of a file upgraded from format 5 or earlier), a range of seqs a durable transaction,
/// and with the last marks the listing whole: from then on a fold reads no content row
/// for its ids. Until then readers read those rows, so an interrupted run leaves a file
/// that reads as before, and running it again finishes the work. Returns the rows listed
/// (none if the listing was whole already).
fn list_content_ids(db: &redb::Database) -> Result<u64> {
    let from = crate::log::content_ids_from(&db.begin_read()?)?;
    if from <= 1 {
        return Ok(0);
    }
    let end = from.saturating_sub(1);
    let mut listed = 0;
    let mut lo = 0u64;
    loop {
        let hi = lo.saturating_add(LIST_TXN_SEQS - 1).min(end);
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        listed += ContentWriter::open(&txn)?.fill_ids(lo..=hi)?;
        if hi == end {
            txn.open_table(META)?.insert(meta_keys::CONTENT_IDS_FROM, 1u64.to_le_bytes().as_slice())?;
            txn.commit()?;
            return Ok(listed);
        }
        txn.commit()?;
        lo = hi + 1;
    }
}

/// Whether a reference of `event` is to a message object (which may have attachments).
fn message_refs(event: &Event) -> &[ContentId] {
    match event {
        Event::SessionCreated(e) => &e.messages,
        Event::TurnCommitted(e) => &e.messages,
        Event::TranscriptRewritten(e) => &e.replacement,
        _ => &[],
    }
}

fn migrate_v1(db: &redb::Database, chain: &LogChain) -> Result<MigrateStats> {
    let mut stats = MigrateStats { from_format: 1, ..MigrateStats::default() };
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    {
        let log = txn.open_table(LOG)?;
        let old = txn.open_table(legacy::CONTENT)?;
        let mut rows = ContentWriter::open(&txn)?;
        let mut seen: HashSet<ContentId> = HashSet::new();
        let mut prev = chain.genesis();
        let mut row = Vec::new();
        for entry in log.iter()? {
            let (k, v) = entry?;
            let seq = k.value();
            if seq != stats.records + 1 {
                return Err(Error::corrupt(Location::Log { seq: stats.records + 1 }, "gap in the log"));
            }
            prev = verify_chain(v.value(), &prev, chain, seq).map_err(|source| Error::Decode { seq, source })?;
            let record = decode_record(v.value(), u64::MAX).map_err(|source| Error::Decode { seq, source })?.record;
            row.clear();
            let mut objects = std::collections::BTreeMap::new();
            let messages = message_refs(&record.event);
            for id in record.event.content_refs() {
                let mut pending = vec![(id, messages.contains(&id))];
                while let Some((id, is_message)) = pending.pop() {
                    if !seen.insert(id) {
                        continue;
                    }
                    let guard = old.get(id.0)?.ok_or_else(|| {
                        Error::corrupt(Location::Content { id: id.to_hex() }, "missing content object")
                    })?;
                    let bytes = guard.value();
                    if annal_codec::content_id(bytes) != id {
                        return Err(Error::corrupt(
                            Location::Content { id: id.to_hex() },
                            "bytes do not hash to the id",
                        ));
                    }
                    objects.insert(id, encode_object(bytes));
                    stats.content_objects += 1;
                    if is_message {
                        if let Ok(attachments) = message_attachments(bytes, u64::MAX) {
                            pending.extend(attachments.iter().rev().map(|a| (*a, false)));
                        }
                    }
                }
            }
            for (id, (encoding, stored)) in &objects {
                push_stored(&mut row, id, *encoding, stored);
            }
            if !row.is_empty() {
                rows.append(seq, &row)?;
            }
            stats.records += 1;
        }
    }
    txn.delete_table(legacy::SESSION_LOG)?;
    txn.delete_table(legacy::CONTENT)?;
    txn.delete_table(legacy::PROJECTIONS)?;
    {
        let mut meta = txn.open_table(META)?;
        for p in Projection::ALL {
            meta.remove(meta_keys::version(p).as_str())?;
            meta.remove(meta_keys::cursor(p).as_str())?;
        }
        meta.insert(meta_keys::FORMAT, tables::FORMAT.to_le_bytes().as_slice())?;
        // Every row was written above, its ids listed with it.
        meta.insert(meta_keys::CONTENT_IDS_FROM, 1u64.to_le_bytes().as_slice())?;
    }
    txn.commit()?;
    Ok(stats)
}
