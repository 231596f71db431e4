//! The async twins and the commit stream, under tokio: many tasks on one thread, group
//! commit, cancellation, a lagging stream and its resume.

mod common;

use annal::*;
use common::*;
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

const TASKS: usize = 1_000;
const TURNS_PER_TASK: usize = 3;
/// Names the runtime's blocking threads, to show that none was started.
const BLOCKING_THREAD_NAME: &str = "annal-test-blocking";

/// A runtime on the calling thread, with no worker threads; its blocking pool is started
/// only by `spawn_blocking`, which nothing here calls.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().thread_name(BLOCKING_THREAD_NAME).build().unwrap()
}

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}

#[test]
fn a_thousand_tasks_commit_on_one_thread_and_group_commit_batches_them() {
    let db = Db::new();
    let engine = db.open_durable();
    let runtime = current_thread();
    let sessions: Vec<SessionReceipt> = runtime.block_on(async {
        let creates: Vec<_> = (0..TASKS)
            .map(|i| engine.create_session_async(CreateSession::new().message(Message::system(format!("task {i}")))))
            .collect();
        let mut sessions = Vec::with_capacity(TASKS);
        for create in creates {
            sessions.push(create.await.unwrap());
        }
        sessions
    });
    let before = engine.stats();

    let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let receipts: Vec<Vec<Receipt>> = runtime.block_on(async {
        let tasks: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(i, created)| {
                let engine = engine.clone();
                let finished = finished.clone();
                let (session, mut revision) = (created.session, created.receipt.revision);
                tokio::spawn(async move {
                    let mut receipts = Vec::new();
                    for t in 0..TURNS_PER_TASK {
                        let turn = CommitTurn::new(session, format!("turn-{t}"), Expected::Exact(revision))
                            .message(Message::user(format!("task {i} asks {t}")))
                            .message(Message::assistant(format!("task {i} answers {t}")));
                        let outcome = engine.commit_turn_async(turn).await.unwrap();
                        let TurnOutcome::Committed(receipt) = outcome else { panic!("{outcome:?}") };
                        revision = receipt.revision;
                        receipts.push(receipt);
                    }
                    finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    receipts
                })
            })
            .collect();
        let mut receipts = Vec::with_capacity(TASKS);
        for task in tasks {
            receipts.push(task.await.unwrap());
        }
        receipts
    });
    assert_eq!(finished.load(std::sync::atomic::Ordering::Relaxed), TASKS, "every task completed");
    assert!(
        !thread_names().iter().any(|name| name == BLOCKING_THREAD_NAME),
        "the runtime started a blocking thread: {:?}",
        thread_names()
    );

    let after = engine.stats();
    let commits = (TASKS * TURNS_PER_TASK) as u64;
    let transactions = after.log_commits - before.log_commits;
    assert_eq!(after.events - before.events, commits);
    let per_transaction = commits as f64 / transactions as f64;
    println!(
        "{commits} commits from {TASKS} tasks in {transactions} log transactions: {per_transaction:.1} per transaction"
    );
    assert!(per_transaction >= 50.0, "group commit did not batch: {per_transaction:.1} commits per transaction");

    // Every receipt is in the log, once.
    let seqs: BTreeSet<u64> = receipts.iter().flatten().map(|r| r.seq).collect();
    assert_eq!(seqs.len() as u64, commits);
    assert_eq!(tip_seq(&engine), TASKS as u64 + commits);
    for (created, receipts) in sessions.iter().zip(&receipts) {
        let head = engine.head(created.session).unwrap().unwrap();
        assert_eq!(head.revision, receipts.last().unwrap().revision);
        assert_eq!(head.stream_seq, 1 + TURNS_PER_TASK as u64);
    }
    engine.close().unwrap();
}

#[test]
fn a_full_writer_queue_blocks_the_caller_and_every_task_still_completes() {
    let db = Db::new();
    let options = Options { durability: Durability::Relaxed, queue_depth: 4, ..Options::default() };
    let engine = Engine::open_with(&db.path, options).unwrap();
    let runtime = current_thread();
    let done = runtime.block_on(async {
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let created = engine.create_session_async(CreateSession::new().message(Message::system("s")));
                    let created = created.await.unwrap();
                    let turn =
                        CommitTurn::new(created.session, format!("t{i}"), Expected::Any).message(Message::user("hi"));
                    engine.commit_turn_async(turn).await.unwrap();
                })
            })
            .collect();
        let mut done = 0;
        for task in tasks {
            task.await.unwrap();
            done += 1;
        }
        done
    });
    assert_eq!(done, 200);
    assert_eq!(tip_seq(&engine), 400);
}

#[test]
fn every_twin_answers_as_its_blocking_method() {
    let db = Db::new();
    let engine = db.open();
    current_thread().block_on(async {
        let created = engine.create_session_async(CreateSession::new().message(Message::system("sys"))).await.unwrap();
        let s = created.session;
        let t1 = turn(s, "t1", created.receipt.revision);
        let receipt = engine.commit_turn_async(t1.clone()).await.unwrap().receipt();
        assert_eq!(engine.commit_turn_async(t1).await.unwrap(), TurnOutcome::AlreadyCommitted(receipt));
        let stale = turn(s, "t2", created.receipt.revision);
        assert!(matches!(
            engine.commit_turn_async(stale).await,
            Err(Error::Rejected(Rejection::RevisionConflict { .. }))
        ));
        assert!(matches!(engine.append_context_async(context(s, "k", "v")).await, Ok(ContextOutcome::Staged(_))));
        assert_eq!(engine.append_context_async(context(s, "k", "v")).await.unwrap(), ContextOutcome::Duplicate);
        assert!(engine.record_tool_call_async(tool_call(s, "op", "bash", "{}")).await.unwrap().created);
        assert!(engine.record_tool_result_async(tool_result(s, "op", "ok")).await.unwrap().created);
        let labels = SetLabels { session: s, set: [("k".into(), "v".into())].into(), remove: Default::default() };
        assert!(engine.set_labels_async(labels.clone()).await.unwrap().is_some());
        assert_eq!(engine.set_labels_async(labels).await.unwrap(), None);
        let fork = engine.fork_at_async(s, 1).await.unwrap();
        assert_eq!(engine.head(fork.session).unwrap().unwrap().revision, revision_of(&[Message::system("sys")]));
        let replaced = engine.fork_replace_async(s, 1, Message::user("other")).await.unwrap();
        assert_ne!(replaced.session, fork.session);
        let rewritten = engine
            .rewrite_async(rewrite(
                s,
                receipt.revision,
                1,
                3,
                vec![Message::system("summary")],
                RewriteReason::Compaction,
            ))
            .await
            .unwrap();
        engine.restore_async(restore(s, rewritten.revision, receipt.revision)).await.unwrap();
        assert!(engine.archive_async(s, "done").await.unwrap());
        assert!(!engine.archive_async(s, "again").await.unwrap());
        assert!(engine.revive_async(s, "back").await.unwrap() > 0);
        let outcomes = engine
            .batch_async(vec![
                Command::AppendContext(context(s, "k2", "v2")),
                Command::AppendContext(context(s, "k3", "v3")),
            ])
            .await
            .unwrap();
        assert_eq!(outcomes.len(), 2);
        assert!(matches!(
            engine.execute_async(Command::AppendContext(context(s, "k2", "v2"))).await,
            Ok(Outcome::Duplicate)
        ));
        let metadata = SetMetadata { session: s, metadata: b"m".to_vec(), expected: Expected::Any };
        assert!(engine.set_metadata_async(metadata.clone()).await.unwrap().is_some());
        assert_eq!(engine.set_metadata_async(metadata).await.unwrap(), None);
        let mut state = SetHostState::new(s, Expected::Any);
        state.state.set.insert("cursor".into(), b"7".to_vec());
        assert!(engine.set_host_state_async(state).await.unwrap().is_some());
        let forked = Fork { parent: s, session: new_session_id(), index: 1, replacement: None, labels: None };
        let forked = engine.fork_async(forked).await.unwrap();
        engine.checkpoint_async().await.unwrap();
        engine.rebuild_async(ProjectionSet::all()).await.unwrap();

        // A session copied into another database, twice: the second copy writes nothing.
        let other = Db::new();
        let target = other.open();
        let export = engine.export_session(forked.session, true).unwrap();
        let copied = target.copy_in_async(export.clone()).await.unwrap();
        assert!(copied.already_present.is_empty());
        assert!(!target.copy_in_async(export).await.unwrap().already_present.is_empty());
        // The whole log imported into an empty database.
        let imported = Db::new().open();
        let records: Vec<Record> = all_events(&engine).into_iter().map(|e| e.record).collect();
        let content =
            records.iter().flat_map(|r| r.event.content_refs()).filter_map(|id| engine.content(id).unwrap()).collect();
        imported.import_async(records, content).await.unwrap();
        assert_eq!(tip_seq(&imported), tip_seq(&engine));
    });
    let engine2 = engine.clone();
    engine.close().unwrap();
    let closed = current_thread().block_on(
        engine2.commit_turn_async(CommitTurn::new(new_session_id(), "x", Expected::Any).message(Message::user("m"))),
    );
    assert!(matches!(closed, Err(Error::Closed)), "{closed:?}");
}

/// Polls `future` once with a waker that does nothing.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_dropped_reply_does_not_cancel_its_command() {
    let db = Db::new();
    let engine = db.open_durable();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let notices = engine.subscribe();

    // Never polled.
    let first = turn(s, "t1", rev0);
    drop(engine.commit_turn_async(first.clone()));
    // Polled once, still waiting, then dropped.
    let second = CommitTurn::new(s, "t2", Expected::Any).message(Message::user("more"));
    let mut reply = engine.commit_turn_async(second.clone());
    if poll_once(&mut reply).is_pending() {
        drop(reply);
    }
    for _ in 0..2 {
        notices.recv_timeout(Duration::from_secs(10)).expect("the dropped command committed");
    }
    // The retries answer as retries: nothing is written twice.
    assert!(matches!(engine.commit_turn(first), Ok(TurnOutcome::AlreadyCommitted(_))));
    assert!(matches!(engine.commit_turn(second), Ok(TurnOutcome::AlreadyCommitted(_))));
    assert_eq!(tip_seq(&engine), 3);
}

fn commit_n(engine: &Engine, session: SessionId, prefix: &str, n: usize) -> Vec<Receipt> {
    (0..n)
        .map(|i| {
            let turn = CommitTurn::new(session, format!("{prefix}{i}"), Expected::Any).message(Message::user("m"));
            engine.commit_turn(turn).unwrap().receipt()
        })
        .collect()
}

#[test]
fn a_lagging_stream_gets_lagged_with_the_first_missed_seq_then_resumes() {
    let db = Db::new();
    let engine = db.open();
    let (s, _) = create(&engine, &[Message::system("sys")]);
    let mut stream = engine.subscribe_stream_with_depth(2);
    let receipts = commit_n(&engine, s, "a", 10);
    let seq = |i: usize| receipts[i].seq;

    current_thread().block_on(async {
        // The two notices the queue held, then the lag at the third.
        for i in 0..2 {
            let Some(StreamItem::Commit(n)) = stream.recv().await else { panic!("expected commit {i}") };
            assert_eq!((n.first_seq, n.last_seq, n.sessions.as_slice()), (seq(i), seq(i), &[s][..]));
        }
        assert_eq!(stream.recv().await, Some(StreamItem::Lagged { resume_from: seq(2) }));
        // Resuming: the log from there holds everything missed.
        let missed = engine.events(EventQuery { from_seq: seq(2), max_events: 100, max_bytes: 1 << 20 }).unwrap();
        let missed: Vec<u64> = missed.events.iter().map(|e| e.record.seq).collect();
        assert_eq!(missed, (seq(2)..=seq(9)).collect::<Vec<_>>());
        // Then notices again, from the next commit on.
        let next = commit_n(&engine, s, "b", 2);
        for receipt in next {
            let Some(StreamItem::Commit(n)) = stream.recv().await else { panic!("expected a commit") };
            assert_eq!(n.first_seq, receipt.seq);
        }
    });
    // A stream ends when the engine closes, after a lag still to report.
    commit_n(&engine, s, "c", 3);
    engine.close().unwrap();
    let items: Vec<StreamItem> = current_thread().block_on(async {
        let mut items = Vec::new();
        while let Some(item) = stream.recv().await {
            items.push(item);
        }
        items
    });
    assert_eq!(items.len(), 3, "{items:?}");
    assert!(matches!(items[2], StreamItem::Lagged { .. }), "{items:?}");
    use futures_core::FusedStream;
    assert!(stream.is_terminated());
}

#[test]
fn a_slow_consumer_that_resumes_from_the_log_sees_every_commit() {
    const PRODUCERS: usize = 4;
    const TURNS: usize = 100;
    let db = Db::new();
    let engine = db.open();
    let mut stream = engine.subscribe_stream_with_depth(4);
    // Producers on threads of their own, so they keep committing while the consumer sleeps.
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let (s, _) = create(&engine, &[Message::system("s")]);
                commit_n(&engine, s, &format!("p{p}-"), TURNS);
            })
        })
        .collect();
    let total = (PRODUCERS * (1 + TURNS)) as u64;
    let (seen, lags) = current_thread().block_on(async {
        let mut seen = BTreeSet::new();
        let mut lags = 0;
        let mut last_delivered = 0;
        // After a lag, no notice of a commit before it.
        let mut lag_floor = 0;
        while (seen.len() as u64) < total {
            match stream.recv().await.expect("the stream ended early") {
                StreamItem::Commit(n) => {
                    assert!(n.first_seq > last_delivered, "notices out of order");
                    assert!(n.first_seq >= lag_floor, "a notice before the lag at {lag_floor} came after it");
                    last_delivered = n.last_seq;
                    seen.extend(n.first_seq..=n.last_seq);
                }
                StreamItem::Lagged { resume_from } => {
                    lags += 1;
                    lag_floor = resume_from;
                    assert!(resume_from > last_delivered, "a commit before the lag ended at or after {resume_from}");
                    let mut from_seq = resume_from;
                    loop {
                        let page = engine.events(EventQuery { from_seq, max_events: 64, max_bytes: 1 << 20 }).unwrap();
                        seen.extend(page.events.iter().map(|e| e.record.seq));
                        if !page.has_more {
                            break;
                        }
                        from_seq = page.next_seq;
                    }
                }
            }
            // A slow consumer (blocking its thread on purpose): the producers get ahead.
            std::thread::sleep(Duration::from_micros(300));
        }
        (seen, lags)
    });
    for producer in producers {
        producer.join().unwrap();
    }
    println!("{lags} lags");
    assert!(lags > 0, "the consumer never lagged");
    assert_eq!(seen, (1..=total).collect::<BTreeSet<_>>());
}

#[test]
fn a_stream_hears_no_rejection_and_a_stream_opened_after_close_ends() {
    let db = Db::new();
    let engine = db.open();
    let (s, rev0) = create(&engine, &[Message::system("sys")]);
    let mut stream = engine.subscribe_stream();
    commit_n(&engine, s, "a", 1);
    assert!(engine.commit_turn(turn(s, "stale", rev0)).is_err());
    let other = engine.clone();
    engine.close().unwrap();
    let items = current_thread().block_on(async {
        let mut items = Vec::new();
        while let Some(item) = stream.recv().await {
            items.push(item);
        }
        items
    });
    assert_eq!(items.len(), 1, "{items:?}");
    let mut late = other.subscribe_stream();
    assert_eq!(current_thread().block_on(late.recv()), None);
}

/// A synchronous commit never overtakes a request the same thread queued before it: a
/// lone committer commits on its own thread only while nothing is queued or running on
/// the writer thread.
#[test]
fn a_synchronous_commit_lands_after_the_async_one_queued_before_it() {
    let db = Db::new();
    let engine = db.open_durable();
    let runtime = current_thread();
    let (s, mut rev) = create(&engine, &[Message::system("sys")]);
    let (t, mut other) = create(&engine, &[Message::system("sys")]);
    for i in 0..50 {
        let queued = engine.commit_turn_async(turn(s, &format!("async-{i}"), rev));
        let here = engine.commit_turn(turn(t, &format!("sync-{i}"), other)).unwrap().receipt();
        let first = runtime.block_on(queued).unwrap().receipt();
        assert!(first.seq < here.seq, "round {i}: the queued commit {} lands first, not {}", first.seq, here.seq);
        (rev, other) = (first.revision, here.revision);
    }
    // Alone again, it commits on its own thread. A pause before each commit lets the
    // writer thread let go of the state after its last reply: a caller woken by that
    // reply can find the state still held on a busy machine, and queue.
    let before = engine.stats().caller_commits;
    for i in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(1));
        other = engine.commit_turn(turn(t, &format!("alone-{i}"), other)).unwrap().receipt().revision;
    }
    assert!(engine.stats().caller_commits > before);
    engine.close().unwrap();
}
