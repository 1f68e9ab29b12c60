"""A paying service run as a child process by the failover test: it pays order after order
through payonce on a PostgreSQL journal given as a multi-host URL, until told to stop, and
writes down what it saw (a JSON line each):

- ``journaled``: an attempt of the order's intent was journaled and is about to be sent
  (the ``attempt_started`` hook): its write-ahead was committed, as the caller was told;
- ``answered``: the caller got the provider's answer;
- ``error``: the caller got a payonce error instead (its type, words, and whether it says
  the request may have reached the provider).

With ``--async-callers N`` it pays from N callers at once on one ``AsyncClient``.

Its payonce log goes to a file, as a service's does; its stderr must stay empty: nothing
of libpq's or psycopg's may reach it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

import payonce
from payonce.journal import PostgresJournal
from payonce.sandbox import DEFAULT_API_KEY

PAYMENT = {"amount": 4200, "currency": "eur"}


class _Journaled(payonce.Hooks):
    def __init__(self, write: Any) -> None:
        self._write = write

    def attempt_started(self, event: Any) -> None:
        self._write({"event": "journaled", "ref": event.reference, "key": event.key})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--synchronous-settles", action="store_true")
    parser.add_argument("--async-callers", type=int, default=0)
    args = parser.parse_args()

    handler = logging.FileHandler(args.log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log = logging.getLogger("payonce")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False

    with Path(args.report).open("a", buffering=1) as report:
        _pay_until_stopped(args, report)
    return 0


def _pay_until_stopped(args: argparse.Namespace, report: Any) -> None:
    lock = threading.Lock()  # AsyncClient may tell its hooks from a journal thread (SQLite)

    def write(line: dict[str, Any]) -> None:
        with lock:
            report.write(json.dumps(line) + "\n")

    def told(reference: str, outcome: httpx.Response | payonce.PayonceError) -> None:
        if isinstance(outcome, payonce.PayonceError):
            write(
                {
                    "event": "error",
                    "ref": reference,
                    "type": type(outcome).__name__,
                    "message": str(outcome),
                    "may_have_executed": getattr(outcome, "may_have_executed", None),
                }
            )
        else:
            write({"event": "answered", "ref": reference, "status": outcome.status_code})

    stop = Path(args.stop)
    journal = PostgresJournal(args.journal, synchronous_settles=args.synchronous_settles)
    options: dict[str, Any] = {
        "base_url": args.url,
        "provider": "sandbox",
        "account": "acct_demo",
        "api_key": DEFAULT_API_KEY,
        "journal": journal,
        "retry": payonce.RetryPolicy(max_attempts=3, initial_wait=0.01, max_wait=0.05),
        "timeout": 5.0,
        "hooks": _Journaled(write),
    }
    with journal:
        if args.async_callers:
            asyncio.run(_pay_async(args, options, stop, told))
            return
        with payonce.Client(**options) as client:
            number = 0
            while not stop.exists():
                reference = f"{args.prefix}-{number:05d}"
                number += 1
                try:
                    told(reference, client.post("/v1/payments", json=PAYMENT, reference=reference))
                except payonce.PayonceError as exc:
                    told(reference, exc)
                time.sleep(0.05)  # a paying service, not a benchmark: the machine is shared


async def _pay_async(
    args: argparse.Namespace,
    options: dict[str, Any],
    stop: Path,
    told: Callable[[str, httpx.Response | payonce.PayonceError], None],
) -> None:
    """``async_callers`` callers paying at once on one AsyncClient."""
    async with payonce.AsyncClient(**options) as client:

        async def caller(number: int) -> None:
            order = 0
            while not stop.exists():
                reference = f"{args.prefix}c{number}-{order:05d}"
                order += 1
                try:
                    response = await client.post("/v1/payments", json=PAYMENT, reference=reference)
                except payonce.PayonceError as exc:
                    told(reference, exc)
                else:
                    told(reference, response)
                await asyncio.sleep(0.05)

        await asyncio.gather(*(caller(n) for n in range(args.async_callers)))


if __name__ == "__main__":
    raise SystemExit(main())
