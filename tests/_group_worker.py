"""A payment worker with many threads on one Client, run as a real child process.

The crash tests' ``_worker.py`` pays its orders one after the other; this one pays them
from ``--threads`` threads at once, so the SQLite journal commits their writes in groups,
and a SIGKILL at a crash point (PAYONCE_CRASH_AT) lands in the middle of batches. The same
orders (references, bodies, provider profile) as ``_worker.py``, which finishes the job.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from concurrent.futures import ThreadPoolExecutor

import payonce
from _worker import _client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--orders", type=int, required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--attempts", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    args.broken, args.key_lifetime, args.clock_offset = None, 0.0, 0.0

    def pay(reference: str) -> None:
        # A failure is left for the next incarnation: the tests read the journal, not this.
        with contextlib.suppress(payonce.PayonceError):
            client.post(
                "/v1/payments",
                json={"amount": 1000, "currency": "eur", "reference": reference},
                reference=reference,
            )

    with _client(args) as client, ThreadPoolExecutor(max_workers=args.threads) as pool:
        list(pool.map(pay, [f"order-{n:04d}" for n in range(args.orders)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
