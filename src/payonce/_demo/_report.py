"""What the demo prints: the faults it runs into, a bar per pass, then the two clients'
counts side by side and the verdict."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from payonce._demo._results import DemoResult
from payonce._demo._scenario import CLIENT_TIMEOUT
from payonce.sandbox import Faults


@attrs.frozen
class Bar:
    """One pass's progress bar."""

    _progress: Progress
    _task: TaskID

    def advance(self) -> None:
        self._progress.advance(self._task)

    def note(self, text: str) -> None:
        """Shown after the count, e.g. how many workers were killed so far."""
        self._progress.update(self._task, note=text)


@contextmanager
def progress(console: Console, label: str, total: int) -> Iterator[Bar]:
    # Kept on screen once done, and the labels padded alike, so the passes line up.
    with Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    ) as bar:
        yield Bar(bar, bar.add_task(label, total=total, note=""))


def print_intro(
    console: Console, payments: int, faults: Faults, client_timeout: float = CLIENT_TIMEOUT
) -> None:
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
        f"the clients time out after {client_timeout:g}s",
    ):
        console.print(Text(f"  {line}", style="dim"))


def print_report(console: Console, result: DemoResult) -> None:
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
        ("payments never executed", str(p.missing), str(n.missing)),
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
