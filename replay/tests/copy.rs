//! End-to-end tests of copying sessions with the `annal` binary: `annal export --session
//! ID [--ancestry]` from one database, `annal import` into another that holds other
//! sessions; re-imports, conflicts and forks without their parents.

use annal::{CommitTurn, Engine, Event, EventQuery, Expected, Limits, ListQuery, Message, Reader, SessionId};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

mod common;

use common::{annal, code, p, stderr, stdout};

/// A demo database named `name` with `sessions` top-level sessions.
fn demo_db(dir: &tempfile::TempDir, name: &str, sessions: u64) -> PathBuf {
    common::demo_db_named(dir, name, sessions)
}

/// `annal export DB extra...` written to `dir/file`.
fn export_to(db: &Path, extra: &[&str], file: &Path) -> String {
    let mut args = vec!["export", p(db)];
    args.extend_from_slice(extra);
    let out = annal(&args);
    assert_eq!(code(&out), 0, "export failed: {}", stderr(&out));
    std::fs::write(file, &out.stdout).unwrap();
    stdout(&out)
}

fn reader(db: &Path) -> Reader {
    Reader::open(db, Limits::default(), None).unwrap()
}

/// The tip and every projection digest: what a write would change.
fn state(db: &Path) -> ((u64, annal::ChainHash), Vec<annal::TableDigest>) {
    let r = reader(db);
    (r.tip().unwrap(), r.projection_digests().unwrap())
}

/// A session's events in stream order: `(stream seq, event)`.
fn stream(db: &Path, session: SessionId) -> Vec<(u64, Event)> {
    let page = reader(db).session_events(session, EventQuery { from_seq: 1, max_events: 10_000, max_bytes: 1 << 26 });
    page.unwrap().events.into_iter().map(|e| (e.record.stream_seq, e.record.event)).collect()
}

fn verify_deep_clean(db: &Path) {
    let out = annal(&["verify", p(db), "--deep", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    assert_eq!(code(&out), 0, "{report}");
    assert_eq!(report["findings"].as_array().map(Vec::len), Some(0), "{report}");
}

/// The number in `text` just before `what` (as in "12 new content objects").
fn number_before(text: &str, what: &str) -> u64 {
    let at = text.find(what).unwrap_or_else(|| panic!("{what:?} in {text:?}"));
    text[..at].trim_end().rsplit(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// Distinct content ids inlined in an export.
fn inlined_ids(text: &str) -> HashSet<String> {
    let mut ids = HashSet::new();
    fn walk(v: &Value, ids: &mut HashSet<String>) {
        match v {
            Value::Object(o) => {
                if let (Some(Value::String(id)), true) =
                    (o.get("id"), o.contains_key("bytes") || o.contains_key("body"))
                {
                    ids.insert(id.clone());
                }
                o.values().for_each(|v| walk(v, ids));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, ids)),
            _ => {}
        }
    }
    for line in text.lines().skip(1) {
        walk(&serde_json::from_str(line).unwrap(), &mut ids);
    }
    ids
}

#[test]
fn a_session_export_copies_into_a_populated_database() {
    let dir = tempfile::tempdir().unwrap();
    let source = demo_db(&dir, "source.redb", 3);
    let target = demo_db(&dir, "target.redb", 2);
    let heads = reader(&source).list_sessions(&ListQuery::new().include_archived()).unwrap().items;
    let fork = heads.iter().find(|h| h.forked_from.is_some()).expect("the demo forks");
    let (child, parent) = (fork.session, fork.forked_from.as_ref().unwrap().session);
    assert!(reader(&source).head(parent).unwrap().unwrap().forked_from.is_none(), "a top-level parent");

    // Without its ancestry the fork cannot be copied where its parent is missing.
    let alone = dir.path().join("alone.jsonl");
    export_to(&source, &["--session", &child.to_string()], &alone);
    let before = state(&target);
    let out = annal(&["import", p(&alone), p(&target)]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&format!("is a fork of {parent}, which is neither here nor in the copy")),
        "{}",
        stderr(&out)
    );
    assert_eq!(state(&target), before, "nothing written");

    // With its ancestry: a header naming the parent first, then the records.
    let file = dir.path().join("fork.jsonl");
    let text = export_to(&source, &["--session", &child.to_string(), "--ancestry"], &file);
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header["annal"], "sessions");
    assert_eq!(header["version"], 1);
    assert_eq!(header["ancestry"], true);
    let listed: Vec<&str> = header["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(listed, vec![parent.to_string(), child.to_string()]);
    let events: u64 = header["sessions"].as_array().unwrap().iter().map(|s| s["events"].as_u64().unwrap()).sum();
    assert_eq!(events as usize, text.lines().count() - 1);

    let content_before = count_content(&target);
    let out = annal(&["import", p(&file), p(&target)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = stdout(&out);
    assert!(report.starts_with("copied 2 sessions"), "{report}");
    assert!(report.contains(&format!("copied           {parent}\n")), "{report}");
    assert!(report.contains(&format!("copied           {child}\n")), "{report}");
    assert_eq!(number_before(&report, "records"), events);
    let new_objects = number_before(&report, "new content objects");
    assert_eq!(count_content(&target) - content_before, new_objects as usize);
    // The demo's system prompts are in both databases: stored once.
    assert!((new_objects as usize) < inlined_ids(&text).len(), "{new_objects} of {}", inlined_ids(&text).len());
    verify_deep_clean(&target);

    // Every query answers as in the source (the transcripts byte for byte).
    for session in [parent, child] {
        assert_eq!(stream(&source, session), stream(&target, session));
        let transcript = |db: &Path| {
            let out = annal(&["transcript", p(db), &session.to_string(), "--json", "--limit", "10000"]);
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            stdout(&out)
        };
        assert_eq!(transcript(&source), transcript(&target));
        let (a, b) = (reader(&source), reader(&target));
        assert_eq!(a.usage(session).unwrap(), b.usage(session).unwrap());
        let revisions = |r: &Reader| -> Vec<_> {
            let page = r.revisions(session, annal::PageRequest::first(1000)).unwrap();
            page.page.items.into_iter().map(|n| (n.revision, n.parents, n.origin, n.message_count)).collect()
        };
        assert_eq!(revisions(&a), revisions(&b));
    }

    // Again: already present, nothing written.
    let before = state(&target);
    let out = annal(&["import", p(&file), p(&target)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = stdout(&out);
    assert!(report.starts_with("copied 0 sessions (0 records, 0 new content objects), 2 already present"), "{report}");
    assert!(report.contains(&format!("already present  {parent}\n")), "{report}");
    assert!(report.contains(&format!("already present  {child}\n")), "{report}");
    assert_eq!(state(&target), before);

    // The parent is there now: the fork alone is already present too.
    let out = annal(&["import", p(&alone), p(&target)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("already present  {child}\n")), "{}", stdout(&out));

    // The source's fork moves on: the same id with another history is a conflict.
    let engine = Engine::open(&source).unwrap();
    let head = engine.head(child).unwrap().unwrap();
    engine
        .commit_turn(CommitTurn::new(child, "later", Expected::Exact(head.revision)).message(Message::user("more")))
        .unwrap();
    engine.close().unwrap();
    let moved = dir.path().join("moved.jsonl");
    export_to(&source, &["--session", &child.to_string()], &moved);
    let before = state(&target);
    let out = annal(&["import", p(&moved), p(&target)]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains(&format!("session {child} exists here with another history")), "{}", stderr(&out));
    assert_eq!(state(&target), before);

    // A whole-database export of the target still round-trips.
    let full = dir.path().join("full.jsonl");
    let text = export_to(&target, &[], &full);
    let copy = dir.path().join("copy.redb");
    let out = annal(&["import", p(&full), p(&copy)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("chain reproduced exactly"), "{}", stdout(&out));
    assert_eq!(export_to(&copy, &[], &dir.path().join("again.jsonl")), text);
}

#[test]
fn a_session_export_creates_a_missing_database_and_leaves_none_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let source = demo_db(&dir, "source.redb", 2);
    let heads = reader(&source).list_sessions(&ListQuery::new().include_archived()).unwrap().items;
    let top = heads.iter().find(|h| h.forked_from.is_none()).unwrap().session;
    let fork = heads.iter().find(|h| h.forked_from.is_some()).unwrap().session;

    let file = dir.path().join("top.jsonl");
    export_to(&source, &["--session", &top.to_string()], &file);
    let fresh = dir.path().join("fresh.redb");
    let out = annal(&["import", p(&file), p(&fresh)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).starts_with("copied 1 sessions"), "{}", stdout(&out));
    verify_deep_clean(&fresh);
    assert_eq!(stream(&source, top), stream(&fresh, top));

    let file = dir.path().join("fork.jsonl");
    export_to(&source, &["--session", &fork.to_string()], &file);
    let missing = dir.path().join("missing.redb");
    let out = annal(&["import", p(&file), p(&missing)]);
    assert_eq!(code(&out), 1);
    assert!(!missing.exists(), "a failed import leaves no file");

    // Unknown sessions and --ancestry without --session are usage errors.
    let unknown = annal::new_session_id().to_string();
    assert_eq!(code(&annal(&["export", p(&source), "--session", &unknown])), 2);
    assert_eq!(code(&annal(&["export", p(&source), "--ancestry"])), 2);
}

fn count_content(db: &Path) -> usize {
    use redb::ReadableDatabase;
    let database = redb::Database::open(db).unwrap();
    let txn = database.begin_read().unwrap();
    let table = annal::pieces::ContentReader::open(&txn).unwrap();
    let mut n = 0;
    for entry in table.iter().unwrap() {
        let (_, row) = entry.unwrap();
        n += annal::codec::content::entries(&row, u64::MAX).count();
    }
    n
}
