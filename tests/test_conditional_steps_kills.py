"""Conditional shop code, its process SIGKILLed at a payonce crash point and run again:
every order is paid once.

A block's requests are matched with what earlier runs journaled by what they are, never by
when they come (``payonce._lifecycle._steps.place``). So the run again of "create the
PaymentIntent if the shop has none yet, then pay" (the shop has it now: the block's first
request is the payment) continues the journaled payment under its key, and "confirm
unless already confirmed" confirms once, whether the confirm executed before the kill or
not. With payonce's own verbs and with stripe-python over
``payonce.integrations.stripe.HTTPClient``, against the sandbox speaking Stripe's dialect,
on a SQLite journal file; the truth is the sandbox's count of executions per key.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import payonce
from helpers.crash import KILLED, TESTS, run_checkout_worker
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import SandboxConfig, SandboxServer

pytestmark = pytest.mark.slow  # two worker processes a test

WORKER = TESTS / "_conditional_checkout_worker.py"
ORDERS = 2
REQUESTS_PER_ORDER = 2
"""Each order's two requests that execute something: the create and the payment."""


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("sdk stripe", SandboxConfig.like("stripe"))


def run(
    server: SandboxServer,
    tmp_path: Path,
    verbs: str,
    pattern: str,
    crash_at: str | None,
    journal: str | None = None,
) -> tuple[int, list[dict[str, str]]]:
    command = [sys.executable, str(WORKER), "--verbs", verbs, "--pattern", pattern]
    command += ["--url", server.url, "--journal", journal or str(tmp_path / "journal.db")]
    command += ["--shop", str(tmp_path / "shop.json"), "--orders", str(ORDERS)]
    return run_checkout_worker(command, server, crash_at)


def killed_and_run_again(
    server: SandboxServer,
    tmp_path: Path,
    verbs: str,
    pattern: str,
    crash_at: str,
    journal: str | None = None,
) -> None:
    """Kill the checkout at ``crash_at`` (order-0's payment), run it again for the same
    orders: each order paid once, and no request journaled outside its order's block."""
    before = server.store.executions()

    killed, _ = run(server, tmp_path, verbs, pattern, crash_at, journal)
    assert killed == KILLED
    ended, answers = run(server, tmp_path, verbs, pattern, None, journal)

    assert ended == 0
    assert [answer["order"] for answer in answers] == [f"order-{n}" for n in range(ORDERS)]
    assert {answer["status"] for answer in answers} == {"succeeded"}
    executed = {
        key: count - before.get(key, 0)
        for key, count in server.store.executions().items()
        if count != before.get(key, 0)
    }
    assert sorted(executed.values()) == [1] * (ORDERS * REQUESTS_PER_ORDER), executed
    with payonce.open_journal(journal or tmp_path / "journal.db") as opened:
        intents = opened.list_intents()
    # No request journaled under a key of its own beside its order's block: one intent
    # per order (its step 1) and its one step 2, and every executed key is one of them.
    assert sorted(r.reference for r in intents) == sorted(
        name for n in range(ORDERS) for name in (f"order-{n}", f"order-{n}#step2")
    )
    assert set(executed) <= {r.key for r in intents}


@pytest.mark.parametrize("verbs", ["payonce", "stripe"])
@pytest.mark.parametrize(
    ("pattern", "crash_at"),
    [
        # Killed once the payment's last byte went out (it executes), or once its answer
        # came back (executed, nothing journaled of it): the run again skips the create.
        ("create-if-missing", "after_send:2"),
        ("create-if-missing", "after_response:2"),
        ("create-if-missing", "during_settle:2"),
        # Killed once the create executed, before the shop kept its id: the run again
        # creates again, which is the journaled create, resent under its key.
        ("create-if-missing", "after_response:1"),
        # Killed after the confirm executed (the run again finds it confirmed and asks
        # for nothing more), or after it was journaled and before it was sent (the run
        # again confirms: the journaled step, under its key).
        ("confirm-unless-confirmed", "after_response:2"),
        ("confirm-unless-confirmed", "after_write_ahead:2"),
    ],
)
def test_conditional_checkout_killed_mid_payment_and_run_again_pays_each_order_once(
    server: SandboxServer, tmp_path: Path, verbs: str, pattern: str, crash_at: str
) -> None:
    killed_and_run_again(server, tmp_path, verbs, pattern, crash_at)


@pytest.mark.parametrize("verbs", ["payonce", "stripe"])
def test_on_postgresql_the_run_again_that_skips_the_create_pays_each_order_once(
    server: SandboxServer, tmp_path: Path, postgres_url: str, verbs: str
) -> None:
    killed_and_run_again(
        server, tmp_path, verbs, "create-if-missing", "after_send:2", journal=postgres_url
    )
