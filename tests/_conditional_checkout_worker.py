"""Shop code whose requests depend on what the shop already has, run as a real child
process by tests/test_conditional_steps_kills.py and SIGKILLed at a payonce crash point
(``PAYONCE_CRASH_AT``), then run again for the same orders.

``--pattern create-if-missing``: the shop keeps each order's PaymentIntent id in its own
file (``--shop``) as soon as it has one; the checkout creates the PaymentIntent only if the
shop has none yet, then pays. Run again after a kill during the payment, the shop has the
id, so the block's first request is the payment. ``--pattern confirm-unless-confirmed``:
create the PaymentIntent, read its status, and confirm it only if it is not confirmed yet.

``--verbs payonce``: payonce's own verbs (``op.post``), the payment a ``POST /v1/payments``;
``--verbs stripe``: stripe-python over ``payonce.integrations.stripe.HTTPClient``, the
payment the PaymentIntent's confirm. Each order's final answer is one JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx

import payonce
from payonce.sandbox import DEFAULT_API_KEY

FAST_RETRY = payonce.RetryPolicy(max_attempts=5, initial_wait=0.001, max_wait=0.02)


class Shop:
    """The shop's own records: each order's PaymentIntent id, kept in a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ids: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}

    def remember(self, order: str, intent_id: str) -> None:
        self.ids[order] = intent_id
        self.path.write_text(json.dumps(self.ids))


def status_of(url: str, intent_id: str) -> str:
    """The PaymentIntent's status, read by the shop (a read: nothing to make exactly-once)."""
    auth = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
    answer = httpx.get(f"{url}/v1/payment_intents/{intent_id}", headers=auth)
    answer.raise_for_status()
    return str(answer.json()["status"])


def payonce_checkout(client: payonce.Client, url: str, shop: Shop, order: str, pattern: str) -> Any:
    with client.intent(order) as op:
        if pattern == "create-if-missing":
            if order not in shop.ids:
                created = op.post("/v1/payment_intents", data={"amount": 2000, "currency": "eur"})
                shop.remember(order, created.json()["id"])
            paid = op.post("/v1/payments", data={"amount": 2000, "currency": "eur"})
            return {"order": order, "id": paid.json()["id"], "status": paid.json()["status"]}
        created = op.post("/v1/payment_intents", data={"amount": 2000, "currency": "eur"})
        intent_id = created.json()["id"]
        if status_of(url, intent_id) != "succeeded":
            op.post(
                f"/v1/payment_intents/{intent_id}/confirm", data={"payment_method": "pm_card_visa"}
            )
        return {"order": order, "id": intent_id, "status": status_of(url, intent_id)}


def stripe_checkout(client: payonce.Client, url: str, shop: Shop, order: str, pattern: str) -> Any:
    import stripe

    from payonce.integrations.stripe import HTTPClient

    sdk = stripe.StripeClient(
        DEFAULT_API_KEY, base_addresses={"api": url}, http_client=HTTPClient(client)
    )
    with client.intent(order):
        if pattern == "create-if-missing":
            if order not in shop.ids:
                created = sdk.v1.payment_intents.create(
                    params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
                )
                shop.remember(order, created.id)
            paid = sdk.v1.payment_intents.confirm(
                shop.ids[order], params={"payment_method": "pm_card_visa"}
            )
            return {"order": order, "id": paid.id, "status": paid.status}
        created = sdk.v1.payment_intents.create(
            params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
        )
        if sdk.v1.payment_intents.retrieve(created.id).status != "succeeded":
            sdk.v1.payment_intents.confirm(created.id, params={"payment_method": "pm_card_visa"})
        return {"order": order, "id": created.id, "status": status_of(url, created.id)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--verbs", choices=("payonce", "stripe"), required=True)
    parser.add_argument("--pattern", choices=("create-if-missing", "confirm-unless-confirmed"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--shop", required=True)
    parser.add_argument("--orders", type=int, default=2)
    args = parser.parse_args()
    shop = Shop(Path(args.shop))
    own = args.verbs == "payonce"
    with payonce.Client(
        base_url=args.url,
        provider="stripe",
        account="acct_shop",
        api_key=DEFAULT_API_KEY if own else None,
        journal=args.journal,
        retry=FAST_RETRY,
        transport_only=not own,
    ) as client:
        checkout = payonce_checkout if own else stripe_checkout
        for number in range(args.orders):
            answer = checkout(client, args.url, shop, f"order-{number}", args.pattern)
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
