"""Type stubs of the native module, ``annal._annal`` (re-exported by ``annal``)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Literal

from .errors import AnnalError

Role = Literal["system", "user", "assistant", "tool"]
#: ``None`` (any head), a revision id (hex ``str``) or a stream seq (``int``).
Expected = str | int | None
#: ``(provider, model, input, output)`` or ``(..., cache_read, cache_write)``.
UsageItem = tuple[str, str, int, int] | tuple[str, str, int, int, int, int]
InputKind = Literal["next_turn", "active_turn"]
InputStateName = Literal["pending", "claimed", "completed", "cancelled"]

#: The limits every database opened from Python has (annal's defaults), by name:
#: ``messages_per_command_max``, ``command_bytes_max``, ``attachments_per_message_max``, ...
#: A command past one is refused with ``AnnalError`` kind ``limit_exceeded``.
LIMITS: dict[str, int]

def content_id(data: bytes) -> str:
    """The content id of ``data`` (blake3, hex)."""

def compact(
    path: str | os.PathLike[str], *, compression: Literal["lz4", "zstd", "off"] | None = None
) -> tuple[int, int]:
    """Compacts a closed database; returns (bytes_before, bytes_after). With
    ``compression``, every content object is first stored the way it stores new ones.
    A missing ``path`` raises ``FileNotFoundError`` (nothing is created)."""

def new_session_id() -> str:
    """A fresh UUIDv7 session id."""

class Message:
    """A message as the host hands it in."""

    role: Role
    content_type: str
    body: bytes
    attachments: list[bytes]
    def __init__(
        self,
        role: Role,
        body: bytes | bytearray | str,
        content_type: str = "text/plain",
        attachments: Sequence[bytes | bytearray | str] = (),
    ) -> None: ...
    @staticmethod
    def user(text: str) -> Message: ...
    @staticmethod
    def assistant(text: str) -> Message: ...
    @staticmethod
    def system(text: str) -> Message: ...
    @staticmethod
    def tool(text: str) -> Message: ...
    def text(self) -> str:
        """The body decoded as UTF-8."""

class Receipt:
    """Where a committed event landed."""

    seq: int
    revision: str
    committed_at_ms: int

class SessionReceipt:
    """A created (or forked) session and its first event's receipt."""

    session: str
    receipt: Receipt

class TurnResult:
    """The result of ``commit_turn``."""

    receipt: Receipt
    already_committed: bool

class Head:
    """A session's head."""

    session: str
    revision: str
    message_count: int
    archived: bool
    labels: dict[str, str]
    metadata: bytes
    forked_from: tuple[str, str, int] | None
    created_seq: int
    created_at_ms: int
    last_seq: int
    stream_seq: int
    updated_at_ms: int
    host_state: dict[str, str]

class SessionPage:
    items: list[Head]
    offset: int
    limit: int
    has_more: bool

class StoredMessage:
    position: int
    content_id: str
    role: Role
    content_type: str
    body: bytes
    attachments: list[str]

class TranscriptPage:
    session: str
    revision: str
    total: int
    offset: int
    messages: list[StoredMessage]
    has_more: bool

class RevisionNode:
    revision: str
    ordinal: int
    seq: int
    message_count: int
    created_at_ms: int
    origin: str

class RevisionPage:
    """A page of a session's revision list, with its current head."""

    head: str
    total: int
    items: list[RevisionNode]
    offset: int
    limit: int
    has_more: bool

class ContextEntry:
    key: str
    content_id: str
    source: str
    appended_seq: int
    applied_by: str | None

class UsageTotals:
    provider: str
    model: str
    input: int
    output: int
    cache_read: int
    cache_write: int
    turns: int

class ToolOp:
    session: str
    op_id: str
    ordinal: int
    call_id: str
    tool_name: str
    args_id: str
    parent_op: str | None
    turn_id: str | None
    replay_safe: bool
    call_seq: int
    outcome: Literal["ok", "error", "cancelled"] | None
    result_id: str | None

class Event:
    seq: int
    session: str
    stream_seq: int
    committed_at_ms: int
    kind: str
    detail: str
    chain_hash: str

class EventPage:
    events: list[Event]
    next_seq: int
    has_more: bool

class CommitNotice:
    first_seq: int
    last_seq: int
    sessions: list[str]
    committed_at_ms: int

class ErasureReport:
    """What a purge erased."""

    purged: list[tuple[str, int]]
    records_erased: int
    records_resealed: int
    objects_erased: int
    content_bytes_erased: int
    drafts_erased: int
    bytes_before: int
    bytes_after: int

class Lease:
    """An execution lease; pass ``token`` as ``fence=`` to the commands made under it."""

    session: str
    owner: str
    token: int
    expires_at_ms: int

class LeaseState:
    """A session's lease as a reader sees it (``Database.lease``)."""

    session: str
    owner: str
    token: int
    expires_at_ms: int
    released: bool

class Draft:
    """A streamed draft: its segments from ``first_segment``, as far as the budget allowed."""

    session: str
    draft_id: str
    first_segment: int
    segments: list[bytes]
    total_segments: int
    total_bytes: int
    created_at_ms: int
    updated_at_ms: int
    complete: bool
    def data(self) -> bytes:
        """The segments read, joined."""

class DraftSummary:
    """A draft without its bytes (``Database.abandoned_drafts``)."""

    session: str
    draft_id: str
    segments: int
    bytes: int
    created_at_ms: int
    updated_at_ms: int

class QueuedInput:
    """An open input of a session's inbox, with its message."""

    input_id: str
    seq: int
    kind: InputKind
    state: Literal["pending", "claimed"]
    claim: int | None
    expires_at_ms: int | None
    role: Role
    content_type: str
    body: bytes
    attachments: list[str]
    def text(self) -> str:
        """The body decoded as UTF-8."""

class InputRow:
    """An input of a session's inbox, whatever its state (``Database.input``)."""

    input_id: str
    seq: int
    message_id: str
    kind: InputKind
    state: InputStateName
    claim: int | None
    expires_at_ms: int | None
    turn_id: str | None
    closed_seq: int | None

class Claim:
    """What ``claim_inputs`` took (``claim`` is ``None`` when nothing was claimable)."""

    claim: int | None
    inputs: list[str]
    expires_at_ms: int

class ClaimRow:
    """A claim as stored (``Database.claim``)."""

    claim: int
    owner: str
    token: int
    target: InputKind
    turn_id: str | None
    inputs: list[str]
    expires_at_ms: int
    open: bool

class Subscription:
    """Commit notices, in commit order."""

    def recv(self, timeout: float | None = None) -> CommitNotice | None: ...
    def __iter__(self) -> Iterator[CommitNotice]: ...
    def __next__(self) -> CommitNotice: ...

class Database:
    """An open annal database (created if missing). Every call releases the GIL while
    the engine works.

    ``durable=False``: commits are acknowledged before they are on disk (a crash can
    lose recent ones, never half of one) and the file is held exclusively; for tests and
    bulk imports. ``compress``: how new content is stored, ``True`` (lz4, the default),
    ``"zstd"``, ``"lz4"`` or ``False`` / ``"off"``; every setting reads the others' content.
    A path in a directory that does not exist raises ``FileNotFoundError`` naming it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durable: bool = True,
        compress: bool | Literal["lz4", "zstd", "off"] = True,
    ) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def durable(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def poison_cause(self) -> AnnalError | None:
        """The failure that poisoned the engine (an ``annal.errors`` instance), or None."""
    def __enter__(self) -> Database: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> bool: ...
    # commands
    def create_session(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        metadata: bytes | None = None,
        messages: Sequence[Message] = (),
        session: str | None = None,
    ) -> SessionReceipt: ...
    def create_session_async(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        metadata: bytes | None = None,
        messages: Sequence[Message] = (),
        session: str | None = None,
    ) -> Awaitable[SessionReceipt]: ...
    def commit_turn(
        self,
        session: str,
        turn_id: str,
        messages: Sequence[Message] = (),
        *,
        expected: Expected = None,
        usage: Sequence[UsageItem] = (),
        state: Mapping[str, bytes | None] | None = None,
        applied_context: Sequence[str] = (),
        tool_ops: Sequence[str] = (),
        run_id: str | None = None,
        finalizes: str | None = None,
        inputs: Sequence[str] = (),
        fence: int | None = None,
    ) -> TurnResult: ...
    def commit_turn_async(
        self,
        session: str,
        turn_id: str,
        messages: Sequence[Message] = (),
        *,
        expected: Expected = None,
        usage: Sequence[UsageItem] = (),
        state: Mapping[str, bytes | None] | None = None,
        applied_context: Sequence[str] = (),
        tool_ops: Sequence[str] = (),
        run_id: str | None = None,
        finalizes: str | None = None,
        inputs: Sequence[str] = (),
        fence: int | None = None,
    ) -> Awaitable[TurnResult]: ...
    def rewrite(
        self,
        session: str,
        expected: str,
        start: int,
        end: int,
        replacement: Sequence[Message] = (),
        *,
        reason: Literal["edit", "compaction", "redaction"] = "edit",
        note: str = "",
        actor: str = "",
        fence: int | None = None,
    ) -> Receipt: ...
    def restore(
        self, session: str, expected: str, target: str, *, note: str = "", actor: str = "", fence: int | None = None
    ) -> Receipt: ...
    def fork(
        self,
        parent: str,
        index: int | None = None,
        *,
        replacement: Message | None = None,
        labels: Mapping[str, str] | None = None,
        session: str | None = None,
        fence: int | None = None,
    ) -> SessionReceipt: ...
    def archive(self, session: str, reason: str = "", *, fence: int | None = None) -> bool: ...
    def revive(self, session: str, reason: str = "", *, fence: int | None = None) -> int: ...
    def append_context(
        self, session: str, key: str, content: bytes | bytearray | str, *, source: str = "", fence: int | None = None
    ) -> int | None: ...
    def record_tool_call(
        self,
        session: str,
        op_id: str,
        tool_name: str,
        args: bytes | bytearray | str,
        *,
        call_id: str,
        parent_op: str | None = None,
        turn_id: str | None = None,
        replay_safe: bool = False,
        fence: int | None = None,
    ) -> bool: ...
    def record_tool_result(
        self,
        session: str,
        op_id: str,
        result: bytes | bytearray | str,
        *,
        outcome: Literal["ok", "error", "cancelled"] = "ok",
        fence: int | None = None,
    ) -> bool: ...
    def set_labels(
        self, session: str, set: Mapping[str, str] = ..., remove: Iterable[str] = (), *, fence: int | None = None
    ) -> int | None: ...
    def set_metadata(
        self, session: str, metadata: bytes, *, expected: Expected = None, fence: int | None = None
    ) -> int | None: ...
    def set_host_state(
        self, session: str, state: Mapping[str, bytes | None], *, expected: Expected = None, fence: int | None = None
    ) -> int | None: ...
    # execution leases
    def acquire_lease(self, session: str, owner: str, ttl_ms: int) -> Lease:
        """Takes the session's lease (``errors.Busy`` while another owner holds it)."""
    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        """Renews a held lease (``errors.Fenced`` for a stale or released one)."""
    def release_lease(self, lease: Lease) -> bool:
        """Releases a held lease; ``False`` if it was released already."""
    def lease(self, session: str) -> LeaseState | None:
        """The session's lease (token, holder, expiry, released), or ``None`` if none was granted."""
    # streamed drafts
    def append_draft(
        self, session: str, draft_id: str, segment: bytes | bytearray | str, *, fence: int | None = None
    ) -> int:
        """Appends a segment to a draft; returns its index."""
    def discard_draft(self, session: str, draft_id: str, *, fence: int | None = None) -> bool:
        """Discards a draft; ``False`` if there was none."""
    def drafts(self, session: str, *, max_bytes: int = ...) -> list[Draft]:
        """The session's drafts, in draft id order."""
    def draft(self, session: str, draft_id: str, from_segment: int = 0, *, max_bytes: int = ...) -> Draft | None:
        """One draft from segment ``from_segment``, or ``None``."""
    def abandoned_drafts(self) -> list[DraftSummary]:
        """The drafts the file held when the database opened."""
    def flush_drafts(self) -> None:
        """Writes every draft segment still in memory to the file now."""
    # the input inbox
    def enqueue_input(self, session: str, input_id: str, message: Message, *, kind: InputKind = "next_turn") -> int | None:
        """Queues an input; ``None`` for an exact retry."""
    def pending_inputs(self, session: str) -> list[QueuedInput]:
        """The inputs a claim may take now, in queue order."""
    def inbox(self, session: str) -> list[QueuedInput]:
        """The open inputs (pending or claimed), in queue order."""
    def input(self, session: str, input_id: str) -> InputRow | None:
        """An input in any state, or ``None``."""
    def claim(self, session: str, claim: int) -> ClaimRow | None:
        """A claim by its number, or ``None``."""
    def claim_inputs(
        self,
        session: str,
        *,
        token: int,
        owner: str,
        target: InputKind = "next_turn",
        turn_id: str | None = None,
        ttl_ms: int = 60000,
        max: int = 64,
    ) -> Claim:
        """Claims queued inputs under the lease with ``token`` (``errors.Fenced`` otherwise)."""
    def abandon_claim(self, session: str, claim: int, *, fence: int | None = None) -> bool:
        """Gives a claim up: its unconsumed inputs are queued again."""
    def cancel_input(self, session: str, input_id: str) -> bool:
        """Withdraws an input no live claim holds; ``False`` if cancelled already."""
    # queries
    def head(self, session: str) -> Head | None: ...
    def list_sessions(
        self,
        *,
        labels: Mapping[str, str] = ...,
        include_archived: bool = False,
        offset: int = 0,
        limit: int = 0,
        recent: bool = False,
    ) -> SessionPage:
        """Sessions matching every label; ``limit=0`` returns as many as a page may hold."""
    def transcript(
        self, session: str, offset: int = 0, limit: int = 100, *, revision: str | None = None
    ) -> TranscriptPage:
        """A page of the transcript; ``limit=0`` returns no messages (``total`` still counts them)."""
    def revisions(self, session: str, offset: int = 0, limit: int = 100) -> list[RevisionNode]:
        """One page of revisions, oldest first (``revision_page`` adds the head and ``has_more``)."""
    def revision_page(self, session: str, offset: int = 0, limit: int = 100) -> RevisionPage:
        """One page of revisions, oldest first, with the head, the total and ``has_more``."""
    def context(self, session: str, *, pending: bool = False) -> list[ContextEntry]: ...
    def usage(self, session: str) -> list[UsageTotals]: ...
    def tool_op(self, session: str, op_id: str) -> ToolOp | None: ...
    def tool_ops(
        self, session: str, *, unsettled: bool = False, offset: int = 0, limit: int | None = None
    ) -> list[ToolOp]:
        """Tool operations in call order from ``offset``: ``limit`` of them (100 if ``None``;
        with ``unsettled=True``, all of them if ``None``)."""
    def host_state(self, session: str, name: str, *, at: int | None = None) -> bytes | None: ...
    def content(self, content_id: str) -> bytes | None: ...
    def contents(self, content_ids: Sequence[str]) -> list[bytes | None]: ...
    def events(self, from_seq: int = 1, max_events: int = 1000, *, session: str | None = None) -> EventPage: ...
    def tip(self) -> tuple[int, str]: ...
    def subscribe(self) -> Subscription: ...
    def stats(self) -> dict[str, int]: ...
    def purge(self, session: str, *, reason: str, actor: str, descendants: bool = False) -> ErasureReport:
        """Erases a session for good; closes, purges and reopens the database."""
    def collect_garbage(self, rows_per_batch: int = 256) -> dict[str, int]: ...
    def checkpoint(self) -> None: ...
