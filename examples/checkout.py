"""A checkout that charges each order exactly once, against payonce's sandbox provider.

Run it with payonce and its sandbox installed (``pip install 'payonce[sandbox]'``):

    python examples/checkout.py

It starts a sandbox payment provider in this process, charges two orders, shows that
asking again for an order already charged replays the stored answer instead of charging
twice (also after a restart), and handles a declined card (``payonce.ProviderError``) and
an outcome that cannot be known (``payonce.OutcomeUnknown``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import httpx

import payonce
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxConfig, SandboxServer

# Short waits between retries so the example runs in a second; the defaults are gentler.
QUICK_RETRIES = payonce.RetryPolicy(max_attempts=3, initial_wait=0.05, max_wait=0.2)


def euros(cents: int) -> str:
    return f"{cents / 100:.2f} EUR"


def show(response: httpx.Response) -> str:
    """One line of what payonce knows about a response it returned."""
    info = payonce.response_info(response)
    assert info is not None, "every response payonce returns carries its ResponseInfo"
    return (
        f"HTTP {response.status_code}, key {info.key}, attempts={info.attempts}, "
        f"replayed={info.replayed}, provider_replayed={info.provider_replayed}"
    )


def charge(client: payonce.Client, order: str, amount: int) -> httpx.Response:
    """Charge one order. The order id is the intent's reference: same order, same key."""
    with client.intent(order) as op:
        return op.post("/v1/payments", json={"amount": amount, "currency": "eur"})


def make_client(server: SandboxServer, journal: Path) -> payonce.Client:
    return payonce.Client(
        base_url=server.url,
        provider="sandbox",
        account=DEFAULT_ACCOUNT,
        api_key=DEFAULT_API_KEY,
        # A real service keeps one journal for good (by default PAYONCE_JOURNAL, else the
        # user data directory). This example's sandbox is new on every run, so its journal
        # is too.
        journal=journal,
        retry=QUICK_RETRIES,
    )


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="payonce-checkout-") as scratch,
        SandboxServer(SandboxConfig()) as server,
    ):
        journal = Path(scratch) / "journal.db"
        print(f"sandbox payment provider listening on {server.url}")
        print(f"journal: {journal}")

        with make_client(server, journal) as client:
            # 1. A plain charge: journaled before it is sent, settled when answered.
            first = charge(client, "order-1001", 4200)
            payment_id = first.json()["id"]
            print(f"order-1001: charged {euros(4200)} as {payment_id} ({show(first)})")

            # 2. The provider charges the card, then fails to answer (HTTP 503). payonce
            #    retries under the same key and the provider replays its stored answer.
            server.script(["fail_after"])
            second = charge(client, "order-1002", 1999)
            print(
                f"order-1002: the provider charged it but answered 503; payonce retried under "
                f"the same key and got the original answer ({show(second)})"
            )

            # 3. Asking again for an order already charged does not charge it again.
            again = charge(client, "order-1001", 4200)
            info = payonce.response_info(again)
            assert info is not None
            print(
                f"order-1001 again: replayed={info.replayed}, from the journal with no network "
                f"call; same payment {again.json()['id']}"
            )

            # 4. A declined card is a definitive answer: payonce raises ProviderError, and
            #    journals the refusal so that asking again replays it rather than retrying.
            try:
                charge(client, "order-1003", 40200)
            except payonce.ProviderError as exc:
                error = exc.response.json()["error"]
                print(
                    f"order-1003: declined (ProviderError, HTTP {exc.status_code}, "
                    f"{error['code']}: {error['message']!r}). Ask the customer for another "
                    "card, then charge it under a new reference"
                )
            try:
                charge(client, "order-1003", 40200)
            except payonce.ProviderError as exc:
                refusal = payonce.response_info(exc.response)
                assert refusal is not None
                print(
                    f"order-1003 again: the same refusal, replayed={refusal.replayed} "
                    "(the card was not tried twice)"
                )

            # 5. The provider answers 503 to every attempt. payonce cannot tell whether the
            #    payment ran, so it stops, marks the intent unknown and never resends it
            #    blindly: reconcile it against the provider instead.
            server.script(["fail_before"] * QUICK_RETRIES.max_attempts)
            unknown_key = ""
            try:
                charge(client, "order-1004", 5000)
            except payonce.OutcomeUnknown as exc:
                unknown_key = exc.key or ""
                print(
                    f"order-1004: OutcomeUnknown after {QUICK_RETRIES.max_attempts} attempts "
                    f"({exc.reason}); key {exc.key} will not be resent blindly. Do not charge "
                    f"again: reconcile it (payonce reconcile {exc.key})"
                )
            try:
                charge(client, "order-1004", 5000)
            except payonce.OutcomeUnknown:
                print("order-1004 again: still OutcomeUnknown, and nothing was sent")

        # 6. A new client on the same journal, as after a restart: the order is still paid.
        with make_client(server, journal) as restarted:
            replay = charge(restarted, "order-1001", 4200)
            info = payonce.response_info(replay)
            assert info is not None
            print(f"after a restart, order-1001: replayed={info.replayed} ({replay.json()['id']})")

        executions = server.store.executions()
        print(
            f"the sandbox executed {sum(executions.values())} payments for 4 orders, "
            f"at most once per key: {max(executions.values()) == 1}"
        )
        print(
            f"(order-1004 was in fact executed {server.store.execution_count(unknown_key)} "
            "times: its 503s came before the charge. payonce could not know that; "
            "reconciliation asks the provider)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
