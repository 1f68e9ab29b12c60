"""What verify-before-resend costs, and what it saves, against a server that executes a
duplicate arriving while the first request still runs (the sandbox's ``racy`` mode).

Each payment's handler takes ``--processing`` seconds; some answers are lost after the
payment ran (``--drop``) and some requests time out while the handler still runs
(``--slow``, the handler then outlives the client's timeout). The same payments go through
payonce twice, interleaved by round: resending at once under the same key, and verifying
with the status look-up first. Printed per mode: median seconds per payment, payments
executed more than once, and the ratio of the two times.

    PYTHONPATH=src .venv/bin/python bench/verify.py              # 60 payments x 3 rounds
    PYTHONPATH=src .venv/bin/python bench/verify.py --quick      # 40 payments x 1 round
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import payonce
from payonce.sandbox import DEFAULT_API_KEY, Faults, SandboxConfig, SandboxServer

LOOKUP = payonce.providers.Lookup(path="/v1/payments")
MODES = {
    "same-key": payonce.ProviderProfile(name="bench-same-key", lookup=LOOKUP, resend="same-key"),
    "verify": payonce.ProviderProfile(name="bench-verify", lookup=LOOKUP, max_processing=1.0),
}


def run(mode: str, server: SandboxServer, payments: int, round_: int) -> tuple[float, int]:
    """Seconds per payment, and how many payments executed more than once."""
    with (
        tempfile.TemporaryDirectory() as directory,
        payonce.Client(
            base_url=server.url,
            provider=MODES[mode],
            account="acct_demo",
            api_key=DEFAULT_API_KEY,
            journal=Path(directory) / "journal.db",
            timeout=0.25,
            retry=payonce.RetryPolicy(
                max_attempts=8, initial_wait=0.02, max_wait=0.2, max_elapsed=30
            ),
        ) as client,
    ):
        keys = []
        began = time.perf_counter()
        for n in range(payments):
            reference = f"{mode}-{round_}-{n}"
            try:
                paid = client.post(
                    "/v1/payments",
                    json={"amount": 1000 + n, "currency": "eur"},
                    reference=reference,
                )
                info = payonce.response_info(paid)
                keys.append(info.key if info else "")
            except payonce.PayonceError as exc:
                keys.append(getattr(exc, "key", "") or "")
        elapsed = time.perf_counter() - began
    server.wait_idle(60)
    counts = server.store.executions()
    return elapsed / payments, sum(1 for key in keys if counts.get(key, 0) > 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payments", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processing", type=float, default=0.3, help="longer than the timeout")
    parser.add_argument("--drop", type=float, default=0.05, help="share of answers lost")
    parser.add_argument("--slow", type=float, default=0.05, help="share of slow handlers")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.payments, args.rounds = 40, 1
    faults = Faults(seed=7, drop_after_rate=args.drop, delay_rate=args.slow, delay_seconds=0.6)
    config = SandboxConfig(processing_seconds=args.processing, idempotency="racy", faults=faults)
    timings: dict[str, list[float]] = {mode: [] for mode in MODES}
    doubles: dict[str, int] = dict.fromkeys(MODES, 0)
    with SandboxServer(config) as server:
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                per_payment, doubled = run(mode, server, args.payments, round_)
                timings[mode].append(per_payment)
                doubles[mode] += doubled
    print(
        f"{args.payments} payments x {args.rounds} rounds, racy server, handler "
        f"{args.processing}s, lost answers {args.drop:.0%}, slow handlers {args.slow:.0%}"
    )
    print(f"{'mode':10} {'s/payment':>10} {'executed twice':>15}")
    for mode in MODES:
        print(f"{mode:10} {statistics.median(timings[mode]):10.4f} {doubles[mode]:15d}")
    ratio = statistics.median(timings["verify"]) / statistics.median(timings["same-key"])
    print(f"verify / same-key time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
