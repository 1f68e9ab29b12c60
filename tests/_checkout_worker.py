"""A shop's two-step checkout worker, run as a real child process by tests/test_transport_kills.py.

Written against plain httpx, as a shop writes it: for each order, create a PaymentIntent,
then confirm it. ``--with-payonce`` adds what payonce asks of such code: one line (the
transport) and one block per order. Without it the code does what stripe-python does: a
fresh uuid4 idempotency key per call, kept in memory only.

The tests kill it with SIGKILL (PAYONCE_CRASH_AT, or ``--die-between-steps``) and run it
again; each order's final answer is printed as one JSON line, which the tests compare with
the sandbox's store.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import uuid

import httpx

import payonce
from payonce._crash import crash_trace
from payonce.sandbox import DEFAULT_API_KEY

ORDER = {"amount": "4200", "currency": "eur", "payment_method": "pm_card_visa"}


def checkout(http: httpx.Client, order: str, *, die_between_steps: bool) -> dict[str, str]:
    # The crash harness's trace hook marks when a request's last byte is out (after_send);
    # payonce's own attempts carry it already.
    trace = {"trace": crash_trace}
    created = http.post(
        "/v1/payment_intents",
        data={**ORDER, "metadata[order]": order},
        headers={"Idempotency-Key": str(uuid.uuid4())},
        extensions=trace,
    )
    created.raise_for_status()
    if die_between_steps:
        os.kill(os.getpid(), signal.SIGKILL)
    confirmed = http.post(
        f"/v1/payment_intents/{created.json()['id']}/confirm",
        headers={"Idempotency-Key": str(uuid.uuid4())},
        extensions=trace,
    )
    confirmed.raise_for_status()
    return {"order": order, "id": confirmed.json()["id"], "status": confirmed.json()["status"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal")
    parser.add_argument("--orders", type=int, default=2)
    parser.add_argument("--with-payonce", action="store_true")
    parser.add_argument("--die-between-steps", action="store_true")
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
    if not args.with_payonce:
        with httpx.Client(base_url=args.url, headers=headers) as http:
            for n in range(args.orders):
                order = f"order-{n}"
                print(json.dumps(checkout(http, order, die_between_steps=args.die_between_steps)))
        return

    client = payonce.Client(
        base_url=args.url,
        provider="stripe",
        account="acct_shop",
        journal=args.journal,
        retry=payonce.RetryPolicy(max_attempts=5, initial_wait=0.001, max_wait=0.02),
        transport_only=True,
    )
    # The one line: the SDK's (here httpx's) own keys are disposable, the steps' are not.
    transport = client.transport(sdk_keys="replace")
    with client, httpx.Client(base_url=args.url, headers=headers, transport=transport) as http:
        for n in range(args.orders):
            order = f"order-{n}"
            with client.intent(order):  # the one block
                paid = checkout(http, order, die_between_steps=args.die_between_steps)
            print(json.dumps(paid))


if __name__ == "__main__":
    main()
