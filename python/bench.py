"""AnnalSaver against langgraph-checkpoint-sqlite, side by side in one run.

For each saver (SqliteSaver and AnnalSaver with threads; AsyncSqliteSaver and AnnalSaver
with asyncio tasks) and each concurrency (1 and 16 writers): put the checkpoints of a
growing message list (``--threads`` threads of ``--steps`` steps: step k holds k + 1
chat messages), then read checkpoints back with get_tuple, then measure the bytes on
disk (as written, and after annal's compaction or SQLite's VACUUM give free space
back). Every saver writes durably (SQLite in WAL mode with its default synchronous=FULL;
annal with its default durable commits).

    python python/bench.py                      # 200 threads x 50 steps = 10,000 puts
    python python/bench.py --threads 40 --steps 25

Each configuration runs ``--rounds`` times (3), the savers alternating; the medians are
reported. Prints a Markdown table and the ratios annal / SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

import annal
from annal.langgraph import AnnalSaver

WORDS = (
    "the agent reads a file and proposes a patch for the failing test then runs the suite again "
    "while the user asks about the build cache the linker flags and the deployment window"
).split()


def message(thread: int, step: int):
    rng = random.Random(thread * 100_003 + step)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 90)))
    if step % 2 == 0:
        return HumanMessage(content=text, id=f"h-{thread}-{step}")
    return AIMessage(content=text, id=f"a-{thread}-{step}")


def checkpoints(thread: int, steps: int, versions):
    """The (checkpoint, metadata, new_versions) of each step of one thread."""
    msgs = []
    for step in range(steps):
        msgs = msgs + [message(thread, step)]
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": msgs, "step": step, "system": "You are a careful coding agent."}
        v = versions(step)
        cp["channel_versions"] = {"messages": v, "step": v, "system": versions(0)}
        cp["versions_seen"] = {"agent": {"messages": v}}
        yield cp, {"source": "loop", "step": step, "parents": {}}, {"messages": v, "step": v}


def versions_for(saver):
    cache = {}

    def versions(step: int):
        if step not in cache:
            cur = None
            for _ in range(step + 1):
                cur = saver.get_next_version(cur, None)
            cache[step] = cur
        return cache[step]

    return versions


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def compacted_bytes(directory: Path) -> int:
    """The bytes after giving free space back: `annal.compact`, or SQLite's VACUUM."""
    for p in directory.iterdir():
        if p.name.endswith(".redb"):
            annal.compact(p)
        elif p.name.endswith(".sqlite"):
            conn = sqlite3.connect(str(p))
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
    return disk_bytes(directory)


def run_sync(make, directory: Path, writers: int, threads: int, steps: int, reads: int) -> dict:
    saver = make(directory)
    versions = versions_for(saver)
    plan = [(t, list(checkpoints(t, steps, versions))) for t in range(threads)]
    configs: list = [None] * threads

    def writer(w: int) -> None:
        for t, cps in plan[w::writers]:
            config = {"configurable": {"thread_id": f"thread-{t}", "checkpoint_ns": ""}}
            for cp, md, nv in cps:
                config = saver.put(config, cp, md, nv)
            configs[t] = config

    start = time.perf_counter()
    pool = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    put_s = time.perf_counter() - start

    def reader(w: int) -> None:
        rng = random.Random(w)
        for _ in range(reads // writers):
            t = rng.randrange(threads)
            got = saver.get_tuple({"configurable": {"thread_id": f"thread-{t}", "checkpoint_ns": ""}})
            assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == steps

    start = time.perf_counter()
    pool = [threading.Thread(target=reader, args=(w,)) for w in range(writers)]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    get_s = time.perf_counter() - start
    close(saver)
    return {
        "puts": threads * steps / put_s,
        "gets": (reads // writers) * writers / get_s,
        "bytes": disk_bytes(directory),
        "compacted": compacted_bytes(directory),
    }


async def run_async(amake, directory: Path, writers: int, threads: int, steps: int, reads: int) -> dict:
    async with amake(directory) as saver:
        versions = versions_for(saver)
        plan = [(t, list(checkpoints(t, steps, versions))) for t in range(threads)]

        async def writer(w: int) -> None:
            for t, cps in plan[w::writers]:
                config = {"configurable": {"thread_id": f"thread-{t}", "checkpoint_ns": ""}}
                for cp, md, nv in cps:
                    config = await saver.aput(config, cp, md, nv)

        start = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(writers)))
        put_s = time.perf_counter() - start

        async def reader(w: int) -> None:
            rng = random.Random(w)
            for _ in range(reads // writers):
                t = rng.randrange(threads)
                got = await saver.aget_tuple({"configurable": {"thread_id": f"thread-{t}", "checkpoint_ns": ""}})
                assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == steps

        start = time.perf_counter()
        await asyncio.gather(*(reader(w) for w in range(writers)))
        get_s = time.perf_counter() - start
    return {
        "puts": threads * steps / put_s,
        "gets": (reads // writers) * writers / get_s,
        "bytes": disk_bytes(directory),
        "compacted": compacted_bytes(directory),
    }


def close(saver) -> None:
    if isinstance(saver, AnnalSaver):
        saver.close()
    else:
        saver.conn.close()


def make_sqlite(directory: Path) -> SqliteSaver:
    conn = sqlite3.connect(str(directory / "checkpoints.sqlite"), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    return saver


def make_annal(directory: Path) -> AnnalSaver:
    return AnnalSaver.open(str(directory / "checkpoints.redb"))


class _AnnalCtx:
    def __init__(self, directory: Path) -> None:
        self.saver = make_annal(directory)

    async def __aenter__(self) -> AnnalSaver:
        return self.saver

    async def __aexit__(self, *exc) -> None:
        self.saver.close()


def amake_sqlite(directory: Path):
    return AsyncSqliteSaver.from_conn_string(str(directory / "checkpoints.sqlite"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=200)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reads", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the databases go (a temporary folder by default)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="annal-bench-"))
    savers = (
        ("SqliteSaver", "threads", make_sqlite),
        ("AnnalSaver", "threads", make_annal),
        ("AsyncSqliteSaver", "tasks", amake_sqlite),
        ("AnnalSaver (async)", "tasks", _AnnalCtx),
    )
    runs: dict[tuple[str, int], list[dict]] = {}
    # Rounds alternate the savers, so that a drift of the shared machine (the disk's
    # fsync latency above all) reaches each of them alike; the medians are reported.
    for round_ in range(args.rounds):
        for writers in (1, 16):
            for name, kind, make in savers:
                directory = root / f"{name.replace(' ', '_')}-{writers}"
                shutil.rmtree(directory, ignore_errors=True)
                directory.mkdir(parents=True)
                if kind == "threads":
                    r = run_sync(make, directory, writers, args.threads, args.steps, args.reads)
                else:
                    r = asyncio.run(run_async(make, directory, writers, args.threads, args.steps, args.reads))
                shutil.rmtree(directory, ignore_errors=True)
                runs.setdefault((name, writers), []).append(r)
                print(f"round {round_ + 1} {name:20} {writers:2} {kind:7}: {r['puts']:9.0f} puts/s "
                      f"{r['gets']:9.0f} get_tuple/s {r['bytes'] / 1e6:8.1f} MB "
                      f"({r['compacted'] / 1e6:.1f} MB compacted)", flush=True)
    rows = []
    for writers in (1, 16):
        for name, _, _ in savers:
            rs = runs[(name, writers)]
            rows.append((name, writers, {k: statistics.median(r[k] for r in rs) for k in rs[0]}))
    n = args.threads * args.steps
    print()
    print(f"{n} checkpoints ({args.threads} threads x {args.steps} steps), {args.reads} get_tuple calls, "
          f"medians of {args.rounds} rounds, on {os.cpu_count()} cores")
    print()
    print("| saver | writers | puts/s | get_tuple/s | bytes on disk | after compaction |")
    print("|---|---|---|---|---|---|")
    for name, writers, r in rows:
        print(f"| {name} | {writers} | {r['puts']:,.0f} | {r['gets']:,.0f} | {r['bytes']:,} | {r['compacted']:,} |")
    print()
    by = {(name, w): r for name, w, r in rows}
    print("| comparison | writers | puts | get_tuple | bytes on disk | after compaction |")
    print("|---|---|---|---|---|---|")
    for annal_name, base in (("AnnalSaver", "SqliteSaver"), ("AnnalSaver (async)", "AsyncSqliteSaver")):
        for w in (1, 16):
            a, b = by[(annal_name, w)], by[(base, w)]
            print(f"| {annal_name} / {base} | {w} | {a['puts'] / b['puts']:.2f}x | {a['gets'] / b['gets']:.2f}x | "
                  f"{a['bytes'] / b['bytes']:.3f} | {a['compacted'] / b['compacted']:.3f} |")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
