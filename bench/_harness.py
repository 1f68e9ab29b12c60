"""What the throughput benchmarks share: the sandbox in its own process, drafts, tables.

Not a benchmark itself. The scripts beside it import it (``bench/`` is their ``sys.path[0]``).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

import payonce
from payonce._lifecycle import IntentDraft, StoredResponse, canonical_request, make_scope

API_KEY = "sk_test_payonce"
ACCOUNT = "acct_demo"
PATH = "/v1/payments"
PAYMENT: dict[str, Any] = {"amount": 4200, "currency": "eur"}
_READY_TIMEOUT = 20.0

console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)

RESPONSE = StoredResponse(
    status=201,
    headers=(("content-type", "application/json"), ("request-id", "req_1")),
    body=b'{"id":"pay_1","amount":4200,"currency":"eur","status":"succeeded"}',
)


def header(title: str) -> None:
    """What ran where: the figures are only comparable within one run."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    console.print(
        f"[bold]{title}[/bold]  payonce {payonce.__version__}, httpx {httpx.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {now}"
    )


def draft(number: int, *, tag: str = "b", account: str = ACCOUNT) -> IntentDraft:
    """The draft a client would journal for payment ``number`` (reference ``tag-number``)."""
    body = {"amount": 1000 + number % 1000, "currency": "eur"}
    canonical = canonical_request("POST", PATH, json_body=body)
    return IntentDraft(
        key=f"{tag}-key-{number:08d}",
        key_supplied=False,
        scope=make_scope(account, "POST", PATH),
        reference=f"{tag}-{number:08d}",
        account=account,
        provider="sandbox",
        method="POST",
        url=f"http://127.0.0.1:9{PATH}",
        fingerprint=canonical.fingerprint,
        request_headers=(("content-type", "application/json"),),
        body=canonical.body,
    )


def fsync_rate(directory: Path, seconds: float = 1.0) -> float:
    """fsyncs per second of a 4 KiB append in ``directory``: what bounds durable commits."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    try:
        count, block = 0, b"\0" * 4096
        deadline = time.perf_counter() + seconds
        began = time.perf_counter()
        while time.perf_counter() < deadline:
            os.write(fd, block)
            os.fsync(fd)
            count += 1
        return count / (time.perf_counter() - began)
    finally:
        os.close(fd)
        path.unlink()


@contextlib.contextmanager
def workdir(keep: str | None = None) -> Iterator[Path]:
    """A scratch directory on the disk under test (``--dir``), removed afterwards."""
    if keep is not None:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path) as name:
            yield Path(name)
    else:
        with tempfile.TemporaryDirectory(prefix="payonce-bench-") as name:
            yield Path(name)


SANDBOX_PIDS: dict[str, int] = {}
"""The process id of each running sandbox, by its URL (for ``cpu_seconds``)."""


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) of a process so far: this one when ``pid`` is None."""
    if pid is None:
        return time.process_time()
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def sandbox_process(directory: Path, *extra: str) -> Iterator[str]:
    """``python -m payonce.sandbox`` on a free loopback port, in its own process."""
    ready = directory / "sandbox.url"
    ready.unlink(missing_ok=True)
    env = dict(os.environ)
    package_root = str(Path(payonce.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "payonce.sandbox", "--port", "0", "--ready-file", str(ready)]
    process = subprocess.Popen(
        [*command, *extra],
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
        url = ready.read_text().strip()
        SANDBOX_PIDS[url] = process.pid
        yield url
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


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU time of a server and all its children, those that exited included.

    The parent's own time, plus what it collected from the children it reaped (``cutime``,
    ``cstime``), plus the children alive now: for PostgreSQL, the postmaster, every backend
    that closed and every one still serving a connection. Sample it while the connections
    of interest are still open (a backend exiting between two samples is counted once the
    postmaster reaps it, which it does at once).
    """
    tick = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    total = sum(int(fields[index]) for index in (11, 12, 13, 14))
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                child = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # exited while we looked
            continue
        if int(child[1]) == pid:
            total += int(child[11]) + int(child[12])
    return total / tick


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def postgres_server() -> Iterator[Any]:
    """A throwaway PostgreSQL server: tests/pgserver.py's, as the test suite starts it.

    initdb into a temp dir (as the ``postgres`` user when we are root), ``pg_ctl start`` on
    127.0.0.1 and a unix socket, ``fsync=on``, ``synchronous_commit=on``; stopped and
    removed on exit. Yields the ``PostgresServer`` (``.url(server.create_database())``).
    Raises ``RuntimeError`` saying why when PostgreSQL cannot be started here.

    tests/pgserver.py also declares the suite's pytest fixtures. The benchmarks' virtualenv
    (``make .venv/.bench-installed``) has no pytest, so then it is imported with a stand-in
    that only lets those declarations through; the fixtures are never used here.
    """
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    stand_in = None
    try:
        import pytest  # noqa: F401
    except ModuleNotFoundError:
        stand_in = types.ModuleType("pytest")

        def fixture(function: Any = None, **_options: Any) -> Any:
            return function if function is not None else (lambda f: f)

        stand_in.fixture = fixture  # type: ignore[attr-defined]
        sys.modules["pytest"] = stand_in
    try:
        from pgserver import PostgresServer, find_bindir
    finally:
        if stand_in is not None:
            del sys.modules["pytest"]
    server = PostgresServer(find_bindir())
    try:
        server.start()
        yield server
    finally:
        server.stop()


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    view = Table(title=title, title_justify="left")
    for number, name in enumerate(columns):
        view.add_column(name, justify="left" if number == 0 else "right")
    for row in rows:
        view.add_row(*row)
    console.print(view)


def rate(value: float) -> str:
    return f"{value:,.0f}"


def ratio(value: float) -> str:
    return f"{value:.2f}x"
