//! Dropping projections and folding them again from the log, with the same `evolve`.

use crate::error::{Error, Location, Result};
use crate::evolve::evolve;
use crate::projection::ProjectionSet;
use crate::store::Overlay;
use crate::tables::{self, RedbStore, LOG, META};
use annal_codec::{decode_record, verify_chain, LogChain};
use redb::{Durability, ReadableTable, WriteTransaction};
use std::time::{Duration, Instant};

/// What a rebuild did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebuildStats {
    /// Events folded.
    pub events: u64,
    /// Bytes of records read.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Called with (events done, events total) while a rebuild runs.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// Drops the projections in `set` and folds the whole log into them, in `txn`. The
/// chain of every record is verified on the way: a rebuild never folds tampered data.
pub fn rebuild_in(
    txn: &WriteTransaction,
    chain: &LogChain,
    record_bytes_max: u64,
    set: ProjectionSet,
    progress: Progress<'_>,
) -> Result<RebuildStats> {
    let started = Instant::now();
    tables::create_all(txn)?;
    if set == ProjectionSet::all() {
        txn.delete_table(tables::PROJECTIONS)?;
        tables::create_all(txn)?;
    } else {
        let doomed: Vec<crate::Table> = set.iter().flat_map(|p| p.tables().iter().copied()).collect();
        tables::clear_projection_tables(txn, &doomed)?;
    }
    let log = txn.open_table(LOG)?;
    let total = log.last()?.map_or(0, |(k, _)| k.value());
    let mut store = RedbStore::open(txn)?;
    let mut prev = chain.genesis();
    let (mut events, mut bytes) = (0u64, 0u64);
    // Fold through a write-back overlay and flush it in key order every
    // REBUILD_CHUNK_EVENTS events: hot rows (heads, tips) stay in memory and the B-trees
    // receive sorted inserts.
    let mut overlay = Overlay::new(&store);
    for entry in log.range(1..)? {
        let (k, v) = entry?;
        let seq = k.value();
        let raw = v.value();
        if seq != events + 1 {
            return Err(Error::corrupt(Location::Log { seq: events + 1 }, format!("gap: next record is {seq}")));
        }
        prev = verify_chain(raw, &prev, chain, seq).map_err(|source| Error::Decode { seq, source })?;
        let decoded = decode_record(raw, record_bytes_max).map_err(|source| Error::Decode { seq, source })?;
        if decoded.record.seq != seq {
            return Err(Error::corrupt(Location::Log { seq }, "record seq differs from its key"));
        }
        evolve(&mut overlay, &decoded.record, set)?;
        events += 1;
        bytes += raw.len() as u64;
        if events % REBUILD_CHUNK_EVENTS == 0 {
            let writes = overlay.into_writes();
            store.apply(writes)?;
            overlay = Overlay::new(&store);
            progress(events, total);
        }
    }
    let writes = overlay.into_writes();
    store.apply(writes)?;
    progress(events, total);
    drop(store);
    let mut meta = txn.open_table(META)?;
    for p in set.iter() {
        tables::write_projection_meta(&mut meta, p, events)?;
    }
    Ok(RebuildStats { events, bytes, elapsed: started.elapsed() })
}

/// Events folded between flushes of the rebuild's write-back overlay.
pub const REBUILD_CHUNK_EVENTS: u64 = 65_536;

/// Rebuilds `set` in one durable transaction on `db`. Readers keep seeing the old
/// projections until it commits.
pub fn rebuild_db(
    db: &redb::Database,
    chain: &LogChain,
    record_bytes_max: u64,
    set: ProjectionSet,
    progress: Progress<'_>,
) -> Result<RebuildStats> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let stats = rebuild_in(&txn, chain, record_bytes_max, set, progress)?;
    txn.commit()?;
    Ok(stats)
}
