"""A LangGraph StateGraph end to end on AnnalSaver, with deterministic nodes: an
interrupt and its resume, time travel, a fork with update_state, and a process that
dies in the middle of a run and a new process that finishes it."""

from __future__ import annotations

import operator
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from annal.langgraph import AnnalSaver


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    approved: str


def plan(state: State) -> dict:
    return {"log": ["plan"]}


def review(state: State) -> dict:
    answer = interrupt({"question": "approve?", "log": state["log"]})
    return {"log": [f"review:{answer}"], "approved": answer}


def act(state: State) -> dict:
    return {"log": [f"act:{state['approved']}"]}


def build(saver: AnnalSaver):
    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("review", review)
    g.add_node("act", act)
    g.add_edge(START, "plan")
    g.add_edge("plan", "review")
    g.add_edge("review", "act")
    g.add_edge("act", END)
    return g.compile(checkpointer=saver)


def test_interrupt_resume_time_travel_and_fork(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "graph.redb")) as saver:
        graph = build(saver)
        config = {"configurable": {"thread_id": "t-1"}}

        # Runs to the interrupt in review.
        out = graph.invoke({"log": ["start"], "approved": ""}, config)
        assert out["__interrupt__"][0].value["question"] == "approve?"
        state = graph.get_state(config)
        assert state.next == ("review",)
        assert state.values["log"] == ["start", "plan"]

        # Resume with an answer.
        out = graph.invoke(Command(resume="yes"), config)
        assert out["log"] == ["start", "plan", "review:yes", "act:yes"]
        assert graph.get_state(config).next == ()

        history = list(graph.get_state_history(config))
        assert len(history) >= 4
        # Newest first; every parent is the next one down.
        for newer, older in zip(history, history[1:]):
            assert newer.parent_config["configurable"]["checkpoint_id"] == older.config["configurable"]["checkpoint_id"]

        # Time travel: replay from the checkpoint before review, answering differently.
        before_review = next(s for s in history if s.next == ("review",))
        replay = graph.invoke(None, before_review.config)
        assert replay["__interrupt__"][0].value["log"] == ["start", "plan"]
        out = graph.invoke(Command(resume="no"), config)
        assert out["log"] == ["start", "plan", "review:no", "act:no"]

        # The first branch is still there.
        ids = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(config)]
        first_done = history[0].config["configurable"]["checkpoint_id"]
        assert first_done in ids
        assert graph.get_state(history[0].config).values["log"] == ["start", "plan", "review:yes", "act:yes"]

        # Fork: update_state on the checkpoint before review, as if review had run.
        forked = graph.update_state(before_review.config, {"log": ["edited"], "approved": "maybe"}, as_node="review")
        assert graph.get_state(forked).next == ("act",)
        out = graph.invoke(None, forked)
        assert out["log"] == ["start", "plan", "edited", "act:maybe"]
        assert out["approved"] == "maybe"
        latest = graph.get_state(config)
        assert latest.values["log"] == ["start", "plan", "edited", "act:maybe"]
        assert latest.parent_config["configurable"]["checkpoint_id"] == forked["configurable"]["checkpoint_id"]


async def test_async_graph(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "graph.redb")) as saver:
        graph = build(saver)
        config = {"configurable": {"thread_id": "t-async"}}
        out = await graph.ainvoke({"log": ["start"], "approved": ""}, config)
        assert "__interrupt__" in out
        out = await graph.ainvoke(Command(resume="ok"), config)
        assert out["log"] == ["start", "plan", "review:ok", "act:ok"]
        assert [s async for s in graph.aget_state_history(config)]


CRASHING_RUN = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    import test_graph
    from annal.langgraph import AnnalSaver

    def act(state):
        os._exit(17)  # the process dies in the middle of the run

    test_graph.act = act
    saver = AnnalSaver.open({db!r})
    graph = test_graph.build(saver)
    config = {{"configurable": {{"thread_id": "t-crash"}}}}
    # durability="sync": each checkpoint is stored before the next step starts.
    graph.invoke({{"log": ["start"], "approved": ""}}, config, durability="sync")
    from langgraph.types import Command
    graph.invoke(Command(resume="yes"), config, durability="sync")
    raise SystemExit("not reached")
    """
)


def test_process_restart_mid_run(tmp_path: Path) -> None:
    db = str(tmp_path / "graph.redb")
    script = CRASHING_RUN.format(tests=str(Path(__file__).parent), db=db)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 17, done.stderr

    # A new process (this one) opens the database and finds the run where it stopped:
    # review's result is checkpointed, act is next.
    with AnnalSaver.open(db) as saver:
        graph = build(saver)
        config = {"configurable": {"thread_id": "t-crash"}}
        state = graph.get_state(config)
        assert state.next == ("act",)
        assert state.values["log"] == ["start", "plan", "review:yes"]
        out = graph.invoke(None, config)
        assert out["log"] == ["start", "plan", "review:yes", "act:yes"]
        assert graph.get_state(config).next == ()


def test_purge_thread(tmp_path: Path) -> None:
    with AnnalSaver.open(str(tmp_path / "graph.redb")) as saver:
        graph = build(saver)
        keep = {"configurable": {"thread_id": "keep"}}
        gone = {"configurable": {"thread_id": "gone"}}
        graph.invoke({"log": ["keep-me"], "approved": ""}, keep)
        graph.invoke({"log": ["secret-plan"], "approved": ""}, gone)
        saver.delete_thread("gone")  # an archived generation
        graph.invoke({"log": ["secret-again"], "approved": ""}, gone)
        assert len(saver.purge_thread("gone", reason="user request", actor="ops")) == 2
        assert graph.get_state(gone).values == {}
        assert graph.get_state(keep).values["log"] == ["keep-me", "plan"]
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"secret-plan" not in raw and b"secret-again" not in raw
