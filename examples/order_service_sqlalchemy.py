"""The order service of ``order_service_psycopg.py``, written with SQLAlchemy's ORM.

Run it with payonce, its sandbox and its PostgreSQL support installed, and SQLAlchemy 2
(``pip install 'payonce[sandbox,postgres]' sqlalchemy``), against a database you may create
a table and a schema in:

    DATABASE_URL=postgresql://shop:secret@localhost/shop python examples/order_service_sqlalchemy.py

The engine uses the psycopg 3 driver (``postgresql+psycopg://``). Each request handler
runs in one ``Session`` transaction (``with Session(engine) as session, session.begin():``)
and passes the session itself to ``client.enqueue(..., connection=session)``: the payment
intent is written in the session's transaction, beside the ``Order`` it adds, and commits
or rolls back with it. ``client.resume()`` sends each committed payment once afterwards.

Its outcome reader (``record_outcomes``) reads ``client.outcomes()``, sets each order's
``status`` (``paid`` or ``declined``) once, and acknowledges the outcome after that commit.
As the psycopg example, it runs as two commands beside ``payonce worker`` (with
``PAYONCE_BASE_URL`` and ``PAYONCE_ACCOUNT`` set): ``place ORDER_ID AMOUNT`` and
``record-outcomes``.
"""

from __future__ import annotations

import os
import sys

from sqlalchemy import Engine, String, create_engine, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import payonce
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxServer


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    # Named with its schema: a database role named like the journal's schema (payonce) would
    # otherwise find that schema first on its search path once the journal has created it.
    __table_args__ = ({"schema": "public"},)

    id: Mapped[str] = mapped_column(String, primary_key=True)
    amount: Mapped[int]
    payment_key: Mapped[str | None]
    status: Mapped[str | None]  # paid or declined, once the service has learnt the outcome


USAGE = """usage: order_service_sqlalchemy.py                       the whole story, with a sandbox
       order_service_sqlalchemy.py place ORDER_ID AMOUNT  enqueue one order's payment
       order_service_sqlalchemy.py record-outcomes        one pass of the outcome reader"""


class HandlerFailed(Exception):
    """What a request handler raises after it enqueued: its whole transaction rolls back."""


def place_order(
    client: payonce.Client, session: Session, order_id: str, amount: int, *, fail: bool = False
) -> payonce.IntentRecord:
    """The request handler's work, in the session's open transaction; safe to retry."""
    order = session.get(Order, order_id) or Order(id=order_id, amount=amount)
    session.add(order)
    payment = client.enqueue(
        "POST",
        "/v1/payments",
        reference=order_id,
        json={"amount": amount, "currency": "eur"},
        connection=session,
    )
    order.payment_key = payment.key
    if fail:
        raise HandlerFailed(f"{order_id}: the handler failed after enqueuing")
    return payment


def record_outcomes(client: payonce.Client, engine: Engine) -> int:
    """One pass of the service's outcome reader: each outcome recorded, then acknowledged.
    Listed again after a crash between the two, an outcome changes nothing the second time."""
    recorded = 0
    cursor = None  # every pass starts at the oldest outcome not acknowledged
    while page := client.outcomes(after=cursor, limit=100):
        for payment in page:
            status = "paid" if payment.state is payonce.IntentState.SUCCEEDED else "declined"
            with Session(engine) as session, session.begin():
                changed = session.execute(
                    update(Order)
                    .where(Order.id == payment.reference, Order.status.is_(None))
                    .values(status=status)
                ).rowcount
            again = "" if changed else " (recorded before)"
            print(f"recorded {payment.reference}: {status}{again}", flush=True)
            client.acknowledge(payment.key)  # after the record committed, never before
            recorded += 1
        cursor = page.cursor
    return recorded


def journal_url(database_url: str) -> str:
    """The journal in the service's own database, schema "payonce": the same database the
    engine writes orders to, which is what lets enqueue join its transactions."""
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


def whole_story(engine: Engine, database_url: str) -> int:
    """The service and its worker in one process, with the sandbox provider in it."""
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
            with Session(engine) as session, session.begin():
                first = place_order(client, session, "order-1001", 4200)
            print(f"order-1001: committed with payment {first.key} ({first.state.value})")
            with Session(engine) as session, session.begin():
                retried = place_order(client, session, "order-1001", 4200)
            print(f"order-1001 retried: same payment {retried.key == first.key}")

            try:
                with Session(engine) as session, session.begin():
                    place_order(client, session, "order-1002", 1500, fail=True)
            except HandlerFailed as exc:
                print(f"{exc}: rolled back")
            print(f"order-1002: payments journaled {len(client.journal.find('order-1002'))}")

            for result in client.resume():
                print(f"resumed {result.reference}: {result.state.value} ({result.detail})")
            print(f"resumed again: {len(client.resume())} to send")
            print(f"{record_outcomes(client, engine)} outcome(s) recorded")

        executed = provider.store.total_executions()
        if not earlier:
            print(f"the sandbox executed {executed} payment(s) for 1 committed order")
        else:
            (paid,) = earlier
            before = f"payment {paid.key}, {paid.state.value}"
            print(
                f"order-1001 was paid by an earlier run on this database ({before}), so "
                f"this run's sandbox executed {executed} payment(s)"
            )
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
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        Base.metadata.create_all(engine)
        if placing:
            order_id, amount = arguments[1], int(arguments[2])
            with (
                enqueue_only_client(database_url) as client,
                Session(engine) as session,
                session.begin(),
            ):
                payment = place_order(client, session, order_id, amount)
            print(f"{order_id}: committed with payment {payment.key} ({payment.state.value})")
            return 0
        if arguments:  # record-outcomes
            with enqueue_only_client(database_url) as client:
                print(f"{record_outcomes(client, engine)} outcome(s) recorded")
            return 0
        return whole_story(engine, database_url)
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
