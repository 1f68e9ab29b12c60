"""An SDK call sent from another thread inside a block (release check r17r H2).

A block is a context variable: a thread pool's threads (``ThreadPoolExecutor.submit``,
``loop.run_in_executor``) do not inherit it, so a stripe-python call made there is outside
the block, a one-shot of its own under a key drawn for that call, which a run again after a
crash cannot find. payonce says so with a WARNING the moment the request arrives, naming the
block and the fix; ``outside_intent="refuse"`` makes it an error. ``asyncio.to_thread`` and
``contextvars.copy_context().run`` carry the block, and the call is its step.

stripe-python (the real SDK) through ``payonce.integrations.stripe.HTTPClient``, against the
sandbox speaking Stripe's dialect.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stripe

import payonce
from helpers.payments import payonce_options
from helpers.sandboxes import SharedSandboxes
from payonce.integrations.stripe import HTTPClient
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

Pay = Callable[[], Any]
WIRED = tuple[payonce.Client, stripe.StripeClient]


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("sdk stripe", SandboxConfig.like("stripe"))


@pytest.fixture
def wired(
    server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> Callable[..., WIRED]:
    """A payonce client and stripe-python sending through it (the one added line)."""

    def make(**integration: Any) -> WIRED:
        client = closing.enter_context(
            payonce.Client(**payonce_options(server, "stripe", journal_path))
        )
        http_client = HTTPClient(client, **integration)
        closing.callback(http_client.close)
        sdk = stripe.StripeClient(
            DEFAULT_API_KEY, base_addresses={"api": server.url}, http_client=http_client
        )
        return client, sdk

    return make


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="shop-pool") as executor:
        yield executor


def create_for(sdk: stripe.StripeClient, order: str) -> Pay:
    return lambda: sdk.v1.payment_intents.create(
        params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
    )


class Warned:
    """The WARNINGs payonce logged of requests outside any block, since the last ``clear``."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.WARNING, logger="payonce")
        self._caplog = caplog

    def __call__(self) -> list[str]:
        return [
            r.getMessage()
            for r in self._caplog.records
            if r.levelno == logging.WARNING and "outside any intent block" in r.getMessage()
        ]

    def clear(self) -> None:
        self._caplog.clear()


@pytest.fixture
def warned(caplog: pytest.LogCaptureFixture) -> Warned:
    return Warned(caplog)


def intents_of(server: SandboxServer, order: str) -> list[dict[str, Any]]:
    return [i for i in server.store.payment_intents() if i["metadata"].get("order") == order]


def test_a_call_submitted_to_a_thread_pool_inside_a_block_is_warned_of_as_it_is_sent(
    wired: Callable[..., WIRED],
    pool: concurrent.futures.ThreadPoolExecutor,
    warned: Warned,
) -> None:
    client, sdk = wired()
    with client.intent("order-TH1") as op:
        created = pool.submit(create_for(sdk, "order-TH1")).result()
        # Said at once, not when the block ends (a killed process never gets there).
        (message,) = warned()
        assert op.steps == []  # not the block's step: a one-shot of its own

    assert created.status == "requires_payment_method"
    assert "POST http://" in message
    assert "intent 'order-TH1' in thread 'MainThread'" in message
    assert "contextvars.copy_context()" in message
    assert "pool.submit(contextvars.copy_context().run, fn, ...)" in message
    assert "asyncio.to_thread" in message
    assert "outside_intent='refuse'" in message


def test_a_call_run_in_the_block_s_copied_context_is_its_step_and_not_warned_of(
    wired: Callable[..., WIRED],
    pool: concurrent.futures.ThreadPoolExecutor,
    warned: Warned,
    server: SandboxServer,
) -> None:
    client, sdk = wired()
    for _ in range(2):  # the run again replays the step: one PaymentIntent
        with client.intent("order-TH2") as op:
            context = contextvars.copy_context()
            created = pool.submit(context.run, create_for(sdk, "order-TH2")).result()
            assert [number for number, _, _ in op.steps] == [1]

    assert warned() == []
    assert [i["id"] for i in intents_of(server, "order-TH2")] == [created.id]


def test_run_in_executor_inside_a_block_is_warned_of_and_to_thread_is_the_block_s_step(
    wired: Callable[..., WIRED], warned: Warned
) -> None:
    client, sdk = wired()

    async def shop(order: str, *, to_thread: bool) -> list[Any]:
        with client.intent(order) as op:
            pay = create_for(sdk, order)
            if to_thread:
                await asyncio.to_thread(pay)
            else:
                await asyncio.get_running_loop().run_in_executor(None, pay)
            return op.steps

    assert asyncio.run(shop("order-TH3", to_thread=False)) == []
    (message,) = warned()
    assert "intent 'order-TH3'" in message
    warned.clear()
    assert len(asyncio.run(shop("order-TH4", to_thread=True))) == 1
    assert warned() == []


def test_outside_intent_refuse_makes_the_thread_pool_s_call_an_error_naming_the_block(
    wired: Callable[..., WIRED],
    pool: concurrent.futures.ThreadPoolExecutor,
    server: SandboxServer,
    journal_path: Path,
) -> None:
    client, sdk = wired(outside_intent="refuse")
    with (
        client.intent("order-TH5"),
        pytest.raises(payonce.ConfigurationError) as refused,
    ):
        pool.submit(create_for(sdk, "order-TH5")).result()

    message = str(refused.value)
    assert "outside_intent='refuse': nothing was sent" in message
    assert "intent 'order-TH5' in thread 'MainThread'" in message
    assert "asyncio.to_thread" in message
    assert intents_of(server, "order-TH5") == []
    with payonce.open_journal(journal_path, read_only=True) as journal:
        assert journal.list_intents() == []


def test_a_call_outside_any_block_with_no_block_open_elsewhere_is_not_warned_of(
    wired: Callable[..., WIRED],
    pool: concurrent.futures.ThreadPoolExecutor,
    warned: Warned,
    server: SandboxServer,
) -> None:
    client, sdk = wired()
    with client.intent("order-TH6"):
        pass  # a block that ended: none is open any more
    warned.clear()

    created = pool.submit(create_for(sdk, "order-TH7")).result()

    assert warned() == []
    assert [i["id"] for i in intents_of(server, "order-TH7")] == [created.id]


def test_a_block_s_own_calls_in_its_thread_are_not_warned_of_while_another_thread_has_one(
    wired: Callable[..., WIRED],
    pool: concurrent.futures.ThreadPoolExecutor,
    warned: Warned,
) -> None:
    # Two orders at once, each block in its own thread: each call is its block's step.
    client, sdk = wired()

    def order(name: str) -> int:
        with client.intent(name) as op:
            create_for(sdk, name)()
            return len(op.steps)

    assert list(pool.map(order, ["order-TH8", "order-TH9"])) == [1, 1]
    assert warned() == []


def test_a_call_through_a_copy_of_a_block_s_context_after_the_block_ended_is_refused(
    wired: Callable[..., WIRED],
    pool: concurrent.futures.ThreadPoolExecutor,
    server: SandboxServer,
) -> None:
    """A thread holding a copy of the block's context outlives the block: its call is no
    step of that ended block (never acknowledged, nothing for a run again to find) and no
    one-shot under a fresh key either. Refused, nothing journaled or sent."""
    client, sdk = wired()
    with client.intent("order-TH-late"):
        create_for(sdk, "order-TH-late")()
        copied = contextvars.copy_context()
    before = client.journal.list_intents()

    late = pool.submit(copied.run, create_for(sdk, "order-TH-late"))
    with pytest.raises(payonce.ConfigurationError) as refused:
        late.result()

    assert "after the block of intent 'order-TH-late'" in str(refused.value)
    assert "nothing was journaled or sent" in str(refused.value)
    assert client.journal.list_intents() == before
    assert len(intents_of(server, "order-TH-late")) == 1


def test_payonce_s_own_verbs_through_a_copy_of_an_ended_block_s_context_are_refused(
    pool: concurrent.futures.ThreadPoolExecutor,
    server: SandboxServer,
    journal_path: Path,
    closing: contextlib.ExitStack,
) -> None:
    options = {**payonce_options(server, "stripe", journal_path), "transport_only": False}
    client = closing.enter_context(payonce.Client(**options, api_key=DEFAULT_API_KEY))
    with client.intent("order-TH-late-verbs") as op:
        op.post("/v1/payment_intents", data={"amount": 2000, "currency": "eur"})
        copied = contextvars.copy_context()
    before = client.journal.list_intents()
    executed = server.store.total_executions()

    late = pool.submit(
        copied.run, client.post, "/v1/payment_intents", data={"amount": 900, "currency": "eur"}
    )
    with pytest.raises(payonce.ConfigurationError, match="after the block of intent"):
        late.result()

    assert client.journal.list_intents() == before
    assert server.store.total_executions() == executed
