"""The journal: where intents, attempts and reconciliations are kept, and what it holds.

``open_journal`` opens one from a path, a ``postgresql://`` URL or the default location;
``Journal`` is what every journal offers for reading and for operators' decisions.
"""

from typing import TYPE_CHECKING, Any

from ._journal._open import default_journal_path, open_journal, postgres_journal_class
from ._journal._reads import Journal
from ._journal._reports import JournalReport
from ._journal._sqlite import SQLiteJournal
from ._lifecycle import AttemptRecord, IntentRecord, ReconciliationRecord, StoredResponse

if TYPE_CHECKING:
    from ._journal._postgres import PostgresJournal

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
        return postgres_journal_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
