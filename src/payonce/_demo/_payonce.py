"""The payments through payonce, twice, and what the journal and the provider say about them."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

import payonce
from payonce._demo._report import progress
from payonce._demo._results import PayonceStats
from payonce._demo._scenario import (
    CLIENT_TIMEOUT,
    DEMO_RETRY,
    PAYMENTS_PATH,
    DemoPayment,
    Executions,
    count_executions,
)
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, Faults, SandboxConfig, SandboxServer

_SETTLED = (payonce.IntentState.SUCCEEDED, payonce.IntentState.FAILED)


def run_payonce(
    plan: Sequence[DemoPayment],
    faults: Faults,
    journal: Path,
    console: Console,
    client_timeout: float = CLIENT_TIMEOUT,
) -> PayonceStats:
    retries: list[payonce.records.RetryEvent] = []
    provider_replays = journal_replays = 0
    started = time.monotonic()
    with ExitStack() as stack:
        server = stack.enter_context(SandboxServer(SandboxConfig(faults=faults)))
        client = stack.enter_context(
            payonce.Client(
                base_url=server.url,
                provider="sandbox",
                account=DEFAULT_ACCOUNT,
                api_key=DEFAULT_API_KEY,
                journal=journal,
                retry=DEMO_RETRY,
                timeout=client_timeout,
                on_retry=retries.append,
            )
        )
        with progress(console, "payonce", len(plan)) as bar:
            for payment in plan:
                info = _pay(client, payment)
                provider_replays += bool(info and info.provider_replayed)
                bar.advance()
        # The same payments again, as a restarted caller would send them: settled ones
        # are answered from the journal and never reach the provider.
        with progress(console, "payonce, sent again", len(plan)) as bar:
            for payment in plan:
                info = _pay(client, payment)
                journal_replays += bool(info and info.replayed)
                bar.advance()
        return _payonce_stats(
            client.journal.list_intents(),
            count_executions(server, faults),
            [payment.reference for payment in plan],
            retries=len(retries),
            provider_replays=provider_replays,
            journal_replays=journal_replays,
            seconds=time.monotonic() - started,
        )


def _pay(client: payonce.Client, payment: DemoPayment) -> payonce.records.ResponseInfo | None:
    try:
        response = client.post(PAYMENTS_PATH, json=payment.body, reference=payment.reference)
    except payonce.ProviderError as exc:
        return payonce.response_info(exc.response)
    except payonce.IntentError:
        # Unknown or never delivered: the journal says which, and the report counts it.
        return None
    return payonce.response_info(response)


def _payonce_stats(
    records: Sequence[payonce.IntentRecord],
    executions: Executions,
    references: Sequence[str],
    *,
    retries: int,
    provider_replays: int,
    journal_replays: int,
    seconds: float,
) -> PayonceStats:
    states = Counter(record.state for record in records)
    problems: list[str] = []
    executions_of_settled = unknown_executed = 0
    for record in records:
        count = executions.by_key.get(record.key, 0)
        name = f"{record.reference} ({record.key}, {record.state.value})"
        if record.state in _SETTLED:
            executions_of_settled += count
            if count != 1:
                problems.append(f"{name} executed {count} times, not once")
        elif record.state is payonce.IntentState.UNKNOWN:
            unknown_executed += count > 0
            if count > 1:
                problems.append(f"{name} executed {count} times")
        elif count:
            problems.append(f"{name} executed {count} times, yet never reached the provider")
    journaled = {record.key for record in records}
    strangers = sum(count for key, count in executions.by_key.items() if key not in journaled)
    if strangers:
        problems.append(f"{strangers} execution(s) under keys the journal does not know")
    if executions.duplicates:
        problems.append(f"{executions.duplicates} duplicate execution(s) by payment reference")
    return PayonceStats(
        intents=len(records),
        attempts=sum(record.attempt_count for record in records),
        retries=retries,
        provider_replays=provider_replays,
        journal_replays=journal_replays,
        succeeded=states[payonce.IntentState.SUCCEEDED],
        failed=states[payonce.IntentState.FAILED],
        unknown=states[payonce.IntentState.UNKNOWN],
        pending=states[payonce.IntentState.PENDING],
        executions=executions.total,
        executions_of_settled=executions_of_settled,
        unknown_executed=unknown_executed,
        duplicates=executions.duplicates,
        charged_twice=executions.charged_twice,
        missing=executions.missing(references),
        problems=tuple(problems),
        seconds=seconds,
    )
