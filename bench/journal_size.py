"""Big journals: listing pending intents, showing one, opening, size, pruning at 10k to 1M.

Each journal is built fast, straight through the schema (a SQLiteJournal creates and
migrates it, then executemany inserts one intent and one attempt per row), with intents
created over the last 90 days: 0.5% pending, 0.1% unknown, 0.4% abandoned, the rest
succeeded or failed, 98% of those acknowledged. Then, per size:

    list     journal.list_intents(states=[pending], limit=50): the query behind
             `payonce intents list --state pending --limit 50` (median of 7), its plan,
             and the whole command run in-process (CliRunner: no interpreter start-up);
             and with two common states, --state succeeded --state failed (median of 7)
    show     journal.find(reference) for one intent in the middle of the journal: the look-up
             behind `payonce intents show <reference>` (median of 7), its plan, and the whole
             command in-process (it also reads the intent's attempts and reconciliations)
    open     opening the journal with PRAGMA quick_check (the default) and without
    prune    `prune --older-than 30d` in batches of 1000: intents deleted per second,
             while another connection keeps claiming intents: its slowest claim shows
             how long a writer waited for a batch

    PYTHONPATH=src .venv/bin/python bench/journal_size.py
    PYTHONPATH=src .venv/bin/python bench/journal_size.py --sizes 10000 100000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from _harness import ACCOUNT, PATH, console, draft, header, table, workdir
from click.testing import CliRunner

from payonce import IntentState
from payonce._journal import _sql as sql
from payonce._journal._open import store_of
from payonce._journal._sqlite import SQLiteJournal
from payonce.cli import cli

DAY = 86400.0
TARGET_MS = 50.0
SHOW_TARGET_MS = 5.0
_CHUNK = 20_000

REQUEST_HEADERS = json.dumps([["content-type", "application/json"]])
RESPONSE_HEADERS = json.dumps([["content-type", "application/json"], ["request-id", "req_x"]])
RESPONSE_BODY = json.dumps(
    {"id": "pay_0123456789", "amount": 4200, "currency": "eur", "status": "succeeded"}
).encode()


def state_of(number: int) -> str:
    slot = number % 1000
    if slot < 5:
        return IntentState.PENDING.value
    if slot < 6:
        return IntentState.UNKNOWN.value
    if slot < 10:
        return IntentState.ABANDONED.value
    if slot < 100:
        return IntentState.FAILED.value
    return IntentState.SUCCEEDED.value


def build(path: Path, size: int, now: float) -> float:
    """A journal of ``size`` intents at ``path``; the seconds it took."""
    began = time.perf_counter()
    SQLiteJournal(path).close()  # the schema, through payonce's own migrations
    template = draft(0)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA synchronous = OFF")
        db.execute("BEGIN")
        for start in range(0, size, _CHUNK):
            intents, attempts = [], []
            for number in range(start, min(size, start + _CHUNK)):
                state = state_of(number)
                created = now - 90 * DAY * (size - number) / size
                settled = state in (IntentState.SUCCEEDED.value, IntentState.FAILED.value)
                key = f"big-key-{number:08d}"
                intents.append(
                    (
                        key,
                        template.scope,
                        f"big-{number:08d}",
                        ACCOUNT,
                        "sandbox",
                        "POST",
                        template.url,
                        template.fingerprint,
                        REQUEST_HEADERS,
                        template.body,
                        state,
                        created,
                        created + 1.0,
                        created,
                        None,
                        None,
                        "timed out" if state == IntentState.UNKNOWN.value else None,
                        201 if settled else None,
                        RESPONSE_HEADERS if settled else None,
                        RESPONSE_BODY if settled else None,
                        1 if settled else None,
                        "0.1.0" if settled else None,
                        4 if settled else None,
                        created + 2.0 if settled and number % 50 else None,
                        "checked by hand" if state == IntentState.ABANDONED.value else None,
                    )
                )
                ended = None if state == IntentState.PENDING.value else created + 0.5
                attempts.append((key, 1, created, ended, 201 if settled else None, None, 0))
            columns = ", ".join(sql.needed_columns()["intents"])
            marks = ", ".join("?" for _ in sql.needed_columns()["intents"])
            db.executemany(f"INSERT INTO intents ({columns}) VALUES ({marks})", intents)
            db.executemany(
                "INSERT INTO attempts (key, number, started_at, ended_at, status_code, error,"
                " ambiguous) VALUES (?, ?, ?, ?, ?, ?, ?)",
                attempts,
            )
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return time.perf_counter() - began


def file_size(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def timed(function: object, repeat: int = 7) -> float:
    """Median seconds of ``function()`` over ``repeat`` runs."""
    assert callable(function)
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def plan_of(journal: SQLiteJournal, statement: str, params: tuple[object, ...]) -> str:
    explain = statement.replace("SELECT", "EXPLAIN QUERY PLAN SELECT", 1)
    steps = journal._engine.conn.execute(explain, params).fetchall()
    return "; ".join(str(step[3]) for step in steps)


def query_plan(journal: SQLiteJournal) -> str:
    statement = sql.LIST + " WHERE state IN (?) ORDER BY created_at DESC, key DESC LIMIT ?"
    return plan_of(journal, statement, ("pending", 50))


@contextlib.contextmanager
def writer_alongside(path: Path) -> Iterator[list[float]]:
    """Another connection claiming new intents the whole time: its claim latencies."""
    latencies: list[float] = []
    stop = threading.Event()

    def claim() -> None:
        with SQLiteJournal(path, check_integrity=False) as other:
            store = store_of(other)
            number = 0
            while not stop.is_set():
                began = time.perf_counter()
                store.claim(draft(number, tag="w"), owner="w", now=time.time(), lease_seconds=60)
                latencies.append(time.perf_counter() - began)
                number += 1
                time.sleep(0.002)

    thread = threading.Thread(target=claim)
    thread.start()
    try:
        yield latencies
    finally:
        stop.set()
        thread.join()


def measure(directory: Path, size: int) -> dict[str, object]:
    path = directory / f"journal-{size}.db"
    now = time.time()
    built = build(path, size, now)
    result: dict[str, object] = {"size": size, "built": built, "bytes": file_size(path)}

    with_check = timed(lambda: SQLiteJournal(path).close(), repeat=3)
    without_check = timed(lambda: SQLiteJournal(path, check_integrity=False).close(), repeat=3)
    result["open_check"], result["open_no_check"] = with_check, without_check

    with SQLiteJournal(path, check_integrity=False) as journal:
        pending = [IntentState.PENDING]
        rows = journal.list_intents(states=pending, limit=50)
        assert len(rows) == min(50, size // 200), len(rows)
        result["query"] = timed(lambda: journal.list_intents(states=pending, limit=50))
        result["plan"] = query_plan(journal)
        common = [IntentState.SUCCEEDED, IntentState.FAILED]
        result["two_states"] = timed(lambda: journal.list_intents(states=common, limit=50))
        result["dry_run"] = timed(
            lambda: journal.prune(older_than=now - 30 * DAY, dry_run=True), repeat=1
        )

        reference = f"big-{size // 2:08d}"
        found = journal.find(reference)
        assert [r.reference for r in found] == [reference], found
        result["show"] = timed(lambda: journal.find(reference))
        result["show_plan"] = plan_of(journal, sql.FIND, (reference, reference))

    runner = CliRunner()
    listing = ["intents", "list", "--state", "pending", "--limit", "50", "--journal", str(path)]
    showing = ["intents", "show", reference, "--journal", str(path)]

    def run_cli(command: list[str]) -> None:
        outcome = runner.invoke(cli, [*command, "--json"])
        assert outcome.exit_code == 0, outcome.output

    result["cli"] = timed(lambda: run_cli(listing), repeat=3)
    result["show_cli"] = timed(lambda: run_cli(showing))

    with SQLiteJournal(path, check_integrity=False) as journal, writer_alongside(path) as waits:
        began = time.perf_counter()
        pruned = journal.prune(older_than=now - 30 * DAY, batch_size=1000)
        seconds = time.perf_counter() - began
    result["pruned"], result["prune_seconds"] = pruned, seconds
    result["writer_claims"] = len(waits)
    result["writer_max"] = max(waits) if waits else float("nan")
    result["writer_p50"] = statistics.median(waits) if waits else float("nan")
    result["bytes_after"] = file_size(path)
    path.unlink()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--dir", help="where the journal files go (default: a temp dir)")
    args = parser.parse_args()

    header("journal size: listing, opening and pruning big SQLite journals")
    results = []
    with workdir(args.dir) as directory:
        for size in args.sizes:
            console.print(f"building and measuring {size:,} intents…")
            results.append(measure(directory, size))

    ms = 1000.0
    table(
        "list --state pending --limit 50, show <reference>, opening, size",
        [
            "intents",
            "list query ms",
            "list CLI in-process ms",
            "list succeeded + failed ms",
            "show query ms",
            "show CLI in-process ms",
            "open + quick_check ms",
            "open, no check ms",
            "file MB",
            "built in s",
        ],
        [
            [
                f"{r['size']:,}",
                f"{float(r['query']) * ms:.2f}",  # type: ignore[arg-type]
                f"{float(r['cli']) * ms:.0f}",  # type: ignore[arg-type]
                f"{float(r['two_states']) * ms:.2f}",  # type: ignore[arg-type]
                f"{float(r['show']) * ms:.3f}",  # type: ignore[arg-type]
                f"{float(r['show_cli']) * ms:.1f}",  # type: ignore[arg-type]
                f"{float(r['open_check']) * ms:.0f}",  # type: ignore[arg-type]
                f"{float(r['open_no_check']) * ms:.0f}",  # type: ignore[arg-type]
                f"{int(r['bytes']) / 1e6:.1f}",  # type: ignore[call-overload]
                f"{float(r['built']):.1f}",  # type: ignore[arg-type]
            ]
            for r in results
        ],
    )
    table(
        "prune --older-than 30d, batches of 1000, one writer claiming alongside",
        [
            "intents",
            "pruned",
            "intents/s",
            "dry run ms",
            "writer claims",
            "writer p50 ms",
            "writer max ms",
            "file MB after",
        ],
        [
            [
                f"{r['size']:,}",
                f"{r['pruned']:,}",
                f"{int(r['pruned']) / float(r['prune_seconds']):,.0f}",  # type: ignore[call-overload, arg-type]
                f"{float(r['dry_run']) * ms:.0f}",  # type: ignore[arg-type]
                f"{r['writer_claims']}",
                f"{float(r['writer_p50']) * ms:.1f}",  # type: ignore[arg-type]
                f"{float(r['writer_max']) * ms:.0f}",  # type: ignore[arg-type]
                f"{int(r['bytes_after']) / 1e6:.1f}",  # type: ignore[call-overload]
            ]
            for r in results
        ],
    )
    for r in results:
        console.print(f"list plan at {r['size']:,}: {r['plan']}")
        console.print(f"show plan at {r['size']:,}: {r['show_plan']}")
    largest = results[-1]
    for what, figure, target in (
        ("list --state pending", "query", TARGET_MS),
        ("show <reference>", "show", SHOW_TARGET_MS),
    ):
        query_ms = float(largest[figure]) * ms  # type: ignore[arg-type]
        verdict = "met" if query_ms < target else f"MISSED by {query_ms / target:.2f}x"
        print(
            f"target: {what} < {target:g} ms at {largest['size']:,} intents: "
            f"{query_ms:.3f} ms, {verdict}"
        )
    _ = PATH


if __name__ == "__main__":
    main()
