"""AsyncClient: the sync scenarios, awaited, over real HTTP and a real journal."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.payments import PAYMENT, leave_pending
from helpers.processes import python_env
from payonce._journal._plans import Call
from payonce.sandbox import Faults, SandboxServer

pytestmark = pytest.mark.anyio


MakeAsyncClient = Callable[..., payonce.AsyncClient]


async def test_a_payment_is_sent_once_and_replayed_from_the_journal(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer
) -> None:
    client = make_async_client()
    async with client.intent("order-1") as op:
        first = await op.post("/v1/payments", json=PAYMENT)
    sandbox.stop()  # the replay must not need the network

    again = await client.post("/v1/payments", json=PAYMENT, reference="order-1")

    assert first.status_code == 201
    assert again.json() == first.json()
    info = payonce.response_info(again)
    assert info is not None
    assert info.replayed
    assert op.state is payonce.IntentState.SUCCEEDED


async def test_a_replay_whose_body_was_too_large_to_journal_is_the_provider_s_replay(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer
) -> None:
    client = make_async_client(max_stored_response_bytes=16)
    first = await client.post("/v1/payments", json=PAYMENT, reference="order-big")
    again = await client.post("/v1/payments", json=PAYMENT, reference="order-big")
    assert again.json() == first.json()
    info = payonce.response_info(again)
    assert info is not None
    assert (info.replayed, info.provider_replayed, info.body_stored) == (True, True, False)
    assert sandbox.store.total_executions() == 1


@pytest.mark.parametrize("faults", [["fail_before"], ["fail_after"], ["drop_after", "rate_limit"]])
async def test_transient_failures_are_retried_under_one_key(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer, faults: list[str]
) -> None:
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(faults)
    client = make_async_client()
    async with client.intent("order-r") as op:
        response = await op.post("/v1/payments", json=PAYMENT)
    assert response.status_code == 201
    assert sandbox.store.executions() == {op.key: 1}


async def test_a_different_body_for_the_same_intent_is_refused_before_sending(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer
) -> None:
    client = make_async_client()
    await client.post("/v1/payments", json=PAYMENT, reference="order-m")
    with pytest.raises(payonce.IntentMismatch):
        await client.post(
            "/v1/payments", json={"amount": 1, "currency": "eur"}, reference="order-m"
        )
    assert sandbox.store.total_executions() == 1


async def test_exhausted_ambiguous_retries_end_unknown_and_reconcile_settles_them(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer
) -> None:
    client = make_async_client(retry=payonce.RetryPolicy(max_attempts=1))
    sandbox.script(["drop_after"])
    with pytest.raises(payonce.OutcomeUnknown) as caught:
        await client.post("/v1/payments", json=PAYMENT, reference="order-u")

    (result,) = await client.reconcile("order-u")

    assert (result.outcome, result.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert sandbox.store.executions() == {caught.value.key: 1}
    assert [r.key for r in await client.unacknowledged()] == [caught.value.key]


async def test_many_concurrent_intents_each_execute_once(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer
) -> None:
    sandbox.set_faults(Faults(seed=3, fail_before_rate=0.1, fail_after_rate=0.1))
    client = make_async_client()
    responses = await asyncio.gather(
        *(client.post("/v1/payments", json=PAYMENT, reference=f"order-{n}") for n in range(64))
    )
    assert {r.status_code for r in responses} == {201}
    assert sandbox.store.total_executions() == 64
    assert set(sandbox.store.executions().values()) == {1}


async def test_two_tasks_on_one_intent_never_send_it_twice(
    make_sandbox: Callable[..., SandboxServer], make_async_client: MakeAsyncClient
) -> None:
    slow = make_sandbox(processing_seconds=0.4)
    client = make_async_client(base_url=slow.url)
    first, second = await asyncio.gather(
        client.post("/v1/payments", json=PAYMENT, reference="order-t"),
        client.post("/v1/payments", json=PAYMENT, reference="order-t"),
    )
    assert first.json()["id"] == second.json()["id"]
    assert slow.store.total_executions() == 1


async def test_resume_finishes_pending_intents(
    make_client: Callable[..., payonce.Client],
    make_async_client: MakeAsyncClient,
    sandbox: SandboxServer,
    tmp_path: Path,
) -> None:
    unreachable = make_client(
        base_url="http://127.0.0.1:9", retry=payonce.RetryPolicy(max_attempts=1)
    )
    with pytest.raises(payonce.ProviderUnavailable):
        unreachable.post("/v1/payments", json=PAYMENT, reference="order-p")

    (result,) = await make_async_client().resume()

    assert result.state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.total_executions() == 1


async def test_resume_judges_the_key_by_the_provider_s_clock(
    make_client: Callable[..., payonce.Client],
    make_async_client: MakeAsyncClient,
    sandbox: SandboxServer,
) -> None:
    """The provider aged 25 h and forgot the key; this host's clock did not move: the
    async client asks the provider its time, as the sync one does, and resends nothing."""
    left = leave_pending(make_client, "order-aged")  # an attempt may have executed
    sandbox.advance_clock(25 * 3600)

    (result,) = await make_async_client().resume()

    assert result.state is payonce.IntentState.UNKNOWN
    assert "behind the provider's" in result.detail
    assert sandbox.store.executions() == {left.key: 1}


async def test_an_intent_resume_leaves_unknown_is_warned_of_once(
    make_client: Callable[..., payonce.Client],
    make_async_client: MakeAsyncClient,
    sandbox: SandboxServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    left = leave_pending(make_client, "order-sent")  # an attempt may have executed
    sandbox.script(["fail_before"] * 3)
    policy = payonce.RetryPolicy(max_attempts=3, initial_wait=0)

    with caplog.at_level(logging.WARNING, logger="payonce"):
        (result,) = await make_async_client(retry=policy).resume()

    assert result.state is payonce.IntentState.UNKNOWN
    said = [r.getMessage() for r in caplog.records if getattr(r, "key", None) == left.key]
    assert len(said) == 1, said
    assert "went unknown: retries exhausted" in said[0]


class _MangledFor(httpx.AsyncHTTPTransport):
    """Passes everything through to the sandbox but the answers about one key: a body that
    cannot be decoded, or a bug after sending."""

    def __init__(self, key: str, how: str) -> None:
        super().__init__()
        self.key, self.how = key, how

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.headers.get("idempotency-key") != self.key:
            return response
        await response.aread()
        if self.how == "broken":
            raise RuntimeError("a bug in the transport")
        return httpx.Response(201, headers={"content-encoding": "gzip"}, content=b"not gzip")


@pytest.mark.parametrize(
    ("how", "state", "said"),
    [
        # An answer arrived: the provider may have executed it, so it goes unknown.
        ("undecodable", payonce.IntentState.UNKNOWN, "DecodingError"),
        # Not a transport failure: the error is reported, the intent left pending.
        ("broken", payonce.IntentState.PENDING, "a bug in the transport"),
    ],
)
async def test_one_intent_failing_in_any_way_does_not_stop_resume(
    make_client: Callable[..., payonce.Client],
    make_async_client: MakeAsyncClient,
    sandbox: SandboxServer,
    how: str,
    state: payonce.IntentState,
    said: str,
) -> None:
    unreachable = make_client(
        base_url="http://127.0.0.1:9", retry=payonce.RetryPolicy(max_attempts=1)
    )
    keys = []
    for n in range(3):
        with pytest.raises(payonce.ProviderUnavailable) as caught:
            unreachable.post("/v1/payments", json=PAYMENT, reference=f"order-{n}")
        keys.append(caught.value.key)

    results = await make_async_client(transport=_MangledFor(keys[1], how)).resume()

    assert [(r.key, r.state) for r in results] == [
        (keys[0], payonce.IntentState.SUCCEEDED),
        (keys[1], state),
        (keys[2], payonce.IntentState.SUCCEEDED),
    ]
    assert said in results[1].detail


def _record_threads(journal: payonce.journal.SQLiteJournal) -> set[int]:
    """Wraps every public method of this journal, and the transaction runners of its engine
    (the client's private writes run in those), to note the thread each call ran on."""
    threads: set[int] = set()
    engine = journal._engine
    wrapped = [(journal, name) for name in dir(journal) if not name.startswith("_")]
    for owner, name in [*wrapped, (engine, "write"), (engine, "read")]:
        method = getattr(owner, name)
        if not callable(method):
            continue

        def call(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            threads.add(threading.get_ident())
            return _method(*args, **kwargs)

        setattr(owner, name, call)
    return threads


async def test_journal_writes_never_run_on_the_event_loop_thread(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    journal = payonce.journal.SQLiteJournal(journal_path)
    threads = _record_threads(journal)
    client = make_async_client(journal=journal)
    sandbox.script(["fail_after"])

    async with client.intent("order-j") as op:
        await op.post("/v1/payments", json=PAYMENT)
    assert op.state is payonce.IntentState.SUCCEEDED  # read without touching the journal
    assert await client.resume() == []
    assert await client.reconcile_all() == []

    assert threads, "the journal was used"
    assert threading.get_ident() not in threads, "an fsync would block the loop"
    journal.close()


async def test_a_call_cancelled_while_its_settle_is_being_written_still_holds_the_intent(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer
) -> None:
    """Cancelled while its settle runs in a journal thread, the first call is not over:
    that settle still writes under its lease. The same process's next call must wait for
    it, not take the intent over and send it again before the answer is journaled."""
    client = make_async_client(in_flight_wait=0.3)
    store, journal = client._core.store, client.journal
    settle = store.settle
    writing, go_on = threading.Event(), threading.Event()

    def held_up() -> None:
        writing.set()
        assert go_on.wait(10)

    class HeldUpSettle:
        """The settle's plan, held up in the journal thread before it writes."""

        def plan(self, *args: Any, **kwargs: Any) -> Any:
            yield Call(held_up)
            return (yield from settle.plan(*args, **kwargs))

    store.settle = HeldUpSettle()  # type: ignore[assignment]
    first = asyncio.create_task(client.post("/v1/payments", json=PAYMENT, reference="order-c"))
    assert await asyncio.to_thread(writing.wait, 10)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first

    with pytest.raises(payonce.IntentInFlight):
        await client.post("/v1/payments", json=PAYMENT, reference="order-c")
    go_on.set()
    (record,) = await asyncio.to_thread(journal.find, "order-c")
    while record.state is payonce.IntentState.PENDING:
        await asyncio.sleep(0.01)
        (record,) = await asyncio.to_thread(journal.find, "order-c")

    replay = await client.post("/v1/payments", json=PAYMENT, reference="order-c")
    assert payonce.response_info(replay).replayed  # type: ignore[union-attr]
    assert sandbox.store.executions() == {record.key: 1}
    assert len(journal.attempts(record.key)) == 1, "sent once"


_TWO_RUNS = """
import asyncio, json, sys

import payonce

client = payonce.AsyncClient(**json.loads(sys.argv[1]))


async def pay(reference):
    response = await client.post("/v1/payments", json={"amount": 4200, "currency": "eur"},
                                 reference=reference)
    return response.status_code, response.json()["id"]


first = asyncio.run(pay("order-loop-1"))
second = asyncio.run(pay("order-loop-2"))
again = asyncio.run(pay("order-loop-1"))
asyncio.run(client.aclose())
print(json.dumps([first, second, again]))
"""


def test_one_async_client_serves_one_asyncio_run_after_another(
    client_options: dict[str, Any], sandbox: SandboxServer
) -> None:
    # A red-team's case: the second asyncio.run's first payment raised a bare RuntimeError
    # ("Event loop is closed", httpx's pool bound to the first loop) and journaled an
    # ambiguous attempt, though nothing had left the machine. In a process of its own: the
    # first loop's pooled sockets can only be left to the garbage collector, which warns.
    options = {k: v for k, v in client_options.items() if k != "retry"}
    options["journal"] = str(options["journal"])
    ran = subprocess.run(
        [sys.executable, "-c", _TWO_RUNS, json.dumps(options)],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    first, second, again = json.loads(ran.stdout)
    assert (first[0], second[0], again) == (201, 201, first)
    with payonce.open_journal(client_options["journal"]) as journal:
        records = journal.list_intents()
        attempts = [a for record in records for a in journal.attempts(record.key)]
    assert sandbox.store.executions() == {record.key: 1 for record in records}
    assert [(a.status_code, a.ambiguous) for a in attempts] == [(201, False), (201, False)]
