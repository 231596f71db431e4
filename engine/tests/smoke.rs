use annal::*;

fn open() -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path().join("db.redb")).unwrap();
    (dir, engine)
}

#[test]
fn end_to_end_smoke() {
    let (dir, e) = open();
    let c = e.create_session(CreateSession::new().label("a", "1").message(Message::system("sys"))).unwrap();
    let s = c.session;
    e.append_context(AppendContext { session: s, key: "k".into(), content: b"ctx".to_vec(), source: "mem".into() })
        .unwrap();
    let mut rev = c.receipt.revision;
    for i in 0..5 {
        let t = CommitTurn::new(s, format!("t{i}"), Expected::Exact(rev))
            .message(Message::user(format!("u{i}")))
            .message(Message::assistant(format!("a{i}")))
            .usage("p", "m", 10, 5);
        let t = if i == 1 { t.apply_context("k") } else { t };
        rev = e.commit_turn(t).unwrap().receipt().revision;
    }
    e.record_tool_call(RecordToolCall {
        session: s,
        op_id: "op1".into(),
        call_id: "c1".into(),
        tool_name: "bash".into(),
        args: b"ls".to_vec(),
        parent_op: None,
        turn_id: None,
        recovery: Recovery::ReplaySafe,
    })
    .unwrap();
    assert_eq!(e.unsettled(s).unwrap().len(), 1);
    let before_compaction = rev;
    let r = e
        .rewrite(Rewrite {
            session: s,
            expected: rev,
            start: 0,
            end: 9,
            replacement: vec![Message::system("summary")],
            reason: RewriteReason::Compaction,
            note: "compact".into(),
            actor: "host".into(),
        })
        .unwrap();
    assert_eq!(e.head(s).unwrap().unwrap().message_count, 3);
    let old = e.transcript_at(s, before_compaction, PageRequest::first(100)).unwrap();
    assert_eq!(old.total, 11);
    let restored = e
        .restore(Restore {
            session: s,
            expected: r.revision,
            target: before_compaction,
            note: "undo".into(),
            actor: "host".into(),
        })
        .unwrap();
    assert_eq!(restored.revision, before_compaction);
    let f = e.fork_at(s, 3).unwrap();
    assert_eq!(e.head(f.session).unwrap().unwrap().message_count, 3);
    let digests = e.projection_digests().unwrap();
    e.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(digests, e.projection_digests().unwrap());
    let page = e.events(EventQuery { from_seq: 1, max_events: 100, max_bytes: 1 << 20 }).unwrap();
    assert_eq!(page.events.len() as u64, e.tip().unwrap().0);
    e.close().unwrap();
    let e = Engine::open(dir.path().join("db.redb")).unwrap();
    assert_eq!(digests, e.projection_digests().unwrap());
    assert_eq!(e.usage(s).unwrap()[0].input, 50);

    // Import everything into an empty database: same tip, same projections.
    let page = e.events(EventQuery { from_seq: 1, max_events: 1000, max_bytes: 1 << 24 }).unwrap();
    let records: Vec<Record> = page.events.into_iter().map(|ev| ev.record).collect();
    let mut content = Vec::new();
    for r in &records {
        for id in r.event.content_refs() {
            let bytes = e.content(id).unwrap().unwrap();
            if let Ok(m) = annal::codec::decode_message(&bytes, 1 << 24) {
                for a in m.attachments {
                    content.push(e.content(a).unwrap().unwrap());
                }
            }
            content.push(bytes);
        }
    }
    let other = Engine::open(dir.path().join("copy.redb")).unwrap();
    let stats = other.import(records.clone(), content.clone()).unwrap();
    assert_eq!(stats.tip_seq, e.tip().unwrap().0);
    assert_eq!(other.tip().unwrap(), e.tip().unwrap());
    assert_eq!(other.projection_digests().unwrap(), digests);
    // A second import of the same records does not follow the tip: rejected, nothing written.
    let err = other.import(records, content).unwrap_err();
    assert!(matches!(err, Error::Rejected(Rejection::InvalidImport { seq: 1, .. })), "{err:?}");
    assert_eq!(other.tip().unwrap(), e.tip().unwrap());
}

/// The head cache never serves a head older than one already seen or acknowledged.
#[test]
fn heads_are_fresh_under_concurrent_reads() {
    let (_dir, e) = open();
    let s = e.create_session(CreateSession::new()).unwrap().session;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (e, done) = (e.clone(), done.clone());
            std::thread::spawn(move || {
                let mut last = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let head = e.head(s).unwrap().unwrap();
                    assert!(head.last_seq >= last, "head went back from {last} to {}", head.last_seq);
                    last = head.last_seq;
                }
            })
        })
        .collect();
    for i in 0..100 {
        let r = e
            .commit_turn(CommitTurn::new(s, format!("t{i}"), Expected::Any).message(Message::user(format!("{i}"))))
            .unwrap()
            .receipt();
        let head = e.head(s).unwrap().unwrap();
        assert_eq!((head.last_seq, head.revision), (r.seq, r.revision), "a receipt's head is visible at once");
    }
    e.rebuild(ProjectionSet::all()).unwrap();
    assert_eq!(e.head(s).unwrap().unwrap().message_count, 100);
    done.store(true, std::sync::atomic::Ordering::Release);
    readers.into_iter().for_each(|r| r.join().unwrap());
}

#[test]
fn compact_gives_back_what_a_rebuild_freed_and_changes_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compact.redb");
    let engine = Engine::open(&path).unwrap();
    for i in 0..20 {
        let s = engine.create_session(CreateSession::new().message(Message::system(format!("prompt {i}")))).unwrap();
        for t in 0..5 {
            let turn =
                CommitTurn::new(s.session, format!("t{t}"), Expected::Any).message(Message::user("x".repeat(300)));
            engine.commit_turn(turn).unwrap();
        }
    }
    engine.rebuild(ProjectionSet::all()).unwrap();
    let digests = engine.projection_digests().unwrap();
    let tip = engine.tip().unwrap();
    engine.close().unwrap();

    let stats = annal::compact(&path, Options::default()).unwrap();
    assert!(stats.bytes_after < stats.bytes_before, "{stats:?}");
    let files = std::fs::metadata(&path).unwrap().len() + std::fs::metadata(projections_path(&path)).unwrap().len();
    assert_eq!(stats.bytes_after, files, "the sizes are of both files");
    let engine = Engine::open(&path).unwrap();
    assert_eq!(engine.projection_digests().unwrap(), digests);
    assert_eq!(engine.tip().unwrap(), tip);

    // Held open by an engine: refused with a storage error, the file left alone.
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(matches!(annal::compact(&path, Options::default()), Err(Error::Storage(_))));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    engine.close().unwrap();

    // No database at the path: refused, and none is made there; a directory likewise.
    let missing = dir.path().join("missing.redb");
    assert!(matches!(annal::compact(&missing, Options::default()), Err(Error::Storage(_))));
    let lz4 = annal::codec::content::Compression::Lz4;
    assert!(matches!(annal::recompress(&missing, lz4, Options::default(), &mut |_, _| {}), Err(Error::Storage(_))));
    assert!(annal::database_files(&missing).iter().all(|f| !f.exists()));
    assert!(matches!(annal::compact(dir.path(), Options::default()), Err(Error::Storage(_))));
}

/// Content compresses where it pays and reads back byte for byte under every
/// `Compression`; the ids are over the canonical bytes, so the same message has the same
/// id in every file. A file written under one compression opens under another, and reads
/// both kinds of objects.
#[test]
fn compressed_and_raw_content_round_trip_with_the_same_ids() {
    use annal::codec::content::{ENCODING_LZ4, ENCODING_RAW, ENCODING_ZSTD};
    let mut ids = Vec::new();
    let mut sizes = Vec::new();
    let mut sessions = Vec::new();
    let long = "the agent reads the file, runs the tests and writes the diff\n".repeat(200);
    let medium = "a short answer that compresses a little, ".repeat(12);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let compressions = [Compression::Lz4, Compression::Zstd, Compression::Off];
    for (dir, compression) in dirs.iter().zip(compressions) {
        let path = dir.path().join("c.redb");
        let options = Options { compression, durability: Durability::Relaxed, ..Options::default() };
        let engine = Engine::open_with(&path, options).unwrap();
        let created = engine
            .create_session(
                CreateSession::new()
                    .message(Message::user(long.clone()))
                    .message(Message::user("hi"))
                    .message(Message::assistant(medium.clone())),
            )
            .unwrap();
        let ctx = AppendContext {
            session: created.session,
            key: "notes".into(),
            content: long.clone().into_bytes(),
            source: "memory".into(),
        };
        engine.append_context(ctx).unwrap();
        sessions.push(created.session);
        let page = engine.transcript(created.session, PageRequest::first(10)).unwrap();
        assert_eq!(page.messages[0].message.body, long.as_bytes());
        assert_eq!(page.messages[1].message.body, b"hi");
        assert_eq!(page.messages[2].message.body, medium.as_bytes());
        let entry = engine.context(created.session).unwrap().remove(0);
        assert_eq!(engine.content(entry.content).unwrap().unwrap(), long.as_bytes());
        ids.push((page.messages[0].content_id, page.messages[2].content_id, entry.content, created.receipt.revision));
        engine.close().unwrap();
        let (counts, stored) = stored_encodings(&path);
        let encodings: std::collections::BTreeSet<u8> = counts.into_keys().collect();
        let expected: std::collections::BTreeSet<u8> = match compression {
            Compression::Lz4 => [ENCODING_RAW, ENCODING_LZ4].into(),
            Compression::Zstd => [ENCODING_RAW, ENCODING_LZ4, ENCODING_ZSTD].into(),
            Compression::Off => [ENCODING_RAW].into(),
        };
        assert_eq!(encodings, expected, "{compression:?}");
        sizes.push(stored);
    }
    assert!(ids.iter().all(|i| *i == ids[0]), "ids are over the canonical bytes");
    assert!(sizes[0] * 5 < sizes[2], "lz4 {} vs raw {}", sizes[0], sizes[2]);
    assert!(sizes[1] < sizes[0], "zstd {} vs lz4 {}", sizes[1], sizes[0]);

    // The zstd file, opened under lz4: both kinds of objects read back, from the engine
    // and after a reopen.
    let path = dirs[1].path().join("c.redb");
    let options = Options { compression: Compression::Lz4, durability: Durability::Relaxed, ..Options::default() };
    let engine = Engine::open_with(&path, options).unwrap();
    let session = sessions[1];
    let more = "another long tool result, read back from a file written under lz4\n".repeat(40);
    let turn = CommitTurn::new(session, "more", Expected::Any).message(Message::tool(more.clone()));
    engine.commit_turn(turn).unwrap();
    let page = engine.transcript(session, PageRequest::first(10)).unwrap();
    assert_eq!(page.messages[0].message.body, long.as_bytes());
    assert_eq!(page.messages[3].message.body, more.as_bytes());
    engine.close().unwrap();
    let reader = Reader::open(&path, Limits::default(), None).unwrap();
    let page = reader.transcript(session, PageRequest::first(10)).unwrap();
    let bodies: Vec<&[u8]> = page.messages.iter().map(|m| m.message.body.as_slice()).collect();
    assert_eq!(bodies, [long.as_bytes(), b"hi", medium.as_bytes(), more.as_bytes()]);
}

/// The encodings of every object of the file at `path`, and their stored bytes.
fn stored_encodings(path: &std::path::Path) -> (std::collections::BTreeMap<u8, u64>, u64) {
    let view = Reader::open(path, Limits::default(), None).unwrap();
    let snapshot = view.snapshot().unwrap();
    let rows = annal::pieces::ContentReader::open(snapshot.log()).unwrap();
    let mut counts = std::collections::BTreeMap::new();
    let mut bytes = 0;
    for row in rows.iter().unwrap() {
        for entry in annal::codec::content::entries(&row.unwrap().1, u64::MAX) {
            let entry = entry.unwrap();
            *counts.entry(entry.encoding).or_insert(0u64) += 1;
            bytes += entry.stored.len() as u64;
        }
    }
    (counts, bytes)
}

/// `recompress` stores every object the way the compression stores new ones, and changes
/// nothing a query sees: the tip, the projections and every object's bytes; run again it
/// changes nothing; it goes to zstd, to raw and back to lz4; a damaged object is left as
/// it is and counted; a file held open is refused.
#[test]
fn recompress_restores_content_and_changes_nothing_else() {
    use annal::codec::content::{ENCODING_LZ4, ENCODING_RAW, ENCODING_ZSTD};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let engine = Engine::open(&path).unwrap();
    let mut ids = Vec::new();
    for i in 0..8 {
        let s = engine.create_session(CreateSession::new().message(Message::system(format!("prompt {i}")))).unwrap();
        for t in 0..6 {
            let long = format!("turn {t} of session {i}: the agent reads the file and writes the diff\n").repeat(40);
            let short = format!("a short answer {t} {i} that compresses a little, ").repeat(8);
            let turn = CommitTurn::new(s.session, format!("t{t}"), Expected::Any)
                .message(Message::user(long))
                .message(Message::assistant(short))
                .message(Message::tool(format!("ok {t}")));
            engine.commit_turn(turn).unwrap();
        }
        let page = engine.transcript(s.session, PageRequest::first(100)).unwrap();
        ids.extend(page.messages.iter().map(|m| m.content_id));
    }
    let read_all = |engine: &Engine| -> Vec<Vec<u8>> {
        ids.iter().map(|id| engine.content(*id).unwrap().expect("stored")).collect()
    };
    let contents = read_all(&engine);
    let digests = engine.projection_digests().unwrap();
    let tip = engine.tip().unwrap();
    engine.close().unwrap();
    let (before, lz4_bytes) = stored_encodings(&path);
    assert!(before.contains_key(&ENCODING_LZ4) && !before.contains_key(&ENCODING_ZSTD), "{before:?}");

    let check = |path: &std::path::Path| {
        let engine = Engine::open(path).unwrap();
        assert_eq!(read_all(&engine), contents);
        assert_eq!(engine.projection_digests().unwrap(), digests);
        assert_eq!(engine.tip().unwrap(), tip);
        engine.close().unwrap();
    };
    let mut seen = Vec::new();
    let stats =
        annal::recompress(&path, Compression::Zstd, Options::default(), &mut |done, tip| seen.push((done, tip)))
            .unwrap();
    assert_eq!(seen, [(tip.0, tip.0)], "one transaction, up to the last row, which is the tip's");
    let (after, zstd_bytes) = stored_encodings(&path);
    assert_eq!(after.get(&ENCODING_ZSTD).copied(), Some(48), "the long messages: {after:?}");
    assert!(after.contains_key(&ENCODING_LZ4), "the short ones stay lz4: {after:?}");
    assert_eq!((stats.objects_changed, stats.objects_damaged), (48, 0), "{stats:?}");
    assert_eq!((stats.stored_bytes_before, stats.stored_bytes_after), (lz4_bytes, zstd_bytes), "{stats:?}");
    assert!(zstd_bytes < lz4_bytes, "{stats:?}");
    let files = std::fs::metadata(&path).unwrap().len() + std::fs::metadata(projections_path(&path)).unwrap().len();
    assert_eq!(stats.compact.bytes_after, files, "{stats:?}");
    check(&path);

    // Again: nothing to do.
    let again = annal::recompress(&path, Compression::Zstd, Options::default(), &mut |_, _| {}).unwrap();
    assert_eq!((again.objects_changed, again.rows_rewritten), (0, 0), "{again:?}");
    assert_eq!(again.objects, stats.objects);

    // Raw, then back to lz4: the bytes lz4 stored at first.
    annal::recompress(&path, Compression::Off, Options::default(), &mut |_, _| {}).unwrap();
    let (raw, _) = stored_encodings(&path);
    assert_eq!(raw.keys().copied().collect::<Vec<_>>(), [ENCODING_RAW], "{raw:?}");
    check(&path);
    annal::recompress(&path, Compression::Lz4, Options::default(), &mut |_, _| {}).unwrap();
    assert_eq!(stored_encodings(&path), (before, lz4_bytes));
    check(&path);

    // A damaged object is left as it is: the same bytes, counted, and reads of it fail.
    let (seq, id, damaged) = {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let found = {
            let mut rows = annal::pieces::ContentWriter::open(&txn).unwrap();
            let all: Vec<(u64, Vec<u8>)> = rows.iter().unwrap().map(|r| r.unwrap()).collect();
            let mut found = None;
            'rows: for (seq, mut row) in all {
                let mut at = 0;
                for entry in annal::codec::content::entries(&row.clone(), u64::MAX) {
                    let entry = entry.unwrap();
                    let header = annal::codec::content::ENTRY_HEADER_LEN;
                    if entry.stored.len() > 100 {
                        row[at + header + entry.stored.len() / 2] ^= 0x5a;
                        let stored = row[at + header..at + header + entry.stored.len()].to_vec();
                        rows.put(seq, &row).unwrap();
                        found = Some((seq, entry.id, stored));
                        break 'rows;
                    }
                    at += header + entry.stored.len();
                }
            }
            found.expect("a long object")
        };
        txn.commit().unwrap();
        found
    };
    let stats = annal::recompress(&path, Compression::Zstd, Options::default(), &mut |_, _| {}).unwrap();
    assert_eq!(stats.objects_damaged, 1, "{stats:?}");
    {
        let view = Reader::open(&path, Limits::default(), None).unwrap();
        let snapshot = view.snapshot().unwrap();
        let rows = annal::pieces::ContentReader::open(snapshot.log()).unwrap();
        let row = rows.get(seq).unwrap().unwrap();
        let entry = annal::codec::content::find(&row, &id, u64::MAX).unwrap().expect("kept");
        assert_eq!(entry.stored, damaged.as_slice(), "the damaged object's bytes are kept");
        assert!(matches!(view.content(id), Err(Error::Corrupt { .. })), "reads of it fail closed");
    }

    // Held open by an engine: refused with a storage error.
    let engine = Engine::open(&path).unwrap();
    assert!(matches!(
        annal::recompress(&path, Compression::Off, Options::default(), &mut |_, _| {}),
        Err(Error::Storage(_))
    ));
    engine.close().unwrap();
}

/// A workload that leaves the log file a few MiB long, written through `engine`.
fn fill(engine: &Engine, sessions: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..sessions {
        let s = engine.create_session(CreateSession::new().message(Message::system(format!("prompt {i}")))).unwrap();
        for t in 0..40 {
            // Random lower-case words: about 0.6 of their size after compression.
            let body: String = (0..1_500)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x.is_multiple_of(7) {
                        ' '
                    } else {
                        char::from(b'a' + (x % 26) as u8)
                    }
                })
                .collect();
            let turn = CommitTurn::new(s.session, format!("t{t}"), Expected::Any).message(Message::user(body));
            engine.commit_turn(turn).unwrap();
        }
    }
}

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// What the compaction at close must not change: every projection and the log's tip.
fn answers(engine: &Engine) -> (Vec<TableDigest>, (u64, ChainHash)) {
    (engine.projection_digests().unwrap(), engine.tip().unwrap())
}

/// Options that never compact at close.
fn kept() -> Options {
    Options { compact_on_close_bytes_max: 0, ..Options::default() }
}

/// A database filled and closed without compaction: its directory, its path and its
/// answers.
fn filled_and_kept(name: &str) -> (tempfile::TempDir, std::path::PathBuf, (Vec<TableDigest>, (u64, ChainHash))) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let engine = Engine::open_with(&path, kept()).unwrap();
    fill(&engine, 60);
    let before = answers(&engine);
    engine.close().unwrap();
    (dir, path, before)
}

fn file_backend(path: &std::path::Path) -> redb::backends::FileBackend {
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
    redb::backends::FileBackend::new(file).unwrap()
}

/// redb grows a small file by doubling it; the last handle's close gives the unused part
/// back when it is at least an eighth of the file, and every answer stays the same.
#[test]
fn close_gives_back_the_free_space_of_a_small_file_and_changes_no_answer() {
    let (_dir, path, before) = filled_and_kept("close.redb");
    let long = file_len(&path);

    // The same file, opened and closed with the default options.
    Engine::open(&path).unwrap().close().unwrap();
    let short = file_len(&path);
    assert!(short * 8 <= long * 7, "compacted at close: {short} bytes against {long}");
    let engine = Engine::open_with(&path, kept()).unwrap();
    assert_eq!(answers(&engine), before, "the same projections and the same log");
    engine.close().unwrap();
}

/// A reader the host still holds keeps the file as it is; the close succeeds all the same,
/// and the files opened on storage backends are compacted like files opened by path.
#[test]
fn close_leaves_a_file_alone_while_a_reader_holds_it_and_compacts_backends_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.redb");
    let engine = Engine::open(&path).unwrap();
    fill(&engine, 60);
    let reader = engine.reader().clone();
    let tip = engine.tip().unwrap();
    engine.close().unwrap();
    let held = file_len(&path);
    assert_eq!(reader.tip().unwrap(), tip, "the reader still reads");
    drop(reader);

    let projections = file_backend(&projections_path(&path));
    let engine = Engine::open_with_backends(file_backend(&path), projections, Options::default()).unwrap();
    assert_eq!(engine.tip().unwrap(), tip);
    engine.close().unwrap();
    assert!(file_len(&path) * 8 <= held * 7, "compacted at close: {} bytes against {held}", file_len(&path));
    let engine = Engine::open(&path).unwrap();
    assert_eq!(engine.tip().unwrap(), tip);
    engine.close().unwrap();
}

/// A write that fails inside the compaction at close is the close's error; every commit
/// was durable before it, and the file opens with the same answers.
#[test]
fn a_write_fault_in_the_compaction_at_close_is_its_error_and_loses_nothing() {
    use annal::fault::{Faults, FaultyBackend};
    let (_dir, path, before) = filled_and_kept("fault.redb");
    let faults = Faults::new();
    let backend = |p: &std::path::Path| FaultyBackend::new(file_backend(p), faults.clone());
    let engine =
        Engine::open_with_backends(backend(&path), backend(&projections_path(&path)), Options::default()).unwrap();
    // A caught-up database opens and closes without a write of its own: the first write
    // after this is the compaction's.
    faults.fail_write_after(0);
    assert!(matches!(engine.close(), Err(Error::Storage(_))));

    let engine = Engine::open_with(&path, kept()).unwrap();
    assert_eq!(answers(&engine), before);
    engine.close().unwrap();
}
