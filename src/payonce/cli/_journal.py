"""``payonce journal check|backup`` and ``payonce prune``: keep the journal healthy and small."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from rich import box
from rich.table import Table
from rich.text import Text

import payonce

from ._common import (
    CliError,
    Damaged,
    JournalLocation,
    console,
    echo_json,
    existing_journal,
    existing_journal_target,
    iso,
    journal_option,
    json_option,
    redacted,
    shown,
)
from ._report import report_json, report_lines, report_view
from ._tables import print_table

__all__ = ["journal_group", "parse_duration", "prune"]


@click.group("journal")
def journal_group() -> None:
    """Check the journal's integrity, migrate it, and back it up."""


@journal_group.command("check")
@journal_option
@json_option
def check_journal(journal_path: JournalLocation | None, as_json: bool) -> None:
    """Read the whole journal through and report its health and what it holds.

    Integrity, schema version, intents by state, unacknowledged intents, size on disk,
    and every row that no longer decodes (a state payonce never writes, headers that are
    not JSON, a time that is not a finite number), each read as `resume` and the worker
    read it: one line per damaged row, with its intent's key and what is wrong. Listings
    leave such a row out and recovery skips it; check the intent at the provider, then
    restore the journal or repair the row (docs/operating.md, "A damaged row").

    Exits 0 when the journal is sound; 1 if it is damaged (a problem or a damaged row),
    with `"ok": false` and the findings under --json, also when the file is too damaged
    to open; 2 when it cannot be reached or read at all (no such journal, a server down).
    """
    target = existing_journal_target(journal_path)
    try:
        with existing_journal(target, read_only=True) as journal:
            report = journal.check()
    except payonce.JournalBusy:
        raise
    except payonce.JournalError as exc:
        if as_json:
            url = isinstance(target, str) and urlsplit(target).scheme.startswith("postgres")
            location = redacted(str(target)) if url else str(Path(target).resolve())
            echo_json({"location": location, "ok": False, "problems": [str(exc)]})
            raise click.exceptions.Exit(1) from exc
        raise Damaged(f"the journal is damaged: {exc}") from exc
    out = console()
    if as_json:
        echo_json(report_json(report))
    elif out.is_terminal:
        out.print(report_view(report))
    else:
        for line in report_lines(report):
            click.echo(line, file=out.file)
    if not report.ok:
        raise click.exceptions.Exit(1)


@journal_group.command("init")
@journal_option
def init_journal(journal_path: JournalLocation | None) -> None:
    """Create the journal's tables, as a payonce client opening it first would.

    For a deploy step that creates the journal before the service and its workers start
    (a worker waits for a journal not created yet; `--once` refuses one). An SQLite file is
    created in a directory that exists; a PostgreSQL journal's schema (?schema=) is
    created if missing, which needs the CREATE privilege. Running it again changes nothing:
    a journal there already is left as it is (migrated, if its schema is older).
    """
    found = 0
    if not _missing_file(journal_path):
        with existing_journal(journal_path, read_only=True) as journal:
            found = journal.schema_version
    try:
        with payonce.open_journal(journal_path) as journal:
            location, now = journal.location, journal.schema_version
    except payonce.ConfigurationError as exc:
        raise CliError(str(exc)) from None
    if found == 0:
        click.echo(f"created the journal {location} (schema {now})")
    elif found == now:
        click.echo(f"{location} is a payonce journal already (schema {now}): nothing to do")
    else:
        click.echo(
            f"{location} is a payonce journal already: migrated from schema {found} to {now}"
        )


def _missing_file(location: JournalLocation | None) -> bool:
    if isinstance(location, str):
        return False
    path = location if location is not None else payonce.journal.default_journal_path()
    return not path.expanduser().exists()


@journal_group.command("migrate")
@journal_option
def migrate_journal(journal_path: JournalLocation | None) -> None:
    """Bring the journal to this payonce's schema, as a payonce client opening it would.

    Reading commands (intents list and show, ack --list, journal check) never migrate a
    journal, and read an older schema as it is; this is for one too old for what they need,
    or to migrate before starting the workers. Migrations only add tables, columns and
    indexes. A file that is not a payonce journal yet is left alone.
    """
    target = existing_journal_target(journal_path)
    with existing_journal(target, read_only=True) as journal:
        found = journal.schema_version
        location = journal.location
    if found == 0:
        raise CliError(
            f"{location} is not a payonce journal yet (it has no payonce tables): nothing to "
            "migrate. A payonce client creates the journal when it first opens it"
        )
    with existing_journal(target) as journal:
        now = journal.schema_version
    if found == now:
        click.echo(f"{location} is at schema {now}, this payonce's: nothing to migrate")
    else:
        click.echo(f"migrated {location} from schema {found} to {now}")


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

_UNITS = {"w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "min": 60.0, "m": 60.0, "s": 1.0}
_NUMBER = r"\d+(?:\.\d+)?"
_PART = re.compile(rf"({_NUMBER})(min|[wdhms])")
_ISO = re.compile(
    rf"P(?:({_NUMBER})W)?(?:({_NUMBER})D)?(?:T(?:({_NUMBER})H)?(?:({_NUMBER})M)?(?:({_NUMBER})S)?)?"
)
_ISO_UNITS = ("w", "d", "h", "m", "s")
_FORMS = "30d, 12h, 90min, 1d12h, 2w, or ISO 8601 such as P30D or PT12H"


def parse_duration(text: str) -> float:
    """Seconds in a duration: ``30d``, ``12h``, ``90min`` (or ``90m``), ``1d12h``, ``2w``,
    or ISO 8601 without years and months (``P30D``, ``PT12H``, ``P1DT12H``, ``P2W``).

    A capital ``M`` is refused: months or minutes? (``6M`` pruned six minutes once.)
    """
    compact = text.strip().replace(" ", "")
    if compact.startswith("P"):
        return _positive(text, _iso_duration(text, compact))
    if "M" in compact:
        raise ValueError(
            f"{text!r}: a capital M could mean months or minutes; write minutes as "
            "90min or 90m, and months in days (180d is about six months)"
        )
    compact = compact.lower()
    parts = _PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"{text!r} is not a duration: write a number and a unit, e.g. {_FORMS}")
    return _positive(text, sum(float(number) * _UNITS[unit] for number, unit in parts))


def _iso_duration(text: str, compact: str) -> float:
    date_part = compact.split("T", 1)[0]
    if "Y" in date_part or "M" in date_part:
        raise ValueError(f"{text!r}: years and months vary in length; give days instead (P180D)")
    match = _ISO.fullmatch(compact)
    if match is None or compact.endswith("T") or not any(match.groups()):
        raise ValueError(f"{text!r} is not an ISO 8601 duration such as P30D, PT12H or P1DT12H")
    return sum(
        float(value) * _UNITS[unit]
        for unit, value in zip(_ISO_UNITS, match.groups(), strict=True)
        if value is not None
    )


def _positive(text: str, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"{text!r} is no time at all: give a positive duration")
    return seconds


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _can_ask() -> bool:
    """Whether someone is at a terminal to confirm a deletion."""
    return sys.stdin is not None and sys.stdin.isatty()


@click.command(short_help="Delete old settled and acknowledged intents.")
@click.option(
    "--older-than",
    "older_than",
    metavar="DURATION",
    callback=_duration,
    required=True,
    help=f"Only intents untouched for this long: {_FORMS}. M (months?) is refused.",
)
@click.option("--dry-run", is_flag=True, help="Show what would be deleted; delete nothing.")
@click.option(
    "--include-unacknowledged",
    is_flag=True,
    help="Also delete settled outcomes your code never acknowledged (gives up being told "
    "of them after a crash).",
)
@click.option("--yes", "-y", is_flag=True, help="Delete without asking: for scripts and cron.")
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
    include_unacknowledged: bool,
    yes: bool,
    batch_size: int,
    journal_path: JournalLocation | None,
    as_json: bool,
) -> None:
    """Delete intents that are over and done with, to keep the journal small.

    Only succeeded and failed intents whose outcome was acknowledged, and abandoned
    intents, with nothing changed for longer than --older-than, go (with their attempts
    and reconciliations). Pending and unknown intents are never pruned: abandon them
    first, with the reason. Unacknowledged outcomes go only with
    --include-unacknowledged. An intent younger than twice its provider's key lifetime
    (48 h for Stripe) is kept whatever --older-than says. On a terminal, prune says how
    many would go and asks; from a script, pass --yes. Deletes in short batches, so
    payonce clients keep writing meanwhile.

    A pruned intent is forgotten: the same reference used again afterwards is a new
    intent with a new key, and PAYS AGAIN. Choose --older-than well beyond any retry of a
    business operation.
    """
    now = time.time()
    cutoff = now - older_than
    given_up = include_unacknowledged
    with existing_journal(journal_path) as journal:
        location = journal.location
        would = journal.prune(
            older_than=cutoff, include_unacknowledged=given_up, now=now, dry_run=True
        )
        if dry_run:
            sample = journal.prunable(older_than=cutoff, include_unacknowledged=given_up, now=now)
            _show_dry_run(sample, would, location, cutoff, given_up, as_json)
            return
        if would and not yes:
            _confirm(would, location)
        began = time.monotonic()
        count = journal.prune(
            older_than=cutoff, include_unacknowledged=given_up, now=now, batch_size=batch_size
        )
        seconds = time.monotonic() - began
    if as_json:
        echo_json(_prune_json(location, cutoff, count, dry_run=False, seconds=seconds))
        return
    click.echo(
        f"pruned {count} intent(s) {_which(given_up)} before "
        f"{iso(cutoff, precise=False)} from {location}" + (f" in {seconds:.1f}s" if count else "")
    )


def _which(include_unacknowledged: bool) -> str:
    if include_unacknowledged:
        return "settled (acknowledged or not) or abandoned"
    return "settled and acknowledged (or abandoned)"


def _prune_json(
    location: str, cutoff: float, count: int, *, dry_run: bool, seconds: float | None = None
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "journal": location,
        "dry_run": dry_run,
        "cutoff": iso(cutoff),
        "intents": count,
    }
    if seconds is not None:
        report["seconds"] = round(seconds, 3)
    return report


def _confirm(count: int, location: str) -> None:
    question = (
        f"Delete {count} intent(s) from {location}? A pruned reference used again is a new "
        "intent and pays again."
    )
    if not _can_ask():
        raise CliError(
            f"prune would delete {count} intent(s) from {location}: pass --yes to delete "
            "them from a script, or --dry-run to see which"
        )
    if not click.confirm(question, err=True):
        click.echo("nothing deleted", err=True)
        raise click.exceptions.Exit(0)


def _show_dry_run(
    sample: list[payonce.IntentRecord],
    count: int,
    location: str,
    cutoff: float,
    include_unacknowledged: bool,
    as_json: bool,
) -> None:
    if as_json:
        report = _prune_json(location, cutoff, count, dry_run=True)
        report["sample"] = [
            {
                "key": record.key,
                "reference": record.reference,
                "state": record.state.value,
                "provider": record.provider,
                "updated_at": iso(record.updated_at),
            }
            for record in sample
        ]
        echo_json(report)
        return
    out = console()

    def say(line: str) -> None:
        if out.is_terminal:
            out.print(Text(line))
        else:  # piped, stdout holds the sample's lines alone, for grep and cut
            click.echo(line, err=True)

    say(
        f"would prune {count} intent(s) {_which(include_unacknowledged)} "
        f"before {iso(cutoff, precise=False)} from {location}; intents younger than twice "
        "their provider's key lifetime are kept whatever --older-than says"
    )
    if sample:
        table = _sample_table(sorted(sample, key=lambda record: record.updated_at))
        print_table(out, [table], fields=table)
    if count > len(sample):
        say(f"... and {count - len(sample)} more")


def _sample_table(sample: list[payonce.IntentRecord]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("key", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("provider", overflow="fold")
    table.add_column("updated (UTC)", no_wrap=True)
    table.add_column("reference", overflow="fold")
    for record in sample:
        table.add_row(
            Text(shown(record.key)),
            Text(record.state.value),
            Text(shown(record.provider)),
            Text(iso(record.updated_at, precise=False) or ""),
            Text(shown(record.reference)),
        )
    return table
