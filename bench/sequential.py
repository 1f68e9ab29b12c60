"""Sequential throughput and latency of payonce against three baselines.

Starts the sandbox provider in a separate process (so client and server never share a
GIL), warms every variant up, then measures ``--requests`` sequential payments per variant
and round, the variants interleaved by round (their order rotating) so machine noise hits
them alike. Reports the median over ``--rounds``:

    raw httpx          httpx.Client, a fresh uuid4 Idempotency-Key per request (baseline)
    stripe pattern     + an in-memory key reused across a tenacity retry loop, no journal
    naive journal      + a plain sqlite3 journal: two fsynced commits per request
                         (insert pending, then update settled, both synchronous=FULL)
    payonce            payonce.Client on a fresh journal file, one reference per request
    payonce/PostgreSQL the same on a PostgreSQL journal (a local server started by the
                         script, as the tests do; skipped with --no-postgres)

plus the fsync cost of the journal's filesystem and the ceiling that implies for one fsync
per intent. ``--profile`` then breaks one payonce run down by where its time goes.

    PYTHONPATH=src .venv/bin/python bench/sequential.py            # 2000 requests x 5 rounds
    PYTHONPATH=src .venv/bin/python bench/sequential.py --quick    # 200-request smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import functools
import math
import os
import platform
import pstats
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import tenacity
from rich.console import Console
from rich.table import Table

import payonce

API_KEY = "sk_test_payonce"
ACCOUNT = "acct_demo"
PAYMENT: dict[str, Any] = {"amount": 4200, "currency": "eur"}
PATH = "/v1/payments"
TARGET_RATIO = 0.8
"""Durable sequential payments over raw httpx: issue 10 (issue 4 asked 0.6)."""
_READY_TIMEOUT = 20.0

T = TypeVar("T")
console = Console(highlight=False, width=None if sys.stdout.isatty() else 110)


# -- the sandbox, in its own process ---------------------------------------------------------


@contextlib.contextmanager
def sandbox_process(workdir: Path) -> Iterator[str]:
    """``python -m payonce.sandbox`` on a free port; yields its base URL."""
    ready = workdir / "sandbox.url"
    env = dict(os.environ)
    # Works before installation too: the child finds payonce where this process found it.
    package_root = str(Path(payonce.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        [sys.executable, "-m", "payonce.sandbox", "--port", "0", "--ready-file", str(ready)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + _READY_TIMEOUT
        while not ready.exists():
            if process.poll() is not None:
                detail = process.stderr.read() if process.stderr is not None else ""
                raise RuntimeError(f"the sandbox exited at start:\n{detail}")
            if time.monotonic() > deadline:
                raise RuntimeError("the sandbox did not become ready in time")
            time.sleep(0.02)
        yield ready.read_text().strip()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()


def sandbox_executions(url: str) -> int:
    response = httpx.get(f"{url}/_sandbox/executions", timeout=30.0)
    response.raise_for_status()
    return int(response.json()["total"])


# -- the variants ------------------------------------------------------------------------------


class Variant(Protocol):
    """One way of sending a payment; a new instance per round (fresh journal, fresh pool)."""

    def pay(self, number: int) -> None: ...

    def close(self) -> None: ...


def _check(response: httpx.Response) -> None:
    if response.status_code != 201:
        raise RuntimeError(f"payment failed: HTTP {response.status_code} {response.text[:200]}")


class RawHttpx:
    """The baseline: one POST with a fresh key, nothing else."""

    name = "raw httpx"

    def __init__(self, url: str, workdir: Path, tag: str) -> None:
        self._http = httpx.Client(base_url=url, timeout=30.0)

    def pay(self, number: int) -> None:
        headers = {"Idempotency-Key": str(uuid.uuid4()), "Authorization": f"Bearer {API_KEY}"}
        _check(self._http.post(PATH, json=PAYMENT, headers=headers))

    def close(self) -> None:
        self._http.close()


class _RetryableStatus(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


_RETRYABLE_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


class StripePattern:
    """stripe-python's pattern: a key made once in memory, reused by a retry loop; no journal.

    The loop has payonce's shape (tenacity, 5 attempts, capped exponential backoff with
    jitter, transport errors and 409/429/5xx retried), but a crash loses the key.
    """

    name = "stripe pattern"

    def __init__(self, url: str, workdir: Path, tag: str) -> None:
        self._http = httpx.Client(base_url=url, timeout=30.0)

    def pay(self, number: int) -> None:
        key = str(uuid.uuid4())
        headers = {"Idempotency-Key": key, "Authorization": f"Bearer {API_KEY}"}
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(5) | tenacity.stop_before_delay(60.0),
            wait=tenacity.wait_random_exponential(multiplier=0.25, max=8.0),
            retry=tenacity.retry_if_exception_type((httpx.TransportError, _RetryableStatus)),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                response = self._http.post(PATH, json=PAYMENT, headers=headers)
                if response.status_code in _RETRYABLE_STATUSES:
                    raise _RetryableStatus(response)
                _check(response)

    def close(self) -> None:
        self._http.close()


class NaiveJournal:
    """A durable journal written the obvious way: two separate fsynced commits per request.

    WAL mode (as payonce uses) with ``synchronous=FULL`` on both the pending insert and the
    settled update, so the comparison isolates the fsync budget rather than the file format.
    """

    name = "naive journal"

    def __init__(self, url: str, workdir: Path, tag: str) -> None:
        self._http = httpx.Client(base_url=url, timeout=30.0)
        self._db = sqlite3.connect(workdir / f"naive-{tag}.db", isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS intents (key TEXT PRIMARY KEY, reference TEXT UNIQUE,"
            " request BLOB NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL,"
            " status INTEGER, response BLOB, settled_at REAL)"
        )
        self._tag = tag

    def pay(self, number: int) -> None:
        key = str(uuid.uuid4())
        body = httpx.Request("POST", "http://x", json=PAYMENT).read()
        # Commit 1 (fsynced): the write-ahead record, before the request leaves.
        self._db.execute(
            "INSERT INTO intents (key, reference, request, state, created_at)"
            " VALUES (?, ?, ?, 'pending', ?)",
            (key, f"naive-{self._tag}-{number}", body, time.time()),
        )
        headers = {
            "Idempotency-Key": key,
            "Authorization": f"Bearer {API_KEY}",
            "Content-Type": "application/json",
        }
        response = self._http.post(PATH, content=body, headers=headers)
        _check(response)
        # Commit 2 (fsynced): the settled outcome.
        self._db.execute(
            "UPDATE intents SET state = 'succeeded', status = ?, response = ?, settled_at = ?"
            " WHERE key = ?",
            (response.status_code, response.content, time.time(), key),
        )

    def close(self) -> None:
        self._http.close()
        self._db.close()


class Payonce:
    """payonce.Client on a fresh journal file; every request is its own intent."""

    name = "payonce"

    def __init__(self, url: str, workdir: Path, tag: str) -> None:
        self.client = payonce.Client(
            base_url=url,
            provider="sandbox",
            account=ACCOUNT,
            api_key=API_KEY,
            journal=self.journal(workdir, tag),
        )
        self._tag = tag

    def journal(self, workdir: Path, tag: str) -> str | Path:
        return workdir / f"payonce-{tag}.db"

    def pay(self, number: int) -> None:
        response = self.client.post(PATH, json=PAYMENT, reference=f"bench-{self._tag}-{number}")
        _check(response)
        info = payonce.response_info(response)
        if info is None or info.replayed:
            raise RuntimeError(f"payonce replayed request {number}: the bench is broken")

    def close(self) -> None:
        self.client.close()


class PayoncePostgres(Payonce):
    """payonce.Client on a PostgreSQL journal; the references keep each run's intents apart."""

    name = "payonce/PostgreSQL"
    url: str | None = None

    def journal(self, workdir: Path, tag: str) -> str | Path:
        assert self.url is not None, "start_postgres() first"
        return self.url


VARIANTS: tuple[Callable[[str, Path, str], Variant], ...] = (
    RawHttpx,
    StripePattern,
    NaiveJournal,
    Payonce,
    PayoncePostgres,
)
NAMES: tuple[str, ...] = tuple(
    v.name for v in (RawHttpx, StripePattern, NaiveJournal, Payonce, PayoncePostgres)
)


@contextlib.contextmanager
def postgres_journal(enabled: bool) -> Iterator[None]:
    """A throwaway PostgreSQL server for the payonce/PostgreSQL variant, or drop it."""
    global VARIANTS, NAMES
    if enabled:
        # tests/pgserver.py's server, through the harness: it imports without pytest, which
        # the benchmarks' virtualenv lacks (this variant was skipped there, saying so).
        from _harness import postgres_server

        with contextlib.ExitStack() as stack:
            try:
                server = stack.enter_context(postgres_server())
            except Exception as exc:  # no binaries, no postgres user: bench without it
                console.print(f"PostgreSQL variant skipped: {exc}")
            else:
                PayoncePostgres.url = server.url(server.create_database())
                yield
                return
    VARIANTS = VARIANTS[:-1]
    NAMES = NAMES[:-1]
    yield


# -- measuring ---------------------------------------------------------------------------------


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


class RoundResult:
    def __init__(self, latencies: list[float], elapsed: float) -> None:
        ordered = sorted(latencies)
        self.rps = len(latencies) / elapsed
        self.p50 = percentile(ordered, 0.50)
        self.p99 = percentile(ordered, 0.99)


def run_round(variant: Variant, requests: int, settle: int) -> RoundResult:
    """``settle`` untimed requests (connection, journal file), then ``requests`` timed."""
    for number in range(-settle, 0):
        variant.pay(number)
    latencies: list[float] = []
    record = latencies.append
    clock = time.perf_counter
    pay = variant.pay
    begin = clock()
    for number in range(requests):
        start = clock()
        pay(number)
        record(clock() - start)
    return RoundResult(latencies, clock() - begin)


def fsync_cost(directory: Path, count: int = 200) -> tuple[float, float]:
    """Median and mean seconds of ``os.fsync`` after a small append, on this filesystem."""
    probe = directory / "fsync-probe.bin"
    timings: list[float] = []
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(count):
            os.write(fd, b"payonce fsync probe\n" * 4)
            start = time.perf_counter()
            os.fsync(fd)
            timings.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        probe.unlink()
    return statistics.median(timings), statistics.fmean(timings)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def benchmark(
    args: argparse.Namespace, url: str, workdir: Path
) -> tuple[dict[str, list[RoundResult]], list[tuple[float, float]]]:
    console.print(f"warming up: {args.warmup} requests per variant")
    for factory in VARIANTS:
        variant = factory(url, workdir, "warmup")
        try:
            for number in range(args.warmup):
                variant.pay(number)
        finally:
            variant.close()

    results: dict[str, list[RoundResult]] = {name: [] for name in NAMES}
    fsyncs: list[tuple[float, float]] = []
    for round_number in range(args.rounds):
        # Rotate the order so no variant always runs first (or right after another).
        shift = round_number % len(VARIANTS)
        order = list(zip(NAMES, VARIANTS, strict=True))
        order = order[shift:] + order[:shift]
        line = []
        for name, factory in order:
            variant = factory(url, workdir, f"r{round_number}")
            try:
                result = run_round(variant, args.requests, settle=10)
            finally:
                variant.close()
            results[name].append(result)
            line.append(f"{name} {result.rps:,.0f} req/s")
        # The disk is measured in every round too, since other load on it varies.
        fsyncs.append(fsync_cost(workdir))
        line.append(f"fsync {fsyncs[-1][1] * 1e6:,.0f} µs")
        console.print(
            f"round {round_number + 1}/{args.rounds} (load {os.getloadavg()[0]:.1f}): "
            + ", ".join(line)
        )
    return results, fsyncs


def report(
    results: dict[str, list[RoundResult]],
    fsyncs: list[tuple[float, float]],
    args: argparse.Namespace,
) -> None:
    baseline = results[RawHttpx.name]
    table = Table(
        title=(
            f"payonce sequential benchmark: {args.requests} requests x {args.rounds} round(s), "
            "median over rounds"
        )
    )
    table.add_column("variant")
    table.add_column("req/s", justify="right")
    table.add_column("p50 ms", justify="right")
    table.add_column("p99 ms", justify="right")
    table.add_column("x raw httpx", justify="right")
    ratios: dict[str, float] = {}
    for name in NAMES:
        rounds = results[name]
        # The ratio pairs each round with the raw run of the same round, then takes the median.
        ratio = statistics.median(r.rps / b.rps for r, b in zip(rounds, baseline, strict=True))
        ratios[name] = ratio
        table.add_row(
            name,
            f"{statistics.median(r.rps for r in rounds):,.0f}",
            _ms(statistics.median(r.p50 for r in rounds)),
            _ms(statistics.median(r.p99 for r in rounds)),
            f"{ratio:.2f}",
        )
    console.print(table)
    median_fsync = statistics.median(median for median, _ in fsyncs)
    mean_fsync = statistics.median(mean for _, mean in fsyncs)
    console.print(
        f"fsync on the journal's filesystem ({args.journal_dir}), 200 small writes per round, "
        f"median over rounds: median {median_fsync * 1e6:,.0f} µs, mean {mean_fsync * 1e6:,.0f} µs"
        f" (per-round means {', '.join(f'{mean * 1e6:,.0f}' for _, mean in fsyncs)} µs). "
        f"One fsync per intent caps a sequential writer at ~{1 / mean_fsync:,.0f} intents/s "
        f"(two: ~{1 / (2 * mean_fsync):,.0f})"
    )
    ratio = ratios[Payonce.name]
    verdict = "met" if ratio >= TARGET_RATIO else f"MISSED by {TARGET_RATIO - ratio:.2f}"
    console.print(
        f"payonce / raw httpx = {ratio:.2f} (target >= {TARGET_RATIO}: {verdict}); "
        f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


# -- where payonce's time goes ----------------------------------------------------------------


class Stopwatch:
    """Wall time spent inside wrapped callables, by label."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def wrap(self, label: str, function: Callable[..., T]) -> Callable[..., T]:
        self.totals.setdefault(label, 0.0)
        clock = time.perf_counter

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> T:
            start = clock()
            try:
                return function(*args, **kwargs)
            finally:
                self.totals[label] += clock() - start

        return timed


def profile_payonce(url: str, workdir: Path, requests: int) -> None:
    """Break ``requests`` payonce intents down by wall time, then list cProfile's hot spots."""
    variant = Payonce(url, workdir, "profile")
    client: Any = variant.client
    core: Any = client._core
    watch = Stopwatch()
    # Instance attributes shadow the methods: the wrappers see every call, src/ is untouched.
    # A method a later payonce renames is simply not broken out (its time lands in "rest").
    for label, owner, attribute in (
        ("drive", client, "_drive"),
        ("executor loop", client, "_execute"),
        ("send", client, "_send"),
        ("claim", core.store, "claim"),
        ("settle", core.store, "settle"),
        ("acknowledge", client.journal, "acknowledge"),
        ("build_request", core, "build_request"),
        ("journal commands", core, "journal_command"),
        ("httpx send", client._http, "send"),
    ):
        if hasattr(owner, attribute):
            setattr(owner, attribute, watch.wrap(label, getattr(owner, attribute)))
    try:
        for number in range(-20, 0):
            variant.pay(number)
        watch.totals = dict.fromkeys(watch.totals, 0.0)
        begin = time.perf_counter()
        for number in range(requests):
            variant.pay(number)
        total = time.perf_counter() - begin
    finally:
        variant.close()

    raw = RawHttpx(url, workdir, "profile")
    try:
        for number in range(-20, 0):
            raw.pay(number)
        begin = time.perf_counter()
        for number in range(requests):
            raw.pay(number)
        raw_total = time.perf_counter() - begin
    finally:
        raw.close()

    t = (
        dict.fromkeys(
            (
                "drive",
                "send loop",
                "claim",
                "settle",
                "acknowledge",
                "build_request",
                "on_response",
                "httpx send",
            ),
            0.0,
        )
        | watch.totals
    )
    parts = {
        "journal.claim: write-ahead transaction (synchronous=FULL)": t["claim"],
        "journal.settle: settle transaction (synchronous=NORMAL)": t["settle"],
        "journal.acknowledge: on leaving the operation (NORMAL)": t["acknowledge"],
        "httpx send: network + sandbox + httpx/h11 (one round trip)": t["httpx send"],
        "build_request (headers, URL, httpx.Request)": t["build_request"],
        "on_response minus settle (classify, StoredResponse)": t["on_response"] - t["settle"],
        "tenacity loop and lease renewer bookkeeping": t["send loop"]
        - t["build_request"]
        - t["httpx send"]
        - t["on_response"],
        "begin minus claim (owner id, Run, bind)": t["drive"] - t["send loop"] - t["claim"],
        "rest: canonical JSON, fingerprint, draft, ULID, Operation": total
        - t["drive"]
        - t["acknowledge"],
    }
    table = Table(title=f"where payonce's time goes ({requests} intents, wall time)")
    table.add_column("part")
    table.add_column("µs / intent", justify="right")
    table.add_column("share", justify="right")
    for label, seconds in parts.items():
        table.add_row(label, f"{seconds / requests * 1e6:,.0f}", f"{seconds / total:.0%}")
    table.add_row("total", f"{total / requests * 1e6:,.0f}", "100%")
    table.add_row(
        "for comparison: raw httpx, same sandbox, right after",
        f"{raw_total / requests * 1e6:,.0f}",
        f"{raw_total / total:.0%}",
    )
    console.print(table)

    variant = Payonce(url, workdir, "cprofile")
    profiler = cProfile.Profile()
    try:
        for number in range(-20, 0):
            variant.pay(number)
        profiler.enable()
        for number in range(requests):
            variant.pay(number)
        profiler.disable()
    finally:
        variant.close()
    stats = pstats.Stats(profiler)
    console.print(f"cProfile, {requests} intents, by own time (its overhead inflates Python code):")
    stats.sort_stats("tottime").print_stats(18)
    _print_buckets(stats, requests)


def _bucket(filename: str, function: str) -> str:
    if "sqlite3" in function or "sqlite3" in filename:
        return "sqlite3 (SQL + commits + fsync)"
    for marker, label in (
        ("/payonce/_journal/", "payonce journal (Python)"),
        ("/payonce/", "payonce other (Python)"),
        ("/tenacity/", "tenacity"),
        ("/httpx/", "httpx"),
        ("/httpcore/", "httpcore + h11"),
        ("/h11/", "httpcore + h11"),
        ("/attr/", "attrs"),
        ("<attrs generated", "attrs"),
        ("/ulid/", "python-ulid"),
    ):
        if marker in filename:
            return label
    if "socket" in function or "recv" in function or "sendall" in function:
        return "socket I/O (waiting on the sandbox)"
    return "stdlib / other"


def _print_buckets(stats: pstats.Stats, requests: int) -> None:
    buckets: dict[str, float] = {}
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, function), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        label = _bucket(filename, function)
        buckets[label] = buckets.get(label, 0.0) + tottime
    total = sum(buckets.values())
    table = Table(title="cProfile own time by component")
    table.add_column("component")
    table.add_column("µs / intent", justify="right")
    table.add_column("share", justify="right")
    for label, seconds in sorted(buckets.items(), key=lambda item: -item[1]):
        table.add_row(label, f"{seconds / requests * 1e6:,.0f}", f"{seconds / total:.0%}")
    console.print(table)


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="per variant and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported")
    parser.add_argument("--warmup", type=int, default=200, help="untimed requests per variant")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 200 requests, 1 round, 20 warm-up"
    )
    parser.add_argument(
        "--no-postgres", action="store_true", help="leave out the payonce/PostgreSQL variant"
    )
    parser.add_argument(
        "--journal-dir",
        type=Path,
        default=None,
        help="where the journals live (default: a new temporary directory)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=2000,
        default=0,
        metavar="N",
        help="afterwards, break N payonce intents down by where the time goes (default 2000)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds, args.warmup = 200, 1, 20
        if args.profile:
            args.profile = min(args.profile, 200)
    if args.requests < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--requests and --rounds must be positive, --warmup not negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console.print(
        f"payonce {payonce.__version__}, httpx {httpx.__version__}, Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="payonce-bench-") as scratch:
        workdir = Path(scratch)
        if args.journal_dir is not None:
            args.journal_dir.mkdir(parents=True, exist_ok=True)
            journals = Path(tempfile.mkdtemp(prefix="payonce-bench-", dir=args.journal_dir))
        else:
            journals = workdir / "journals"
            journals.mkdir()
        args.journal_dir = journals
        try:
            with sandbox_process(workdir) as url, postgres_journal(not args.no_postgres):
                before = sandbox_executions(url)
                results, fsyncs = benchmark(args, url, journals)
                executed = sandbox_executions(url) - before
                expected = len(VARIANTS) * (args.warmup + args.rounds * (args.requests + 10))
                report(results, fsyncs, args)
                console.print(
                    f"the sandbox executed {executed:,} payments for {expected:,} requests"
                    + (" (one each)" if executed == expected else " - MISMATCH")
                )
                if args.profile:
                    profile_payonce(url, journals, args.profile)
        finally:
            if journals.parent != workdir:
                for leftover in journals.iterdir():
                    leftover.unlink()
                journals.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
