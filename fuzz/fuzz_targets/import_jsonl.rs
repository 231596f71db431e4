//! Arbitrary bytes as a JSON Lines export: `annal_replay::export::parse_import`, then the
//! engine's all-or-nothing `Engine::import` into a fresh database whose log and
//! projections files are two in-memory backends. Neither may panic. A failed import
//! leaves the database empty. A successful one leaves a log that verifies page by page
//! and holds exactly the imported records; every content object a record refers to reads
//! back from the content rows the import wrote (checked against its id); a checkpoint
//! changes no projection; the engine, closed and reopened on the same two backends, has
//! the same tip and projections; and a rebuild reproduces them.

#![no_main]

use annal::fault::SharedMemory;
use annal::{Durability, Engine, Error, EventQuery, Options, ProjectionSet};
use libfuzzer_sys::fuzz_target;

fn options() -> Options {
    Options { durability: Durability::Relaxed, cache_bytes: 1 << 20, ..Options::default() }
}

fuzz_target!(|data: &[u8]| {
    let Ok(parsed) = annal_replay::export::parse_import(&mut &data[..]) else {
        return;
    };
    let (log, projections) = (SharedMemory::new(), SharedMemory::new());
    let engine = Engine::open_with_backends(log.clone(), projections.clone(), options()).expect("open in memory");
    let empty = engine.projection_digests().expect("digests");
    let count = parsed.records.len() as u64;
    match engine.import(parsed.records.clone(), parsed.content) {
        Ok(stats) => {
            assert_eq!(stats.records, count);
            let tip = engine.tip().expect("tip").0;
            assert_eq!(tip, stats.tip_seq);
            let page = engine
                .events(EventQuery { from_seq: 1, max_events: 10_000, max_bytes: 64 << 20 })
                .expect("an imported log verifies");
            let records: Vec<_> = page.events.into_iter().map(|e| e.record).collect();
            assert_eq!(records, parsed.records, "the log holds exactly the imported records");
            for record in &records {
                for id in record.event.content_refs() {
                    let bytes =
                        engine.content(id).expect("stored content reads back").expect("referred content is stored");
                    assert_eq!(annal::codec::content_id(&bytes), id, "content reads back as its id");
                }
            }
            let live = engine.projection_digests().expect("digests");
            engine.checkpoint().expect("checkpoint");
            assert_eq!(engine.projection_digests().expect("digests"), live, "a checkpoint changes no row");
            engine.close().expect("close");
            let engine =
                Engine::open_with_backends(log.clone(), projections.clone(), options()).expect("reopen in memory");
            assert_eq!(engine.tip().expect("tip").0, tip, "reopened: the same tip");
            assert_eq!(engine.projection_digests().expect("digests"), live, "reopened: the same projections");
            engine.rebuild(ProjectionSet::all()).expect("rebuild");
            assert_eq!(engine.projection_digests().expect("digests"), live, "rebuild reproduces the import");
            engine.close().expect("close");
        }
        Err(Error::Rejected(_)) => {
            assert_eq!(engine.tip().expect("tip").0, 0, "a rejected import writes nothing");
            assert_eq!(engine.projection_digests().expect("digests"), empty, "a rejected import changes nothing");
            engine.close().expect("close");
        }
        Err(e) => panic!("import failed with a non-rejection: {e:?}"),
    }
});
