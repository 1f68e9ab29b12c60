"""How a table reaches its reader: whole on a terminal, plain lines through a pipe.

On a terminal a table is printed only in a layout that fits the width without cutting a
word: free text wraps at spaces, a key is never wrapped. When no layout fits, the records
are printed one after another, a field a line, so nothing is ever cropped or elided.

When stdout is not a terminal (a pipe, a file, cron), a table is plain lines for grep and
cut: a header line of field names, then one tab-separated line per record, with no title,
box or padding. Tabs and newlines inside a value are escaped (``\\x09``) by ``shown``, so a
record is always one line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import click
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ._common import shown

__all__ = ["field_name", "fits", "plain_lines", "print_table", "stacked"]

_UNBOUNDED = 1_000_000


def fits(out: Console, table: Table) -> bool:
    """Whether ``table`` fits the console with every no-wrap cell whole and no word cut."""
    # Measured without a limit: a measurement within the console's width is capped at it.
    unbounded = out.options.update_width(_UNBOUNDED)
    return Measurement.get(out, unbounded, table).minimum <= out.width


def print_table(out: Console, layouts: Sequence[Table], *, fields: Table) -> None:
    """``fields`` (every field of every record, the key first) as the reader needs it.

    A terminal gets the first of ``layouts`` that fits, else ``fields`` record by record;
    anything else gets ``fields`` as plain lines.
    """
    if not out.is_terminal:
        for line in plain_lines(fields):
            click.echo(line, file=out.file)
        return
    for layout in layouts:
        if fits(out, layout):
            out.print(layout)
            return
    # Not cropped: a key longer than the whole terminal is left to the terminal to wrap.
    out.print(stacked(fields, out.width), crop=False)


def field_name(header: object) -> str:
    """A header as a field name for awk and cut: ``created (UTC)`` -> ``created_utc``."""
    return re.sub(r"[^0-9a-z]+", "_", _plain(header).lower()).strip("_")


def plain_lines(table: Table) -> Iterator[str]:
    """The header line, then one tab-separated line per row; the title is left out."""
    yield "\t".join(field_name(column.header) for column in table.columns)
    for cells in _rows(table):
        yield "\t".join(shown(_plain(cell)) for cell in cells)


def stacked(table: Table, width: int) -> Group:
    """Record after record: the first cell (the key) whole on its own line, then the other
    non-empty fields under it, ``name  value``, each value wrapped at words. A value with a
    word too long for the space beside its name (a long reference) gets a line of its own
    under the name, never cut: a terminal narrower than the word wraps it, and a copy of
    it is still whole."""
    others = table.columns[1:]
    parts: list[RenderableType] = []
    if table.title:
        parts.append(Text(_plain(table.title), style="italic"))
    for index, (key, *values) in enumerate(_rows(table)):
        style = table.rows[index].style or ""
        label = _plain(table.columns[0].header)
        whole = _plain(key) if label == "key" else f"{label} {_plain(key)}"  # "attempt 2"
        head = Text(whole, style="bold", no_wrap=True, overflow="ignore")
        head.stylize(style)
        shown_fields = [
            (_plain(column.header), value)
            for column, value in zip(others, values, strict=True)
            if _plain(value)
        ]
        beside = width - 2 - max((len(name) for name, _ in shown_fields), default=0) - 2
        grid = _field_grid()
        parts.append(head)
        for name, value in shown_fields:
            if max(map(len, _plain(value).split() or [""])) <= beside:
                grid.add_row(name, value)
                continue
            # The grid so far, then this field: its name, and its value alone, whole.
            parts += [Padding(grid, (0, 0, 0, 2)), Padding(Text(name, style="dim"), (0, 0, 0, 2))]
            parts.append(Text(_plain(value), no_wrap=True, overflow="ignore"))
            grid = _field_grid()
        parts.append(Padding(grid, (0, 0, 0, 2)))
    return Group(*parts)


def _field_grid() -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, style="dim")
    grid.add_column(overflow="fold")  # only a word no line could hold folds, never "…"
    return grid


def _rows(table: Table) -> Iterator[tuple[RenderableType, ...]]:
    yield from zip(*(column.cells for column in table.columns), strict=True)


def _plain(value: object) -> str:
    return value.plain if isinstance(value, Text) else str(value)
