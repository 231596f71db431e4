//! # annal
//!
//! An event-sourced storage engine for AI-agent sessions, built on redb.
//!
//! Every mutation is a [`Command`]. A pure [`decide()`] validates it against the current
//! state and either rejects it with a typed [`Rejection`] (nothing written) or returns
//! the event it causes. A pure [`evolve()`] folds events into projections: session heads,
//! transcripts, revision graphs, context, turn records, usage, labels and the tool
//! ledger. The live writer and offline replay run the same `evolve`, so projections are
//! disposable: [`Engine::rebuild`] refolds them from the log at any time.
//!
//! The log is the database. The writer group-commits whatever is queued into one
//! append: one frame in the log's journal and one fsync ([`journal`]). The frame holds
//! the batch's records, the bytes of the content they introduce, and the changes to
//! streamed drafts waiting to be written (new segments, removed drafts), nothing else.
//! Without a journal ([`Durability::Relaxed`], [`Engine::open_with_backend`]) the same
//! rows go into one redb transaction. It folds each durable batch into an in-memory
//! delta; behind the commits, an absorber moves the journalled rows into the log file
//! and a checkpointer writes the delta into a projections file beside it, and an open
//! after a crash appends what the journal holds and folds the log past the last
//! checkpoint. Every query reads one [`View`]
//! (checkpoint plus delta at one sequence number), so it sees every acknowledged commit
//! and never blocks the writer.
//!
//! ```
//! use annal::{CommitTurn, CreateSession, Engine, Expected, Message, PageRequest, Rejection, Error};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path().join("sessions.redb")).unwrap();
//!
//! // A session with a system prompt.
//! let created = engine
//!     .create_session(CreateSession::new().label("project", "demo").message(Message::system("Be brief.")))
//!     .unwrap();
//! let session = created.session;
//!
//! // A turn, committed against the head it was produced from.
//! let turn = CommitTurn::new(session, "turn-1", Expected::Exact(created.receipt.revision))
//!     .message(Message::user("What is 2 + 2?"))
//!     .message(Message::assistant("4"))
//!     .usage("anthropic", "claude", 120, 3);
//! let receipt = engine.commit_turn(turn.clone()).unwrap().receipt();
//!
//! // A retry after a lost acknowledgement returns the original receipt.
//! assert_eq!(engine.commit_turn(turn).unwrap().receipt(), receipt);
//!
//! // A turn against a stale head is rejected, and nothing is written.
//! let stale = CommitTurn::new(session, "turn-2", Expected::Exact(created.receipt.revision))
//!     .message(Message::user("again"));
//! assert!(matches!(
//!     engine.commit_turn(stale),
//!     Err(Error::Rejected(Rejection::RevisionConflict { .. }))
//! ));
//!
//! let page = engine.transcript(session, PageRequest::first(10)).unwrap();
//! assert_eq!(page.total, 3);
//! assert_eq!(page.messages[2].message.body, b"4");
//! engine.close().unwrap();
//! ```
//!
//! ## Host guide: fences, retries and turns without messages
//!
//! - **Retries.** Every command is idempotent by its key (turn id, context key, tool op
//!   id). Send the same request again after a lost acknowledgement: an exact retry
//!   answers as one (`AlreadyCommitted` with the original receipt, `Duplicate`,
//!   `created: false`), even if the session was archived meanwhile. The same key with
//!   other content is a conflict (`TurnConflict`, `ContextConflict`, `ToolConflict`).
//! - **Fences.** `Expected::Exact(revision)` compares the transcript's content: use it
//!   when the write depends on the messages the host read (a model call's context). It
//!   passes again after a restore brings the same messages back, and events that do not
//!   touch the transcript do not move it. `Expected::Version(stream_seq)` compares the
//!   session's stream sequence number, which every event moves and nothing moves back:
//!   use it when the write depends on anything about the session (context, tool state,
//!   labels) or must not pass after an undo (`VersionConflict { expected, actual }`).
//! - **Turns without messages.** A failed or cancelled model call still used tokens: a
//!   turn may carry usage, applied context or tool references and no message. It moves
//!   the ledgers and the stream, not the revision; a turn with none of these is
//!   `InvalidRequest`.
//!
//! ```
//! use annal::{CommitTurn, CreateSession, Engine, Error, Expected, Message, Rejection};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path().join("sessions.redb")).unwrap();
//! let created = engine.create_session(CreateSession::new().message(Message::system("Be brief."))).unwrap();
//! let session = created.session;
//! let read = engine.head(session).unwrap().unwrap();
//!
//! // The model call failed after it used tokens: record them, fenced on what was read.
//! let failed = CommitTurn::new(session, "turn-1", Expected::Version(read.stream_seq)).usage("acme", "m1", 900, 0);
//! let receipt = engine.commit_turn(failed).unwrap().receipt();
//! assert_eq!(receipt.revision, read.revision);
//!
//! // A second writer that read the same head is fenced out.
//! let late = CommitTurn::new(session, "turn-2", Expected::Version(read.stream_seq)).message(Message::user("hi"));
//! assert!(matches!(engine.commit_turn(late), Err(Error::Rejected(Rejection::VersionConflict { .. }))));
//! engine.close().unwrap();
//! ```
//!
//! ## Host guide: many workers, one session, and streamed answers
//!
//! - **Execution leases.** A worker takes the session's lease
//!   ([`Engine::acquire_lease`]) and sends its commands through
//!   [`Engine::fenced`]`(lease.fence())`. Another worker gets `Busy` while the lease is
//!   live; after it expires (or is released) a takeover gets a larger token, and every
//!   command of the old holder is refused with `Fenced` and writes nothing. Renew
//!   ([`Engine::renew_lease`]) well within the time to live; renewals cost no write.
//! - **Streamed drafts.** While a model streams, append its output to a draft
//!   ([`Engine::append_draft`]): other readers see it at once ([`Engine::drafts`]), a
//!   crash keeps it up to the last flush (`Options::draft_flush_interval`), and it never
//!   enters the hash-chained log. The turn with the final message names it
//!   ([`CommitTurn::finalizes`]) and removes it atomically. After a restart,
//!   [`Engine::abandoned_drafts`] lists what the last run left: resume or discard it.
//! - **The input inbox.** User input that arrives while a turn runs, or while the session
//!   is idle, is queued durably ([`Engine::enqueue_input`], idempotent by input id). The
//!   lease holder claims it ([`Engine::claim_inputs`] with its token): the live turn takes
//!   active-turn inputs at a checkpoint of its own, the next turn takes next-turn inputs
//!   once the session is idle. The turn that uses them names them
//!   ([`CommitTurn::consumes`]) and completes them in its own commit. A claim expires;
//!   [`Engine::abandon_claim`] gives it back at once.
//!
//! ```
//! use annal::{ClaimInputs, ClaimTarget, CommitTurn, CreateSession, Engine, Error, Expected, InputKind, Message, Rejection};
//! use std::time::Duration;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path().join("sessions.redb")).unwrap();
//! let session = engine.create_session(CreateSession::new()).unwrap().session;
//!
//! let lease = engine.acquire_lease(session, "worker-1", Duration::from_secs(30)).unwrap();
//! let worker = engine.fenced(lease.fence());
//! assert!(matches!(
//!     engine.acquire_lease(session, "worker-2", Duration::from_secs(30)),
//!     Err(Error::Rejected(Rejection::Busy { .. }))
//! ));
//!
//! // The answer streams into a draft, then the final turn replaces it.
//! for chunk in ["Four", " is", " the answer."] {
//!     worker.append_draft(session, "reply-1", chunk).unwrap();
//! }
//! assert_eq!(engine.drafts(session, 1 << 20)[0].segments.len(), 3);
//! let turn = CommitTurn::new(session, "turn-1", Expected::Any)
//!     .message(Message::assistant("Four is the answer."))
//!     .finalizes("reply-1");
//! worker.commit_turn(turn).unwrap();
//! assert!(engine.drafts(session, 1 << 20).is_empty());
//!
//! // Input that arrived meanwhile waits in the inbox for the next turn.
//! engine.enqueue_input(session, "in-1", Message::user("thanks! and 5 + 5?"), InputKind::NextTurn).unwrap();
//! let claim = worker
//!     .claim_inputs(ClaimInputs {
//!         session,
//!         token: lease.token,
//!         owner: lease.owner.clone(),
//!         target: ClaimTarget::NextTurn,
//!         ttl_ms: 30_000,
//!         max: 8,
//!     })
//!     .unwrap();
//! assert_eq!(claim.inputs, ["in-1"]);
//! let next = CommitTurn::new(session, "turn-2", Expected::Any)
//!     .message(Message::user("thanks! and 5 + 5?"))
//!     .message(Message::assistant("10"))
//!     .consumes("in-1");
//! worker.commit_turn(next).unwrap();
//! assert!(engine.inbox(session).unwrap().is_empty());
//! worker.release_lease(&lease).unwrap();
//! engine.close().unwrap();
//! ```
//!
//! ## Host guide: async hosts
//!
//! Every command method has an async twin named with `_async`
//! ([`Engine::commit_turn_async`], [`Engine::create_session_async`], ...,
//! [`Engine::execute_async`], [`Engine::batch_async`]). It queues the same request for the
//! writer and returns a [`Reply`], a future of the same result that works on any executor:
//! the writer thread completes it and wakes the task. No runtime thread waits while the
//! writer decides and fsyncs, so a thousand tasks can commit at once on one
//! current-thread runtime, and group commit gathers them into a few transactions.
//!
//! - **Queued when called.** The request is queued when the `_async` method returns; the
//!   future only waits for the answer. Dropping it does not cancel the command: it is
//!   decided and, if accepted, committed and announced to subscribers. To learn the
//!   outcome after giving up on a reply, send the same command again: the retry rules
//!   above make it answer as a retry, never write twice.
//! - **What runs on the calling task.** Compressing the command's content (lz4, or
//!   zstd under [`Compression::Zstd`], in proportion to its bytes) and queuing it. When more than
//!   [`Options::queue_depth`] requests (4096 by default) are queued already, the call
//!   blocks the calling thread until the writer takes one: a host with more requests in
//!   flight raises the depth.
//! - **Queries stay synchronous.** A query reads an MVCC snapshot (a [`View`] of the
//!   checkpoint plus the in-memory delta) and never waits for the writer or the disk:
//!   on the reference machine a head read takes 0.1 µs and a page of 20 messages of a
//!   transcript 26 µs (`docs/benchmarks.md`, Micro-benchmarks). Call them directly from
//!   async code: they take a task about as long as a hand-off to a blocking pool would.
//! - **Commit notices as a stream.** [`Engine::subscribe_stream`] is a
//!   [`futures_core::Stream`] of [`StreamItem`]s (or call [`CommitStream::recv`]). A
//!   consumer that falls its queue's depth behind is not dropped: after the commits it
//!   holds it gets [`StreamItem::Lagged`] `{ resume_from }`. Read the log from
//!   `resume_from` with [`Reader::events`] to catch up; the commits the stream yields
//!   after that may overlap the read, so skip those whose seqs it covered.
//!
//! ```
//! use annal::{CommitTurn, CreateSession, Engine, EventQuery, Expected, Message, StreamItem, TurnOutcome};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path().join("sessions.redb")).unwrap();
//! // Any executor will do; this one runs on the calling thread.
//! let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! runtime.block_on(async {
//!     let mut notices = engine.subscribe_stream();
//!     let system = CreateSession::new().message(Message::system("Be brief."));
//!     let session = engine.create_session_async(system).await.unwrap().session;
//!
//!     // Ten turns queued at once: the writer commits them together.
//!     let turn = |n: u32| CommitTurn::new(session, format!("turn-{n}"), Expected::Any).message(Message::user("next"));
//!     let replies: Vec<_> = (1..=10).map(|n| engine.commit_turn_async(turn(n))).collect();
//!     for reply in replies {
//!         assert!(matches!(reply.await.unwrap(), TurnOutcome::Committed(_)));
//!     }
//!
//!     // A dropped reply does not cancel its command; the retry answers as one.
//!     drop(engine.commit_turn_async(turn(11)));
//!     assert!(matches!(engine.commit_turn_async(turn(11)).await.unwrap(), TurnOutcome::AlreadyCommitted(_)));
//!
//!     // Queries are synchronous snapshot reads.
//!     let head = engine.head(session).unwrap().unwrap();
//!     assert_eq!(head.stream_seq, 12);
//!
//!     // Every commit once, in order; after a lag, catch up from the log.
//!     let mut last_seen = 0;
//!     while last_seen < 12 {
//!         match notices.recv().await.unwrap() {
//!             StreamItem::Commit(notice) => last_seen = last_seen.max(notice.last_seq),
//!             StreamItem::Lagged { resume_from } => {
//!                 let query = EventQuery { from_seq: resume_from, max_events: 1000, max_bytes: 1 << 20 };
//!                 let missed = engine.events(query).unwrap();
//!                 last_seen = missed.events.last().map_or(last_seen, |e| e.record.seq);
//!             }
//!         }
//!     }
//! });
//! engine.close().unwrap();
//! ```
//!
//! ## Host guide: erasing a session
//!
//! A purge erases every byte the host supplied for a session (and, on request, its fork
//! descendants) from both files, keeps the chain verifiable, and leaves a
//! `SessionPurged` tombstone: queries on the session then answer
//! [`Rejection::Purged`] `{ session, seq }` and listings hide it. It rewrites the files,
//! so it needs them to itself: a running host calls [`Engine::purge`], which decides the
//! request on the engine, then closes it, purges, and gives back a reopened engine
//! (offline: [`purge()`] or `annal purge`). Content that other sessions reach stays.
//! [`Engine::collect_garbage`] removes, online and in batches between commits, content
//! that nothing reaches any more (`docs/design.md` §7f; what is erased and what is not:
//! `docs/guarantees.md`, Erasure).
//!
//! ```
//! use annal::{CreateSession, Engine, Error, Message, PurgeRequest, Rejection};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path().join("sessions.redb")).unwrap();
//! let leaving = engine.create_session(CreateSession::new().message(Message::user("my address is ..."))).unwrap().session;
//! let staying = engine.create_session(CreateSession::new().message(Message::user("hello"))).unwrap().session;
//!
//! let request = PurgeRequest::new(leaving, "gdpr-art17", "dpo@example.com");
//! let (engine, report) = engine.purge(&request).unwrap();
//! let seq = report.unwrap().purged[0].1;
//! assert_eq!(engine.head(leaving), Err(Error::Rejected(Rejection::Purged { session: leaving, seq })));
//! assert!(engine.head(staying).unwrap().is_some());
//!
//! // Nothing is left unreachable: the purge collected as it went.
//! assert_eq!(engine.collect_garbage(256).unwrap().objects_removed, 0);
//! engine.close().unwrap();
//! ```
#![deny(missing_docs)]

mod absorb;
pub mod backend;
pub mod buckets;
mod cache;
pub mod checkpoint;
pub mod clock;
pub mod collect;
pub mod command;
pub mod compact;
pub mod copy;
pub mod decide;
pub mod delta;
pub mod draft;
pub mod engine;
pub mod error;
pub mod evolve;
pub mod fault;
pub mod filter;
mod import;
pub mod journal;
pub mod limits;
mod log;
pub mod migrate;
mod packed;
pub mod pieces;
mod pool;
pub mod projection;
pub mod purge;
pub mod query;
pub mod reader;
pub mod rebuild;
mod reply;
pub mod shared;
pub mod store;
mod stream;
pub mod tables;
pub mod transcript;
pub mod unclean;
mod writer;

pub use annal_codec as codec;
pub use annal_codec::content::Compression;
pub use annal_codec::{
    ChainHash, ClaimTarget, CommitHash, ContentId, Event, EventKind, ForkOrigin, InputKind, MessageObject, Record,
    Recovery, RevisionId, Role, SessionId, ToolOutcome, Usage,
};
pub use checkpoint::CheckpointPolicy;
pub use clock::{Clock, ManualClock, SystemClock};
pub use collect::CollectReport;
pub use command::{
    new_session_id, AcquireLease, AppendContext, AppendDraft, ClaimInputs, Command, CommitTurn, CreateSession,
    EnqueueInput, Expected, Fence, Fork, Lease, Message, Outcome, Receipt, RecordToolCall, RecordToolResult,
    RenewLease, Restore, Rewrite, RewriteReason, SetHostState, SetLabels, SetMetadata, StateChanges, LEASE_TTL_MS_MAX,
};
pub use compact::{compact, recompress, CompactStats, RecompressStats};
pub use copy::{CopyOutcome, SessionExport};
pub use decide::{check_fence, decide, materialize, outcome_of, Decision, Now, Renewal, Renewals};
pub use delta::{View, HEAD_CACHE_ENTRIES_MAX};
pub use draft::{Draft, DraftSummary};
pub use engine::{
    database_files, projections_path, recover_log, ContextOutcome, Durability, Engine, EngineStats, LogRecovery,
    Options, SessionReceipt, StatsSnapshot, ToolReceipt, TurnOutcome, CONTENT_CACHE_BYTES, DRAFT_FLUSH_INTERVAL,
};
pub use error::{Error, Limit, Location, Rejection, Result, StorageFailure};
pub use evolve::evolve;
pub use import::ImportStats;
pub use journal::{journal_paths, JOURNAL_BYTES_MAX, JOURNAL_SWITCH_BYTES};
pub use limits::Limits;
pub use log::{FileRecords, LogEntry, LogTail};
pub use migrate::migrate;
pub use projection::*;
pub use purge::{collect_garbage, purge, ErasureReport, PurgeRequest, Reclaimed};
pub use query::{
    Claim, EventPage, EventQuery, ListOrder, ListQuery, Page, PageRequest, QueuedInput, RevisionGraph, RevisionPage,
    StoredEvent, StoredMessage, TableDigest, TranscriptPage,
};
pub use reader::Reader;
pub use rebuild::rebuild_offline;
pub use rebuild::RebuildStats;
pub use reply::Reply;
pub use store::{HashStore, MemStore, Overlay, RowMap, Rows, Store, StoreExt, Table};
pub use stream::{CommitStream, StreamItem};
pub use writer::{CommitNotice, SUBSCRIBER_QUEUE_MAX};

#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
