"""AnnalSaver's storage of list channels: element by element, as deltas of the parent
checkpoint's list, across branches and restarts."""

from __future__ import annotations

from pathlib import Path

from langgraph.checkpoint.base import empty_checkpoint

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
