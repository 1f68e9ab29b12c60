"""Clients shared across os.fork() (gunicorn --preload, a master that resumed at start-up):
each child pays with connections of its own and journals only its own answers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.payments import FAST_RETRY, PAYMENT
from payonce._journal import _acks
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer
from payonce.webhooks import sign

CHILDREN, EACH = 4, 25


def _in_children(work: Callable[[int], None], *, within: float = 60.0) -> list[int]:
    """Run ``work(n)`` in CHILDREN forked processes at once; their exit codes. A child still
    running after ``within`` seconds (stuck on a connection it shares with another) is
    killed, and reported as killed (-9)."""
    go_read, go_write = os.pipe()
    pids = []
    for n in range(CHILDREN):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                os.read(go_read, 1)  # all start at once, as a preforked server's workers do
                work(n)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    os.write(go_write, b"x" * CHILDREN)
    os.close(go_read)
    os.close(go_write)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + within
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes and (done := os.waitpid(pid, os.WNOHANG))[0] == pid:
                codes[pid] = os.waitstatus_to_exitcode(done[1])
        if time.monotonic() > deadline:
            for pid in set(pids) - set(codes):
                os.kill(pid, signal.SIGKILL)
                codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.01)
    return [codes[pid] for pid in pids]


def _amount(n: int, i: int) -> int:
    return 1000 + 100 * n + i


def _assert_each_answer_is_its_own(journal_at: Path | str, sandbox: SandboxServer) -> None:
    with payonce.open_journal(journal_at) as journal:
        records = journal.list_intents()
        assert len(records) == 1 + CHILDREN * EACH
        for record in records:
            assert record.state is payonce.IntentState.SUCCEEDED, record.reference
            assert record.response is not None
            asked, answered = json.loads(record.body), json.loads(record.response.body)
            assert answered["amount"] == asked["amount"], f"{record.reference} got another's"
    assert sandbox.store.total_executions() == 1 + CHILDREN * EACH
    assert set(sandbox.store.executions().values()) == {1}


@pytest.mark.slow
def test_children_of_a_client_that_already_paid_journal_only_their_own_answers(
    make_sandbox: Callable[..., SandboxServer], location: str
) -> None:
    """On SQLite and on PostgreSQL: the journal's connections are the child's own too."""
    # Slow enough that the children's requests overlap, as a busy service's do.
    sandbox = make_sandbox(processing_seconds=0.05)
    client = payonce.Client(
        base_url=sandbox.url,
        provider="sandbox",
        account="acct_demo",
        api_key=DEFAULT_API_KEY,
        journal=location,
        retry=FAST_RETRY,
    )
    # A pooled keep-alive connection and an open SQLite handle, both inherited below.
    client.post("/v1/payments", json=PAYMENT, reference="in-the-parent")

    def pay(n: int) -> None:
        for i in range(EACH):
            amount = _amount(n, i)
            paid = client.post(
                "/v1/payments", json={"amount": amount, "currency": "eur"}, reference=f"c{n}-{i}"
            )
            assert paid.json()["amount"] == amount

    assert _in_children(pay) == [0] * CHILDREN
    client.post("/v1/payments", json=PAYMENT, reference="in-the-parent")  # still works here
    client.close()
    _assert_each_answer_is_its_own(location, sandbox)


@pytest.mark.slow
def test_children_of_a_transport_that_already_paid_journal_only_their_own_answers(
    make_sandbox: Callable[..., SandboxServer], journal_path: Path
) -> None:
    sandbox = make_sandbox(processing_seconds=0.05)
    client = payonce.Client(
        base_url=sandbox.url,
        provider="sandbox",
        account="acct_demo",
        journal=journal_path,
        retry=FAST_RETRY,
        transport_only=True,
    )
    headers = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
    # httpx code over payonce's transport, with a pooled connection inherited below.
    http = httpx.Client(base_url=sandbox.url, transport=client.transport(), headers=headers)
    with client.intent("in-the-parent"):
        http.post("/v1/payments", json=PAYMENT)

    def pay(n: int) -> None:
        for i in range(EACH):
            amount = _amount(n, i)
            with client.intent(f"c{n}-{i}"):
                paid = http.post("/v1/payments", json={"amount": amount, "currency": "eur"})
            assert paid.json()["amount"] == amount

    assert _in_children(pay) == [0] * CHILDREN
    with client.intent("in-the-parent"):
        http.post("/v1/payments", json=PAYMENT)  # still works here, replayed
    http.close()
    client.close()
    _assert_each_answer_is_its_own(journal_path, sandbox)


def test_children_of_an_async_client_that_already_paid_pay_with_their_own_connections(
    sandbox: SandboxServer, location: str
) -> None:
    """On SQLite and on PostgreSQL, whose writes run on the loop's own async connections:
    a child's new loop opens its own, and the parent's still serve the parent."""

    def pay(client: payonce.AsyncClient, n: int) -> None:
        async def payments() -> None:
            for i in range(EACH):
                amount = _amount(n, i)
                body = {"amount": amount, "currency": "eur"}
                paid = await client.post("/v1/payments", json=body, reference=f"c{n}-{i}")
                assert paid.json()["amount"] == amount
            await client.aclose()

        # The child's own event loop, in a thread: the parent's, inherited mid-run, is dead.
        outcome: list[BaseException] = []
        runner = threading.Thread(target=lambda: _run_catching(payments, outcome))
        runner.start()
        runner.join()
        assert not outcome, outcome

    async def parent() -> list[int]:
        async with payonce.AsyncClient(
            base_url=sandbox.url,
            provider="sandbox",
            account="acct_demo",
            api_key=DEFAULT_API_KEY,
            journal=location,
            retry=FAST_RETRY,
        ) as client:
            await client.post("/v1/payments", json=PAYMENT, reference="in-the-parent")
            codes = _in_children(lambda n: pay(client, n))
            # Still works here, on the connections the children never touched: replayed.
            again = await client.post("/v1/payments", json=PAYMENT, reference="in-the-parent")
            assert again.is_success
            return codes

    assert asyncio.run(parent()) == [0] * CHILDREN
    _assert_each_answer_is_its_own(location, sandbox)


def _run_catching(
    coroutine: Callable[[], Coroutine[Any, Any, None]], into: list[BaseException]
) -> None:
    try:
        asyncio.run(coroutine())
    except BaseException as exc:
        into.append(exc)


def test_children_of_a_webhook_inbox_handle_events_with_their_own_lease_keeper(
    journal_path: Path,
) -> None:
    inbox = payonce.WebhookInbox(journal_path, "whsec_test", lease_seconds=0.9)

    def event(event_id: str) -> tuple[bytes, dict[str, str]]:
        body = json.dumps({"id": event_id, "type": "payment.succeeded"}).encode()
        return body, {"Stripe-Signature": sign(body, ["whsec_test"])}

    inbox.receive(*event("evt_parent"), lambda e: None)

    def slow_handler(received: payonce.webhooks.Event) -> None:
        before = inbox.event(received.id)
        time.sleep(1.2)  # longer than the lease: only a keeper running in this child renews it
        after = inbox.event(received.id)
        assert before is not None
        assert after is not None
        assert after.lease_owner == before.lease_owner, "still this handler's lease"
        assert before.lease_expires_at is not None
        assert after.lease_expires_at is not None
        assert after.lease_expires_at > before.lease_expires_at, "renewed meanwhile"

    def handle(n: int) -> None:
        delivery = inbox.receive(*event(f"evt_{n}"), slow_handler)
        assert delivery.outcome.value == "handled"

    assert _in_children(handle) == [0] * CHILDREN
    with payonce.journal.SQLiteJournal(journal_path) as journal:
        events = journal.list_events()
    assert sorted(e.event_id for e in events) == ["evt_0", "evt_1", "evt_2", "evt_3", "evt_parent"]
    assert all(e.handler_runs == 1 and e.processed for e in events)
    inbox.close()


def test_a_child_writes_its_own_acknowledgements_and_leaves_its_parents_to_the_parent(
    sandbox: SandboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block's acknowledgement waits in the journal object's memory until its next
    write: a child inherits that memory, but starts with none of its own."""
    monkeypatch.setattr(_acks, "FLUSH_DELAY", 3600.0)  # only the writes below write them
    journal_path = tmp_path / "journal.db"
    client = payonce.Client(
        base_url=sandbox.url,
        provider="sandbox",
        api_key=DEFAULT_API_KEY,
        journal=journal_path,
        retry=FAST_RETRY,
    )
    with client.intent("order-parent") as op:
        op.post("/v1/payments", json=PAYMENT)

    def child(n: int) -> None:
        with client.intent(f"order-child-{n}") as op:
            op.post("/v1/payments", json={**PAYMENT, "amount": _amount(n, 0)})
        client.close()  # writes the child's acknowledgement, and only the child's

    assert _in_children(child) == [0] * CHILDREN

    def acknowledged() -> dict[str, bool]:
        with payonce.open_journal(journal_path, read_only=True) as journal:
            records = journal.list_intents()
        return {r.reference or "": r.acknowledged_at is not None for r in records}

    assert acknowledged() == {
        "order-parent": False,
        **{f"order-child-{n}": True for n in range(CHILDREN)},
    }
    client.close()
    assert acknowledged()["order-parent"], "the parent writes its own when it closes"
