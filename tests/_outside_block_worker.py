"""Code not migrated to blocks yet: one stripe-python call that pays an order, made through
payonce's ``HTTPClient`` but outside any ``with client.intent(...)`` block. Run as a real
child process by tests/test_outside_block.py, which SIGKILLs it (PAYONCE_CRASH_AT) and runs
it again, then resumes the journal as an operator would.

``--key``: the caller sets the idempotency key itself (``options={"idempotency_key": ...}``),
else stripe-python draws one per call. Prints the PaymentIntent it got as one JSON line.

``--sdk square``: Square's SDK instead, as Square's own examples call it: a fresh
``idempotency_key=str(uuid.uuid4())`` per call, honoured by the default ``sdk_keys``
(red-team r17i H3). Prints the Payment it got as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import stripe

import payonce
from payonce.integrations.stripe import HTTPClient
from payonce.sandbox import DEFAULT_API_KEY

FAST_RETRY = payonce.RetryPolicy(max_attempts=3, initial_wait=0.001, max_wait=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--order", required=True)
    parser.add_argument("--key")
    parser.add_argument("--sdk", choices=["stripe", "square"], default="stripe")
    args = parser.parse_args()
    if args.sdk == "square":
        pay_with_square(args.url, args.journal, args.order)
        return
    payments = payonce.Client(
        base_url=args.url,
        provider="stripe",
        account="acct_shop",
        journal=args.journal,
        retry=FAST_RETRY,
        transport_only=True,
    )
    sdk = stripe.StripeClient(
        DEFAULT_API_KEY, base_addresses={"api": args.url}, http_client=HTTPClient(payments)
    )
    options: dict[str, Any] = {} if args.key is None else {"idempotency_key": args.key}
    paid = sdk.v1.payment_intents.create(
        params={
            "amount": 999,
            "currency": "eur",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "metadata": {"order": args.order},
        },
        options=options,  # type: ignore[arg-type]
    )
    print(json.dumps({"order": args.order, "id": paid.id, "status": paid.status}), flush=True)
    payments.close()


def pay_with_square(url: str, journal: str, order: str) -> None:
    from square import Square

    import payonce.integrations.square

    payments = payonce.Client(
        base_url=url,
        provider="square",
        account="acct_shop",
        journal=journal,
        retry=FAST_RETRY,
        transport_only=True,
    )
    http = payonce.integrations.square.httpx_client(payments)
    square = Square(token=DEFAULT_API_KEY, base_url=url, httpx_client=http)
    paid = square.payments.create(
        idempotency_key=str(uuid.uuid4()),  # as Square's examples: a new key on every run
        source_id="cnon:card-nonce-ok",
        amount_money={"amount": 1234, "currency": "USD"},
        reference_id=order,
        request_options={"max_retries": 0},
    ).payment
    assert paid is not None
    print(json.dumps({"order": order, "id": paid.id, "status": paid.status}), flush=True)
    http.close()
    payments.close()


if __name__ == "__main__":
    main()
