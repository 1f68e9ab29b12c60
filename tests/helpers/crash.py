"""The crash harness: payment workers run as real child processes, killed at crash points,
and the truth read from the sandbox's store and the journal, never from their output."""

from __future__ import annotations

import collections
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from helpers.processes import python_env
from payonce.sandbox import SandboxServer

TESTS = Path(__file__).resolve().parents[1]
WORKER = TESTS / "_worker.py"
GROUP_WORKER = TESTS / "_group_worker.py"
KILLED = -signal.SIGKILL


def worker_env(crash_at: str | None = None) -> dict[str, str]:
    """A worker's environment; ``crash_at`` (``point:visit``) makes it SIGKILL itself there."""
    env = python_env()
    env.pop("PAYONCE_CRASH_AT", None)
    if crash_at:
        env["PAYONCE_CRASH_AT"] = crash_at
    return env


def run_worker(
    server: SandboxServer,
    journal: Path,
    orders: int,
    *,
    crash_at: str | None = None,
    args: Sequence[str] = (),
) -> int:
    """Run tests/_worker.py to its end or its crash point; its exit code."""
    command = [sys.executable, str(WORKER), "--url", server.url, "--journal", str(journal)]
    command += ["--orders", str(orders), *args]
    done = subprocess.run(
        command, env=worker_env(crash_at), capture_output=True, text=True, timeout=300
    )
    if done.returncode not in (0, KILLED):
        pytest.fail(f"worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.returncode


def run_checkout_worker(
    command: Sequence[str], server: SandboxServer, crash_at: str | None = None
) -> tuple[int, list[dict[str, str]]]:
    """Run a checkout worker (one JSON answer a line) to its end or its kill: its exit
    code and the answers it printed, once the sandbox handled all it received."""
    done = subprocess.run(
        command, env=worker_env(crash_at), capture_output=True, text=True, timeout=120
    )
    if done.returncode not in (0, KILLED):
        pytest.fail(f"worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    server.wait_idle()
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


def executions_once_arrived(server: SandboxServer, expected: int) -> int:
    """The provider's execution count once the killed worker's last request was handled.

    Its bytes were out when the worker died, but the sandbox may not have started on them
    yet (``wait_idle`` sees no request in flight then): wait for them, up to a bound."""
    deadline = time.monotonic() + 10.0
    while server.store.total_executions() < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    server.wait_idle()
    return server.store.total_executions()


def exactly_once_violations(server: SandboxServer, journal: Path, orders: int) -> list[str]:
    """Everything that breaks "each order executed exactly once, and its state known"."""
    problems = []
    by_reference = collections.Counter(p["reference"] for p in server.store.payments())
    for reference, count in sorted(by_reference.items()):
        if count > 1:
            problems.append(f"{reference} executed {count} times")
    for key, count in server.store.executions().items():
        if count > 1:
            problems.append(f"key {key} executed {count} times")
    intents: dict[str, tuple[str, str, str | None]] = {}
    if journal.exists():
        with sqlite3.connect(journal) as conn:
            rows = conn.execute("SELECT reference, key, state, unknown_reason FROM intents")
            intents = {ref: (key, state, reason) for ref, key, state, reason in rows}
    executed_keys = set(server.store.executions())
    for n in range(orders):
        reference = f"order-{n:04d}"
        if reference not in intents:
            problems.append(f"{reference} lost: not in the journal")
            continue
        key, state, reason = intents[reference]
        if state == "succeeded" and key not in executed_keys:
            problems.append(f"{reference} succeeded in the journal but never executed")
        if state == "pending" or (state == "unknown" and not reason):
            problems.append(f"{reference} left {state} without a reason")
        if state == "succeeded" and by_reference[reference] == 0:
            problems.append(f"{reference} succeeded but the provider has no payment")
    stray = executed_keys - {key for key, _, _ in intents.values()}
    if stray:
        problems.append(f"{len(stray)} execution(s) under keys the journal does not know")
    return problems


def settled_states(journal: Path) -> collections.Counter[str]:
    with sqlite3.connect(journal) as conn:
        return collections.Counter(state for (state,) in conn.execute("SELECT state FROM intents"))
