//! A demo database whose rows are tampered with through redb (records replaced, flipped
//! or removed; content objects, `session_log` entries and meta values changed), then
//! checked by `annal verify --deep`'s own function. Verification must report, never
//! panic and never hang, whatever the rows hold; the untampered file must verify clean.

#![no_main]

use annal::tables::{CONTENT, LOG, META, SESSION_LOG};
use annal::Limits;
use annal_replay::verify::{verify_snapshot, VerifyOptions};
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use redb::{ReadableDatabase, ReadableTable, StorageBackend};
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
    /// Replace a content object's bytes.
    SetContent { at: u16, bytes: Vec<u8> },
    /// Remove a content object.
    RemoveContent { at: u16 },
    /// Point a `session_log` entry somewhere else.
    SetIndex { at: u16, seq: u64 },
    /// Remove a `session_log` entry.
    RemoveIndex { at: u16 },
    /// Replace a meta value.
    SetMeta { at: u8, bytes: Vec<u8> },
}

/// The pristine demo database.
fn sample() -> &'static [u8] {
    static SAMPLE: OnceLock<Vec<u8>> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("demo.redb");
        let opts = annal_replay::demo::DemoOptions { db: Some(path.clone()), sessions: 1, progress: false };
        annal_replay::demo::demo(&opts).expect("demo");
        std::fs::read(&path).expect("read demo")
    })
}

/// The element `at` picks, modulo the length.
fn pick<T: Copy>(items: &[T], at: u16) -> Option<T> {
    (!items.is_empty()).then(|| items[at as usize % items.len()])
}

fn tamper(db: &redb::Database, tampers: &[Tamper]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut log = txn.open_table(LOG)?;
        let mut content = txn.open_table(CONTENT)?;
        let mut index = txn.open_table(SESSION_LOG)?;
        let mut meta = txn.open_table(META)?;
        // The keys as they were: a tamper may pick a key an earlier one removed.
        let seqs: Vec<u64> = log.iter()?.filter_map(Result::ok).map(|(k, _)| k.value()).collect();
        let ids: Vec<[u8; 32]> = content.iter()?.filter_map(Result::ok).map(|(k, _)| k.value()).collect();
        let entries: Vec<([u8; 16], u64)> = index.iter()?.filter_map(Result::ok).map(|(k, _)| k.value()).collect();
        let names: Vec<String> = meta.iter()?.filter_map(Result::ok).map(|(k, _)| k.value().to_string()).collect();
        for t in tampers.iter().take(8) {
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
                Tamper::SetContent { at, bytes } => {
                    if let Some(id) = pick(&ids, *at) {
                        content.insert(id, bytes.as_slice())?;
                    }
                }
                Tamper::RemoveContent { at } => {
                    if let Some(id) = pick(&ids, *at) {
                        content.remove(id)?;
                    }
                }
                Tamper::SetIndex { at, seq } => {
                    if let Some(k) = pick(&entries, *at) {
                        index.insert(k, *seq)?;
                    }
                }
                Tamper::RemoveIndex { at } => {
                    if let Some(k) = pick(&entries, *at) {
                        index.remove(k)?;
                    }
                }
                Tamper::SetMeta { at, bytes } => {
                    if !names.is_empty() {
                        meta.insert(names[*at as usize % names.len()].as_str(), bytes.as_slice())?;
                    }
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}

fuzz_target!(|tampers: Vec<Tamper>| {
    let bytes = sample();
    let backend = redb::backends::InMemoryBackend::new();
    backend.set_len(bytes.len() as u64).expect("set_len");
    backend.write(0, bytes).expect("write");
    let db = redb::Database::builder().create_with_backend(backend).expect("open the sample");
    tamper(&db, &tampers).expect("tamper");
    let txn = db.begin_read().expect("read");
    let opts = VerifyOptions { deep: true, ..VerifyOptions::default() };
    match verify_snapshot(&txn, &Limits::default(), &opts) {
        Ok(report) => {
            if tampers.is_empty() {
                assert!(report.is_clean(), "the untampered demo verifies clean: {}", report.render());
            }
            let _ = report.render();
            let _ = report.to_json();
        }
        // A meta table that no longer names the chain key the same way: a usage error.
        Err(_) => {}
    }
});
