"""annal: event-sourced storage for AI-agent sessions.

A :class:`Database` is an annal database (a redb log file and its projections file
beside it). Every mutation is an immutable, hash-chained event; message bodies,
attachments and host state values are content objects stored once by content id;
session heads, transcripts, revision graphs and the tool ledger are projections of the
log.

>>> import annal, tempfile, os
>>> db = annal.open(os.path.join(tempfile.mkdtemp(), "sessions.redb"))
>>> s = db.create_session(labels={"project": "demo"}, messages=[annal.Message.system("Be brief.")]).session
>>> head = db.head(s)
>>> r = db.commit_turn(s, "turn-1", [annal.Message.user("2 + 2?"), annal.Message.assistant("4")], expected=head.revision)
>>> [m.body for m in db.transcript(s).messages]
[b'Be brief.', b'2 + 2?', b'4']
>>> db.close()

Every call releases the GIL while the engine works, so threads that commit at once are
group-committed: one journal frame and one fsync for all of them (with the default
``durable=True``). The ``*_async`` methods queue the command at once and return an
awaitable future. Errors are :mod:`annal.errors` exceptions carrying the engine's
values.

Hosts that run sessions on workers take a session's execution lease
(:meth:`Database.acquire_lease`) and pass its token as ``fence=`` to their writes: after
a takeover, a stale worker's writes raise :class:`annal.errors.Fenced` and write
nothing. Streamed partial output goes to drafts (``append_draft``; the final turn
``finalizes`` its draft), and input that arrives mid-turn to the inbox
(``enqueue_input``, ``claim_inputs``; the turn consumes it with ``inputs=``).

The LangGraph checkpointer is :class:`annal.langgraph.AnnalSaver`.
"""

from __future__ import annotations

import os
from typing import Literal

from . import errors
from ._annal import (
    LIMITS,
    Claim,
    ClaimRow,
    CommitNotice,
    ContextEntry,
    Database,
    Draft,
    DraftSummary,
    Event,
    ErasureReport,
    EventPage,
    Head,
    InputRow,
    Lease,
    LeaseState,
    Message,
    QueuedInput,
    Receipt,
    RevisionNode,
    RevisionPage,
    SessionPage,
    SessionReceipt,
    StoredMessage,
    Subscription,
    ToolOp,
    TranscriptPage,
    TurnResult,
    UsageTotals,
    compact,
    content_id,
    new_session_id,
)
from .errors import AnnalError

__all__ = [
    "LIMITS",
    "AnnalError",
    "Claim",
    "ClaimRow",
    "CommitNotice",
    "ContextEntry",
    "Database",
    "Draft",
    "DraftSummary",
    "Event",
    "ErasureReport",
    "EventPage",
    "Head",
    "InputRow",
    "Lease",
    "LeaseState",
    "Message",
    "QueuedInput",
    "Receipt",
    "RevisionNode",
    "RevisionPage",
    "SessionPage",
    "SessionReceipt",
    "StoredMessage",
    "Subscription",
    "ToolOp",
    "TranscriptPage",
    "TurnResult",
    "UsageTotals",
    "compact",
    "content_id",
    "errors",
    "new_session_id",
    "open",
]


def open(  # noqa: A001
    path: str | os.PathLike[str], *, durable: bool = True, compress: bool | Literal["lz4", "zstd", "off"] = True
) -> Database:
    """Opens (or creates) the database at ``path``; same as ``Database(path, ...)``.

    ``durable=False`` opens with relaxed durability: commits are acknowledged before they
    are on disk, so a crash can lose recent acknowledged commits (never half of one), and
    the file is held exclusively (no other process can read it while it is open). It is
    meant for tests and bulk imports.

    ``compress`` is how new content is stored: ``True`` (lz4, the default), ``"zstd"``
    (a quarter to a third smaller, for more CPU), ``"lz4"``, or ``False`` / ``"off"``.
    """
    return Database(path, durable=durable, compress=compress)
