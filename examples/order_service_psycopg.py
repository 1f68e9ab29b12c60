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

The service learns each payment's outcome from ``client.outcomes()`` and records it in its
own table (``orders.status``: ``paid`` or ``declined``), then acknowledges it: its outcome
reader, run on a schedule. Recording is idempotent, so an outcome listed again after a
crash between the two is recorded once.

Deployed, the service only enqueues (its client holds no API key: ``transport_only=True``)
and ``payonce worker`` sends, with the key of ``PAYONCE_ACCOUNT``. The same service, run as
its two commands beside a running worker and provider::

    export DATABASE_URL=postgresql://... PAYONCE_BASE_URL=http://127.0.0.1:8765
    export PAYONCE_ACCOUNT=acct_demo          # the account the worker sends for
    python examples/order_service_psycopg.py place order-2001 4200
    python examples/order_service_psycopg.py record-outcomes
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

import payonce
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxServer

# The shop's table, named with its schema: a database role named like the journal's schema
# (``payonce``) would otherwise find that schema first on its search path ("$user", public)
# once the journal has created it, and a bare ``orders`` would name another table.
ORDERS = """
CREATE TABLE IF NOT EXISTS public.orders (
    id          text PRIMARY KEY,
    amount      integer NOT NULL,
    payment_key text,
    status      text  -- paid or declined, once the service has learnt the outcome
)
"""


USAGE = """usage: order_service_psycopg.py                          the whole story, with a sandbox
       order_service_psycopg.py place ORDER_ID AMOUNT     enqueue one order's payment
       order_service_psycopg.py record-outcomes           one pass of the outcome reader"""


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
            "INSERT INTO public.orders (id, amount) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
            (order_id, amount),
        )
        payment = client.enqueue(
            "POST",
            "/v1/payments",
            reference=order_id,
            json={"amount": amount, "currency": "eur"},
            connection=conn,
        )
        conn.execute(
            "UPDATE public.orders SET payment_key = %s WHERE id = %s", (payment.key, order_id)
        )
        if fail:
            raise HandlerFailed(f"{order_id}: the handler failed after enqueuing")
        return payment


def record_outcomes(client: payonce.Client, database_url: str) -> int:
    """One pass of the service's outcome reader: each settled payment's outcome recorded in
    the order's row, then acknowledged (never before the record committed). A crash between
    the two lists the outcome again on the next pass: recording it again changes nothing."""
    recorded = 0
    cursor = None  # every pass starts at the oldest outcome not acknowledged
    while page := client.outcomes(after=cursor, limit=100):
        for payment in page:
            status = "paid" if payment.state is payonce.IntentState.SUCCEEDED else "declined"
            with transaction(database_url) as conn:
                changed = conn.execute(
                    "UPDATE public.orders SET status = %s WHERE id = %s AND status IS NULL",
                    (status, payment.reference),
                ).rowcount
            again = "" if changed else " (recorded before)"
            print(f"recorded {payment.reference}: {status}{again}", flush=True)
            client.acknowledge(payment.key)
            recorded += 1
        cursor = page.cursor
    return recorded


def journal_url(database_url: str) -> str:
    """The journal lives in the service's own database, in a schema of its own: that is
    what lets enqueue write into the service's transactions."""
    return f"{database_url}{'&' if '?' in database_url else '?'}schema=payonce"


def enqueue_only_client(database_url: str) -> payonce.Client:
    """The deployed service's client: it enqueues and reads outcomes; the worker sends."""
    return payonce.Client(
        base_url=os.environ["PAYONCE_BASE_URL"],
        provider="sandbox",
        account=os.environ["PAYONCE_ACCOUNT"],  # the account the worker sends for
        journal=journal_url(database_url),
        transport_only=True,  # no API key: nothing is sent from here
    )


def whole_story(database_url: str) -> int:
    """The service and its worker in one process, with the sandbox provider in it."""
    # A real service has its provider's base URL.
    with SandboxServer() as provider:
        client = payonce.Client(
            base_url=provider.url,
            provider="sandbox",
            account=DEFAULT_ACCOUNT,
            api_key=DEFAULT_API_KEY,
            journal=journal_url(database_url),
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
            print(f"{record_outcomes(client, database_url)} outcome(s) recorded")

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


def main() -> int:
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        print("set DATABASE_URL to a PostgreSQL database, e.g. postgresql://localhost/shop")
        return 2
    arguments = sys.argv[1:]
    placing = arguments[:1] == ["place"] and len(arguments) == 3 and arguments[2].isdigit()
    if arguments and not placing and arguments != ["record-outcomes"]:
        print(USAGE)
        return 2
    if arguments and not (os.environ.get("PAYONCE_BASE_URL") and os.environ.get("PAYONCE_ACCOUNT")):
        print(
            "set PAYONCE_BASE_URL to the provider and PAYONCE_ACCOUNT to the account the "
            "worker sends for"
        )
        return 2
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(ORDERS)

    if placing:
        order_id, amount = arguments[1], int(arguments[2])
        with enqueue_only_client(database_url) as client:
            payment = place_order(client, database_url, order_id, amount)
        print(f"{order_id}: committed with payment {payment.key} ({payment.state.value})")
        return 0
    if arguments:  # record-outcomes
        with enqueue_only_client(database_url) as client:
            print(f"{record_outcomes(client, database_url)} outcome(s) recorded")
        return 0
    return whole_story(database_url)


if __name__ == "__main__":
    sys.exit(main())
