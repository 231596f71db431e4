"""What hosts that run sessions on workers need: execution leases and fenced writes,
streamed drafts, and the input inbox."""

from __future__ import annotations

from pathlib import Path

import pytest

import annal
from annal import Message, errors


def new_session(db: annal.Database) -> str:
    return db.create_session(messages=[Message.system("Be brief.")]).session


# ----- leases and fencing -----


def test_lease_busy_renew_and_fenced_commit(db: annal.Database) -> None:
    s = new_session(db)
    lease = db.acquire_lease(s, "worker-a", 5_000)
    assert isinstance(lease, annal.Lease)
    assert lease.session == s and lease.owner == "worker-a" and lease.token >= 1

    with pytest.raises(errors.Busy) as busy:
        db.acquire_lease(s, "worker-b", 5_000)
    assert busy.value.holder == "worker-a"
    assert busy.value.expires_at_ms == lease.expires_at_ms

    renewed = db.renew_lease(lease, 60_000)
    assert renewed.token == lease.token and renewed.owner == "worker-a"
    assert renewed.expires_at_ms > lease.expires_at_ms

    r = db.commit_turn(s, "t1", [Message.user("hi"), Message.assistant("hello")], fence=lease.token)
    assert not r.already_committed
    assert db.append_context(s, "k", "ctx", fence=lease.token) is not None
    assert db.record_tool_call(s, "op-1", "search", b"{}", call_id="c1", fence=lease.token)
    assert db.record_tool_result(s, "op-1", b"[]", fence=lease.token)

    assert db.release_lease(renewed) is True
    assert db.release_lease(renewed) is False
    taken = db.acquire_lease(s, "worker-b", 5_000)
    assert taken.owner == "worker-b" and taken.token > lease.token

    before = db.head(s)
    with pytest.raises(errors.Fenced) as fenced:
        db.commit_turn(s, "t2", [Message.user("stale")], fence=lease.token)
    assert fenced.value.presented == lease.token and fenced.value.current == taken.token
    for write in (
        lambda: db.append_context(s, "k2", "late", fence=lease.token),
        lambda: db.record_tool_call(s, "op-2", "search", b"{}", call_id="c2", fence=lease.token),
        lambda: db.record_tool_result(s, "op-1", b"[]", fence=lease.token),
        lambda: db.rewrite(s, before.revision, 1, 2, [Message.user("edited")], fence=lease.token),
        lambda: db.append_draft(s, "d", b"x", fence=lease.token),
    ):
        with pytest.raises(errors.Fenced):
            write()
    after = db.head(s)
    assert after.revision == before.revision and after.stream_seq == before.stream_seq
    assert db.drafts(s) == []

    # The new holder's token is accepted; a stale lease can be neither renewed nor released.
    db.commit_turn(s, "t2", [Message.user("fresh")], fence=taken.token)
    with pytest.raises(errors.Fenced):
        db.renew_lease(lease, 1_000)
    with pytest.raises(errors.Fenced):
        db.release_lease(lease)


async def test_fenced_async_commit(db: annal.Database) -> None:
    s = new_session(db)
    old = db.acquire_lease(s, "a", 5_000)
    await db.commit_turn_async(s, "t1", [Message.user("1")], fence=old.token)
    db.release_lease(old)
    new = db.acquire_lease(s, "b", 5_000)
    before = db.head(s)
    with pytest.raises(errors.Fenced) as e:
        await db.commit_turn_async(s, "t2", [Message.user("2")], fence=old.token)
    assert e.value.presented == old.token and e.value.current == new.token
    assert db.head(s).stream_seq == before.stream_seq


def test_lease_on_unknown_session(db: annal.Database) -> None:
    with pytest.raises(errors.NotFound):
        db.acquire_lease(annal.new_session_id(), "a", 1_000)


# ----- drafts -----


def test_drafts_append_read_discard_and_finalize(db: annal.Database) -> None:
    s = new_session(db)
    assert [db.append_draft(s, "d1", seg) for seg in (b"Hel", "lo", b" world")] == [0, 1, 2]
    [d] = db.drafts(s)
    assert isinstance(d, annal.Draft)
    assert d.session == s and d.draft_id == "d1" and d.first_segment == 0
    assert d.segments == [b"Hel", b"lo", b" world"] and d.data() == b"Hello world"
    assert d.total_segments == 3 and d.total_bytes == 11 and d.complete

    tail = db.draft(s, "d1", from_segment=1)
    assert tail.first_segment == 1 and tail.segments == [b"lo", b" world"]
    assert db.draft(s, "nope") is None
    partial = db.draft(s, "d1", max_bytes=3)
    assert partial.segments == [b"Hel"] and not partial.complete

    assert db.discard_draft(s, "d1") is True
    assert db.discard_draft(s, "d1") is False
    assert db.drafts(s) == [] and db.draft(s, "d1") is None

    db.append_draft(s, "d2", "partial answ")
    db.append_draft(s, "d2", "er")
    r = db.commit_turn(s, "t1", [Message.user("q"), Message.assistant("partial answer")], finalizes="d2")
    assert not r.already_committed
    assert db.draft(s, "d2") is None and db.drafts(s) == []
    assert db.transcript(s).messages[-1].body == b"partial answer"


async def test_async_commit_finalizes_draft(db: annal.Database) -> None:
    s = new_session(db)
    db.append_draft(s, "d", "a")
    await db.commit_turn_async(s, "t1", [Message.assistant("a")], finalizes="d")
    assert db.draft(s, "d") is None


def test_flushed_drafts_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sessions.redb"
    db = annal.open(path)
    s = new_session(db)
    db.append_draft(s, "d3", b"one ")
    db.append_draft(s, "d3", b"two")
    db.flush_drafts()
    assert db.abandoned_drafts() == []
    db.close()

    db = annal.open(path)
    try:
        [summary] = db.abandoned_drafts()
        assert isinstance(summary, annal.DraftSummary)
        assert (summary.session, summary.draft_id, summary.segments, summary.bytes) == (s, "d3", 2, 7)
        assert db.draft(s, "d3").segments == [b"one ", b"two"]
        db.append_draft(s, "d3", b" three")
        db.commit_turn(s, "t1", [Message.assistant("one two three")], finalizes="d3")
        assert db.drafts(s) == []
    finally:
        db.close()


# ----- the inbox -----


def test_inbox_enqueue_claim_consume_cancel(db: annal.Database) -> None:
    s = new_session(db)
    lease = db.acquire_lease(s, "worker", 60_000)
    seq = db.enqueue_input(s, "in-1", Message.user("first"))
    assert isinstance(seq, int)
    assert db.enqueue_input(s, "in-1", Message.user("first")) is None
    with pytest.raises(errors.InputConflict):
        db.enqueue_input(s, "in-1", Message.user("other"))
    db.enqueue_input(s, "in-2", Message.user("second"), kind="next_turn")

    pending = db.pending_inputs(s)
    assert [(i.input_id, i.kind, i.state) for i in pending] == [
        ("in-1", "next_turn", "pending"),
        ("in-2", "next_turn", "pending"),
    ]
    assert pending[0].text() == "first" and pending[0].role == "user"
    assert [i.input_id for i in db.inbox(s)] == ["in-1", "in-2"]

    with pytest.raises(errors.Fenced) as e:
        db.claim_inputs(s, token=lease.token + 1, owner="worker", ttl_ms=60_000, max=10)
    assert e.value.presented == lease.token + 1 and e.value.current == lease.token

    claim = db.claim_inputs(s, token=lease.token, owner="worker", ttl_ms=60_000, max=10)
    assert isinstance(claim, annal.Claim)
    assert claim.claim is not None and claim.inputs == ["in-1", "in-2"]
    assert db.pending_inputs(s) == []
    inbox = db.inbox(s)
    assert [(i.state, i.claim) for i in inbox] == [("claimed", claim.claim), ("claimed", claim.claim)]
    row = db.claim(s, claim.claim)
    assert row.owner == "worker" and row.token == lease.token and row.target == "next_turn"
    assert row.inputs == ["in-1", "in-2"] and row.open and row.turn_id is None

    db.commit_turn(
        s, "t1", [Message.user("first second"), Message.assistant("ok")], inputs=["in-1", "in-2"], fence=lease.token
    )
    for input_id in ("in-1", "in-2"):
        done = db.input(s, input_id)
        assert done.state == "completed" and done.turn_id == "t1" and done.closed_seq is not None
    assert db.inbox(s) == [] and db.pending_inputs(s) == []
    assert not db.claim(s, claim.claim).open

    db.enqueue_input(s, "in-3", Message.user("never mind"))
    assert db.cancel_input(s, "in-3") is True
    assert db.cancel_input(s, "in-3") is False
    assert db.input(s, "in-3").state == "cancelled"
    assert db.inbox(s) == []
    assert db.input(s, "missing") is None

    # Claiming nothing writes nothing.
    empty = db.claim_inputs(s, token=lease.token, owner="worker", ttl_ms=1_000, max=10)
    assert empty.claim is None and empty.inputs == []


def test_inbox_active_turn_and_abandon(db: annal.Database) -> None:
    s = new_session(db)
    lease = db.acquire_lease(s, "worker", 60_000)
    db.enqueue_input(s, "a", Message.user("while you run"), kind="active_turn")
    claim = db.claim_inputs(s, token=lease.token, owner="worker", target="active_turn", turn_id="t1", ttl_ms=60_000, max=1)
    assert claim.inputs == ["a"]
    assert db.claim(s, claim.claim).turn_id == "t1" and db.claim(s, claim.claim).target == "active_turn"
    with pytest.raises(errors.InputState):
        db.cancel_input(s, "a")
    assert db.abandon_claim(s, claim.claim) is True
    assert db.abandon_claim(s, claim.claim) is False
    with pytest.raises(errors.UnknownClaim):
        db.abandon_claim(s, claim.claim + 1000)
    assert [i.input_id for i in db.pending_inputs(s)] == ["a"]


def test_inbox_rejects_unknown_strings(db: annal.Database) -> None:
    s = new_session(db)
    with pytest.raises(ValueError, match="input kind"):
        db.enqueue_input(s, "x", Message.user("x"), kind="later")
    with pytest.raises(ValueError, match="claim target"):
        db.claim_inputs(s, token=1, owner="w", target="soon")
    with pytest.raises(ValueError, match="turn_id"):
        db.claim_inputs(s, token=1, owner="w", target="active_turn")
    with pytest.raises(ValueError, match="turn_id"):
        db.claim_inputs(s, token=1, owner="w", target="next_turn", turn_id="t")
    assert db.inbox(s) == []


def test_fork_archive_labels_and_metadata_take_a_fence(db: annal.Database) -> None:
    s = new_session(db)
    first = db.acquire_lease(s, "worker-a", 60_000)
    assert db.set_labels(s, {"stage": "one"}, fence=first.token) is not None
    assert db.set_metadata(s, b"meta", fence=first.token) is not None
    child = db.fork(s, fence=first.token).session
    assert db.head(child).forked_from[0] == s
    db.release_lease(first)
    second = db.acquire_lease(s, "worker-b", 60_000)
    assert second.token > first.token
    before = db.head(s)
    for stale in (
        lambda: db.set_labels(s, {"stage": "two"}, fence=first.token),
        lambda: db.set_metadata(s, b"other", fence=first.token),
        lambda: db.fork(s, fence=first.token),
        lambda: db.archive(s, "done", fence=first.token),
    ):
        with pytest.raises(errors.Fenced) as fenced:
            stale()
        assert (fenced.value.presented, fenced.value.current) == (first.token, second.token)
    after = db.head(s)
    assert (after.stream_seq, after.labels, after.archived) == (before.stream_seq, before.labels, False)
    assert db.archive(s, "done", fence=second.token)
    assert db.revive(s, "again", fence=second.token) > 0


def test_lease_query(db: annal.Database) -> None:
    s = new_session(db)
    assert db.lease(s) is None
    held = db.acquire_lease(s, "worker-a", 60_000)
    seen = db.lease(s)
    assert isinstance(seen, annal.LeaseState)
    assert (seen.session, seen.owner, seen.token, seen.released) == (s, "worker-a", held.token, False)
    renewed = db.renew_lease(held, 120_000)
    assert db.lease(s).expires_at_ms == renewed.expires_at_ms
    db.release_lease(held)
    assert db.lease(s).released
    with pytest.raises(errors.NotFound):
        db.lease(annal.new_session_id())
