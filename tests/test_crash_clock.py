"""The provider's clock, across a real crash and resume, with libfaketime.

Issue 18's case: a payment crashed after it was sent, the provider aged 25 hours and
forgot the key, and the host's clock was set back 25 hours before the resume; by that clock
the attempt was a moment old, payonce resent it, and the provider executed it twice.

Here all of it happens for real, 25 hours compressed: a child process pays under a key,
its wall clock 25 hours back (libfaketime), against the sandbox (in this test process, so
it outlives the child) whose clock is 25 hours back too; the child is SIGKILLed right after
the request left. Then the provider ages those 25 hours (its clock back to now) and forgets
the key, by its 24-hour key lifetime. The resume runs as a process of its own with its wall
clock still 25 hours back. The truth is read from the sandbox's store and the journal.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.cli import run_cli_process
from helpers.crash import KILLED, executions_once_arrived, worker_env
from helpers.faketime import libfaketime_env
from payonce._lifecycle import _drive
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

HOURS_25 = 25 * 3600.0
ACCOUNT = "acct_demo"

_PAY = """
import sys, time

import payonce
from payonce.sandbox import DEFAULT_API_KEY

url, journal, reference = sys.argv[1:]
print(time.time(), flush=True)  # this process's wall clock, for the test to check
client = payonce.Client(
    base_url=url, provider="sandbox", account="acct_demo", api_key=DEFAULT_API_KEY,
    journal=journal, timeout=120,  # its answer may be held while the test looks on
)
client.post("/v1/payments", json={"amount": 4200, "currency": "eur"}, reference=reference)
"""


def _crash_25_hours_ago(sandbox: SandboxServer, journal: Path, reference: str) -> str:
    """Pay ``reference`` 25 hours ago, dying right after the request left; the provider
    then ages 25 hours. The intent's key."""
    set_back = libfaketime_env("-25h")
    sandbox.advance_clock(-HOURS_25)
    child = subprocess.run(
        [sys.executable, "-c", _PAY, sandbox.url, str(journal), reference],
        env={**worker_env("after_send:1"), **set_back},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == KILLED, child.stderr[-3000:]
    assert float(child.stdout.split()[0]) < time.time() - HOURS_25 + 600, "its clock was off"
    assert executions_once_arrived(sandbox, 1) == 1
    (key,) = sandbox.store.executions()
    assert sandbox.store.executions() == {key: 1}
    sandbox.advance_clock(HOURS_25)  # the provider's clock is now again: it forgot the key
    return key


def _intent(journal: Path, key: str) -> tuple[str, str | None]:
    with sqlite3.connect(journal) as conn:
        ((state, reason),) = conn.execute(
            "SELECT state, unknown_reason FROM intents WHERE key = ?", (key,)
        )
    return state, reason


@pytest.mark.slow
def test_a_resume_with_the_clock_set_back_25_hours_never_pays_a_forgotten_key_twice(
    sandbox: SandboxServer, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.db"
    key = _crash_25_hours_ago(sandbox, journal, "order-clock")

    resumed = run_cli_process(
        ["resume"],
        env={
            "PAYONCE_API_KEY": DEFAULT_API_KEY,
            "PAYONCE_BASE_URL": sandbox.url,
            "PAYONCE_PROVIDER": "sandbox",
            "PAYONCE_ACCOUNT": ACCOUNT,
            "PAYONCE_JOURNAL": str(journal),
            **libfaketime_env("-25h"),
        },
        timeout=120,
    )

    assert resumed.exit_code == 1, resumed.output  # an intent went unknown
    assert sandbox.store.executions() == {key: 1}, "executed exactly once"
    state, reason = _intent(journal, key)
    assert state == "unknown"
    assert reason is not None
    assert "this host's clock is " in reason
    assert "s behind the provider's (its Date header)" in reason
    assert "by the provider's clock now it was first sent" in reason


def test_the_same_crash_resumed_by_this_host_s_clock_alone_pays_twice(
    sandbox: SandboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness bites: with the provider's clock ignored (payonce before it read it),
    the very same journal is resent, and the provider executes the payment again."""
    journal = tmp_path / "journal.db"
    key = _crash_25_hours_ago(sandbox, journal, "order-clock")

    def unknown(settings: _drive.DriveSettings) -> Generator[_drive.Command, Any, float | None]:
        return None
        yield  # a generator that never asks

    monkeypatch.setattr(_drive, "_provider_now", unknown)
    with payonce.Client(
        base_url=sandbox.url,
        provider="sandbox",
        account=ACCOUNT,
        api_key=DEFAULT_API_KEY,
        journal=str(journal),
        clock=lambda: time.time() - HOURS_25,  # set back 25 hours, as under faketime
    ) as client:
        (result,) = client.resume()

    assert result.state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {key: 2}, "the forgotten key executed again"


@pytest.mark.slow
def test_a_worker_whose_clock_is_a_year_ahead_holds_no_intent_for_a_year(
    make_sandbox: Callable[..., SandboxServer], tmp_path: Path
) -> None:
    """Leases are between payonce's workers, dated by their own clocks: a live worker a
    year ahead writes a lease that expires a year from now. Another worker does not wait
    for it (no honest worker writes a lease that long), and does not resend what the
    year-ahead worker sent either: its first attempt is dated a year in the future."""
    journal = tmp_path / "journal.db"
    slow = make_sandbox()
    child: subprocess.Popen[str] | None = None
    try:
        # The year-ahead worker's attempt stays at the provider until the other has tried.
        with slow.holding():
            child = subprocess.Popen(
                [sys.executable, "-c", _PAY, slow.url, str(journal), "order-ahead"],
                env={**worker_env(), **libfaketime_env("+1y")},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            held = _wait_for_a_lease(journal, "order-ahead")
            assert held > time.time() + 300 * 86_400, "its lease runs a year ahead"
            assert slow.wait_held(1), "the year-ahead worker's payment never arrived"
            began = time.monotonic()
            with (
                payonce.Client(
                    base_url=slow.url,
                    provider="sandbox",
                    account=ACCOUNT,
                    api_key=DEFAULT_API_KEY,
                    journal=str(journal),
                    in_flight_wait=30.0,
                ) as client,
                pytest.raises(payonce.OutcomeUnknown, match="in the future"),
            ):
                client.post(
                    "/v1/payments",
                    json={"amount": 4200, "currency": "eur"},
                    reference="order-ahead",
                )
            assert time.monotonic() - began < 10, "not held for a year, nor for in_flight_wait"
    finally:
        if child is not None:
            child.communicate(timeout=60)
    assert slow.wait_idle()
    ((key, count),) = slow.store.executions().items()
    assert count == 1, "executed once: the year-ahead worker's attempt, never resent"
    with payonce.Client(
        base_url=slow.url,
        provider="sandbox",
        account=ACCOUNT,
        api_key=DEFAULT_API_KEY,
        journal=str(journal),
    ) as client:
        (reconciled,) = client.reconcile(key)
    assert reconciled.after is payonce.IntentState.SUCCEEDED


def _wait_for_a_lease(journal: Path, reference: str) -> float:
    """When the lease on ``reference`` expires, once a worker has written it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if journal.exists():
            with contextlib.suppress(sqlite3.OperationalError), sqlite3.connect(journal) as conn:
                row = conn.execute(
                    "SELECT lease_expires_at FROM intents WHERE reference = ?", (reference,)
                ).fetchone()
                if row is not None and row[0] is not None:
                    return float(row[0])
        time.sleep(0.05)
    raise AssertionError("the worker never journaled the intent")
