"""The same stripe-python scenarios against the sandbox's Stripe resources and against
localstripe, a fake Stripe server from PyPI that nobody here wrote.

Where the two agree (the status flow, the object's fields, which exception each refusal
raises) the test is one for both. Where localstripe departs from what Stripe documents,
Stripe's documentation and SDK are trusted: the sandbox follows them, and the test pins
localstripe's departure beside it, so that it is known, and noticed if it ever changes:

- localstripe has no idempotency layer: the same key twice creates two intents;
- it has no Search API (``/v1/payment_intents/search`` is a 404);
- its errors carry no ``code`` (Stripe's ``resource_missing``, ``parameter_missing``,
  ``payment_intent_unexpected_state``) and a decline's ``type`` is
  ``invalid_request_error`` where Stripe's is ``card_error``;
- it expands ``latest_charge`` into the Charge, where Stripe gives its id unless asked;
- it declines ``pm_card_visa_chargeDeclined`` only when attached to a customer, where
  Stripe declines its charges; ``pm_card_chargeCustomerFail`` (attaches, then every
  charge fails) declines a PaymentIntent's charge on both, so the scenario uses it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import requests
import stripe

from helpers.localstripe import running_localstripe
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

# The fields a checkout reads, which both servers must give.
FIELDS = frozenset(
    {
        "id",
        "object",
        "amount",
        "currency",
        "status",
        "metadata",
        "client_secret",
        "created",
        "livemode",
        "payment_method",
        "capture_method",
        "latest_charge",
        "last_payment_error",
        "next_action",
    }
)


@attrs.frozen
class Provider:
    name: str
    client: stripe.StripeClient
    sandbox: SandboxServer | None = None

    @property
    def is_sandbox(self) -> bool:
        return self.sandbox is not None


@pytest.fixture(scope="module")
def localstripe_url() -> Iterator[str]:
    with running_localstripe() as url:
        yield url


@pytest.fixture(params=["sandbox", "localstripe"])
def provider(
    request: pytest.FixtureRequest, shared_sandboxes: SharedSandboxes
) -> Iterator[Provider]:
    sandbox = None
    if request.param == "sandbox":
        sandbox = shared_sandboxes.get("stripe", SandboxConfig.like("stripe"))
        url, api_key = sandbox.url, DEFAULT_API_KEY
    else:
        url, api_key = request.getfixturevalue("localstripe_url"), "sk_test_conformance"
    with contextlib.closing(requests.Session()) as session:
        client = stripe.StripeClient(
            api_key,
            base_addresses={"api": url},
            max_network_retries=0,
            http_client=stripe.RequestsClient(session=session),
        )
        yield Provider(request.param, client, sandbox)


def _id(reference: Any) -> str:
    # Stripe answers an id unless asked to expand it; localstripe answers the object.
    return str(reference if isinstance(reference, str) else reference.id)


def _order(**more: Any) -> dict[str, Any]:
    # localstripe's state lasts the session: an order of our own to find ours by.
    return {"amount": 4200, "currency": "eur", "metadata": {"order": uuid.uuid4().hex}, **more}


def test_an_intent_goes_from_requires_confirmation_to_succeeded(provider: Provider) -> None:
    intents = provider.client.v1.payment_intents
    order = _order(payment_method="pm_card_visa")

    created = intents.create(params=order)
    paid = intents.confirm(created.id)
    found = intents.retrieve(created.id)

    assert set(created.to_dict()) >= FIELDS, FIELDS - set(created.to_dict())
    assert created.id.startswith("pi_")
    assert (created.object, created.status) == ("payment_intent", "requires_confirmation")
    assert (created.amount, created.currency) == (4200, "eur")
    assert created.metadata.to_dict() == order["metadata"]
    assert created.client_secret.startswith(f"{created.id}_secret_")
    assert (created.livemode, created.latest_charge) == (False, None)
    assert isinstance(created.created, int)
    assert (paid.id, paid.status) == (created.id, "succeeded")
    assert _id(paid.latest_charge).startswith("ch_")
    if provider.is_sandbox:
        assert isinstance(paid.latest_charge, str)
    assert found.status == "succeeded"


def test_without_a_payment_method_an_intent_requires_one(provider: Provider) -> None:
    created = provider.client.v1.payment_intents.create(params=_order())

    assert (created.status, created.payment_method) == ("requires_payment_method", None)


def test_confirm_true_pays_at_creation(provider: Provider) -> None:
    paid = provider.client.v1.payment_intents.create(
        params=_order(payment_method="pm_card_visa", confirm=True)
    )

    assert paid.status == "succeeded"


def test_a_declined_charge_raises_card_error_and_the_intent_requires_a_payment_method(
    provider: Provider,
) -> None:
    intents = provider.client.v1.payment_intents
    created = intents.create(params=_order(payment_method="pm_card_chargeCustomerFail"))

    with pytest.raises(stripe.CardError) as declined:
        intents.confirm(created.id)

    assert (declined.value.http_status, declined.value.code) == (402, "card_declined")
    after = intents.retrieve(created.id)
    assert after.status == "requires_payment_method"
    assert after.last_payment_error is not None
    assert after.last_payment_error.code == "card_declined"
    error_type = declined.value.error.type if declined.value.error else None
    # Stripe's API reference: a decline is a card_error. localstripe says otherwise.
    expected = "card_error" if provider.is_sandbox else "invalid_request_error"
    assert error_type == expected


def test_refusals_raise_the_same_exceptions(provider: Provider) -> None:
    intents = provider.client.v1.payment_intents
    paid = intents.create(params=_order(payment_method="pm_card_visa", confirm=True))

    with pytest.raises(stripe.InvalidRequestError) as missing:
        intents.retrieve("pi_none_such")
    with pytest.raises(stripe.InvalidRequestError) as confirmed_twice:
        intents.confirm(paid.id)
    with pytest.raises(stripe.InvalidRequestError) as no_amount:
        intents.create(params={"currency": "eur"})

    statuses = [e.value.http_status for e in (missing, confirmed_twice, no_amount)]
    assert statuses == [404, 400, 400]
    codes = [e.value.code for e in (missing, confirmed_twice, no_amount)]
    # The codes Stripe documents for these; localstripe sends none.
    expected = ["resource_missing", "payment_intent_unexpected_state", "parameter_missing"]
    assert codes == (expected if provider.is_sandbox else [None, None, None])


def test_search_by_metadata(provider: Provider) -> None:
    intents = provider.client.v1.payment_intents
    order = _order()
    created = intents.create(params=order)
    query = f"metadata['order']:'{order['metadata']['order']}'"

    if not provider.is_sandbox:
        # localstripe has no Search API; Stripe's is what the sandbox serves.
        with pytest.raises(stripe.InvalidRequestError) as absent:
            intents.search(params={"query": query})
        assert absent.value.http_status == 404
        return
    found = intents.search(params={"query": query})
    assert (found.object, found.has_more, found.url) == (
        "search_result",
        False,
        "/v1/payment_intents/search",
    )
    assert [pi.id for pi in found.data] == [created.id]


def test_the_same_key_twice(provider: Provider) -> None:
    intents = provider.client.v1.payment_intents
    key = f"conformance-{uuid.uuid4().hex}"
    order = _order(payment_method="pm_card_visa")

    first = intents.create(params=order, options={"idempotency_key": key})
    second = intents.create(params=order, options={"idempotency_key": key})

    assert second.last_response is not None
    replayed = second.last_response.headers.get("Idempotent-Replayed")
    if provider.sandbox is not None:
        # Stripe's documented contract: the first answer, replayed and marked so.
        assert (second.id, replayed) == (first.id, "true")
        assert provider.sandbox.store.execution_count(key) == 1
    else:
        # localstripe has no idempotency layer: a second intent.
        assert (second.id != first.id, replayed) == (True, None)
