"""The journal: where intents, attempts and reconciliations are kept, and what it holds.

``open_journal`` opens one from a path, a ``postgresql://`` URL or the default location;
``Journal`` is what every journal offers for reading and for operators' decisions;
``owner_is_dead`` tells whether the worker holding an intent's lease is provably gone.
"""

from typing import TYPE_CHECKING, Any

from ._journal._open import default_journal_path, open_journal, postgres_journal_class
from ._journal._reads import Journal, Outcomes
from ._journal._reports import JournalReport
from ._journal._rows import DamagedRow, Intents
from ._journal._sqlite import SQLiteJournal
from ._lifecycle import (
    AttemptRecord,
    EscalationRecord,
    IntentRecord,
    KeyTerms,
    ReconciliationRecord,
    StoredResponse,
)
from ._owners import owner_is_dead as _owner_is_dead

if TYPE_CHECKING:
    from ._journal._postgres import PostgresJournal

__all__ = [
    "AttemptRecord",
    "DamagedRow",
    "EscalationRecord",
    "IntentRecord",
    "Intents",
    "Journal",
    "JournalReport",
    "KeyTerms",
    "Outcomes",
    "PostgresJournal",
    "ReconciliationRecord",
    "SQLiteJournal",
    "StoredResponse",
    "default_journal_path",
    "open_journal",
    "owner_is_dead",
]


def owner_is_dead(owner: str | None) -> bool:
    """Whether the worker a lease names (``IntentRecord.lease_owner``) is provably gone.

    True only for a process of this host (same boot, same PID namespace) that has exited or
    whose pid now belongs to another process: its lease blocks no one, though it has not
    run out. False for a live worker, for no owner, and for a worker on another host or in
    another container, whose liveness this process cannot tell: its lease runs to expiry.
    """
    return _owner_is_dead(owner)


def __getattr__(name: str) -> Any:
    # PostgresJournal imports psycopg: only for those who ask for it.
    if name == "PostgresJournal":
        return postgres_journal_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
