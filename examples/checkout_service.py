"""An order service that pays through stripe-python, each order exactly once, even when it is
killed mid-payment.

``POST /orders/{order_id}/pay`` pays an order: stripe-python creates a PaymentIntent, then
confirms it with the customer's card, in one payonce block named after the order.
``GET /orders/{order_id}`` shows the order as the shop's own table has it. payonce sits under
stripe-python (``payonce.integrations.stripe.HTTPClient``, the one line) and journals each
request before it leaves, so the order id names the same Stripe keys for good: a double
click, a retrying load balancer, or this service killed and restarted never pay twice.

When the service starts, it first pays again every order a killed run left half paid (its
block, run again, replays what Stripe already did and sends what it did not), and only then
accepts requests.

Run it against the sandbox speaking Stripe's API (``pip install 'payonce[examples]'``)::

    payonce sandbox --like stripe --port 8765 &
    export STRIPE_API_KEY=sk_test_payonce STRIPE_API_BASE=http://127.0.0.1:8765
    export PAYONCE_ACCOUNT=acct_demo PAYONCE_JOURNAL=$PWD/payonce-journal.db
    export ORDERS_DB=$PWD/orders.db
    uvicorn --app-dir examples checkout_service:app --port 8000

    curl -X POST localhost:8000/orders/1001/pay -H 'content-type: application/json' \\
         -d '{"amount": 4200, "currency": "eur", "payment_method": "pm_card_visa"}'
    curl localhost:8000/orders/1001

Configuration, all from the environment:

- ``STRIPE_API_KEY``: the Stripe secret key (required; stripe-python sends it, payonce never
  journals it);
- ``STRIPE_API_BASE``: where Stripe is (default ``https://api.stripe.com``);
- ``PAYONCE_ACCOUNT``: the Stripe account that key belongs to (required): the journal keeps
  each account's payments apart, and an operator names it to finish them
  (``payonce resume``);
- ``PAYONCE_JOURNAL``: payonce's journal, a file path or a ``postgresql://`` URL. Keep it on
  a persistent disk: it is what survives the crash;
- ``ORDERS_DB``: the shop's own orders, an SQLite file (default ``orders.db``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
import stripe
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import payonce
import payonce.integrations.stripe

logger = logging.getLogger("checkout")


class PayRequest(BaseModel):
    amount: int = Field(gt=0, description="in minor units: 4200 is 42.00")
    currency: str = Field(pattern=r"^[a-z]{3}$", description="ISO 4217, lower case")
    payment_method: str = Field(description="a Stripe PaymentMethod id, never card numbers")


def reference_for(order_id: str) -> str:
    """The block's reference: one order, one intent, the same keys for good. Never change
    its format while orders are being paid: the new one would name new intents."""
    return f"order-{order_id}"


# -- the shop's own orders ------------------------------------------------------------------


class Orders:
    """The shop's order table: what the shop knows, apart from payonce's journal."""

    def __init__(self, path: str) -> None:
        self.path = path
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL,"
                " currency TEXT NOT NULL, payment_method TEXT NOT NULL, state TEXT NOT NULL,"
                " payment_intent TEXT, detail TEXT)"
            )

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10)
        db.row_factory = sqlite3.Row
        try:
            with db:  # one transaction, committed on success
                yield db
        finally:
            db.close()

    def get(self, order_id: str) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute("SELECT * FROM orders WHERE id = ?", (order_id,)).fetchone()
        return dict(row) if row is not None else None

    def start_paying(self, order_id: str, payment: PayRequest) -> dict[str, Any]:
        """Record the order as being paid (with the customer's card of the moment) before
        any request leaves, so a restart knows which orders to finish."""
        with self._db() as db:
            db.execute(
                "INSERT INTO orders (id, amount, currency, payment_method, state)"
                " VALUES (?, ?, ?, ?, 'paying') ON CONFLICT (id) DO UPDATE SET"
                " payment_method = excluded.payment_method, state = 'paying'"
                # Paid is final; another amount is another order, refused by the caller.
                " WHERE orders.state IN ('paying', 'declined', 'unknown')"
                " AND orders.amount = excluded.amount AND orders.currency = excluded.currency",
                (order_id, payment.amount, payment.currency, payment.payment_method),
            )
            row = db.execute("SELECT * FROM orders WHERE id = ?", (order_id,)).fetchone()
        return dict(row)

    def settle(self, order_id: str, state: str, payment_intent: str | None, detail: str) -> None:
        with self._db() as db:
            db.execute(
                "UPDATE orders SET state = ?, payment_intent = ?, detail = ? WHERE id = ?",
                (state, payment_intent, detail, order_id),
            )

    def being_paid(self) -> list[dict[str, Any]]:
        with self._db() as db:
            rows = db.execute("SELECT * FROM orders WHERE state = 'paying' ORDER BY id")
            return [dict(row) for row in rows]


# -- paying an order --------------------------------------------------------------------------


class Shop:
    def __init__(self) -> None:
        api_key = os.environ.get("STRIPE_API_KEY")
        account = os.environ.get("PAYONCE_ACCOUNT")
        if not api_key or not account:
            raise RuntimeError(
                "set STRIPE_API_KEY to your Stripe secret key and PAYONCE_ACCOUNT to the "
                "Stripe account it belongs to (acct_…)"
            )
        base = os.environ.get("STRIPE_API_BASE", "https://api.stripe.com")
        # The payonce client stripe-python sends through: it journals every request before
        # it leaves. stripe-python brings the API key, so this client needs none.
        self.payments = payonce.Client(
            provider="stripe", base_url=base, account=account, transport_only=True
        )
        self.stripe = stripe.StripeClient(
            api_key,
            base_addresses={"api": base},
            http_client=payonce.integrations.stripe.HTTPClient(self.payments),  # the one line
        )
        self.orders = Orders(os.environ.get("ORDERS_DB", "orders.db"))

    def close(self) -> None:
        self.payments.close()

    def pay(self, order: dict[str, Any]) -> None:
        """Pay one order: the whole block, the same on every run. Run again after a crash,
        it replays from the journal what Stripe already did (the create) and carries on
        with what it did not (the confirm)."""
        order_id = order["id"]
        declined: stripe.CardError | None = None
        try:
            with self.payments.intent(reference_for(order_id)):  # the one block
                intent = self.stripe.v1.payment_intents.create(
                    params={
                        "amount": order["amount"],
                        "currency": order["currency"],
                        "metadata": {"order": order_id},
                    }
                )
                try:
                    intent = self.stripe.v1.payment_intents.confirm(
                        intent.id, params={"payment_method": order["payment_method"]}
                    )
                except stripe.CardError as exc:
                    # Recorded once the block has ended on it: had a run with another card
                    # gone on past this decline, the block would raise instead.
                    declined = exc
        except stripe.StripeError as exc:
            self._not_paid(order_id, exc)
            return
        except payonce.IntentMismatch as exc:
            # The block ended on a decline that an earlier run went on past with another
            # card: the order may be paid. Nothing was sent; a person looks.
            self.orders.settle(order_id, "mismatch", None, str(exc))
            return
        if declined is not None:
            self.orders.settle(order_id, "declined", None, declined.user_message or "declined")
        else:
            self.orders.settle(order_id, "paid", intent.id, intent.status)

    def _not_paid(self, order_id: str, exc: stripe.StripeError) -> None:
        """Stripe's or payonce's word that the order is not settled: the order stays
        ``paying`` (a restart, or the customer's retry, runs its block again) unless payonce
        says why not."""
        reason = getattr(exc, "payonce_error", None)
        if isinstance(reason, payonce.OutcomeUnknown):
            # Maybe paid: never pay it again under another reference. An operator settles
            # it (`payonce reconcile`), then the block, run again, carries on.
            self.orders.settle(order_id, "unknown", None, str(reason))
        elif isinstance(reason, payonce.IntentMismatch):
            # This order's journaled requests differ from this run's: nothing was sent.
            self.orders.settle(order_id, "mismatch", None, str(reason))
        else:
            logger.warning("order %s not paid yet: %s", order_id, exc)


# -- the web service ------------------------------------------------------------------------


def finish_what_a_killed_run_left(shop: Shop) -> None:
    """Run again the block of every order a killed run was paying: the only way to send a
    block's later steps (a resume resends a step left pending, never the next one)."""
    for order in shop.orders.being_paid():
        shop.pay(order)
        finished = shop.orders.get(order["id"]) or order
        logger.info("finished order-%s: %s", order["id"], finished["state"])


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # uvicorn configures only its own loggers; this shows ours and payonce's (a no-op when
    # the host program has configured logging already).
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # payonce logs each intent already
    logging.getLogger("stripe").setLevel(logging.WARNING)
    shop = Shop()
    try:
        # uvicorn opens its socket only once this returns: no order is taken before the
        # previous run's half-paid orders are finished.
        await anyio.to_thread.run_sync(finish_what_a_killed_run_left, shop)
        app.state.shop = shop
        yield
    finally:
        shop.close()


app = FastAPI(title="checkout", lifespan=lifespan)

_ANSWERS = {"paid": 200, "declined": 402, "unknown": 202, "mismatch": 409, "paying": 503}
"""The HTTP status of each order state after a pay request."""


# A plain ``def``: FastAPI runs it in its thread pool, where the blocking clients belong.
# One payonce client serves every thread; the journal arbitrates between them.
@app.post("/orders/{order_id}/pay")
def pay(order_id: str, payment: PayRequest, request: Request) -> JSONResponse:
    shop: Shop = request.app.state.shop
    order = shop.orders.start_paying(order_id, payment)
    if (order["amount"], order["currency"]) != (payment.amount, payment.currency):
        return JSONResponse({**order, "detail": "this order has another amount"}, 409)
    if order["state"] == "paying":  # else paid already, or refused above
        shop.pay(order)
        order = shop.orders.get(order_id) or order
    # A state other than paid is retried by the customer (paying: the same request again
    # is safe; declined: another card), or settled by an operator (unknown).
    headers = {"Retry-After": "5"} if order["state"] in ("paying", "unknown") else None
    return JSONResponse(order, _ANSWERS.get(order["state"], 500), headers=headers)


@app.get("/orders/{order_id}")
def order(order_id: str, request: Request) -> dict[str, Any]:
    shop: Shop = request.app.state.shop
    found = shop.orders.get(order_id)
    if found is None:
        raise HTTPException(404, f"no order {order_id}")
    return found


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}
