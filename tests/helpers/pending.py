"""Pending intents that were journaled and never sent, in bulk, for the worker to send.

On a PostgreSQL journal the outbox (``client.enqueue``) makes them; it refuses an SQLite
journal, so the SQLite tests write them as a process killed right after its write-ahead
leaves them: the intent and its first attempt journaled, nothing on the wire, the lease
free. The worker cannot tell them from a crashed caller's.
"""

from __future__ import annotations

import payonce
from payonce._owners import new_owner

from .payments import PAYMENT


def enqueue_pending(
    client: payonce.Client, n: int, *, prefix: str = "order", amount: int | None = None
) -> list[str]:
    """Journal ``n`` payments (references ``{prefix}-0``...) write-ahead without sending
    them; their keys, in order."""
    core = client._core
    body = PAYMENT if amount is None else {**PAYMENT, "amount": amount}
    keys: list[str] = []
    for number in range(n):
        operation = client.intent(f"{prefix}-{number}")
        draft = operation._draft("POST", "/v1/payments", {"json": body})
        owner = new_owner()
        claim = core.store.claim(
            draft, owner=owner, now=core.clock(), lease_seconds=core.lease_seconds
        )
        core.store.release(claim.record.key, owner=owner)  # as its owner's death would
        keys.append(claim.record.key)
    return keys
