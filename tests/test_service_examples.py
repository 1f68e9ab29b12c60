"""The service examples, run as they would be deployed: real processes, really killed.

The checkout service (examples/checkout_service.py, stripe-python over payonce) runs under
uvicorn in a child process; the sandbox speaking Stripe's API runs in this test process, so
it outlives the child and its store says what was really executed. The resume worker
(examples/resume_worker.py) runs as a child process over a journal this test left pending
and unknown intents in.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.payments import PAYMENT, DiesAfterSending, free_port
from helpers.processes import deployed_env, run_example
from helpers.services import CheckoutService, wait_for
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxConfig, SandboxServer


def _example_env(tmp_path: Path, server: SandboxServer, journal: Path) -> dict[str, str]:
    """The environment of a deployed example: only PAYONCE_* settings, nothing of ours."""
    return deployed_env(
        tmp_path / "example-home",
        PAYONCE_BASE_URL=server.url,
        PAYONCE_PROVIDER="sandbox",
        PAYONCE_ACCOUNT=DEFAULT_ACCOUNT,
        PAYONCE_API_KEY=DEFAULT_API_KEY,
        PAYONCE_JOURNAL=str(journal),
    )


# -- the checkout service ---------------------------------------------------------------------


@pytest.fixture
def stripe_sandbox(closing: contextlib.ExitStack) -> SandboxServer:
    """``payonce sandbox --like stripe``, in this process: it outlives the service, and its
    store says what Stripe would have executed."""
    return closing.enter_context(SandboxServer(SandboxConfig.like("stripe")))


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Callable[[SandboxServer], CheckoutService]]:
    services: list[CheckoutService] = []

    def make(server: SandboxServer) -> CheckoutService:
        # The same port across restarts, as behind a load balancer.
        service = CheckoutService(tmp_path, server.url, free_port())
        services.append(service)
        return service

    yield make
    for service in services:
        service.stop()


class _PayInBackground:
    """A customer's pay request, sent from a thread: the service dies before answering it."""

    def __init__(self, service: CheckoutService, order_id: str) -> None:
        self.outcome: httpx.Response | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(service, order_id), daemon=True)
        self._thread.start()

    def _run(self, service: CheckoutService, order_id: str) -> None:
        try:
            self.outcome = service.pay(order_id)
        except BaseException as exc:
            self.outcome = exc

    def join(self) -> httpx.Response | BaseException | None:
        self._thread.join(60)
        return self.outcome


def _intents_by_order(server: SandboxServer) -> dict[str, list[dict[str, Any]]]:
    """The PaymentIntents the sandbox holds, by the order their metadata names."""
    found: dict[str, list[dict[str, Any]]] = {}
    for intent in server.store.payment_intents():
        found.setdefault(intent["metadata"]["order"], []).append(intent)
    return found


def _paid_once(server: SandboxServer, *orders: str) -> dict[str, str]:
    """Each order has one PaymentIntent at the sandbox, succeeded, and nothing executed
    twice under a key; the PaymentIntent id of each."""
    assert server.wait_idle()
    by_order = _intents_by_order(server)
    assert sorted(by_order) == sorted(orders), by_order
    for order, intents in by_order.items():
        assert [i["status"] for i in intents] == ["succeeded"], (order, intents)
    executions = server.store.executions()
    assert set(executions.values()) == {1}, executions
    assert len(executions) == 2 * len(orders), executions  # a create and a confirm each
    return {order: intents[0]["id"] for order, intents in by_order.items()}


CRASHES = {
    # SIGKILLed from outside while Stripe is creating the order's PaymentIntent: Stripe
    # finishes it without the service, which never hears the answer.
    "killed-while-stripe-creates": None,
    # Killed by payonce's named crash points (src/payonce/_crash.py): once Stripe answered
    # the create, before the answer was journaled; once the confirm's last byte left; in
    # the middle of journaling the confirm's answer.
    "after-the-create-answered": "after_response:1",
    "after-the-confirm-left": "after_send:2",
    "while-journaling-the-confirm": "during_settle:2",
}


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", list(CRASHES.values()), ids=list(CRASHES))
def test_the_checkout_service_killed_mid_payment_pays_each_order_once(
    stripe_sandbox: SandboxServer,
    service_factory: Callable[[SandboxServer], CheckoutService],
    crash_at: str | None,
) -> None:
    server = stripe_sandbox
    service = service_factory(server).start(crash_at=crash_at)

    if crash_at is None:
        with server.holding():
            customer = _PayInBackground(service, "1001")
            assert server.wait_held(1, timeout=30), service.output
            assert server.store.total_executions() == 0, "killed too late"
            service.kill()
        # Let go, Stripe creates the PaymentIntent for a service that is gone.
    else:
        customer = _PayInBackground(service, "1001")
        service.wait_killed()
    outcome = customer.join()
    assert isinstance(outcome, httpx.TransportError), f"the customer got an answer: {outcome!r}"
    # The create had left: Stripe makes the PaymentIntent, perhaps only now on a loaded machine.
    wait_for(lambda: len(server.store.payment_intents()) == 1, "the create to reach Stripe")
    assert server.wait_idle()

    # Restarted, the service first runs the block of the order it was killed paying: the
    # create replays (Stripe's answer, under the same key) and the confirm goes on.
    service.start()
    assert "finished order-1001" in service.output, service.output
    status = service.order("1001")
    assert status.status_code == 200, status.text
    assert status.json()["state"] == "paid", status.json()

    # The customer, who never got an answer, pays the order again: paid, once.
    again = service.pay("1001")
    assert again.status_code == 200, again.text
    assert again.json()["state"] == "paid"
    # And the restarted service takes new orders as usual.
    other = service.pay("1002")
    assert other.status_code == 200, other.text

    intent_ids = _paid_once(server, "1001", "1002")
    assert again.json()["payment_intent"] == intent_ids["1001"]
    assert other.json()["payment_intent"] == intent_ids["1002"]
    assert "Traceback" not in service.output, service.output


@pytest.mark.slow
def test_the_checkout_service_killed_again_while_finishing_at_start_up_still_pays_once(
    stripe_sandbox: SandboxServer, service_factory: Callable[[SandboxServer], CheckoutService]
) -> None:
    """Killed twice in a row (the second time while finishing the order at start-up), then
    started for good and the order retried: still one PaymentIntent, confirmed once."""
    server = stripe_sandbox
    service = service_factory(server).start(crash_at="after_send:1")
    killed = _PayInBackground(service, "1003")
    service.wait_killed()
    assert isinstance(killed.join(), httpx.TransportError)
    wait_for(lambda: len(server.store.payment_intents()) == 1, "the create to reach Stripe")
    assert server.wait_idle()

    # Started again, it dies in its start-up, journaling the create's outcome it got back.
    service.launch(crash_at="during_settle:1")
    service.wait_killed()
    assert "finished order-1003" not in service.output

    service.start()
    paid = service.pay("1003")
    assert paid.status_code == 200, paid.text
    assert paid.json()["state"] == "paid"
    _paid_once(server, "1003")


@pytest.mark.slow
def test_the_checkout_service_answers_each_outcome_as_documented(
    stripe_sandbox: SandboxServer, service_factory: Callable[[SandboxServer], CheckoutService]
) -> None:
    server = stripe_sandbox
    service = service_factory(server).start()

    assert service.order("404").status_code == 404

    first = service.pay("2001")
    assert first.status_code == 200, first.text
    assert first.json()["state"] == "paid"

    # The same order with another amount: refused before anything is sent.
    mismatch = service.pay("2001", amount=9900)
    assert mismatch.status_code == 409, mismatch.text

    # A declined card: the order waits for another card, which pays it in the same block
    # (the decline passed over), once.
    declined = service.pay("2002", card="pm_card_chargeDeclined")
    assert declined.status_code == 402, declined.text
    assert declined.json()["state"] == "declined"
    paid = service.pay("2002", card="pm_card_visa")
    assert paid.status_code == 200, paid.text
    assert paid.json()["state"] == "paid"
    assert service.pay("2002", card="pm_card_visa").json()["state"] == "paid"

    # Stripe answers 503 to every attempt of the create: maybe created, never resent blindly.
    server.script(["fail_before"] * 5)
    unknown = service.pay("2003")
    assert unknown.status_code == 202, unknown.text
    assert unknown.json()["state"] == "unknown"
    assert service.order("2003").json()["state"] == "unknown"

    assert server.wait_idle()
    by_order = _intents_by_order(server)
    assert sorted(by_order) == ["2001", "2002"], by_order
    assert [i["status"] for i in by_order["2002"]] == ["succeeded"]
    assert set(server.store.executions().values()) == {1}
    assert "Traceback" not in service.output, service.output


# -- the resume worker ------------------------------------------------------------------------


def _run_worker(
    tmp_path: Path, server: SandboxServer, journal: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    env = {**_example_env(tmp_path, server, journal), **env}
    return run_example("resume_worker.py", "--once", cwd=tmp_path, env=env)


def _payment(reference: str) -> dict[str, Any]:
    return {**PAYMENT, "reference": reference}


def _states(journal: Path) -> dict[str, payonce.IntentState]:
    with payonce.journal.SQLiteJournal(journal) as opened:
        return {r.reference or r.key: r.state for r in opened.list_intents()}


def test_the_resume_worker_settles_pending_and_unknown_intents_each_executed_once(
    tmp_path: Path,
    sandbox: SandboxServer,
    journal_path: Path,
    make_client: Callable[..., payonce.Client],
) -> None:
    once = payonce.RetryPolicy(max_attempts=1)

    # Two workers died right after their request left: pending, executed by the provider.
    for reference in ("order-1", "order-2"):
        with pytest.raises(RuntimeError, match="worker died"):
            make_client(transport=DiesAfterSending()).post(
                "/v1/payments", json=_payment(reference), reference=reference
            )
    # The provider executed it and the answer was lost: unknown, and it did happen.
    sandbox.script(["drop_after"])
    with pytest.raises(payonce.OutcomeUnknown):
        make_client(retry=once).post("/v1/payments", json=_payment("order-3"), reference="order-3")
    # A 503 that came before executing: unknown, and it did not happen.
    sandbox.script(["fail_before"])
    with pytest.raises(payonce.OutcomeUnknown):
        make_client(retry=once).post("/v1/payments", json=_payment("order-4"), reference="order-4")
    # The provider could not be reached at all: pending, provably never sent.
    down = make_client(base_url=f"http://127.0.0.1:{free_port()}", retry=once)
    with pytest.raises(payonce.ProviderUnavailable):
        down.post("/v1/payments", json=_payment("order-5"), reference="order-5")

    assert _states(journal_path) == {
        "order-1": "pending",
        "order-2": "pending",
        "order-3": "unknown",
        "order-4": "unknown",
        "order-5": "pending",
    }
    assert server_executions_by_reference(sandbox) == {"order-1": 1, "order-2": 1, "order-3": 1}

    result = _run_worker(tmp_path, sandbox, journal_path)

    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert _states(journal_path) == {f"order-{n}": "succeeded" for n in range(1, 6)}
    assert server_executions_by_reference(sandbox) == {f"order-{n}": 1 for n in range(1, 6)}
    assert max(sandbox.store.executions().values()) == 1
    assert "pass over 5 intent(s): 5 succeeded; 0 still pending, 0 still unknown" in result.stdout
    assert "Traceback" not in result.stderr, result.stderr

    # A second pass finds nothing to do and sends nothing.
    again = _run_worker(tmp_path, sandbox, journal_path)
    assert again.returncode == 0, f"stdout:\n{again.stdout}\nstderr:\n{again.stderr}"
    assert "pass over 0 intent(s): nothing to do" in again.stdout
    assert sandbox.store.total_executions() == 5


def server_executions_by_reference(server: SandboxServer) -> dict[str, int]:
    counts: dict[str, int] = {}
    for payment in server.store.payments():
        counts[payment["reference"]] = counts.get(payment["reference"], 0) + 1
    return counts


@pytest.mark.slow
def test_the_resume_worker_exits_1_while_the_provider_is_unreachable(
    tmp_path: Path,
    sandbox: SandboxServer,
    journal_path: Path,
    make_client: Callable[..., payonce.Client],
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    down = make_client(base_url=closed, retry=payonce.RetryPolicy(max_attempts=1))
    with pytest.raises(payonce.ProviderUnavailable):
        down.post("/v1/payments", json=_payment("order-1"), reference="order-1")

    still_down = _run_worker(tmp_path, sandbox, journal_path, PAYONCE_BASE_URL=closed)

    assert still_down.returncode == 1, f"stdout:\n{still_down.stdout}\nstderr:\n{still_down.stderr}"
    assert "1 still pending, 0 still unknown" in still_down.stdout
    assert _states(journal_path) == {"order-1": "pending"}
    assert sandbox.store.total_executions() == 0

    # Run again once the provider is back: sent under the same key, executed once.
    back = _run_worker(tmp_path, sandbox, journal_path)

    assert back.returncode == 0, f"stdout:\n{back.stdout}\nstderr:\n{back.stderr}"
    assert _states(journal_path) == {"order-1": "succeeded"}
    assert server_executions_by_reference(sandbox) == {"order-1": 1}


def test_the_resume_worker_refuses_a_journal_that_does_not_exist(
    tmp_path: Path, sandbox: SandboxServer
) -> None:
    missing = tmp_path / "nowhere" / "journal.db"

    result = _run_worker(tmp_path, sandbox, missing)

    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert f"error: no journal at {missing}" in result.stderr
    assert not missing.exists()
