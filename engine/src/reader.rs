//! The read side: queries over MVCC snapshots. An [`crate::Engine`] reads through its
//! own `Reader`; [`Reader::open`] opens a database read-only, even beside a live writer
//! in another process.

use crate::copy::SessionExport;
use crate::delta::{Delta, View};
use crate::error::{fail_closed, Result};
use crate::limits::Limits;
use crate::projection::*;
use crate::query::{self, *};
use crate::store::StoreExt;
use annal_codec::{ChainHash, ContentId, LogChain, RevisionId, SessionId};
use parking_lot::Mutex;
use redb::ReadableDatabase;
use std::path::Path;
use std::sync::Arc;

/// Read-only access to a database: every query, no writes. Cheap to clone.
#[derive(Clone)]
pub struct Reader {
    source: Arc<Source>,
    limits: Limits,
    chain: LogChain,
}

/// Where a reader's views come from.
struct Source {
    delta: Arc<Delta>,
    /// The writer's lease renewals, for an engine's own reader.
    renewals: Option<Arc<Mutex<crate::decide::Renewals>>>,
    /// For a read-only opener: the log it follows, folded into its own delta before each
    /// view (the delta keeps the databases open: `Delta::with_anchor`).
    follow: Option<Follow>,
}

struct Follow {
    log: Arc<dyn ReadableDatabase + Send + Sync>,
    /// The journal beside the log file: commits the log file does not hold yet.
    journal: crate::journal::Follower,
    lock: Mutex<()>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

/// The page cache of a [`Reader::open`]: offline tools read most pages once, in key
/// order, so a larger cache only costs memory (redb's default is 1 GiB).
pub const READER_CACHE_BYTES: usize = 64 << 20;

/// The revision cache of a [`Reader::open`] ([`crate::decide::materialize`]'s walk over
/// a revision's recipes stops at a list an earlier walk rebuilt): the share of an engine
/// with the default [`crate::CONTENT_CACHE_BYTES`], a sixteenth (4 MiB). It keeps ids
/// alone, which never go stale, so a reader beside a live host keeps one; the reader
/// keeps no content cache (what a host's purge erases must not be served from a
/// reader's memory).
pub const READER_REVISION_CACHE_BYTES: u64 = crate::CONTENT_CACHE_BYTES as u64 / 16;

impl Reader {
    /// The engine's own reader, over its live delta.
    pub(crate) fn live(
        delta: Arc<Delta>,
        limits: Limits,
        chain: LogChain,
        renewals: Option<Arc<Mutex<crate::decide::Renewals>>>,
    ) -> Reader {
        Reader { source: Arc::new(Source { delta, follow: None, renewals }), limits, chain }
    }

    /// Opens `path` read-only, with a page cache of [`READER_CACHE_BYTES`]. Works while
    /// another process has it open for writing with the default (durable) options. The
    /// reader starts from the projections file's last checkpoint (or from nothing if
    /// there is none usable) and folds the log past it in memory, so it sees every
    /// durable commit (and possibly a last one whose fsync the writer is still waiting
    /// for: `docs/guarantees.md`, Durability); each query first folds whatever was
    /// committed since.
    /// `chain_key` is needed to verify event pages of a keyed database.
    pub fn open(path: impl AsRef<Path>, limits: Limits, chain_key: Option<[u8; 32]>) -> Result<Reader> {
        limits.validate()?;
        let path = path.as_ref();
        // A file whose writer was killed opens too: redb's repair runs in memory
        // (`crate::unclean`), and nothing is written to it.
        let open = |path: &Path| crate::unclean::open_read_only(path, READER_CACHE_BYTES);
        let log = fail_closed("open read-only", || Ok(open(path)?))?;
        let projections_path = crate::engine::projections_path(path);
        // While an erasure is unfinished the projections file may still hold what the
        // purge erased from the log: fold the whole log instead.
        // Its first read: a file redb cannot read fails here with its own error (the
        // reads after it would only say that an earlier one failed).
        let unfinished = fail_closed("open read-only", || crate::purge::erasure_unfinished(&log.begin_read()?))?;
        let projections = match projections_path.exists() && !unfinished {
            true => open(&projections_path).ok(),
            false => None,
        };
        let chain = chain_key.map_or_else(LogChain::plain, LogChain::keyed);
        let journal = crate::journal::Follower::new(path);
        let empty = Arc::new(crate::checkpoint::empty_projections()?);
        let delta = fail_closed("open read-only", || match &projections {
            Some(p) => crate::checkpoint::read_only_delta(log.clone(), &**p, &empty, &journal, &chain, &limits),
            None => crate::checkpoint::read_only_delta(log.clone(), &*empty, &empty, &journal, &chain, &limits),
        })?;
        // The delta's views keep the databases they read open, whatever outlives what:
        // the reader, or a view taken from it.
        let delta = delta
            .with_anchor(Arc::new((log.clone(), projections, empty)))
            .with_revision_cache(READER_REVISION_CACHE_BYTES);
        let follow = Follow { log, journal, lock: Mutex::new(()) };
        Ok(Reader {
            source: Arc::new(Source { delta: Arc::new(delta), follow: Some(follow), renewals: None }),
            limits,
            chain,
        })
    }

    /// A consistent view at the last durable commit: the projections (checkpoint plus
    /// delta) and the log at one seq, for callers that need several reads to agree (and
    /// for the functions in [`crate::query`]).
    pub fn snapshot(&self) -> Result<View> {
        self.follow()?;
        Ok(self.source.delta.view())
    }

    /// For a read-only opener: folds what was committed since the last query (the log
    /// file's records past its delta, then the journal's) into its delta.
    fn follow(&self) -> Result<()> {
        if let Some(follow) = &self.source.follow {
            let _guard = follow.lock.lock();
            let (delta, journal) = (&self.source.delta, &follow.journal);
            crate::checkpoint::fold_tail(delta, &*follow.log, journal, &self.chain, &self.limits)?;
        }
        Ok(())
    }

    /// The record chain this reader verifies with.
    pub fn chain(&self) -> &LogChain {
        &self.chain
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The head of `session`, if it exists.
    /// Served from the heads rows the engine keeps in memory, which every batch updates
    /// as it is published, so a head read agrees with every other query.
    pub fn head(&self, session: SessionId) -> Result<Option<SessionHead>> {
        fail_closed("head", || {
            self.follow()?;
            Ok(self.source.delta.head(&session.0)?.map(|head| (*head).clone()))
        })
    }

    /// The open inputs of `session`'s inbox (queued, neither consumed nor cancelled), in
    /// queue order, with their state: pending, or held by a claim (which may have
    /// expired: see [`crate::Engine::pending_inputs`] for what a claim may take now).
    pub fn inbox(&self, session: SessionId) -> Result<Vec<QueuedInput>> {
        fail_closed("inbox", || query::inbox(&self.snapshot()?, &self.limits, &session, |_| true))
    }

    /// The open inputs of `session` that a claim may take at `now_ms`: pending, or held by
    /// a claim that expired by then, in queue order.
    pub fn inbox_claimable(&self, session: SessionId, now_ms: u64) -> Result<Vec<QueuedInput>> {
        fail_closed("inbox", || query::inbox(&self.snapshot()?, &self.limits, &session, |s| s.claimable(now_ms)))
    }

    /// An input of `session`, whatever its state (completed and cancelled ones too).
    pub fn input(&self, session: SessionId, input_id: &str) -> Result<Option<InputRow>> {
        fail_closed("input", || {
            let view = self.snapshot()?;
            let row = view.row(crate::store::Table::Inputs, &crate::store::keys::session_str(&session, input_id))?;
            if row.is_none() {
                query::purged_check(&view, &session)?;
            }
            Ok(row)
        })
    }

    /// A claim of `session`, by the stream seq of its `InputsClaimed`.
    pub fn claim(&self, session: SessionId, claim: u64) -> Result<Option<ClaimRow>> {
        fail_closed("claim", || {
            let view = self.snapshot()?;
            let row = view.row(crate::store::Table::Claims, &crate::store::keys::session_u64(&session, claim))?;
            if row.is_none() {
                query::purged_check(&view, &session)?;
            }
            Ok(row)
        })
    }

    /// The execution lease of `session`, if one was ever granted: its holder, its token
    /// (the session's current one) and its expiry, including renewals when this is an
    /// engine's own reader (renewals are held in the writer's memory; a reader in another
    /// process sees the expiry the grant recorded). Whether it is live depends on the
    /// writer's clock: see [`LeaseState::holds`].
    pub fn lease(&self, session: SessionId) -> Result<Option<LeaseState>> {
        let Some(head) = self.head(session)? else { return Ok(None) };
        Ok(head.lease.map(|mut lease| {
            if let Some(renewals) = &self.source.renewals {
                lease.expires_at_ms = crate::decide::renewed_expiry(Some(&renewals.lock()), &session, &lease);
            }
            lease
        }))
    }

    /// The value of host state entry `name` at the session's head, if it is set.
    pub fn host_state(&self, session: SessionId, name: &str) -> Result<Option<Vec<u8>>> {
        fail_closed("host_state", || query::host_state(&self.snapshot()?, &self.limits, &session, name, None))
    }

    /// The value of host state entry `name` as of the session's stream seq `stream_seq`
    /// (what its events up to that one left it); a stream seq past the head reads the
    /// head.
    pub fn host_state_at(&self, session: SessionId, name: &str, stream_seq: u64) -> Result<Option<Vec<u8>>> {
        fail_closed("host_state_at", || {
            query::host_state(&self.snapshot()?, &self.limits, &session, name, Some(stream_seq))
        })
    }

    /// Lists sessions in creation order.
    pub fn list_sessions(&self, q: &ListQuery) -> Result<Page<SessionHead>> {
        fail_closed("list_sessions", || query::list_sessions(&self.snapshot()?, &self.limits, q))
    }

    /// A page of the current transcript.
    pub fn transcript(&self, session: SessionId, page: PageRequest) -> Result<TranscriptPage> {
        fail_closed("transcript", || query::transcript(&self.snapshot()?, &self.limits, &session, page))
    }

    /// A page of any revision the session has held.
    pub fn transcript_at(&self, session: SessionId, revision: RevisionId, page: PageRequest) -> Result<TranscriptPage> {
        fail_closed("transcript_at", || {
            query::transcript_at(&self.snapshot()?, &self.limits, &session, &revision, page)
        })
    }

    /// The session's revisions, oldest first, with the head.
    pub fn revisions(&self, session: SessionId, page: PageRequest) -> Result<RevisionPage> {
        fail_closed("revisions", || query::revisions(&self.snapshot()?, &self.limits, &session, page))
    }

    /// The session's whole revision graph.
    pub fn graph(&self, session: SessionId) -> Result<RevisionGraph> {
        fail_closed("graph", || query::graph(&self.snapshot()?, &session))
    }

    /// Every context entry of the session.
    pub fn context(&self, session: SessionId) -> Result<Vec<ContextEntry>> {
        fail_closed("context", || query::context(&self.snapshot()?, &session))
    }

    /// Pending context entries of the session.
    pub fn pending_context(&self, session: SessionId) -> Result<Vec<ContextEntry>> {
        fail_closed("pending_context", || {
            let mut all = self.context(session)?;
            all.retain(|e| e.state == ContextState::Pending);
            Ok(all)
        })
    }

    /// Usage totals per (provider, model).
    pub fn usage(&self, session: SessionId) -> Result<Vec<UsageTotals>> {
        fail_closed("usage", || query::usage(&self.snapshot()?, &session))
    }

    /// One tool operation.
    pub fn tool_op(&self, session: SessionId, op_id: &str) -> Result<Option<ToolOp>> {
        fail_closed("tool_op", || query::tool_op(&self.snapshot()?, &session, op_id))
    }

    /// The session's unsettled tool operations, in call order.
    pub fn unsettled(&self, session: SessionId) -> Result<Vec<ToolOp>> {
        fail_closed("unsettled", || query::unsettled(&self.snapshot()?, &session))
    }

    /// A page of the session's unsettled tool operations, in call order.
    pub fn unsettled_page(&self, session: SessionId, page: PageRequest) -> Result<Page<ToolOp>> {
        fail_closed("unsettled_page", || query::unsettled_page(&self.snapshot()?, &self.limits, &session, page))
    }

    /// Unsettled tool operations across every session, for crash recovery.
    pub fn unsettled_all(&self, page: PageRequest) -> Result<Page<ToolOp>> {
        fail_closed("unsettled_all", || query::unsettled_all(&self.snapshot()?, &self.limits, page))
    }

    /// The session's tool operations in the order recorded.
    pub fn tool_ops(&self, session: SessionId, page: PageRequest) -> Result<Page<ToolOp>> {
        fail_closed("tool_ops", || query::tool_ops(&self.snapshot()?, &self.limits, &session, page))
    }

    /// A page of the global log, chain-verified.
    pub fn events(&self, q: EventQuery) -> Result<EventPage> {
        fail_closed("events", || query::events(&self.snapshot()?, &self.chain, &self.limits, &q))
    }

    /// A page of one session's events, by stream seq.
    pub fn session_events(&self, session: SessionId, q: EventQuery) -> Result<EventPage> {
        fail_closed("session_events", || {
            query::session_events(&self.snapshot()?, &self.chain, &self.limits, &session, &q)
        })
    }

    /// A content object, verified against its id.
    pub fn content(&self, id: ContentId) -> Result<Option<Vec<u8>>> {
        fail_closed("content", || self.snapshot()?.content(&id, self.limits.message_object_bytes_max()))
    }

    /// The log tip as queries see it: the last durable commit, and `h(seq)`.
    pub fn tip(&self) -> Result<(u64, ChainHash)> {
        fail_closed("tip", || {
            let view = self.snapshot()?;
            Ok((view.seq(), view.hash()))
        })
    }

    /// Reads `session` (and with `ancestry` the sessions it was forked from, parent
    /// before child) for a copy into another database with [`crate::Engine::copy_in`]:
    /// every record, chain-verified, and every content object they refer to, attachments
    /// included. An unknown session is [`crate::Rejection::NotFound`].
    pub fn export_session(&self, session: SessionId, ancestry: bool) -> Result<SessionExport> {
        self.export_sessions(&[session], ancestry)
    }

    /// [`Reader::export_session`] for several sessions at once, read from one view.
    pub fn export_sessions(&self, sessions: &[SessionId], ancestry: bool) -> Result<SessionExport> {
        fail_closed("export_sessions", || {
            crate::copy::export(&self.snapshot()?, &self.chain, &self.limits, sessions, ancestry)
        })
    }

    /// Digests of every projection table (rows and blake3), to compare states byte for byte.
    pub fn projection_digests(&self) -> Result<Vec<TableDigest>> {
        fail_closed("projection_digests", || query::projection_digests(&self.snapshot()?))
    }
}
