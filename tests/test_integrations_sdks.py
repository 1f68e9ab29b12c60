"""The provider SDKs themselves (stripe-python, Adyen, mollie-api-python, Square) plugged
into a real payonce client's transport by ``payonce.integrations``, against the sandbox's
dialect of each provider, over loopback, on a real journal (a SQLite file; PostgreSQL too
for one scenario per SDK).

Under lost answers (``drop_after``), 5xx before and after executing and in-flight 409s,
each business operation executes once (counted on the sandbox's store), the code that
runs again gets the same objects, and an outcome that stays unknown reaches the SDK's
caller as the exception that SDK's callers catch, naming the key and the reference. The
baselines show what payonce is for: each SDK alone, a create whose answer is lost and the
code run again, pays twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import Adyen
import httpx
import mollie.api.client
import mollie.api.error
import pytest
import requests
import stripe
from square import AsyncSquare, Square
from square.core.api_error import ApiError as SquareApiError

import payonce
from helpers.payments import FAST_RETRY, payonce_options
from helpers.processes import mypy_strict, python_output
from helpers.sandboxes import SharedSandboxes
from payonce.integrations import adyen as adyen_integration
from payonce.integrations import mollie as mollie_integration
from payonce.integrations import square as square_integration
from payonce.integrations import stripe as stripe_integration
from payonce.sandbox import DEFAULT_API_KEY, MOLLIE_TEST_API_KEY, SandboxConfig, SandboxServer

FAULTS = [
    pytest.param(["drop_after"], id="answer-lost"),
    pytest.param(["fail_after"], id="5xx-after-executing"),
    pytest.param(["fail_before"], id="5xx-before-executing"),
    pytest.param(["lock_timeout"], id="409-in-flight"),
]
UNANSWERED = ["fail_before"] * FAST_RETRY.max_attempts
"""Every attempt of a step meets a 503: whether it executed, payonce cannot tell."""
ONCE = payonce.RetryPolicy(max_attempts=1)
T = TypeVar("T")

MakePayonce = Callable[..., payonce.Client]


def sandbox_like(shared: SharedSandboxes, provider: str) -> SandboxServer:
    return shared.get(f"sdk {provider}", SandboxConfig.like(provider))  # type: ignore[arg-type]


def payonce_maker(
    server: SandboxServer, provider: str, journal: str | Path, closing: contextlib.ExitStack
) -> MakePayonce:
    def make(**overrides: Any) -> payonce.Client:
        options = {**payonce_options(server, provider, journal), **overrides}
        return closing.enter_context(payonce.Client(**options))

    return make


def unknown_key(error: Exception) -> str:
    """The key of the payonce error an SDK's exception carries."""
    found = getattr(error, "payonce_error", None)
    assert isinstance(found, payonce.OutcomeUnknown), f"{error!r} carries {found!r}"
    assert found.key is not None
    return found.key


# -- Stripe ------------------------------------------------------------------------------------


@pytest.fixture
def stripe_server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return sandbox_like(shared_sandboxes, "stripe")


@pytest.fixture
def stripe_client(closing: contextlib.ExitStack) -> Callable[..., stripe.StripeClient]:
    """stripe-python pointed at a sandbox: over its default HTTP client (requests, with a
    session closed when the test ends) unless given another."""

    def make(server: SandboxServer, **options: Any) -> stripe.StripeClient:
        if "http_client" not in options:
            session = closing.enter_context(requests.Session())
            options["http_client"] = stripe.RequestsClient(session=session)
        else:
            closing.callback(options["http_client"].close)
        return stripe.StripeClient(DEFAULT_API_KEY, base_addresses={"api": server.url}, **options)

    return make


@pytest.fixture
def stripe_payonce(
    stripe_server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> MakePayonce:
    return payonce_maker(stripe_server, "stripe", journal_path, closing)


@pytest.fixture
def stripe_through(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    stripe_payonce: MakePayonce,
) -> Callable[..., tuple[payonce.Client, stripe.StripeClient]]:
    """A payonce client and stripe-python over it: the one added line."""

    def make(
        *, max_network_retries: int = 0, **payonce_overrides: Any
    ) -> tuple[payonce.Client, stripe.StripeClient]:
        client = stripe_payonce(**payonce_overrides)
        http_client = stripe_integration.HTTPClient(client)
        sdk = stripe_client(
            stripe_server, http_client=http_client, max_network_retries=max_network_retries
        )
        return client, sdk

    return make


def checkout(client: stripe.StripeClient, order: str) -> stripe.PaymentIntent:
    """A shop's checkout: create a PaymentIntent for the order, then confirm it."""
    intent = client.v1.payment_intents.create(
        params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
    )
    return client.v1.payment_intents.confirm(intent.id, params={"payment_method": "pm_card_visa"})


def intents_of(server: SandboxServer, order: str) -> list[dict[str, Any]]:
    return [i for i in server.store.payment_intents() if i["metadata"].get("order") == order]


def test_a_stripe_python_checkout_through_payonce_creates_and_confirms_once_and_replays(
    stripe_server: SandboxServer,
    stripe_through: Callable[..., tuple[payonce.Client, stripe.StripeClient]],
) -> None:
    client, sdk = stripe_through()
    with client.intent("order-1") as op:
        paid = checkout(sdk, "order-1")
    assert paid.status == "succeeded"
    assert sdk.v1.payment_intents.retrieve(paid.id).status == "succeeded"  # a read: no step
    keys = [key for _, key, _ in op.steps]
    assert stripe_server.store.executions() == {key: 1 for key in keys}
    assert keys[1] == f"{keys[0]}-step2"

    # The same code run again (a new process would do the same: another stripe-python,
    # whose own random keys and telemetry headers differ) is answered from the journal.
    again_client, again_sdk = stripe_through()
    with again_client.intent("order-1"):
        again = checkout(again_sdk, "order-1")
    assert (again.id, again.status) == (paid.id, "succeeded")
    assert stripe_server.store.executions() == {key: 1 for key in keys}
    assert len(intents_of(stripe_server, "order-1")) == 1


def test_a_key_the_caller_gave_stripe_python_is_the_step_s_key_never_replaced(
    stripe_server: SandboxServer,
    stripe_through: Callable[..., tuple[payonce.Client, stripe.StripeClient]],
) -> None:
    params = {"amount": 2000, "currency": "eur", "metadata": {"order": "order-77"}}
    client, sdk = stripe_through()
    # The shop's own key, under two references (a web handler, then a webhook): stripe-python
    # alone would make one PaymentIntent, and so does payonce.
    created = []
    for reference in ("web-order-77", "webhook-order-77"):
        with client.intent(reference) as op:
            created.append(
                sdk.v1.payment_intents.create(
                    params=params, options={"idempotency_key": "charge-order-77"}
                ).id
            )
        assert [key for _, key, _ in op.steps] == ["charge-order-77"]
    assert [i["id"] for i in intents_of(stripe_server, "order-77")] == created[:1]
    assert created[1] == created[0]
    assert stripe_server.store.executions() == {"charge-order-77": 1}

    # A key stripe-python drew itself is still replaced by the step's.
    with client.intent("order-78") as op:
        sdk.v1.payment_intents.create(params={**params, "metadata": {"order": "order-78"}})
    ((_, key, _),) = op.steps
    assert client.journal.find("order-78")[0].key == key
    assert stripe_server.store.executions()[key] == 1


def test_a_wrong_api_key_is_stripe_python_s_own_error_and_the_step_waits_under_its_key(
    stripe_server: SandboxServer,
    stripe_payonce: MakePayonce,
    stripe_through: Callable[..., tuple[payonce.Client, stripe.StripeClient]],
    closing: contextlib.ExitStack,
) -> None:
    client = stripe_payonce()
    http_client = closing.enter_context(contextlib.closing(stripe_integration.HTTPClient(client)))
    wrong = stripe.StripeClient(
        "sk_test_wrong", base_addresses={"api": stripe_server.url}, http_client=http_client
    )
    with pytest.raises(stripe.AuthenticationError) as caught, client.intent("order-401") as op:
        checkout(wrong, "order-401")
    # Stripe's own 401, raised by stripe-python from Stripe's answer: no payonce error in it.
    assert getattr(caught.value, "payonce_error", None) is None
    ((_, key, state),) = op.steps
    assert state is payonce.IntentState.PENDING  # not replayed: it waits for a working key
    assert stripe_server.store.executions().get(key, 0) == 0

    # The right key, the same code: the same step key, each step executed once.
    right_client, sdk = stripe_through()
    with right_client.intent("order-401") as again:
        paid = checkout(sdk, "order-401")
    assert paid.status == "succeeded"
    assert [k for _, k, _ in again.steps] == [key, f"{key}-step2"]
    assert stripe_server.store.executions() == {key: 1, f"{key}-step2": 1}


@pytest.mark.parametrize("faults", FAULTS)
@pytest.mark.parametrize("step", [1, 2])
def test_a_stripe_python_step_meeting_a_fault_executes_once_and_answers_the_sdk(
    stripe_server: SandboxServer,
    stripe_through: Callable[..., tuple[payonce.Client, stripe.StripeClient]],
    faults: list[str],
    step: int,
) -> None:
    client, sdk = stripe_through()
    with client.intent("order-faults"):
        if step == 1:
            stripe_server.script(faults)
        created = sdk.v1.payment_intents.create(
            params={"amount": 2000, "currency": "eur", "metadata": {"order": "order-faults"}}
        )
        if step == 2:
            stripe_server.script(faults)
        confirmed = sdk.v1.payment_intents.confirm(
            created.id, params={"payment_method": "pm_card_visa"}
        )
    # stripe-python parsed the provider's own objects, whatever the way they were recovered.
    assert created.object == "payment_intent"
    assert (confirmed.id, confirmed.status) == (created.id, "succeeded")
    assert sorted(stripe_server.store.executions().values()) == [1, 1]
    assert len(stripe_server.store.payment_intents()) == 1


def test_a_stripe_python_outcome_that_stays_unknown_is_a_connection_error_never_resent(
    stripe_server: SandboxServer,
    stripe_through: Callable[..., tuple[payonce.Client, stripe.StripeClient]],
) -> None:
    client, sdk = stripe_through()

    def pay() -> None:
        with client.intent("order-unknown"):
            checkout(sdk, "order-unknown")

    stripe_server.script(["none", *UNANSWERED])  # the create goes through; the confirm not
    with pytest.raises(stripe.APIConnectionError) as caught:
        pay()
    assert caught.value.should_retry is False  # stripe-python must not resend it itself
    key = unknown_key(caught.value)
    assert key.endswith("-step2")
    # The step is named by its position, its intent's reference and its own key, in the
    # words and in the attributes of the SDK's exception and of payonce's.
    assert f"step 2 of intent 'order-unknown' (key {key})" in str(caught.value)
    error = caught.value
    assert (error.payonce_key, error.payonce_reference, error.payonce_step) == (  # type: ignore[attr-defined]
        key,
        "order-unknown",
        2,
    )
    assert (error.payonce_error.reference, error.payonce_error.step) == ("order-unknown", 2)  # type: ignore[attr-defined]
    assert error.payonce_error.intent_key == key.removesuffix("-step2")  # type: ignore[attr-defined]
    executions = stripe_server.store.executions()
    with pytest.raises(stripe.APIConnectionError):
        pay()  # run again: the create replays, the confirm is refused, nothing is sent
    assert stripe_server.store.executions() == executions
    assert list(executions.values()) == [1]


def test_stripe_python_s_own_retries_are_off_payonce_s_are_under_the_step_s_key(
    stripe_server: SandboxServer,
    stripe_through: Callable[..., tuple[payonce.Client, stripe.StripeClient]],
) -> None:
    # A 503 with Stripe-Should-Retry: true, which stripe-python alone retries (here twice).
    # payonce given one attempt: the outcome stays unknown, and the SDK sends nothing more
    # (a resend of its own would have executed: the fault was scripted once).
    client, sdk = stripe_through(max_network_retries=2, retry=ONCE)
    stripe_server.script(["fail_before"])
    with client.intent("order-once"), pytest.raises(stripe.APIConnectionError):
        sdk.v1.payment_intents.create(params={"amount": 900, "currency": "eur"})
    assert stripe_server.store.payment_intents() == []
    # payonce's own retries resend under the step's key, which the provider executes once.
    client, sdk = stripe_through()
    stripe_server.script(["fail_before", "fail_before"])
    with client.intent("order-twice") as op:
        sdk.v1.payment_intents.create(params={"amount": 900, "currency": "eur"})
    assert stripe_server.store.executions() == {key: 1 for _, key, _ in op.steps}


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_stripe_python_checkout_on_a_postgresql_journal_recovers_a_lost_answer(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    location: str,
    closing: contextlib.ExitStack,
) -> None:
    def run() -> stripe.PaymentIntent:
        client = payonce_maker(stripe_server, "stripe", location, closing)()
        sdk = stripe_client(stripe_server, http_client=stripe_integration.HTTPClient(client))
        with client.intent("order-pg"):
            return checkout(sdk, "order-pg")

    stripe_server.script(["none", "drop_after"])
    paid = run()
    assert (run().id, paid.status) == (paid.id, "succeeded")
    assert sorted(stripe_server.store.executions().values()) == [1, 1]


async def in_an_async_block(
    server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    journal: Path,
    reference: str,
    body: Callable[[stripe.StripeClient], Awaitable[T]],
) -> T:
    """``body`` given stripe-python over a payonce AsyncClient, in that client's block for
    ``reference``."""
    async with payonce.AsyncClient(**payonce_options(server, "stripe", journal)) as client:
        http = stripe_integration.HTTPClient(client)
        sdk = stripe_client(server, http_client=http)
        try:
            async with client.intent(reference):
                return await body(sdk)
        finally:
            await http.close_async()


def test_stripe_python_async_through_an_async_client(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    journal_path: Path,
) -> None:
    async def checkout_async(sdk: stripe.StripeClient) -> stripe.PaymentIntent:
        stripe_server.script(["drop_after"])
        created = await sdk.v1.payment_intents.create_async(
            params={"amount": 900, "currency": "eur"}
        )
        return await sdk.v1.payment_intents.confirm_async(
            created.id, params={"payment_method": "pm_card_visa"}
        )

    def pay() -> Coroutine[Any, Any, stripe.PaymentIntent]:
        return in_an_async_block(
            stripe_server, stripe_client, journal_path, "order-async", checkout_async
        )

    paid = asyncio.run(pay())
    assert paid.status == "succeeded"
    assert asyncio.run(pay()).id == paid.id
    assert sorted(stripe_server.store.executions().values()) == [1, 1]


def test_an_integration_over_an_async_client_refuses_sync_calls_as_a_configuration_error(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    journal_path: Path,
) -> None:
    async def make() -> stripe_integration.HTTPClient:
        return stripe_integration.HTTPClient(
            payonce.AsyncClient(**payonce_options(stripe_server, "stripe", journal_path))
        )

    sdk = stripe_client(stripe_server, http_client=asyncio.run(make()))
    # A wiring mistake, payonce's own error: never a network error someone might retry.
    with pytest.raises(payonce.ConfigurationError, match="over an AsyncClient"):
        sdk.v1.payment_intents.create(params={"amount": 900, "currency": "eur"})
    assert stripe_server.store.total_executions() == 0


def test_an_integration_over_a_sync_client_refuses_async_calls_as_a_configuration_error(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    stripe_payonce: MakePayonce,
) -> None:
    sdk = stripe_client(stripe_server, http_client=stripe_integration.HTTPClient(stripe_payonce()))

    async def create() -> Any:
        return await sdk.v1.payment_intents.create_async(params={"amount": 900, "currency": "eur"})

    with pytest.raises(payonce.ConfigurationError, match="as async_client= for async calls"):
        asyncio.run(create())
    assert stripe_server.store.total_executions() == 0


def test_two_stripe_python_calls_at_once_in_one_block_are_payonce_s_configuration_error(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    journal_path: Path,
) -> None:
    # A programming error (the steps of one intent run one after another): raised as
    # itself, never as an APIConnectionError someone may retry.
    async def pay_twice_at_once(sdk: stripe.StripeClient) -> list[Any]:
        return await asyncio.gather(
            sdk.v1.payment_intents.create_async(params={"amount": 900, "currency": "eur"}),
            sdk.v1.payment_intents.create_async(params={"amount": 901, "currency": "eur"}),
            return_exceptions=True,
        )

    created, refused = asyncio.run(
        in_an_async_block(
            stripe_server, stripe_client, journal_path, "order-gather", pay_twice_at_once
        )
    )
    assert isinstance(created, stripe.PaymentIntent)
    assert type(refused) is payonce.ConfigurationError
    assert "one after another" in str(refused)
    assert list(stripe_server.store.executions().values()) == [1]
    assert [i["id"] for i in stripe_server.store.payment_intents()] == [created.id]


ELSEWHERE = "http://localhost:9"
"""Not the sandbox's address: a payonce client there refuses every request an SDK pointed
at the sandbox sends through it (a programming error), before sending anything."""


@pytest.mark.parametrize("sdk", ["stripe", "adyen", "mollie", "square"])
def test_a_programming_error_reaches_the_sdk_s_caller_as_itself_never_as_a_network_error(
    shared_sandboxes: SharedSandboxes, journal_path: Path, closing: contextlib.ExitStack, sdk: str
) -> None:
    server = sandbox_like(shared_sandboxes, sdk)
    client = payonce_maker(server, sdk, journal_path, closing)(base_url=ELSEWHERE)
    pay: Callable[[], Any]
    if sdk == "stripe":
        http_client = stripe_integration.HTTPClient(client)
        closing.callback(http_client.close)
        payments = stripe.StripeClient(
            DEFAULT_API_KEY, base_addresses={"api": server.url}, http_client=http_client
        ).v1.payment_intents
        pay = functools.partial(payments.create, params={"amount": 900, "currency": "eur"})
    elif sdk == "adyen":
        adyen = adyen_sdk(server)
        adyen_integration.use_transport(adyen, client)
        pay = functools.partial(adyen.checkout.payments_api.payments, adyen_payment("order-x"))
    elif sdk == "mollie":
        mollie_client = mollie_sdk(server)
        closing.enter_context(mollie_integration.use_transport(mollie_client, client))
        pay = functools.partial(mollie_client.payments.create, MOLLIE_PAYMENT)
    else:
        http = closing.enter_context(square_integration.httpx_client(client))
        square = Square(token=DEFAULT_API_KEY, base_url=server.url, httpx_client=http)
        pay = functools.partial(square_pay, square, "k-misplugged")
    with client.intent("order-misplugged"), pytest.raises(payonce.ConfigurationError) as caught:
        pay()
    assert type(caught.value) is payonce.ConfigurationError
    assert "is not under this client's base_url" in str(caught.value)
    assert server.store.total_executions() == 0


@contextlib.contextmanager
def started_elsewhere(
    client: payonce.Client, reference: str, pay: Callable[[], Any]
) -> Iterator[None]:
    """``pay`` running in another worker (a thread here), its intent journaled and its
    request on its way when the block starts; joined at the end of the block."""
    worker = threading.Thread(target=pay)
    worker.start()
    try:
        deadline = time.monotonic() + 5.0
        while not client.journal.find(reference):  # claimed, so its lease is held
            assert time.monotonic() < deadline, "the other worker never started"
            time.sleep(0.005)
        yield
    finally:
        worker.join()


@pytest.mark.parametrize("sdk", ["stripe", "square"])
def test_a_step_another_worker_is_sending_is_the_sdk_s_no_answer_error_and_executes_once(
    journal_path: Path, closing: contextlib.ExitStack, sdk: str
) -> None:
    # The provider takes its time; a second worker that will not wait for the first one's
    # answer is told so in its SDK's words, and nothing is sent twice.
    config = SandboxConfig.like(sdk, processing_seconds=0.5)  # type: ignore[arg-type]
    server = closing.enter_context(SandboxServer(config))
    make_client = payonce_maker(server, sdk, journal_path, closing)
    patient, impatient = make_client(), make_client(in_flight_wait=0.0)

    def pay(client: payonce.Client) -> None:
        with client.intent("order-busy"):
            if sdk == "stripe":
                http_client = stripe_integration.HTTPClient(client)
                closing.callback(http_client.close)
                stripe.StripeClient(
                    DEFAULT_API_KEY, base_addresses={"api": server.url}, http_client=http_client
                ).v1.payment_intents.create(params={"amount": 900, "currency": "eur"})
            else:
                http = closing.enter_context(square_integration.httpx_client(client))
                square = Square(token=DEFAULT_API_KEY, base_url=server.url, httpx_client=http)
                square_pay(square, "k-busy")

    errors = {"stripe": stripe.APIConnectionError, "square": SquareApiError}
    with (
        started_elsewhere(patient, "order-busy", lambda: pay(patient)),
        pytest.raises(errors[sdk]) as caught,
    ):
        pay(impatient)
    assert isinstance(caught.value.payonce_error, payonce.IntentInFlight)  # type: ignore[union-attr]
    assert "another worker" in str(caught.value)
    if sdk == "stripe":
        assert caught.value.should_retry is False  # type: ignore[union-attr]
    server.wait_idle()
    assert server.store.total_executions() == 1


def test_baseline_stripe_python_alone_pays_twice_when_an_answer_is_lost_and_it_runs_again(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
) -> None:
    # The first run's create executes and its answer is cut off mid-body, which
    # stripe-python does not retry; the process gives up, runs again for the same order,
    # and stripe-python draws a new key.
    stripe_server.script(["drop_after"])
    with pytest.raises(stripe.APIConnectionError):
        checkout(stripe_client(stripe_server, max_network_retries=2), "order-1")
    checkout(stripe_client(stripe_server), "order-1")
    orders = [intent["metadata"]["order"] for intent in stripe_server.store.payment_intents()]
    assert orders == ["order-1", "order-1"]


# -- Adyen -------------------------------------------------------------------------------------


@pytest.fixture
def adyen_server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return sandbox_like(shared_sandboxes, "adyen")


def adyen_sdk(server: SandboxServer) -> Adyen.Adyen:
    adyen = Adyen.Adyen(xapikey=DEFAULT_API_KEY, platform="test")
    # Adyen's services hold their base URL (https://checkout-test.adyen.com/v72).
    for api in (adyen.checkout.payments_api, adyen.checkout.modifications_api):
        api.baseUrl = api.baseUrl.replace("https://checkout-test.adyen.com", server.url)
    return adyen


@pytest.fixture
def adyen_through(
    adyen_server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> Callable[..., tuple[payonce.Client, Adyen.Adyen]]:
    """A payonce client whose base URL is Adyen's (with its version), and Adyen over it."""

    def make(
        *, sdk_keys: str | None = None, **overrides: Any
    ) -> tuple[payonce.Client, Adyen.Adyen]:
        adyen = adyen_sdk(adyen_server)
        base_url = adyen.checkout.payments_api.baseUrl
        make_client = payonce_maker(adyen_server, "adyen", journal_path, closing)
        client = make_client(base_url=base_url, **overrides)
        adyen_integration.use_transport(adyen, client, sdk_keys=sdk_keys)
        closing.callback(adyen.client.http_client.close)
        return client, adyen

    return make


def adyen_payment(order: str, value: int = 1000) -> dict[str, Any]:
    return {
        "amount": {"value": value, "currency": "EUR"},
        "reference": order,
        "merchantAccount": "PayonceShop",
        "paymentMethod": {"type": "scheme", "encryptedCardNumber": "test_4111111111111111"},
        "returnUrl": "https://shop.example/return",
    }


def adyen_checkout(adyen: Adyen.Adyen, order: str, key: str | None = None) -> tuple[Any, Any]:
    """Authorise the payment, then capture it (Adyen's two steps)."""
    keys = {} if key is None else {"idempotency_key": key}
    paid = adyen.checkout.payments_api.payments(adyen_payment(order), **keys)
    capture = {"merchantAccount": "PayonceShop", "amount": {"value": 1000, "currency": "EUR"}}
    keys = {} if key is None else {"idempotency_key": f"{key}-capture"}
    captured = adyen.checkout.modifications_api.capture_authorised_payment(
        capture, paid.message["pspReference"], **keys
    )
    return paid, captured


@pytest.mark.parametrize("faults", FAULTS)
@pytest.mark.parametrize("step", [1, 2])
def test_adyen_authorise_and_capture_through_payonce_execute_once_under_faults(
    adyen_server: SandboxServer,
    adyen_through: Callable[..., tuple[payonce.Client, Adyen.Adyen]],
    faults: list[str],
    step: int,
) -> None:
    client, adyen = adyen_through()
    with client.intent("order-1") as op:
        adyen_server.script(faults if step == 1 else ["none", *faults])
        paid, captured = adyen_checkout(adyen, "order-1")
    assert paid.message["resultCode"] == "Authorised"
    assert captured.message["status"] == "received"
    # Adyen sends no key of its own: payonce's, one per step, are the ones executed.
    assert adyen_server.store.executions() == {key: 1 for _, key, _ in op.steps}


def test_adyen_keeps_its_callers_keys_and_a_run_again_replays(
    adyen_server: SandboxServer,
    adyen_through: Callable[..., tuple[payonce.Client, Adyen.Adyen]],
) -> None:
    client, adyen = adyen_through()
    with client.intent("order-2"):
        adyen_server.script(["drop_after"])
        paid, _ = adyen_checkout(adyen, "order-2", key="k-adyen-2")
    again_client, again_adyen = adyen_through()
    with again_client.intent("order-2"):
        again, captured = adyen_checkout(again_adyen, "order-2", key="k-adyen-2")
    assert again.message == paid.message
    assert captured.message["status"] == "received"
    assert adyen_server.store.executions() == {"k-adyen-2": 1, "k-adyen-2-capture": 1}


def test_adyen_with_a_fresh_key_per_call_replaced_pays_once_when_run_again(
    adyen_server: SandboxServer,
    adyen_through: Callable[..., tuple[payonce.Client, Adyen.Adyen]],
) -> None:
    # As Adyen's examples do: a uuid4 per call, which a run again would not make the same.
    def run() -> Any:
        client, adyen = adyen_through(sdk_keys="replace")
        with client.intent("order-3"):
            return adyen_checkout(adyen, "order-3", key=str(uuid.uuid4()))[0]

    adyen_server.script(["drop_after", "none", "fail_after"])
    paid = run()
    assert run().message == paid.message
    assert [p["reference"] for p in adyen_server.store.payments()] == ["order-3"]
    assert sorted(adyen_server.store.executions().values()) == [1, 1]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_adyen_s_unknown_outcome_is_its_communication_error_and_a_run_again_gets_the_replay(
    adyen_server: SandboxServer,
    location: str,
    closing: contextlib.ExitStack,
) -> None:
    # Adyen has no look-up by reference: a lost answer, not retried, goes unknown; a run
    # again resends it under its key while Adyen keeps the key, and gets Adyen's replay.
    adyen = adyen_sdk(adyen_server)
    base_url = adyen.checkout.payments_api.baseUrl
    client = payonce_maker(adyen_server, "adyen", location, closing)(base_url=base_url, retry=ONCE)
    adyen_integration.use_transport(adyen, client)
    closing.callback(adyen.client.http_client.close)

    def pay() -> Any:
        with client.intent("order-9"):
            return adyen.checkout.payments_api.payments(adyen_payment("order-9"))

    adyen_server.script(["drop_after"])
    with pytest.raises(Adyen.AdyenAPICommunicationError) as caught:
        pay()
    key = unknown_key(caught.value)
    assert f"{key!r}" in str(caught.value.message)
    assert "'order-9'" in str(caught.value.message)
    again = pay()
    assert again.message["merchantReference"] == "order-9"
    assert adyen_server.store.executions() == {key: 1}
    assert [p["reference"] for p in adyen_server.store.payments()] == ["order-9"]


# Adyen's default client calls requests.request(), whose connection cut off mid-body is
# left to the garbage collector: the SDK's leak, not the test's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_baseline_adyen_alone_pays_twice_when_an_answer_is_lost_and_it_runs_again(
    adyen_server: SandboxServer,
) -> None:
    adyen_server.script(["drop_after"])
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        adyen_sdk(adyen_server).checkout.payments_api.payments(adyen_payment("order-1"))
    gc.collect()  # the leaked connection goes now, under this test's filters
    adyen_sdk(adyen_server).checkout.payments_api.payments(adyen_payment("order-1"))
    assert [p["reference"] for p in adyen_server.store.payments()] == ["order-1", "order-1"]


# -- Mollie ------------------------------------------------------------------------------------


@pytest.fixture
def mollie_server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return sandbox_like(shared_sandboxes, "mollie")


def mollie_sdk(server: SandboxServer) -> mollie.api.client.Client:
    client = mollie.api.client.Client(api_endpoint=server.url)
    client.set_api_key(MOLLIE_TEST_API_KEY)
    return client


@pytest.fixture
def mollie_through(
    mollie_server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> Callable[..., tuple[payonce.Client, mollie.api.client.Client]]:
    def make(**overrides: Any) -> tuple[payonce.Client, mollie.api.client.Client]:
        client = payonce_maker(mollie_server, "mollie", journal_path, closing)(**overrides)
        sdk = mollie_sdk(mollie_server)
        closing.enter_context(mollie_integration.use_transport(sdk, client))
        return client, sdk

    return make


MOLLIE_PAYMENT = {
    "amount": {"currency": "EUR", "value": "10.00"},
    "description": "order-1",
    "redirectUrl": "https://shop.example/return",
    "metadata": {"order": "order-1"},
}


@pytest.mark.parametrize("faults", FAULTS)
def test_a_mollie_payment_through_payonce_is_created_once_under_faults_and_on_a_run_again(
    mollie_server: SandboxServer,
    mollie_through: Callable[..., tuple[payonce.Client, mollie.api.client.Client]],
    faults: list[str],
) -> None:
    def run() -> Any:
        client, sdk = mollie_through()
        with client.intent("order-1"):
            created = sdk.payments.create(MOLLIE_PAYMENT)
        assert sdk.payments.get(created.id).id == created.id  # a read passes through
        return created

    mollie_server.script(faults)
    created = run()
    assert (created.status, created.amount) == ("paid", {"value": "10.00", "currency": "EUR"})
    assert run().id == created.id  # mollie-api-python's new uuid4 key was replaced again
    assert [p["reference"] for p in mollie_server.store.payments()] == ["order-1"]
    assert sorted(mollie_server.store.executions().values()) == [1]


def test_a_key_the_caller_gave_mollie_is_the_step_s_key_and_its_own_keys_are_replaced(
    mollie_server: SandboxServer,
    mollie_through: Callable[..., tuple[payonce.Client, mollie.api.client.Client]],
) -> None:
    client, sdk = mollie_through()
    created = []
    for reference in ("web-order-1", "webhook-order-1"):
        with client.intent(reference) as op:
            created.append(sdk.payments.create(MOLLIE_PAYMENT, idempotency_key="pay-order-1").id)
        assert [key for _, key, _ in op.steps] == ["pay-order-1"]
    assert created[1] == created[0]
    assert mollie_server.store.executions() == {"pay-order-1": 1}

    with client.intent("order-2") as op:
        sdk.payments.create({**MOLLIE_PAYMENT, "description": "order-2"})
    ((_, key, _),) = op.steps
    assert client.journal.find("order-2")[0].key == key
    assert mollie_server.store.executions()[key] == 1


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_mollie_payment_on_a_postgresql_journal_is_created_once(
    mollie_server: SandboxServer, location: str, closing: contextlib.ExitStack
) -> None:
    def run() -> Any:
        client = payonce_maker(mollie_server, "mollie", location, closing)()
        sdk = mollie_sdk(mollie_server)
        closing.enter_context(mollie_integration.use_transport(sdk, client))
        with client.intent("order-pg"):
            return sdk.payments.create(MOLLIE_PAYMENT)

    mollie_server.script(["drop_after"])
    assert run().id == run().id
    assert sorted(mollie_server.store.executions().values()) == [1]


def test_mollie_reads_the_sandbox_s_refusal_as_its_own(
    mollie_server: SandboxServer,
    mollie_through: Callable[..., tuple[payonce.Client, mollie.api.client.Client]],
) -> None:
    client, sdk = mollie_through()
    with (
        client.intent("order-bad"),
        pytest.raises(mollie.api.error.UnprocessableEntityError) as refused,
    ):
        sdk.payments.create({**MOLLIE_PAYMENT, "amount": {"currency": "EUR", "value": "ten"}})
    assert "amount.value" in str(refused.value)
    assert mollie_server.store.total_executions() == 0


def test_mollie_s_unknown_outcome_is_its_request_error_and_a_run_again_gets_the_replay(
    mollie_server: SandboxServer,
    mollie_through: Callable[..., tuple[payonce.Client, mollie.api.client.Client]],
) -> None:
    client, sdk = mollie_through(retry=ONCE)

    def pay() -> Any:
        with client.intent("order-9"):
            return sdk.payments.create(MOLLIE_PAYMENT)

    mollie_server.script(["drop_after"])
    with pytest.raises(mollie.api.error.RequestError) as caught:
        pay()
    # mollie-api-python raises its RequestError while handling the requests error that
    # carries payonce's: it is the context, not the cause.
    key = unknown_key(caught.value.__context__ or caught.value)
    assert f"{key!r}" in str(caught.value)
    assert "'order-9'" in str(caught.value)
    # Mollie has no look-up: a run again within the key's hour resends it under its key.
    again = pay()
    assert again.id == mollie_server.store.payments()[0]["id"]
    assert mollie_server.store.executions() == {key: 1}


# As Adyen's: requests leaves a connection cut off mid-body to the garbage collector.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_baseline_mollie_alone_pays_twice_when_an_answer_is_lost_and_it_runs_again(
    mollie_server: SandboxServer,
) -> None:
    mollie_server.script(["drop_after"])
    with pytest.raises(mollie.api.error.RequestError):
        mollie_sdk(mollie_server).payments.create(MOLLIE_PAYMENT)
    gc.collect()
    mollie_sdk(mollie_server).payments.create(MOLLIE_PAYMENT)
    assert [p["reference"] for p in mollie_server.store.payments()] == ["order-1", "order-1"]


@pytest.mark.parametrize("sdk", ["mollie", "adyen", "square"])
def test_a_run_again_on_another_host_or_sdk_version_replays_despite_the_sdk_s_telemetry(
    shared_sandboxes: SharedSandboxes,
    journal_path: Path,
    closing: contextlib.ExitStack,
    monkeypatch: pytest.MonkeyPatch,
    sdk: str,
) -> None:
    # Each SDK describes its host and itself in headers (Mollie: the whole uname, host name
    # included; Adyen: its version; Square: the Python, OS release and SDK version). A
    # worker on another host, or upgraded, runs the same step: the same request.
    server = sandbox_like(shared_sandboxes, sdk)

    make_client = payonce_maker(server, sdk, journal_path, closing)

    def create_with_mollie() -> tuple[payonce.Client, Callable[[], str]]:
        client, mollie_client = make_client(), mollie_sdk(server)
        closing.enter_context(mollie_integration.use_transport(mollie_client, client))
        return client, lambda: str(mollie_client.payments.create(MOLLIE_PAYMENT).id)

    def create_with_adyen() -> tuple[payonce.Client, Callable[[], str]]:
        adyen = adyen_sdk(server)
        client = make_client(base_url=adyen.checkout.payments_api.baseUrl)
        adyen_integration.use_transport(adyen, client)
        closing.callback(adyen.client.http_client.close)
        api = adyen.checkout.payments_api
        return client, lambda: str(
            api.payments(adyen_payment("order-moved")).message["pspReference"]
        )

    def create_with_square() -> tuple[payonce.Client, Callable[[], str]]:
        client = make_client()
        http = closing.enter_context(square_integration.httpx_client(client))
        square = Square(token=DEFAULT_API_KEY, base_url=server.url, httpx_client=http)
        return client, lambda: str(square_pay(square, "k-moved").payment.id)

    plug = {"mollie": create_with_mollie, "adyen": create_with_adyen, "square": create_with_square}

    def pay() -> str:
        client, create = plug[sdk]()
        with client.intent("order-moved"):
            return create()

    first = pay()
    monkeypatch.setattr(mollie.api.client.Client, "UNAME", "Linux another-host 6.99.0 x86_64")
    monkeypatch.setattr(Adyen.settings, "LIB_VERSION", "99.0.0")
    monkeypatch.setattr("platform.release", lambda: "6.99.0-another")
    assert pay() == first
    assert sorted(server.store.executions().values()) == [1]


# -- Square ------------------------------------------------------------------------------------


@pytest.fixture
def square_server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return sandbox_like(shared_sandboxes, "square")


@pytest.fixture
def square_through(
    square_server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> Callable[..., tuple[payonce.Client, Square]]:
    def make(*, sdk_keys: str | None = None, **overrides: Any) -> tuple[payonce.Client, Square]:
        client = payonce_maker(square_server, "square", journal_path, closing)(**overrides)
        http = closing.enter_context(square_integration.httpx_client(client, sdk_keys=sdk_keys))
        return client, Square(token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http)

    return make


NO_SDK_RETRIES: Any = {"max_retries": 0}


def square_pay(square: Square, key: str, amount: int = 1500, **more: Any) -> Any:
    return square.payments.create(
        idempotency_key=key,
        source_id="cnon:card-nonce-ok",
        amount_money={"amount": amount, "currency": "USD"},
        reference_id="order-1",
        request_options=NO_SDK_RETRIES,
        **more,
    )


def square_checkout(square: Square, key: str) -> Any:
    """Approve the payment, then complete it (Square's two steps)."""
    approved = square_pay(square, key, autocomplete=False).payment
    assert approved.status == "APPROVED"
    return square.payments.complete(approved.id, request_options=NO_SDK_RETRIES).payment


@pytest.mark.parametrize("faults", FAULTS)
@pytest.mark.parametrize("step", [1, 2])
def test_square_with_a_fresh_key_per_call_replaced_pays_and_completes_once(
    square_server: SandboxServer,
    square_through: Callable[..., tuple[payonce.Client, Square]],
    faults: list[str],
    step: int,
) -> None:
    # As Square's examples do: a uuid4 per call; the code runs again after the fault.
    def run() -> Any:
        client, square = square_through(sdk_keys="replace")
        with client.intent("order-1") as op:
            completed = square_checkout(square, str(uuid.uuid4()))
        return completed, op

    square_server.script(faults if step == 1 else ["none", *faults])
    completed, op = run()
    assert completed.status == "COMPLETED"
    assert run()[0].id == completed.id
    assert [p["reference"] for p in square_server.store.payments()] == ["order-1"]
    # The body carried payonce's key for the create (not the uuid4); the complete takes none.
    (create_key, _) = [key for _, key, _ in op.steps]
    assert square_server.store.execution_count(create_key) == 1
    assert square_server.store.execution_count("") == 1


def test_square_keeps_its_callers_keys_and_its_idempotency_semantics(
    square_server: SandboxServer,
    square_through: Callable[..., tuple[payonce.Client, Square]],
) -> None:
    client, square = square_through()
    with client.intent("order-2") as op:
        first = square_pay(square, "k-sq-2").payment
    assert [key for _, key, _ in op.steps] == ["k-sq-2"]
    with client.intent("order-2"):
        assert square_pay(square, "k-sq-2").payment.id == first.id  # replayed
    # Another request under a key already used: refused by the journal before it is sent.
    with client.intent("order-2"), pytest.raises(SquareApiError) as reused:
        square_pay(square, "k-sq-2", amount=1600)
    assert reused.value.errors[0].code == "PAYONCE_INTENT_MISMATCH"
    assert square.payments.get(first.id).payment.status == "COMPLETED"
    assert square_server.store.execution_count("k-sq-2") == 1


def test_square_steps_each_keep_the_key_their_body_carries(
    square_server: SandboxServer,
    square_through: Callable[..., tuple[payonce.Client, Square]],
) -> None:
    # A split payment: two creates in one block, each with the caller's own key.
    client, square = square_through()
    with client.intent("order-split") as op:
        square_pay(square, "k-split-1", amount=1000)
        square_pay(square, "k-split-2", amount=500)
    assert [key for _, key, _ in op.steps] == ["k-split-1", "k-split-2"]
    assert square_server.store.executions() == {"k-split-1": 1, "k-split-2": 1}


def test_async_square_through_an_async_client(
    square_server: SandboxServer, journal_path: Path
) -> None:
    async def pay() -> Any:
        options = payonce_options(square_server, "square", journal_path)
        async with (
            payonce.AsyncClient(**options) as client,
            square_integration.async_httpx_client(client, sdk_keys="replace") as http,
        ):
            square = AsyncSquare(
                token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http
            )
            async with client.intent("order-async"):
                square_server.script(["drop_after"])
                return await square.payments.create(
                    idempotency_key=str(uuid.uuid4()),
                    source_id="cnon:card-nonce-ok",
                    amount_money={"amount": 700, "currency": "USD"},
                    request_options=NO_SDK_RETRIES,
                )

    paid = asyncio.run(pay()).payment
    assert paid.status == "COMPLETED"
    assert asyncio.run(pay()).payment.id == paid.id
    assert sorted(square_server.store.executions().values()) == [1]


@pytest.mark.parametrize("mistake", ["not under the base url", "outside any block"])
def test_async_square_gets_a_programming_error_as_itself_never_as_a_network_error(
    square_server: SandboxServer, journal_path: Path, mistake: str
) -> None:
    # Adyen's and Mollie's SDKs have no async calls; Square's AsyncSquare goes through
    # payonce's async transport, which must hand payonce's own error through as well.
    async def pay() -> None:
        options = payonce_options(square_server, "square", journal_path)
        elsewhere = mistake == "not under the base url"
        if elsewhere:
            options["base_url"] = ELSEWHERE
        async with (
            payonce.AsyncClient(**options) as client,
            square_integration.async_httpx_client(client, outside_intent="refuse") as http,
        ):
            square = AsyncSquare(
                token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http
            )
            payment = square.payments.create(
                idempotency_key="k-async-misplugged",
                source_id="cnon:card-nonce-ok",
                amount_money={"amount": 700, "currency": "USD"},
                request_options=NO_SDK_RETRIES,
            )
            if elsewhere:
                async with client.intent("order-misplugged"):
                    await payment
            else:
                await payment

    with pytest.raises(payonce.ConfigurationError) as caught:
        asyncio.run(pay())
    assert type(caught.value) is payonce.ConfigurationError
    expected = {
        "not under the base url": "is not under this client's base_url",
        "outside any block": "outside any intent block",
    }[mistake]
    assert expected in str(caught.value)
    assert square_server.store.executions() == {}
    with payonce.open_journal(journal_path) as journal:
        assert journal.list_intents() == []


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_square_s_unknown_outcome_is_its_api_error_and_a_run_again_gets_the_replay(
    square_server: SandboxServer, location: str, closing: contextlib.ExitStack
) -> None:
    client = payonce_maker(square_server, "square", location, closing)(retry=ONCE)
    http = closing.enter_context(square_integration.httpx_client(client))
    square = Square(token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http)

    def pay() -> Any:
        with client.intent("order-9"):
            return square_pay(square, "k-sq-9")

    square_server.script(["drop_after"])
    with pytest.raises(SquareApiError) as caught:
        pay()
    assert caught.value.status_code is None
    assert caught.value.errors[0].code == "PAYONCE_OUTCOME_UNKNOWN"
    assert "'k-sq-9'" in str(caught.value.errors[0].detail)
    assert "'order-9'" in str(caught.value.errors[0].detail)
    assert unknown_key(caught.value) == "k-sq-9"
    # Square has no look-up: a run again resends it under its key (issue 17), and gets
    # the payment Square executed, replayed.
    again = pay()
    assert again.payment.status == "COMPLETED"
    assert square_server.store.executions() == {"k-sq-9": 1}


def test_square_s_unknown_step_2_names_the_step_its_intent_s_reference_and_its_key(
    square_server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> None:
    client = payonce_maker(square_server, "square", journal_path, closing)(retry=ONCE)
    http = closing.enter_context(square_integration.httpx_client(client, sdk_keys="replace"))
    square = Square(token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http)
    with client.intent("order-sq-step") as op:
        payment = square_pay(square, str(uuid.uuid4()), autocomplete=False).payment
        square_server.script(["drop_after"])
        with pytest.raises(SquareApiError) as caught:
            square.payments.complete(payment.id, request_options=NO_SDK_RETRIES)
    (_, intent_key, _), (_, step_key, _) = op.steps
    assert step_key == f"{intent_key}-step2"
    detail = str(caught.value.errors[0].detail)
    assert f"step 2 of intent 'order-sq-step' (key {step_key})" in detail
    assert "'order-sq-step'" in detail
    error = caught.value
    assert (error.payonce_key, error.payonce_reference, error.payonce_step) == (  # type: ignore[attr-defined]
        step_key,
        "order-sq-step",
        2,
    )
    # Square's complete carries no key of its own: the sandbox counts it under none.
    assert sorted(square_server.store.executions().values()) == [1, 1]
    assert square_server.store.executions()[intent_key] == 1


def test_baseline_square_alone_pays_twice_when_an_answer_is_lost_and_it_runs_again(
    square_server: SandboxServer,
) -> None:
    # As Square's own examples do, the key is a uuid4 made per call: a run again makes another.
    square_server.script(["drop_after"])
    with httpx.Client() as http:
        square = Square(token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http)
        with pytest.raises(httpx.HTTPError):
            square_pay(square, str(uuid.uuid4()))
    with httpx.Client() as http:
        square = Square(token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http)
        square_pay(square, str(uuid.uuid4()))
    assert [p["reference"] for p in square_server.store.payments()] == ["order-1", "order-1"]


# -- identical payments in one block; a block on the wrong client -----------------------------


def test_square_paying_two_identical_amounts_in_one_block_pays_twice_and_a_run_again_replays(
    square_server: SandboxServer,
    square_through: Callable[..., tuple[payonce.Client, Square]],
) -> None:
    # A bill split in two equal halves, each call with a uuid4 of its own (replaced by
    # payonce's step keys): two payments, not one answered twice.
    def run() -> tuple[list[Any], list[str]]:
        client, square = square_through(sdk_keys="replace")
        with client.intent("order-split") as op:
            halves = [square_pay(square, str(uuid.uuid4()), amount=750) for _ in range(2)]
        return [half.payment.id for half in halves], [key for _, key, _ in op.steps]

    paid, keys = run()
    assert paid[0] != paid[1]
    assert keys[1] == f"{keys[0]}-step2"
    assert run() == (paid, keys)  # run again: both halves replayed, in their order
    assert square_server.store.executions() == {key: 1 for key in keys}
    assert len(square_server.store.payments()) == 2


def test_square_retrying_an_unknown_half_of_a_split_payment_executes_it_once(
    square_server: SandboxServer,
    square_through: Callable[..., tuple[payonce.Client, Square]],
) -> None:
    client, square = square_through(sdk_keys="replace", retry=ONCE)
    with client.intent("order-split-lost") as op:
        square_pay(square, str(uuid.uuid4()), amount=750)
        square_server.script(["drop_after"])  # the second half executes; its answer is lost
        with pytest.raises(SquareApiError) as lost:
            square_pay(square, str(uuid.uuid4()), amount=750)
        # The caller's retry is that half again, resent under its step key: Square replays
        # the half it executed, never a third payment.
        retried = square_pay(square, str(uuid.uuid4()), amount=750)
    assert unknown_key(lost.value) == f"{op.key}-step2"
    assert retried.payment.status == "COMPLETED"
    assert [n for n, _, _ in op.steps] == [1, 2]
    assert sorted(square_server.store.executions().values()) == [1, 1]
    assert len(square_server.store.payments()) == 2


def test_stripe_python_s_async_calls_inside_the_sync_client_s_block_are_refused_unsent(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    journal_path: Path,
    closing: contextlib.ExitStack,
) -> None:
    # The review's case: HTTPClient(payments, async_client=apay), the block on `payments`,
    # the call through `apay`. It used to go through as a one-shot under a fresh key.
    options = payonce_options(stripe_server, "stripe", journal_path)
    payments = closing.enter_context(payonce.Client(**options))

    async def pay() -> tuple[payonce.ConfigurationError, list[Any]]:
        async with payonce.AsyncClient(**options) as apay:
            http = stripe_integration.HTTPClient(payments, async_client=apay)
            sdk = stripe_client(stripe_server, http_client=http)
            try:
                with (
                    payments.intent("order-1") as op,
                    # A programming error: payonce's own, never a connection error to retry.
                    pytest.raises(payonce.ConfigurationError) as refused,
                ):
                    await sdk.v1.payment_intents.create_async(
                        params={"amount": 900, "currency": "eur"}
                    )
                return refused.value, op.steps
            finally:
                await http.close_async()

    carried, steps = asyncio.run(pay())
    assert "went through payonce.AsyncClient(provider='stripe'" in str(carried)
    assert "intent 'order-1' on payonce.Client(provider='stripe'" in str(carried)
    assert "`async with <AsyncClient>.intent(...)`" in str(carried)
    assert steps == []
    assert payments.journal.list_intents() == []
    assert stripe_server.store.executions() == {}
    assert stripe_server.store.payment_intents() == []


def test_square_calls_through_a_second_client_of_the_same_settings_are_refused_unsent(
    square_server: SandboxServer,
    square_through: Callable[..., tuple[payonce.Client, Square]],
    journal_path: Path,
    closing: contextlib.ExitStack,
) -> None:
    client, square = square_through()
    twin = payonce_maker(square_server, "square", journal_path, closing)()
    with twin.intent("order-1"), pytest.raises(payonce.ConfigurationError) as refused:
        square_pay(square, "k-wrong-client")
    assert "another client object with the same settings" in str(refused.value)
    assert client.journal.list_intents() == []
    assert square_server.store.executions() == {}


def test_one_operation_over_two_providers_opens_a_block_on_each_client(
    stripe_server: SandboxServer,
    square_server: SandboxServer,
    stripe_through: Callable[..., tuple[payonce.Client, stripe.StripeClient]],
    square_through: Callable[..., tuple[payonce.Client, Square]],
) -> None:
    def run() -> tuple[str, str]:
        stripe_payments, stripe_sdk = stripe_through()
        square_payments, square = square_through(sdk_keys="replace")
        with stripe_payments.intent("order-2p"), square_payments.intent("order-2p"):
            deposit = stripe_sdk.v1.payment_intents.create(
                params={"amount": 500, "currency": "eur"}
            )
            balance = square_pay(square, str(uuid.uuid4()), amount=1000)
        return deposit.id, balance.payment.id

    paid = run()
    assert run() == paid  # run again: each provider's step replayed from its intent
    assert list(stripe_server.store.executions().values()) == [1]
    assert list(square_server.store.executions().values()) == [1]


def test_a_block_around_an_sdk_not_wired_to_payonce_warns_nothing_was_made_exactly_once(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
    stripe_through: Callable[..., tuple[payonce.Client, stripe.StripeClient]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, wired = stripe_through()
    unwired = stripe_client(stripe_server)  # stripe-python's own HTTP client: no payonce
    params = {"amount": 900, "currency": "eur"}
    with caplog.at_level(logging.WARNING, logger="payonce"):
        with client.intent("order-unwired"):
            unwired.v1.payment_intents.create(params=params)
        (warned,) = caplog.records
        assert "the block of intent 'order-unwired'" in warned.getMessage()
        assert "nothing in it was made exactly-once" in warned.getMessage()
        caplog.clear()
        with client.intent("order-wired"):
            wired.v1.payment_intents.create(params=params)
    assert caplog.records == []
    # Both were paid; only the wired one is an intent payonce knows (and could recover).
    assert len(stripe_server.store.payment_intents()) == 2
    assert [r.reference for r in client.journal.list_intents()] == ["order-wired"]


def _refused_outside_any_block(sdk: str, server: SandboxServer, client: payonce.Client) -> None:
    """One payment call of ``sdk``, outside any block, over an integration made with
    ``outside_intent="refuse"``."""
    if sdk == "stripe":
        http = stripe_integration.HTTPClient(client, outside_intent="refuse")
        sdk_client = stripe.StripeClient(
            DEFAULT_API_KEY, base_addresses={"api": server.url}, http_client=http
        )
        sdk_client.v1.payment_intents.create(params={"amount": 900, "currency": "eur"})
    elif sdk == "adyen":
        adyen = adyen_sdk(server)
        adyen_integration.use_transport(adyen, client, outside_intent="refuse")
        adyen.checkout.payments_api.payments(adyen_payment("order-1"))
    elif sdk == "mollie":
        mollie_client = mollie_sdk(server)
        mollie_integration.use_transport(mollie_client, client, outside_intent="refuse")
        mollie_client.payments.create(MOLLIE_PAYMENT)
    else:
        http_square = square_integration.httpx_client(client, outside_intent="refuse")
        square_pay(
            Square(token=DEFAULT_API_KEY, base_url=server.url, httpx_client=http_square), "k"
        )


@pytest.mark.parametrize("sdk", ["stripe", "adyen", "mollie", "square"])
def test_each_integration_passes_outside_intent_to_its_transport(
    shared_sandboxes: SharedSandboxes, journal_path: Path, closing: contextlib.ExitStack, sdk: str
) -> None:
    server = sandbox_like(shared_sandboxes, sdk)
    base_url = adyen_sdk(server).checkout.payments_api.baseUrl if sdk == "adyen" else server.url
    client = payonce_maker(server, sdk, journal_path, closing)(base_url=base_url)
    # A programming error: payonce's own, through every SDK, never one of its network errors.
    with pytest.raises(payonce.ConfigurationError) as caught:
        _refused_outside_any_block(sdk, server, client)
    assert type(caught.value) is payonce.ConfigurationError
    assert "outside any intent block" in str(caught.value)
    assert server.store.executions() == {}
    assert client.journal.list_intents() == []


TYPED_USE = """
import httpx
import mollie.api.client
import stripe
from square import Square

import payonce
from payonce.integrations import mollie as mollie_integration
from payonce.integrations import square as square_integration
from payonce.integrations import stripe as stripe_integration

client = payonce.Client(base_url="https://api.stripe.com", provider="stripe", transport_only=True)
async_client = payonce.AsyncClient(base_url="https://api.stripe.com", transport_only=True)
http_client = stripe_integration.HTTPClient(client, async_client=async_client)
stripe_client = stripe.StripeClient("sk_test_x", http_client=http_client)
square = Square(token="t", httpx_client=square_integration.httpx_client(client))
session = mollie_integration.use_transport(mollie.api.client.Client(), client)
adapter = client.requests_adapter(sdk_keys="replace")
plain = httpx.Client(transport=client.transport(outside_intent="refuse"))
"""


@pytest.mark.slow  # mypy reads stripe-python's and Square's types: about 20 s
def test_the_integrations_take_real_clients_under_mypy_strict(tmp_path: Path) -> None:
    # A payonce.Client must fit what each integration asks for (its transport()), as a
    # user's type checker sees it, not only at run time.
    script = tmp_path / "shop.py"
    script.write_text(TYPED_USE)
    result = mypy_strict(script)
    assert result.returncode == 0, result.stdout


# -- missing SDKs --------------------------------------------------------------------------------


def import_error(integration: str, first: str) -> str:
    """What importing ``payonce.integrations.<integration>`` says, in a fresh interpreter
    that ran ``first`` before it ("imported" when it raised nothing)."""
    script = (
        f"{first}"
        "try:\n"
        f"    import payonce.integrations.{integration}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    return python_output(script)


@pytest.mark.parametrize(
    ("integration", "sdk_module", "extra"),
    [
        ("stripe", "stripe", "stripe"),
        ("adyen", "Adyen", "adyen"),
        ("mollie", "mollie", "mollie"),
        ("square", "square", "square"),
        ("requests", "requests", "requests"),
    ],
)
def test_an_integration_without_its_sdk_names_the_extra_to_install(
    integration: str, sdk_module: str, extra: str
) -> None:
    as_if_not_installed = f"import sys\nsys.modules[{sdk_module!r}] = None\n"
    assert f"pip install 'payonce[{extra}]'" in import_error(integration, as_if_not_installed)


@pytest.mark.parametrize(
    ("integration", "draws_keys", "supported"),
    [
        ("stripe", "import stripe._api_requestor as part", "stripe>=16"),
        (
            "mollie",
            "from mollie.api.resources.base import ResourceBase as part",
            "mollie-api-python>=4",
        ),
    ],
)
def test_an_sdk_too_old_to_tell_its_own_keys_names_the_versions_payonce_supports(
    integration: str, draws_keys: str, supported: str
) -> None:
    # stripe-python before 16 has no _generate_idempotency_key to tell its own keys from a
    # caller's: the import says which versions work, not only "a version payonce supports".
    as_in_an_older_release = f"{draws_keys}\ndel part._generate_idempotency_key\n"
    assert supported in import_error(integration, as_in_an_older_release)


@pytest.mark.parametrize(
    ("extra", "brings"),
    [
        ("stripe", {"stripe"}),
        ("adyen", {"adyen"}),
        ("mollie", {"mollie-api-python", "requests"}),
        ("square", {"squareup"}),
        ("requests", {"requests"}),
    ],
)
def test_each_integration_s_extra_installs_only_its_sdk(extra: str, brings: set[str]) -> None:
    from importlib.metadata import requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    asked = {
        canonicalize_name(requirement.name)
        for requirement in map(Requirement, requires("payonce") or [])
        if requirement.marker is not None and requirement.marker.evaluate({"extra": extra})
    }
    assert asked == brings


CHECKOUT_SCRIPT = """
import sys
import stripe

client = stripe.StripeClient(sys.argv[2], base_addresses={"api": sys.argv[1]})
order = sys.argv[3]
try:
    intent = client.v1.payment_intents.create(
        params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
    )
    client.v1.payment_intents.confirm(intent.id, params={"payment_method": "pm_card_visa"})
except stripe.APIConnectionError:
    sys.exit(3)  # the shop's process gives up; its job runner runs it again
"""


@pytest.mark.slow
def test_baseline_a_stripe_python_checkout_run_again_as_a_new_process_pays_twice(
    stripe_server: SandboxServer,
) -> None:
    def run() -> int:
        command = [sys.executable, "-c", CHECKOUT_SCRIPT, stripe_server.url, DEFAULT_API_KEY]
        return subprocess.run([*command, "order-7"], check=False, timeout=60).returncode

    stripe_server.script(["drop_after"])
    assert run() == 3
    assert run() == 0
    intents = stripe_server.store.payment_intents()
    assert [intent["metadata"]["order"] for intent in intents] == ["order-7", "order-7"]
    assert [intent["status"] for intent in intents] == ["requires_payment_method", "succeeded"]
