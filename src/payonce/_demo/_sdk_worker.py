"""The worker process of ``payonce demo --sdk stripe``: a shop's stripe-python checkout.

Run as ``python -m payonce._demo._sdk_worker``. For each order its own records do not mark
paid, it creates a PaymentIntent, then confirms it, then marks the order paid: the code a
shop writes with stripe-python. ``--journal`` adds what payonce asks of that code: one
line (``http_client=payonce.integrations.stripe.HTTPClient(client)``) and one block per
order (``with client.intent(order):``). ``--die-at ORDER:STEP`` SIGKILLs the process once
that order's step answered, before the shop recorded anything: the demo runs it again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sqlite3
from contextlib import closing
from typing import Any

import stripe

import payonce
from payonce.sandbox import DEFAULT_API_KEY

SDK_RETRY = payonce.RetryPolicy(max_attempts=10, initial_wait=0.01, max_wait=0.1)


def sdk_order(n: int) -> str:
    return f"sdk-order-{n:03d}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--orders-db", required=True)
    parser.add_argument("--orders", type=int, required=True)
    parser.add_argument("--journal")
    parser.add_argument("--die-at")
    args = parser.parse_args()
    die_at = None
    if args.die_at:
        order, step = args.die_at.split(":")
        die_at = (int(order), int(step))

    client = None
    options: dict[str, Any] = {}
    if args.journal:
        from payonce.integrations.stripe import HTTPClient

        client = payonce.Client(
            base_url=args.url,
            provider="stripe",
            account="acct_shop",
            journal=args.journal,
            retry=SDK_RETRY,
            transport_only=True,
        )
        options["http_client"] = HTTPClient(client)  # the one line
    sdk = stripe.StripeClient(DEFAULT_API_KEY, base_addresses={"api": args.url}, **options)

    def answered(n: int, step: int) -> None:
        if die_at == (n, step):
            os.kill(os.getpid(), signal.SIGKILL)

    with closing(sqlite3.connect(args.orders_db, isolation_level=None)) as orders:
        orders.execute("CREATE TABLE IF NOT EXISTS paid (reference TEXT PRIMARY KEY, id TEXT)")
        for n in range(args.orders):
            order = sdk_order(n)
            if orders.execute("SELECT 1 FROM paid WHERE reference = ?", (order,)).fetchone():
                continue
            # The one block (none for the SDK alone):
            with contextlib.nullcontext() if client is None else client.intent(order):
                created = sdk.v1.payment_intents.create(
                    params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
                )
                answered(n, 1)
                paid = sdk.v1.payment_intents.confirm(
                    created.id, params={"payment_method": "pm_card_visa"}
                )
                answered(n, 2)
            orders.execute("INSERT INTO paid VALUES (?, ?)", (order, paid.id))
    if client is not None:
        client.close()


if __name__ == "__main__":
    main()
