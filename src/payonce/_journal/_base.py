"""The public ``Journal``: what an operator, the CLI and a user's own code may do with one.

Reads (of intents and of webhook events), and the operator's commands: abandon,
acknowledge, prune, check, back up. Writing intents and events (claims, leases, attempts,
outcomes) is the clients' and the inbox's alone, through the private ``IntentStore``
(``_store``), so that no one settles an intent behind a lease's back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._lifecycle import IntentState
from ._records import AttemptRecord, IntentRecord, JournalReport, ReconciliationRecord

if TYPE_CHECKING:
    from ._inbox import EventRecord

__all__ = ["Journal"]


@runtime_checkable
class Journal(Protocol):
    """The durable store of intents and attempts, as its readers and operators see it.

    Every method is atomic. ``SQLiteJournal`` and ``PostgresJournal`` implement it, and
    ``payonce.open_journal`` opens either.
    """

    @property
    def location(self) -> str:
        """Where the journal lives (a path or a URL without credentials)."""
        ...

    # -- reading -----------------------------------------------------------------------------

    def get(self, key: str) -> IntentRecord | None: ...

    def find(self, key_or_reference: str) -> list[IntentRecord]:
        """Intents whose key or caller reference is exactly this string."""
        ...

    def list_intents(
        self, *, states: Iterable[IntentState] | None = None, limit: int | None = None
    ) -> list[IntentRecord]:
        """Newest first."""
        ...

    def attempts(self, key: str) -> Sequence[AttemptRecord]: ...

    def reconciliations(self, key: str) -> Sequence[ReconciliationRecord]: ...

    def pending(
        self, *, account: str, provider: str, limit: int | None = None
    ) -> list[IntentRecord]:
        """Pending intents of this account and provider, oldest first, leased or not."""
        ...

    def unacknowledged(self, *, account: str | None = None) -> list[IntentRecord]:
        """Settled intents whose outcome the caller has not acknowledged yet."""
        ...

    def get_event(self, endpoint: str, event_id: str) -> EventRecord | None:
        """What the webhook inbox knows of one event."""
        ...

    def list_events(
        self,
        *,
        endpoint: str | None = None,
        unprocessed: bool = False,
        limit: int | None = None,
    ) -> list[EventRecord]:
        """Webhook events, first received first; ``unprocessed`` keeps those still to handle."""
        ...

    # -- operating ---------------------------------------------------------------------------

    def abandon(self, key: str, *, reason: str, now: float) -> IntentRecord:
        """Close a pending or unknown intent for good: kept, never resent."""
        ...

    def acknowledge(self, key: str, *, now: float) -> IntentRecord:
        """The caller has recorded this settled outcome on its side (client-side outbox)."""
        ...

    def prune(
        self,
        *,
        older_than: float,
        batch_size: int = 1000,
        dry_run: bool = False,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Delete final intents nothing has touched since ``older_than`` (a timestamp).

        Only acknowledged succeeded and failed intents and abandoned ones go; returns how
        many (with ``dry_run``: would). See ``SQLiteJournal.prune``.
        """
        ...

    def prune_events(self, *, processed_before: float) -> int:
        """Forget webhook events processed before this time; returns how many."""
        ...

    def check(self) -> JournalReport:
        """Integrity, schema version and what the journal holds, read at one instant."""
        ...

    def backup(self, destination: str | os.PathLike[str]) -> Path:
        """A consistent copy at ``destination``, a new file; ``JournalError`` where the
        journal's own database tools must do it (PostgreSQL: ``pg_dump``)."""
        ...

    def close(self) -> None: ...
