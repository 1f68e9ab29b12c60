"""``python -m payonce.sandbox``: run a sandbox provider in the foreground."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from payonce.sandbox._app import SandboxConfig
from payonce.sandbox._faults import Faults
from payonce.sandbox._server import serve
from payonce.sandbox._webhooks import WebhookConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m payonce.sandbox",
        description="Run the payonce sandbox payment provider until SIGINT/SIGTERM.",
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8765, help="0 picks a free port")
    add("--store", metavar="PATH", help="SQLite file to keep state in (default: a temporary one)")
    add("--key-lifetime", type=float, default=24 * 3600.0, metavar="SECONDS")
    add("--processing", type=float, default=0.0, metavar="SECONDS", help="work per payment")
    add("--seed", type=int, default=0, help="seed of the random faults")
    add("--fail-before", type=float, default=0.0, metavar="RATE")
    add("--fail-after", type=float, default=0.0, metavar="RATE")
    add("--drop-after", type=float, default=0.0, metavar="RATE")
    add("--rate-limit", type=float, default=0.0, metavar="RATE")
    add("--delay-rate", type=float, default=0.0, metavar="RATE")
    add("--delay", type=float, default=0.0, metavar="SECONDS")
    add("--ready-file", type=Path, metavar="PATH", help="write the base URL here once listening")
    add("--webhook-url", metavar="URL", help="deliver a signed event per settled payment here")
    add(
        "--webhook-secret",
        action="append",
        default=[],
        metavar="SECRET",
        help="signing secret (repeat it to sign with two during a rotation)",
    )
    add("--webhook-redeliver-rate", type=float, default=0.0, metavar="RATE")
    return parser


def _write_atomically(path: Path, text: str) -> None:
    # A watcher polling for the file must never read it half-written.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        webhooks = None
        if args.webhook_url:
            if not args.webhook_secret:
                parser.error("--webhook-url needs at least one --webhook-secret")
            webhooks = WebhookConfig(
                url=args.webhook_url,
                secrets=args.webhook_secret,
                redeliver_rate=args.webhook_redeliver_rate,
                seed=args.seed,
            )
        config = SandboxConfig(
            key_lifetime=args.key_lifetime,
            processing_seconds=args.processing,
            faults=Faults(
                seed=args.seed,
                fail_before_rate=args.fail_before,
                fail_after_rate=args.fail_after,
                drop_after_rate=args.drop_after,
                rate_limit_rate=args.rate_limit,
                delay_rate=args.delay_rate,
                delay_seconds=args.delay,
            ),
            store_path=args.store,
            webhooks=webhooks,
        )
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ready_file: Path | None = args.ready_file

    def ready(url: str) -> None:
        print(f"payonce sandbox listening on {url}", flush=True)
        if ready_file is not None:
            _write_atomically(ready_file, url)

    serve(config, args.host, args.port, ready=ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
