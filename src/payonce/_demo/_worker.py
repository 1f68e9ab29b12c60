"""One worker process of the kill scenario: it pays its slice of a batch of orders.

Run as ``python -m payonce._demo._worker``; the demo SIGKILLs it at random moments and starts
it again on the same slice. It is the loop a batch job runs: skip the orders its own records
already mark paid, pay the others one by one, mark each paid once the provider answered.
Both clients run this same loop; only where the idempotency key lives differs:

- ``payonce``: the key is in the journal, a SQLite file all workers share, found again by
  the order's reference. A restarted worker asks for the same reference and gets the same
  key: the provider replays, or payonce finishes the intent the dead worker left.
- ``stripe``: the stripe-python pattern. A key (uuid4) is made when the process starts
  paying an order and reused on that call's retries, so a lost answer is safe; but it
  lives only in this process's memory, and the restarted worker makes a new one.

It prints ``ready`` once it is about to pay, then ``paid REFERENCE`` for each order it marks
paid; those lines are progress for the screen only (a kill loses them). What was charged is
read at the provider.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Literal

import httpx

import payonce
from payonce._demo._scenario import PAYMENTS_PATH, DemoPayment, plan
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY

Pattern = Literal["payonce", "stripe"]
PATTERNS: tuple[Pattern, ...] = ("payonce", "stripe")

WORKER_RETRY = payonce.RetryPolicy(
    max_attempts=20, initial_wait=0.01, max_wait=0.1, max_retry_after=0.1
)
"""Enough to outwait a payment still executing for the worker that was killed (409s)."""

WORKER_TIMEOUT = 10.0
"""Far longer than any answer takes here: in this scenario only kills lose payments."""

_MAX_CALLS = 20
"""Calls of one order before the worker gives up and fails the demo (never, if all is well)."""


class _Orders:
    """The application's own record of which orders are paid (one file per worker slot)."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS paid (reference TEXT PRIMARY KEY, payment_id TEXT)"
        )

    def is_paid(self, reference: str) -> bool:
        found = self._db.execute("SELECT 1 FROM paid WHERE reference = ?", (reference,))
        return found.fetchone() is not None

    def mark_paid(self, reference: str, payment_id: str) -> None:
        self._db.execute("INSERT INTO paid VALUES (?, ?)", (reference, payment_id))

    def close(self) -> None:
        self._db.close()


def _pay_with_payonce(client: payonce.Client) -> Callable[[DemoPayment], str]:
    def pay(payment: DemoPayment) -> str:
        for _ in range(_MAX_CALLS):
            try:
                response = client.post(
                    PAYMENTS_PATH, json=payment.body, reference=payment.reference
                )
            except payonce.OutcomeUnknown:
                # Retries ran out while the answer was unknown: ask the provider, which
                # settles the intent or shows it never ran; the next call replays or sends.
                client.reconcile(payment.reference)
            except payonce.ProviderUnavailable:
                pass  # it provably never executed: the same intent may be sent again
            else:
                return str(response.json()["id"])
        raise RuntimeError(f"{payment.reference}: no answer after {_MAX_CALLS} calls")

    return pay


def _pay_like_stripe_python(http: httpx.Client) -> Callable[[DemoPayment], str]:
    def pay(payment: DemoPayment) -> str:
        for _ in range(_MAX_CALLS):
            # One key per call, made in memory and kept for this call's retries, as
            # stripe-python does; a call that gives up is followed by a new call, a new key.
            key = str(uuid.uuid4())
            for attempt in range(1, WORKER_RETRY.max_attempts + 1):
                try:
                    response = http.post(
                        PAYMENTS_PATH, json=dict(payment.body), headers={"Idempotency-Key": key}
                    )
                except httpx.TransportError:
                    pass
                else:
                    if response.is_success:
                        return str(response.json()["id"])
                    if response.status_code < 500 and response.status_code not in (409, 429):
                        response.raise_for_status()
                time.sleep(WORKER_RETRY.backoff(attempt))
        raise RuntimeError(f"{payment.reference}: no answer after {_MAX_CALLS} calls")

    return pay


def _work(batch: Sequence[DemoPayment], orders: _Orders, pay: Callable[[DemoPayment], str]) -> None:
    print("ready", flush=True)
    for payment in batch:
        if not orders.is_paid(payment.reference):
            orders.mark_paid(payment.reference, pay(payment))
        print(f"paid {payment.reference}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m payonce._demo._worker")
    parser.add_argument("--pattern", choices=PATTERNS, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal", type=Path, help="the shared journal (payonce only)")
    parser.add_argument("--orders-db", type=Path, required=True)
    parser.add_argument("--total", type=int, required=True, help="orders in the whole batch")
    parser.add_argument("--first", type=int, required=True, help="this slice's first order")
    parser.add_argument("--count", type=int, required=True, help="this slice's orders")
    args = parser.parse_args(argv)
    if args.pattern == "payonce" and args.journal is None:
        parser.error("--journal is required with --pattern payonce")

    batch = plan(args.total)[args.first : args.first + args.count]
    with closing(_Orders(args.orders_db)) as orders:
        if args.pattern == "payonce":
            with payonce.Client(
                base_url=args.url,
                provider="sandbox",
                account=DEFAULT_ACCOUNT,
                api_key=DEFAULT_API_KEY,
                journal=args.journal,
                retry=WORKER_RETRY,
                timeout=WORKER_TIMEOUT,
            ) as client:
                _work(batch, orders, _pay_with_payonce(client))
        else:
            headers = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
            with httpx.Client(base_url=args.url, headers=headers, timeout=WORKER_TIMEOUT) as http:
                _work(batch, orders, _pay_like_stripe_python(http))
    return 0


if __name__ == "__main__":
    sys.exit(main())
