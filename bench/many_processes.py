"""Many processes on one PostgreSQL journal: P processes x C concurrent async callers.

What a service on several hosts does: every process has its own ``payonce.AsyncClient``
on one shared PostgreSQL journal (``postgresql://``, TCP to a local server the script
starts, ``fsync=on``), and C tasks in it pay one new intent after another, each under a
reference of its own, for ``--seconds``. Beside each PostgreSQL cell, the same P x C on
SQLite with a journal file per process (what each host would have alone). Cells:
P = 1, 2, 4 processes x C = 1, 16, 64 callers x the two journals, interleaved, the order
of the journals alternating by round; the median over rounds is reported.

Reported per cell: intents/s (all processes together over the wall clock of the cell),
p50 and p99 latency of one intent (``time.perf_counter`` around ``client.post``), and
where the CPU went, in ms per intent: the client processes, the sandbox provider, the
PostgreSQL server (the postmaster and every backend, from /proc), and what the whole
machine was busy with (other users' processes included). From those: what bounds each
cell, and intents/s per PostgreSQL core (1 / its CPU per intent).

The sandbox runs as a process of its own (``python -m payonce.sandbox``): one Python
process, so at most one core, and on this machine it shares the cores with the clients
and the database. Before any figure is printed, each cell is checked against the
provider's own count (``/_sandbox/executions``): every intent executed exactly once, none
twice, none replayed; a mismatch stops the run without a figure.

The worker processes are started once (multiprocessing, spawn) and reused; each cell
opens fresh clients in them (new pools, new SQLite files) and warms them up before the
clock starts.

    PYTHONPATH=src .venv/bin/python bench/many_processes.py --quick   # ~1 min
    PYTHONPATH=src .venv/bin/python bench/many_processes.py           # ~3-4 min
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
from _harness import (
    PATH,
    PAYMENT,
    SANDBOX_PIDS,
    console,
    cpu_seconds,
    header,
    machine_busy_seconds,
    median,
    percentile,
    postgres_server,
    process_tree_cpu_seconds,
    rate,
    sandbox_process,
    table,
    workdir,
)

import payonce

KINDS = ("postgresql", "sqlite")
SATURATED = 0.85
"""A process busier than this share of one core is taken as saturated."""


# -- a worker process --------------------------------------------------------------------------


def worker_main(conn: Connection, url: str) -> None:
    """Serve cells until told to stop (``None``): one ``AsyncClient`` per cell."""
    while True:
        order = conn.recv()
        if order is None:
            return
        try:
            asyncio.run(_cell(conn, url, order))
        except BaseException as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            if not isinstance(exc, Exception):
                raise


async def _cell(conn: Connection, url: str, order: dict[str, Any]) -> None:
    from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY

    concurrency: int = order["concurrency"]
    tag: str = order["tag"]
    keys: list[str] = []
    numbers = itertools.count()
    async with payonce.AsyncClient(
        base_url=url,
        provider="sandbox",
        account=DEFAULT_ACCOUNT,
        api_key=DEFAULT_API_KEY,
        journal=order["journal"],
    ) as client:

        async def pay() -> None:
            reference = f"{tag}-{next(numbers)}"
            response = await client.post(PATH, json=PAYMENT, reference=reference)
            if response.status_code != 201:
                raise RuntimeError(f"{reference}: HTTP {response.status_code} {response.text}")
            info = payonce.response_info(response)
            if info is None or info.replayed:
                raise RuntimeError(
                    f"{reference} was replayed from the journal: the bench is broken"
                )
            keys.append(info.key)

        # Warm up: the pools (HTTP and journal) grow to what C callers use.
        warm = iter(range(order["warm"]))

        async def warming() -> None:
            for _ in warm:
                await pay()

        await asyncio.gather(*(warming() for _ in range(concurrency)))
        conn.send(("ready", None))

        start, stop = await asyncio.to_thread(conn.recv)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        latencies: list[float] = []
        clock = time.perf_counter
        cpu = time.process_time()

        async def caller() -> None:
            while time.monotonic() < stop:
                began = clock()
                await pay()
                latencies.append(clock() - began)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        ended = time.monotonic()
        conn.send(
            (
                "done",
                {
                    "latencies": latencies,
                    "keys": keys,
                    "ended": ended,
                    "cpu": time.process_time() - cpu,
                },
            )
        )
        # The connections stay open until the parent has read the server's CPU.
        await asyncio.to_thread(conn.recv)
    conn.send(("closed", None))


class Workers:
    """``count`` spawned worker processes, reused from cell to cell."""

    def __init__(self, count: int, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.processes: list[Any] = []
        for _ in range(count):
            parent, child = context.Pipe()
            process = context.Process(target=worker_main, args=(child, url), daemon=True)
            process.start()
            child.close()
            self.pipes.append(parent)
            self.processes.append(process)

    @staticmethod
    def expect(pipe: Connection, kind: str) -> Any:
        if not pipe.poll(300):
            raise RuntimeError(f"a worker sent nothing for 5 minutes (waiting for {kind!r})")
        got, payload = pipe.recv()
        if got != kind:
            raise RuntimeError(f"a worker failed: {payload}" if got == "error" else got)
        return payload

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


# -- one cell, measured in the parent ----------------------------------------------------------


@dataclass
class Cell:
    rate: float
    p50: float
    p99: float
    intents: int
    client_ms: float
    """CPU ms per intent, all client processes together."""
    sandbox_ms: float
    postgres_ms: float
    machine_ms: float
    """CPU ms per intent the whole machine was busy (others' processes too)."""
    sandbox_cores: float
    postgres_cores: float
    machine_cores: float
    load: float
    server: dict[str, float] = field(default_factory=dict)
    """PostgreSQL's own counters per intent (warm-ups included): commits, WAL."""
    keys: list[str] = field(repr=False, default_factory=list)


@dataclass
class Setup:
    sandbox: str
    postgres_url: str | None
    postmaster: int | None
    admin: Any
    """A superuser connection to the journal's database (``None`` without PostgreSQL)."""
    directory: Path
    seconds: float
    warm: int


def _postgres_cpu(setup: Setup) -> float:
    return process_tree_cpu_seconds(setup.postmaster) if setup.postmaster else 0.0


SERVER_COUNTERS = (
    "SELECT d.xact_commit, d.tup_inserted, d.tup_updated, w.wal_records, w.wal_bytes,"
    " w.wal_sync FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()"
)
SERVER_NAMES = ("commits", "rows inserted", "rows updated", "WAL records", "WAL bytes", "WAL syncs")


def _server_counters(setup: Setup) -> tuple[float, ...]:
    """The server's cumulative counters for the journal's database and its WAL."""
    if setup.admin is None:
        return (0.0,) * len(SERVER_NAMES)
    row = setup.admin.execute(SERVER_COUNTERS).fetchone()
    return tuple(float(value) for value in row)


def run_cell(
    workers: Workers, setup: Setup, kind: str, processes: int, callers: int, tag: str
) -> Cell:
    pipes = workers.pipes[:processes]
    counters = _server_counters(setup) if kind == "postgresql" else ()
    for index, pipe in enumerate(pipes):
        journal = (
            setup.postgres_url
            if kind == "postgresql"
            else str(setup.directory / f"{tag}-w{index}.db")
        )
        pipe.send(
            {
                "journal": journal,
                "concurrency": callers,
                "tag": f"{tag}-w{index}",
                "warm": max(setup.warm, 2 * callers),
            }
        )
    for pipe in pipes:
        workers.expect(pipe, "ready")
    start = time.monotonic() + 0.05
    stop = start + setup.seconds
    for pipe in pipes:
        pipe.send((start, stop))
    time.sleep(max(0.0, start - time.monotonic()))
    sandbox_pid = SANDBOX_PIDS[setup.sandbox]
    before = (time.monotonic(), cpu_seconds(sandbox_pid), _postgres_cpu(setup))
    machine_before = machine_busy_seconds()
    results = [workers.expect(pipe, "done") for pipe in pipes]
    after = (time.monotonic(), cpu_seconds(sandbox_pid), _postgres_cpu(setup))
    machine_after = machine_busy_seconds()
    load = os.getloadavg()[0]
    for pipe in pipes:
        pipe.send("close")
    for pipe in pipes:
        workers.expect(pipe, "closed")
    server: dict[str, float] = {}
    keys = [key for r in results for key in r["keys"]]
    if counters:
        # Backends report their counters as they exit: give the closed ones a moment.
        time.sleep(0.3)
        now = _server_counters(setup)
        server = {
            name: (b - a) / len(keys)
            for name, a, b in zip(SERVER_NAMES, counters, now, strict=True)
        }

    latencies = sorted(itertools.chain.from_iterable(r["latencies"] for r in results))
    if not latencies:
        raise RuntimeError(f"{tag}: no intent finished in {setup.seconds} s")
    intents = len(latencies)
    wall = max(r["ended"] for r in results) - start
    window = after[0] - before[0]
    sandbox, postgres = after[1] - before[1], after[2] - before[2]
    machine = machine_after - machine_before
    return Cell(
        rate=intents / wall,
        p50=percentile(latencies, 0.50),
        p99=percentile(latencies, 0.99),
        intents=intents,
        client_ms=sum(r["cpu"] for r in results) / intents * 1e3,
        sandbox_ms=sandbox / intents * 1e3,
        postgres_ms=postgres / intents * 1e3 if kind == "postgresql" else 0.0,
        machine_ms=machine / intents * 1e3,
        sandbox_cores=sandbox / window,
        postgres_cores=postgres / window,
        machine_cores=machine / window,
        load=load,
        server=server,
        keys=keys,
    )


# -- the provider's count ----------------------------------------------------------------------


class Executions:
    """What the sandbox executed, by idempotency key: every key of ours exactly once."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen = 0
        self.keys: set[str] = set()

    def check(self, cell: Cell, what: str) -> None:
        response = httpx.get(f"{self.url}/_sandbox/executions", timeout=60.0)
        response.raise_for_status()
        answer = response.json()
        executions: dict[str, int] = answer["executions"]
        total = int(answer["total"])
        keys = set(cell.keys)
        problems = []
        if len(keys) != len(cell.keys):
            problems.append(f"{len(cell.keys) - len(keys)} keys answered twice")
        if keys & self.keys:
            problems.append(f"{len(keys & self.keys)} keys of earlier cells answered again")
        if total - self.seen != len(cell.keys):
            problems.append(
                f"the provider executed {total - self.seen:,} payments for {len(cell.keys):,} "
                "intents"
            )
        twice = {key: count for key, count in executions.items() if count != 1}
        if twice:
            problems.append(f"{len(twice)} keys executed more than once: {list(twice)[:5]}")
        missing = [key for key in keys if key not in executions]
        if missing:
            problems.append(f"{len(missing)} intents answered but never executed: {missing[:5]}")
        if problems:
            console.print(f"[bold red]{what}: NOT EXACTLY ONCE[/bold red]: " + "; ".join(problems))
            raise SystemExit("stopped: a benchmark that double-charges prints no figure")
        self.seen = total
        self.keys |= keys


# -- the run -----------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres(enabled: bool) -> Iterator[tuple[str | None, int | None, Any]]:
    """The journal's URL, the postmaster's pid and a superuser connection to the database."""
    if not enabled:
        yield None, None, None
        return
    with postgres_server() as server:
        database = server.create_database()
        postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
        with server.admin(database) as admin:
            yield server.url(database), postmaster, admin


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured, per cell")
    parser.add_argument("--rounds", type=int, default=2, help="the median is reported")
    parser.add_argument("--warm", type=int, default=20, help="untimed intents per process")
    parser.add_argument("--journals", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--dir", help="where the SQLite journals go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="one round of 2.5 s per cell")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 2.5, 1
    if min(args.processes) < 1 or min(args.concurrency) < 1 or args.rounds < 1:
        parser.error("--processes, --concurrency and --rounds must be positive")
    return args


def bound(cell: Cell, kind: str) -> str:
    """What stopped this cell going faster, from where its CPU went: the sandbox (its one
    process past 85% of a core), the machine (all its cores past 85%, whoever used them),
    the PostgreSQL server, or else the callers themselves (each waits for its round trips:
    more callers would go faster)."""
    cpus = os.cpu_count() or 1
    if cell.sandbox_cores >= SATURATED:
        return "sandbox"
    if cell.machine_cores >= SATURATED * cpus:
        return f"{cpus} CPUs"
    if kind == "postgresql" and cell.postgres_cores >= SATURATED:
        return "PostgreSQL"
    return "callers"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console.width = max(console.width, 150)  # the table has 14 columns
    header("many processes: P x C async callers on one PostgreSQL journal, SQLite beside it")
    console.print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    results: dict[tuple[str, int, int], list[Cell]] = {}
    with (
        workdir(args.dir) as directory,
        sandbox_process(directory) as url,
        postgres("postgresql" in args.journals) as (pg_url, postmaster, admin),
    ):
        setup = Setup(url, pg_url, postmaster, admin, directory, args.seconds, args.warm)
        executions = Executions(url)
        workers = Workers(max(args.processes), url)
        try:
            for round_ in range(args.rounds):
                kinds = args.journals if round_ % 2 == 0 else args.journals[::-1]
                for processes in args.processes:
                    for callers in args.concurrency:
                        for kind in kinds:
                            tag = f"r{round_}-{kind[:2]}-p{processes}-c{callers}"
                            cell = run_cell(workers, setup, kind, processes, callers, tag)
                            executions.check(cell, tag)
                            results.setdefault((kind, processes, callers), []).append(cell)
                            console.print(
                                f"round {round_ + 1}/{args.rounds} {kind:10} P={processes} "
                                f"C={callers:<3} {rate(cell.rate):>6} intents/s  p99 "
                                f"{cell.p99 * 1e3:6.1f} ms  cores: sandbox "
                                f"{cell.sandbox_cores:.2f} PostgreSQL {cell.postgres_cores:.2f}"
                                f" machine {cell.machine_cores:.2f}  load {cell.load:.2f}"
                                f"  (exactly once: {len(cell.keys):,} intents)"
                            )
        finally:
            workers.close()
        total = executions.seen
    report(args, results, total)
    return 0


LABELS = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}


def report(
    args: argparse.Namespace, results: dict[tuple[str, int, int], list[Cell]], total: int
) -> None:
    def typical(key: tuple[str, int, int], attribute: str) -> float:
        return median([getattr(cell, attribute) for cell in results[key]])

    cpus = os.cpu_count() or 1
    rows = []
    for processes in args.processes:
        for callers in args.concurrency:
            for kind in args.journals:
                key = (kind, processes, callers)
                cells = sorted(results[key], key=lambda cell: cell.rate)
                ours = sum(typical(key, a) for a in ("client_ms", "sandbox_ms", "postgres_ms"))
                rows.append(
                    [
                        LABELS[kind],
                        str(processes),
                        str(callers),
                        rate(typical(key, "rate")),
                        f"{typical(key, 'p50') * 1e3:.1f}",
                        f"{typical(key, 'p99') * 1e3:.1f}",
                        f"{typical(key, 'client_ms'):.2f}",
                        f"{typical(key, 'sandbox_ms'):.2f}",
                        f"{typical(key, 'postgres_ms'):.2f}" if kind == "postgresql" else "-",
                        f"{typical(key, 'machine_ms') - ours:.2f}",
                        rate(cpus / ours * 1e3),
                        f"{typical(key, 'sandbox_cores'):.2f}",
                        f"{typical(key, 'machine_cores'):.2f}",
                        bound(cells[len(cells) // 2], kind),
                    ]
                )
    table(
        f"P processes x C callers; PostgreSQL: one journal for all, SQLite: a file per "
        f"process. Median of {args.rounds} round(s) of {args.seconds:g} s per cell. "
        "CPU ms per intent: "
        "the client processes together, the sandbox, the PostgreSQL server, and everything "
        f"else this machine ran meanwhile (other users'); ceiling = {cpus} cores / (client + "
        "sandbox + PostgreSQL) per intent",
        [
            "journal",
            "P",
            "C",
            "intents/s",
            "p50 ms",
            "p99 ms",
            "client",
            "sandbox",
            "PG",
            "others",
            "ceiling/s",
            "sandbox cores",
            "machine cores",
            "bound",
        ],
        rows,
    )
    if set(KINDS) <= set(args.journals):

        def versus(processes: int, callers: int) -> str:
            shared = typical(("postgresql", processes, callers), "rate")
            alone = typical(("sqlite", processes, callers), "rate")
            return f"{shared / alone:.2f}x"

        table(
            "PostgreSQL / SQLite, intents/s",
            ["P", *(f"C={c}" for c in args.concurrency)],
            [[str(p), *(versus(p, c) for c in args.concurrency)] for p in args.processes],
        )
    if "postgresql" in args.journals:
        cells = [(p, c) for p in args.processes for c in args.concurrency if c > 1] or [
            (p, c) for p in args.processes for c in args.concurrency
        ]
        server = median([typical(("postgresql", p, c), "postgres_ms") for p, c in cells])
        client = median([typical(("postgresql", p, c), "client_ms") for p, c in cells])
        counted = [cell.server for p, c in cells for cell in results[("postgresql", p, c)]]
        console.print(
            "the PostgreSQL server's own counters per intent (median over those cells): "
            + ", ".join(
                f"{name} {median([counts[name] for counts in counted]):,.2f}"
                for name in SERVER_NAMES
            )
        )
        console.print(
            f"per one-shot intent on PostgreSQL (median over the cells with C > 1): the server "
            f"{server:.2f} ms of CPU, about {1e3 / server:,.0f} intents/s per PostgreSQL core; "
            f"the clients {client:.2f} ms, about {1e3 / client:,.0f} intents/s per client core "
            "(this machine)"
        )
    console.print(
        f"the sandbox executed {total:,} payments, each of them once, for {total:,} intents "
        "(warm-ups included), checked after every cell"
    )
    console.print(
        f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())} on "
        f"{cpus} CPUs (this benchmark included)"
    )


if __name__ == "__main__":
    sys.exit(main())
