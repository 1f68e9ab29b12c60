"""After a crash: how resume and reconcile results are shown, summed up and watched."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import attrs
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

import payonce

from ._common import shown
from ._intent_views import state_text
from ._tables import print_table

__all__ = [
    "Row",
    "print_rows",
    "progress",
    "reconcile_row",
    "resume_row",
    "rows_table",
    "summary",
]

Category = Literal["settled", "pending", "unknown", "skipped", "damaged"]

_SETTLED = (payonce.IntentState.SUCCEEDED, payonce.IntentState.FAILED)


@attrs.frozen
class Row:
    """One resumed or reconciled intent, as the command reports it."""

    key: str
    reference: str | None
    before: payonce.IntentState | None
    """None for resume: every resumed intent was pending."""
    after: payonce.IntentState
    outcome: payonce.records.ReconcileOutcome | None
    """The reconciliation's outcome; None for resume."""
    detail: str
    reason: str | None
    """Why the intent is still unknown (grouped in the summary), else None."""
    damaged: bool = False
    """Its journal row no longer decodes: skipped, never sent or looked up."""

    @property
    def category(self) -> Category:
        if self.damaged:
            return "damaged"
        if (
            self.outcome is payonce.records.ReconcileOutcome.SKIPPED
            and self.after is not payonce.IntentState.UNKNOWN
        ):
            return "skipped"
        if self.after in _SETTLED:
            return "settled"
        if self.after is payonce.IntentState.PENDING:
            return "pending"
        if self.after is payonce.IntentState.UNKNOWN:
            return "unknown"
        return "skipped"

    @property
    def needs_attention(self) -> bool:
        """Not settled: still unknown, or pending (not sent by resume, or put back to
        pending by reconcile and waiting for `payonce resume`)."""
        return self.category in ("pending", "unknown", "damaged")

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"key": self.key, "reference": self.reference}
        if self.before is None:
            document["state"] = self.after.value
        else:
            document |= {
                "before": self.before.value,
                "after": self.after.value,
                "outcome": self.outcome,
            }
        document |= {"detail": self.detail, "unknown_reason": self.reason}
        if self.damaged:
            document["damaged"] = True
        return document


def resume_row(result: payonce.records.ResumeResult, journal: payonce.Journal) -> Row:
    reason = None
    if result.state is payonce.IntentState.UNKNOWN:
        # The journal's reason names no key, so the same cause groups in the summary.
        record = journal.get(result.key)
        reason = (record.unknown_reason if record else None) or result.detail
    if result.damaged:
        return Row(
            result.key, result.reference, None, result.state, None, result.detail, None, True
        )
    return Row(result.key, result.reference, None, result.state, None, result.detail, reason)


def reconcile_row(result: payonce.records.ReconcileResult) -> Row:
    unknown = result.after is payonce.IntentState.UNKNOWN and not result.damaged
    return Row(
        result.key,
        result.reference,
        result.before,
        result.after,
        result.outcome,
        result.detail,
        result.detail if unknown else None,
        result.damaged,
    )


def print_rows(out: Console, rows: Sequence[Row], *, title: str) -> None:
    """The results as a table on a terminal (record by record if none fits), else plain
    lines with ``before`` and ``after`` apart."""
    fields = rows_table(rows, title=title, apart=True)
    print_table(out, [rows_table(rows, title=title)], fields=fields)


def rows_table(rows: Sequence[Row], *, title: str, apart: bool = False) -> Table:
    """The results; ``apart`` puts ``before`` and ``after`` in columns of their own."""
    reconciled = any(row.before is not None for row in rows)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("key", no_wrap=True)
    table.add_column("reference", overflow="fold")
    if reconciled and apart:
        table.add_column("before", no_wrap=True)
        table.add_column("after", no_wrap=True)
        table.add_column("outcome", no_wrap=True)
    elif reconciled:
        table.add_column("before → after", no_wrap=True)
        table.add_column("outcome", no_wrap=True)
    else:
        table.add_column("state", no_wrap=True)
    # Free text wraps at spaces; a word longer than the column (a URL) folds, nothing is cut.
    table.add_column("detail", overflow="fold", min_width=20)
    for row in rows:
        cells = [Text(shown(row.key)), Text(shown(row.reference))]
        if row.before is not None and apart:
            cells += [state_text(row.before), state_text(row.after), Text(row.outcome or "")]
        elif row.before is not None:
            cells += [
                Text.assemble(state_text(row.before), " → ", state_text(row.after)),
                Text(row.outcome or ""),
            ]
        else:
            cells.append(state_text(row.after))
        cells.append(Text(shown(row.detail)))
        table.add_row(*cells)
    return table


def summary(verb: str, rows: Sequence[Row]) -> str:
    """One line: how many settled, went (or stayed) pending, stayed unknown and why."""
    by_category = Counter(row.category for row in rows)
    by_state = Counter(row.after for row in rows if row.category == "settled")
    settled = ", ".join(f"{by_state[state]} {state.value}" for state in _SETTLED if by_state[state])
    parts = [f"{by_category['settled']} settled" + (f" ({settled})" if settled else "")]
    resumed = all(row.before is None for row in rows)
    parts.append(f"{by_category['pending']} {'still' if resumed else 'back to'} pending")
    unknown = f"{by_category['unknown']} still unknown"
    reasons = Counter(row.reason or row.detail for row in rows if row.category == "unknown")
    if reasons:
        unknown += " (" + " | ".join(f"{n}x {why}" for why, n in reasons.most_common()) + ")"
    parts.append(unknown)
    if by_category["skipped"]:
        parts.append(f"{by_category['skipped']} skipped (nothing to reconcile)")
    if by_category["damaged"]:
        parts.append(
            f"{by_category['damaged']} damaged row(s) skipped (see `payonce journal check`)"
        )
    return f"{verb} {len(rows)} intent(s): " + ", ".join(parts)


@contextlib.contextmanager
def progress(
    console: Console, label: str, total: int | None, *, enabled: bool
) -> Iterator[Callable[[], None]]:
    """A progress bar on a terminal (gone once done); elsewhere, nothing at all.

    Yields ``advance()``, called once per intent as its result comes in. ``total`` may be
    None when it is not known up front: the bar then only counts.
    """
    if not enabled or total == 0:
        yield lambda: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)
