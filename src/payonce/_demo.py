"""``payonce demo``: the same faulty network, with payonce and with a naive client.

Both send the same payments to a fresh sandbox provider with the same seeded faults. payonce
retries under one key per payment; the naive client retries with a fresh key per attempt,
as code that "adds an idempotency key" per request does. The provider counts executions, so
the difference is measured, not claimed.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

import payonce
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, Faults, SandboxConfig, SandboxServer

__all__ = [
    "CLIENT_TIMEOUT",
    "DEMO_FAULTS",
    "DEMO_RETRY",
    "DemoResult",
    "NaiveStats",
    "PayonceStats",
    "run_demo",
]

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

_SETTLED = (payonce.IntentState.SUCCEEDED, payonce.IntentState.FAILED)


@attrs.frozen
class PayonceStats:
    intents: int
    attempts: int
    """HTTP attempts, as journaled."""
    retries: int
    provider_replays: int
    """Answers the provider replayed for a key it had already executed."""
    journal_replays: int
    """Payments answered from the journal, without the network, when sent a second time."""
    succeeded: int
    failed: int
    unknown: int
    pending: int
    executions: int
    """Executions the provider counted, in total."""
    executions_of_settled: int
    unknown_executed: int
    """Intents left unknown that the provider did execute (at most once each)."""
    duplicates: int
    """Executions beyond one per payment reference: must be zero."""
    charged_twice: int
    """Payments executed more than once: must be zero."""
    problems: tuple[str, ...]
    """Every broken promise found, one line each: must be empty."""
    seconds: float

    @property
    def settled(self) -> int:
        return self.succeeded + self.failed


@attrs.frozen
class NaiveStats:
    attempts: int
    retries: int
    answered: int
    """Payments that got a definitive answer (2xx or 4xx) in the end."""
    gave_up: int
    executions: int
    duplicates: int
    """Executions beyond one per payment reference."""
    charged_twice: int
    """Payments executed more than once."""
    seconds: float


@attrs.frozen
class DemoResult:
    payments: int
    seed: int
    faults: Faults
    journal: Path | None
    """Where the payonce journal was kept; None when it was temporary and is gone."""
    payonce: PayonceStats
    naive: NaiveStats

    @property
    def ok(self) -> bool:
        """True when payonce executed no payment twice and every count adds up."""
        return self.payonce.duplicates == 0 and not self.payonce.problems


@attrs.frozen
class _Payment:
    reference: str
    body: Mapping[str, Any]


def _plan(count: int) -> list[_Payment]:
    # Amounts vary so requests differ, and stay below anything the sandbox would decline.
    return [
        _Payment(
            reference=f"demo-order-{i:04d}",
            body={
                "amount": 1000 + (i % 250) * 100,
                "currency": "eur",
                "reference": f"demo-order-{i:04d}",
            },
        )
        for i in range(1, count + 1)
    ]


def run_demo(
    payments: int,
    seed: int,
    journal: Path | None,
    console: Console,
    *,
    faults: Faults | None = None,
) -> DemoResult:
    """Run the demo and print its report on ``console``.

    ``faults`` replaces the default fault mix; its seed is always replaced by ``seed``, so
    both clients meet the same faults. ``journal`` must not exist yet: the demo's counts
    only make sense on a fresh journal.
    """
    if payments < 1:
        raise payonce.ConfigurationError("the demo needs at least one payment")
    if journal is not None and journal.exists():
        raise payonce.ConfigurationError(
            f"{journal} already exists; the demo writes a fresh journal: choose a new path"
        )
    faults = attrs.evolve(faults or DEMO_FAULTS, seed=seed)
    plan = _plan(payments)
    _print_intro(console, payments, faults)
    with ExitStack() as stack:
        if journal is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="payonce-demo-"))
            journal_path = Path(directory) / "journal.db"
        else:
            journal_path = journal
        payonce_stats = _run_payonce(plan, faults, journal_path, console)
    naive_stats = _run_naive(plan, faults, console)
    result = DemoResult(
        payments=payments,
        seed=seed,
        faults=faults,
        journal=journal,
        payonce=payonce_stats,
        naive=naive_stats,
    )
    _print_report(console, result)
    return result


# -- payonce ----------------------------------------------------------------------------------


def _run_payonce(
    plan: Sequence[_Payment], faults: Faults, journal: Path, console: Console
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
                timeout=CLIENT_TIMEOUT,
                on_retry=retries.append,
            )
        )
        with _progress(console, "payonce", len(plan)) as advance:
            for payment in plan:
                info = _pay(client, payment)
                provider_replays += bool(info and info.provider_replayed)
                advance()
        # The same payments again, as a restarted caller would send them: settled ones
        # are answered from the journal and never reach the provider.
        with _progress(console, "payonce, sent again", len(plan)) as advance:
            for payment in plan:
                info = _pay(client, payment)
                journal_replays += bool(info and info.replayed)
                advance()
        _quiesce(server, faults)
        return _payonce_stats(
            client.journal.list_intents(),
            executions=server.store.executions(),
            by_reference=_executions_by_reference(server),
            retries=len(retries),
            provider_replays=provider_replays,
            journal_replays=journal_replays,
            seconds=time.monotonic() - started,
        )


def _pay(client: payonce.Client, payment: _Payment) -> payonce.records.ResponseInfo | None:
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
    *,
    executions: Mapping[str, int],
    by_reference: Mapping[str | None, int],
    retries: int,
    provider_replays: int,
    journal_replays: int,
    seconds: float,
) -> PayonceStats:
    states = Counter(record.state for record in records)
    problems: list[str] = []
    executions_of_settled = unknown_executed = 0
    for record in records:
        count = executions.get(record.key, 0)
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
    strangers = sum(count for key, count in executions.items() if key not in journaled)
    if strangers:
        problems.append(f"{strangers} execution(s) under keys the journal does not know")
    duplicates = sum(count - 1 for count in by_reference.values() if count > 1)
    if duplicates:
        problems.append(f"{duplicates} duplicate execution(s) by payment reference")
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
        executions=sum(executions.values()),
        executions_of_settled=executions_of_settled,
        unknown_executed=unknown_executed,
        duplicates=duplicates,
        charged_twice=sum(count > 1 for count in by_reference.values()),
        problems=tuple(problems),
        seconds=seconds,
    )


# -- the naive client -------------------------------------------------------------------------


def _run_naive(plan: Sequence[_Payment], faults: Faults, console: Console) -> NaiveStats:
    attempts = answered = 0
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
    with (
        SandboxServer(SandboxConfig(faults=faults)) as server,
        httpx.Client(base_url=server.url, headers=headers, timeout=CLIENT_TIMEOUT) as http,
    ):
        with _progress(console, "naive client", len(plan)) as advance:
            for payment in plan:
                tries, done = _naive_pay(http, payment)
                attempts += tries
                answered += done
                advance()
        _quiesce(server, faults)
        by_reference = _executions_by_reference(server)
        executions = server.store.total_executions()
    return NaiveStats(
        attempts=attempts,
        retries=attempts - len(plan),
        answered=answered,
        gave_up=len(plan) - answered,
        executions=executions,
        duplicates=sum(count - 1 for count in by_reference.values() if count > 1),
        charged_twice=sum(count > 1 for count in by_reference.values()),
        seconds=time.monotonic() - started,
    )


def _naive_pay(http: httpx.Client, payment: _Payment) -> tuple[int, bool]:
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


# -- shared -----------------------------------------------------------------------------------


def _executions_by_reference(server: SandboxServer) -> Counter[str | None]:
    # By the payment's own reference: the naive client's executions carry a new key per attempt.
    return Counter(payment["reference"] for payment in server.store.payments())


def _quiesce(server: SandboxServer, faults: Faults) -> None:
    """Wait for attempts the clients gave up on but the provider is still working on.

    A delayed request executes after its client timed out; counting before it lands would
    miss exactly the executions this demo is about.
    """
    if faults.delay_rate <= 0 or faults.delay_seconds <= 0:
        return
    time.sleep(faults.delay_seconds)
    seen = -1
    while (total := server.store.total_executions()) != seen:
        seen = total
        time.sleep(0.1)


@contextmanager
def _progress(console: Console, label: str, total: int) -> Iterator[Callable[[], None]]:
    with Progress(
        TextColumn("{task.description:<20}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task(label, total=total)
        yield lambda: progress.advance(task)


def _print_intro(console: Console, payments: int, faults: Faults) -> None:
    console.print(
        Text.assemble(
            ("payonce demo", "bold"),
            f": {payments} payments to a sandbox provider that fails on purpose "
            f"(seed {faults.seed})",
        )
    )
    for line in (
        f"{faults.fail_before_rate:.0%} of requests answer 503 before executing",
        f"{faults.fail_after_rate:.0%} execute, then answer 503",
        f"{faults.drop_after_rate:.0%} execute, then drop the connection",
        f"{faults.rate_limit_rate:.0%} answer 429 (rate limited)",
        f"{faults.delay_rate:.0%} answer after {faults.delay_seconds:g}s; "
        f"the clients time out after {CLIENT_TIMEOUT:g}s",
    ):
        console.print(Text(f"  {line}", style="dim"))


def _print_report(console: Console, result: DemoResult) -> None:
    p, n = result.payonce, result.naive
    table = Table(title="payonce vs a naive client (fresh key per attempt)", title_justify="left")
    table.add_column("")
    table.add_column("payonce", justify="right")
    table.add_column("naive client", justify="right")
    rows: list[tuple[str, str, str]] = [
        ("payments", str(result.payments), str(result.payments)),
        ("intents journaled", str(p.intents), "-"),
        ("HTTP attempts", str(p.attempts), str(n.attempts)),
        ("retries", str(p.retries), str(n.retries)),
        ("answers replayed by the provider", str(p.provider_replays), "-"),
        ("answered from the journal when sent again", str(p.journal_replays), "-"),
        ("answered: succeeded / failed", f"{p.succeeded} / {p.failed}", str(n.answered)),
        ("unknown (to reconcile) / pending", f"{p.unknown} / {p.pending}", "-"),
        ("gave up", str(p.unknown + p.pending), str(n.gave_up)),
        ("executions at the provider", str(p.executions), str(n.executions)),
        ("  of settled intents", str(p.executions_of_settled), "-"),
        ("  of unknown intents", str(p.unknown_executed), "-"),
        ("payments executed more than once", str(p.charged_twice), str(n.charged_twice)),
        ("duplicate executions", str(p.duplicates), str(n.duplicates)),
        ("seconds", f"{p.seconds:.1f}", f"{n.seconds:.1f}"),
    ]
    for name, ours, theirs in rows:
        table.add_row(name, ours, theirs)
    console.print(table)
    _print_verdict(console, result)


def _print_verdict(console: Console, result: DemoResult) -> None:
    p, n = result.payonce, result.naive
    if result.ok:
        lines = [
            f"payonce: {p.settled} settled intent(s), {p.executions_of_settled} execution(s) "
            "at the provider: exactly once each."
        ]
        if p.unknown:
            lines.append(
                f"{p.unknown} intent(s) left unknown for reconciliation; {p.unknown_executed} "
                "of them executed at the provider, none more than once."
            )
        if p.pending:
            lines.append(f"{p.pending} never reached the provider: pending, safe to resend.")
        console.print(Text.assemble(("OK ", "bold green"), " ".join(lines)))
    else:
        console.print(Text("FAILED payonce broke its promise:", style="bold red"))
        for problem in result.payonce.problems:
            console.print(Text(f"  {problem}"))
    console.print(
        Text.assemble(
            ("naive client: ", "bold"),
            (
                f"{n.duplicates} duplicate execution(s), {n.charged_twice} payment(s) charged "
                "more than once.",
                "bold red" if n.duplicates else "",
            ),
        )
    )
    if result.journal is not None:
        console.print(
            Text(f"journal kept: payonce intents list --journal {result.journal}", style="dim")
        )
    else:
        console.print(Text("(pass --journal PATH to keep the journal and inspect it)", style="dim"))
