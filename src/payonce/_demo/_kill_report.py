"""What the demo prints about the kill scenario, and the summary of both scenarios."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from payonce._demo._kills import KillScenario
from payonce._demo._results import DemoResult, KillResult


def print_kill_intro(console: Console, scenario: KillScenario) -> None:
    faults = scenario.sandbox_config().faults
    console.print()
    console.print(
        Text.assemble(
            ("Worker processes killed mid-batch", "bold"),
            f": {scenario.orders} orders paid by {scenario.workers} worker processes, "
            f"{_plural(scenario.kills, 'SIGKILL')} at random moments (seed {scenario.seed})",
        )
    )
    for line in (
        "a killed worker is restarted at once and goes on with its orders",
        f"each payment takes {scenario.processing:g}s at the provider: the window a kill hits",
        f"{faults.fail_after_rate:.0%} execute, then answer 503; "
        f"{faults.drop_after_rate:.0%} execute, then drop the connection",
        "payonce: the workers share one journal",
        "stripe-python pattern: a key per call, in memory, kept for its retries",
    ):
        console.print(Text(f"  {line}", style="dim"))


def print_kill_report(console: Console, result: KillResult) -> None:
    p, s = result.payonce, result.stripe
    table = Table(
        title="payonce vs the stripe-python pattern (a key per call, in memory)",
        title_justify="left",
    )
    table.add_column("")
    table.add_column("payonce", justify="right")
    table.add_column("stripe-python pattern", justify="right")
    cut_off = "-" if p.cut_off is None else str(p.cut_off)
    rows = [
        ("orders", str(p.orders), str(s.orders)),
        ("worker processes", str(p.workers), str(s.workers)),
        ("SIGKILLs, each followed by a restart", str(p.kills), str(s.kills)),
        ("  requests cut off (in the journal)", cut_off, "-"),
        ("executions at the provider", str(p.executions), str(s.executions)),
        ("orders charged more than once", str(p.charged_twice), str(s.charged_twice)),
        ("duplicate executions", str(p.duplicates), str(s.duplicates)),
        ("missing orders (never executed)", str(p.missing), str(s.missing)),
        ("seconds", f"{p.seconds:.1f}", f"{s.seconds:.1f}"),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if result.ok:
        console.print(
            Text.assemble(
                ("OK ", "bold green"),
                f"payonce: {p.orders} orders, each executed exactly once through "
                f"{_plural(p.kills, 'kill')}: a restarted worker found its order's key in "
                "the journal.",
            )
        )
    else:
        console.print(
            Text(
                f"FAILED payonce through the kills: {p.duplicates} duplicate execution(s), "
                f"{p.missing} missing order(s).",
                style="bold red",
            )
        )
    console.print(
        Text.assemble(
            ("stripe-python pattern: ", "bold"),
            (
                f"{s.duplicates} duplicate execution(s), {s.missing} missing order(s) after "
                f"{_plural(s.kills, 'kill')}: a restarted worker made a new key for the order "
                "it was paying.",
                "bold red" if s.duplicates else "",
            ),
        )
    )


def print_summary(console: Console, result: DemoResult) -> None:
    """Both scenarios in one table: what the provider executed twice, and never."""
    table = Table(
        title="Counted at the provider: duplicate executions / missing orders",
        title_justify="left",
    )
    table.add_column("client")
    table.add_column("network faults", justify="right")
    table.add_column("workers killed", justify="right")
    p, n, kills = result.payonce, result.naive, result.kills
    table.add_row(
        "payonce",
        f"{p.duplicates} / {p.missing}",
        "-" if kills is None else f"{kills.payonce.duplicates} / {kills.payonce.missing}",
    )
    table.add_row("a fresh key per attempt", f"{n.duplicates} / {n.missing}", "-")
    if kills is not None:
        table.add_row(
            "a key per call, in memory (stripe-python)",
            "-",
            f"{kills.stripe.duplicates} / {kills.stripe.missing}",
        )
    console.print()
    console.print(table)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
