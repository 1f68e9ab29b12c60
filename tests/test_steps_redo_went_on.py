"""A declined step run again alone, after a later run went on past it, never ends on the
decline.

Card A is declined at step 2; a later run, with card B, passes step 2 over and pays at
step 3. Then the first job is redelivered: the block runs again with card A alone, and
step 2's decline is replayed. Handed back alone, it reads as the order's outcome while the
order was paid: a shop that fails the order on it lets the customer pay a second time.
So the decline says that a run went on (``ProviderError.later_steps``), ``op.steps`` shows
step 3, and the block raises ``IntentMismatch`` as it ends, nothing sent, the journal as
it was. The run that declined A and then paid with B, run again as it was, still replays
exactly (A's decline, then B at step 3): only a block that ends on the decline raises.

Against the sandbox over loopback (its default dialect declines one amount with a 402), on
a SQLite journal file; each run is a new client, as a new process would have.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.crash import KILLED, executions_once_arrived, worker_env
from helpers.payments import DECLINED, PAYMENT, MakeClient
from payonce.sandbox import SandboxServer

ORDER = "order-1"
CARD_B = {**PAYMENT, "amount": 4300}
"""The same payment with the customer's other card (another amount, for the sandbox)."""

S = payonce.IntentState


def run_block(client: payonce.Client, *payments: dict[str, Any]) -> payonce.Operation:
    """The shop's checkout: step 1, then each payment in turn; the last one's refusal
    reaches the caller, an earlier one's is caught (the customer tries the next card)."""
    with client.intent(ORDER) as op:
        op.post("/v1/payments", json=PAYMENT)
        for payment in payments[:-1]:
            try:
                op.post("/v1/payments", json=payment)
                break
            except payonce.ProviderError:
                continue
        else:
            op.post("/v1/payments", json=payments[-1])
    return op


def run_in_a_process_of_its_own(make_client: MakeClient, *payments: dict[str, Any]) -> Any:
    """``run_block`` with a client closed at its end, as a process ends: its block's
    acknowledgements are written by then, so that a later look at the journal compares
    only what a later run did."""
    client = make_client()
    try:
        return run_block(client, *payments)
    finally:
        client.close()


def declined_then_paid_in_a_later_run(make_client: MakeClient) -> str:
    """The red-team's first two runs: A declined at step 2; B passes it over and pays at
    step 3. The intent's key."""
    with pytest.raises(payonce.ProviderError):
        run_in_a_process_of_its_own(make_client, DECLINED)
    op = run_in_a_process_of_its_own(make_client, CARD_B)
    assert op.key is not None
    assert [(n, s) for n, _, s in op.steps] == [(1, S.SUCCEEDED), (3, S.SUCCEEDED)]
    return op.key


def journal_of(client: payonce.Client) -> list[payonce.IntentRecord]:
    return client.journal.list_intents()


def test_the_declined_card_alone_after_another_card_paid_says_step_3_succeeded(
    make_client: MakeClient, sandbox: SandboxServer, location: str
) -> None:
    """On either journal (a SQLite file, a PostgreSQL database)."""
    make_client = functools.partial(make_client, journal=location)
    key = declined_then_paid_in_a_later_run(make_client)
    executed = sandbox.store.total_executions()
    client = make_client()
    before = journal_of(client)

    # The first job redelivered: card A alone.
    with pytest.raises(payonce.IntentMismatch) as went_on:
        run_block(client, DECLINED)

    error = went_on.value
    message = str(error)
    assert message.startswith(f"step 2 of intent '{ORDER}' (key {key}-step2), POST /v1/payments")
    assert f"step 3 (key {key}-step3) succeeded" in message
    assert "the order may be paid" in message
    assert f"payonce reconcile {ORDER}" in message
    assert "run the block with the request that went on" in message
    assert (error.key, error.reference, error.step, error.intent_key) == (
        f"{key}-step3",
        ORDER,
        3,
        key,
    )
    # Raised from the decline, which itself says a run went on.
    declined = error.__cause__
    assert isinstance(declined, payonce.ProviderError)
    assert declined.status_code == 402
    assert declined.later_steps == ((3, f"{key}-step3", "succeeded"),)
    assert "a run went on past this refusal" in str(declined)
    assert "make it in the block" not in str(declined)  # another card would pay twice
    # Nothing sent, the journal as it was.
    assert sandbox.store.total_executions() == executed
    assert journal_of(client) == before


def test_op_steps_shows_the_step_a_later_run_paid_after_the_declined_one(
    make_client: MakeClient,
) -> None:
    key = declined_then_paid_in_a_later_run(make_client)
    seen: list[list[tuple[int, str | None, payonce.IntentState | None]]] = []

    def shop_looking_at_the_block_on_a_decline(client: payonce.Client) -> None:
        """Catches the decline and looks at the block before it acts on it; then ends the
        block normally."""
        with client.intent(ORDER) as op:
            op.post("/v1/payments", json=PAYMENT)
            try:
                op.post("/v1/payments", json=DECLINED)
            except payonce.ProviderError:
                seen.append(op.steps)

    with pytest.raises(payonce.IntentMismatch):
        shop_looking_at_the_block_on_a_decline(make_client())

    assert seen == [
        [
            (1, key, S.SUCCEEDED),
            (2, f"{key}-step2", S.FAILED),
            (3, f"{key}-step3", S.SUCCEEDED),
        ]
    ]


def test_the_declined_card_then_the_card_that_paid_replays_both_without_error(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    """The decline replayed, then the request that went on: the block reached step 3, so
    it ends as any replay does."""
    key = declined_then_paid_in_a_later_run(make_client)
    executed = sandbox.store.total_executions()

    op = run_block(make_client(), DECLINED, CARD_B)

    assert op.steps == [
        (1, key, S.SUCCEEDED),
        (2, f"{key}-step2", S.FAILED),
        (3, f"{key}-step3", S.SUCCEEDED),
    ]
    assert sandbox.store.total_executions() == executed


def test_a_third_card_after_the_replayed_decline_is_refused_at_step_3(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    declined_then_paid_in_a_later_run(make_client)
    executed = sandbox.store.total_executions()

    with pytest.raises(payonce.IntentMismatch) as refused:
        run_block(make_client(), DECLINED, {**PAYMENT, "amount": 4400})

    assert refused.value.step == 3
    assert "This step succeeded" in str(refused.value)
    assert sandbox.store.total_executions() == executed


def test_a_refusal_no_run_went_on_past_is_replayed_as_it_was(make_client: MakeClient) -> None:
    with pytest.raises(payonce.ProviderError):
        run_block(make_client(), DECLINED)

    with pytest.raises(payonce.ProviderError) as again:
        run_block(make_client(), DECLINED)

    assert again.value.later_steps == ()
    assert "make it in the block" in str(again.value)


def test_every_step_a_run_went_on_to_is_named_when_a_second_card_was_declined_too(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    """A declined at 2; B, declined too, at 3; C paid at 4. A alone again names both."""
    with pytest.raises(payonce.ProviderError):
        run_block(make_client(), DECLINED)
    with pytest.raises(payonce.ProviderError):
        run_block(make_client(), {**DECLINED, "currency": "usd"})
    paid = run_block(make_client(), CARD_B)
    key = paid.key
    assert [n for n, _, _ in paid.steps] == [1, 4]

    with pytest.raises(payonce.IntentMismatch) as went_on:
        run_block(make_client(), DECLINED)

    assert f"step 3 (key {key}-step3) was refused too; step 4 (key {key}-step4) succeeded" in str(
        went_on.value
    )
    assert went_on.value.step == 4


@pytest.mark.anyio
async def test_an_async_block_ending_on_the_replayed_decline_raises_the_same_way(
    make_client: MakeClient, make_async_client: Callable[..., payonce.AsyncClient]
) -> None:
    key = declined_then_paid_in_a_later_run(make_client)
    client = make_async_client()
    ran: list[payonce.AsyncOperation] = []

    async def declined_card_alone() -> None:
        async with client.intent(ORDER) as op:
            ran.append(op)
            await op.post("/v1/payments", json=PAYMENT)
            await op.post("/v1/payments", json=DECLINED)

    with pytest.raises(payonce.IntentMismatch) as went_on:
        await declined_card_alone()

    assert f"step 3 (key {key}-step3) succeeded" in str(went_on.value)
    assert isinstance(went_on.value.__cause__, payonce.ProviderError)
    assert [n for n, _, _ in ran[0].steps] == [1, 2, 3]


# -- step 3 left pending by a crash after send ---------------------------------------------

CARD_B_RUN = """
import sys, payonce
client = payonce.Client(
    provider="sandbox", account="acct_demo", base_url=sys.argv[1], journal=sys.argv[2],
    api_key=sys.argv[3], retry=payonce.RetryPolicy(max_attempts=1),
)
with client.intent({order!r}) as op:
    op.post("/v1/payments", json={payment!r})
    op.post("/v1/payments", json={card_b!r})
"""


def killed_after_sending_card_b(sandbox: SandboxServer, journal: Path, api_key: str) -> None:
    """The run with card B, in a process SIGKILLed once step 3's request is out (its first
    send: step 1 replays)."""
    script = textwrap.dedent(CARD_B_RUN).format(order=ORDER, payment=PAYMENT, card_b=CARD_B)
    done = subprocess.run(
        [sys.executable, "-c", script, sandbox.url, str(journal), api_key],
        env=worker_env("after_send:1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == KILLED, done.stderr[-3000:]


def test_the_declined_card_alone_after_a_crash_that_sent_card_b_says_it_may_have_executed(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    client_options: dict[str, Any],
) -> None:
    with pytest.raises(payonce.ProviderError):
        run_in_a_process_of_its_own(make_client, DECLINED)
    killed_after_sending_card_b(sandbox, journal_path, client_options["api_key"])
    assert executions_once_arrived(sandbox, 3) == 3  # step 3 executed; its answer was lost
    client = make_client()
    (intent,) = client.journal.find(ORDER)
    key = intent.key
    assert [(s.key, s.state) for s in client.journal.steps(key)] == [
        (f"{key}-step2", S.FAILED),
        (f"{key}-step3", S.PENDING),
    ]
    before = journal_of(client)

    with pytest.raises(payonce.IntentMismatch) as went_on:
        run_block(client, DECLINED)

    assert f"step 3 (key {key}-step3) is pending: it may have executed" in str(went_on.value)
    assert sandbox.store.total_executions() == 3
    assert journal_of(client) == before

    # Run with the request that went on: step 3 settles under its key, paid once.
    op = run_block(make_client(), CARD_B)
    assert [(n, s) for n, _, s in op.steps] == [(1, S.SUCCEEDED), (3, S.SUCCEEDED)]
    assert sandbox.store.total_executions() == 3
