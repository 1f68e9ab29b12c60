"""A two-step checkout (create, then confirm) written against plain httpx, its worker
process SIGKILLed mid-checkout and run again: with payonce's transport each PaymentIntent
is created once and confirmed once; without it, the same code pays twice.

The worker is tests/_checkout_worker.py, a real child process; the sandbox speaking
Stripe's PaymentIntents runs in this process and outlives it. The truth is read from the
sandbox's store; the worker's last run must have told each order's truth.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers.crash import KILLED, TESTS, executions_once_arrived, run_checkout_worker
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import SandboxConfig, SandboxServer

pytestmark = pytest.mark.slow  # two worker processes each, about 1.5 s

WORKER = TESTS / "_checkout_worker.py"
ORDERS = 2


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("stripe steps", SandboxConfig.like("stripe"))


def run_checkout(
    server: SandboxServer,
    journal: Path | None,
    *,
    crash_at: str | None = None,
    die_between_steps: bool = False,
) -> tuple[int, list[dict[str, str]]]:
    """Run the worker to its end or its kill: its exit code and the answers it printed."""
    command = [sys.executable, str(WORKER), "--url", server.url, "--orders", str(ORDERS)]
    if journal is not None:
        command += ["--with-payonce", "--journal", str(journal)]
    if die_between_steps:
        command.append("--die-between-steps")
    return run_checkout_worker(command, server, crash_at)


def payment_intents_by_order(server: SandboxServer) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for intent in server.store.payment_intents():
        found[intent["metadata"]["order"]].append(intent)
    return dict(found)


KILLS = [
    # (how the worker dies, what the provider had executed by then)
    pytest.param({"crash_at": "after_send:1"}, 1, id="after-step-1-was-sent"),
    pytest.param({"die_between_steps": True}, 1, id="after-step-1-settled"),
    pytest.param({"crash_at": "after_send:2"}, 2, id="after-step-2-was-sent"),
]


@pytest.mark.parametrize(("kill", "executed"), KILLS)
def test_a_checkout_killed_and_run_again_creates_and_confirms_each_intent_once(
    server: SandboxServer, tmp_path: Path, kill: dict[str, Any], executed: int
) -> None:
    journal = tmp_path / "journal.db"
    assert run_checkout(server, journal, **kill)[0] == KILLED
    assert executions_once_arrived(server, executed) == executed

    code, answers = run_checkout(server, journal)

    assert code == 0
    by_order = payment_intents_by_order(server)
    assert sorted(by_order) == [f"order-{n}" for n in range(ORDERS)]
    assert all(len(intents) == 1 for intents in by_order.values())
    assert all(intents[0]["status"] == "succeeded" for intents in by_order.values())
    # Created once and confirmed once: one execution under each key, two keys per order.
    executions = server.store.executions()
    assert sorted(executions.values()) == [1] * (2 * ORDERS)
    # Every caller was told the truth: the one intent of its order, succeeded.
    assert answers == [
        {"order": order, "id": intents[0]["id"], "status": "succeeded"}
        for order, intents in sorted(by_order.items())
    ]


def test_the_same_checkout_without_payonce_pays_twice_under_the_same_kill(
    server: SandboxServer,
) -> None:
    assert run_checkout(server, None, crash_at="after_send:1")[0] == KILLED
    assert executions_once_arrived(server, 1) == 1

    code, answers = run_checkout(server, None)

    assert code == 0
    by_order = payment_intents_by_order(server)
    # The killed process's create reached the provider; the re-run, with a fresh key, made
    # a second PaymentIntent for the same order: the duplicate payonce prevents.
    assert len(by_order["order-0"]) == 2
    assert len(by_order["order-1"]) == 1
    assert [a["order"] for a in answers] == ["order-0", "order-1"]
