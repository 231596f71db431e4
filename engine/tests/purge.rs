//! Purge and content garbage collection: what a purge erases (every byte the host gave
//! the session, in both files, before and after compaction), what it keeps (content a
//! live session reaches, the chain), and how a purged session answers.

mod common;

use annal::*;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const MARK: &str = "ZQXERASEME";

/// Options that store content uncompressed, so that a marker left in the file could be
/// found by a byte search at all.
fn plain_options() -> Options {
    Options { compression: annal::Compression::Off, ..Options::default() }
}

/// Whether `needle` occurs in any byte of the file.
fn file_holds(path: &Path, needle: &str) -> bool {
    let bytes = std::fs::read(path).unwrap();
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn db_holds(path: &Path, needle: &str) -> bool {
    file_holds(path, needle) || file_holds(&projections_path(path), needle)
}

/// A session whose every host-supplied field carries `MARK`: labels, metadata, messages
/// and an attachment, a rewrite's note and actor, context text, key and source, a tool
/// call's ids, name and arguments, its result, host state, and an archive reason. Its
/// first message is `shared`.
fn marked_session(engine: &Engine, shared: &Message) -> SessionId {
    let created = engine
        .create_session(
            CreateSession::new()
                .label(format!("{MARK}-label-key"), format!("{MARK}-label-value"))
                .metadata(format!("{{\"user\":\"{MARK}-metadata\"}}"))
                .message(shared.clone())
                .message(Message::user(format!("{MARK}-first-message")).with_attachment(format!("{MARK}-attachment"))),
        )
        .unwrap();
    let s = created.session;
    engine
        .append_context(AppendContext {
            session: s,
            key: format!("{MARK}-context-key"),
            content: format!("{MARK}-context-text").into_bytes(),
            source: format!("{MARK}-context-source"),
        })
        .unwrap();
    engine
        .record_tool_call(RecordToolCall {
            session: s,
            op_id: format!("{MARK}-op"),
            call_id: format!("{MARK}-call"),
            tool_name: format!("{MARK}-tool"),
            args: format!("{{\"path\":\"{MARK}-args\"}}").into_bytes(),
            parent_op: None,
            turn_id: Some(format!("{MARK}-turn")),
            recovery: Recovery::ReplaySafe,
        })
        .unwrap();
    engine
        .record_tool_result(RecordToolResult {
            session: s,
            op_id: format!("{MARK}-op"),
            outcome: ToolOutcome::Ok,
            result: format!("{MARK}-tool-result").into_bytes(),
        })
        .unwrap();
    let head = engine.head(s).unwrap().unwrap();
    let turn = CommitTurn::new(s, format!("{MARK}-turn"), Expected::Exact(head.revision))
        .message(Message::assistant(format!("{MARK}-answer")))
        .usage("ZQXERASEME-provider", "ZQXERASEME-model", 10, 2)
        .apply_context(format!("{MARK}-context-key"))
        .tool_op(format!("{MARK}-op"))
        .set_state(format!("{MARK}-state-name"), format!("{MARK}-state-value"))
        .run_id(format!("{MARK}-run"));
    let revision = engine.commit_turn(turn).unwrap().receipt().revision;
    engine
        .rewrite(Rewrite {
            session: s,
            expected: revision,
            start: 2,
            end: 3,
            replacement: vec![Message::assistant(format!("{MARK}-summary"))],
            reason: RewriteReason::Compaction,
            note: format!("{MARK}-note"),
            actor: format!("{MARK}-actor"),
        })
        .unwrap();
    engine
        .set_labels(SetLabels {
            session: s,
            set: BTreeMap::from([(format!("{MARK}-second-key"), format!("{MARK}-second-value"))]),
            remove: BTreeSet::new(),
        })
        .unwrap();
    engine
        .set_metadata(SetMetadata {
            session: s,
            metadata: format!("{MARK}-metadata-2").into_bytes(),
            expected: Expected::Any,
        })
        .unwrap();
    engine.archive(s, format!("{MARK}-archive-reason")).unwrap();
    s
}

/// Checks everything a purged session answers, and that the database holds `MARK`
/// nowhere.
fn check_purged(path: &Path, session: SessionId, tombstone: u64) {
    assert!(!db_holds(path, MARK), "a byte of the purged session is left in the files");
    let engine = Engine::open_with(path, plain_options()).unwrap();
    let purged = Rejection::Purged { session, seq: tombstone };
    assert_eq!(rejected(engine.head(session)), purged);
    assert_eq!(rejected(engine.transcript(session, PageRequest::first(10))), purged);
    assert_eq!(rejected(engine.revive(session, "again")), purged);
    assert_eq!(rejected(engine.archive(session, "again")), purged);
    assert_eq!(rejected(engine.create_session(CreateSession::with_id(session))), purged);
    let listed = engine.list_sessions(&ListQuery::default().include_archived()).unwrap();
    assert!(listed.items.iter().all(|h| h.session != session), "a purged session is listed");
    engine.close().unwrap();
    let records = annal::purge::session_records(path, &session).unwrap();
    let (last, erased) = records.iter().next_back().map(|(k, v)| (*k, *v)).unwrap();
    assert_eq!((last, erased), (tombstone, false), "the tombstone is the session's last record, whole");
    assert!(records.iter().filter(|(k, _)| **k != tombstone).all(|(_, erased)| *erased));
}

#[test]
fn a_purge_erases_every_byte_of_the_session_from_both_files() {
    let db = Db::new();
    let engine = Engine::open_with(&db.path, plain_options()).unwrap();
    let shared = Message::system("a system prompt every session starts with");
    let s = marked_session(&engine, &shared);
    let other = create(&engine, std::slice::from_ref(&shared)).0;
    engine.close().unwrap();
    assert!(db_holds(&db.path, MARK), "the marker must be in the file before the purge");

    let report = purge(&db.path, plain_options(), &PurgeRequest::new(s, "erasure request", "dpo")).unwrap();
    assert_eq!(report.purged.len(), 1);
    assert_eq!(report.records_erased, 9);
    assert!(report.objects_erased >= 7, "{report:?}");
    check_purged(&db.path, s, report.purged[0].1);

    // The other session still reads the message it shares with the purged one.
    let engine = Engine::open_with(&db.path, plain_options()).unwrap();
    let page = engine.transcript(other, PageRequest::first(10)).unwrap();
    assert_eq!(page.messages[0].message.body, shared.body);
    engine.close().unwrap();

    compact(&db.path, plain_options()).unwrap();
    check_purged(&db.path, s, report.purged[0].1);
    // Nothing is left to collect.
    let gc = collect_garbage(&db.path, plain_options()).unwrap();
    assert_eq!((gc.objects_erased, gc.records_erased), (0, 0));
}

#[test]
fn content_a_live_session_shares_stays() {
    let db = Db::new();
    let engine = Engine::open_with(&db.path, plain_options()).unwrap();
    // The live session is created first and introduces the shared object; then the
    // purged one refers to it, and the other way round for a second shared message.
    let shared_first = Message::user("a question both sessions asked, first in the live one");
    let live = create(&engine, std::slice::from_ref(&shared_first)).0;
    let shared_later = Message::user("a question both asked, first in the purged one");
    let purged_session = marked_session(&engine, &Message::assistant(format!("{MARK}-not-shared")));
    let doomed = engine
        .create_session(CreateSession::new().message(shared_later.clone()).message(shared_first.clone()))
        .unwrap()
        .session;
    let live_head = engine.head(live).unwrap().unwrap();
    engine
        .commit_turn(CommitTurn::new(live, "t1", Expected::Exact(live_head.revision)).message(shared_later.clone()))
        .unwrap();
    engine.close().unwrap();
    purge(&db.path, plain_options(), &PurgeRequest::new(doomed, "", "ops")).unwrap();
    purge(&db.path, plain_options(), &PurgeRequest::new(purged_session, "", "ops")).unwrap();
    assert!(!db_holds(&db.path, MARK));
    let engine = Engine::open_with(&db.path, plain_options()).unwrap();
    let page = engine.transcript(live, PageRequest::first(10)).unwrap();
    let bodies: Vec<_> = page.messages.iter().map(|m| m.message.body.clone()).collect();
    assert_eq!(bodies, vec![shared_first.body.clone(), shared_later.body.clone()]);
    engine.close().unwrap();
}

#[test]
fn forks_are_refused_without_descendants_and_purged_with_them() {
    let db = Db::new();
    let engine = Engine::open_with(&db.path, plain_options()).unwrap();
    let (parent, _) = create(&engine, &[Message::user(format!("{MARK}-parent"))]);
    let child = engine.fork_at(parent, 1).unwrap().session;
    let grandchild = engine.fork_at(child, 1).unwrap().session;
    let (bystander, _) = create(&engine, &[Message::user("unrelated")]);
    let view = engine.reader().snapshot().unwrap();
    assert_eq!(annal::tables::session_count(&view).unwrap(), 4, "two sessions and two forks");
    assert_eq!(annal::tables::projection_len(&view, Table::Heads).unwrap(), 4);
    drop(view);
    engine.close().unwrap();

    let refused = rejected(purge(&db.path, plain_options(), &PurgeRequest::new(parent, "", "ops")));
    assert_eq!(refused, Rejection::HasForks { session: parent, forks: vec![child, grandchild] });
    assert!(db_holds(&db.path, MARK), "a refused purge erases nothing");

    // A fork alone can go: the parent still reaches the prefix.
    let report = purge(&db.path, plain_options(), &PurgeRequest::new(grandchild, "", "ops")).unwrap();
    assert_eq!(report.objects_erased, 0);
    assert!(db_holds(&db.path, MARK));

    let report = purge(&db.path, plain_options(), &PurgeRequest::new(parent, "", "ops").with_descendants()).unwrap();
    let purged: Vec<SessionId> = report.purged.iter().map(|(s, _)| *s).collect();
    assert_eq!(purged, vec![parent, child]);
    assert!(!db_holds(&db.path, MARK));
    let engine = Engine::open_with(&db.path, plain_options()).unwrap();
    assert!(matches!(rejected(engine.head(child)), Rejection::Purged { .. }));
    assert!(engine.head(bystander).unwrap().is_some());
    // The grandchild went on its own, the parent and the child together: the bystander
    // is the one session left, and the count by the creation order says so as the heads do.
    let view = engine.reader().snapshot().unwrap();
    assert_eq!(annal::tables::session_count(&view).unwrap(), 1);
    assert_eq!(annal::tables::projection_len(&view, Table::Heads).unwrap(), 1);
    assert_eq!(rejected(engine.fork_at(parent, 0)), Rejection::Purged { session: parent, seq: report.purged[0].1 });
    engine.close().unwrap();
    assert!(matches!(
        rejected(purge(&db.path, plain_options(), &PurgeRequest::new(parent, "", "ops"))),
        Rejection::Purged { .. }
    ));
    assert_eq!(
        rejected(purge(&db.path, plain_options(), &PurgeRequest::new(SessionId([7; 16]), "", "ops"))),
        Rejection::NotFound { session: SessionId([7; 16]) }
    );
}

#[test]
fn a_purged_database_rebuilds_to_the_same_projections_and_writes_on() {
    let db = Db::new();
    let engine = Engine::open_with(&db.path, plain_options()).unwrap();
    let s = marked_session(&engine, &Message::system("shared"));
    let (live, rev) = create(&engine, &[Message::system("shared")]);
    engine.close().unwrap();
    purge(&db.path, plain_options(), &PurgeRequest::new(s, "", "ops")).unwrap();
    let engine = Engine::open_with(&db.path, plain_options()).unwrap();
    let digests = annal::query::projection_digests(&engine.reader().snapshot().unwrap()).unwrap();
    engine.rebuild(ProjectionSet::all()).unwrap();
    let again = annal::query::projection_digests(&engine.reader().snapshot().unwrap()).unwrap();
    assert_eq!(digests, again);
    engine.commit_turn(turn(live, "after-purge", rev)).unwrap();
    engine.close().unwrap();
}

/// With a chain key, the payload digests are keyed, the purge needs the key, and every
/// chain link (the erased records' included) verifies under it; without the key the
/// purge is refused and nothing changes.
#[test]
fn a_keyed_database_is_purged_under_its_key() {
    let db = Db::new();
    let keyed = Options { chain_key: Some([7; 32]), ..plain_options() };
    let engine = Engine::open_with(&db.path, keyed.clone()).unwrap();
    let s = marked_session(&engine, &Message::system("shared"));
    let (live, _) = create(&engine, &[Message::system("shared")]);
    engine.close().unwrap();
    let before = std::fs::read(&db.path).unwrap();
    assert!(matches!(
        purge(&db.path, plain_options(), &PurgeRequest::new(s, "", "ops")),
        Err(Error::KeyMismatch { .. })
    ));
    assert_eq!(std::fs::read(&db.path).unwrap(), before, "a refused purge changes no byte of the log");
    let report = purge(&db.path, keyed.clone(), &PurgeRequest::new(s, "", "ops")).unwrap();
    assert!(!db_holds(&db.path, MARK));
    let engine = Engine::open_with(&db.path, keyed).unwrap();
    let page = engine.events(EventQuery { from_seq: 1, max_events: 1000, max_bytes: 1 << 24 }).unwrap();
    let erased = page.events.iter().filter(|e| e.record.event.is_erased()).count() as u64;
    assert_eq!(erased, report.records_erased);
    assert!(engine.head(live).unwrap().is_some());
    engine.rebuild(ProjectionSet::all()).unwrap();
    engine.close().unwrap();
}
