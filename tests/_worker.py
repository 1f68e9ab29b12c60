"""A payment worker run as a real child process by the crash and concurrency tests.

It behaves like a calling service: it (re)issues its orders through payonce, one intent per
order reference, and on start it first resumes and reconciles what an earlier incarnation
left behind. The tests kill it with SIGKILL at a named crash point (PAYONCE_CRASH_AT) and
start it again. Its stdout is never trusted (lost on SIGKILL): the tests read the sandbox's
store and the journal instead.

``--broken`` runs deliberately wrong clients, to prove the harness catches them:
- ``fresh-key``: keys live only in memory (a new journal per process), as in SDKs that
  generate the key per call;
- ``no-reconcile``: resume resends unknown intents blindly instead of reconciling.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import time
from pathlib import Path

import payonce
from payonce.sandbox import DEFAULT_API_KEY


def _client(args: argparse.Namespace) -> payonce.Client:
    journal = Path(args.journal)
    if args.broken == "fresh-key":
        journal = journal.with_name(f"{journal.stem}-{os.getpid()}.db")
    profile = payonce.ProviderProfile(
        name="sandbox-short" if args.key_lifetime else "sandbox",
        key_lifetime=args.key_lifetime or 24 * 3600.0,
        lookup=payonce.providers.Lookup(path="/v1/payments"),
        # The sandbox guards a duplicate in flight (409): resends go out at once, so the
        # harness sees what a client that resends blindly would do.
        resend="same-key",
    )
    offset = args.clock_offset
    return payonce.Client(
        base_url=args.url,
        provider=profile,
        account="acct_demo",
        api_key=DEFAULT_API_KEY,
        journal=journal,
        retry=payonce.RetryPolicy(max_attempts=args.attempts, initial_wait=0.001, max_wait=0.02),
        timeout=args.timeout,
        clock=lambda: time.time() + offset,
    )


def _resend_unknown_blindly(journal: Path) -> None:
    """The injected bug: put unknown intents back to pending without asking the provider."""
    with sqlite3.connect(journal) as conn:
        conn.execute("UPDATE intents SET state = 'pending' WHERE state = 'unknown'")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--orders", type=int, required=True)
    parser.add_argument("--prefix", default="order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attempts", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--key-lifetime", type=float, default=0.0)
    parser.add_argument("--clock-offset", type=float, default=0.0)
    parser.add_argument("--report")
    parser.add_argument("--broken", choices=["fresh-key", "no-reconcile"])
    args = parser.parse_args()

    errors: dict[str, int] = {}
    orders = [f"{args.prefix}-{n:04d}" for n in range(args.orders)]
    random.Random(args.seed).shuffle(orders)
    with _client(args) as client:
        client.resume()
        if args.broken == "no-reconcile":
            _resend_unknown_blindly(Path(args.journal))
        else:
            client.reconcile_all()
        client.resume()
        for reference in orders:
            try:
                client.post(
                    "/v1/payments",
                    json={"amount": 1000, "currency": "eur", "reference": reference},
                    reference=reference,
                )
            except payonce.PayonceError as exc:
                name = type(exc).__name__
                if "locked" in str(exc):
                    name += ":locked"
                errors[name] = errors.get(name, 0) + 1
    if args.report:
        Path(args.report).write_text(json.dumps({"errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
