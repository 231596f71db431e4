"""A LangGraph checkpointer on annal: :class:`AnnalSaver`.

How LangGraph's model maps onto annal's (``docs/design.md``, "The LangGraph
checkpointer"):

- A **thread** is a session, labelled ``langgraph=thread`` and
  ``langgraph.thread=<thread_id>``. Checkpoint namespaces live inside it.
- A **checkpoint** is a turn with one message (content type
  ``application/vnd.langgraph.checkpoint``). Its body is a small header (namespace,
  checkpoint id, parent id, run id); its first attachment is the record (the checkpoint
  without its channel values, the metadata, and a reference to each channel value);
  the other attachments are the channel values that are new.
- A **channel value** is a content object: a list value is stored element by element,
  so a growing message list stores each message once, and a checkpoint refers to the
  list as the ids of its elements. An unchanged channel is the same content object, so
  it is stored once however many checkpoints hold it.
- **Pending writes** are a turn with one message of content type
  ``application/vnd.langgraph.writes`` whose header names the checkpoint and task, and
  whose attachments are the written values.
- ``delete_thread`` archives the thread's session; the next checkpoint of that thread
  id starts a new session. ``delete_for_runs`` and ``prune`` redact the messages of the
  checkpoints they drop (a transcript rewrite); ``copy_thread`` forks the session (no
  content is copied). The log keeps what archive and redaction hide from the projections:
  erasing it is annal's purge, :meth:`AnnalSaver.purge_thread`.

The saver keeps an in-memory index per thread (checkpoint ids, parents, namespaces and
the ids of their records and writes), built from the session's transcript the first time
the thread is used and kept up to date by every write through this ``Database``. Only
one process opens an annal database, so the index is always current.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)

from . import LIMITS, Database, Message, content_id
from . import errors as _errors

__all__ = ["AnnalSaver"]

CHECKPOINT_TYPE = "application/vnd.langgraph.checkpoint"
WRITES_TYPE = "application/vnd.langgraph.writes"
BLOBS_TYPE = "application/vnd.langgraph.blobs"
THREAD_LABEL = "langgraph.thread"
KIND_LABEL = "langgraph"
ATTACHMENTS_MAX = LIMITS["attachments_per_message_max"]
# A list refers to the list of its parent checkpoint plus what it appends, for at most
# this many checkpoints in a row; then it is stored whole again, so reading a checkpoint
# reads at most this many earlier records.
DELTA_DEPTH_MAX = 8
# A serialized value this small is kept in the record itself, not as a content object.
INLINE_MAX = 64
PAGE = 1000
# The engine's bounds on one command (the limits every database opened from Python
# has): how many messages it carries and how many bytes (bodies, content types and
# attachments). ``copy_thread`` splits its appends to stay within them.
COMMAND_MESSAGES_MAX = LIMITS["messages_per_command_max"]
COMMAND_BYTES_MAX = LIMITS["command_bytes_max"]
# What a turn's id and bookkeeping may add to the bytes a command carries.
COMMAND_BYTES_SLACK = 64 * 1024


def _pack(obj: Any) -> bytes:
    return ormsgpack.packb(obj)


def _unpack(data: bytes) -> Any:
    return ormsgpack.unpackb(data)


# The index's entries are named tuples of strings: the garbage collector stops tracking
# such a tuple after its first collection, so a thread's index of thousands of
# checkpoints costs the collector nothing.
class _Checkpoint(NamedTuple):
    record: str  # content id of the record
    parent: str | None
    run_id: str | None


class _Write(NamedTuple):
    channel: str
    type: str
    value: str  # content id
    task_path: str


_NO_SNAPSHOT = object()
_IMMUTABLE = frozenset((str, bytes, int, float, bool, type(None)))

try:  # LangChain's messages are pydantic (v2) models
    from pydantic import BaseModel as _PydanticModel
except ImportError:  # pragma: no cover - langgraph depends on pydantic
    _PydanticModel = None


class _NotPlain(Exception):
    """A value that :func:`_plain` does not copy."""


def _plain(obj: Any) -> Any:
    """A deep copy of a value built of dicts, lists and tuples over immutable scalars;
    raises :class:`_NotPlain` at anything else, whose copying and equality are its own."""
    t = type(obj)
    if t in _IMMUTABLE:
        return obj
    if t is dict:
        out = {}
        for k, v in obj.items():
            if type(k) not in _IMMUTABLE:
                raise _NotPlain
            out[k] = _plain(v)
        return out
    if t is list:
        return [_plain(v) for v in obj]
    if t is tuple:
        return tuple([_plain(v) for v in obj])
    raise _NotPlain


def _same(a: Any, b: Any) -> bool:
    """``a == b`` with the types equal too, all the way down, and dicts in the same key
    order: ``1``, ``1.0`` and ``True`` are equal to Python but serialize differently, and
    so do ``0.0`` and ``-0.0``, and dicts whose keys come in another order. ``b`` is a
    :func:`_plain` copy; raises :class:`_NotPlain` where it holds something else."""
    t = type(b)
    if t is not type(a):
        if t not in _IMMUTABLE and t not in (dict, list, tuple):
            raise _NotPlain
        return False
    if t is float:
        return a.hex() == b.hex() if a == a else b != b  # NaN equals NaN here
    if t in _IMMUTABLE:
        return bool(a == b)
    if t is dict:
        return len(a) == len(b) and all(
            type(ka) is type(kb) and ka == kb and _same(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items())
        )
    if t is list or t is tuple:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    raise _NotPlain


class _ModelSnapshot:
    """A pydantic model's state as it was serialized: its class, and copies of its
    field values, its extra fields and its private attributes."""

    __slots__ = ("cls", "fields", "extra", "private")

    def __init__(self, item: Any) -> None:
        self.cls = type(item)
        self.fields = _plain(item.__dict__)
        self.extra = _plain(item.__pydantic_extra__)
        self.private = _plain(item.__pydantic_private__)

    def matches(self, item: Any) -> bool:
        # What pydantic's own == compares (fields, extra, private), on exact copies of
        # them; anything else that differs only makes the element serialized again.
        return (
            type(item) is self.cls
            and _same(item.__dict__, self.fields)
            and _same(item.__pydantic_extra__, self.extra)
            and _same(item.__pydantic_private__, self.private)
        )


def _snapshot(item: Any) -> Any:
    """A copy of ``item`` to compare it with later, or ``_NO_SNAPSHOT``. Plain values and
    pydantic models of plain values are copied directly (a few times faster than
    ``copy.deepcopy``); anything else goes through ``copy.deepcopy``."""
    t = type(item)
    if t in _IMMUTABLE:
        return item
    try:
        if _PydanticModel is not None and isinstance(item, _PydanticModel):
            return _ModelSnapshot(item)
        return _plain(item)
    except (_NotPlain, AttributeError):
        pass
    try:
        return copy.deepcopy(item)
    except Exception:
        return _NO_SNAPSHOT


def _unchanged(item: Any, snapshot: Any) -> bool:
    """Whether ``item`` still equals the snapshot taken when it was serialized: exactly
    (:func:`_same`) for plain values and pydantic models of them, by ``==`` for what
    ``copy.deepcopy`` copied."""
    try:
        if type(snapshot) is _ModelSnapshot:
            return snapshot.matches(item)
        try:
            return _same(item, snapshot)
        except _NotPlain:
            return bool(item == snapshot)
    except Exception:
        return False


class _Item:
    """A list element as it was serialized: the object, a copy, its type and id."""

    __slots__ = ("obj", "snapshot", "type", "cid")

    def __init__(self, obj: Any, snapshot: Any, type_: str, cid: bytes) -> None:
        self.obj = obj
        self.snapshot = snapshot
        self.type = type_
        self.cid = cid


class _ListTip(NamedTuple):
    """A list channel as a committed checkpoint stored it: the base of the next delta."""

    checkpoint: str
    record: str  # content id of that checkpoint's record
    type: str
    ids: bytes  # the elements' content ids, 32 bytes each
    depth: int  # deltas between that record and a full list


@dataclass
class _Thread:
    """The index of one thread's session."""

    session: str
    # ns -> checkpoint id -> entry
    checkpoints: dict[str, dict[str, _Checkpoint]] = field(default_factory=dict)
    # (ns, checkpoint id) -> (task id, idx) -> write
    writes: dict[tuple[str, str], dict[tuple[str, int], _Write]] = field(default_factory=dict)
    # content ids this process knows are stored (attachments need not be sent again)
    stored: set[str] = field(default_factory=set)
    # ns -> channel -> id(element) -> the element as the last checkpoint serialized it
    memo: dict[str, dict[str, dict[int, _Item]]] = field(default_factory=dict)
    # (ns, channel) -> the list the last committed checkpoint of ns stored there
    lists: dict[tuple[str, str], _ListTip] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, header: dict[str, Any], attachments: Sequence[str]) -> None:
        kind = header.get("k")
        ns = header.get("ns", "")
        if kind == "c":
            self.checkpoints.setdefault(ns, {})[header["id"]] = _Checkpoint(
                attachments[0], header.get("p"), header.get("r")
            )
            self.stored.update(attachments)
        elif kind == "w":
            key = (ns, header["id"])
            table = self.writes.setdefault(key, {})
            for idx, channel, type_, value in header["w"]:
                slot = (header["t"], idx)
                if header.get("x") or slot not in table:
                    table[slot] = _Write(channel, type_, value, header.get("tp", ""))
            self.stored.update(attachments)


class _Shared:
    """What every AnnalSaver on one Database shares: the thread indexes."""

    def __init__(self) -> None:
        self.threads: dict[str, _Thread] = {}
        self.lock = threading.Lock()


_SHARED: weakref.WeakKeyDictionary[Database, _Shared] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def _shared(db: Database) -> _Shared:
    with _SHARED_LOCK:
        shared = _SHARED.get(db)
        if shared is None:
            shared = _SHARED[db] = _Shared()
        return shared


class _Turn(NamedTuple):
    """A checkpoint's or a task's writes' turn, prepared: what it commits, and what the
    thread's index takes once it is committed (its entry, and for a checkpoint the list
    tips and the list memo of its namespace)."""

    thread: _Thread
    turn_id: str
    messages: list[Message]
    header: dict[str, Any]
    ids: list[str]
    tips: dict[tuple[str, str], _ListTip]
    memo: tuple[str, dict[str, dict[int, _Item]]] | None


@dataclass
class _CopyGroup:
    """Messages ``copy_thread`` commits in one turn: a checkpoint or writes message, the
    blob messages that carry its objects, their bytes, its header, the content ids its
    record reaches and those its messages carry."""

    messages: list[Message]
    size: int
    header: dict[str, Any]
    reaches: set[str]
    carries: set[str]


class AnnalSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer that stores threads as annal sessions.

    ``AnnalSaver(db)`` uses an open :class:`annal.Database`; ``AnnalSaver.open(path)``
    opens one (and ``close()`` closes it). Thread-safe, sync and async: the async
    methods queue their commits with the engine's async twins, so concurrent tasks are
    group-committed like concurrent threads.
    """

    db: Database

    def __init__(self, db: Database, *, serde: Any = None, owns_db: bool = False) -> None:
        super().__init__(serde=serde)
        self.db = db
        self._owns_db = owns_db
        self._shared = _shared(db)

    @classmethod
    def open(cls, path: str, *, durable: bool = True, serde: Any = None) -> AnnalSaver:
        """Opens the annal database at ``path`` and returns a saver that owns it."""
        return cls(Database(path, durable=durable), serde=serde, owns_db=True)

    def close(self) -> None:
        """Closes the database if this saver opened it."""
        if self._owns_db:
            self.db.close()

    def __enter__(self) -> AnnalSaver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----- the index -----

    def _find_session(self, thread_id: str) -> str | None:
        page = self.db.list_sessions(labels={KIND_LABEL: "thread", THREAD_LABEL: thread_id}, limit=10)
        if not page.items:
            return None
        # One live session per thread id; the newest wins if there ever were more.
        return max(page.items, key=lambda h: h.created_seq).session

    def _load(self, session: str) -> _Thread:
        thread = _Thread(session)
        offset = 0
        while True:
            page = self.db.transcript(session, offset, PAGE)
            for m in page.messages:
                if m.content_type in (CHECKPOINT_TYPE, WRITES_TYPE):
                    thread.apply(_unpack(m.body), m.attachments)
            offset += len(page.messages)
            if not page.has_more or not page.messages:
                return thread

    def _thread(self, thread_id: str, *, create: bool = False) -> _Thread | None:
        shared = self._shared
        thread = shared.threads.get(thread_id)
        if thread is not None:
            return thread
        with shared.lock:
            thread = shared.threads.get(thread_id)
            if thread is not None:
                return thread
            session = self._find_session(thread_id)
            if session is None:
                if not create:
                    return None
                session = self.db.create_session(labels={KIND_LABEL: "thread", THREAD_LABEL: thread_id}).session
                thread = _Thread(session)
            else:
                thread = self._load(session)
            shared.threads[thread_id] = thread
            return thread

    def _forget(self, thread_id: str) -> None:
        with self._shared.lock:
            self._shared.threads.pop(thread_id, None)

    def _reload(self, thread_id: str) -> None:
        """Reads the thread's index again from its transcript, into the object every
        holder of the thread shares, under its lock: a put that commits meanwhile applies
        its entry to that object, before the read (which then holds it too) or after the
        new index is in place, so it is never lost from the index. The list memo and tips
        start again empty (the next checkpoint stores its lists whole)."""
        thread = self._thread(thread_id)
        if thread is None:
            return
        with thread.lock:
            fresh = self._load(thread.session)
            thread.checkpoints, thread.writes, thread.stored = fresh.checkpoints, fresh.writes, fresh.stored
            thread.memo, thread.lists = {}, {}

    # ----- encoding -----

    def _dump_item(self, item: Any, fresh: dict[int, _Item], blobs: dict[str, bytes]) -> _Item:
        """One list element the memo does not hold unchanged: serialized, its object
        added to ``blobs`` and, with a snapshot to compare it with next time, to ``fresh``."""
        t, data = self.serde.dumps_typed(item)
        cid = content_id(data)
        blobs[cid] = data
        entry = _Item(item, _snapshot(item), t, bytes.fromhex(cid))
        if entry.snapshot is not _NO_SNAPSHOT:
            fresh[id(item)] = entry
        return entry

    def _dump_value(self, value: Any, blobs: dict[str, bytes], memo: dict[int, _Item] | None = None) -> tuple[list[Any], dict[int, _Item]]:
        """A channel value as a reference; its new content objects go into ``blobs``.
        Returns the reference and the memo of a list's elements for the next checkpoint.

        A list element is taken from ``memo`` when it is the very object the previous
        checkpoint of this channel held and still equals the snapshot taken when it was
        serialized (so an element changed in place is serialized again)."""
        fresh: dict[int, _Item] = {}
        if type(value) is list and value:
            memo = memo or {}
            items: list[_Item] = []
            for item in value:
                key = id(item)
                known = memo.get(key)
                if known is not None and known.obj is item and _unchanged(item, known.snapshot):
                    fresh[key] = known
                    items.append(known)
                else:
                    items.append(self._dump_item(item, fresh, blobs))
            t0 = items[0].type
            ids = b"".join([i.cid for i in items])
            types = [i.type for i in items]
            if types.count(t0) == len(types):
                return ["l", t0, ids], fresh
            return ["L", types, ids], fresh
        t, data = self.serde.dumps_typed(value)
        if len(data) <= INLINE_MAX:
            return ["i", t, data], fresh
        cid = content_id(data)
        blobs[cid] = data
        return ["b", t, bytes.fromhex(cid)], fresh

    def _messages(
        self, kind_type: str, header: dict[str, Any], first: list[bytes], blobs: dict[str, bytes], thread: _Thread
    ) -> tuple[list[Message], list[str]]:
        """The turn's messages: the header with ``first`` and the new blobs attached,
        spilling into blob messages past the attachment limit. Returns them and the
        content ids of the first message's attachments."""
        new = [(cid, data) for cid, data in blobs.items() if cid not in thread.stored]
        head_room = ATTACHMENTS_MAX - len(first)
        head_blobs, rest = new[:head_room], new[head_room:]
        attachments = first + [data for _, data in head_blobs]
        ids = [content_id(a) for a in first] + [cid for cid, _ in head_blobs]
        body = _pack(header)
        messages = [Message("assistant" if kind_type == CHECKPOINT_TYPE else "tool", body, kind_type, attachments)]
        spill_header = _pack({"k": "b", "ns": header.get("ns", ""), "id": header.get("id")}) if rest else b""
        for i in range(0, len(rest), ATTACHMENTS_MAX):
            chunk = [data for _, data in rest[i : i + ATTACHMENTS_MAX]]
            messages.append(Message("tool", spill_header, BLOBS_TYPE, chunk))
        return messages, ids

    def _prepare_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        thread: _Thread | None = None,
    ) -> tuple[_Turn, RunnableConfig]:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        parent = conf.get("checkpoint_id")
        if thread is None:
            thread = self._thread(thread_id, create=True)
        assert thread is not None
        blobs: dict[str, bytes] = {}
        values = checkpoint.get("channel_values", {})
        refs = {}
        # The memo of each channel for the next checkpoint; it takes the place of the
        # thread's memo only once this checkpoint is committed, so the memo never holds
        # an element whose content is not stored.
        memos = thread.memo.get(ns, {})
        next_memos: dict[str, dict[int, _Item]] = {}
        for ch, v in values.items():
            refs[ch], next_memos[ch] = self._dump_value(v, blobs, memos.get(ch))
        # (ns, channel) -> (type, element ids, depth): the next delta's base, once the
        # record's id is known.
        lists: dict[tuple[str, str], tuple[str, bytes, int]] = {}
        for ch, ref in refs.items():
            if ref[0] != "l":
                continue
            full_ids, depth = ref[2], 0
            base = thread.lists.get((ns, ch))
            if (
                base is not None
                and parent is not None
                and base.checkpoint == parent
                and base.type == ref[1]
                and base.depth < DELTA_DEPTH_MAX
                and len(full_ids) > len(base.ids)
                and full_ids.startswith(base.ids)
            ):
                # ["d", base record, elements kept from it, type, appended ids]
                ref = refs[ch] = ["d", bytes.fromhex(base.record), len(base.ids) // 32, ref[1], full_ids[len(base.ids) :]]
                depth = base.depth + 1
            lists[(ns, ch)] = (ref[1] if ref[0] == "l" else ref[3], full_ids, depth)
        bare = dict(checkpoint)
        bare.pop("channel_values", None)
        md = get_checkpoint_metadata(config, metadata)
        record = _pack(
            {
                "cp": list(self.serde.dumps_typed(bare)),
                "md": list(self.serde.dumps_typed(md)),
                "vals": refs,
            }
        )
        run_id = md.get("run_id")
        header = {"k": "c", "ns": ns, "id": checkpoint["id"], "p": parent, "r": str(run_id) if run_id else None}
        messages, ids = self._messages(CHECKPOINT_TYPE, header, [record], blobs, thread)
        turn_id = "c:" + content_id(_pack([header, ids]))[:32]
        tips = {key: _ListTip(checkpoint["id"], ids[0], *tip) for key, tip in lists.items()}
        out: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}
        return _Turn(thread, turn_id, messages, header, ids, tips, (ns, next_memos)), out

    def _prepare_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
        thread: _Thread | None = None,
    ) -> _Turn:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = str(conf["checkpoint_id"])
        if thread is None:
            thread = self._thread(thread_id, create=True)
        assert thread is not None
        blobs: dict[str, bytes] = {}
        entries = []
        for idx, (channel, value) in enumerate(writes):
            t, data = self.serde.dumps_typed(value)
            cid = content_id(data)
            blobs[cid] = data
            entries.append([WRITES_IDX_MAP.get(channel, idx), channel, t, cid])
        replace = all(w[0] in WRITES_IDX_MAP for w in writes)
        header = {"k": "w", "ns": ns, "id": checkpoint_id, "t": task_id, "tp": task_path, "x": replace, "w": entries}
        messages, ids = self._messages(WRITES_TYPE, header, [], blobs, thread)
        turn_id = "w:" + content_id(_pack([header, ids]))[:32]
        return _Turn(thread, turn_id, messages, header, ids, {}, None)

    def _commit(self, turn: _Turn) -> None:
        result = self.db.commit_turn(turn.thread.session, turn.turn_id, turn.messages)
        if result.already_committed and not self._indexed(turn.thread, turn.header, turn.ids):
            # The same content was written before and then redacted: write it again.
            self.db.commit_turn(turn.thread.session, f"{turn.turn_id}:{uuid.uuid4().hex}", turn.messages)
        self._committed(turn)

    @staticmethod
    def _committed(turn: _Turn) -> None:
        """Brings the index up to a committed turn: its entry, the list tips the next
        checkpoint may refer to, and the list memo of its namespace."""
        thread = turn.thread
        with thread.lock:
            thread.apply(turn.header, turn.ids)
            thread.lists.update(turn.tips)
            if turn.memo is not None:
                ns, channels = turn.memo
                memos = thread.memo.setdefault(ns, {})
                for ch, fresh in channels.items():
                    if fresh:
                        memos[ch] = fresh
                    else:
                        memos.pop(ch, None)

    async def _acommit(self, turn: _Turn) -> None:
        result = await self.db.commit_turn_async(turn.thread.session, turn.turn_id, turn.messages)
        if result.already_committed and not self._indexed(turn.thread, turn.header, turn.ids):
            await self.db.commit_turn_async(turn.thread.session, f"{turn.turn_id}:{uuid.uuid4().hex}", turn.messages)
        self._committed(turn)

    @staticmethod
    def _indexed(thread: _Thread, header: dict, ids: list[str]) -> bool:
        ns = header.get("ns", "")
        if header["k"] == "c":
            entry = thread.checkpoints.get(ns, {}).get(header["id"])
            return entry is not None and entry.record == ids[0]
        table = thread.writes.get((ns, header["id"]), {})
        return all(table.get((header["t"], w[0])) is not None for w in header["w"])

    def _load_value(self, ref: list[Any], objects: dict[str, bytes]) -> Any:
        kind = ref[0]
        if kind == "i":
            return self.serde.loads_typed((ref[1], ref[2]))
        if kind == "b":
            return self.serde.loads_typed((ref[1], objects[ref[2].hex()]))
        ids = [ref[2][i : i + 32].hex() for i in range(0, len(ref[2]), 32)]
        types = [ref[1]] * len(ids) if kind == "l" else ref[1]
        return [self.serde.loads_typed((t, objects[cid])) for t, cid in zip(types, ids)]

    def _resolve_delta(
        self, ch: str, ref: list[Any], records: dict[str, Any], depth: int = 0, bases: set[str] | None = None
    ) -> list[Any]:
        """A list reference as the whole list, ``["l", type, ids]``: a delta
        ``["d", base record, keep, type, appended]`` is the first ``keep`` elements of
        the base record's list in the same channel, then ``appended``. The ids of the
        base records it reads go into ``bases``, if given."""
        if ref[0] == "l":
            return ref
        if ref[0] != "d" or depth > DELTA_DEPTH_MAX:
            raise _errors.Corrupt(f"list channel {ch}: bad reference", location="checkpoint record", detail=str(ref[0]))
        _, base_id, keep, t, appended = ref
        key = base_id.hex()
        if bases is not None:
            bases.add(key)
        base = records.get(key)
        if base is None:
            raw = self.db.content(key)
            if raw is None:
                raise _errors.Corrupt(f"checkpoint record {key} is missing", location=f"content {key}", detail="")
            base = records[key] = _unpack(raw)
        base_ref = self._resolve_delta(ch, base["vals"][ch], records, depth + 1, bases)
        return ["l", t, base_ref[2][: keep * 32] + appended]

    @staticmethod
    def _value_ids(ref: list[Any]) -> list[str]:
        if ref[0] == "i":
            return []
        raw = ref[2]
        return [raw[i : i + 32].hex() for i in range(0, len(raw), 32)]

    def _tuple(self, thread_id: str, thread: _Thread, ns: str, checkpoint_id: str) -> CheckpointTuple | None:
        with thread.lock:
            entry = thread.checkpoints.get(ns, {}).get(checkpoint_id)
            writes = sorted(
                ((task_id, idx, w) for (task_id, idx), w in thread.writes.get((ns, checkpoint_id), {}).items()),
                key=lambda r: writes_sort_key(r[2].task_path, r[0], r[1]),
            )
        if entry is None:
            return None
        record_bytes = self.db.content(entry.record)
        if record_bytes is None:
            return None
        record = _unpack(record_bytes)
        records = {entry.record: record}
        for ch, ref in list(record["vals"].items()):
            if ref[0] == "d":
                record["vals"][ch] = self._resolve_delta(ch, ref, records)
        wanted: list[str] = []
        for ref in record["vals"].values():
            wanted.extend(self._value_ids(ref))
        wanted.extend(w.value for _, _, w in writes)
        objects = dict(zip(wanted, self.db.contents(wanted))) if wanted else {}
        checkpoint = self.serde.loads_typed(tuple(record["cp"]))
        checkpoint["channel_values"] = {ch: self._load_value(ref, objects) for ch, ref in record["vals"].items()}
        metadata = self.serde.loads_typed(tuple(record["md"]))
        pending: list[PendingWrite] = [
            (task_id, w.channel, self.serde.loads_typed((w.type, objects[w.value]))) for task_id, _, w in writes
        ]
        parent_config = (
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": entry.parent}}
            if entry.parent
            else None
        )
        return CheckpointTuple(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}},
            checkpoint,
            metadata,
            parent_config,
            pending,
        )

    # ----- BaseCheckpointSaver -----

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the latest of its thread and namespace."""
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        thread = self._thread(thread_id)
        if thread is None:
            return None
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            with thread.lock:
                ids = thread.checkpoints.get(ns)
                if not ids:
                    return None
                checkpoint_id = max(ids)
        return self._tuple(thread_id, thread, ns, checkpoint_id)

    def _thread_ids(self) -> list[str]:
        ids = []
        offset = 0
        while True:
            page = self.db.list_sessions(labels={KIND_LABEL: "thread"}, offset=offset, limit=PAGE)
            ids.extend(h.labels[THREAD_LABEL] for h in page.items if THREAD_LABEL in h.labels)
            offset += len(page.items)
            if not page.has_more or not page.items:
                return ids

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints, newest (largest id) first, of one thread (and namespace, and
        checkpoint id, if ``config`` names them) or of every thread."""
        if config is not None:
            conf = config["configurable"]
            thread_ids = [str(conf["thread_id"])]
            ns_filter = conf.get("checkpoint_ns")
            id_filter = get_checkpoint_id(config)
        else:
            thread_ids = self._thread_ids()
            ns_filter = None
            id_filter = None
        before_id = get_checkpoint_id(before) if before else None
        candidates: list[tuple[str, str, str, _Thread]] = []
        for thread_id in thread_ids:
            thread = self._thread(thread_id)
            if thread is None:
                continue
            with thread.lock:
                for ns, entries in thread.checkpoints.items():
                    if ns_filter is not None and ns != ns_filter:
                        continue
                    for cid in entries:
                        if id_filter is not None and cid != id_filter:
                            continue
                        if before_id is not None and not cid < before_id:
                            continue
                        candidates.append((cid, ns, thread_id, thread))
        candidates.sort(key=lambda c: c[0], reverse=True)
        yielded = 0
        for cid, ns, thread_id, thread in candidates:
            if limit is not None and yielded >= limit:
                return
            tup = self._tuple(thread_id, thread, ns, cid)
            if tup is None:
                continue
            if filter and not all(tup.metadata.get(k) == v for k, v in filter.items()):
                continue
            yielded += 1
            yield tup

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Stores a checkpoint as one turn; returns its config."""
        turn, out = self._prepare_put(config, checkpoint, metadata)
        self._commit(turn)
        return out

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Stores a task's pending writes for a checkpoint as one turn."""
        self._commit(self._prepare_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Archives the thread's session: its checkpoints and writes are gone from every
        query, and the next checkpoint of this thread id starts a new session."""
        thread_id = str(thread_id)
        with self._shared.lock:
            self._shared.threads.pop(thread_id, None)
            while True:
                session = self._find_session(thread_id)
                if session is None:
                    return
                self.db.archive(session, "langgraph: delete_thread")

    def purge_thread(self, thread_id: str, *, reason: str, actor: str, copies: bool = False) -> list[str]:
        """Erases a thread for good: purges every session it ever had (the live one and
        those ``delete_thread`` archived), so no byte of its checkpoints and writes is
        left in the database (``Database.purge``). A thread copied with ``copy_thread`` is
        a fork of it: with ``copies=True`` the copies are purged too, otherwise the purge
        is refused with ``errors.HasForks``. Returns the purged session ids.

        The database is closed and reopened by the purge; calls from other threads wait."""
        thread_id = str(thread_id)
        purged: list[str] = []
        with self._shared.lock:
            self._shared.threads.pop(thread_id, None)
            # Every session the thread id ever had (a thread id deleted and reused has
            # one per use), listed in full before the first purge changes the listing.
            sessions: list[str] = []
            offset = 0
            while True:
                page = self.db.list_sessions(
                    labels={KIND_LABEL: "thread", THREAD_LABEL: thread_id},
                    include_archived=True,
                    offset=offset,
                    limit=PAGE,
                )
                sessions.extend(h.session for h in page.items)
                offset += len(page.items)
                if not page.has_more or not page.items:
                    break
            for session in sessions:
                try:
                    report = self.db.purge(session, reason=reason, actor=actor, descendants=copies)
                except _errors.Purged:
                    continue  # a descendant of a session purged before it
                purged.extend(s for s, _ in report.purged)
            if copies:
                self._shared.threads.clear()  # copies of other thread ids may be gone too
        return purged

    def _redact(self, thread_id: str, drop: Any) -> None:
        """Removes the messages for which ``drop(header)`` holds from the thread's
        transcript (one redaction per run of adjacent messages), then reindexes."""
        thread = self._thread(thread_id)
        if thread is None:
            return
        for _attempt in range(100):
            head = self.db.head(thread.session)
            if head is None:
                return
            ranges: list[list[int]] = []
            offset = 0
            while True:
                page = self.db.transcript(thread.session, offset, PAGE, revision=head.revision)
                for m in page.messages:
                    if m.content_type in (CHECKPOINT_TYPE, WRITES_TYPE, BLOBS_TYPE) and drop(_unpack(m.body)):
                        if ranges and ranges[-1][1] == m.position:
                            ranges[-1][1] = m.position + 1
                        else:
                            ranges.append([m.position, m.position + 1])
                offset += len(page.messages)
                if not page.has_more or not page.messages:
                    break
            revision = head.revision
            try:
                for start, end in reversed(ranges):
                    revision = self.db.rewrite(
                        thread.session, revision, start, end, [], reason="redaction", actor="langgraph"
                    ).revision
            except _errors.RevisionConflict:
                if revision != head.revision:
                    raise
                continue  # a concurrent write moved the head before the first rewrite
            break
        self._reload(thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Redacts the checkpoints whose metadata ``run_id`` is one of ``run_ids``, with
        their writes, from every thread."""
        runs = {str(r) for r in run_ids}
        if not runs:
            return
        for thread_id in self._thread_ids():
            thread = self._thread(thread_id)
            if thread is None:
                continue
            with thread.lock:
                doomed = {
                    (ns, cid) for ns, entries in thread.checkpoints.items() for cid, e in entries.items() if e.run_id in runs
                }
            if doomed:
                self._redact(thread_id, lambda h, d=doomed: (h.get("ns", ""), h.get("id")) in d)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies every checkpoint and write of one thread to another: a fork of the
        source session (no content is copied), or, if the target thread exists, its
        messages appended to the target's session.

        The append is as many turns as the engine's command limits need (messages and
        bytes per command); a checkpoint or write never straddles two of them, since its
        spilled attachments travel in the same turn. Every message keeps every one of its
        attachments, in order (a record is found by its position): if the content of an
        attachment is missing the copy raises ``errors.Corrupt`` before anything is
        appended. What a copied record names and no copied message carries (content an
        earlier checkpoint of the source sent, whose message a prune or
        ``delete_for_runs`` took out of the transcript) goes along in blob messages, so
        the copy reads whole on its own, even once the source is purged. A turn refused
        partway leaves the turns before it in the target."""
        source = self._thread(str(source_thread_id))
        if source is None:
            return
        target_thread_id = str(target_thread_id)
        labels = {KIND_LABEL: "thread", THREAD_LABEL: target_thread_id}
        with self._shared.lock:
            target = self._find_session(target_thread_id)
            if target is None:
                self.db.fork(source.session, labels=labels)
                self._shared.threads.pop(target_thread_id, None)
                return
        # The source's messages in groups that go in one turn: a checkpoint or writes
        # message with the blob messages that carry its spilled attachments, and the
        # content its record reaches.
        groups: list[_CopyGroup] = []
        records: dict[str, Any] = {}
        offset = 0
        while True:
            page = self.db.transcript(source.session, offset, PAGE)
            # The page's attachments in one call, handed back to their messages in order.
            ids = [cid for m in page.messages for cid in m.attachments]
            fetched = iter(self.db.contents(ids) if ids else [])
            for m in page.messages:
                attachments = [next(fetched) for _ in m.attachments]
                for cid, data in zip(m.attachments, attachments):
                    if data is None:
                        raise _errors.Corrupt(
                            f"copy_thread: attachment {cid} of message {m.position} of session "
                            f"{source.session} is missing",
                            location=f"content {cid}",
                            detail="attachment content missing",
                        )
                message = Message(m.role, m.body, m.content_type, attachments)
                size = len(m.body) + len(m.content_type) + sum(len(a) for a in attachments)
                if m.content_type == BLOBS_TYPE and groups:
                    groups[-1].messages.append(message)
                    groups[-1].size += size
                    groups[-1].carries.update(m.attachments)
                else:
                    header = _unpack(m.body) if m.content_type in (CHECKPOINT_TYPE, WRITES_TYPE) else {}
                    reaches = self._reaches(m.content_type, header, attachments, records)
                    groups.append(_CopyGroup([message], size, header, reaches, set(m.attachments)))
            offset += len(page.messages)
            if not page.has_more or not page.messages:
                break
        # A checkpoint's values and a task's writes name content an earlier message of the
        # thread carried (each object is sent once a thread). The earlier messages may be
        # gone from the source's transcript (a prune, delete_for_runs), so what the copied
        # messages do not carry goes with them: the copy reads whole on its own, even once
        # the source is purged. (What a turn carries counts for the turns after it only:
        # a copy refused partway leaves whole turns.)
        carried: set[str] = set()
        for group in groups:
            carried |= group.carries
            missing = sorted(group.reaches - carried)
            if not missing:
                continue
            data = self.db.contents(missing)
            for cid, blob in zip(missing, data):
                if blob is None:
                    raise _errors.Corrupt(
                        f"copy_thread: content {cid} that a record of session {source.session} reaches is missing",
                        location=f"content {cid}",
                        detail="content missing",
                    )
            spill = _pack({"k": "b", "ns": group.header.get("ns", ""), "id": group.header.get("id")})
            for i in range(0, len(missing), ATTACHMENTS_MAX):
                chunk = [b for b in data[i : i + ATTACHMENTS_MAX] if b is not None]
                group.messages.append(Message("tool", spill, BLOBS_TYPE, chunk))
                group.size += len(spill) + len(BLOBS_TYPE) + sum(len(b) for b in chunk)
            carried.update(missing)
        copy_id = uuid.uuid4().hex
        turn: list[Message] = []
        turn_bytes = 0
        turns = 0
        bytes_max = COMMAND_BYTES_MAX - COMMAND_BYTES_SLACK
        try:
            for g in groups:
                group, size = g.messages, g.size
                if turn and (len(turn) + len(group) > COMMAND_MESSAGES_MAX or turn_bytes + size > bytes_max):
                    self.db.commit_turn(target, f"copy:{copy_id}:{turns}", turn)
                    turns += 1
                    turn, turn_bytes = [], 0
                turn.extend(group)
                turn_bytes += size
            if turn:
                self.db.commit_turn(target, f"copy:{copy_id}:{turns}", turn)
        finally:
            self._reload(target_thread_id)

    def _reaches(
        self, content_type: str, header: dict[str, Any], attachments: list[bytes], records: dict[str, Any]
    ) -> set[str]:
        """The content a checkpoint message's record (its first attachment) or a writes
        message's header names: blobs, list elements, and the records its list deltas are
        relative to, down to a whole list (``records`` caches the records read)."""
        if content_type == WRITES_TYPE:
            return {w[3] for w in header.get("w", [])}
        if content_type != CHECKPOINT_TYPE or not attachments:
            return set()
        out: set[str] = set()
        for ch, ref in _unpack(attachments[0]).get("vals", {}).items():
            whole = self._resolve_delta(ch, ref, records, bases=out) if ref[0] == "d" else ref
            out.update(self._value_ids(whole))
        return out

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: redacts every checkpoint but the latest of each namespace
        (with their writes). ``delete``: deletes the threads."""
        for thread_id in thread_ids:
            thread_id = str(thread_id)
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            if strategy != "keep_latest":
                raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
            thread = self._thread(thread_id)
            if thread is None:
                continue
            # What goes is chosen now, by name: a checkpoint put while the redaction runs
            # is newer than every one of them, and stays.
            doomed: set[tuple[str, str]] = set()
            with thread.lock:
                for ns, entries in thread.checkpoints.items():
                    latest = max(entries, default=None)
                    doomed.update((ns, cid) for cid in entries if cid != latest)
            if doomed:
                self._redact(thread_id, lambda h, d=doomed: (h.get("ns", ""), h.get("id")) in d)

    def get_next_version(self, current: int | None, channel: None = None) -> int:
        """Versions are integers, one more than the current. Channel values are stored by
        content, not under (channel, version) keys, so two branches that reach the same
        version number with different values cannot collide."""
        return 1 if current is None else int(str(current).split(".")[0]) + 1

    # ----- async -----

    async def _athread(self, config: RunnableConfig) -> _Thread:
        """The thread ``config`` names, created or loaded in a worker thread if this
        process has not used it yet (creating a session is a durable commit, loading one
        reads its transcript)."""
        thread_id = str(config["configurable"]["thread_id"])
        thread = self._shared.threads.get(thread_id)
        if thread is None:
            thread = await asyncio.to_thread(self._thread, thread_id, create=True)
        assert thread is not None
        return thread

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Like ``get_tuple``, run in a worker thread: loading a thread's index reads
        its transcript, and a purge in progress makes reads wait for the reopen."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Like ``list``; each checkpoint is read in a worker thread."""
        it = self.list(config, filter=filter, before=before, limit=limit)
        done = object()
        while True:
            tup = await asyncio.to_thread(next, it, done)
            if tup is done:
                return
            yield tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Like ``put``; the commit is queued without blocking the event loop (as is the
        session of a new thread, created in a worker thread). The values are serialized
        on the calling thread."""
        thread = await self._athread(config)
        turn, out = self._prepare_put(config, checkpoint, metadata, thread)
        await self._acommit(turn)
        return out

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Like ``put_writes``; the commit is queued without blocking the event loop (as
        is the session of a new thread, created in a worker thread)."""
        thread = await self._athread(config)
        await self._acommit(self._prepare_writes(config, writes, task_id, task_path, thread))

    async def adelete_thread(self, thread_id: str) -> None:
        """Like ``delete_thread``."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Like ``delete_for_runs``."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Like ``copy_thread``."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Like ``prune``."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)
