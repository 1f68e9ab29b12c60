"""The journal: intents and attempts, durable before anything is sent."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from ._base import Journal
from ._records import (
    AttemptRecord,
    Claim,
    ClaimKind,
    IntentDraft,
    IntentRecord,
    JournalReport,
    ReconciliationRecord,
    StoredResponse,
)
from ._schema import SCHEMA_VERSION
from ._sqlite import SQLiteJournal

__all__ = [
    "SCHEMA_VERSION",
    "AttemptRecord",
    "Claim",
    "ClaimKind",
    "IntentDraft",
    "IntentRecord",
    "Journal",
    "JournalReport",
    "ReconciliationRecord",
    "SQLiteJournal",
    "StoredResponse",
    "default_journal_path",
    "open_journal",
]

JOURNAL_ENV = "PAYONCE_JOURNAL"


def default_journal_path() -> Path:
    """``$PAYONCE_JOURNAL`` if set, else ``payonce/journal.db`` in the user data directory."""
    configured = os.environ.get(JOURNAL_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_data_dir("payonce", appauthor=False)) / "journal.db"


def open_journal(
    journal: Journal | str | os.PathLike[str] | None = None, *, busy_timeout: float = 5.0
) -> Journal:
    """A journal from an instance, a path, or the default location.

    Only the default location's directory is created on demand: an explicit path whose
    directory is missing is far more likely a typo than a wish.
    """
    if journal is not None and not isinstance(journal, str | os.PathLike):
        return journal
    if journal is None:
        from_env = bool(os.environ.get(JOURNAL_ENV))
        return SQLiteJournal(
            default_journal_path(), busy_timeout=busy_timeout, create_directories=not from_env
        )
    return SQLiteJournal(journal, busy_timeout=busy_timeout)
