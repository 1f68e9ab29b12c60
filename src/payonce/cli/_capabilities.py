"""The one place the command asks a journal what it can do.

The public ``Journal`` interface does not promise ``prune`` or ``backup`` yet, so the
journal commands probe for them here. Once the interface has them (issue 8, section 2),
each function below becomes a plain method call and this module can go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import payonce

from ._common import CliError, JournalLocation

__all__ = ["backup", "check", "prune", "refuse_server_backup"]

_PG_DUMP = "back a PostgreSQL journal up with pg_dump (e.g. pg_dump -Fc -f payonce.dump DBNAME)"


@runtime_checkable
class _Checkable(Protocol):
    def check(self) -> payonce.journal.JournalReport: ...


@runtime_checkable
class _Prunable(Protocol):
    def prune(self, *, older_than: float, batch_size: int = 1000, dry_run: bool = False) -> int: ...


def check(journal: payonce.Journal) -> payonce.journal.JournalReport:
    if not isinstance(journal, _Checkable):
        raise CliError(f"the journal at {journal.location} cannot be checked by payonce")
    return journal.check()


def prune(journal: payonce.Journal, *, older_than: float, batch_size: int, dry_run: bool) -> int:
    if not isinstance(journal, _Prunable):
        raise CliError(f"the journal at {journal.location} cannot be pruned by payonce")
    return journal.prune(older_than=older_than, batch_size=batch_size, dry_run=dry_run)


def refuse_server_backup(location: JournalLocation | None) -> None:
    """Refuse a PostgreSQL URL before connecting: its backup is the database's own job."""
    if isinstance(location, str) and urlsplit(location).scheme in ("postgresql", "postgres"):
        raise CliError(_PG_DUMP)


def backup(journal: payonce.Journal, destination: Path) -> Path:
    if not isinstance(journal, payonce.journal.SQLiteJournal):
        raise CliError(f"the journal at {journal.location} is not a SQLite file: {_PG_DUMP}")
    return journal.backup(destination)
