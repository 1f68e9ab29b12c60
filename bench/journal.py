"""The SQLite journal alone: durable intents per second at 1, 16 and 64 calling threads.

One intent is the journal traffic payonce.Client makes for one payment, without the HTTP
call: ``claim`` (the write-ahead record, committed with synchronous=FULL: fsynced before it
returns), ``settle`` (synchronous=NORMAL) and ``acknowledge`` (NORMAL). Arrangements:

    per-thread   one SQLiteJournal (one connection) per thread, each write its own commit
    inline       one SQLiteJournal shared by every thread, each write its own commit
    group        one SQLiteJournal shared by every thread, group commit (the default):
                 the writes queued at an instant commit together, each in a savepoint

Each cell runs ``--seconds`` and the arrangements alternate by round (order rotating), so
noise on this shared machine hits them alike; the table shows the median of ``--rounds``.
The filesystem's fsync rate is measured in the same run: it bounds ``inline`` from above.

    PYTHONPATH=src .venv/bin/python bench/journal.py
    PYTHONPATH=src .venv/bin/python bench/journal.py --quick
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from pathlib import Path
from typing import NamedTuple

from _harness import (
    RESPONSE,
    draft,
    fsync_rate,
    header,
    median,
    rate,
    ratio,
    table,
    workdir,
)

from payonce._journal._open import store_of
from payonce._journal._sqlite import SQLiteJournal
from payonce._journal._store import IntentStore
from payonce._lifecycle import ClaimKind, Transition

TARGET = 5.0
"""Group commit over inline at the most callers: issue 10's row (issue 4 asked 8x)."""
ARRANGEMENTS = ("per-thread", "inline", "group")


WRITES: tuple[str, ...] = ("claim", "settle")


def one_intent(
    journal: SQLiteJournal, store: IntentStore, number: int, tag: str, owner: str
) -> None:
    claim = store.claim(draft(number, tag=tag), owner=owner, now=time.time(), lease_seconds=60)
    if claim.kind is not ClaimKind.CREATED:
        raise RuntimeError(f"intent {number} was not created: {claim.kind}")
    key = claim.record.key
    if "settle" in WRITES:
        store.settle(
            key,
            owner=owner,
            now=time.time(),
            transition=Transition.SUCCEEDED,
            response=RESPONSE,
            attempt=1,
        )
    if "acknowledge" in WRITES:
        journal.acknowledge(key, now=time.time())


class Cell(NamedTuple):
    per_second: float
    writes_per_commit: float
    cpu_per_intent: float
    """Seconds of CPU (every thread, SQLite's too) per intent."""


def measure(directory: Path, arrangement: str, callers: int, seconds: float, tag: str) -> Cell:
    """Intents per second, writes per commit and CPU per intent, over ``seconds``."""
    path = directory / f"{tag}.db"
    shared = SQLiteJournal(path, group_commit=arrangement == "group")
    journals = [shared]
    if arrangement == "per-thread":
        journals += [SQLiteJournal(path, group_commit=False) for _ in range(callers - 1)]
    stores = [store_of(journal) for journal in journals]  # one per journal, as a client has
    counts = [0] * callers
    stop = threading.Event()
    start = threading.Barrier(callers + 1)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        journal = journals[index % len(journals)]
        store = stores[index % len(journals)]
        owner = f"w{index}"
        start.wait()
        numbers = itertools.count(index * 10_000_000)
        try:
            while not stop.is_set():
                one_intent(journal, store, next(numbers), tag, owner)
                counts[index] += 1
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    commits_before = _commits(shared)
    start.wait()
    began, cpu_began = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    commits = _commits(shared) - commits_before
    for journal in journals:
        journal.close()
    if errors:
        raise errors[0]
    total = sum(counts)
    return Cell(
        total / elapsed, len(WRITES) * total / commits if commits else float("nan"), cpu / total
    )


def _commits(journal: SQLiteJournal) -> int:
    return journal._engine.commits  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where the journal files go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="one 1-second round")
    parser.add_argument("--arrangements", nargs="+", default=list(ARRANGEMENTS))
    parser.add_argument(
        "--writes",
        choices=["claim", "claim+settle", "claim+settle+ack"],
        default="claim+settle",
        help="the journal writes of one intent (default: the write-ahead and settle records; "
        "+ack: also the acknowledgement Client makes on leaving the block)",
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 1.0, 1
    global WRITES
    WRITES = tuple(args.writes.replace("ack", "acknowledge").split("+"))

    header(f"journal alone: durable intents/s ({' + '.join(WRITES)}; claim fsynced)")
    cells: dict[tuple[str, int], list[Cell]] = {}
    with workdir(args.dir) as directory:
        fsyncs = fsync_rate(directory)
        order = list(args.arrangements)
        for round_ in range(args.rounds):
            for callers in args.callers:
                for arrangement in order:
                    tag = f"{arrangement}-{callers}-{round_}"
                    cell = measure(directory, arrangement, callers, args.seconds, tag)
                    cells.setdefault((arrangement, callers), []).append(cell)
                order = order[1:] + order[:1]
        fsyncs_after = fsync_rate(directory)

    def typical(arrangement: str, callers: int, field: str) -> float:
        return median([getattr(c, field) for c in cells.get((arrangement, callers), [])])

    rows = []
    for callers in args.callers:
        row = [str(callers)]
        row += [rate(typical(a, callers, "per_second")) for a in args.arrangements]
        gain = typical("group", callers, "per_second") / typical("inline", callers, "per_second")
        row += [
            ratio(gain),
            f"{typical('group', callers, 'writes_per_commit'):.1f}",
            f"{typical('inline', callers, 'cpu_per_intent') * 1e6:.0f}",
            f"{typical('group', callers, 'cpu_per_intent') * 1e6:.0f}",
        ]
        rows.append(row)
    table(
        f"intents/s, median of {args.rounds} round(s) of {args.seconds:g}s "
        f"(fsync rate of this disk: {fsyncs:,.0f}/s before, {fsyncs_after:,.0f}/s after)",
        [
            "callers",
            *args.arrangements,
            "group / inline",
            "writes/commit",
            "CPU µs/intent inline",
            "CPU µs/intent group",
        ],
        rows,
    )
    last = args.callers[-1]
    achieved = typical("group", last, "per_second") / typical("inline", last, "per_second")
    verdict = "met" if achieved >= TARGET else f"MISSED by {TARGET / achieved:.2f}x"
    print(f"target: group >= {TARGET:g}x inline at {last} callers: {achieved:.2f}x, {verdict}")
    inline_cpu = typical("inline", last, "cpu_per_intent")
    group_cpu = typical("group", last, "cpu_per_intent")
    fsync_floor = min(fsyncs, fsyncs_after)
    inline_bound = min(fsync_floor, 1 / inline_cpu)
    ceiling = (1 / group_cpu) / typical("inline", last, "per_second")
    print(
        f"bounds at {last} callers: inline <= min(fsync rate {fsync_floor:,.0f}/s, 1 / its "
        f"CPU per intent {1 / inline_cpu:,.0f}/s) = {inline_bound:,.0f}/s; group <= 1 / its "
        f"CPU per intent = {1 / group_cpu:,.0f}/s (the GIL runs the Python side of every "
        f"caller on one core), so group / inline <= {ceiling:.1f}x here: sharing fsyncs is "
        f"worth {TARGET:g}x only where one fsync costs about {TARGET:g}x an intent's CPU"
    )


if __name__ == "__main__":
    main()
