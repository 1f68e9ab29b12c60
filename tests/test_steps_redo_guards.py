"""What a later run may NOT pass over: the red team's shapes of "a declined step".

A journaled step that failed may be passed over by a later run whose request at that
position differs (``test_steps_redo``): only when the failure is the provider's refusal
of that very request, of this very block. Here, each way something else could pass for
one, against the sandbox's dialects on a SQLite journal file:

- the provider's word that the step's key already holds another request (a journal
  restored from an older copy lost the step that paid): Adyen's and Mollie's answers;
- another block's step under the same step reference (two intents named ``order-9``);
- a step whose key the caller set (it cannot be tied to the block).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.payments import DECLINED, PAYMENT, MakeClient
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

ORDER = "order-r"
OTHER_AMOUNT = {**PAYMENT, "amount": 4300}
THIRD_AMOUNT = {**PAYMENT, "amount": 4400}


@pytest.fixture(params=["adyen", "mollie"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def dialect(shared_sandboxes: SharedSandboxes, provider: str) -> SandboxServer:
    return shared_sandboxes.get(f"redo guards {provider}", SandboxConfig.like(provider))


def test_a_step_whose_key_holds_another_payment_is_never_passed_over(
    provider: str, dialect: SandboxServer, client_options: dict[str, Any], journal_path: Path
) -> None:
    """The red team's repro: the journal is restored from a backup taken before step 2
    paid. A run with another amount meets the provider's "this key holds another request"
    at step 2; a run again must not take that for a decline and pay a second time at step
    3. Each run is a process of its own: its client is closed when it ends."""
    options = {**client_options, "base_url": dialect.url, "provider": provider}

    def run(*payments: dict[str, Any]) -> payonce.Operation:
        with payonce.Client(**options) as client, client.intent(ORDER) as op:
            for payment in payments:
                op.post("/v1/payments", json=payment)
        return op

    run(PAYMENT)
    backup = journal_path.with_name("before-step-2.db")
    with payonce.Client(**options) as client:
        client.journal.backup(backup)
    paid = run(PAYMENT, PAYMENT)  # step 2 pays
    (_, key, _), (_, step_2_key, _) = paid.steps
    # The operator restores the backup (the processes stopped): step 2's row is gone.
    for leftover in journal_path.parent.glob(journal_path.name + "-*"):
        leftover.unlink()
    shutil.copyfile(backup, journal_path)

    with pytest.raises(payonce.IntentMismatch) as reused:
        run(PAYMENT, OTHER_AMOUNT)  # the key of step 2 holds the first run's payment
    assert reused.value.key == step_2_key
    with payonce.Client(**options) as client:
        (step_2,) = client.journal.steps(key)
        before = client.journal.list_intents()
    assert step_2.state is payonce.IntentState.FAILED

    with pytest.raises(payonce.IntentMismatch) as again:
        run(PAYMENT, THIRD_AMOUNT)

    assert again.value.step == 2
    assert dialect.store.executions() == {key: 1, step_2_key: 1}, "step 2 paid once, no step 3"
    with payonce.Client(**options) as client:
        assert client.journal.list_intents() == before


def test_adyen_s_200_refused_is_no_declined_step_a_later_run_passes_over(
    shared_sandboxes: SharedSandboxes, make_client: MakeClient
) -> None:
    """Adyen answers a decline with 200 ``resultCode: Refused``: journaled as succeeded,
    so another card at its position is refused as a changed step, nothing sent; the
    refusal says the step's answer was a decline, not "its operation is done". The block
    that tries the other card after the declined one pays it as the next step."""
    adyen = shared_sandboxes.get("redo guards adyen", SandboxConfig.like("adyen"))
    client = make_client(base_url=adyen.url, provider="adyen")

    def run(*payments: dict[str, Any]) -> list[str]:
        with client.intent("order-a") as op:
            return [op.post("/v1/payments", json=p).json()["resultCode"] for p in payments]

    assert run(PAYMENT, DECLINED) == ["Authorised", "Refused"]
    executed = adyen.store.executions()
    before = client.journal.list_intents()

    with pytest.raises(payonce.IntentMismatch) as refused:
        run(PAYMENT, OTHER_AMOUNT)

    assert refused.value.step == 2
    message = str(refused.value)
    assert "a 2xx whose body declines the payment (e.g. Adyen's resultCode Refused)" in message
    assert "its operation is done" not in message
    assert adyen.store.executions() == executed
    assert client.journal.list_intents() == before
    # As the refusal advises: the declined card first (replayed), then the other one.
    assert run(PAYMENT, DECLINED, OTHER_AMOUNT) == ["Authorised", "Refused", "Authorised"]
    assert adyen.store.total_executions() == sum(executed.values()) + 1


def block(client: payonce.Client, *steps: tuple[str, dict[str, Any]], **name: str) -> None:
    """A block of ``client`` (``name``: its reference, or ``key=``) making ``steps``."""
    with client.intent(name.pop("reference", None), **name) as op:
        for path, form in steps:
            op.post(path, data=form)


def declined_at_step_2(client: payonce.Client, **name: str) -> None:
    """Block P: step 1 pays, step 2 is declined (the sandbox's 402)."""
    with pytest.raises(payonce.ProviderError) as declined:
        block(client, ("/v1/payments", PAYMENT), ("/v1/payments", DECLINED), **name)
    assert declined.value.status_code == 402


def refused_without_a_trace(
    server: SandboxServer, client: payonce.Client, *steps: tuple[str, dict[str, Any]], **name: str
) -> payonce.IntentMismatch:
    """Block Q is refused at its step 2: nothing of it beyond its step 1 is sent or
    journaled, and P's rows are as they were."""
    executed = server.store.executions()
    before = client.journal.list_intents()
    with pytest.raises(payonce.IntentMismatch) as refused:
        block(client, *steps, **name)
    (q,) = [r for r in client.journal.list_intents() if r not in before]
    assert server.store.executions() == {**executed, q.key: 1}
    assert client.journal.steps(q.key) == []
    assert [r for r in client.journal.list_intents() if r != q] == before
    return refused.value


def test_a_block_never_passes_over_the_declined_step_of_a_block_keyed_by_its_reference(
    dialect_stripe: SandboxServer, make_stripe_client: MakeClient
) -> None:
    """``c.intent(key="order-9")`` and ``c.intent("order-9")``: two blocks whose steps share
    the step references ``order-9#stepN``. Block Q must not pass over block P's declined
    step 2 and journal its payment as P's step 3 (P would then be told its step 3
    succeeded)."""
    client = make_stripe_client()
    declined_at_step_2(client, key="order-9")

    refused = refused_without_a_trace(
        dialect_stripe,
        client,
        ("/v1/payments", OTHER_AMOUNT),
        ("/v1/payments", THIRD_AMOUNT),
        reference="order-9",
    )

    assert refused.step == 2
    assert "holds step 2 of another block named alike (key order-9-step2, not" in str(refused)
    declined_at_step_2(client, key="order-9")  # P's step 2 is still P's decline


def test_a_block_whose_first_request_goes_elsewhere_is_the_same_intent_and_passes_nothing_over(
    dialect_stripe: SandboxServer, make_stripe_client: MakeClient
) -> None:
    """A reference names one intent, whatever endpoint its block's first request goes to:
    block Q under ``order-9`` is P's intent. Its request to an endpoint P never used is a
    step added after P's; its payment of another amount meets P's first payment (the
    first journaled there, which succeeded) and is refused: P's declined step 2 is never
    passed over by it."""
    client = make_stripe_client()
    declined_at_step_2(client, reference="order-9")
    executed = dialect_stripe.store.executions()
    before = client.journal.list_intents()

    with pytest.raises(payonce.IntentMismatch) as refused:
        block(
            client,
            ("/v1/payment_intents", {"amount": 2100, "currency": "eur"}),
            ("/v1/payments", OTHER_AMOUNT),
            reference="order-9",
        )

    assert refused.value.step == 1
    assert "differs from the one first journaled for it in the body" in str(refused.value)
    (added,) = [r for r in client.journal.list_intents() if r not in before]
    assert (added.reference, added.method) == ("order-9#step3", "POST")
    assert added.url.endswith("/v1/payment_intents")
    assert dialect_stripe.store.executions() == {**executed, added.key: 1}
    assert [r for r in client.journal.list_intents() if r != added] == before


def test_a_declined_step_under_a_key_the_caller_set_is_never_passed_over(
    dialect_stripe: SandboxServer, make_stripe_client: MakeClient
) -> None:
    """A key your code sets on a step (``Idempotency-Key: order-k-pay``, the same on every
    run) cannot be tied to the block's position: its declined step is not passed over, and
    the other card is refused at step 2, nothing sent."""
    client = make_stripe_client()

    def run(payment: dict[str, Any]) -> None:
        http = httpx.Client(
            base_url=dialect_stripe.url,
            transport=client.transport(),
            headers={"Authorization": f"Bearer {DEFAULT_API_KEY}"},
        )
        with http, client.intent("order-k"):
            http.post("/v1/payments", data=PAYMENT)
            paid = http.post("/v1/payments", data=payment, headers={"Idempotency-Key": CALLER_KEY})
            paid.raise_for_status()

    with pytest.raises(httpx.HTTPStatusError, match="402"):
        run(DECLINED)
    executed = dialect_stripe.store.executions()
    before = client.journal.list_intents()

    with pytest.raises(payonce.IntentMismatch) as refused:
        run(OTHER_AMOUNT)

    assert (refused.value.step, refused.value.key) == (2, CALLER_KEY)
    assert dialect_stripe.store.executions() == executed
    assert client.journal.list_intents() == before


CALLER_KEY = "order-k-pay"


@pytest.fixture
def dialect_stripe(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("redo guards stripe", SandboxConfig.like("stripe"))


@pytest.fixture
def make_stripe_client(
    make_client: MakeClient, dialect_stripe: SandboxServer
) -> Callable[..., payonce.Client]:
    def make(**overrides: Any) -> payonce.Client:
        return make_client(base_url=dialect_stripe.url, provider="stripe", **overrides)

    return make
