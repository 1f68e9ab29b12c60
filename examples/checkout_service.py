"""A checkout service that charges each order exactly once, even when it is killed mid-request.

``POST /orders/{order_id}/pay`` charges an order through payonce; ``GET /orders/{order_id}``
shows what the journal knows about its payment. The order id is the intent's reference, so
the same order always carries the same idempotency key: a customer who clicks "pay" twice,
a load balancer that retries, or this service restarted after a crash, never charge twice.

When the service starts it first finishes what an earlier run of it started (the requests
it was killed in the middle of: ``client.resume()``, ``client.reconcile_all()``), and only
then accepts requests.

Run it against the sandbox provider (``pip install 'payonce[sandbox,examples]'``)::

    payonce sandbox --port 8765 &
    export PAYONCE_BASE_URL=http://127.0.0.1:8765 PAYONCE_API_KEY=sk_test_payonce
    export PAYONCE_JOURNAL=$PWD/checkout-journal.db
    uvicorn --app-dir examples checkout_service:app --port 8000

    curl -X POST localhost:8000/orders/1001/pay -H 'content-type: application/json' \\
         -d '{"amount": 4200, "currency": "eur"}'
    curl localhost:8000/orders/1001

Configuration, all from the environment:

- ``PAYONCE_BASE_URL``: the provider's API root (required);
- ``PAYONCE_PROVIDER``: the provider profile (default ``sandbox``);
- ``PAYONCE_ACCOUNT``: the account at the provider (default ``acct_demo``, the sandbox's);
- ``PAYONCE_API_KEY``: the API key (else the OS keyring entry of the account);
- ``PAYONCE_JOURNAL``: the journal, a file path or a ``postgresql://`` URL (default: the
  user data directory). Keep it on a persistent disk: it is what survives the crash.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import payonce

logger = logging.getLogger("checkout")

PAYMENTS_PATH = "/v1/payments"


class PayRequest(BaseModel):
    amount: int = Field(gt=0, description="in minor units: 4200 is 42.00")
    currency: str = Field(pattern=r"^[a-z]{3}$", description="ISO 4217, lower case")


def reference_for(order_id: str) -> str:
    """The intent's reference: one order, one intent, one key, for good."""
    return f"order-{order_id}"


def make_client() -> payonce.Client:
    base_url = os.environ.get("PAYONCE_BASE_URL")
    if not base_url:
        raise RuntimeError("set PAYONCE_BASE_URL to the payment provider's API root")
    # The API key comes from PAYONCE_API_KEY or the OS keyring, the journal from
    # PAYONCE_JOURNAL or the user data directory: payonce.Client reads both itself.
    return payonce.Client(
        base_url=base_url,
        provider=os.environ.get("PAYONCE_PROVIDER", "sandbox"),
        account=os.environ.get("PAYONCE_ACCOUNT", "acct_demo"),
    )


def recover(client: payonce.Client) -> None:
    """Finish what an earlier run of this service left behind, before taking new requests.

    A run killed mid-request leaves its intent ``pending`` in the journal: ``resume`` sends
    it again under its own key, so the provider executes it at most once (or replays what
    it already did). Intents whose outcome could not be known are ``unknown``:
    ``reconcile_all`` asks the provider about them, which may put some back to
    ``pending`` (the provider has no record, and the key is still valid), hence the
    second ``resume``.
    """
    results: list[payonce.records.ResumeResult | payonce.records.ReconcileResult] = []
    results += client.resume()
    if client.provider.lookup is not None:
        results += client.reconcile_all()
        results += client.resume()
    for result in results:
        logger.info("recovered %s (%s): %s", result.reference, result.key, result.detail)
    # The client-side outbox: outcomes settled while nobody was waiting for them. This
    # service keeps no order table of its own (GET /orders reads the journal), so logging
    # them is all there is to record; a real one would update its orders here, then ack.
    for record in client.unacknowledged():
        logger.info("order payment %s settled as %s", record.reference, record.state)
        client.acknowledge(record.key)
    still = client.journal.list_intents(
        states=[payonce.IntentState.PENDING, payonce.IntentState.UNKNOWN]
    )
    if still := [r for r in still if r.account == client.account]:
        logger.warning(
            "%d payment(s) still pending or unknown after recovery: run the resume worker, "
            "or `payonce resume; payonce reconcile --all; payonce resume`",
            len(still),
        )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # uvicorn configures only its own loggers; this shows ours and payonce's (a no-op when
    # the host program has configured logging already).
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # payonce logs each intent already
    client = make_client()
    try:
        # uvicorn opens its socket only once this returns, so no request is taken before
        # the previous run's unfinished payments are settled.
        await anyio.to_thread.run_sync(recover, client)
        app.state.client = client
        yield
    finally:
        client.close()


app = FastAPI(title="checkout", lifespan=lifespan)


def _client(request: Request) -> payonce.Client:
    client: payonce.Client = request.app.state.client
    return client


def _error(
    status: int, order_id: str, state: str, detail: str, retry_after: int | None = None
) -> JSONResponse:
    body = {"order_id": order_id, "state": state, "detail": detail}
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


# A plain ``def``: FastAPI runs it in its thread pool, where the blocking payonce.Client
# belongs. One client serves every thread; the journal arbitrates between them.
@app.post("/orders/{order_id}/pay")
def pay(order_id: str, payment: PayRequest, request: Request) -> Any:
    client = _client(request)
    reference = reference_for(order_id)
    body = {"amount": payment.amount, "currency": payment.currency, "reference": reference}
    try:
        with client.intent(reference) as op:
            try:
                response = op.post(PAYMENTS_PATH, json=body)
            except payonce.ProviderError as exc:
                # A definitive refusal (a declined card), journaled: asking again replays
                # it and never tries the card twice. Handled here, inside the block, so
                # leaving it acknowledges the outcome.
                return _refused(order_id, exc)
    except payonce.IntentMismatch as exc:
        # The order is already being paid with another amount or currency: nothing sent.
        return _error(409, order_id, "mismatch", str(exc))
    except payonce.OutcomeUnknown as exc:
        # Maybe charged, maybe not. Never charge it again under another reference: the
        # resume worker (or `payonce reconcile`) finds out, and GET /orders shows it.
        return _error(202, order_id, "unknown", exc.reason, retry_after=60)
    except payonce.ProviderUnavailable as exc:
        # Provably not executed: sending the same request again later is safe.
        return _error(503, order_id, "pending", str(exc), retry_after=5)
    except payonce.IntentInFlight as exc:
        # Another request for this order is being sent right now: ask again shortly.
        return _error(409, order_id, "in_flight", str(exc), retry_after=1)
    except payonce.IntentStateError as exc:
        # An operator abandoned this order's payment (`payonce abandon`).
        return _error(409, order_id, "abandoned", str(exc))
    except payonce.JournalError as exc:
        # The journal cannot be written: nothing is sent without a key on record.
        return _error(503, order_id, "journal_unavailable", str(exc), retry_after=5)
    info = payonce.response_info(response)
    return {
        "order_id": order_id,
        "state": "succeeded",
        "payment": response.json(),
        "idempotency_key": op.key,
        # True when the answer came from the journal: the order had been paid already.
        "replayed": bool(info and info.replayed),
    }


def _refused(order_id: str, exc: payonce.ProviderError) -> JSONResponse:
    try:
        answer = exc.response.json()
    except ValueError:
        answer = None
    body = {"order_id": order_id, "state": "failed", "provider_response": answer}
    # 402 for a declined card; any other refusal is the provider's problem with our request.
    return JSONResponse(body, status_code=402 if exc.status_code == 402 else 502)


@app.get("/orders/{order_id}")
def order(order_id: str, request: Request) -> dict[str, Any]:
    client = _client(request)
    payment_scope = f"{client.account} POST {PAYMENTS_PATH}"
    records = [
        r
        for r in client.journal.find(reference_for(order_id))
        if r.scope == payment_scope  # the same reference on another endpoint is another intent
    ]
    if not records:
        raise HTTPException(404, f"no payment for order {order_id}")
    record = records[0]
    payment = None
    if record.response is not None and record.response.body_stored:
        try:
            payment = json.loads(record.response.body)
        except ValueError:
            payment = None
    return {
        "order_id": order_id,
        "state": str(record.state),
        "idempotency_key": record.key,
        "attempts": record.attempt_count,
        "in_flight": record.lease_live(time.time()),
        "unknown_reason": record.unknown_reason,
        "status_code": record.response.status if record.response else None,
        "payment": payment,
    }


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}
