"""The journal: where intents, attempts and reconciliations are kept, and what it holds.

``open_journal`` opens one from a path, a ``postgresql://`` URL or the default location;
``Journal`` is what every journal offers for reading and for operators' decisions.
"""

from typing import TYPE_CHECKING, Any

from ._journal import (
    AttemptRecord,
    IntentRecord,
    Journal,
    JournalReport,
    ReconciliationRecord,
    SQLiteJournal,
    StoredResponse,
    default_journal_path,
    open_journal,
)

if TYPE_CHECKING:
    from ._journal import PostgresJournal

__all__ = [
    "AttemptRecord",
    "IntentRecord",
    "Journal",
    "JournalReport",
    "PostgresJournal",
    "ReconciliationRecord",
    "SQLiteJournal",
    "StoredResponse",
    "default_journal_path",
    "open_journal",
]


def __getattr__(name: str) -> Any:
    # PostgresJournal imports psycopg: only for those who ask for it.
    if name == "PostgresJournal":
        from . import _journal

        return _journal.PostgresJournal
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
