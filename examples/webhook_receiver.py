"""A webhook receiver that fulfils each paid order once, however often the event arrives.

A small Starlette app around ``payonce.WebhookInbox``: it verifies the provider's
``Stripe-Signature``, answers 400 to anything unsigned, stale or forged, hands each event
to the handler once (a redelivery is answered 200 without running it again, also after a
restart and across worker processes), answers 409 while another worker is handling the
same event, and 500 when the handler fails, so the provider redelivers and the event is
handled then.

Serve it for a real provider (any number of uvicorn workers may share the journal):

    PAYONCE_WEBHOOK_SECRETS=whsec_new,whsec_old PAYONCE_JOURNAL=/var/lib/shop/journal.db \\
        uvicorn --app-dir examples --factory webhook_receiver:app_from_env

Or run the self-contained demo, where payonce's sandbox provider delivers the events of
the payments it settles to this receiver over loopback, redelivering some on purpose:

    python examples/webhook_receiver.py
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import payonce
from payonce.webhooks import Event, WebhookInbox

logger = logging.getLogger("webhook_receiver")


class Orders:
    """The shop's own database: one fulfilment row per order paid.

    Deliberately a plain INSERT (no unique constraint), so a double fulfilment would show
    as two rows. A production handler would also make its effect safe to repeat, since a
    worker killed half-way through a handler leaves the event to be handled again.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS fulfilments (event_id TEXT NOT NULL,"
            " payment_id TEXT NOT NULL, reference TEXT, amount INTEGER NOT NULL,"
            " currency TEXT NOT NULL, status TEXT NOT NULL)"
        )

    def fulfil(self, event: Event) -> None:
        payment = event.data["object"]
        with self._lock:
            self._db.execute(
                "INSERT INTO fulfilments VALUES (?, ?, ?, ?, ?, ?)",
                (
                    event.id,
                    payment["id"],
                    payment.get("reference"),
                    payment["amount"],
                    payment["currency"],
                    payment["status"],
                ),
            )

    def fulfilments(self) -> list[tuple[str, str, str | None, int, str, str]]:
        with self._lock:
            return self._db.execute("SELECT * FROM fulfilments ORDER BY rowid").fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()


def create_app(inbox: WebhookInbox, orders: Orders) -> Starlette:
    async def handle(event: Event) -> None:
        if event.type == "payment.succeeded":
            await asyncio.to_thread(orders.fulfil, event)
        # Other event types are acknowledged and ignored.

    async def webhook(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            delivery = await inbox.areceive(body, request.headers, handle)
        except payonce.WebhookError as exc:  # signature or payload: never retried usefully
            logger.warning("webhook refused: %s", exc)
            return JSONResponse({"error": str(exc)}, status_code=400)
        except Exception:  # the handler failed: the event stays unprocessed
            logger.exception("webhook handler failed; the provider will redeliver")
            return JSONResponse({"error": "handler failed"}, status_code=500)
        return JSONResponse(
            {"event": delivery.event.id, "outcome": delivery.outcome.value},
            status_code=delivery.status_code,
        )

    return Starlette(routes=[Route("/webhooks", webhook, methods=["POST"])])


def app_from_env() -> Starlette:
    """The app for ``uvicorn --factory``, configured from the environment."""
    secrets = [s for s in os.environ.get("PAYONCE_WEBHOOK_SECRETS", "").split(",") if s]
    inbox = WebhookInbox(None, secrets)  # the journal: $PAYONCE_JOURNAL or the default
    return create_app(inbox, Orders(os.environ.get("SHOP_ORDERS_DB", "orders.db")))


# -- the demo ---------------------------------------------------------------------------------


class Receiver:
    """The app on a loopback port, served by uvicorn from a daemon thread."""

    def __init__(self, app: Starlette) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/webhooks"
        config = uvicorn.Config(
            app,
            loop="asyncio",
            http="h11",
            ws="none",
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> Receiver:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the receiver did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


def demo(workdir: Path) -> int:
    from payonce.sandbox import (
        DEFAULT_ACCOUNT,
        DEFAULT_API_KEY,
        SandboxConfig,
        SandboxServer,
        WebhookConfig,
    )

    # Mid-rotation: the provider signs with the old and the new secret; this receiver has
    # already moved on to the new one.
    inbox = WebhookInbox(workdir / "journal.db", ["whsec_new"])
    orders = Orders(workdir / "orders.db")
    with Receiver(create_app(inbox, orders)) as receiver:
        webhooks = WebhookConfig(
            url=receiver.url, secrets=["whsec_old", "whsec_new"], redeliver_rate=0.5, seed=7
        )
        with SandboxServer(SandboxConfig(webhooks=webhooks)) as provider:
            client = payonce.Client(
                base_url=provider.url,
                provider="sandbox",
                account=DEFAULT_ACCOUNT,
                api_key=DEFAULT_API_KEY,
                journal=workdir / "journal.db",
            )
            with client:
                for number in range(1, 7):
                    with client.intent(f"order-{number}") as op:
                        op.post("/v1/payments", json={"amount": 1000 * number, "currency": "eur"})
            if not provider.wait_for_webhooks(timeout=30):
                print("the sandbox still had webhooks to deliver after 30s")
                return 1
            attempts = provider.webhook_attempts()

    outcomes = collections.Counter[str]()
    for attempt in attempts:
        outcome = json.loads(attempt.response).get("outcome", "?") if attempt.response else "?"
        kind = "redelivery" if attempt.redelivery else "delivery"
        outcomes[f"{kind}: {outcome}"] += 1
        print(f"{attempt.event_id} {kind:10} HTTP {attempt.status_code} {outcome}")
    fulfilled = collections.Counter(row[1] for row in orders.fulfilments())
    print(f"events: {len({a.event_id for a in attempts})}, attempts: {len(attempts)}")
    for key in sorted(outcomes):
        print(f"  {key}: {outcomes[key]}")
    print(f"orders fulfilled: {len(fulfilled)}, each once: {set(fulfilled.values()) == {1}}")
    orders.close()
    inbox.close()
    return 0


def main() -> int:
    # No options: the parser is there so that -h prints what this script does, not runs it.
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="payonce-webhooks-") as workdir:
        return demo(Path(workdir))


if __name__ == "__main__":
    sys.exit(main())
