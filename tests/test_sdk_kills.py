"""The shop's checkout written with each provider's real SDK (tests/_sdk_checkout_worker.py),
its worker process SIGKILLed mid-checkout and run again for the same orders.

Through payonce (the SDK plugged in by ``payonce.integrations``, one block per order) each
payment is created once and confirmed, captured or completed once; the same code without
payonce makes duplicates. The sandbox speaking each provider's dialect runs in this process
and outlives the workers; the truth is read from its store, and the last run must have
told each order's truth.
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

pytestmark = pytest.mark.slow  # two worker processes each, each importing its SDK

WORKER = TESTS / "_sdk_checkout_worker.py"
ORDERS = 2


def sandbox_like(shared: SharedSandboxes, provider: str) -> SandboxServer:
    return shared.get(f"sdk {provider}", SandboxConfig.like(provider))  # type: ignore[arg-type]


def run_checkout(
    sdk: str,
    server: SandboxServer,
    journal: Path | None,
    *,
    crash_at: str | None = None,
    die_between_steps: bool = False,
    max_stored_bytes: int | None = None,
    split: bool = False,
) -> tuple[int, list[dict[str, str]]]:
    """Run the worker to its end or its kill: its exit code and the answers it printed."""
    command = [sys.executable, str(WORKER), "--sdk", sdk, "--url", server.url]
    command += ["--orders", str(ORDERS)]
    if journal is not None:
        command += ["--journal", str(journal)]
    if max_stored_bytes is not None:
        command += ["--max-stored-bytes", str(max_stored_bytes)]
    if die_between_steps:
        command.append("--die-between-steps")
    if split:
        command.append("--split")
    return run_checkout_worker(command, server, crash_at)


def payments_by_order(sdk: str, server: SandboxServer) -> dict[str, list[dict[str, Any]]]:
    """The payments the provider holds, by the order they were made for."""
    found: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    if sdk == "stripe":
        for intent in server.store.payment_intents():
            found[intent["metadata"]["order"]].append(intent)
    else:
        for payment in server.store.payments():
            found[payment["reference"]].append(payment)
    return dict(found)


KEYED_STEPS = {"stripe": 2, "adyen": 2, "square": 1, "mollie": 1}
KEYLESS_STEPS = {"square": 1}
"""Square's complete takes no key: the sandbox counts its executions under ``""``."""
FINAL = {"stripe": "succeeded", "adyen": "received", "square": "COMPLETED", "mollie": "paid"}

KILLS = [
    # (the SDK, how the worker dies, what the provider had executed by then)
    pytest.param("stripe", {"crash_at": "after_send:1"}, 1, id="stripe-after-step-1-was-sent"),
    pytest.param("stripe", {"die_between_steps": True}, 1, id="stripe-after-step-1-settled"),
    pytest.param("stripe", {"crash_at": "after_send:2"}, 2, id="stripe-after-step-2-was-sent"),
    pytest.param("adyen", {"crash_at": "after_send:1"}, 1, id="adyen-after-step-1-was-sent"),
    pytest.param("adyen", {"crash_at": "after_send:2"}, 2, id="adyen-after-step-2-was-sent"),
    pytest.param("square", {"crash_at": "after_send:1"}, 1, id="square-after-step-1-was-sent"),
    pytest.param("square", {"die_between_steps": True}, 1, id="square-after-step-1-settled"),
    pytest.param("mollie", {"crash_at": "after_send:1"}, 1, id="mollie-after-it-was-sent"),
]


@pytest.mark.parametrize(("sdk", "kill", "executed"), KILLS)
def test_an_sdk_checkout_killed_and_run_again_executes_each_step_once(
    shared_sandboxes: SharedSandboxes,
    tmp_path: Path,
    sdk: str,
    kill: dict[str, Any],
    executed: int,
) -> None:
    server = sandbox_like(shared_sandboxes, sdk)
    journal = tmp_path / "journal.db"
    assert run_checkout(sdk, server, journal, **kill)[0] == KILLED
    assert executions_once_arrived(server, executed) == executed

    code, answers = run_checkout(sdk, server, journal)

    assert code == 0
    by_order = payments_by_order(sdk, server)
    assert sorted(by_order) == [f"order-{n}" for n in range(ORDERS)]
    assert all(len(payments) == 1 for payments in by_order.values())
    # Each step executed once, under its own key: one key per step per order.
    executions = server.store.executions()
    keyless = executions.pop("", 0)
    assert sorted(executions.values()) == [1] * (KEYED_STEPS[sdk] * ORDERS)
    assert keyless == KEYLESS_STEPS.get(sdk, 0) * ORDERS
    # Every caller was told the truth: its order's one payment, in its final state.
    assert [(a["order"], a["status"]) for a in answers] == [
        (f"order-{n}", FINAL[sdk]) for n in range(ORDERS)
    ]
    ids = {order: payments[0]["id"] for order, payments in by_order.items()}
    assert all(ids[a["order"]] == a["id"] for a in answers)


@pytest.mark.parametrize(
    "kill",
    [
        pytest.param({"die_between_steps": True}, id="after-step-1-settled"),
        pytest.param({"crash_at": "after_send:2"}, id="after-step-2-was-sent"),
    ],
)
def test_answers_too_large_to_journal_reach_stripe_python_in_full_when_it_runs_again(
    shared_sandboxes: SharedSandboxes, tmp_path: Path, kill: dict[str, Any]
) -> None:
    # Every answer is larger than the journal keeps (status and headers only): the run
    # again replays the settled steps from the provider's own replay under their keys,
    # never as an empty body stripe-python cannot parse, and executes nothing twice.
    server = sandbox_like(shared_sandboxes, "stripe")
    journal = tmp_path / "journal.db"
    assert run_checkout("stripe", server, journal, max_stored_bytes=64, **kill)[0] == KILLED
    code, answers = run_checkout("stripe", server, journal, max_stored_bytes=64)
    assert code == 0
    ids = {
        order: intents[0]["id"] for order, intents in payments_by_order("stripe", server).items()
    }
    assert answers == [
        {
            "order": f"order-{n}",
            "id": ids[f"order-{n}"],
            "status": "succeeded",
            "parsed": "payment_intent 2000 payment_intent 2000",
        }
        for n in range(ORDERS)
    ]
    assert sorted(server.store.executions().values()) == [1] * (2 * ORDERS)
    # And run once more, every step of every order settled: all replays, all in full.
    assert run_checkout("stripe", server, journal, max_stored_bytes=64) == (0, answers)
    assert sorted(server.store.executions().values()) == [1] * (2 * ORDERS)


@pytest.mark.parametrize("sdk", ["stripe", "adyen", "square", "mollie"])
def test_the_same_sdk_checkout_without_payonce_pays_twice_when_killed_and_run_again(
    shared_sandboxes: SharedSandboxes, sdk: str
) -> None:
    server = sandbox_like(shared_sandboxes, sdk)
    # The first order's step 1 executed and answered; the process died before step 2.
    assert run_checkout(sdk, server, None, die_between_steps=True)[0] == KILLED
    assert server.store.total_executions() == 1

    code, answers = run_checkout(sdk, server, None)

    assert code == 0
    by_order = payments_by_order(sdk, server)
    # The re-run, under keys of its own, made a second payment for the same order.
    assert len(by_order["order-0"]) == 2
    assert len(by_order["order-1"]) == 1
    assert [a["order"] for a in answers] == ["order-0", "order-1"]


def test_a_square_split_payment_killed_between_its_halves_and_run_again_pays_each_half_once(
    shared_sandboxes: SharedSandboxes, tmp_path: Path
) -> None:
    # Two identical payments in one block: the second is a step of its own (a payment),
    # not a replay of the first; killed between them and run again, neither is paid twice.
    server = sandbox_like(shared_sandboxes, "square")
    journal = tmp_path / "journal.db"
    assert run_checkout("square", server, journal, die_between_steps=True, split=True)[0] == KILLED
    assert executions_once_arrived(server, 1) == 1

    code, answers = run_checkout("square", server, journal, split=True)
    assert code == 0
    assert run_checkout("square", server, journal, split=True)[0] == 0  # and once more
    by_order = payments_by_order("square", server)
    assert {order: len(payments) for order, payments in by_order.items()} == {
        f"order-{n}": 2 for n in range(ORDERS)
    }
    assert sorted(server.store.executions().values()) == [1] * (2 * ORDERS)
    # Each caller was told its two payments, the first one the run before the kill made.
    for answer in answers:
        halves = answer["id"].split(",")
        assert sorted(halves) == sorted(p["id"] for p in by_order[answer["order"]])
