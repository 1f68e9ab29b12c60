"""The CPU one PostgreSQL journal write costs the client, by path: in the caller's thread
(``Client``), handed from an event loop to a journal thread (``AsyncClient`` before its
writes ran on the loop) and on the event loop (``AsyncClient`` on PostgreSQL, the engine's
async edge), with and without the task that keeps a cancelled caller's write going.

Each path runs the same one-statement write (the shape of a write-ahead or a settle: one
statement, its own transaction) ``--writes`` times, one after another, on a warm
connection; CPU is this process's, per write. No sandbox, no httpx: the journal's own cost,
for the question the async edge raises (what it spares the loop in hand-offs, what
psycopg's async waits cost it in CPU).

    PYTHONPATH=src .venv/bin/python bench/pg_write_cpu.py --writes 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from _harness import header, median, postgres_server, table

from payonce._journal._plans import Work, Write, commit_with
from payonce._journal._postgres import PostgresEngine, _AsyncEdge
from payonce._lifecycle import NOTHING_CHANGED
from payonce._runtime._journal_threads import off_loop
from payonce.journal import PostgresJournal

WARM_UP = 50


def _work() -> Work[Any]:
    finished = yield from commit_with("SELECT 1 WHERE ? = 1", (1,), whole=True)
    return finished.rows


WRITE = Write(_work, True, NOTHING_CHANGED)


def thread_path(engine: PostgresEngine, writes: int) -> float:
    for _ in range(WARM_UP):
        engine.write_planned(WRITE)
    started = time.process_time()
    for _ in range(writes):
        engine.write_planned(WRITE)
    return (time.process_time() - started) / writes


def hop_path(engine: PostgresEngine, writes: int) -> float:
    """From a loop, each write handed to a journal thread: AsyncClient before the edge."""

    async def run() -> float:
        for _ in range(WARM_UP):
            await off_loop(engine.write_planned, WRITE)
        started = time.process_time()
        for _ in range(writes):
            await off_loop(engine.write_planned, WRITE)
        return (time.process_time() - started) / writes

    return asyncio.run(run())


def loop_path(engine: PostgresEngine, writes: int, *, shielded: bool) -> float:
    async def run() -> float:
        edge = engine.async_edge()
        assert isinstance(edge, _AsyncEdge)
        write: Callable[[Write[Any]], Any] = edge.write if shielded else edge._write
        for _ in range(WARM_UP):
            await write(WRITE)
        started = time.process_time()
        for _ in range(writes):
            await write(WRITE)
        spent = (time.process_time() - started) / writes
        await edge.aclose()
        return spent

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    header("One PostgreSQL journal write: CPU by path")
    paths: dict[str, Callable[[PostgresEngine], float]] = {
        "the caller's thread (Client)": lambda e: thread_path(e, args.writes),
        "a journal thread (AsyncClient before)": lambda e: hop_path(e, args.writes),
        "event loop (AsyncClient)": lambda e: loop_path(e, args.writes, shielded=True),
        "event loop, no cancel shield": lambda e: loop_path(e, args.writes, shielded=False),
    }
    spent: dict[str, list[float]] = {name: [] for name in paths}
    with postgres_server() as server:
        journal = PostgresJournal(server.url(server.create_database()))
        engine = journal._engine
        assert isinstance(engine, PostgresEngine)
        for _ in range(args.rounds):
            for name, path in paths.items():
                spent[name].append(path(engine))
        journal.close()
    table(
        f"CPU per write, median of {args.rounds} round(s) of {args.writes} writes",
        ["path", "µs of CPU per write"],
        [[name, f"{median(values) * 1e6:.0f}"] for name, values in spent.items()],
    )


if __name__ == "__main__":
    main()
