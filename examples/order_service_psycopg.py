"""An order service whose orders and payments commit together: the outbox, with psycopg 3.

Run it with payonce, its sandbox and its PostgreSQL support installed
(``pip install 'payonce[sandbox,postgres]'``), against a database you may create a table
and a schema in:

    DATABASE_URL=postgresql://shop:secret@localhost/shop python examples/order_service_psycopg.py

Placing an order inserts the order row and enqueues its payment with
``client.enqueue(..., connection=conn)`` in the same transaction: the payment intent is
journaled through the service's own connection, into the journal's schema (``payonce``) of
the same database. Both commit, or neither does: a handler that fails after enqueuing
leaves no order and no payment behind, and a crash after the commit leaves an intent that
is sent later. ``client.resume()`` (here, in-process) or ``payonce worker`` /
``payonce resume`` (beside the service) sends each committed intent once, under its key.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

import payonce
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxServer

ORDERS = """
CREATE TABLE IF NOT EXISTS orders (
    id          text PRIMARY KEY,
    amount      integer NOT NULL,
    payment_key text
)
"""


class HandlerFailed(Exception):
    """What a request handler raises after it enqueued: its whole transaction rolls back."""


@contextmanager
def transaction(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """One request's transaction: committed when the block ends, rolled back if it raises."""
    with psycopg.connect(database_url) as conn, conn.transaction():
        yield conn


def place_order(
    client: payonce.Client, database_url: str, order_id: str, amount: int, *, fail: bool = False
) -> payonce.IntentRecord:
    """The request handler: the order and its payment, in one transaction.

    Safe to retry: the order insert does nothing the second time, and the same reference
    enqueued again is the same intent (same key), not a second payment.
    """
    with transaction(database_url) as conn:
        conn.execute(
            "INSERT INTO orders (id, amount) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
            (order_id, amount),
        )
        payment = client.enqueue(
            "POST",
            "/v1/payments",
            reference=order_id,
            json={"amount": amount, "currency": "eur"},
            connection=conn,
        )
        conn.execute("UPDATE orders SET payment_key = %s WHERE id = %s", (payment.key, order_id))
        if fail:
            raise HandlerFailed(f"{order_id}: the handler failed after enqueuing")
        return payment


def main() -> int:
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        print("set DATABASE_URL to a PostgreSQL database, e.g. postgresql://localhost/shop")
        return 2
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(ORDERS)

    # The sandbox provider, in this process; a real service has its provider's base URL.
    with SandboxServer() as provider:
        client = payonce.Client(
            base_url=provider.url,
            provider="sandbox",
            account=DEFAULT_ACCOUNT,
            api_key=DEFAULT_API_KEY,
            # The journal lives in the service's own database, in a schema of its own:
            # that is what lets enqueue write into the service's transactions.
            journal=f"{database_url}{'&' if '?' in database_url else '?'}schema=payonce",
        )
        with client:
            # A run before this one on the same database (either order-service example)
            # journaled order-1001 already: its payment is not made again.
            earlier = client.journal.find("order-1001")
            first = place_order(client, database_url, "order-1001", 4200)
            print(f"order-1001: committed with payment {first.key} ({first.state.value})")
            retried = place_order(client, database_url, "order-1001", 4200)
            print(f"order-1001 retried: same payment {retried.key == first.key}")

            try:
                place_order(client, database_url, "order-1002", 1500, fail=True)
            except HandlerFailed as exc:
                print(f"{exc}: rolled back")
            print(f"order-1002: payments journaled {len(client.journal.find('order-1002'))}")

            for result in client.resume():
                print(f"resumed {result.reference}: {result.state.value} ({result.detail})")
            print(f"resumed again: {len(client.resume())} to send")

        executed = provider.store.total_executions()
        if earlier:
            print(
                f"order-1001 was paid by an earlier run on this database (payment "
                f"{earlier[0].key}, {earlier[0].state.value}), so this run's sandbox "
                f"executed {executed} payment(s)"
            )
        else:
            print(f"the sandbox executed {executed} payment(s) for 1 committed order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
