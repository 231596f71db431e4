"""The annal package's own API: commands, queries, errors, async twins, subscriptions
and group commit from Python threads."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import annal
from annal import Message, errors


def test_session_turns_and_retries(db: annal.Database) -> None:
    created = db.create_session(labels={"project": "demo"}, metadata=b"m", messages=[Message.system("Be brief.")])
    s = created.session
    head = db.head(s)
    assert head.labels == {"project": "demo"} and head.metadata == b"m" and head.message_count == 1
    assert head.revision == created.receipt.revision

    turn = [Message.user("2 + 2?"), Message.assistant("4")]
    r = db.commit_turn(s, "turn-1", turn, expected=head.revision, usage=[("acme", "m1", 10, 1)])
    assert not r.already_committed
    again = db.commit_turn(s, "turn-1", turn, expected=head.revision, usage=[("acme", "m1", 10, 1)])
    assert again.already_committed and again.receipt.seq == r.receipt.seq

    with pytest.raises(errors.TurnConflict) as e:
        db.commit_turn(s, "turn-1", [Message.user("other")])
    assert e.value.turn_id == "turn-1"

    with pytest.raises(errors.RevisionConflict) as e:
        db.commit_turn(s, "turn-2", [Message.user("late")], expected=head.revision)
    assert e.value.expected == head.revision
    assert e.value.actual == r.receipt.revision
    assert isinstance(e.value, errors.Rejected) and isinstance(e.value, annal.AnnalError)
    assert e.value.fields == {"expected": head.revision, "actual": r.receipt.revision}
    copy = pickle.loads(pickle.dumps(e.value))
    assert type(copy) is errors.RevisionConflict and copy.actual == e.value.actual

    stream_seq = db.head(s).stream_seq
    with pytest.raises(errors.VersionConflict) as e:
        db.commit_turn(s, "turn-3", [Message.user("x")], expected=stream_seq - 1)
    assert (e.value.expected, e.value.actual) == (stream_seq - 1, stream_seq)

    page = db.transcript(s)
    assert [m.body for m in page.messages] == [b"Be brief.", b"2 + 2?", b"4"]
    assert [m.role for m in page.messages] == ["system", "user", "assistant"]
    assert page.total == 3
    usage = db.usage(s)
    assert (usage[0].provider, usage[0].input, usage[0].output) == ("acme", 10, 1)

    with pytest.raises(errors.NotFound):
        db.commit_turn(annal.new_session_id(), "t", [Message.user("x")])
    with pytest.raises(ValueError):
        db.head("not-an-id")


def test_attachments_and_host_state_are_content_objects(db: annal.Database) -> None:
    s = db.create_session().session
    blob = b"x" * 1000
    db.commit_turn(s, "t1", [Message("user", b"a", "application/json", [blob])], state={"tools": b"v1"})
    m = db.transcript(s).messages[0]
    assert m.content_type == "application/json"
    assert m.attachments == [annal.content_id(blob)]
    assert db.content(m.attachments[0]) == blob
    assert db.contents([m.attachments[0], "00" * 32]) == [blob, None]
    assert db.host_state(s, "tools") == b"v1"
    seq = db.head(s).stream_seq
    db.set_host_state(s, {"tools": b"v2", "other": b"o"})
    db.set_host_state(s, {"other": None})
    assert db.host_state(s, "tools") == b"v2"
    assert db.host_state(s, "tools", at=seq) == b"v1"
    assert db.host_state(s, "other") is None
    assert set(db.head(s).host_state) == {"tools"}


def test_rewrite_restore_fork_archive(db: annal.Database) -> None:
    s = db.create_session(messages=[Message.system("sys")]).session
    for i in range(3):
        db.commit_turn(s, f"t{i}", [Message.user(f"u{i}"), Message.assistant(f"a{i}")])
    before = db.head(s).revision
    r = db.rewrite(s, before, 1, 5, [Message.assistant("summary")], reason="compaction", note="n", actor="me")
    assert [m.body for m in db.transcript(s).messages] == [b"sys", b"summary", b"u2", b"a2"]
    assert [m.body for m in db.transcript(s, revision=before).messages][-1] == b"a2"
    db.restore(s, r.revision, before)
    assert db.head(s).revision == before
    assert {n.origin for n in db.revisions(s)} >= {"created", "turn", "compaction"}
    with pytest.raises(errors.InvalidRange) as e:
        db.rewrite(s, before, 5, 99, [])
    assert (e.value.start, e.value.end, e.value.len) == (5, 99, 7)

    child = db.fork(s, 3, labels={"branch": "b"}).session
    assert [m.body for m in db.transcript(child).messages] == [b"sys", b"u0", b"a0"]
    assert db.head(child).forked_from[0] == s
    whole = db.fork(s).session
    assert db.head(whole).message_count == 7

    assert db.archive(child, "done")
    assert not db.archive(child, "again")
    with pytest.raises(errors.Archived):
        db.commit_turn(child, "x", [Message.user("x")])
    listed = {h.session for h in db.list_sessions().items}
    assert child not in listed and s in listed
    assert child in {h.session for h in db.list_sessions(include_archived=True).items}
    assert [h.session for h in db.list_sessions(labels={"branch": "b"}, include_archived=True).items] == [child]
    db.revive(child)
    db.set_labels(child, {"k": "v"}, {"branch"})
    assert db.head(child).labels == {"k": "v"}
    assert db.set_metadata(child, b"meta") is not None
    assert db.head(child).metadata == b"meta"


def test_context_and_tools(db: annal.Database) -> None:
    s = db.create_session().session
    assert db.append_context(s, "ctx-1", "the repo uses tabs", source="agents.md") is not None
    assert db.append_context(s, "ctx-1", "the repo uses tabs", source="agents.md") is None
    assert [c.key for c in db.context(s, pending=True)] == ["ctx-1"]
    assert db.record_tool_call(s, "op-1", "grep", b'{"q":"x"}', call_id="c1", replay_safe=True)
    assert [o.op_id for o in db.tool_ops(s, unsettled=True)] == ["op-1"]
    db.commit_turn(s, "t1", [Message.assistant("calling")], applied_context=["ctx-1"], tool_ops=["op-1"])
    assert db.context(s)[0].applied_by == "t1"
    assert db.record_tool_result(s, "op-1", b"found", outcome="ok")
    op = db.tool_op(s, "op-1")
    assert op.outcome == "ok" and db.content(op.result_id) == b"found" and op.replay_safe
    assert db.tool_ops(s, unsettled=True) == []
    with pytest.raises(errors.ToolOrphan):
        db.record_tool_result(s, "op-2", b"x")


def test_a_database_dropped_without_close_closes_without_holding_the_gil(tmp_path: Path) -> None:
    import time

    db = annal.open(tmp_path / "g.redb")
    s = db.create_session(messages=[Message.system("sys")]).session
    for i in range(100):
        db.commit_turn(s, f"t{i}", [Message.user(f"{i}: " + "x" * 2000) for _ in range(50)])
    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0)  # gives the GIL back at once when the main thread wants it

    # The main thread gives the GIL up only where it releases it: not between bytecodes.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30)
    spinner = threading.Thread(target=spin)
    try:
        spinner.start()
        time.sleep(0.05)
        before = counter[0]
        del db  # the last reference: the engine closes here
        during = counter[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        spinner.join()
    assert during > 0, "another thread ran while the dropped database closed"
    with annal.open(tmp_path / "g.redb") as again:
        assert again.head(s).message_count == 5001


def test_answers_for_a_closed_event_loop_go_quietly(db: annal.Database) -> None:
    s = db.create_session(messages=[Message.system("sys")]).session
    seen: list[object] = []
    hook = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        loop = asyncio.new_event_loop()

        async def start() -> list:
            # A large turn first keeps the writer busy: the answers come after the close.
            big = db.commit_turn_async(s, "big", [Message("tool", os.urandom(12 << 20), "application/octet-stream")])
            return [big] + [db.commit_turn_async(s, f"t{i}", [Message.user(str(i))]) for i in range(20)]

        loop.run_until_complete(start())
        loop.close()
        # Group commits answer in order: once this one is back, the others were answered.
        db.commit_turn(s, "after", [Message.user("after")])
        for _ in range(50):
            if db.head(s).message_count == 23:
                break
            threading.Event().wait(0.01)
        threading.Event().wait(0.1)
    finally:
        sys.unraisablehook = hook
    assert seen == [], [getattr(u, "exc_value", u) for u in seen]
    assert db.head(s).message_count == 23


def test_a_pages_list_is_made_once_and_is_the_same_list_at_every_read(db: annal.Database) -> None:
    s = db.create_session(messages=[Message.user(str(i)) for i in range(5)]).session
    page = db.transcript(s)
    assert page.messages is page.messages and [m.body for m in page.messages] == [b"0", b"1", b"2", b"3", b"4"]
    sessions, revisions, events = db.list_sessions(), db.revision_page(s), db.events()
    assert sessions.items is sessions.items and len(sessions.items) == 1
    assert revisions.items is revisions.items and len(revisions.items) == 1
    assert events.events is events.events and len(events.events) == 1
    assert [n.revision for n in db.revisions(s)] == [n.revision for n in revisions.items]


def test_bytes_arguments_take_bytes_bytearray_or_str_and_nothing_else() -> None:
    assert Message("user", bytearray(b"hi"), attachments=[bytearray(b"a"), "b"]).body == b"hi"
    assert Message("user", "hé").body == "hé".encode()
    for wrong in ([104, 105], 7, None):
        with pytest.raises(TypeError, match="must be bytes, bytearray or str"):
            Message("user", wrong)
    with pytest.raises(TypeError, match="an attachment must be"):
        Message("user", "x", attachments=[[1, 2]])


def test_a_database_in_a_missing_directory_and_a_bad_compression_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "no such dir"
    with pytest.raises(FileNotFoundError) as caught:
        annal.open(missing / "x.redb")
    assert caught.value.filename == str(missing) and not missing.exists()
    with pytest.raises(ValueError, match="^compression must be"):
        annal.compact(tmp_path, compression="gzip")


def test_a_storage_error_names_the_kind_the_file_system_gave(tmp_path: Path) -> None:
    a_dir = tmp_path / "a-dir.redb"
    a_dir.mkdir()
    with pytest.raises(annal.errors.Storage) as caught:
        annal.open(a_dir)
    assert caught.value.kind == "IsADirectory", caught.value
    with pytest.raises(annal.errors.Storage) as caught:
        annal.compact(tmp_path)
    assert caught.value.kind is None and "is not a file" in caught.value.detail
    with annal.open(tmp_path / "healthy.redb") as db:
        db.create_session()
        assert db.poison_cause() is None


def test_a_subscription_wait_is_interrupted_by_a_signal(db: annal.Database) -> None:
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    sub = db.subscribe()
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            # Bounded, so a wait that ignores the signal fails the test instead of hanging it.
            sub.recv(timeout=5)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            for _ in sub:
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert sub.recv(timeout=0) is None


def test_events_subscribe_and_close(tmp_path: Path) -> None:
    db = annal.open(tmp_path / "s.redb")
    sub = db.subscribe()
    s = db.create_session().session
    notice = sub.recv(timeout=5)
    assert notice.sessions == [s] and notice.first_seq == 1
    page = db.events(1, 10)
    assert [e.kind for e in page.events] == ["SessionCreated"]
    assert db.events(session=s).events[0].seq == 1
    assert db.tip()[0] == 1
    db.close()
    assert db.closed
    db.close()
    with pytest.raises(errors.Closed):
        db.head(s)
    assert sub.recv(timeout=1) is None
    before, after = annal.compact(tmp_path / "s.redb")
    assert 0 < after <= before
    with annal.open(tmp_path / "s.redb") as again:
        assert again.head(s) is not None


def test_threads_group_commit(db: annal.Database) -> None:
    sessions = [db.create_session().session for _ in range(16)]
    sub = db.subscribe()
    start = db.tip()[0]

    def work(s: str) -> None:
        for i in range(50):
            db.commit_turn(s, f"t{i}", [Message.user(f"m{i}")])

    threads = [threading.Thread(target=work, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert db.tip()[0] == start + 16 * 50
    assert all(db.head(s).message_count == 50 for s in sessions)
    # Threads wait for the writer without the GIL, so their commits share
    # transactions: fewer log commits (fsyncs) than events.
    stats = db.stats()
    assert stats["events"] >= 16 * 50
    assert stats["log_commits"] < stats["events"], stats
    seen = 0
    while seen < 16 * 50:
        n = sub.recv(timeout=5)
        assert n is not None
        seen += n.last_seq - n.first_seq + 1


async def test_async_twins(db: annal.Database) -> None:
    created = await db.create_session_async(labels={"a": "b"})
    s = created.session
    results = await asyncio.gather(*(db.commit_turn_async(s, f"t{i}", [Message.user(str(i))]) for i in range(100)))
    assert sorted(r.receipt.seq for r in results) == list(range(2, 102))
    retry = await db.commit_turn_async(s, "t0", [Message.user("0")])
    assert retry.already_committed
    with pytest.raises(errors.TurnConflict):
        await db.commit_turn_async(s, "t0", [Message.user("changed")])
    with pytest.raises(errors.NotFound):
        await db.commit_turn_async(annal.new_session_id(), "t", [Message.user("x")])


def test_compress_chooses_how_content_is_stored(tmp_path: Path) -> None:
    long = "the agent reads the file, runs the tests and writes the diff\n" * 100
    sessions = {}
    for compress in (True, "zstd", "lz4", False, "off"):
        db = annal.open(tmp_path / f"c-{compress}.redb", compress=compress)
        sessions[compress] = db.create_session(messages=[Message.user(long)]).session
        assert db.transcript(sessions[compress]).messages[0].body == long.encode()
        db.close()
    # Content written under zstd reads back under lz4, beside what lz4 writes.
    db = annal.open(tmp_path / "c-zstd.redb", compress="lz4")
    s = db.create_session(messages=[Message.user(long + "more")]).session
    assert db.transcript(sessions["zstd"]).messages[0].body == long.encode()
    assert db.transcript(s).messages[0].body == (long + "more").encode()
    db.close()
    with pytest.raises(ValueError, match="zstd"):
        annal.open(tmp_path / "bad.redb", compress="brotli")
    # The lz4 file, recompressed to zstd offline: smaller, and it reads the same.
    before, after = annal.compact(tmp_path / "c-True.redb", compression="zstd")
    assert after <= before
    db = annal.open(tmp_path / "c-True.redb")
    assert db.transcript(sessions[True]).messages[0].body == long.encode()
    db.close()
    with pytest.raises(ValueError, match="zstd"):
        annal.compact(tmp_path / "c-True.redb", compression="brotli")


def test_purge_and_collect(tmp_path: Path) -> None:
    db = annal.open(tmp_path / "p.redb", compress=False)
    secret = b"my card number is 4111"
    leaving = db.create_session(messages=[Message("user", secret)]).session
    staying = db.create_session(messages=[Message.user("hello")]).session
    child = db.fork(leaving).session
    content = db.transcript(leaving).messages[0].content_id
    # The commit is in the database's files: the journal, until it is moved into the log file.
    assert secret in b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())

    with pytest.raises(errors.HasForks) as e:
        db.purge(leaving, reason="gdpr-art17", actor="dpo")
    assert e.value.session == leaving and e.value.forks == [child]

    report = db.purge(leaving, reason="gdpr-art17", actor="dpo", descendants=True)
    assert {s for s, _ in report.purged} == {leaving, child}
    assert not db.closed
    with pytest.raises(errors.Purged) as e:
        db.head(leaving)
    assert e.value.session == leaving and e.value.seq > 0
    assert db.content(content) is None
    assert db.head(staying).message_count == 1
    db.commit_turn(staying, "t", [Message.user("still here")])
    with pytest.raises(errors.NotFound):
        db.purge(annal.new_session_id(), reason="r", actor="a")
    assert db.collect_garbage()["objects_removed"] == 0
    db.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert secret not in raw


def test_recv_with_an_unbounded_timeout(db: annal.Database) -> None:
    sub = db.subscribe()
    s = db.create_session().session
    db.commit_turn(s, "t1", [Message.user("hi")])
    # Too long for a duration: no limit, as with None.
    assert sub.recv(timeout=float("inf")).sessions == [s]
    assert sub.recv(timeout=1e20).sessions == [s]
    # Negative and NaN timeouts do not wait.
    assert sub.recv(timeout=-1) is None
    assert sub.recv(timeout=float("nan")) is None


def test_pending_async_commits_at_exit(tmp_path: Path) -> None:
    script = f"""
import asyncio
import os
import annal

db = annal.open({str(tmp_path / "exit.redb")!r})
s = db.create_session().session

async def main():
    for i in range(3000):
        db.commit_turn_async(s, f"t{{i}}", [annal.Message.user("x" * 2000)])

asyncio.new_event_loop().run_until_complete(main())
"""
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert "panicked" not in run.stderr, run.stderr
        assert run.returncode == 0, run.stderr


def test_daemon_threads_committing_at_exit(tmp_path: Path) -> None:
    # Daemon threads are inside engine calls when the program ends. The process exits
    # cleanly (such a thread never takes the GIL back once the interpreter finalizes),
    # and every commit a thread saw acknowledged is in the file.
    script = """
import sys
import threading
import time
import annal

db = annal.open(sys.argv[1])
s = db.create_session().session
acked = []

def work(k):
    i = 0
    while True:
        db.commit_turn(s, f"t{k}-{i}", [annal.Message.user("x" * 500)])
        acked.append(f"t{k}-{i}")
        i += 1

for k in range(4):
    threading.Thread(target=work, args=(k,), daemon=True).start()
time.sleep(0.2)
print(s, *list(acked))
"""
    for i in range(3):
        path = tmp_path / f"daemon{i}.redb"
        run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        session, *acked = run.stdout.split()
        assert acked
        db = annal.open(str(path))
        for turn in acked:
            assert db.commit_turn(session, turn, [Message.user("x" * 500)]).already_committed
        db.close()


def test_compact_refuses_a_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.redb"
    with pytest.raises(FileNotFoundError) as e:
        annal.compact(missing)
    assert e.value.filename == str(missing)
    with pytest.raises(FileNotFoundError):
        annal.compact(missing, compression="zstd")
    assert list(tmp_path.iterdir()) == []


def test_record_tool_call_needs_a_call_id(db: annal.Database) -> None:
    s = db.create_session().session
    with pytest.raises(TypeError, match="call_id"):
        db.record_tool_call(s, "op-1", "grep", b"{}")
    assert db.record_tool_call(s, "op-1", "grep", b"{}", call_id="c1")
    assert "call_id" in annal.Database.record_tool_call.__doc__


def test_labels_and_state_take_any_mapping_and_collection(db: annal.Database) -> None:
    from types import MappingProxyType

    s = db.create_session(labels=MappingProxyType({"a": "1", "b": "2", "c": "3", "d": "4"})).session
    assert db.set_labels(s, remove=["a"]) is not None
    assert db.set_labels(s, remove=("b",)) is not None
    assert db.set_labels(s, MappingProxyType({"e": "5"}), remove={"c"}) is not None
    assert db.head(s).labels == {"d": "4", "e": "5"}
    with pytest.raises(TypeError):
        db.set_labels(s, remove="d")
    assert [h.session for h in db.list_sessions(labels=MappingProxyType({"e": "5"})).items] == [s]
    child = db.fork(s, labels=MappingProxyType({"f": "6"})).session
    assert db.head(child).labels == {"f": "6"}
    db.commit_turn(s, "t1", [Message.user("hi")], state=MappingProxyType({"k": b"v"}))
    assert db.host_state(s, "k") == b"v"
    db.set_host_state(s, MappingProxyType({"k": None, "j": b"w"}))
    assert db.host_state(s, "k") is None and db.host_state(s, "j") == b"w"
    with pytest.raises(TypeError):
        db.set_host_state(s, [("k", b"v")])


def test_context_manager_exit_takes_the_exception(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        with annal.open(tmp_path / "cm.redb") as db:
            raise KeyError("x")
    assert db.closed
    db = annal.open(tmp_path / "cm.redb")
    assert db.__exit__(None, None, None) is False and db.closed


def test_database_doc_describes_its_options() -> None:
    assert "durable=False" in annal.Database.__doc__
    assert "compress" in annal.Database.__doc__ and "zstd" in annal.Database.__doc__


def test_revision_pages_and_unsettled_paging(db: annal.Database) -> None:
    s = db.create_session(messages=[Message.user("a")]).session
    for i in range(3):
        db.commit_turn(s, f"t{i}", [Message.user(str(i))])
    page = db.revision_page(s, 1, 2)
    assert page.head == db.head(s).revision and page.total == 4 and page.has_more
    assert [n.ordinal for n in page.items] == [1, 2] and (page.offset, page.limit) == (1, 2)
    assert [n.revision for n in db.revisions(s, 1, 2)] == [n.revision for n in page.items]
    empty = db.revision_page(s, 0, 0)
    assert empty.items == [] and empty.head == page.head and empty.has_more
    assert db.transcript(s, 0, 0).messages == [] and db.transcript(s, 0, 0).total == 4

    for i in range(5):
        db.record_tool_call(s, f"op-{i}", "grep", b"{}", call_id=f"c{i}")
    assert [o.op_id for o in db.tool_ops(s, unsettled=True)] == [f"op-{i}" for i in range(5)]
    assert [o.op_id for o in db.tool_ops(s, unsettled=True, offset=1, limit=2)] == ["op-1", "op-2"]
    assert [o.op_id for o in db.tool_ops(s, unsettled=True, offset=3)] == ["op-3", "op-4"]
    # A page is a page in both modes: over the engine's page limit, it is refused.
    for unsettled in (False, True):
        with pytest.raises(errors.LimitExceeded):
            db.tool_ops(s, unsettled=unsettled, limit=10**6)
    assert [o.op_id for o in db.tool_ops(s, offset=1, limit=2)] == ["op-1", "op-2"]


def test_limits_are_the_engines_and_bound_what_a_command_carries(db: annal.Database) -> None:
    limits = annal.LIMITS
    assert limits["messages_per_command_max"] == 4096 and limits["page_items_max"] == 10_000
    assert limits["attachments_per_message_max"] == 64 and len(limits) == 21
    s = db.create_session(messages=[Message.system("sys")]).session
    tip = db.tip()
    many = [Message.user(str(i)) for i in range(limits["messages_per_command_max"] + 1)]
    with pytest.raises(errors.LimitExceeded):
        db.commit_turn(s, "t", many)
    assert db.tip() == tip, "a refused command writes nothing"
    db.commit_turn(s, "t", many[1:])


def test_expected_is_none_a_revision_or_a_stream_seq(db: annal.Database) -> None:
    s = db.create_session(messages=[Message.system("sys")]).session
    tip = db.tip()
    for wrong in (True, False):
        with pytest.raises(TypeError, match="not a bool"):
            db.commit_turn(s, "t", [Message.user("x")], expected=wrong)
    with pytest.raises(ValueError, match="stream seq"):
        db.commit_turn(s, "t", [Message.user("x")], expected=-1)
    with pytest.raises(TypeError):
        db.commit_turn(s, "t", [Message.user("x")], expected=1.0)
    assert db.tip() == tip, "a refused argument writes nothing"
    db.commit_turn(s, "t", [Message.user("x")], expected=1)
