"""Async throughput at 1, 16, 64 and 256 concurrent requests: plain httpx.AsyncClient against
payonce.AsyncClient with each transport option, with and without group commit.

The sandbox runs in a process of its own; every cell gets a fresh client (and a fresh
journal file), warms up, then sends ``--requests`` payments from N concurrent tasks, each
payment a new intent. Cells alternate by round, so noise hits the variants alike. Rows:

    httpx                    httpx.AsyncClient(), default pool (100 connections, 20 kept
                             alive), a fresh Idempotency-Key per request: the baseline
    httpx, no sniffio        the same with sniffio hidden: httpcore then re-tries the
                             failed import on every lock it creates (encode/httpcore#1103)
    aiohttp                  aiohttp.ClientSession (100 connections): the yardstick of the
                             aiohttp transport, which must reach half its rate at c=64
    payonce …                payonce.AsyncClient, one reference per payment, on
        default pool         transport=None (httpx's default pool)
        bounded 16           transport=Bounded(16): at most 16 requests in the pool, 16
                             connections kept alive (bench/_transports.py)
        4 pools x 16         transport=Spread(4 pools of 16 connections)
        aiohttp              transport=httpx_aiohttp.AiohttpTransport() (extra "aiohttp")
    … group / inline         SQLiteJournal(group_commit=True) (the default) / False
    … journal threads 64     journal calls on a 64-thread executor of the client's own
                             instead of asyncio.to_thread's default one (min(32, CPUs + 4)
                             threads: 6 here): the change proposed for _async_client.py

plus payonce.Client (sync) sequential, the floor the async client must never fall below.

Then, in the same run and against the same sandbox, the journal section (issue 19): the
same payonce.AsyncClient (httpx's default pool) at 1, 16 and 64 callers on a SQLite journal
file (group commit, the default) and on a PostgreSQL journal (a local server the script
starts as the tests do, bench/_harness.py: 127.0.0.1, fsync and synchronous_commit on),
intents/s and p99 latency, and PostgreSQL / SQLite at 64 callers against the 0.8x target.
"PG, journal threads" is the same PostgreSQL journal reached as before AsyncClient wrote on
the event loop: every journal command in a journal thread (its async edge switched off).
--no-postgres leaves the PostgreSQL half out; --journal-only runs this section alone.

    PYTHONPATH=src .venv/bin/python bench/async_concurrency.py
    PYTHONPATH=src .venv/bin/python bench/async_concurrency.py --quick
    PYTHONPATH=src .venv/bin/python bench/async_concurrency.py --journal-only --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.machinery
import itertools
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, ParamSpec, TypeVar

import httpx
from _harness import (
    ACCOUNT,
    API_KEY,
    PATH,
    PAYMENT,
    SANDBOX_PIDS,
    cpu_seconds,
    header,
    median,
    percentile,
    postgres_server,
    rate,
    ratio,
    sandbox_process,
    table,
    workdir,
)
from _transports import Bounded, Spread, pool

import payonce
from payonce._journal._sqlite import SQLiteJournal
from payonce._runtime import _async as _async_client

P = ParamSpec("P")
T = TypeVar("T")

WARM_UP = 30
TARGET = 2.0
AIOHTTP_TARGET = 0.5
"""payonce's aiohttp transport at 64 concurrent over raw aiohttp at 64 (issue 10)."""
POSTGRES_TARGET = 0.8
"""AsyncClient at 64 callers on PostgreSQL over the same on SQLite, same run (issue 19)."""
POSTGRES_AT = 64


# -- sniffio, hidden the way a missing package is missing -------------------------------------


class _HideSniffio:
    """A meta-path finder that searches sys.path for sniffio as usual, then fails."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "sniffio":
            importlib.machinery.PathFinder.find_spec(name, path)
            raise ModuleNotFoundError("No module named 'sniffio'", name=name)


@contextlib.contextmanager
def sniffio_missing() -> Iterator[None]:
    finder = _HideSniffio()
    saved = sys.modules.pop("sniffio", None)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        if saved is not None:
            sys.modules["sniffio"] = saved


# -- the journal's thread pool ----------------------------------------------------------------


@contextlib.contextmanager
def journal_threads(count: int) -> Iterator[None]:
    """payonce's async journal calls on an executor of ``count`` threads (the proposed
    change to _async_client._off_loop), instead of asyncio.to_thread's default pool."""
    executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix="payonce-journal")
    original = _async_client._off_loop

    async def off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, lambda: function(*args, **kwargs))

    _async_client._off_loop = off_loop  # type: ignore[assignment]
    try:
        yield
    finally:
        _async_client._off_loop = original
        executor.shutdown()


# -- the variants -----------------------------------------------------------------------------

Pay = Callable[[int], Awaitable[None]]


def _aiohttp() -> httpx.AsyncBaseTransport:
    from httpx_aiohttp import AiohttpTransport

    return AiohttpTransport(limits=httpx.Limits(max_connections=100))


TRANSPORTS: dict[str, Callable[[], httpx.AsyncBaseTransport | None]] = {
    "default pool": lambda: None,
    "bounded 16": lambda: Bounded(16),
    "4 pools x 16": lambda: Spread([pool(16) for _ in range(4)]),
    "aiohttp": _aiohttp,
}


def variants(selected: list[str] | None) -> list[str]:
    names = ["httpx", "httpx, no sniffio", "aiohttp"]
    for transport in TRANSPORTS:
        names += [f"payonce {transport}, group", f"payonce {transport}, inline"]
    if hasattr(_async_client, "_off_loop"):  # gone once the journal has a thread of its own
        names.append("payonce bounded 16, group, journal threads 64")
    return [n for n in names if selected is None or any(s in n for s in selected)]


@contextlib.asynccontextmanager
async def open_variant(name: str, url: str, journal: Path) -> Any:
    """A ``pay(number)`` coroutine function for one variant, and its cleanup."""
    if name.startswith("httpx"):
        context = sniffio_missing() if "no sniffio" in name else contextlib.nullcontext()
        with context:
            async with httpx.AsyncClient(base_url=url, timeout=30.0) as http:

                async def pay_raw(number: int) -> None:
                    headers = {
                        "Idempotency-Key": str(uuid.uuid4()),
                        "Authorization": f"Bearer {API_KEY}",
                    }
                    response = await http.post(PATH, json=PAYMENT, headers=headers)
                    if response.status_code != 201:
                        raise RuntimeError(f"HTTP {response.status_code}: {response.text}")

                yield pay_raw
        return
    if name == "aiohttp":
        import aiohttp

        connector = aiohttp.TCPConnector(limit=100)
        async with aiohttp.ClientSession(url, connector=connector) as session:

            async def pay_aiohttp(number: int) -> None:
                headers = {
                    "Idempotency-Key": str(uuid.uuid4()),
                    "Authorization": f"Bearer {API_KEY}",
                }
                async with session.post(PATH, json=PAYMENT, headers=headers) as response:
                    await response.read()
                    if response.status != 201:
                        raise RuntimeError(f"HTTP {response.status}")

            yield pay_aiohttp
        return
    transport = next(TRANSPORTS[t] for t in TRANSPORTS if f"payonce {t}," in name)()
    threads = journal_threads(64) if "journal threads" in name else contextlib.nullcontext()
    store = SQLiteJournal(journal, group_commit=", group" in name)
    tag = journal.stem
    with threads:
        async with payonce.AsyncClient(
            base_url=url,
            provider="sandbox",
            account=ACCOUNT,
            api_key=API_KEY,
            journal=store,
            transport=transport,
        ) as client:

            async def pay(number: int) -> None:
                response = await client.post(PATH, json=PAYMENT, reference=f"{tag}-{number}")
                if response.status_code != 201:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text}")

            yield pay
    store.close()


async def drive(pay: Pay, concurrency: int, numbers: range) -> float:
    """Requests per second: ``concurrency`` tasks share the numbers to pay."""
    pending = iter(numbers)

    async def worker() -> None:
        for number in pending:
            await pay(number)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(numbers) / (time.perf_counter() - began)


class Cell(NamedTuple):
    per_second: float
    client_cpu: float
    """CPU seconds of this process per request."""
    server_cpu: float
    """CPU seconds of the sandbox process per request."""


async def cell(name: str, url: str, journal: Path, concurrency: int, requests: int) -> Cell:
    async with open_variant(name, url, journal) as pay:
        await drive(pay, min(concurrency, WARM_UP), range(WARM_UP))
        client, server = cpu_seconds(), cpu_seconds(SANDBOX_PIDS[url])
        per_second = await drive(pay, concurrency, range(WARM_UP, WARM_UP + requests))
        return Cell(
            per_second,
            (cpu_seconds() - client) / requests,
            (cpu_seconds(SANDBOX_PIDS[url]) - server) / requests,
        )


def sync_sequential(url: str, journal: Path, requests: int) -> float:
    with payonce.Client(
        base_url=url, provider="sandbox", account=ACCOUNT, api_key=API_KEY, journal=journal
    ) as client:
        for number in range(WARM_UP):
            client.post(PATH, json=PAYMENT, reference=f"sync-{number}")
        began = time.perf_counter()
        for number in range(WARM_UP, WARM_UP + requests):
            client.post(PATH, json=PAYMENT, reference=f"sync-{number}")
        return requests / (time.perf_counter() - began)


# -- the journal section: the same AsyncClient on SQLite and on PostgreSQL ------------------

THREADED = "PG, journal threads"
"""PostgreSQL reached the way AsyncClient did before its writes ran on the event loop:
every journal command in a journal thread (the engine's async edge switched off)."""
JOURNALS = ("SQLite", "PostgreSQL", THREADED)


@contextlib.contextmanager
def journal_threads_only(kind: str) -> Iterator[None]:
    """For the ``THREADED`` cells: no async edge, so every journal command hops."""
    if kind != THREADED:
        yield
        return
    from payonce._journal._postgres import PostgresEngine

    edge = PostgresEngine.async_edge
    PostgresEngine.async_edge = lambda self: None  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        PostgresEngine.async_edge = edge  # type: ignore[method-assign]


class Timed(NamedTuple):
    per_second: float
    latencies: list[float]
    """Seconds per intent, each call's own (``time.perf_counter`` around it)."""


async def journal_cell(
    kind: str, url: str, journal: Path | str, tag: str, concurrency: int, requests: int
) -> Timed:
    """``requests`` intents from ``concurrency`` tasks on one fresh AsyncClient."""
    latencies: list[float] = []
    async with payonce.AsyncClient(
        base_url=url, provider="sandbox", account=ACCOUNT, api_key=API_KEY, journal=journal
    ) as client:

        async def pay(number: int) -> None:
            began = time.perf_counter()
            response = await client.post(PATH, json=PAYMENT, reference=f"{tag}-{number}")
            latencies.append(time.perf_counter() - began)
            if response.status_code != 201:
                raise RuntimeError(f"{kind}: HTTP {response.status_code}: {response.text}")

        await drive(pay, min(concurrency, WARM_UP), range(WARM_UP))
        latencies.clear()
        per_second = await drive(pay, concurrency, range(WARM_UP, WARM_UP + requests))
    return Timed(per_second, sorted(latencies))


@contextlib.contextmanager
def postgres_journal(enabled: bool) -> Iterator[str | None]:
    """The URL of a fresh database on a throwaway PostgreSQL server, or None (said why)."""
    if not enabled:
        yield None
        return
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(postgres_server())
            database = server.create_database()
        except Exception as exc:  # no binaries, no postgres user: the SQLite half alone
            print(f"PostgreSQL half skipped: {exc}")
            yield None
            return
        yield server.url(database)


def journal_section(
    url: str, directory: Path, postgres_url: str | None, args: argparse.Namespace
) -> None:
    kinds = [k for k in JOURNALS if k == "SQLite" or postgres_url is not None]
    results: dict[tuple[str, int], list[Timed]] = {}
    counter = itertools.count()
    for round_ in range(args.rounds):
        order = kinds[round_ % len(kinds) :] + kinds[: round_ % len(kinds)]
        for concurrency in args.journal_concurrency:
            for kind in order:
                tag = f"jr{next(counter)}"
                journal: Path | str = (
                    directory / f"{tag}.db" if kind == "SQLite" else str(postgres_url)
                )
                with journal_threads_only(kind):
                    timed = asyncio.run(
                        journal_cell(kind, url, journal, tag, concurrency, args.requests)
                    )
                results.setdefault((kind, concurrency), []).append(timed)

    def per_second(kind: str, c: int) -> float:
        return median([t.per_second for t in results[(kind, c)]])

    def p99_ms(kind: str, c: int) -> float:
        return median([percentile(t.latencies, 0.99) for t in results[(kind, c)]]) * 1e3

    columns = ["journal"]
    for c in args.journal_concurrency:
        columns += [f"c={c} intents/s", f"c={c} p99 ms"]
    rows = [
        [
            kind,
            *itertools.chain.from_iterable(
                (rate(per_second(kind, c)), f"{p99_ms(kind, c):.1f}")
                for c in args.journal_concurrency
            ),
        ]
        for kind in kinds
    ]
    for kind, name in (("PostgreSQL", "PG / SQLite"), (THREADED, "PG threads / SQLite")):
        if kind not in kinds:
            continue
        rows.append(
            [
                name,
                *itertools.chain.from_iterable(
                    (
                        ratio(per_second(kind, c) / per_second("SQLite", c)),
                        ratio(p99_ms(kind, c) / p99_ms("SQLite", c)),
                    )
                    for c in args.journal_concurrency
                ),
            ]
        )
    table(
        f"payonce.AsyncClient (default pool) on a SQLite file and on PostgreSQL: median of "
        f"{args.rounds} round(s) of {args.requests} intents per cell; PG / SQLite of the medians",
        columns,
        rows,
    )
    if "PostgreSQL" not in kinds or POSTGRES_AT not in args.journal_concurrency:
        return
    by_round = [
        pg.per_second / lite.per_second
        for pg, lite in zip(
            results[("PostgreSQL", POSTGRES_AT)], results[("SQLite", POSTGRES_AT)], strict=True
        )
    ]
    got = median(by_round)
    verdict = "met" if got >= POSTGRES_TARGET else "MISSED"
    print(
        f"AsyncClient at {POSTGRES_AT} callers, PostgreSQL / SQLite: {got:.2f}x, the median "
        f"of each round's ratio (target >= {POSTGRES_TARGET:g}x: {verdict}; the rounds: "
        + ", ".join(f"{r:.2f}" for r in by_round)
        + ")"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--requests", type=int, default=400, help="per cell")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", help="only the variants whose name has one of these")
    parser.add_argument("--dir", help="where the journal files go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="150 requests, one round")
    parser.add_argument(
        "--journal-concurrency",
        type=int,
        nargs="+",
        default=[1, 16, POSTGRES_AT],
        help="callers of the SQLite / PostgreSQL journal section",
    )
    parser.add_argument(
        "--no-postgres", action="store_true", help="the journal section on SQLite alone"
    )
    parser.add_argument(
        "--journal-only", action="store_true", help="only the SQLite / PostgreSQL section"
    )
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 150, 1

    header("async concurrency: plain httpx.AsyncClient vs payonce.AsyncClient")
    with (
        workdir(args.dir) as directory,
        sandbox_process(directory) as url,
        postgres_journal(not args.no_postgres) as postgres_url,
    ):
        if not args.journal_only:
            transport_section(url, directory, args)
        journal_section(url, directory, postgres_url, args)


def transport_section(url: str, directory: Path, args: argparse.Namespace) -> None:
    names = variants(args.only)
    results: dict[tuple[str, int], list[Cell]] = {}
    sequential: list[float] = []
    counter = itertools.count()
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for concurrency in args.concurrency:
            for name in order:
                journal = directory / f"j{next(counter)}.db"
                measured = asyncio.run(cell(name, url, journal, concurrency, args.requests))
                results.setdefault((name, concurrency), []).append(measured)
        sequential.append(sync_sequential(url, directory / f"s{round_}.db", args.requests))

    typical = {key: median([c.per_second for c in cells]) for key, cells in results.items()}
    client_ms = {key: median([c.client_cpu for c in cells]) * 1e3 for key, cells in results.items()}
    server_ms = {key: median([c.server_cpu for c in cells]) * 1e3 for key, cells in results.items()}
    table(
        f"requests/s (median of {args.rounds} round(s) of {args.requests} requests per cell)",
        ["variant", *(f"c={c}" for c in args.concurrency)],
        [[name, *(rate(typical[(name, c)]) for c in args.concurrency)] for name in names],
    )
    table(
        "CPU ms per request: this process (client) / the sandbox process (server)",
        ["variant", *(f"c={c}" for c in args.concurrency)],
        [
            [
                name,
                *(
                    f"{client_ms[(name, c)]:.2f} / {server_ms[(name, c)]:.2f}"
                    for c in args.concurrency
                ),
            ]
            for name in names
        ],
    )
    floor = median(sequential)
    print(f"payonce.Client (sync), sequential: {floor:,.0f} requests/s")
    if "aiohttp" in names and 64 in args.concurrency:
        raw = typical[("aiohttp", 64)]
        for name in names:
            if name.startswith("payonce aiohttp"):
                got = typical[(name, 64)] / raw
                verdict = "met" if got >= AIOHTTP_TARGET else "MISSED"
                print(
                    f"{name} at 64 / raw aiohttp at 64: {got:.2f}x "
                    f"(target >= {AIOHTTP_TARGET:g}x: {verdict})"
                )
    if "httpx" in names and 64 in args.concurrency:
        base = typical[("httpx", 64)]
        rows = [
            [
                name,
                ratio(typical[(name, 64)] / base),
                ratio(typical[(name, 64)] / floor),
                "met"
                if typical[(name, 64)] >= TARGET * base and typical[(name, 64)] >= floor
                else f"missed ({typical[(name, 64)] / (TARGET * base):.2f} of {TARGET:g}x)",
            ]
            for name in names
            if name.startswith("payonce")
        ]
        table(
            "at 64 concurrent: ratio to plain httpx.AsyncClient at 64, and to payonce sync "
            "sequential (targets: >= 2x, >= 1x)",
            ["variant", "/ httpx @64", "/ payonce sequential", "target"],
            rows,
        )
        capacity = 1 / (server_ms[("httpx", 64)] / 1e3)
        print(
            f"bound: the sandbox spends {server_ms[('httpx', 64)]:.2f} ms of CPU per request at "
            f"c=64 (plain httpx): at most {capacity:,.0f} requests/s on a core of its own, and "
            "client and server share this machine's cores"
        )
        if "httpx, no sniffio" in names:
            print(
                "sniffio installed vs missing (plain httpx): "
                + ", ".join(
                    f"c={c} {typical[('httpx', c)] / typical[('httpx, no sniffio', c)]:.2f}x"
                    for c in args.concurrency
                )
            )


if __name__ == "__main__":
    main()
