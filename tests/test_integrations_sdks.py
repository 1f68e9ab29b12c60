"""The provider SDKs themselves against the sandbox's dialects, alone and through
payonce.integrations.

Until ``Client.transport()`` lands, the integrations are driven by a stand-in whose
``transport()`` is httpx's own (a plain pass-through): what is proved here is the plumbing
(each SDK, plugged in by its integration, creates and reads a payment on its provider's
dialect; errors arrive as the SDK's own) and the baseline payonce exists for: each SDK
alone, a create whose answer is lost and the process run again, pays twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

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
from helpers.sandboxes import SharedSandboxes
from payonce.integrations import adyen as adyen_integration
from payonce.integrations import mollie as mollie_integration
from payonce.integrations import square as square_integration
from payonce.integrations import stripe as stripe_integration
from payonce.sandbox import DEFAULT_API_KEY, MOLLIE_TEST_API_KEY, SandboxConfig, SandboxServer


class PassThrough:
    """What the integrations need of a payonce client (``transport()``), with httpx's own
    transport underneath: the SDK's requests reach the sandbox as they are."""

    def __init__(self, *, asynchronous: bool = False) -> None:
        self.asynchronous = asynchronous
        self.asked: list[dict[str, Any]] = []

    def transport(self, **options: Any) -> httpx.BaseTransport | httpx.AsyncBaseTransport:
        self.asked.append(options)
        return httpx.AsyncHTTPTransport() if self.asynchronous else httpx.HTTPTransport()


class Refusing(httpx.BaseTransport):
    """A transport that raises what payonce's raises when an outcome stays unknown."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise payonce.OutcomeUnknown(
            "the answer was lost and the look-up found nothing yet",
            key="k-unknown",
            reference="order-9",
            reason="lost answer",
        )


class RefusingClient:
    def transport(self, **options: Any) -> httpx.BaseTransport:
        return Refusing()


class AsyncRefusing(httpx.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return Refusing().handle_request(request)


class AsyncRefusingClient:
    def transport(self, **options: Any) -> httpx.AsyncBaseTransport:
        return AsyncRefusing()


def sandbox_like(shared: SharedSandboxes, provider: str) -> SandboxServer:
    return shared.get(f"sdk {provider}", SandboxConfig.like(provider))  # type: ignore[arg-type]


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


def checkout(client: stripe.StripeClient, order: str) -> stripe.PaymentIntent:
    """A shop's checkout: create a PaymentIntent for the order, then confirm it."""
    intent = client.v1.payment_intents.create(
        params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
    )
    return client.v1.payment_intents.confirm(intent.id, params={"payment_method": "pm_card_visa"})


def test_stripe_python_through_the_integration_creates_and_reads_an_intent(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
) -> None:
    source = PassThrough()
    client = stripe_client(stripe_server, http_client=stripe_integration.HTTPClient(source))
    paid = checkout(client, "order-1")
    assert paid.status == "succeeded"
    assert client.v1.payment_intents.retrieve(paid.id).status == "succeeded"
    # The transport was asked to put payonce's key in place of stripe-python's random one.
    assert source.asked == [{"sdk_keys": "replace"}]
    assert len(stripe_server.store.payment_intents()) == 1


def test_stripe_python_async_through_the_integration(
    stripe_server: SandboxServer, stripe_client: Callable[..., stripe.StripeClient]
) -> None:
    http = stripe_integration.HTTPClient(PassThrough(asynchronous=True))
    client = stripe_client(stripe_server, http_client=http)

    async def create() -> stripe.PaymentIntent:
        try:
            return await client.v1.payment_intents.create_async(
                params={"amount": 900, "currency": "eur"}
            )
        finally:
            await http.close_async()

    created = asyncio.run(create())
    assert created.status == "requires_payment_method"
    with pytest.raises(stripe.APIConnectionError, match="over an AsyncClient"):
        client.v1.payment_intents.retrieve(created.id)


def test_the_integration_turns_stripe_pythons_retries_off(
    stripe_server: SandboxServer, stripe_client: Callable[..., stripe.StripeClient]
) -> None:
    # A 503 with Stripe-Should-Retry: true, which stripe-python alone retries: through
    # payonce the retry decision was the transport's, and the SDK sends nothing more.
    stripe_server.script(["fail_before"])
    http = stripe_integration.HTTPClient(PassThrough())
    client = stripe_client(stripe_server, http_client=http, max_network_retries=2)
    with pytest.raises(stripe.APIError):
        client.v1.payment_intents.create(params={"amount": 900, "currency": "eur"})
    assert stripe_server.store.payment_intents() == []


def test_an_unknown_outcome_is_a_stripe_connection_error_that_must_not_be_retried(
    stripe_server: SandboxServer,
    stripe_client: Callable[..., stripe.StripeClient],
) -> None:
    client = stripe_client(
        stripe_server, http_client=stripe_integration.HTTPClient(RefusingClient())
    )
    with pytest.raises(stripe.APIConnectionError) as caught:
        client.v1.payment_intents.create(params={"amount": 900, "currency": "eur"})
    assert caught.value.should_retry is False
    assert "'k-unknown'" in str(caught.value)
    assert "'order-9'" in str(caught.value)
    assert isinstance(caught.value.payonce_error, payonce.OutcomeUnknown)  # type: ignore[attr-defined]


def test_an_unknown_outcome_in_async_code_is_the_same_stripe_error(
    stripe_server: SandboxServer, stripe_client: Callable[..., stripe.StripeClient]
) -> None:
    http = stripe_integration.HTTPClient(AsyncRefusingClient())
    client = stripe_client(stripe_server, http_client=http)

    async def create() -> None:
        try:
            await client.v1.payment_intents.create_async(params={"amount": 9, "currency": "eur"})
        finally:
            await http.close_async()

    with pytest.raises(stripe.APIConnectionError) as caught:
        asyncio.run(create())
    assert caught.value.should_retry is False
    assert "'k-unknown'" in str(caught.value)


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


@pytest.fixture
def adyen_through(
    adyen_server: SandboxServer, closing: contextlib.ExitStack
) -> Callable[[Any], Adyen.Adyen]:
    """Adyen's library plugged into a stand-in's transport; its client closed at the end."""

    def make(source: Any) -> Adyen.Adyen:
        adyen = adyen_sdk(adyen_server)
        adyen_integration.use_transport(adyen, source)
        closing.callback(adyen.client.http_client.close)
        return adyen

    return make


def adyen_sdk(server: SandboxServer) -> Adyen.Adyen:
    adyen = Adyen.Adyen(xapikey=DEFAULT_API_KEY, platform="test")
    # Adyen's services hold their base URL (https://checkout-test.adyen.com/v72).
    api = adyen.checkout.payments_api
    api.baseUrl = api.baseUrl.replace("https://checkout-test.adyen.com", server.url)
    return adyen


def adyen_payment(order: str, value: int = 1000) -> dict[str, Any]:
    return {
        "amount": {"value": value, "currency": "EUR"},
        "reference": order,
        "merchantAccount": "PayonceShop",
        "paymentMethod": {"type": "scheme", "encryptedCardNumber": "test_4111111111111111"},
        "returnUrl": "https://shop.example/return",
    }


def test_adyen_through_the_integration_pays_and_captures(
    adyen_server: SandboxServer, adyen_through: Callable[[Any], Adyen.Adyen]
) -> None:
    adyen = adyen_through(PassThrough())
    api = adyen.checkout.payments_api
    paid = api.payments(adyen_payment("order-1"), idempotency_key="k-adyen-1")
    assert paid.message["resultCode"] == "Authorised"
    again = api.payments(adyen_payment("order-1"), idempotency_key="k-adyen-1")
    assert again.message == paid.message  # the same key replays the first answer

    modifications = adyen.checkout.modifications_api
    modifications.baseUrl = api.baseUrl
    capture = {"merchantAccount": "PayonceShop", "amount": {"value": 1000, "currency": "EUR"}}
    captured = modifications.capture_authorised_payment(
        capture, paid.message["pspReference"], idempotency_key="k-adyen-capture"
    )
    assert captured.message["status"] == "received"
    assert adyen_server.store.execution_count("k-adyen-1") == 1
    assert adyen_server.store.execution_count("k-adyen-capture") == 1

    refused = api.payments(adyen_payment("order-2", value=40200), idempotency_key="k-adyen-2")
    assert refused.message["resultCode"] == "Refused"


def test_adyen_gets_its_own_errors(adyen_through: Callable[[Any], Adyen.Adyen]) -> None:
    adyen = adyen_through(RefusingClient())
    with pytest.raises(Adyen.AdyenAPICommunicationError) as caught:
        adyen.checkout.payments_api.payments(adyen_payment("order-9"), idempotency_key="k")
    assert "'k-unknown'" in str(caught.value.message)
    assert isinstance(caught.value.payonce_error, payonce.OutcomeUnknown)


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
    mollie_server: SandboxServer, closing: contextlib.ExitStack
) -> Callable[[Any], mollie.api.client.Client]:
    """mollie-api-python plugged into a stand-in's transport; its session closed at the end."""

    def make(source: Any) -> mollie.api.client.Client:
        sdk = mollie_sdk(mollie_server)
        closing.enter_context(mollie_integration.use_transport(sdk, source))
        return sdk

    return make


MOLLIE_PAYMENT = {
    "amount": {"currency": "EUR", "value": "10.00"},
    "description": "order-1",
    "redirectUrl": "https://shop.example/return",
    "metadata": {"order": "order-1"},
}


def test_mollie_through_the_integration_creates_and_reads_a_payment(
    mollie_server: SandboxServer, mollie_through: Callable[[Any], mollie.api.client.Client]
) -> None:
    source = PassThrough()
    sdk = mollie_through(source)
    created = sdk.payments.create(MOLLIE_PAYMENT)
    assert (created.status, created.amount) == ("paid", {"value": "10.00", "currency": "EUR"})
    assert sdk.payments.get(created.id).id == created.id
    assert source.asked == [{"sdk_keys": "replace"}]
    assert len(mollie_server.store.payments()) == 1


def test_mollie_reads_the_sandbox_s_refusal_as_its_own(
    mollie_server: SandboxServer, mollie_through: Callable[[Any], mollie.api.client.Client]
) -> None:
    sdk = mollie_through(PassThrough())
    with pytest.raises(mollie.api.error.UnprocessableEntityError) as refused:
        sdk.payments.create({**MOLLIE_PAYMENT, "amount": {"currency": "EUR", "value": "ten"}})
    assert "amount.value" in str(refused.value)
    assert mollie_server.store.total_executions() == 0


def test_mollie_gets_its_own_error(
    mollie_through: Callable[[Any], mollie.api.client.Client],
) -> None:
    sdk = mollie_through(RefusingClient())
    with pytest.raises(mollie.api.error.RequestError, match="'k-unknown'"):
        sdk.payments.create(MOLLIE_PAYMENT)


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


# -- Square ------------------------------------------------------------------------------------


@pytest.fixture
def square_server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return sandbox_like(shared_sandboxes, "square")


@pytest.fixture
def square(square_server: SandboxServer) -> Iterator[Square]:
    http = square_integration.httpx_client(PassThrough())
    yield Square(token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http)
    http.close()


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


def test_square_through_the_integration_pays_completes_and_reads(
    square: Square, square_server: SandboxServer
) -> None:
    approved = square_pay(square, "k-sq-1", autocomplete=False).payment
    assert approved.status == "APPROVED"
    completed = square.payments.complete(approved.id, request_options=NO_SDK_RETRIES).payment
    assert completed.status == "COMPLETED"
    assert square.payments.get(approved.id).payment.status == "COMPLETED"
    assert [p.id for p in square.payments.list()] == [approved.id]


def test_async_square_through_the_integration(square_server: SandboxServer) -> None:
    async def pay() -> Any:
        async with square_integration.async_httpx_client(PassThrough(asynchronous=True)) as http:
            square = AsyncSquare(
                token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http
            )
            return await square.payments.create(
                idempotency_key="k-async",
                source_id="cnon:card-nonce-ok",
                amount_money={"amount": 700, "currency": "USD"},
                request_options=NO_SDK_RETRIES,
            )

    assert asyncio.run(pay()).payment.status == "COMPLETED"
    assert square_server.store.execution_count("k-async") == 1


def test_square_keeps_its_idempotency_semantics(
    square: Square, square_server: SandboxServer
) -> None:
    first = square_pay(square, "k-sq-2").payment
    assert square_pay(square, "k-sq-2").payment.id == first.id  # the same key, the same body
    with pytest.raises(SquareApiError) as reused:
        square_pay(square, "k-sq-2", amount=1600)
    assert reused.value.status_code == 400
    assert reused.value.errors[0].code == "IDEMPOTENCY_KEY_REUSED"
    assert square_server.store.execution_count("k-sq-2") == 1


def test_square_and_adyen_keep_the_caller_s_keys_unless_told_to_replace_them() -> None:
    source = PassThrough()
    square_integration.httpx_client(source).close()
    square_integration.httpx_client(source, sdk_keys="replace").close()
    adyen = Adyen.Adyen(xapikey=DEFAULT_API_KEY)
    adyen_integration.use_transport(adyen, source, sdk_keys="replace")
    adyen.client.http_client.close()
    assert source.asked == [{}, {"sdk_keys": "replace"}, {"sdk_keys": "replace"}]


def test_square_gets_its_own_error(square_server: SandboxServer) -> None:
    with square_integration.httpx_client(RefusingClient()) as http:
        square = Square(token=DEFAULT_API_KEY, base_url=square_server.url, httpx_client=http)
        with pytest.raises(SquareApiError) as caught:
            square_pay(square, "k-sq-3")
    assert caught.value.errors[0].code == "PAYONCE_OUTCOME_UNKNOWN"
    assert "'k-unknown'" in str(caught.value.errors[0].detail)


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


# -- missing SDKs --------------------------------------------------------------------------------


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
    script = (
        "import sys\n"
        f"sys.modules[{sdk_module!r}] = None  # as if it were not installed\n"
        "try:\n"
        f"    import payonce.integrations.{integration}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert f"pip install 'payonce[{extra}]'" in result.stdout


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
