"""``payonce journal check|backup`` and ``payonce prune``: keep the journal healthy and small."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import click

import payonce

from ._common import (
    CliError,
    Damaged,
    JournalLocation,
    console,
    echo_json,
    existing_journal,
    iso,
    journal_option,
    json_option,
)
from ._report import report_json, report_view

__all__ = ["journal_group", "parse_duration", "prune"]


@click.group("journal")
def journal_group() -> None:
    """Check the journal's integrity and back it up."""


@journal_group.command("check")
@journal_option
@json_option
def check_journal(journal_path: JournalLocation | None, as_json: bool) -> None:
    """Read the whole journal through and report its health and what it holds.

    Integrity, schema version, intents by state, unacknowledged intents, size on disk.
    Exits 1 if the journal is damaged.
    """
    with existing_journal(journal_path) as journal:
        try:
            report = journal.check()
        except payonce.JournalBusy:
            raise
        except payonce.JournalError as exc:
            raise Damaged(f"the journal is damaged: {exc}") from exc
    if as_json:
        echo_json(report_json(report))
    else:
        console().print(report_view(report))
    if not report.ok:
        raise click.exceptions.Exit(1)


@journal_group.command("backup")
@click.argument("destination", type=click.Path(path_type=Path))
@journal_option
def backup_journal(destination: Path, journal_path: JournalLocation | None) -> None:
    """Copy the SQLite journal to DESTINATION, a new file, while payonce keeps running.

    Through SQLite's backup API: the copy is consistent and holds every committed row,
    also those still only in the -wal file beside the journal (a copy of the .db file
    alone can miss them). DESTINATION must not exist: a backup never overwrites anything.
    """
    if isinstance(journal_path, str) and urlsplit(journal_path).scheme.startswith("postgres"):
        # Said before connecting: a PostgreSQL journal's backup is the database's own job.
        raise CliError("back a PostgreSQL journal up with pg_dump (pg_dump -Fc -f payonce.dump DB)")
    with existing_journal(journal_path) as journal:
        target = journal.backup(destination)
    size = target.stat().st_size
    click.echo(f"backed up {journal.location} to {target} ({size} bytes)")


# -- prune ------------------------------------------------------------------------------------

_UNITS = {"w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30d``, ``12h``, ``90m``, ``1d12h`` or ``2w``."""
    compact = text.strip().lower().replace(" ", "")
    parts = _PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(
            f"{text!r} is not a duration: write a number and a unit (w, d, h, m or s), "
            "e.g. 30d, 12h, 90m or 1d12h"
        )
    seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r} is no time at all: give a positive duration")
    return seconds


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@click.command(short_help="Delete old settled and acknowledged intents.")
@click.option(
    "--older-than",
    "older_than",
    metavar="DURATION",
    callback=_duration,
    required=True,
    help="Only intents untouched for this long: 30d, 12h, 90m, 1d12h, 2w.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Intents deleted per transaction: writers wait for one batch at most.",
)
@journal_option
@json_option
def prune(
    older_than: float,
    dry_run: bool,
    batch_size: int,
    journal_path: JournalLocation | None,
    as_json: bool,
) -> None:
    """Delete intents that are over and done with, to keep the journal small.

    Only succeeded and failed intents whose outcome was acknowledged, and abandoned
    intents, with nothing changed for longer than --older-than, go (with their attempts
    and reconciliations). Pending and unknown intents and unacknowledged outcomes are
    never pruned. Deletes in short batches, so payonce clients keep writing meanwhile.

    A pruned intent is forgotten: the same reference used again afterwards is a new
    intent with a new key, and could pay again. Choose --older-than well beyond any
    retry of a business operation (and the provider's key lifetime).
    """
    cutoff = time.time() - older_than
    with existing_journal(journal_path) as journal:
        began = time.monotonic()
        count = journal.prune(older_than=cutoff, batch_size=batch_size, dry_run=dry_run)
        seconds = time.monotonic() - began
        location = journal.location
    if as_json:
        echo_json(
            {
                "journal": location,
                "dry_run": dry_run,
                "cutoff": iso(cutoff),
                "intents": count,
                "seconds": round(seconds, 3),
            }
        )
        return
    what = "would prune" if dry_run else "pruned"
    click.echo(
        f"{what} {count} intent(s) settled and acknowledged (or abandoned) before "
        f"{iso(cutoff, precise=False)} from {location}"
        + ("" if dry_run or not count else f" in {seconds:.1f}s")
    )
