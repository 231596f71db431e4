"""Type stubs of the native module, ``annal._annal`` (re-exported by ``annal``)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import Literal

Role = Literal["system", "user", "assistant", "tool"]
#: ``None`` (any head), a revision id (hex ``str``) or a stream seq (``int``).
Expected = str | int | None
#: ``(provider, model, input, output)`` or ``(..., cache_read, cache_write)``.
UsageItem = tuple[str, str, int, int] | tuple[str, str, int, int, int, int]

def content_id(data: bytes) -> str:
    """The content id of ``data`` (blake3, hex)."""

def compact(path: str | os.PathLike[str]) -> tuple[int, int]:
    """Compacts a closed database; returns (bytes_before, bytes_after)."""

def new_session_id() -> str:
    """A fresh UUIDv7 session id."""

class Message:
    """A message as the host hands it in."""

    role: Role
    content_type: str
    body: bytes
    attachments: list[bytes]
    def __init__(
        self, role: Role, body: bytes | str, content_type: str = "text/plain", attachments: Sequence[bytes | str] = ()
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

class Subscription:
    """Commit notices, in commit order."""

    def recv(self, timeout: float | None = None) -> CommitNotice | None: ...
    def __iter__(self) -> Iterator[CommitNotice]: ...
    def __next__(self) -> CommitNotice: ...

class Database:
    """An open annal database. Every call releases the GIL while the engine works."""

    def __init__(self, path: str | os.PathLike[str], *, durable: bool = True, compress: bool = True) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def durable(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Database: ...
    def __exit__(self, *exc: object) -> bool: ...
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
    ) -> Receipt: ...
    def restore(self, session: str, expected: str, target: str, *, note: str = "", actor: str = "") -> Receipt: ...
    def fork(
        self,
        parent: str,
        index: int | None = None,
        *,
        replacement: Message | None = None,
        labels: Mapping[str, str] | None = None,
        session: str | None = None,
    ) -> SessionReceipt: ...
    def archive(self, session: str, reason: str = "") -> bool: ...
    def revive(self, session: str, reason: str = "") -> int: ...
    def append_context(self, session: str, key: str, content: bytes | str, *, source: str = "") -> int | None: ...
    def record_tool_call(
        self,
        session: str,
        op_id: str,
        tool_name: str,
        args: bytes | str,
        *,
        call_id: str = "",
        parent_op: str | None = None,
        turn_id: str | None = None,
        replay_safe: bool = False,
    ) -> bool: ...
    def record_tool_result(
        self, session: str, op_id: str, result: bytes | str, *, outcome: Literal["ok", "error", "cancelled"] = "ok"
    ) -> bool: ...
    def set_labels(
        self, session: str, set: Mapping[str, str] = ..., remove: Sequence[str] = ()
    ) -> int | None: ...
    def set_metadata(self, session: str, metadata: bytes, *, expected: Expected = None) -> int | None: ...
    def set_host_state(
        self, session: str, state: Mapping[str, bytes | None], *, expected: Expected = None
    ) -> int | None: ...
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
    ) -> SessionPage: ...
    def transcript(
        self, session: str, offset: int = 0, limit: int = 100, *, revision: str | None = None
    ) -> TranscriptPage: ...
    def revisions(self, session: str, offset: int = 0, limit: int = 100) -> list[RevisionNode]: ...
    def context(self, session: str, *, pending: bool = False) -> list[ContextEntry]: ...
    def usage(self, session: str) -> list[UsageTotals]: ...
    def tool_op(self, session: str, op_id: str) -> ToolOp | None: ...
    def tool_ops(self, session: str, *, unsettled: bool = False, offset: int = 0, limit: int = 100) -> list[ToolOp]: ...
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
