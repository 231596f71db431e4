//! Errors, split by what the caller can do about them.
//!
//! - [`Error::Rejected`]: the command broke a rule ([`Rejection`]). Nothing was written;
//!   fix the request or re-read state and retry.
//! - [`Error::Corrupt`], [`Error::Decode`]: stored data failed verification. The engine
//!   fails closed; run `annal verify`.
//! - [`Error::Poisoned`], [`Error::Closed`], [`Error::Storage`]: the engine cannot write
//!   now. Reopen the database. A storage failure the file system reported carries its
//!   kind ([`Error::io_kind`]: a full disk is [`std::io::ErrorKind::StorageFull`]), and a
//!   poisoned engine names the failure that poisoned it (`Engine::poison_cause`).

use annal_codec::{DecodeError, RevisionId, SessionId};
use std::fmt;

/// A configurable limit (SPEC §8). Breaking one is [`Rejection::LimitExceeded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// Bytes of one content object (message, context text, tool args or result).
    ContentBytes,
    /// Bytes of one command.
    CommandBytes,
    /// Messages in one command.
    MessagesPerCommand,
    /// Labels on one session.
    LabelsPerSession,
    /// Bytes of a label key.
    LabelKeyBytes,
    /// Bytes of a label value.
    LabelValueBytes,
    /// Bytes of an id or key (turn id, op id, context key, ...).
    IdBytes,
    /// Items in one page.
    PageItems,
    /// Bytes in one page.
    PageBytes,
    /// Bytes of one encoded record.
    RecordBytes,
    /// Bytes of session metadata.
    MetadataBytes,
    /// Commands in one batch.
    BatchCommands,
    /// Attachments on one message.
    AttachmentsPerMessage,
    /// Usage entries, context keys or tool references in one turn.
    ListItems,
    /// Bytes of a note, reason, actor or source.
    NoteBytes,
    /// Bytes of a host state entry's name.
    HostStateNameBytes,
    /// Host state entries on one session (and changes in one command).
    HostStateEntries,
    /// Bytes of one draft.
    DraftBytes,
    /// Bytes of the drafts of one session.
    SessionDraftBytes,
    /// Bytes of every draft.
    DraftBytesTotal,
    /// Open inputs (queued, not consumed or cancelled) in one session's inbox.
    InboxInputs,
}

impl Limit {
    /// Every limit, in the order [`crate::Limits`] declares them.
    pub const ALL: [Limit; 21] = [
        Limit::ContentBytes,
        Limit::CommandBytes,
        Limit::MessagesPerCommand,
        Limit::LabelsPerSession,
        Limit::LabelKeyBytes,
        Limit::LabelValueBytes,
        Limit::IdBytes,
        Limit::PageItems,
        Limit::PageBytes,
        Limit::RecordBytes,
        Limit::MetadataBytes,
        Limit::BatchCommands,
        Limit::AttachmentsPerMessage,
        Limit::ListItems,
        Limit::NoteBytes,
        Limit::HostStateNameBytes,
        Limit::HostStateEntries,
        Limit::DraftBytes,
        Limit::SessionDraftBytes,
        Limit::DraftBytesTotal,
        Limit::InboxInputs,
    ];
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Limit::ContentBytes => "content_bytes_max",
            Limit::CommandBytes => "command_bytes_max",
            Limit::MessagesPerCommand => "messages_per_command_max",
            Limit::LabelsPerSession => "labels_per_session_max",
            Limit::LabelKeyBytes => "label_key_bytes_max",
            Limit::LabelValueBytes => "label_value_bytes_max",
            Limit::IdBytes => "id_bytes_max",
            Limit::PageItems => "page_items_max",
            Limit::PageBytes => "page_bytes_max",
            Limit::RecordBytes => "record_bytes_max",
            Limit::MetadataBytes => "metadata_bytes_max",
            Limit::BatchCommands => "batch_commands_max",
            Limit::AttachmentsPerMessage => "attachments_per_message_max",
            Limit::ListItems => "list_items_max",
            Limit::NoteBytes => "note_bytes_max",
            Limit::HostStateNameBytes => "host_state_name_bytes_max",
            Limit::HostStateEntries => "host_state_entries_max",
            Limit::DraftBytes => "draft_bytes_max",
            Limit::SessionDraftBytes => "session_draft_bytes_max",
            Limit::DraftBytesTotal => "draft_bytes_total_max",
            Limit::InboxInputs => "inbox_inputs_max",
        };
        f.write_str(name)
    }
}

/// Why a command was refused. A rejection writes nothing and notifies nobody.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// No such session.
    #[error("session {session} not found")]
    NotFound {
        /// The session asked for.
        session: SessionId,
    },
    /// The session was purged: its data is erased, and it takes no command and answers
    /// no query but this one.
    #[error("session {session} was purged (tombstone at seq {seq})")]
    Purged {
        /// The session.
        session: SessionId,
        /// The tombstone's seq.
        seq: u64,
    },
    /// A purge of a session that has fork descendants which are not purged, without
    /// asking for them too: a fork's history needs its parent's.
    #[error("session {session} has {} fork descendants that are not purged; purge them too", forks.len())]
    HasForks {
        /// The session.
        session: SessionId,
        /// Its descendants that are not purged.
        forks: Vec<SessionId>,
    },
    /// A session with this id exists.
    #[error("session {session} already exists")]
    AlreadyExists {
        /// The session id.
        session: SessionId,
    },
    /// The session is archived; revive it first.
    #[error("session {session} is archived")]
    Archived {
        /// The session id.
        session: SessionId,
    },
    /// Revive of a session that is not archived.
    #[error("session {session} is not archived")]
    NotArchived {
        /// The session id.
        session: SessionId,
    },
    /// The expected revision is not the head.
    #[error("revision conflict: expected {expected}, head is {actual}")]
    RevisionConflict {
        /// What the caller expected.
        expected: RevisionId,
        /// The current head.
        actual: RevisionId,
    },
    /// The expected stream sequence number is not the session's (`Expected::Version`).
    #[error("version conflict: expected stream seq {expected}, the session is at {actual}")]
    VersionConflict {
        /// What the caller expected.
        expected: u64,
        /// The session's stream sequence number.
        actual: u64,
    },
    /// Another owner holds the session's execution lease.
    #[error("the session's lease is held by {holder} until {expires_at_ms}")]
    Busy {
        /// The owner that holds it.
        holder: String,
        /// When it expires unless renewed (writer clock, unix ms).
        expires_at_ms: u64,
    },
    /// A fenced command (or a lease renewal or release) presented a token that is not the
    /// session's current lease token: a worker that lost its lease must stop.
    #[error("{}", fenced_text(*presented, *current))]
    Fenced {
        /// The token presented.
        presented: u64,
        /// The session's current token (0: no lease was ever granted).
        current: u64,
    },
    /// The input id was queued with another message or kind.
    #[error("input {input_id} was queued with other content")]
    InputConflict {
        /// The input id.
        input_id: String,
    },
    /// No input with this id was queued in the session.
    #[error("unknown input {input_id}")]
    UnknownInput {
        /// The input id.
        input_id: String,
    },
    /// The input is not in a state that allows the command (a turn consumes claimed
    /// inputs; a cancel needs one no live claim holds).
    #[error("input {input_id} is {state}")]
    InputState {
        /// The input id.
        input_id: String,
        /// `pending`, `claimed`, `completed` or `cancelled`.
        state: &'static str,
    },
    /// No claim with this seq was made in the session.
    #[error("unknown claim {claim}")]
    UnknownClaim {
        /// The claim asked for.
        claim: u64,
    },
    /// Active-turn inputs are claimed only for a turn that is running (not committed).
    #[error("turn {turn_id} is not live")]
    TurnNotLive {
        /// The turn id.
        turn_id: String,
    },
    /// Next-turn inputs are claimed only while the session is idle: no live claim for a
    /// running turn.
    #[error("the session is running turn {turn_id}")]
    NotIdle {
        /// The running turn.
        turn_id: String,
    },
    /// The turn id was committed with different content.
    #[error("turn {turn_id} was already committed with different content")]
    TurnConflict {
        /// The turn id.
        turn_id: String,
    },
    /// A turn tried to apply a context key that is not pending.
    #[error("context {key} is not pending")]
    ContextNotPending {
        /// The key.
        key: String,
    },
    /// The context key exists with other content.
    #[error("context {key} exists with other content")]
    ContextConflict {
        /// The key.
        key: String,
    },
    /// The request is malformed.
    #[error("invalid request: {reason}")]
    InvalidRequest {
        /// What is wrong.
        reason: String,
    },
    /// A limit was exceeded.
    #[error("{limit} exceeded: {actual} > {max}")]
    LimitExceeded {
        /// Which limit.
        limit: Limit,
        /// The offending size or count.
        actual: u64,
        /// The configured maximum.
        max: u64,
    },
    /// A rewrite range is out of bounds or inverted.
    #[error("invalid range {start}..{end} for a transcript of {len} messages")]
    InvalidRange {
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// Transcript length.
        len: u64,
    },
    /// The rewrite or restore would not change the transcript.
    #[error("the result equals the current head")]
    NoChange,
    /// The revision was never held by this session.
    #[error("revision {revision} is unknown in this session")]
    UnknownRevision {
        /// The revision asked for.
        revision: RevisionId,
    },
    /// A fork index is past the end.
    #[error("index {index} out of bounds for {len} messages")]
    IndexOutOfBounds {
        /// The index asked for.
        index: u64,
        /// Transcript length.
        len: u64,
    },
    /// A tool operation id was reused with other identity fields or another result.
    #[error("tool operation {op_id} conflicts on {field}")]
    ToolConflict {
        /// The op id.
        op_id: String,
        /// The differing field.
        field: &'static str,
    },
    /// A result for an operation that was never called.
    #[error("tool result for {op_id} has no call")]
    ToolOrphan {
        /// The op id.
        op_id: String,
    },
    /// A reference to a tool operation that does not exist in the session.
    #[error("unknown tool operation {op_id}")]
    UnknownToolOp {
        /// The op id.
        op_id: String,
    },
    /// A record handed to [`crate::Engine::import`] cannot be appended.
    #[error("import rejected at seq {seq}: {reason}")]
    InvalidImport {
        /// The record's sequence number.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// A session handed to [`crate::Engine::copy_in`] exists in this database with
    /// another history (other events, or more or fewer of them). Nothing was written.
    #[error("session {session} exists here with another history")]
    SessionConflict {
        /// The session id.
        session: SessionId,
    },
    /// A forked session handed to [`crate::Engine::copy_in`] names a parent that is
    /// neither in this database nor in the copy (export it with its ancestry). Nothing
    /// was written.
    #[error("session {session} is a fork of {parent}, which is neither here nor in the copy")]
    ForkParentMissing {
        /// The forked session.
        session: SessionId,
        /// Its parent.
        parent: SessionId,
    },
    /// A forked session handed to [`crate::Engine::copy_in`] names a parent that is in
    /// this database, but whose head is no longer the revision the fork was taken from,
    /// so the fork cannot be folded after it. Nothing was written.
    #[error("session {session} is a fork of {parent}, whose head here is no longer the revision it was forked from")]
    ForkParentMoved {
        /// The forked session.
        session: SessionId,
        /// Its parent.
        parent: SessionId,
    },
    /// A command inside a batch was rejected; nothing in the batch was written.
    #[error("batch command {index} rejected: {rejection}")]
    Batch {
        /// Index of the failing command.
        index: usize,
        /// Its rejection.
        rejection: Box<Rejection>,
    },
}

/// Where a corruption was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// The database file's own structure (redb's pages), below annal's tables.
    File,
    /// A log record.
    Log {
        /// Its global sequence number.
        seq: u64,
    },
    /// A content object.
    Content {
        /// Its id, hex.
        id: String,
    },
    /// A projection row.
    Projection {
        /// Table name.
        table: &'static str,
        /// Key, hex.
        key: String,
    },
    /// The meta table.
    Meta {
        /// Meta key.
        key: String,
    },
    /// The per-session index.
    SessionLog {
        /// The session.
        session: SessionId,
        /// Stream sequence number.
        stream_seq: u64,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File => write!(f, "the database file"),
            Location::Log { seq } => write!(f, "log seq {seq}"),
            Location::Content { id } => write!(f, "content {id}"),
            Location::Projection { table, key } => write!(f, "projection {table} key {key}"),
            Location::Meta { key } => write!(f, "meta {key}"),
            Location::SessionLog { session, stream_seq } => write!(f, "session_log {session}/{stream_seq}"),
        }
    }
}

/// Every error the engine returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The command broke a rule; nothing was written.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// A record in the event page exceeds the page's byte budget by itself.
    #[error("record {seq} is {size} bytes, over the page budget of {max_bytes}")]
    OversizedRecord {
        /// Its sequence number.
        seq: u64,
        /// Its encoded size.
        size: u64,
        /// The budget.
        max_bytes: u64,
    },
    /// A message in a transcript page is larger than the page's byte budget by itself.
    #[error("message at position {position} has a {size}-byte body, over the page budget of {max_bytes}")]
    OversizedMessage {
        /// Its position in the transcript.
        position: u64,
        /// Its body's size in bytes.
        size: u64,
        /// The budget.
        max_bytes: u64,
    },
    /// The configured [`crate::Limits`] cannot be used (see [`crate::Limits::validate`]);
    /// nothing was opened.
    #[error("invalid limits: {limit} {detail}")]
    InvalidLimits {
        /// The limit at fault.
        limit: Limit,
        /// Why.
        detail: String,
    },
    /// Stored data failed verification.
    #[error("corrupt data at {location}: {detail}")]
    Corrupt {
        /// Where.
        location: Location,
        /// What.
        detail: String,
    },
    /// A stored record could not be decoded, for example a newer schema version.
    #[error("cannot decode record at seq {seq}: {source}")]
    Decode {
        /// The record's sequence number.
        seq: u64,
        /// The codec's reason.
        source: DecodeError,
    },
    /// The file's format version is not this binary's.
    #[error("unsupported database format {found} (this binary supports {supported})")]
    UnsupportedFormat {
        /// Found in the file.
        found: u32,
        /// Supported.
        supported: u32,
    },
    /// The file was written by an older release in a format this binary upgrades
    /// offline: run `annal migrate` on it (or [`crate::migrate()`]).
    #[error("database format {found} must be migrated to format {supported}: run `annal migrate <path>`")]
    MigrationRequired {
        /// Found in the file.
        found: u32,
        /// What the migration writes.
        supported: u32,
    },
    /// The database has a keyed chain and the key given does not match (or none was given).
    #[error("chain key mismatch: {detail}")]
    KeyMismatch {
        /// What did not match.
        detail: String,
    },
    /// An earlier commit failed with an I/O error; reopen the database.
    #[error("engine poisoned by an earlier I/O failure; reopen the database")]
    Poisoned,
    /// The engine was closed.
    #[error("engine closed")]
    Closed,
    /// The storage layer failed.
    #[error("storage: {0}")]
    Storage(StorageFailure),
    /// The shared log a host appends to failed (`crate::Engine::open_shared`). It does
    /// not poison the engine; a command it failed may or may not have been stored, and
    /// retrying it is safe where the command is idempotent (a turn with its id).
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

impl Error {
    /// The rejection, if this is one.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Error::Rejected(r) => Some(r),
            _ => None,
        }
    }

    /// The kind of failure the file system reported, if this is a storage failure that
    /// came from one: [`std::io::ErrorKind::StorageFull`] for a full disk,
    /// [`std::io::ErrorKind::PermissionDenied`], [`std::io::ErrorKind::NotFound`], ...
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Storage(failure) => failure.io_kind(),
            _ => None,
        }
    }

    pub(crate) fn corrupt(location: Location, detail: impl Into<String>) -> Error {
        Error::Corrupt { location, detail: detail.into() }
    }

    /// A storage failure described by `detail`, with no kind from the file system.
    pub(crate) fn storage(detail: impl Into<String>) -> Error {
        Error::Storage(StorageFailure::new(detail))
    }

    /// `e` as an error, a storage failure's description led by `what` (its kind kept).
    pub(crate) fn storage_in(what: impl fmt::Display, e: impl Into<Error>) -> Error {
        match e.into() {
            Error::Storage(f) => Error::Storage(StorageFailure { detail: format!("{what}: {}", f.detail), ..f }),
            other => other,
        }
    }
}

/// What [`Error::Storage`] carries: what failed, and the kind of failure when the file
/// system reported one. It displays as the description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageFailure {
    detail: String,
    kind: Option<std::io::ErrorKind>,
}

impl StorageFailure {
    /// A failure described by `detail`, with no kind from the file system.
    pub fn new(detail: impl Into<String>) -> StorageFailure {
        StorageFailure { detail: detail.into(), kind: None }
    }

    /// A failure the file system reported as `kind`, described by `detail`.
    pub fn io(kind: std::io::ErrorKind, detail: impl Into<String>) -> StorageFailure {
        StorageFailure { detail: detail.into(), kind: Some(kind) }
    }

    /// The description.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The kind of failure the file system reported, if it came from one.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        self.kind
    }
}

impl fmt::Display for StorageFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl From<std::io::Error> for StorageFailure {
    fn from(e: std::io::Error) -> StorageFailure {
        StorageFailure::io(e.kind(), e.to_string())
    }
}

// redb's errors keep the I/O error under them: its kind comes along, with redb's words.
macro_rules! storage_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                let detail = e.to_string();
                match redb::Error::from(e) {
                    redb::Error::Io(io) => Error::Storage(StorageFailure::io(io.kind(), detail)),
                    _ => Error::storage(detail),
                }
            }
        }
    )*};
}
storage_from!(
    redb::Error,
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::DatabaseError,
    redb::SetDurabilityError,
    redb::CompactionError,
    redb::CursorError
);

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Storage(e.into())
    }
}

/// Whether the engine is poisoned (SPEC invariant 9), and by what: the first failure
/// that poisoned it, which every later [`Error::Poisoned`] stands for.
#[derive(Debug, Default)]
pub(crate) struct Poison {
    flag: std::sync::atomic::AtomicBool,
    cause: parking_lot::Mutex<Option<Error>>,
}

impl Poison {
    /// Whether the engine is poisoned.
    pub fn load(&self, order: std::sync::atomic::Ordering) -> bool {
        self.flag.load(order)
    }

    /// Poisons the engine by `cause`; the first cause is kept.
    pub fn set(&self, cause: &Error) {
        let mut kept = self.cause.lock();
        if kept.is_none() && *cause != Error::Poisoned {
            *kept = Some(cause.clone());
        }
        self.flag.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The failure that poisoned the engine, if it is poisoned.
    pub fn cause(&self) -> Option<Error> {
        match self.load(std::sync::atomic::Ordering::Acquire) {
            true => Some(self.cause.lock().clone().unwrap_or(Error::Poisoned)),
            false => None,
        }
    }
}

/// What [`Rejection::Fenced`] says: a token that is the current one was released.
fn fenced_text(presented: u64, current: u64) -> String {
    match presented == current {
        true => format!("fenced: lease token {presented} was released"),
        false => format!("fenced: token {presented} is not the session's current lease token {current}"),
    }
}

/// Runs `f`, turning a panic inside the storage layer into [`Error::Corrupt`] at
/// [`Location::File`]. redb may panic on pages it cannot make sense of; annal fails
/// closed instead of taking the host down.
pub(crate) fn fail_closed<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic_message(panic.as_ref());
            Err(Error::corrupt(Location::File, format!("{what}: the storage layer failed on damaged data: {message}")))
        }
    }
}

/// The message a panic carried (`panic!` with a literal or a formatted string), or
/// `panic` when it carried something else.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
