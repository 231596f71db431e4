//! A demo database whose rows are tampered with through redb (log records replaced,
//! flipped, removed or added; content rows, read and rewritten through their pieces,
//! replaced, flipped, removed, added at any seq, or an object moved to another row; one
//! piece written at any index; a whole row of an earlier format added; the ids listed
//! for a content row changed, added at any seq or removed; meta
//! values changed; projection rows changed or removed in the projections file), then
//! checked by `annal verify --deep`'s own function on the two files. Verification must
//! report, never panic and never hang, whatever the rows hold; the untampered files must
//! verify clean, with every projection table compared.

#![no_main]

use annal::codec::content::entries;
use annal::fault::SharedMemory;
use annal::pieces::{PIECES, PIECE_BYTES};
use annal::tables::{CONTENT, CONTENT_IDS, LOG, META, PROJECTIONS};
use annal_replay::verify::{verify, VerifyOptions};
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use redb::{ReadableTable, StorageBackend};
use std::path::Path;
use std::sync::OnceLock;

#[derive(Arbitrary, Debug)]
enum Tamper {
    /// Replace a log record (chosen modulo the log length) with these bytes.
    SetRecord { at: u16, bytes: Vec<u8> },
    /// Flip one bit of a log record.
    FlipRecord { at: u16, offset: u16, bit: u8 },
    /// Remove a log record.
    RemoveRecord { at: u16 },
    /// Add a record past the end.
    AppendRecord { gap: u8, bytes: Vec<u8> },
    /// Replace a content row's bytes.
    SetContentRow { at: u16, bytes: Vec<u8> },
    /// Flip one bit of a content row (its ids, lengths or bytes).
    FlipContentRow { at: u16, offset: u16, bit: u8 },
    /// Remove a content row.
    RemoveContentRow { at: u16 },
    /// Add a content row at a seq up to a few past the tip, with or without a record.
    InsertContentRow { seq: u8, bytes: Vec<u8> },
    /// Move the first object of one content row to the end of another row (at the seq
    /// of a record), so it may be introduced after its first reference, or twice.
    MoveObject { from: u16, to: u16, keep: bool },
    /// Write one piece of a content row at any piece index (a gap, an empty piece, a
    /// row made longer), whatever the row's other pieces.
    SetPiece { at: u16, piece: u8, bytes: Vec<u8> },
    /// Write a content row whole, as a file of an earlier format holds it: beside the
    /// pieces of the same seq, or at a seq that has none.
    WholeContentRow { seq: u8, bytes: Vec<u8> },
    /// Write the ids listed for a content row at a seq up to a few past the tip (other
    /// ids, none, bytes that are no list of ids, a listing without a row).
    SetContentIds { seq: u8, bytes: Vec<u8> },
    /// Remove the ids listed for a content row.
    RemoveContentIds { at: u16 },
    /// Replace a meta value.
    SetMeta { at: u8, bytes: Vec<u8> },
    /// Replace a projection row's value in the projections file.
    SetProjection { at: u16, bytes: Vec<u8> },
    /// Remove a projection row.
    RemoveProjection { at: u16 },
}

/// The pristine demo database: the log file and the projections file.
struct Sample {
    log: Vec<u8>,
    projections: Vec<u8>,
}

fn sample() -> &'static Sample {
    static SAMPLE: OnceLock<Sample> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("demo.redb");
        let opts = annal_replay::demo::DemoOptions { db: Some(path.clone()), sessions: 1, progress: false };
        annal_replay::demo::demo(&opts).expect("demo");
        Sample {
            log: std::fs::read(&path).expect("read demo"),
            projections: std::fs::read(annal::projections_path(&path)).expect("read demo projections"),
        }
    })
}

/// Opens `bytes` in memory, lets `f` change it through redb, and writes the result to
/// `path` (no fsync: the file only has to outlive this run).
fn edit_file(
    bytes: &[u8],
    path: &Path,
    f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
) -> Result<(), redb::Error> {
    let backend = SharedMemory::new();
    backend.set_len(bytes.len() as u64).expect("set_len");
    backend.write(0, bytes).expect("write");
    {
        let db = redb::Database::builder().create_with_backend(backend.clone())?;
        let txn = db.begin_write()?;
        f(&txn)?;
        txn.commit()?;
    }
    let mut out = vec![0u8; backend.len().expect("len") as usize];
    backend.read(0, &mut out).expect("read");
    std::fs::write(path, out).expect("write the file");
    Ok(())
}

/// The element `at` picks, modulo the length.
fn pick<T: Copy>(items: &[T], at: u16) -> Option<T> {
    (!items.is_empty()).then(|| items[at as usize % items.len()])
}

/// The raw entries of a content row (id, encoding and length included), as far as it
/// parses.
fn raw_entries(row: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = row;
    for entry in entries(row, u64::MAX).map_while(Result::ok) {
        let len = annal::codec::content::ENTRY_HEADER_LEN + entry.stored.len();
        out.push(rest[..len].to_vec());
        rest = &rest[len..];
    }
    out
}

/// The content pieces of a log file: (seq, piece) → bytes.
type Pieces<'txn> = redb::Table<'txn, (u64, u32), &'static [u8]>;

/// The content row of `seq`: its pieces in key order, concatenated (empty if it has none).
fn get_row(pieces: &Pieces, seq: u64) -> Result<Vec<u8>, redb::Error> {
    let mut row = Vec::new();
    for piece in pieces.range((seq, 0)..=(seq, u32::MAX))? {
        row.extend_from_slice(piece?.1.value());
    }
    Ok(row)
}

/// Removes every piece of the row of `seq`.
fn remove_row(pieces: &mut Pieces, seq: u64) -> Result<(), redb::Error> {
    pieces.retain_in((seq, 0)..=(seq, u32::MAX), |_, _| false)?;
    Ok(())
}

/// Replaces the row of `seq` with `bytes`, cut into pieces as the engine cuts them; an
/// empty `bytes` is stored as one empty piece, so the row is there and empty.
fn put_row(pieces: &mut Pieces, seq: u64, bytes: &[u8]) -> Result<(), redb::Error> {
    remove_row(pieces, seq)?;
    if bytes.is_empty() {
        pieces.insert((seq, 0), bytes)?;
    }
    for (i, piece) in (0u32..).zip(bytes.chunks(PIECE_BYTES)) {
        pieces.insert((seq, i), piece)?;
    }
    Ok(())
}

fn tamper_log(txn: &redb::WriteTransaction, tampers: &[Tamper]) -> Result<(), redb::Error> {
    let mut log = txn.open_table(LOG)?;
    let mut content = txn.open_table(PIECES)?;
    let mut meta = txn.open_table(META)?;
    // The keys as they were: a tamper may pick a key an earlier one removed.
    let seqs: Vec<u64> = log.iter()?.filter_map(Result::ok).map(|(k, _)| k.value()).collect();
    let mut rows: Vec<u64> = content.iter()?.filter_map(Result::ok).map(|(k, _)| k.value().0).collect();
    rows.dedup();
    let names: Vec<String> = meta.iter()?.filter_map(Result::ok).map(|(k, _)| k.value().to_string()).collect();
    let tip = seqs.last().copied().unwrap_or(0);
    for t in tampers {
        match t {
            Tamper::SetRecord { at, bytes } => {
                if let Some(seq) = pick(&seqs, *at) {
                    log.insert(seq, bytes.as_slice())?;
                }
            }
            Tamper::FlipRecord { at, offset, bit } => {
                if let Some(seq) = pick(&seqs, *at) {
                    let mut bytes = log.get(seq)?.map(|g| g.value().to_vec()).unwrap_or_default();
                    if !bytes.is_empty() {
                        let i = *offset as usize % bytes.len();
                        bytes[i] ^= 1 << (bit % 8);
                        log.insert(seq, bytes.as_slice())?;
                    }
                }
            }
            Tamper::RemoveRecord { at } => {
                if let Some(seq) = pick(&seqs, *at) {
                    log.remove(seq)?;
                }
            }
            Tamper::AppendRecord { gap, bytes } => {
                let last = log.last()?.map_or(0, |(k, _)| k.value());
                log.insert(last + 1 + u64::from(*gap % 4), bytes.as_slice())?;
            }
            Tamper::SetContentRow { at, bytes } => {
                if let Some(seq) = pick(&rows, *at) {
                    put_row(&mut content, seq, bytes)?;
                }
            }
            Tamper::FlipContentRow { at, offset, bit } => {
                if let Some(seq) = pick(&rows, *at) {
                    let mut bytes = get_row(&content, seq)?;
                    if !bytes.is_empty() {
                        let i = *offset as usize % bytes.len();
                        bytes[i] ^= 1 << (bit % 8);
                        put_row(&mut content, seq, &bytes)?;
                    }
                }
            }
            Tamper::RemoveContentRow { at } => {
                if let Some(seq) = pick(&rows, *at) {
                    remove_row(&mut content, seq)?;
                }
            }
            Tamper::InsertContentRow { seq, bytes } => {
                put_row(&mut content, u64::from(*seq) % (tip + 4), bytes)?;
            }
            Tamper::MoveObject { from, to, keep } => {
                let (Some(from), Some(to)) = (pick(&rows, *from), pick(&seqs, *to)) else {
                    continue;
                };
                let source = get_row(&content, from)?;
                let mut objects = raw_entries(&source);
                if objects.is_empty() {
                    continue;
                }
                let moved = objects.remove(0);
                if !keep {
                    if objects.is_empty() {
                        remove_row(&mut content, from)?;
                    } else {
                        put_row(&mut content, from, &objects.concat())?;
                    }
                }
                let mut target = get_row(&content, to)?;
                target.extend_from_slice(&moved);
                put_row(&mut content, to, &target)?;
            }
            Tamper::SetPiece { at, piece, bytes } => {
                if let Some(seq) = pick(&rows, *at) {
                    content.insert((seq, u32::from(*piece % 8)), bytes.as_slice())?;
                }
            }
            Tamper::WholeContentRow { seq, bytes } => {
                txn.open_table(CONTENT)?.insert(u64::from(*seq) % (tip + 4), bytes.as_slice())?;
            }
            Tamper::SetContentIds { seq, bytes } => {
                txn.open_table(CONTENT_IDS)?.insert(u64::from(*seq) % (tip + 4), bytes.as_slice())?;
            }
            Tamper::RemoveContentIds { at } => {
                if let Some(seq) = pick(&rows, *at) {
                    txn.open_table(CONTENT_IDS)?.remove(seq)?;
                }
            }
            Tamper::SetMeta { at, bytes } => {
                if !names.is_empty() {
                    meta.insert(names[*at as usize % names.len()].as_str(), bytes.as_slice())?;
                }
            }
            Tamper::SetProjection { .. } | Tamper::RemoveProjection { .. } => {}
        }
    }
    Ok(())
}

fn tamper_projections(txn: &redb::WriteTransaction, tampers: &[Tamper]) -> Result<(), redb::Error> {
    let mut rows = txn.open_table(PROJECTIONS)?;
    let keys: Vec<Vec<u8>> = rows.iter()?.filter_map(Result::ok).map(|(k, _)| k.value().to_vec()).collect();
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    for t in tampers {
        match t {
            Tamper::SetProjection { at, bytes } => {
                if let Some(key) = pick(&keys, *at) {
                    rows.insert(key, bytes.as_slice())?;
                }
            }
            Tamper::RemoveProjection { at } => {
                if let Some(key) = pick(&keys, *at) {
                    rows.remove(key)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fuzz_target!(|tampers: Vec<Tamper>| {
    let tampers = &tampers[..tampers.len().min(8)];
    let sample = sample();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("demo.redb");
    edit_file(&sample.log, &path, |txn| tamper_log(txn, tampers)).expect("tamper the log");
    let projections = annal::projections_path(&path);
    edit_file(&sample.projections, &projections, |txn| tamper_projections(txn, tampers))
        .expect("tamper the projections");
    let opts = VerifyOptions { deep: true, ..VerifyOptions::default() };
    match verify(&path, &opts) {
        Ok(report) => {
            if tampers.is_empty() {
                assert!(report.is_clean(), "the untampered demo verifies clean: {}", report.render());
                assert_eq!(report.deep, Some(Ok(annal::Table::ALL.len())), "{}", report.render());
            }
            let _ = report.render();
            let _ = report.to_json();
        }
        // A meta table that no longer names the chain key or format the same way: a usage
        // error.
        Err(_) => {}
    }
});
