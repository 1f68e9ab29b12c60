"""A shop's checkout written with a provider's own SDK, run as a real child process by
tests/test_sdk_kills.py.

For each order: stripe-python creates a PaymentIntent then confirms it (with ``--card``,
``pm_card_visa`` unless told); Adyen authorises a payment then captures it; Square
approves a payment (a ``uuid4`` key per call, as its examples do) then completes it (or,
``--split``, pays two identical halves); Mollie creates a payment. ``--with-payonce`` adds what
payonce asks of such code: one line (the SDK over ``payonce.integrations``) and one block
per order. Without it, the SDK alone: its keys live in this process only.

The tests kill it with SIGKILL (PAYONCE_CRASH_AT at payonce's ``after_send``, or
``--die-between-steps`` once step 1 answered, or ``--die-if-declined`` once the card's
decline reached the code) and run it again; each order's final answer is printed as one
JSON line, which the tests compare with the sandbox's store.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import uuid
from collections.abc import Callable
from typing import Any

import payonce
from payonce.sandbox import DEFAULT_API_KEY, MOLLIE_TEST_API_KEY

FAST_RETRY = payonce.RetryPolicy(max_attempts=5, initial_wait=0.001, max_wait=0.02)
ADYEN_BASE = "https://checkout-test.adyen.com"

Checkout = Callable[[str, Callable[[], None]], dict[str, str]]
"""One order's checkout: (order, what to do between its steps) -> its final answer."""


def transport_client(
    url: str, provider: str, journal: str, max_stored_bytes: int | None = None
) -> payonce.Client:
    """The payonce client the SDK sends through; the SDK brings its own credentials."""
    more = {} if max_stored_bytes is None else {"max_stored_response_bytes": max_stored_bytes}
    return payonce.Client(
        base_url=url,
        provider=provider,
        account="acct_shop",
        journal=journal,
        retry=FAST_RETRY,
        transport_only=True,
        **more,
    )


def stripe_checkout(
    url: str,
    client: payonce.Client | None,
    *,
    card: str = "pm_card_visa",
    die_if_declined: bool = False,
) -> Checkout:
    """``card``: the customer's, confirmed with; ``die_if_declined``: SIGKILLed as its
    decline reaches the code (journaled by then)."""
    import stripe

    options: dict[str, Any] = {}
    if client is not None:
        from payonce.integrations.stripe import HTTPClient

        options["http_client"] = HTTPClient(client)  # the one line
    sdk = stripe.StripeClient(DEFAULT_API_KEY, base_addresses={"api": url}, **options)

    def checkout(order: str, between: Callable[[], None]) -> dict[str, str]:
        created = sdk.v1.payment_intents.create(
            params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
        )
        between()
        try:
            paid = sdk.v1.payment_intents.confirm(created.id, params={"payment_method": card})
        except stripe.CardError:
            if die_if_declined:
                die()
            raise
        # What the SDK parsed of each answer (a replayed one too).
        parsed = f"{created.object} {created.amount} {paid.object} {paid.amount}"
        return {"order": order, "id": paid.id, "status": paid.status, "parsed": parsed}

    return checkout


def adyen_checkout(url: str, client: payonce.Client | None) -> Checkout:
    import Adyen

    adyen = Adyen.Adyen(xapikey=DEFAULT_API_KEY, platform="test")
    checkout_api = adyen.checkout
    for api in (checkout_api.payments_api, checkout_api.modifications_api):
        api.baseUrl = api.baseUrl.replace(ADYEN_BASE, url)
    if client is not None:
        from payonce.integrations.adyen import use_transport

        use_transport(adyen, client)  # the one line

    def checkout(order: str, between: Callable[[], None]) -> dict[str, str]:
        paid = checkout_api.payments_api.payments(
            {
                "amount": {"value": 1000, "currency": "EUR"},
                "reference": order,
                "merchantAccount": "PayonceShop",
                "paymentMethod": {"type": "scheme", "encryptedCardNumber": "test_4111111111111111"},
                "returnUrl": "https://shop.example/return",
            }
        ).message
        between()
        captured = checkout_api.modifications_api.capture_authorised_payment(
            {"merchantAccount": "PayonceShop", "amount": {"value": 1000, "currency": "EUR"}},
            paid["pspReference"],
        ).message
        return {"order": order, "id": paid["pspReference"], "status": captured["status"]}

    return checkout


def adyen_base_url(url: str) -> str:
    """Adyen's paths carry its API version (``/v72``): its payonce client's base URL is
    the SDK's own, moved to the sandbox."""
    import Adyen

    return str(Adyen.Adyen(platform="test").checkout.payments_api.baseUrl).replace(ADYEN_BASE, url)


def mollie_checkout(url: str, client: payonce.Client | None) -> Checkout:
    import mollie.api.client

    sdk = mollie.api.client.Client(api_endpoint=url)
    sdk.set_api_key(MOLLIE_TEST_API_KEY)
    if client is not None:
        from payonce.integrations.mollie import use_transport

        use_transport(sdk, client)  # the one line

    def checkout(order: str, between: Callable[[], None]) -> dict[str, str]:
        created = sdk.payments.create(
            {
                "amount": {"currency": "EUR", "value": "10.00"},
                "description": order,
                "redirectUrl": "https://shop.example/return",
                "metadata": {"order": order},
            }
        )
        between()
        return {"order": order, "id": created.id, "status": created.status}

    return checkout


NO_RETRIES: Any = {"max_retries": 0}


def square_sdk(url: str, client: payonce.Client | None) -> Any:
    import httpx
    from square import Square

    if client is not None:
        from payonce.integrations.square import httpx_client

        http = httpx_client(client, sdk_keys="replace")  # the one line
    else:
        http = httpx.Client(timeout=60.0)
    return Square(token=DEFAULT_API_KEY, base_url=url, httpx_client=http)


def square_create(square: Any, order: str, amount: int, **more: Any) -> Any:
    """One payment, under a ``uuid4`` made for this call, as Square's examples do."""
    paid = square.payments.create(
        idempotency_key=str(uuid.uuid4()),
        source_id="cnon:card-nonce-ok",
        amount_money={"amount": amount, "currency": "USD"},
        reference_id=order,
        request_options=NO_RETRIES,
        **more,
    ).payment
    assert paid is not None
    return paid


def square_checkout(url: str, client: payonce.Client | None) -> Checkout:
    square = square_sdk(url, client)

    def checkout(order: str, between: Callable[[], None]) -> dict[str, str]:
        approved = square_create(square, order, 1500, autocomplete=False)
        between()
        assert approved.id is not None
        done = square.payments.complete(approved.id, request_options=NO_RETRIES).payment
        assert done is not None
        return {"order": order, "id": str(done.id), "status": str(done.status)}

    return checkout


def square_split_checkout(url: str, client: payonce.Client | None) -> Checkout:
    """A bill split in two equal halves: two identical payments in one block, each with a
    ``uuid4`` of its own (replaced by payonce's step keys)."""
    square = square_sdk(url, client)

    def checkout(order: str, between: Callable[[], None]) -> dict[str, str]:
        first = square_create(square, order, 750).id
        between()
        second = square_create(square, order, 750).id
        return {"order": order, "id": f"{first},{second}", "status": "COMPLETED"}

    return checkout


CHECKOUTS: dict[str, Callable[[str, payonce.Client | None], Checkout]] = {
    "stripe": stripe_checkout,
    "adyen": adyen_checkout,
    "mollie": mollie_checkout,
    "square": square_checkout,
}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sdk", choices=sorted(CHECKOUTS), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal")
    parser.add_argument("--orders", type=int, default=2)
    parser.add_argument("--die-between-steps", action="store_true")
    parser.add_argument("--max-stored-bytes", type=int)
    parser.add_argument("--split", action="store_true", help="square: two identical halves")
    parser.add_argument("--card", default="pm_card_visa", help="stripe: the confirm's card")
    parser.add_argument("--die-if-declined", action="store_true", help="stripe: killed then")
    args = parser.parse_args()

    between = die if args.die_between_steps else lambda: None
    client = None
    if args.journal:
        base_url = adyen_base_url(args.url) if args.sdk == "adyen" else args.url
        client = transport_client(base_url, args.sdk, args.journal, args.max_stored_bytes)
    if args.sdk == "stripe":
        checkout = stripe_checkout(
            args.url, client, card=args.card, die_if_declined=args.die_if_declined
        )
    else:
        checkout = (square_split_checkout if args.split else CHECKOUTS[args.sdk])(args.url, client)

    for n in range(args.orders):
        order = f"order-{n}"
        # The one block (none for the SDK alone):
        with contextlib.nullcontext() if client is None else client.intent(order):
            answer = checkout(order, between)
        print(json.dumps(answer), flush=True)
    if client is not None:
        client.close()


if __name__ == "__main__":
    main()
