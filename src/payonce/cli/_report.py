"""``payonce journal check``: the journal's health report, as a table or JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

import payonce

from ._common import shown
from ._tables import field_name

__all__ = ["report_json", "report_lines", "report_view"]

_STATE_ORDER = [state.value for state in payonce.IntentState]


def _by_state(report: payonce.journal.JournalReport) -> dict[str, int]:
    known = {state: report.intents_by_state.get(state, 0) for state in _STATE_ORDER}
    others = {k: v for k, v in sorted(report.intents_by_state.items()) if k not in known}
    return known | others


def report_json(report: payonce.journal.JournalReport) -> dict[str, Any]:
    read = report.contents_read  # else null, not a 0 that reads like an empty journal
    return {
        "location": report.location,
        "ok": report.ok,
        "problems": list(report.problems),
        "contents_read": read,
        "schema_version": report.schema_version if read else None,
        "latest_schema_version": report.latest_schema_version,
        "intents_by_state": _by_state(report) if read else None,
        "intents": sum(report.intents_by_state.values()) if read else None,
        "unacknowledged": report.unacknowledged if read else None,
        "size_bytes": report.size_bytes,
        "damaged_rows": [damaged_json(row) for row in report.damaged_rows] if read else None,
    }


def damaged_json(row: payonce.journal.DamagedRow) -> dict[str, Any]:
    return {
        "table": row.table,
        "key": row.key,
        "problem": row.problem,
        "state": row.state,
        "account": row.account,
        "provider": row.provider,
        "reference": row.reference,
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


def _fields(report: payonce.journal.JournalReport) -> list[tuple[str, Text]]:
    if not report.problems:
        integrity = Text("ok", style="green")
    else:
        integrity = Text(f"{len(report.problems)} problem(s) found", style="bold red")
    unreadable = "unreadable: the file is too damaged to count what it holds"
    counts = _by_state(report)
    states = ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "none"
    intents = f"{sum(counts.values())} ({states})"
    if report.contents_read and report.problems:
        # A database server's problems (fsync=off) are its settings, not a damaged file.
        server = "://" in report.location
        intents += (
            ", as read despite the problems below" if server else ", as read from a damaged file"
        )
    read = report.contents_read
    damaged = len(report.damaged_rows)
    if not read:
        rows = Text(unreadable)
    elif damaged:
        rows = Text(
            f"{damaged}, each below: listings leave them out, resume and the worker skip them",
            style="bold red",
        )
    else:
        rows = Text("none", style="green")
    return [
        ("journal", Text(report.location)),
        ("integrity", integrity),
        ("schema version", Text(_schema(report) if read else unreadable)),
        ("intents", Text(intents if read else unreadable)),
        ("unacknowledged", Text(str(report.unacknowledged) if read else unreadable)),
        ("size", Text(_size(report.size_bytes))),
        ("damaged rows", rows),
    ]


def report_view(report: payonce.journal.JournalReport) -> Group:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    for name, value in _fields(report):
        fields.add_row(name, value)
    parts: list[Table | Text] = [fields]
    parts.extend(Text(f"  {shown(problem)}", style="red") for problem in report.problems)
    parts.extend(Text(f"  damaged {shown(row)}", style="red") for row in report.damaged_rows)
    return Group(*parts)


def report_lines(report: payonce.journal.JournalReport) -> list[str]:
    """Piped: ``name<TAB>value`` lines, then a ``problem<TAB>…`` line per finding and a
    ``damaged<TAB>…`` line per damaged row, each whole on one line (a finding's own line
    breaks escaped), for grep and cut."""
    lines = [f"{field_name(name)}\t{shown(value.plain)}" for name, value in _fields(report)]
    lines += [f"problem\t{shown(problem)}" for problem in report.problems]
    lines += [f"damaged\t{shown(row)}" for row in report.damaged_rows]
    return lines
