"""An SDK call made outside any block: never worse than the SDK alone (release check r17r H1).

Code not migrated to blocks yet pays an order with one stripe-python call through payonce's
``HTTPClient``, outside any ``with client.intent(...)``. payonce journals it under a key drawn
for that one call (stripe-python's own is taken out, payonce draws one): that call retries and
verifies it. Killed before it was sent, the same code run again draws another key and pays.
A resume or a worker that then resent the first one would pay the order a second time, where
stripe-python alone pays once: so nothing resends it on its own. The same holds for a key the
caller passed (red-team r17i H3): payonce cannot tell ``f"order-{id}"`` from the
``str(uuid.uuid4())`` of Square's and Adyen's own examples, so it is never resent on its own
either; code run again under the same key still finds and continues it.

The real SDKs (stripe-python, Square's) in a real child process, SIGKILLed at payonce's crash
points, against the sandbox speaking their dialect; the operator's commands through the CLI.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.cli import run_cli
from helpers.crash import KILLED, TESTS, executions_once_arrived, run_checkout_worker
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

pytestmark = pytest.mark.slow  # child processes importing stripe-python, and the CLI

WORKER = TESTS / "_outside_block_worker.py"
ENV = {"PAYONCE_API_KEY": DEFAULT_API_KEY, "PAYONCE_ACCOUNT": "acct_shop"}  # the key's account


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("sdk stripe", SandboxConfig.like("stripe"))


@pytest.fixture
def square_server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("sdk square", SandboxConfig.like("square"))


def pay_outside_any_block(
    server: SandboxServer,
    journal: Path,
    order: str,
    *,
    key: str | None = None,
    crash_at: str | None = None,
    sdk: str = "stripe",
) -> tuple[int, list[dict[str, str]]]:
    command = [sys.executable, str(WORKER), "--url", server.url, "--journal", str(journal)]
    command += ["--order", order, "--sdk", sdk]
    if key is not None:
        command += ["--key", key]
    return run_checkout_worker(command, server, crash_at)


def killed_before_sending(
    server: SandboxServer, journal: Path, order: str, **how: Any
) -> payonce.IntentRecord:
    """The call outside any block, killed once journaled, before a byte was sent."""
    code, _ = pay_outside_any_block(server, journal, order, crash_at="after_write_ahead:1", **how)
    assert code == KILLED
    (left,) = intents(journal)
    assert (left.state, left.key_per_call) == (payonce.IntentState.PENDING, True)
    return left


def payment_intents_for(server: SandboxServer, order: str) -> list[dict[str, Any]]:
    return [i for i in server.store.payment_intents() if i["metadata"].get("order") == order]


def intents(journal: Path) -> list[payonce.IntentRecord]:
    with payonce.open_journal(journal, read_only=True) as opened:
        return sorted(opened.list_intents(), key=lambda record: record.created_at)


def operator(server: SandboxServer, journal: Path, *command: str, provider: str = "stripe") -> Any:
    """``payonce COMMAND`` for the shop's account at the sandbox, as an operator runs it."""
    where = ["--base-url", server.url, "--journal", str(journal)]
    if command[0] != "reconcile":
        where += ["--provider", provider, "--account", "acct_shop"]
    return run_cli([*command, *where], env=ENV, secrets=[DEFAULT_API_KEY])


RECOVERIES = {
    "payonce resume": ("resume",),
    "payonce worker": ("worker", "--once"),
}


@pytest.mark.parametrize("recovery", sorted(RECOVERIES))
def test_a_call_outside_any_block_killed_then_paid_by_a_run_again_is_never_paid_again(
    server: SandboxServer, tmp_path: Path, recovery: str, caplog: pytest.LogCaptureFixture
) -> None:
    journal = tmp_path / "journal.db"
    order = f"OC-{recovery.split()[-1]}"
    # Killed once journaled, before a byte was sent: the call never executed.
    code, _ = pay_outside_any_block(server, journal, order, crash_at="after_write_ahead:1")
    assert code == KILLED
    (left,) = intents(journal)
    assert (left.state, left.key_per_call, left.attempt_count) == (
        payonce.IntentState.PENDING,
        True,
        1,
    )
    assert payment_intents_for(server, order) == []

    # The same code run again: stripe-python draws another key, and pays.
    code, [paid] = pay_outside_any_block(server, journal, order)
    assert (code, paid["status"]) == (0, "succeeded")

    caplog.set_level(logging.INFO, logger="payonce")
    recovered = operator(server, journal, *RECOVERIES[recovery])

    # Nothing resent the first call: the order is paid once, as stripe-python alone pays it.
    server.wait_idle()
    assert [i["id"] for i in payment_intents_for(server, order)] == [paid["id"]]
    assert recovered.exit_code == 1, recovered.output  # an unknown intent is left to judge
    if recovery == "payonce worker":
        # It only marked the intent unknown: the pass says it sent nothing.
        assert "worker pass: 0 sent, 0 settled, 0 still pending, 1 still unknown" in caplog.text
    first, again = intents(journal)
    assert (first.key, first.state) == (left.key, payonce.IntentState.UNKNOWN)
    assert (again.state, again.key_per_call) == (payonce.IntentState.SUCCEEDED, True)
    reason = first.unknown_reason or ""
    assert "outside any intent block under a key drawn for that one call" in reason
    assert "may have run again since under another key" in reason
    assert f"payonce reconcile {first.key} --resend" in reason

    # A reconciliation looks it up and finds nothing: it stays unknown, never sent.
    looked = operator(server, journal, "reconcile", first.key, "--json")
    (result,) = json.loads(looked.stdout)
    assert (result["outcome"], result["after"]) == ("not_found", "unknown")
    assert [i["id"] for i in payment_intents_for(server, order)] == [paid["id"]]
    assert operator(server, journal, *RECOVERIES[recovery]).exit_code == 1
    assert [i["id"] for i in payment_intents_for(server, order)] == [paid["id"]]

    # An operator sure that it was never paid may still have it sent: that is a decision.
    forced = operator(server, journal, "reconcile", first.key, "--resend", "--json")
    assert forced.exit_code == 0, forced.output
    assert len(payment_intents_for(server, order)) == 2


def test_a_call_outside_any_block_that_executed_is_settled_by_its_look_up_not_resent(
    server: SandboxServer, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.db"
    order = "OC-executed"
    # Killed once its request was out: Stripe executed it, its answer never came back.
    code, _ = pay_outside_any_block(server, journal, order, crash_at="after_send:1")
    assert code == KILLED
    assert executions_once_arrived(server, 1) >= 1
    (executed,) = payment_intents_for(server, order)

    resumed = operator(server, journal, "resume")

    assert resumed.exit_code == 1, resumed.output
    (record,) = intents(journal)
    assert record.state is payonce.IntentState.UNKNOWN  # not resent, not even replayed
    looked = operator(server, journal, "reconcile", record.key)
    assert looked.exit_code == 0, looked.output
    (record,) = intents(journal)
    assert record.state is payonce.IntentState.SUCCEEDED  # Stripe's search found it
    assert [i["id"] for i in payment_intents_for(server, order)] == [executed["id"]]


def test_a_key_the_caller_set_outside_any_block_is_never_resumed_only_resent_by_an_operator(
    server: SandboxServer, tmp_path: Path
) -> None:
    # It was resumed once, as a block's would be. But outside a block payonce cannot tell
    # this key from a uuid4 drawn per call (Square's and Adyen's examples), and resending
    # one of those pays twice: so a caller's key is journaled per call too (r17i H3).
    journal = tmp_path / "journal.db"
    order = "OC-caller-key"
    left = killed_before_sending(server, journal, order, key="shop-OC-caller-key")
    assert left.key == "shop-OC-caller-key"

    resumed = operator(server, journal, "resume")

    assert resumed.exit_code == 1, resumed.output
    (record,) = intents(journal)
    assert record.state is payonce.IntentState.UNKNOWN  # left to judge, not resent
    assert "or one the caller passed" in (record.unknown_reason or "")
    assert payment_intents_for(server, order) == []
    # Stripe's search finds no payment under it: the operator has it sent, once.
    forced = operator(server, journal, "reconcile", record.key, "--resend", "--json")
    assert forced.exit_code == 0, forced.output
    (paid,) = payment_intents_for(server, order)
    # The code run again names the same key: it finds its intent, the answer replayed.
    code, [again] = pay_outside_any_block(server, journal, order, key="shop-OC-caller-key")
    assert (code, again["id"]) == (0, paid["id"])
    assert len(payment_intents_for(server, order)) == 1


def test_a_key_the_caller_set_outside_any_block_is_continued_by_its_run_again(
    server: SandboxServer, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.db"
    order = "OC-caller-key-again"
    killed_before_sending(server, journal, order, key="shop-OC-again")

    # Run again before anyone resumed it: the same key finds its intent and finishes it.
    code, [paid] = pay_outside_any_block(server, journal, order, key="shop-OC-again")
    assert (code, paid["status"]) == (0, "succeeded")
    resumed = operator(server, journal, "resume")

    assert resumed.exit_code == 0, resumed.output
    (record,) = intents(journal)
    assert (record.key, record.state) == ("shop-OC-again", payonce.IntentState.SUCCEEDED)
    assert [i["id"] for i in payment_intents_for(server, order)] == [paid["id"]]


def test_square_s_own_example_outside_any_block_killed_run_again_and_resumed_pays_once(
    square_server: SandboxServer, tmp_path: Path
) -> None:
    # Square's example passes idempotency_key=str(uuid.uuid4()): a key of the caller's,
    # honoured by default, and a new one on every run (red-team r17i H3).
    journal = tmp_path / "journal.db"
    order = "OC-square"
    left = killed_before_sending(square_server, journal, order, sdk="square")

    code, [paid] = pay_outside_any_block(square_server, journal, order, sdk="square")
    assert (code, paid["status"]) == (0, "COMPLETED")
    resumed = operator(square_server, journal, "resume", provider="square")

    square_server.wait_idle()
    paid_for_order = [p for p in square_server.store.payments() if p["reference"] == order]
    assert [p["id"] for p in paid_for_order] == [paid["id"]]
    assert resumed.exit_code == 1, resumed.output  # the first is left unknown, to judge
    first, again = intents(journal)
    assert (first.key, first.state) == (left.key, payonce.IntentState.UNKNOWN)
    assert "drawn for that one call" in (first.unknown_reason or "")
    assert again.state is payonce.IntentState.SUCCEEDED
