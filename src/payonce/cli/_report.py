"""``payonce journal check``: the journal's health report, as a table or JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

import payonce

__all__ = ["report_json", "report_view"]

_STATE_ORDER = [state.value for state in payonce.IntentState]


def _by_state(report: payonce.journal.JournalReport) -> dict[str, int]:
    known = {state: report.intents_by_state.get(state, 0) for state in _STATE_ORDER}
    others = {k: v for k, v in sorted(report.intents_by_state.items()) if k not in known}
    return known | others


def report_json(report: payonce.journal.JournalReport) -> dict[str, Any]:
    return {
        "location": report.location,
        "ok": report.ok,
        "problems": list(report.problems),
        "schema_version": report.schema_version,
        "latest_schema_version": report.latest_schema_version,
        "intents_by_state": _by_state(report),
        "intents": sum(report.intents_by_state.values()),
        "unacknowledged": report.unacknowledged,
        "size_bytes": report.size_bytes,
    }


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _schema(report: payonce.journal.JournalReport) -> str:
    version, latest = report.schema_version, report.latest_schema_version
    if version == 0 or version >= latest:
        return str(version)
    return f"{version} (this payonce writes {latest}: the next payonce that writes migrates it)"


def report_view(report: payonce.journal.JournalReport) -> Group:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    if report.ok:
        integrity = Text("ok", style="green")
    else:
        integrity = Text(f"{len(report.problems)} problem(s) found", style="bold red")
    counts = _by_state(report)
    states = ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "none"
    fields.add_row("journal", Text(report.location))
    fields.add_row("integrity", integrity)
    fields.add_row("schema version", Text(_schema(report)))
    fields.add_row("intents", Text(f"{sum(counts.values())} ({states})"))
    fields.add_row("unacknowledged", Text(str(report.unacknowledged)))
    fields.add_row("size", Text(_size(report.size_bytes)))
    parts: list[Table | Text] = [fields]
    parts.extend(Text(f"  {problem}", style="red") for problem in report.problems)
    return Group(*parts)
