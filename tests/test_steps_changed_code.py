"""A block whose code takes another path on a run again: each request meets the step it
is, never a new operation under a new key.

The shop's checkout sets the payment up (a PaymentIntent) then charges (a payment), with
payonce's own verbs against the sandbox speaking Stripe's dialect, on a SQLite journal
file; each run is a new client, as a new process would have. The conditional paths are
``_lifecycle._steps.place``'s cases (tests/test_step_placement.py) carried out end to end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import payonce
from helpers.payments import MakeClient
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import SandboxConfig, SandboxServer

SETUP = ("/v1/payment_intents", {"amount": 2000, "currency": "eur"})
CHARGE = ("/v1/payments", {"amount": 2000, "currency": "eur"})
SUCCEEDED = payonce.IntentState.SUCCEEDED


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("changed code stripe", SandboxConfig.like("stripe"))


@pytest.fixture
def new_run(make_client: MakeClient, server: SandboxServer) -> Callable[[], payonce.Client]:
    def make() -> payonce.Client:
        return make_client(base_url=server.url, provider="stripe")

    return make


def block(client: payonce.Client, order: str, *requests: tuple[str, dict[str, Any]]) -> Any:
    """The block of ``order`` making ``requests``: the block, and each answer's info."""
    with client.intent(order) as op:
        answers = [op.post(path, data=form) for path, form in requests]
    return op, [payonce.response_info(answer) for answer in answers]


def test_the_setup_skipped_on_a_run_again_replays_the_charge_at_its_own_step(
    new_run: Callable[[], payonce.Client], server: SandboxServer
) -> None:
    first, _ = block(new_run(), "order-skip", SETUP, CHARGE)
    executed = server.store.total_executions()

    again, infos = block(new_run(), "order-skip", CHARGE)

    assert again.key == first.key
    assert again.steps == [(2, f"{first.key}-step2", SUCCEEDED)]
    assert [info.replayed for info in infos] == [True]
    assert server.store.total_executions() == executed


def test_reordered_steps_each_replay_their_own(
    new_run: Callable[[], payonce.Client], server: SandboxServer
) -> None:
    first, _ = block(new_run(), "order-reorder", SETUP, CHARGE)
    executed = server.store.total_executions()

    again, infos = block(new_run(), "order-reorder", CHARGE, SETUP)

    assert again.steps == [(2, f"{first.key}-step2", SUCCEEDED), (1, first.key, SUCCEEDED)]
    assert [info.replayed for info in infos] == [True, True]
    assert server.store.total_executions() == executed


def test_a_step_added_on_a_run_again_is_the_next_position_sent_once(
    new_run: Callable[[], payonce.Client], server: SandboxServer
) -> None:
    first, _ = block(new_run(), "order-add", SETUP, CHARGE)
    executed = server.store.total_executions()
    fee = ("/v1/payments", {"amount": 500, "currency": "eur"})

    # The new code charges a fee first: a second charge, the block's first request now.
    again, infos = block(new_run(), "order-add", CHARGE, fee, SETUP)

    # The charge meets the journaled charge; the fee, the second request to that endpoint,
    # has none journaled: a new step after every journaled one, sent once.
    assert [number for number, _, _ in again.steps] == [2, 3, 1]
    assert [info.replayed for info in infos] == [True, False, True]
    assert server.store.total_executions() == executed + 1
    again_twice, infos = block(new_run(), "order-add", CHARGE, fee, SETUP)
    assert [info.replayed for info in infos] == [True, True, True]
    assert again_twice.key == first.key


def test_a_charge_of_another_amount_with_the_setup_skipped_is_refused_at_its_step(
    new_run: Callable[[], payonce.Client], server: SandboxServer
) -> None:
    block(new_run(), "order-changed-amount", SETUP, CHARGE)
    client = new_run()
    before = client.journal.list_intents()
    executed = server.store.total_executions()

    with pytest.raises(payonce.IntentMismatch) as refused:
        block(client, "order-changed-amount", ("/v1/payments", {"amount": 9900, "currency": "eur"}))

    assert refused.value.step == 2
    assert "differs from the one journaled in the body (field amount)" in str(refused.value)
    assert client.journal.list_intents() == before
    assert server.store.total_executions() == executed


@pytest.mark.anyio
async def test_async_the_setup_skipped_on_a_run_again_replays_the_charge(
    make_async_client: Callable[..., payonce.AsyncClient], server: SandboxServer
) -> None:
    async def run(*requests: tuple[str, dict[str, Any]]) -> Any:
        client = make_async_client(base_url=server.url, provider="stripe")
        async with client.intent("order-async-skip") as op:
            for path, form in requests:
                await op.post(path, data=form)
        return op

    first = await run(SETUP, CHARGE)
    executed = server.store.total_executions()

    again = await run(CHARGE)

    assert again.steps == [(2, f"{first.key}-step2", SUCCEEDED)]
    assert server.store.total_executions() == executed
