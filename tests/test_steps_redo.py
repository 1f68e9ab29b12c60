"""A step the provider declined may be redone differently when the block runs again.

The customer's card A is declined at step 2 (confirm), the process ends, and the customer
comes back with card B: the block runs again, and its confirm with B meets step 2 journaled
as the confirm with A. The decline executed nothing the provider would ever replay as a
success, so that step is passed over: B is compared with step 3, and becomes step 3 when
there is none. Every step that may have executed (unknown, pending, succeeded) is still
refused when its request changes: that is the guard against paying twice.

stripe-python itself, over payonce's integration, against the sandbox's Stripe dialect (a
declined test card answers Stripe's 402 ``card_declined``), on a SQLite journal file; each
run is a new payonce client and a new stripe-python, as a new process would have.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import stripe

import payonce
from helpers.crash import KILLED, TESTS, run_checkout_worker
from helpers.journals import draft_for
from helpers.payments import DECLINED, PAYMENT, MakeClient, payonce_options
from helpers.sandboxes import SharedSandboxes
from helpers.stripe_sdk import stripe_over
from payonce._journal._held import created_record
from payonce._lifecycle import IntentRecord, StoredResponse
from payonce._lifecycle._steps import may_pass_over
from payonce._providers._profile import get_profile
from payonce.sandbox import SandboxConfig, SandboxServer

CARD_A = "pm_card_chargeDeclined"
"""Stripe's test card that is declined: a 402 ``card_declined``."""
CARD_B = "pm_card_visa"
CARD_C = "pm_card_mastercard"
ORDER = "order-1"

Run = Callable[..., tuple[payonce.Client, stripe.StripeClient]]


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("sdk stripe", SandboxConfig.like("stripe"))


@pytest.fixture
def new_run(server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack) -> Run:
    """What a process of the shop starts with: a payonce client on the journal file, and
    stripe-python over it (the one added line)."""

    def make(**overrides: Any) -> tuple[payonce.Client, stripe.StripeClient]:
        options = {**payonce_options(server, "stripe", journal_path), **overrides}
        client = closing.enter_context(payonce.Client(**options))
        return client, stripe_over(client, server, closing)

    return make


def create(sdk: stripe.StripeClient) -> stripe.PaymentIntent:
    return sdk.v1.payment_intents.create(
        params={"amount": 2000, "currency": "eur", "metadata": {"order": ORDER}}
    )


def confirm(sdk: stripe.StripeClient, intent: stripe.PaymentIntent, card: str) -> Any:
    return sdk.v1.payment_intents.confirm(intent.id, params={"payment_method": card})


def checkout(client: payonce.Client, sdk: stripe.StripeClient, *cards: str) -> Any:
    """The shop's checkout: create the PaymentIntent, then confirm it with each card the
    customer offers until one pays. The decline of the last one reaches the caller."""
    with client.intent(ORDER) as op:
        intent = create(sdk)
        for card in cards[:-1]:
            with contextlib.suppress(stripe.CardError):
                return confirm(sdk, intent, card), op
        return confirm(sdk, intent, cards[-1]), op


def declined_in_a_first_run(new_run: Run) -> payonce.Operation:
    """The first run: created, then card A declined; the block ends with the decline."""
    client, sdk = new_run()
    with pytest.raises(stripe.CardError) as declined, client.intent(ORDER) as op:
        confirm(sdk, create(sdk), CARD_A)
    assert declined.value.code == "card_declined"
    return op


def intents_of(server: SandboxServer) -> list[dict[str, Any]]:
    return [i for i in server.store.payment_intents() if i["metadata"].get("order") == ORDER]


def journaled(client: payonce.Client) -> list[tuple[str | None, str]]:
    """The block's intent and its steps as the journal holds them: (reference, state)."""
    (intent,) = [r for r in client.journal.find(ORDER)]
    steps = client.journal.steps(intent.key)
    return [(r.reference, r.state.value) for r in [intent, *steps]]


# -- another card in a later run ---------------------------------------------------------------


def test_a_card_declined_then_another_card_in_a_later_run_pays_once_as_the_next_step(
    server: SandboxServer, new_run: Run
) -> None:
    first_op = declined_in_a_first_run(new_run)
    (_, key, _), (_, declined_key, _) = first_op.steps

    # The customer comes back with card B: the same code, another process.
    client, sdk = new_run()
    (paid, op) = checkout(client, sdk, CARD_B)

    assert paid.status == "succeeded"
    assert [(n, k) for n, k, _ in op.steps] == [(1, key), (3, f"{key}-step3")]
    (intent,) = intents_of(server)
    assert (intent["id"], intent["status"]) == (paid.id, "succeeded")
    # The PaymentIntent was created once, card A tried once, card B once.
    assert server.store.executions() == {key: 1, declined_key: 1, f"{key}-step3": 1}
    assert journaled(client) == [
        (ORDER, "succeeded"),
        (f"{ORDER}#step2", "failed"),
        (f"{ORDER}#step3", "succeeded"),
    ]


def test_the_first_run_run_again_replays_the_decline_and_the_other_card_exactly(
    server: SandboxServer, new_run: Run
) -> None:
    paid, op = checkout(*new_run(), CARD_A, CARD_B)
    assert paid.status == "succeeded"
    executed = server.store.executions()
    assert len(executed) == 3

    # Run again as it was (A declined, then B): A's decline is replayed at step 2, B at 3.
    again, again_op = checkout(*new_run(), CARD_A, CARD_B)
    assert (again.id, again.status) == (paid.id, "succeeded")
    assert again_op.steps == op.steps
    # Run again with B alone (the customer's second visit, the order already paid): step 2
    # declined A, so B is compared with step 3, and replayed from it.
    only_b, only_b_op = checkout(*new_run(), CARD_B)
    assert (only_b.id, only_b.status) == (paid.id, "succeeded")
    assert [n for n, _, _ in only_b_op.steps] == [1, 3]
    assert server.store.executions() == executed, "nothing executed again"
    assert len(intents_of(server)) == 1


def test_the_declined_card_alone_after_another_card_paid_never_ends_on_the_decline(
    server: SandboxServer, new_run: Run
) -> None:
    """A declined, B paid at step 3 in a later run; then the first job is redelivered: A
    alone. stripe-python raises its CardError for A's replayed decline, and the block
    turns it into IntentMismatch as it ends: the order was paid at step 3, and a shop that
    failed it on the decline would let the customer pay again."""
    # Each run's client is closed at its end, as its process ends: its acknowledgements
    # are written by then, and the journal compared below holds only what the third did.
    first, first_sdk = new_run()
    with pytest.raises(stripe.CardError):
        checkout(first, first_sdk, CARD_A)
    first.close()
    second, second_sdk = new_run()
    paid, _ = checkout(second, second_sdk, CARD_B)
    second.close()
    executed = server.store.executions()
    client, sdk = new_run()
    before = client.journal.list_intents()

    with pytest.raises(payonce.IntentMismatch) as went_on:
        checkout(client, sdk, CARD_A)

    assert isinstance(went_on.value.__cause__, stripe.CardError)  # not caught as a decline
    assert went_on.value.step == 3
    assert f"step 3 (key {went_on.value.key}) succeeded" in str(went_on.value)
    assert server.store.executions() == executed
    assert client.journal.list_intents() == before
    (intent,) = intents_of(server)
    assert (intent["id"], intent["status"]) == (paid.id, "succeeded")


def refused_in_a_later_run(server: SandboxServer, new_run: Run, card: str) -> Any:
    """The checkout run again with ``card``: refused as stripe-python's IdempotencyError,
    nothing sent, the journal as it was. The payonce error it carries."""
    executed = server.store.executions()
    client, sdk = new_run()
    before = client.journal.list_intents()

    with pytest.raises(stripe.IdempotencyError) as refused:
        checkout(client, sdk, card)

    assert server.store.executions() == executed
    assert client.journal.list_intents() == before
    error = refused.value.payonce_error  # type: ignore[attr-defined]
    assert isinstance(error, payonce.IntentMismatch)
    return error


def test_a_third_card_is_refused_where_a_later_step_succeeded_with_another(
    server: SandboxServer, new_run: Run
) -> None:
    """Step 2 (A) was declined and passed over, but step 3 (B) paid: card C at step 3
    would be a second payment."""
    checkout(*new_run(), CARD_A, CARD_B)

    error = refused_in_a_later_run(server, new_run, CARD_C)

    assert (error.step, error.reference) == (3, ORDER)
    assert str(error).startswith(f"step 3 of intent '{ORDER}' (key {error.key}), POST ")
    assert "This step succeeded" in str(error)


def test_a_step_that_may_have_executed_is_never_passed_over_by_another_card(
    server: SandboxServer, new_run: Run
) -> None:
    """Step 2's answer was lost: card B may have paid. Card C there is refused, nothing
    sent, the journal as it was; that is the guard against paying twice."""
    client, sdk = new_run(retry=payonce.RetryPolicy(max_attempts=1))
    with client.intent(ORDER):
        intent = create(sdk)
        server.script(["drop_after"])
        with pytest.raises(stripe.APIConnectionError):
            confirm(sdk, intent, CARD_B)

    error = refused_in_a_later_run(server, new_run, CARD_C)

    assert error.step == 2
    assert "This step is unknown: the provider may have executed it" in str(error)
    (found,) = intents_of(server)
    assert found["status"] == "succeeded"  # card B had paid: C would have paid twice


def test_a_step_that_succeeded_is_never_passed_over_by_another_card(
    server: SandboxServer, new_run: Run
) -> None:
    checkout(*new_run(), CARD_B)

    error = refused_in_a_later_run(server, new_run, CARD_C)

    assert error.step == 2
    assert "This step succeeded" in str(error)


# -- the same with payonce's own verbs -----------------------------------------------------


def test_a_declined_step_then_another_request_in_a_later_run_is_the_next_step(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    """With ``op.post`` on the sandbox's own dialect (it declines one amount with a 402)."""
    with make_client().intent("order-raw") as first:
        first.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.ProviderError) as declined:
            first.post("/v1/payments", json=DECLINED)
    # A new reference would pay step 1 again: the refusal says where the other request goes.
    assert "make it in the block" in str(declined.value)
    assert "new reference" not in str(declined.value)

    with make_client().intent("order-raw") as op:
        op.post("/v1/payments", json=PAYMENT)
        paid = op.post("/v1/payments", json={**PAYMENT, "amount": 4300})
        tip = op.post("/v1/payments", json={**PAYMENT, "amount": 300})

    assert paid.status_code == 201
    info = payonce.response_info(paid)
    assert info is not None
    assert info.key == f"{op.key}-step3"
    assert tip.status_code == 201
    assert [n for n, _, _ in op.steps] == [1, 3, 4]
    assert sandbox.store.total_executions() == 4


def test_a_request_refused_past_a_passed_over_step_shows_the_step_that_refused_it(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    """Step 2 declined, then step 3 paid another amount in a run that died before it
    acknowledged it: a third amount in a later run passes step 2 over and is refused at
    step 3. ``op.steps`` shows step 3 as the journal holds it, and the block, which
    caught the refusal and ended normally, acknowledges no outcome it never got."""

    def run(second: dict[str, Any], *, dies: bool = False) -> payonce.Operation:
        with client.intent("order-third") as op:
            op.post("/v1/payments", json=PAYMENT)
            op.post("/v1/payments", json=second)
            if dies:
                raise RuntimeError("died before recording the payment")
        return op

    with client.intent("order-third") as declined:
        declined.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.ProviderError):
            declined.post("/v1/payments", json=DECLINED)
    with pytest.raises(RuntimeError):
        run({**PAYMENT, "amount": 4300}, dies=True)
    step_3 = f"{declined.key}-step3"
    assert [r.key for r in client.unacknowledged()] == [step_3]
    before = client.journal.list_intents()

    with client.intent("order-third") as op:
        op.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.IntentMismatch) as refused:
            op.post("/v1/payments", json={**PAYMENT, "amount": 4400})

    assert (refused.value.step, refused.value.key) == (3, step_3)
    assert op.steps == [
        (1, declined.key, payonce.IntentState.SUCCEEDED),
        (3, step_3, payonce.IntentState.SUCCEEDED),
    ]
    assert client.journal.list_intents() == before
    assert [r.key for r in client.unacknowledged()] == [step_3], "not this block's to ack"
    # The amount step 3 paid, run again, replays it there: that block acknowledges it.
    assert [n for n, _, _ in run({**PAYMENT, "amount": 4300}).steps] == [1, 3]
    assert client.unacknowledged() == []
    assert sandbox.store.total_executions() == 3


@pytest.mark.anyio
async def test_an_async_block_passes_a_declined_step_over_the_same_way(
    make_async_client: Callable[..., payonce.AsyncClient], sandbox: SandboxServer
) -> None:
    client = make_async_client()
    async with client.intent("order-async") as first:
        await first.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.ProviderError):
            await first.post("/v1/payments", json=DECLINED)

    async with client.intent("order-async") as op:
        await op.post("/v1/payments", json=PAYMENT)
        paid = await op.post("/v1/payments", json={**PAYMENT, "amount": 4300})
    assert paid.status_code == 201
    assert [n for n, _, _ in op.steps] == [1, 3]
    assert sandbox.store.total_executions() == 3


# -- which refusals qualify ------------------------------------------------------------------


CARD_B_DRAFT = attrs.evolve(
    draft_for(2, key="KEY-step2", reference="order-1#step2", key_supplied=True),
    step=2,
    intent_key="KEY",
    intent_reference="order-1",
    derived_key="KEY-step2",
)
"""The confirm with card B, asked at position 2 of intent 'order-1' (key KEY)."""
DECLINE = b'{"error": {"type": "card_error", "code": "card_declined"}}'


def journaled_step_2(state: str, status: int, body: bytes, **more: Any) -> IntentRecord:
    """Step 2 as an earlier run journaled it: another request (card A), in ``state``, with
    the answer stored (``more``: its headers, whether its body was kept)."""
    card_a = attrs.evolve(CARD_B_DRAFT, fingerprint="the confirm with card A")
    headers = (("content-type", "application/json"), *more.pop("headers", ()))
    return attrs.evolve(
        created_record(card_a, "owner", 0.0, 30.0),
        state=payonce.IntentState(state),
        response=StoredResponse(status=status, headers=headers, body=body, **more),
    )


@pytest.mark.parametrize(
    ("state", "status", "body", "more", "passed_over"),
    [
        pytest.param("failed", 402, DECLINE, {}, True, id="declined-402"),
        pytest.param("failed", 400, b'{"error": {"type": "invalid_request_error"}}', {}, True),
        pytest.param("failed", 402, b"", {"body_stored": False}, False, id="body-not-kept"),
        pytest.param(
            "failed",
            400,
            b'{"error": {"type": "idempotency_error"}}',
            {},
            False,
            id="the-key-holds-another-request",
        ),
        pytest.param(
            "failed",
            422,
            b'{"status": 422, "errorCode": "idempotency_key_mismatch", "message": "reused"}',
            {},
            False,
            id="a-422-naming-the-key",
        ),
        pytest.param(
            "failed",
            400,
            b'{"errors": [{"detail": {"cause": {"code": "IDEMPOTENCY_KEY_REUSED"}}}]}',
            {},
            False,
            id="the-key-named-four-levels-deep",
        ),
        pytest.param(
            "failed",
            422,
            b'{"gateway": {"upstream": {"error": {"type": "idempotency_error"}}}}',
            {},
            False,
            id="a-gateway-wrapping-the-key-refusal",
        ),
        pytest.param(
            "failed",
            400,
            b"Idempotency key already used with another request",
            {"headers": (("content-type", "text/plain"), ("stripe-should-retry", "false"))},
            False,
            id="the-key-named-in-a-body-of-plain-text",
        ),
        pytest.param(
            "failed",
            402,
            b'{"error": ' * 100 + b'"card_declined"' + b"}" * 100,
            {},
            False,
            id="nested-deeper-than-read",
        ),
        pytest.param(
            "failed", 402, b"[" * 100_000 + b"]" * 100_000, {}, False, id="nested-past-the-decoder"
        ),
        pytest.param(
            "failed",
            402,
            b'{"error": {"type": "card_error", "code": "card_declined", "payment": {"id": '
            b'"pay_1", "status": "failed", "idempotency_key": "KEY-step2", "metadata": {}}}}',
            {},
            True,
            id="a-decline-carrying-the-payment-and-its-key-field",
        ),
        pytest.param(
            "failed",
            409,
            b'{"error": {"type": "invalid_request_error"}}',
            {},
            False,
            id="in-flight-status",
        ),
        pytest.param(
            "failed",
            500,
            b'{"error": {}}',
            {"headers": (("stripe-should-retry", "false"),)},
            False,
            id="5xx-do-not-retry",
        ),
        pytest.param("failed", 200, b'{"status": "canceled"}', {}, False, id="found-by-look-up"),
        pytest.param("succeeded", 200, b"{}", {}, False, id="succeeded"),
        pytest.param("unknown", 402, DECLINE, {}, False, id="unknown"),
        pytest.param("pending", 402, DECLINE, {}, False, id="pending"),
        pytest.param("abandoned", 402, DECLINE, {}, False, id="abandoned"),
    ],
)
def test_only_a_refusal_in_the_provider_s_own_answer_is_passed_over(
    state: str, status: int, body: bytes, more: dict[str, Any], passed_over: bool
) -> None:
    record = journaled_step_2(state, status, body, **more)
    assert may_pass_over(record, CARD_B_DRAFT, get_profile("stripe")) is passed_over


def test_a_decline_echoing_its_own_key_is_passed_over_whatever_the_key_s_words() -> None:
    """A block keyed ``idempotent-order``: its step 2's key names idempotency itself, and
    the decline carries that key back; that is no refusal about the key."""
    draft = attrs.evolve(
        CARD_B_DRAFT,
        key="idempotent-order-step2",
        intent_key="idempotent-order",
        derived_key="idempotent-order-step2",
    )
    body = (
        b'{"error": {"code": "card_declined", "payment": {"idempotency_key": '
        b'"idempotent-order-step2", "description": "order idempotent-order-step2"}}}'
    )
    declined = attrs.evolve(journaled_step_2("failed", 402, body), key=draft.key)
    assert may_pass_over(declined, draft, get_profile("stripe"))
    refused = attrs.evolve(
        declined,
        response=attrs.evolve(
            declined.response, body=b'{"error": {"message": "idempotency key reused"}}'
        ),
    )
    assert not may_pass_over(refused, draft, get_profile("stripe"))


def test_a_declined_step_is_not_passed_over_by_the_same_request_or_another_intent_s_row() -> None:
    declined = journaled_step_2("failed", 402, DECLINE)
    stripe_profile = get_profile("stripe")
    assert may_pass_over(declined, CARD_B_DRAFT, stripe_profile)
    # The same request under another key: a key that changed between runs.
    same = attrs.evolve(declined, fingerprint=CARD_B_DRAFT.fingerprint, key="K")
    assert not may_pass_over(same, CARD_B_DRAFT, stripe_profile)
    # A row a key the caller set points to, of another block.
    elsewhere = attrs.evolve(declined, reference="order-2#step2", key="K")
    assert not may_pass_over(elsewhere, CARD_B_DRAFT, stripe_profile)
    # Another block's row at this very step reference (a block keyed 'order-1').
    another_block = attrs.evolve(declined, key="order-1-step2")
    assert not may_pass_over(another_block, CARD_B_DRAFT, stripe_profile)
    # A step under a key the caller set: nothing ties it to this block's position.
    caller_keyed = attrs.evolve(declined, key="order-1-pay")
    card_b_caller_keyed = attrs.evolve(CARD_B_DRAFT, key="order-1-pay")
    assert not may_pass_over(caller_keyed, card_b_caller_keyed, stripe_profile)


# -- killed after the decline ----------------------------------------------------------------

WORKER = TESTS / "_sdk_checkout_worker.py"


@pytest.mark.slow
def test_a_worker_killed_after_the_decline_and_run_again_with_another_card_pays_once(
    server: SandboxServer, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.db"
    command = [sys.executable, str(WORKER), "--sdk", "stripe", "--url", server.url]
    command += ["--orders", "1", "--journal", str(journal)]

    code, _ = run_checkout_worker([*command, "--card", CARD_A, "--die-if-declined"], server)
    assert code == KILLED
    assert sum(server.store.executions().values()) == 2  # created, and card A declined

    code, answers = run_checkout_worker([*command, "--card", CARD_B], server)

    assert code == 0
    (intent,) = server.store.payment_intents()
    assert answers == [
        {
            "order": "order-0",
            "id": intent["id"],
            "status": "succeeded",
            "parsed": answers[0]["parsed"],
        }
    ]
    assert intent["status"] == "succeeded"
    assert sorted(server.store.executions().values()) == [1, 1, 1]
    journal_view = payonce.open_journal(journal)
    try:
        (first,) = journal_view.find("order-0")
        steps = journal_view.steps(first.key)
    finally:
        journal_view.close()
    assert [(s.reference, s.state.value) for s in steps] == [
        ("order-0#step2", "failed"),
        ("order-0#step3", "succeeded"),
    ]
