"""LangGraph's checkpointer conformance suite (langgraph-checkpoint-conformance) on
AnnalSaver: every base and every extended capability must pass."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from annal.langgraph import AnnalSaver


@checkpointer_test(name="AnnalSaver")
async def annal_checkpointer():
    directory = tempfile.mkdtemp(prefix="annal-conformance-")
    saver = AnnalSaver.open(str(Path(directory) / "checkpoints.redb"))
    try:
        yield saver
    finally:
        saver.close()
        shutil.rmtree(directory, ignore_errors=True)


async def test_conformance_every_capability():
    report = await validate(annal_checkpointer)
    report.print_report()
    every = {c.value for c in Capability}
    results = {name: r for name, r in report.results.items()}
    assert set(results) == every, f"capabilities run: {sorted(results)}"
    failed = {name: r.failures for name, r in results.items() if r.passed is not True or r.tests_failed}
    assert not failed, failed
    skipped = {name: r.tests_skipped for name, r in results.items() if r.tests_skipped or not r.detected}
    assert not skipped, skipped
    assert report.passed_all()
