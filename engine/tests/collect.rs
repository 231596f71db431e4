//! Online content collection (`Engine::collect_garbage`): objects nothing reaches are
//! removed beside committers, objects a commit reaches again meanwhile stay, a removed
//! object brought again is stored again, and a collection a crash interrupted is
//! finished by the next open.

mod common;

use annal::codec::content::{encode_object, entries, push_stored};
use annal::codec::{content_id, encode_message, ContentId, MessageObject};
use annal::pieces::{ContentReader, ContentWriter};
use annal::tables::meta_keys;
use annal::{Engine, Message, ProjectionSet, Role};
use common::*;
use redb::ReadableDatabase;
use std::collections::BTreeSet;
use std::path::Path;

/// The message object the engine stores for `m` (no attachments).
fn object_of(m: &Message) -> Vec<u8> {
    let object =
        MessageObject { role: m.role, content_type: m.content_type.clone(), body: m.body.clone(), attachments: vec![] };
    encode_message(&object, u64::MAX).unwrap()
}

/// Leftover objects: messages no record refers to (as a hand-edited file or an
/// interrupted tool could leave them), with a text long enough to be compressed.
fn leftovers(n: usize) -> Vec<Message> {
    (0..n).map(|i| Message::user(format!("leftover {i}: {}", "a line of a tool log\n".repeat(8)))).collect()
}

/// Adds `objects` to the content row at `seq` through a raw handle (the engine closed)
/// and deletes the projections file, so the next open folds them into the index.
fn inject(path: &Path, seq: u64, objects: &[Vec<u8>]) {
    let raw = redb::Database::create(path).unwrap();
    let txn = raw.begin_write().unwrap();
    {
        let mut content = ContentWriter::open(&txn).unwrap();
        let mut row = content.get(seq).unwrap().unwrap_or_default();
        for o in objects {
            let (encoding, stored) = encode_object(o);
            push_stored(&mut row, &content_id(o), encoding, &stored);
        }
        content.put(seq, &row).unwrap();
    }
    txn.commit().unwrap();
    drop(raw);
    let _ = std::fs::remove_file(annal::projections_path(path));
}

/// Every object id the log file's content rows hold.
fn stored_ids(path: &Path) -> BTreeSet<ContentId> {
    let raw = redb::Database::create(path).unwrap();
    let txn = raw.begin_read().unwrap();
    let content = ContentReader::open(&txn).unwrap();
    let mut ids = BTreeSet::new();
    for item in content.iter().unwrap() {
        let (_, row) = item.unwrap();
        for e in entries(&row, u64::MAX) {
            ids.insert(e.unwrap().id);
        }
    }
    ids
}

fn equal_a_rebuild(engine: &Engine) {
    let digests = engine.projection_digests().unwrap();
    engine.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), digests, "projections equal a rebuild");
}

#[test]
fn online_collection_removes_only_what_nothing_reaches_while_commits_go_on() {
    let db = Db::new();
    let engine = db.open_durable();
    let sessions = workload(&engine);
    let (s, mut head) = create(&engine, &[Message::user("hello")]);
    head = commit_turns(&engine, s, "t", 20, head);
    engine.close().unwrap();
    let extra = leftovers(12);
    let objects: Vec<Vec<u8>> = extra.iter().map(object_of).collect();
    inject(&db.path, 1, &objects[..6]);
    inject(&db.path, 3, &objects[6..]);
    let before = stored_ids(&db.path);

    let engine = db.open_durable();
    // A committer brings the even leftovers back while the collection runs: each is
    // either kept (reached before its row was swept) or stored again.
    let committer = {
        let engine = engine.clone();
        let extra = extra.clone();
        std::thread::spawn(move || {
            for (i, m) in extra.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
                let turn =
                    annal::CommitTurn::new(s, format!("back-{i}"), annal::Expected::Exact(head)).message(m.clone());
                head = engine.commit_turn(turn).unwrap().receipt().revision;
            }
        })
    };
    let report = engine.collect_garbage(1).unwrap();
    committer.join().unwrap();
    assert!(report.batches >= 3, "one row per batch: {report:?}");
    assert!(report.objects_removed >= 6 && report.objects_removed <= 12, "{report:?}");

    // Every transcript reads whole (its objects are there and hash to their ids).
    for session in sessions.iter().chain([&s]) {
        transcript(engine.reader(), *session);
    }
    let back: Vec<ContentId> = transcript_ids(engine.reader(), s);
    for (i, m) in extra.iter().enumerate() {
        assert_eq!(back.contains(&message_id(m)), i % 2 == 0, "leftover {i} in the transcript");
    }
    // Bringing an odd one now stores it again.
    let revived = extra[1].clone();
    let h = head_of(&engine, s);
    engine
        .commit_turn(annal::CommitTurn::new(s, "revive", annal::Expected::Exact(h)).message(revived.clone()))
        .unwrap();
    assert_eq!(transcript(engine.reader(), s).last().unwrap().message.body, revived.body);
    equal_a_rebuild(&engine);
    let stats_objects = report.objects_removed;
    engine.close().unwrap();

    let after = stored_ids(&db.path);
    for (i, m) in extra.iter().enumerate() {
        let id = message_id(m);
        assert!(before.contains(&id));
        assert_eq!(after.contains(&id), i % 2 == 0 || i == 1, "leftover {i} stored after the collection");
    }
    // What was reclaimed is counted in the file.
    let raw = redb::Database::create(&db.path).unwrap();
    let txn = raw.begin_read().unwrap();
    let meta = txn.open_table(annal::tables::META).unwrap();
    let erased = meta.get(meta_keys::ERASED).unwrap().map(|g| annal::Reclaimed::decode(g.value()).unwrap()).unwrap();
    assert_eq!(erased.objects, stats_objects);
    assert!(meta.get(meta_keys::CONTENT_COLLECTING).unwrap().is_none(), "the mark is cleared");
    drop((meta, txn, raw));

    // A second collection finds nothing.
    let engine = db.open_durable();
    let again = engine.collect_garbage(64).unwrap();
    assert_eq!(again.objects_removed, 0);
    assert_eq!(again.rows_rewritten, 0);
    equal_a_rebuild(&engine);
}

fn head_of(engine: &Engine, s: annal::SessionId) -> annal::RevisionId {
    head(engine, s).revision
}

/// A crash after a sweep committed and before the index removals reached the
/// projections file: the next open folds the content projection again, so the removed
/// objects are not deduplicated against and a commit that brings one stores it again.
#[test]
fn an_interrupted_collection_is_finished_by_the_next_open() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, head) = create(&engine, &[Message::user("hello")]);
    commit_turns(&engine, s, "t", 3, head);
    engine.close().unwrap();
    let extra = leftovers(2);
    let objects: Vec<Vec<u8>> = extra.iter().map(object_of).collect();
    inject(&db.path, 2, &objects);
    // The open folds the leftovers into the index; the close checkpoints it.
    db.open_durable().close().unwrap();
    // What a sweep commits: the rows without the leftovers, the mark.
    {
        let raw = redb::Database::create(&db.path).unwrap();
        let txn = raw.begin_write().unwrap();
        {
            let mut content = ContentWriter::open(&txn).unwrap();
            let row = content.get(2).unwrap().unwrap();
            let mut kept = Vec::new();
            for e in entries(&row, u64::MAX) {
                let e = e.unwrap();
                if !objects.iter().any(|o| content_id(o) == e.id) {
                    push_stored(&mut kept, &e.id, e.encoding, e.stored);
                }
            }
            content.put(2, &kept).unwrap();
        }
        txn.open_table(annal::tables::META).unwrap().insert(meta_keys::CONTENT_COLLECTING, [1u8].as_slice()).unwrap();
        txn.commit().unwrap();
    }
    let engine = db.open_durable();
    let h = head_of(&engine, s);
    let turn = annal::CommitTurn::new(s, "back", annal::Expected::Exact(h)).message(extra[0].clone());
    engine.commit_turn(turn).unwrap();
    let last = transcript(engine.reader(), s).pop().unwrap();
    assert_eq!((last.message.role, &last.message.body), (Role::User, &extra[0].body));
    equal_a_rebuild(&engine);
    engine.close().unwrap();
    assert_eq!(common::meta_u64(&db.path, meta_keys::CONTENT_COLLECTING), None, "the open cleared the mark");
    assert!(stored_ids(&db.path).contains(&content_id(&objects[0])));
    assert!(!stored_ids(&db.path).contains(&content_id(&objects[1])));
}

/// `Engine::purge` closes, purges and reopens; it refuses while another handle is open.
#[test]
fn a_purge_through_the_engine_needs_its_last_handle() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, head) = create(&engine, &[Message::user("secret marker 7f3a")]);
    commit_turns(&engine, s, "t", 2, head);
    let (keep, _) = create(&engine, &[Message::user("kept")]);
    let other = engine.clone();
    let request = annal::PurgeRequest::new(s, "gdpr-art17", "dpo");
    let refused = engine.purge(&request).unwrap_err();
    assert!(matches!(refused, annal::Error::Rejected(annal::Rejection::InvalidRequest { .. })), "{refused:?}");
    // The engine is untouched: the other handle still works, and is now the last one.
    assert!(other.head(s).unwrap().is_some());
    let (engine, report) = other.purge(&request).unwrap();
    let report = report.unwrap();
    assert_eq!(report.purged.len(), 1);
    let seq = report.purged[0].1;
    assert_eq!(engine.head(s), Err(annal::Error::Rejected(annal::Rejection::Purged { session: s, seq })));
    assert!(engine.head(keep).unwrap().is_some());
    // A rejected purge gives the engine back, untouched.
    let (engine, again) = engine.purge(&request).unwrap();
    assert_eq!(again.unwrap_err(), annal::Error::Rejected(annal::Rejection::Purged { session: s, seq }));
    assert!(engine.head(keep).unwrap().is_some());
    engine.close().unwrap();
    let bytes = std::fs::read(&db.path).unwrap();
    assert!(!bytes.windows(17).any(|w| w == b"secret marker 7f3"), "the marker is gone from the log file");
}

#[test]
fn an_object_read_before_its_collection_is_not_read_after_it() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, head) = create(&engine, &[Message::user("hello")]);
    commit_turns(&engine, s, "t", 3, head);
    engine.close().unwrap();
    let objects: Vec<Vec<u8>> = leftovers(4).iter().map(object_of).collect();
    inject(&db.path, 1, &objects);

    let engine = db.open_durable();
    // Read once: verified, and kept in the engine's content cache.
    for o in &objects {
        assert_eq!(engine.reader().content(content_id(o)).unwrap().as_deref(), Some(o.as_slice()));
    }
    // A view taken before the collection, and before a commit (the collection applies at
    // the tip, which views at the tip see), still reads them from its snapshot after it;
    // what it reads then is not cached for the views after.
    let before = engine.reader().snapshot().unwrap();
    commit_turns(&engine, s, "later", 1, head_of(&engine, s));
    let report = engine.collect_garbage(64).unwrap();
    assert_eq!(report.objects_removed, objects.len() as u64, "{report:?}");
    for o in &objects {
        assert_eq!(engine.reader().content(content_id(o)).unwrap(), None, "a collected object is gone from memory too");
        let old = before.content(&content_id(o), u64::MAX).unwrap();
        assert_eq!(old.as_deref(), Some(o.as_slice()), "an older view reads its snapshot");
        assert_eq!(engine.reader().content(content_id(o)).unwrap(), None, "and does not cache it for newer ones");
    }
    drop(before);
    // What the transcript reaches still reads, from the cache or the file.
    transcript(engine.reader(), s);
    transcript(engine.reader(), s);
    engine.close().unwrap();
}

/// A view taken before a collection that shrinks the content-id index sees the index's
/// rows after it (the collection applies at the tip's seq), and still reads every object
/// its transcript reaches: its size of the index is read again on a miss.
#[test]
fn a_view_taken_before_a_collection_that_shrank_the_index_reads_what_it_reaches() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, head) = create(&engine, &[Message::user("hello")]);
    commit_turns(&engine, s, "t", 40, head);
    engine.close().unwrap();
    let objects: Vec<Vec<u8>> = leftovers(600).iter().map(object_of).collect();
    inject(&db.path, 1, &objects);

    // No content cache: every read goes through the index.
    let options = annal::Options { content_cache_bytes: 0, ..annal::Options::default() };
    let engine = Engine::open_with(&db.path, options).unwrap();
    let view = engine.reader().snapshot().unwrap();
    let (limits, page) = (annal::Limits::default(), annal::PageRequest::first(1000));
    let before = annal::query::transcript(&view, &limits, &s, page).unwrap();
    assert!(before.messages.len() > 40);
    let report = engine.collect_garbage(1 << 20).unwrap();
    assert_eq!(report.objects_removed, objects.len() as u64, "{report:?}");
    let after = annal::query::transcript(&view, &limits, &s, page).unwrap();
    assert_eq!(after.messages, before.messages);
    drop(view);
    engine.close().unwrap();
}

/// A collection that ends with nothing committed after it: the index removals are the
/// delta's only writes (no event made them), and the close must still checkpoint them.
/// Otherwise the projections file keeps index entries for objects whose rows no longer
/// hold them, and a command that brings the same bytes again is told they are stored.
#[test]
fn the_removals_of_a_collection_that_nothing_follows_reach_the_projections_file() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, head) = create(&engine, &[Message::user("hello")]);
    engine.close().unwrap();
    let extra = leftovers(3);
    let objects: Vec<Vec<u8>> = extra.iter().map(object_of).collect();
    inject(&db.path, 1, &objects);

    let engine = db.open_durable();
    // The open folded the leftovers into the index; checkpoint that, so the removals
    // below are all the next layer holds.
    engine.checkpoint().unwrap();
    assert_eq!(engine.collect_garbage(64).unwrap().objects_removed, 3);
    engine.close().unwrap();

    let engine = db.open_durable();
    equal_a_rebuild(&engine);
    let turn = annal::CommitTurn::new(s, "again", annal::Expected::Exact(head)).message(extra[0].clone());
    engine.commit_turn(turn).unwrap();
    assert_eq!(transcript(engine.reader(), s).last().unwrap().message.body, extra[0].body, "stored again");
    engine.close().unwrap();
    assert!(stored_ids(&db.path).contains(&message_id(&extra[0])));
}
