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
"""

from __future__ import annotations

import os
import sys

from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import payonce
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxServer


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[str] = mapped_column(String, primary_key=True)
    amount: Mapped[int]
    payment_key: Mapped[str | None]


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


def main() -> int:
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        print("set DATABASE_URL to a PostgreSQL database, e.g. postgresql://localhost/shop")
        return 2
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    Base.metadata.create_all(engine)

    with SandboxServer() as provider:
        client = payonce.Client(
            base_url=provider.url,
            provider="sandbox",
            account=DEFAULT_ACCOUNT,
            api_key=DEFAULT_API_KEY,
            # The journal in the service's own database, schema "payonce": the same database
            # the engine writes orders to, which is what lets enqueue join its transactions.
            journal=f"{database_url}{'&' if '?' in database_url else '?'}schema=payonce",
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
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
