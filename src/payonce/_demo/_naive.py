"""The same payments through a naive client: it retries too, but with a fresh key each time."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import httpx
from rich.console import Console

from payonce._demo._report import progress
from payonce._demo._results import NaiveStats
from payonce._demo._scenario import (
    CLIENT_TIMEOUT,
    DEMO_RETRY,
    PAYMENTS_PATH,
    DemoPayment,
    count_executions,
)
from payonce.sandbox import DEFAULT_API_KEY, Faults, SandboxConfig, SandboxServer


def run_naive(
    plan: Sequence[DemoPayment],
    faults: Faults,
    console: Console,
    client_timeout: float = CLIENT_TIMEOUT,
) -> NaiveStats:
    attempts = answered = 0
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
    with (
        SandboxServer(SandboxConfig(faults=faults)) as server,
        httpx.Client(base_url=server.url, headers=headers, timeout=client_timeout) as http,
    ):
        with progress(console, "naive client", len(plan)) as bar:
            for payment in plan:
                tries, done = _naive_pay(http, payment)
                attempts += tries
                answered += done
                bar.advance()
        executions = count_executions(server, faults)
    return NaiveStats(
        attempts=attempts,
        retries=attempts - len(plan),
        answered=answered,
        gave_up=len(plan) - answered,
        executions=executions.total,
        duplicates=executions.duplicates,
        charged_twice=executions.charged_twice,
        missing=executions.missing(payment.reference for payment in plan),
        seconds=time.monotonic() - started,
    )


def _naive_pay(http: httpx.Client, payment: DemoPayment) -> tuple[int, bool]:
    """Retry like much real code does: same backoff, but a new key for every attempt."""
    for attempt in range(1, DEMO_RETRY.max_attempts + 1):
        try:
            response = http.post(
                PAYMENTS_PATH,
                json=dict(payment.body),
                headers={"Idempotency-Key": str(uuid.uuid4())},
            )
        except httpx.TransportError:
            pass
        else:
            if response.status_code < 500 and response.status_code not in (409, 429):
                return attempt, True
        if attempt < DEMO_RETRY.max_attempts:
            time.sleep(DEMO_RETRY.backoff(attempt))
    return DEMO_RETRY.max_attempts, False
