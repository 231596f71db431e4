//! Arbitrary bytes as a JSON Lines export: `annal_replay::export::parse_import`, then the
//! engine's all-or-nothing `Engine::import` into a fresh in-memory database. Neither may
//! panic. A failed import leaves the database empty; a successful one leaves a log that
//! verifies page by page, holds exactly the imported records, and rebuilds to the same
//! projections.

#![no_main]

use annal::{Durability, Engine, Error, EventQuery, Options, ProjectionSet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(parsed) = annal_replay::export::parse_import(&mut &data[..]) else {
        return;
    };
    let options = Options { durability: Durability::Relaxed, cache_bytes: 1 << 20, ..Options::default() };
    let engine = Engine::open_with_backend(redb::backends::InMemoryBackend::new(), options).expect("open in memory");
    let empty = engine.projection_digests().expect("digests");
    let count = parsed.records.len() as u64;
    match engine.import(parsed.records.clone(), parsed.content) {
        Ok(stats) => {
            assert_eq!(stats.records, count);
            assert_eq!(engine.tip().expect("tip").0, stats.tip_seq);
            let page = engine
                .events(EventQuery { from_seq: 1, max_events: 10_000, max_bytes: 64 << 20 })
                .expect("an imported log verifies");
            let records: Vec<_> = page.events.into_iter().map(|e| e.record).collect();
            assert_eq!(records, parsed.records, "the log holds exactly the imported records");
            let live = engine.projection_digests().expect("digests");
            engine.rebuild(ProjectionSet::all()).expect("rebuild");
            assert_eq!(engine.projection_digests().expect("digests"), live, "rebuild reproduces the import");
        }
        Err(Error::Rejected(_)) => {
            assert_eq!(engine.tip().expect("tip").0, 0, "a rejected import writes nothing");
            assert_eq!(engine.projection_digests().expect("digests"), empty, "a rejected import changes nothing");
        }
        Err(e) => panic!("import failed with a non-rejection: {e:?}"),
    }
    engine.close().expect("close");
});
