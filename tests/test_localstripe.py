"""The stripe profile against localstripe, a fake Stripe server from PyPI that nobody here
wrote: nested parameters as Stripe reads them, replays, a refused key, orders paid twice.

What localstripe lacks, and what that means here:
- it has no idempotency layer (the same key twice creates two PaymentIntents), so every
  "once" below is payonce's own doing: its journal replays a settled intent;
- it has no Search API (``/v1/payment_intents/search`` answers 404), so the profile's
  reconciliation cannot find anything there: payonce must conclude nothing from it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.localstripe import running_localstripe

API_KEY = "sk_test_localstripe"
RETRY = payonce.RetryPolicy(max_attempts=2, initial_wait=0.01, max_wait=0.01)


@pytest.fixture(scope="session")
def localstripe() -> Iterator[str]:
    with running_localstripe() as url:
        yield url


@pytest.fixture
def account() -> str:
    return f"acct_{secrets.token_hex(4)}"  # the fake's state is the session's: our own tag


MakeStripe = Callable[..., payonce.Client]


@pytest.fixture
def stripe_client(localstripe: str, journal_path: Path, make_client: MakeStripe) -> MakeStripe:
    def make(**options: Any) -> payonce.Client:
        defaults = {
            "base_url": localstripe,
            "provider": "stripe",
            "api_key": API_KEY,
            "journal": journal_path,
            "retry": RETRY,
        }
        return make_client(**{**defaults, **options})

    return make


def _intents(localstripe: str, order_prefix: str) -> list[dict[str, Any]]:
    """Every PaymentIntent localstripe holds for these orders, page after page."""
    found: list[dict[str, Any]] = []
    page: dict[str, Any] = {"limit": 100}
    with httpx.Client(base_url=localstripe, auth=(API_KEY, "")) as http:
        while True:
            listed = http.get("/v1/payment_intents", params=page).json()
            found += listed["data"]
            if not listed["has_more"]:
                break
            page["starting_after"] = listed["data"][-1]["id"]
    return [pi for pi in found if pi["metadata"].get("order", "").startswith(order_prefix)]


def _order(prefix: str, n: int = 0) -> dict[str, Any]:
    return {
        "amount": 4200 + n,
        "currency": "eur",
        "metadata": {"order": f"{prefix}-{n}"},
        "payment_method_types": ["card"],
        "payment_method": "pm_card_visa",
        "confirm": True,
    }


def test_a_payment_intent_with_nested_parameters_is_created_and_confirmed(
    stripe_client: MakeStripe, localstripe: str, account: str
) -> None:
    client = stripe_client(account=account)

    paid = client.post("/v1/payment_intents", data=_order(account), reference=f"{account}-0")

    intent = paid.json()
    assert (paid.status_code, intent["status"]) == (200, "succeeded"), intent
    assert intent["metadata"]["order"] == f"{account}-0", "metadata[order] read as Stripe reads it"
    assert (intent["amount"], intent["currency"]) == (4200, "eur")
    assert intent["metadata"]["payonce_idempotency_key"] == payonce.response_info(paid).key  # type: ignore[union-attr]


def test_a_settled_order_is_replayed_by_reference_not_created_again(
    stripe_client: MakeStripe, localstripe: str, account: str
) -> None:
    client = stripe_client(account=account)
    first = client.post("/v1/payment_intents", data=_order(account), reference=f"{account}-0")

    again = stripe_client(account=account).post(
        "/v1/payment_intents", data=_order(account), reference=f"{account}-0"
    )

    info = payonce.response_info(again)
    assert info is not None
    assert info.replayed
    assert again.json()["id"] == first.json()["id"]
    assert len(_intents(localstripe, account)) == 1


def test_a_wrong_api_key_then_the_right_one_pays_the_order_once(
    stripe_client: MakeStripe, localstripe: str, account: str
) -> None:
    with pytest.raises(payonce.AuthenticationError) as refused:
        stripe_client(account=account, api_key="not_a_stripe_key").post(
            "/v1/payment_intents", data=_order(account), reference=f"{account}-0"
        )
    assert refused.value.status_code == 401

    paid = stripe_client(account=account).post(
        "/v1/payment_intents", data=_order(account), reference=f"{account}-0"
    )

    assert payonce.response_info(paid).key == refused.value.key  # type: ignore[union-attr]
    assert [pi["id"] for pi in _intents(localstripe, account)] == [paid.json()["id"]]


def test_twenty_orders_paid_twice_each_make_twenty_payment_intents(
    stripe_client: MakeStripe, localstripe: str, account: str
) -> None:
    client = stripe_client(account=account)
    for _ in range(2):
        for n in range(20):
            client.post("/v1/payment_intents", data=_order(account, n), reference=f"{account}-{n}")

    intents = _intents(localstripe, account)
    assert len(intents) == 20
    assert sorted(pi["metadata"]["order"] for pi in intents) == sorted(
        f"{account}-{n}" for n in range(20)
    )


def test_without_stripe_s_search_api_reconciliation_concludes_nothing(
    stripe_client: MakeStripe, localstripe: str, account: str, journal_path: Path
) -> None:
    """localstripe has no Search API: its 404 is not "no record", so nothing is resent."""

    class LosesTheAnswer(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            super().handle_request(request).close()
            raise httpx.ReadTimeout("the answer was lost", request=request)

    lost = stripe_client(account=account, transport=LosesTheAnswer())
    with pytest.raises(payonce.OutcomeUnknown) as caught:
        lost.post("/v1/payment_intents", data=_order(account), reference=f"{account}-0")

    (result,) = stripe_client(account=account).reconcile(caught.value.key)

    assert (result.outcome, result.after) == ("error", payonce.IntentState.UNKNOWN)
    assert "404" in result.detail
    assert len(_intents(localstripe, account)) == 2, "the two attempts localstripe executed"


def test_an_outbox_payment_is_one_create_with_confirm_that_the_worker_sends(
    stripe_client: MakeStripe, localstripe: str, account: str
) -> None:
    """docs/outbox.md's Stripe request: enqueued by a service with no key, sent as one
    request by a client that has it (as a worker does), paid, and told to the service."""
    service = stripe_client(account=account, api_key=None, transport_only=True)
    order = f"{account}-0"
    service.enqueue(
        "POST",
        "/v1/payment_intents",
        reference=order,
        data={
            "amount": 4200,
            "currency": "eur",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "off_session": True,
            "metadata": {"order": order},
        },
        connection=None,
    )

    (sent,) = stripe_client(account=account).resume()

    assert sent.state is payonce.IntentState.SUCCEEDED
    (outcome,) = service.outcomes()
    assert outcome.response is not None
    assert json.loads(outcome.response.body)["status"] == "succeeded"
    (created,) = _intents(localstripe, account)
    assert (created["status"], created["metadata"]["order"]) == ("succeeded", order)
