"""Fixtures shared by the binding's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import annal


@pytest.fixture
def db(tmp_path: Path):
    """A database in a fresh temporary folder, closed after the test."""
    database = annal.open(tmp_path / "sessions.redb")
    yield database
    database.close()
