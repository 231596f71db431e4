"""AnnalSaver's storage of list channels: element by element, as deltas of the parent
checkpoint's list, across branches and restarts."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

import annal.langgraph
from annal import Database, errors
from annal.langgraph import AnnalSaver


def checkpoint(items: list, step: int) -> dict:
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": list(items), "step": step}
    cp["channel_versions"] = {"messages": step + 1, "step": step + 1}
    return cp


def put(saver: AnnalSaver, thread: str, parent: dict | None, items: list, step: int) -> tuple[dict, list]:
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    stored = saver.put(config, checkpoint(items, step), {"source": "loop", "step": step}, {"messages": step + 1})
    return stored, list(items)


def test_growing_list_branches_and_restarts(tmp_path: Path) -> None:
    path = str(tmp_path / "c.redb")
    history: list[tuple[dict, list]] = []
    with AnnalSaver.open(path) as saver:
        items: list = [{"role": "system", "text": "be brief"}]
        parent = None
        for step in range(30):
            items = items + [{"role": "user", "text": f"message {step} " * 5}]
            parent, snapshot = put(saver, "t", parent, items, step)
            history.append((parent, snapshot))
        # A branch from the middle (time travel): its list is not an extension of the
        # latest checkpoint's.
        middle, middle_items = history[10]
        branch_items = middle_items + [{"role": "user", "text": "other way"}]
        branch, _ = put(saver, "t", middle, branch_items, 11)
        history.append((branch, branch_items))
        # An element changed in place is stored again, not taken from the memo.
        last_items = history[-2][1]
        changed = [dict(x) for x in last_items]
        changed[-1]["text"] = "edited"
        edited, _ = put(saver, "t", history[-2][0], changed, 31)
        history.append((edited, changed))
        for config, expected in history:
            got = saver.get_tuple(config)
            assert got.checkpoint["channel_values"]["messages"] == expected
    # After a restart the saver continues the thread from the stored checkpoints.
    with AnnalSaver.open(path) as saver:
        for config, expected in history:
            assert saver.get_tuple(config).checkpoint["channel_values"]["messages"] == expected
        more = history[-1][1] + [{"role": "assistant", "text": "done"}]
        after, _ = put(saver, "t", history[-1][0], more, 32)
        assert saver.get_tuple(after).checkpoint["channel_values"]["messages"] == more
        saver.prune(["t"], strategy="keep_latest")
        latest = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
        assert latest.checkpoint["channel_values"]["messages"] == more


def test_mutated_element_is_serialized_again(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "c.redb")) as saver:
        items = [{"text": "a"}, {"text": "b"}]
        first, _ = put(saver, "t", None, items, 0)
        items[1]["text"] = "changed in place"
        second, _ = put(saver, "t", first, items, 1)
        assert saver.get_tuple(first).checkpoint["channel_values"]["messages"][1]["text"] == "b"
        assert saver.get_tuple(second).checkpoint["channel_values"]["messages"][1]["text"] == "changed in place"


def test_an_element_changed_to_an_equal_value_of_another_type_is_serialized_again(tmp_path: Path) -> None:
    # 1 == 1.0 == True and 0.0 == -0.0 in Python, but each serializes as what it is.
    from langchain_core.messages import AIMessage

    with AnnalSaver.open(str(tmp_path / "c.redb")) as saver:
        message = AIMessage(content="a", id="a1", additional_kwargs={"n": 1})
        items: list[Any] = [{"done": 0, "score": 1, "x": 0.0}, message]
        first, _ = put(saver, "t", None, items, 0)
        items[0]["done"], items[0]["score"], items[0]["x"] = False, 1.0, -0.0
        items[1].additional_kwargs["n"] = True
        second, _ = put(saver, "t", first, items, 1)
        plain, message = saver.get_tuple(second).checkpoint["channel_values"]["messages"]
        assert [type(plain[k]) for k in ("done", "score")] == [bool, float] and str(plain["x"]) == "-0.0"
        assert message.additional_kwargs["n"] is True
        plain, message = saver.get_tuple(first).checkpoint["channel_values"]["messages"]
        assert [type(plain[k]) for k in ("done", "score")] == [int, int] and type(message.additional_kwargs["n"]) is int


def test_prune_beside_puts_keeps_every_checkpoint_put_after_it_chose(tmp_path: Path) -> None:
    path = str(tmp_path / "c.redb")
    with AnnalSaver.open(path) as saver:
        configs: list[dict] = []
        done = threading.Event()

        def writer() -> None:
            try:
                parent = None
                for step in range(100):
                    parent, _ = put(saver, "t", parent, [{"step": step}], step)
                    configs.append(parent)
            finally:
                done.set()

        thread = threading.Thread(target=writer)
        thread.start()
        while not done.is_set():
            saver.prune(["t"], strategy="keep_latest")
        thread.join()
        last = configs[-1]
        assert len(configs) == 100
        assert saver.get_tuple(last).checkpoint["channel_values"]["messages"] == [{"step": 99}]
        latest = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
        assert latest.config["configurable"]["checkpoint_id"] == last["configurable"]["checkpoint_id"]
    with AnnalSaver.open(path) as saver:
        latest = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
        assert latest.config["configurable"]["checkpoint_id"] == last["configurable"]["checkpoint_id"]
        assert latest.checkpoint["channel_values"]["messages"] == [{"step": 99}]


def test_a_copy_into_an_existing_thread_after_a_prune_reads_whole_once_the_source_is_purged(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "c.redb")) as saver:
        parent = None
        items: list = []
        for step in range(5):
            # A list that grows (stored as deltas) and a value that does not change (sent
            # once, by the first checkpoint).
            items = items + [{"text": f"m{step}"}]
            config = {"configurable": {"thread_id": "src", "checkpoint_ns": ""}}
            if parent is not None:
                config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            cp = checkpoint(items, step)
            cp["channel_values"]["system"] = "a long system prompt " * 20
            parent = saver.put(config, cp, {"step": step}, {})
        put(saver, "dst", None, [{"text": "other"}], 0)
        saver.prune(["src"], strategy="keep_latest")
        saver.copy_thread("src", "dst")
        saver.purge_thread("src", reason="test", actor="test")
        copied = {"configurable": {"thread_id": "dst", "checkpoint_ns": ""}}
        copied["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        values = saver.get_tuple(copied).checkpoint["channel_values"]
        assert values["messages"] == items and values["system"] == "a long system prompt " * 20


def test_message_changed_in_place_is_serialized_again(tmp_path: Path) -> None:
    # LangChain messages are pydantic models: a field, a nested value or an extra field
    # changed in place between two checkpoints must reach the second one.
    from langchain_core.messages import AIMessage, HumanMessage

    with AnnalSaver.open(str(tmp_path / "c.redb")) as saver:
        items = [
            HumanMessage(content="question", id="h1"),
            AIMessage(content="answer", id="a1", additional_kwargs={"tags": ["x"]}),
            HumanMessage(content="more", id="h2"),
        ]
        first, _ = put(saver, "t", None, items, 0)
        items[0].content = "question, edited"
        items[1].additional_kwargs["tags"].append("y")
        second, _ = put(saver, "t", first, items, 1)
        items[2].custom = "an extra field"
        third, _ = put(saver, "t", second, items, 2)
        fourth, _ = put(saver, "t", third, items, 3)

        def stored(config: dict) -> list:
            return saver.get_tuple(config).checkpoint["channel_values"]["messages"]

        assert [m.content for m in stored(first)] == ["question", "answer", "more"]
        assert stored(first)[1].additional_kwargs == {"tags": ["x"]}
        assert stored(second)[0].content == "question, edited"
        assert stored(second)[1].additional_kwargs == {"tags": ["x", "y"]}
        assert not hasattr(stored(second)[2], "custom")
        assert stored(third)[2].custom == "an extra field"
        assert stored(fourth) == items


class RecordingDb:
    """A Database that records which thread made each call, and can hide contents."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.calls: list[tuple[str, int]] = []
        self.missing: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.db, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, threading.get_ident()))
            result = attr(*args, **kwargs)
            if name == "contents":
                return [None if cid in self.missing else data for cid, data in zip(args[0], result)]
            return result

        return call


def thread_config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


HUGE = {"role": "tool", "text": "x" * (17 << 20)}  # over the engine's 16 MiB per content


def test_refused_put_leaves_the_memo_unchanged(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "c.redb")) as saver:
        m1 = {"role": "user", "text": "hello " * 50}
        with pytest.raises(errors.LimitExceeded):
            saver.put(thread_config("t"), checkpoint([m1, HUGE], 0), {}, {})
        # The same element object again: its content was never stored, so it is sent.
        stored = saver.put(thread_config("t"), checkpoint([m1], 1), {}, {})
        assert saver.get_tuple(stored).checkpoint["channel_values"]["messages"] == [m1]


def test_put_failing_in_a_later_channel_leaves_the_memo_unchanged(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "c.redb")) as saver:
        m1 = {"role": "user", "text": "hello " * 50}
        cp = checkpoint([m1], 0)
        cp["channel_values"]["bad"] = object()
        with pytest.raises(Exception):
            saver.put(thread_config("t"), cp, {}, {})
        stored = saver.put(thread_config("t"), checkpoint([m1], 1), {}, {})
        assert saver.get_tuple(stored).checkpoint["channel_values"]["messages"] == [m1]


async def test_refused_aput_leaves_the_memo_unchanged(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "c.redb")) as saver:
        m1 = {"role": "user", "text": "hello " * 50}
        await saver.aput(thread_config("t"), checkpoint([{"role": "system", "text": "s" * 100}], 0), {}, {})
        with pytest.raises(errors.LimitExceeded):
            await saver.aput(thread_config("t"), checkpoint([m1, HUGE], 1), {}, {})
        stored = await saver.aput(thread_config("t"), checkpoint([m1], 2), {}, {})
        got = await saver.aget_tuple(stored)
        assert got.checkpoint["channel_values"]["messages"] == [m1]


def copied(saver: AnnalSaver, thread: str) -> list:
    return [
        (t.config["configurable"]["checkpoint_id"], t.checkpoint["channel_values"], t.metadata, t.pending_writes)
        for t in saver.list(thread_config(thread))
    ]


def test_copy_into_an_existing_thread_of_more_messages_than_a_command_holds(tmp_path: Path) -> None:
    # 2058 checkpoints with a write each: 4116 messages, more than one command carries (4096).
    with AnnalSaver.open(str(tmp_path / "c.redb"), durable=False) as saver:
        config = None
        for i in range(2058):
            cp = empty_checkpoint()
            cp["channel_values"] = {"step": i}
            cp["channel_versions"] = {"step": i + 1}
            config = saver.put(thread_config("src"), cp, {"step": i}, {})
            saver.put_writes(config, [("step", i + 1)], f"task{i}")
        own = saver.put(thread_config("dst"), empty_checkpoint(), {}, {})["configurable"]["checkpoint_id"]
        saver.copy_thread("src", "dst")
        saver.copy_thread("src", "fork")  # a new target: a fork
        source = copied(saver, "src")
        assert len(source) == 2058
        dst = copied(saver, "dst")
        assert [c for c in dst if c[0] != own] == source == copied(saver, "fork")
        assert len(dst) == len(source) + 1


def test_copy_into_an_existing_thread_of_more_bytes_than_a_command_holds(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "c.redb"), durable=False) as saver:
        for i in range(5):  # 70 MiB that do not compress
            cp = empty_checkpoint()
            cp["channel_values"] = {"blob": os.urandom(14 << 20)}
            cp["channel_versions"] = {"blob": i + 1}
            saver.put(thread_config("src"), cp, {"step": i}, {})
        own = saver.put(thread_config("dst"), empty_checkpoint(), {}, {})["configurable"]["checkpoint_id"]
        saver.copy_thread("src", "dst")
        source = copied(saver, "src")
        assert len(source) == 5
        assert [c for c in copied(saver, "dst") if c[0] != own] == source


def test_copy_with_a_missing_attachment_is_refused(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "c.redb"))
    recording = RecordingDb(db)
    saver = AnnalSaver(recording)
    try:
        first = saver.put(thread_config("src"), checkpoint([{"text": "a" * 100}, {"text": "b" * 100}], 0), {}, {})
        saver.put(thread_config("dst"), empty_checkpoint(), {}, {})
        before = copied(saver, "dst")
        page = db.transcript(saver._thread("src").session, 0, 10)
        # The record is the checkpoint message's first attachment; hide an element.
        recording.missing.add(page.messages[0].attachments[1])
        with pytest.raises(errors.Corrupt):
            saver.copy_thread("src", "dst")
        recording.missing.clear()
        assert copied(saver, "dst") == before
        saver.copy_thread("src", "dst")
        assert saver.get_tuple({"configurable": {**first["configurable"], "thread_id": "dst"}}) is not None
    finally:
        db.close()


def test_purge_erases_every_session_of_a_reused_thread_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(annal.langgraph, "PAGE", 3)
    with AnnalSaver.open(str(tmp_path / "c.redb"), durable=False) as saver:
        for i in range(8):
            cp = empty_checkpoint()
            cp["channel_values"] = {"secret": f"secret-{i}"}
            saver.put(thread_config("t"), cp, {}, {})
            if i < 7:
                saver.delete_thread("t")
        purged = saver.purge_thread("t", reason="erasure", actor="test")
        assert len(purged) == 8
        left = saver.db.list_sessions(labels={"langgraph.thread": "t"}, include_archived=True, limit=100).items
        assert left == []
        assert saver.get_tuple(thread_config("t")) is None


async def test_async_calls_leave_blocking_work_to_worker_threads(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "c.redb"))
    recording = RecordingDb(db)
    try:
        loop_thread = threading.get_ident()
        saver = AnnalSaver(recording)
        stored = await saver.aput(thread_config("t"), checkpoint([{"text": "a" * 100}], 0), {}, {})
        await saver.aput_writes(stored, [("step", 1)], "task")
        # A new saver on the same database loads the thread from its transcript.
        fresh = AnnalSaver(RecordingDb(db))
        got = await fresh.aget_tuple(stored)
        assert got.checkpoint["channel_values"]["messages"] == [{"text": "a" * 100}]
        assert [t async for t in fresh.alist(thread_config("t"))][0].checkpoint["id"] == got.checkpoint["id"]
        on_loop = [
            name
            for name, ident in recording.calls + fresh.db.calls
            if ident == loop_thread and not name.endswith("_async")
        ]
        assert on_loop == []
    finally:
        db.close()
