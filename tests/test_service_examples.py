"""The service examples, run as they would be deployed: real processes, really killed.

The checkout service (examples/checkout_service.py) runs under uvicorn in a child
process; the sandbox provider runs in this test process, so it outlives the child and its
store says what was really executed. The resume worker (examples/resume_worker.py) runs as
a child process over a journal this test left pending and unknown intents in.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.payments import PAYMENT, DiesAfterSending, free_port
from helpers.processes import EXAMPLES, deployed_env, run_example
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxServer


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


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def _keys_in_progress(server: SandboxServer) -> list[str]:
    """Keys the provider has in hand and has not finished executing (read from its store)."""
    with contextlib.closing(sqlite3.connect(server.store.path)) as db:
        rows = db.execute("SELECT key FROM idempotency_keys WHERE state = 'in_progress'")
        return [row[0] for row in rows]


# -- the checkout service ---------------------------------------------------------------------


class Service:
    """examples/checkout_service.py under uvicorn, in a child process of its own."""

    def __init__(self, env: dict[str, str], log: Path, port: int) -> None:
        self.env = env
        self.log = log
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, crash_at: str | None = None) -> Service:
        env = dict(self.env)
        if crash_at is not None:
            env["PAYONCE_CRASH_AT"] = crash_at
        command = [
            sys.executable, "-m", "uvicorn", "checkout_service:app",
            "--app-dir", str(EXAMPLES),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--loop", "asyncio", "--http", "h11", "--ws", "none", "--lifespan", "on",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            log.write(f"--- start (PAYONCE_CRASH_AT={crash_at})\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command, env=env, cwd=self.log.parent, stdout=log, stderr=subprocess.STDOUT
            )
        _wait_for(self._ready, "the checkout service to start")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"the checkout service exited ({self.process.returncode}):\n{self.output}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_killed(self) -> None:
        assert self.process is not None
        assert self.process.wait(timeout=30) == -signal.SIGKILL, self.output

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.wait_killed()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def pay(self, order_id: str, payment: dict[str, Any] = PAYMENT) -> httpx.Response:
        return httpx.post(f"{self.url}/orders/{order_id}/pay", json=payment, timeout=30.0)

    def order(self, order_id: str) -> httpx.Response:
        return httpx.get(f"{self.url}/orders/{order_id}", timeout=10.0)


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Callable[[SandboxServer], Service]]:
    services: list[Service] = []

    def make(server: SandboxServer) -> Service:
        env = _example_env(tmp_path, server, tmp_path / "checkout-journal.db")
        # The same port across restarts, as behind a load balancer.
        service = Service(env, tmp_path / "service.log", free_port())
        services.append(service)
        return service

    yield make
    for service in services:
        service.stop()


class _PayInBackground:
    """A customer's pay request, sent from a thread: the service dies before answering it."""

    def __init__(self, service: Service, order_id: str) -> None:
        self.outcome: httpx.Response | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(service, order_id), daemon=True)
        self._thread.start()

    def _run(self, service: Service, order_id: str) -> None:
        try:
            self.outcome = service.pay(order_id)
        except BaseException as exc:
            self.outcome = exc

    def join(self) -> httpx.Response | BaseException | None:
        self._thread.join(30)
        return self.outcome


CRASHES = {
    # SIGKILLed from outside while the provider is processing the charge: the provider
    # finishes it without the service, which never hears the answer.
    "killed-while-the-provider-processes": None,
    # Killed at payonce's named crash points (src/payonce/_crash.py): before anything was
    # sent; after the provider answered, before the answer was journaled; in the middle of
    # journaling it.
    "after-write-ahead": "after_write_ahead:1",
    "after-response": "after_response:1",
    "during-settle": "during_settle:1",
}


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", list(CRASHES.values()), ids=list(CRASHES))
def test_the_checkout_service_killed_mid_request_charges_the_order_exactly_once(
    make_sandbox: Callable[..., SandboxServer],
    service_factory: Callable[[SandboxServer], Service],
    crash_at: str | None,
) -> None:
    # The provider takes its time with each charge, so a request can be caught in the middle.
    server = make_sandbox(processing_seconds=1.0)
    service = service_factory(server).start(crash_at=crash_at)

    customer = _PayInBackground(service, "1001")
    if crash_at is None:
        _wait_for(lambda: bool(_keys_in_progress(server)), "the provider to receive the charge")
        assert server.store.total_executions() == 0, "killed too late: the charge had finished"
        service.kill()
    else:
        service.wait_killed()
    outcome = customer.join()
    assert isinstance(outcome, httpx.TransportError), f"the customer got an answer: {outcome!r}"

    # What the provider had in hand runs to its end without the service. (The test waits
    # for that: a service restarted sooner would get "in progress" 409s, and if its retries
    # ran out first, leave the order unknown for the resume worker to reconcile.)
    executed_while_down = 0 if crash_at == "after_write_ahead:1" else 1
    _wait_for(
        lambda: (
            server.store.total_executions() == executed_while_down and not _keys_in_progress(server)
        ),
        "the provider to finish what it had received",
    )

    # Restarted, the service first finishes the payment it was killed in the middle of.
    service.start()
    status = service.order("1001")
    assert status.status_code == 200, status.text
    recovered = status.json()
    assert recovered["state"] == "succeeded", recovered
    key = recovered["idempotency_key"]
    payment_id = recovered["payment"]["id"]
    assert f"recovered order-1001 ({key})" in service.output
    assert server.store.executions() == {key: 1}
    (payment,) = server.store.payments()
    assert payment["id"] == payment_id
    assert payment["reference"] == "order-1001"

    # The customer's browser sends the same pay request again: the stored outcome comes
    # back from the journal, the card is not charged a second time.
    again = service.pay("1001")
    assert again.status_code == 200, again.text
    body = again.json()
    assert body["replayed"] is True
    assert body["idempotency_key"] == key
    assert body["payment"]["id"] == payment_id
    assert server.store.executions() == {key: 1}
    assert server.store.total_executions() == 1

    # And the restarted service takes new orders as usual.
    other = service.pay("1002")
    assert other.status_code == 200, other.text
    assert other.json()["replayed"] is False
    assert server.store.total_executions() == 2
    assert "Traceback" not in service.output, service.output


@pytest.mark.slow
def test_the_checkout_service_answers_each_outcome_as_documented(
    sandbox: SandboxServer, service_factory: Callable[[SandboxServer], Service]
) -> None:
    server = sandbox
    service = service_factory(server).start()

    assert service.order("404").status_code == 404

    first = service.pay("2001")
    assert first.status_code == 200, first.text
    assert first.json()["replayed"] is False

    # The same order with another amount: refused before anything is sent.
    mismatch = service.pay("2001", {"amount": 9900, "currency": "eur"})
    assert mismatch.status_code == 409, mismatch.text
    assert mismatch.json()["state"] == "mismatch"

    # A declined card (the sandbox declines 402.00): journaled, replayed, tried once.
    declined = service.pay("2002", {"amount": 40200, "currency": "eur"})
    assert declined.status_code == 402, declined.text
    assert declined.json()["provider_response"]["error"]["code"] == "card_declined"
    assert service.pay("2002", {"amount": 40200, "currency": "eur"}).status_code == 402
    assert service.order("2002").json()["state"] == "failed"

    # The provider answers 503 to every attempt: maybe charged, so never resent blindly.
    server.script(["fail_before"] * 5)
    unknown = service.pay("2003")
    assert unknown.status_code == 202, unknown.text
    assert unknown.json()["state"] == "unknown"
    assert service.order("2003").json()["state"] == "unknown"

    executions = server.store.executions()
    assert sorted(executions.values()) == [1, 1], executions
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
