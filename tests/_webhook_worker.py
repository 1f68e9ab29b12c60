"""A webhook-receiving worker run as a real child process by tests/test_webhooks.py.

It opens a ``WebhookInbox`` on the shared journal, says it is ready (a file), waits for the
test's go signal (another file), then receives the same signed delivery ``--deliveries``
times at once from as many threads. Its handler appends one line per call to ``--out``
(O_APPEND: lines from many processes never interleave), so the test counts the calls of
every process together. ``--hang`` makes the handler write ``--started`` and then sleep
until the test SIGKILLs the process, leaving its claim behind.

The outcomes go to ``--report`` as JSON; a killed worker writes none.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from payonce.webhooks import Delivery, Event, WebhookInbox


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add = parser.add_argument
    add("--journal", required=True)
    add("--secret", required=True)
    add("--payload", type=Path, required=True, help="file holding the raw body")
    add("--signature", required=True, help="the Stripe-Signature header value")
    add("--out", type=Path, required=True)
    add("--deliveries", type=int, default=1)
    add("--hold", type=float, default=0.0, help="seconds the handler takes")
    add("--lease-seconds", type=float, default=60.0)
    add("--ready", type=Path, help="created once the inbox is open")
    add("--go", type=Path, help="wait for this file before receiving")
    add("--report", type=Path)
    add("--hang", action="store_true")
    add("--started", type=Path)
    return parser


def main() -> int:
    args = _parser().parse_args()
    payload = args.payload.read_bytes()
    headers = {"Stripe-Signature": args.signature}

    def handle(event: Event) -> None:
        line = f"{os.getpid()} {event.id}\n".encode()
        fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        if args.hang:
            assert args.started is not None
            args.started.write_text(str(os.getpid()))
            while True:
                time.sleep(1)
        time.sleep(args.hold)

    with WebhookInbox(args.journal, args.secret, lease_seconds=args.lease_seconds) as inbox:
        if args.ready is not None:
            args.ready.touch()
        while args.go is not None and not args.go.exists():
            time.sleep(0.001)
        start = threading.Barrier(args.deliveries)

        def deliver(_: int) -> Delivery:
            start.wait()
            return inbox.receive(payload, headers, handle)

        with ThreadPoolExecutor(max_workers=args.deliveries) as pool:
            deliveries = list(pool.map(deliver, range(args.deliveries)))
    if args.report is not None:
        outcomes = [delivery.outcome.value for delivery in deliveries]
        args.report.write_text(json.dumps({"pid": os.getpid(), "outcomes": outcomes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
