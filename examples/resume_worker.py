"""Finish the payments that crashed processes left behind; run it beside your service.

A process killed between journaling a payment and learning its outcome leaves the intent
``pending`` in the journal; one whose retries could not tell what the provider did leaves
it ``unknown``. This worker drives both to an end, in one pass:

1. ``client.resume()``: resend every pending intent no live worker holds, under its own
   key, so the provider executes it at most once (or replays what it already did);
2. ``client.reconcile_all()``: ask the provider's status endpoint about every unknown
   intent; the ones it has no record of (while their key is still valid) become pending;
3. ``client.resume()`` again, for those.

To deploy, prefer ``payonce worker`` (or ``payonce.worker.Worker`` in a process of your
own): the same recovery, continuously, for every account and provider of the journal,
several intents at once, unknown intents looked up on the provider's schedule and
escalated when it is spent, SIGTERM draining it. This example stays as the recovery
written with the ``Client`` API, step by step.

Run it with the service's settings (the same variables as ``payonce resume``)::

    export PAYONCE_BASE_URL=http://127.0.0.1:8765 PAYONCE_API_KEY=sk_test_payonce
    export PAYONCE_JOURNAL=$PWD/journal.db
    python examples/resume_worker.py --once      # one pass: a deploy hook, a cron job
    python examples/resume_worker.py             # one pass now, then every --interval s

``PAYONCE_PROVIDER`` (default ``sandbox``) and ``PAYONCE_ACCOUNT`` (default
``acct_demo``) pick the profile and the account.

Exit status of ``--once``, as for the ``payonce`` command: 0 when nothing is left to do,
1 when an intent is still pending (the provider could not be reached: run it again later,
it is safe) or unknown (it needs ``payonce reconcile`` later, or an operator), 2 when the
configuration or the journal needs fixing.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

import payonce

logger = logging.getLogger("resume_worker")

_UNSETTLED = (payonce.IntentState.PENDING, payonce.IntentState.UNKNOWN)


class SetupError(Exception):
    """The configuration or the journal needs fixing: exit status 2."""


def make_client() -> payonce.Client:
    base_url = os.environ.get("PAYONCE_BASE_URL")
    if not base_url:
        raise SetupError("set PAYONCE_BASE_URL to the payment provider's API root")
    journal = os.environ.get("PAYONCE_JOURNAL", "")
    if not journal.startswith(("postgresql://", "postgres://")):
        # A worker pointed at the wrong path would find an empty new journal and report
        # that all is well: only ever resume from a journal that exists.
        path = payonce.journal.default_journal_path()
        if not path.exists():
            raise SetupError(f"no journal at {path}: set PAYONCE_JOURNAL to the service's")
    try:
        return payonce.Client(
            base_url=base_url,
            provider=os.environ.get("PAYONCE_PROVIDER", "sandbox"),
            account=os.environ.get("PAYONCE_ACCOUNT", "acct_demo"),
        )
    except (payonce.ConfigurationError, payonce.JournalError) as exc:
        raise SetupError(str(exc)) from exc


def run_pass(client: payonce.Client) -> bool:
    """One pass of resume, reconcile, resume. True when nothing is left to do."""
    # What became of each intent this pass touched: its latest state, and how it got there.
    touched: dict[str, tuple[str | None, payonce.IntentState, str]] = {}

    def note(key: str, reference: str | None, state: payonce.IntentState, detail: str) -> None:
        if key in touched:
            detail = f"{touched[key][2]} -> {detail}"
        touched[key] = (reference, state, detail)

    for result in client.resume():
        note(result.key, result.reference, result.state, result.detail)
    if client.provider.lookup is not None:
        for reconciled in client.reconcile_all():
            detail = f"reconciled: {reconciled.outcome}"
            note(reconciled.key, reconciled.reference, reconciled.after, detail)
        for result in client.resume():
            note(result.key, result.reference, result.state, result.detail)

    for key, (reference, state, detail) in touched.items():
        print(f"{reference or '-':<20} {key}  {state:<9}  {detail}")

    # What still needs someone, touched or not: a pending intent a live worker is sending
    # right now is fine; one nobody holds, or an unknown one, is not.
    now = time.time()
    left = [
        record
        for record in client.journal.list_intents(states=_UNSETTLED)
        if record.account == client.account and not record.lease_live(now)
    ]
    states = collections.Counter(str(state) for _, state, _ in touched.values())
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "nothing to do"
    unacknowledged = len(client.unacknowledged())
    print(
        f"pass over {len(touched)} intent(s): {counts}; "
        f"{sum(r.state is payonce.IntentState.PENDING for r in left)} still pending, "
        f"{sum(r.state is payonce.IntentState.UNKNOWN for r in left)} still unknown; "
        f"{unacknowledged} settled outcome(s) not acknowledged yet",
        flush=True,
    )
    if client.provider.lookup is None and any(r.state is payonce.IntentState.UNKNOWN for r in left):
        print(
            f"profile {client.provider.name!r} has no status look-up: check the unknown "
            "intents at the provider, then `payonce abandon` them",
            flush=True,
        )
    return not left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.add_argument(
        "--interval", type=float, default=60.0, help="seconds between passes (default 60)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # payonce logs each intent already

    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        with make_client() as client:
            done = run_pass(client)
            if args.once:
                return 0 if done else 1
            while not stop.wait(args.interval):
                try:
                    run_pass(client)
                except payonce.JournalError as exc:
                    # A busy or briefly unreachable journal: the next pass tries again.
                    logger.warning("pass failed: %s", exc)
            return 0
    except (SetupError, payonce.ConfigurationError, payonce.JournalError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
