"""What both clients meet: the same payments, a provider with the same seeded faults, the
same timeout and the same retry budget; and how the provider's counts are read."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

import payonce
from payonce.sandbox import Faults, SandboxServer

PAYMENTS_PATH = "/v1/payments"

CLIENT_TIMEOUT = 0.2
"""Shorter than the injected delay: a slow attempt times out at the client and still runs
at the provider, the classic lost success."""

DEMO_FAULTS = Faults(
    fail_before_rate=0.1,
    fail_after_rate=0.1,
    drop_after_rate=0.1,
    rate_limit_rate=0.02,
    retry_after_seconds=0.05,
    delay_rate=0.04,
    delay_seconds=0.4,
)

DEMO_RETRY = payonce.RetryPolicy(
    max_attempts=8, initial_wait=0.005, max_wait=0.05, max_retry_after=0.1
)
"""Enough attempts that almost every payment settles; waits kept tiny so the demo is quick."""


@attrs.frozen
class DemoPayment:
    reference: str
    body: Mapping[str, Any]


def plan(count: int) -> list[DemoPayment]:
    # Amounts vary so requests differ, and stay below anything the sandbox would decline.
    return [
        DemoPayment(
            reference=f"demo-order-{i:04d}",
            body={
                "amount": 1000 + (i % 250) * 100,
                "currency": "eur",
                "reference": f"demo-order-{i:04d}",
            },
        )
        for i in range(1, count + 1)
    ]


@attrs.frozen
class Executions:
    """What the provider executed, by key and by the payment's own reference (the naive
    client's executions carry a new key per attempt)."""

    by_key: Mapping[str, int]
    by_reference: Mapping[str | None, int]

    @property
    def total(self) -> int:
        return sum(self.by_key.values())

    @property
    def duplicates(self) -> int:
        """Executions beyond one per payment reference."""
        return sum(count - 1 for count in self.by_reference.values() if count > 1)

    @property
    def charged_twice(self) -> int:
        """Payments executed more than once."""
        return sum(count > 1 for count in self.by_reference.values())

    def missing(self, references: Iterable[str]) -> int:
        """Payments of ``references`` the provider never executed."""
        return sum(self.by_reference.get(reference, 0) == 0 for reference in references)


def count_executions(server: SandboxServer, faults: Faults) -> Executions:
    """What the provider executed, once the attempts the clients gave up on have landed."""
    _quiesce(server, faults)
    payments = server.store.payments()
    return Executions(server.store.executions(), Counter(p["reference"] for p in payments))


def _quiesce(server: SandboxServer, faults: Faults) -> None:
    # A delayed request executes after its client timed out; counting before it lands would
    # miss exactly the executions this demo is about.
    if faults.delay_rate <= 0 or faults.delay_seconds <= 0:
        return
    time.sleep(faults.delay_seconds)
    seen = -1
    while (total := server.store.total_executions()) != seen:
        seen = total
        time.sleep(0.1)
