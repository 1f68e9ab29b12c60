"""What every command shares: errors and exit codes, the journal option, output helpers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import urlsplit, urlunsplit

import click
from rich.console import Console

import payonce

__all__ = [
    "CONTEXT_SETTINGS",
    "JOURNAL_ENV",
    "CliError",
    "Damaged",
    "JournalLocation",
    "NotFound",
    "Refused",
    "console",
    "echo_json",
    "existing_journal",
    "existing_journal_target",
    "iso",
    "journal_option",
    "json_option",
    "redacted",
    "say_damaged",
    "shown",
]

JOURNAL_ENV = "PAYONCE_JOURNAL"

CONTEXT_SETTINGS: Final[dict[str, Any]] = {"help_option_names": ["-h", "--help"]}
"""For the ``payonce`` group (its subcommands inherit it) and for any command that is also
run on its own, as ``payonce sandbox`` is by ``python -m payonce.sandbox``."""


class CliError(click.ClickException):
    """A user-facing failure: one ``error: ...`` line on stderr, no traceback.

    Exit status 2: the journal or the configuration needs fixing.
    """

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


class NotFound(CliError):
    """What was asked for is not there: exit status 1."""

    exit_code = 1


class Refused(CliError):
    """The intent's state does not allow what was asked (or another worker holds it): 1."""

    exit_code = 1


class Damaged(CliError):
    """The journal opened, but reading it through found damage: exit status 1."""

    exit_code = 1


# -- the journal ------------------------------------------------------------------------------

JournalLocation = Path | str
"""A journal file, or the URL of a journal server (kept as a string: a Path would mangle it)."""


def _journal_location(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> JournalLocation | None:
    if value is None:
        return None
    return value if "://" in value else Path(value)


journal_option = click.option(
    "--journal",
    "journal_path",
    metavar="PATH|URL",
    callback=_journal_location,
    envvar=JOURNAL_ENV,
    show_envvar=True,
    help="The journal file, or a journal URL such as postgresql://… "
    "(default: payonce's journal in the user data directory).",
)


def existing_journal_target(location: JournalLocation | None) -> JournalLocation:
    """The journal to open; a missing journal file is reported, never created."""
    if isinstance(location, str):
        return location
    target = (
        location if location is not None else payonce.journal.default_journal_path()
    ).expanduser()
    if not target.exists():
        # Not "no journal at" a libpq key=value string, which would print its password:
        # payonce refuses one as a journal (ConfigurationError), before touching the disk.
        try:
            payonce.open_journal(target, read_only=True, check_integrity=False).close()
        except payonce.ConfigurationError as exc:
            raise CliError(str(exc)) from None
        except payonce.PayonceError:
            pass  # no such file: said below
        raise CliError(f"no journal at {target}")
    return target


@contextlib.contextmanager
def existing_journal(
    location: JournalLocation | None, *, read_only: bool = False
) -> Iterator[payonce.Journal]:
    """Open an existing journal; closed on the way out.

    ``read_only`` commands open it read-only: never created, migrated or locked for writing
    (an empty file stays empty, and they read while a worker writes). They skip the
    integrity check on open too: it reads the whole file (1.5 s at a million intents), and
    a reader changes nothing a damaged file could spoil.
    """
    journal = payonce.open_journal(
        existing_journal_target(location), check_integrity=not read_only, read_only=read_only
    )
    try:
        yield journal
    finally:
        journal.close()


# -- output -----------------------------------------------------------------------------------


def iso(timestamp: float | None, *, precise: bool = True) -> str | None:
    """ISO 8601 in UTC: with milliseconds and offset for JSON, short for tables."""
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, UTC)
    if precise:
        return moment.isoformat(timespec="milliseconds")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def redacted(url: str) -> str:
    """The URL without any user:password part: a base URL may carry credentials."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def shown(value: object) -> str:
    """Text from the journal (references, keys, reasons, headers), safe to print: control
    characters are shown escaped (``\\x1b``), never sent to the terminal, where they could
    rewrite the screen or the window title."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def console() -> Console:
    # Created per command so it writes to whatever stdout is current (CliRunner swaps it).
    return Console(highlight=False)


def say_damaged(rows: Sequence[payonce.journal.DamagedRow]) -> None:
    """Name each row a read left out because it no longer decodes, on stderr, and what to
    do; the command then exits 1 (``Damaged``)."""
    for row in rows:
        click.echo(f"error: damaged {shown(row)}", err=True)
    if rows:
        click.echo(
            "payonce never sends or changes a damaged row: check the intent at the provider, "
            "then restore the journal from a backup or repair the row by hand "
            "(`payonce journal check` lists every damaged row)",
            err=True,
        )
