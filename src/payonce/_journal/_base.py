"""The Journal interface every backend implements."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from .._intent import IntentState
from ._records import (
    AttemptRecord,
    Claim,
    IntentDraft,
    IntentRecord,
    JournalReport,
    ReconciliationRecord,
    StoredResponse,
)

__all__ = ["Journal"]


@runtime_checkable
class Journal(Protocol):
    """The durable store of intents and attempts.

    Every method is atomic. Methods that take ``owner`` act only while that owner holds the
    intent's lease and raise ``IntentInFlight`` otherwise, so a worker whose lease was taken
    over can never settle or resend an intent behind the new holder's back.
    """

    @property
    def location(self) -> str:
        """Where the journal lives (a path or a URL without credentials)."""
        ...

    def claim(
        self,
        draft: IntentDraft,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        stale_owner: str | None = None,
    ) -> Claim:
        """Find or create the intent and try to take its lease.

        A live lease is respected unless it belongs to ``stale_owner`` (a worker known to
        be dead), checked atomically with the take-over.

        A new intent is written together with its first attempt's start, durably (fsync),
        before this returns: this is the write-ahead record.
        """
        ...

    def claim_key(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        unknown: bool = False,
        stale_owner: str | None = None,
    ) -> Claim | None:
        """Take the lease of an existing intent by key (None if there is none).

        ``unknown=True`` lets reconciliation claim an ``unknown`` intent too.
        """
        ...

    def claim_next_pending(
        self,
        *,
        account: str,
        provider: str,
        owner: str,
        now: float,
        lease_seconds: float,
        after: tuple[float, str] | None = None,
        is_stale: Callable[[str], bool] | None = None,
    ) -> Claim | None:
        """Lease the oldest pending intent of this account and provider no live worker holds.

        For resume workers on many hosts: rows another worker is claiming at this instant
        are skipped, not waited for. ``after`` is the ``(created_at, key)`` of the intent
        handled last, so a pass meets each intent once even when it leaves it pending. A
        lease whose owner ``is_stale`` judges dead counts as free. None when none is left.
        """
        ...

    def renew_lease(self, key: str, *, owner: str, now: float, lease_seconds: float) -> bool:
        """Extend a lease the owner still holds; False when it was lost."""
        ...

    def start_attempt(self, key: str, *, owner: str, now: float, lease_seconds: float) -> int:
        """Durably record that a new attempt is about to be sent; returns its number."""
        ...

    def end_attempt(
        self,
        key: str,
        number: int,
        *,
        owner: str,
        now: float,
        status_code: int | None,
        error: str | None,
        ambiguous: bool,
    ) -> None: ...

    def settle(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        state: IntentState,
        response: StoredResponse,
        attempt: int,
    ) -> IntentRecord:
        """End the attempt, store the definitive answer and release the lease, at once."""
        ...

    def mark_unknown(self, key: str, *, owner: str, now: float, reason: str) -> IntentRecord: ...

    def release(self, key: str, *, owner: str) -> None:
        """Give the lease up, leaving the intent pending."""
        ...

    def reconciled(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        outcome: str,
        detail: str,
        status_code: int | None,
        state: IntentState,
        response: StoredResponse | None = None,
    ) -> IntentRecord:
        """Journal one reconciliation and the state it leads to, and release the lease."""
        ...

    def reconciliations(self, key: str) -> Sequence[ReconciliationRecord]: ...

    def abandon(self, key: str, *, reason: str, now: float) -> IntentRecord:
        """Close a pending or unknown intent for good: kept, never resent."""
        ...

    def acknowledge(self, key: str, *, now: float) -> IntentRecord:
        """The caller has recorded this settled outcome on its side (client-side outbox)."""
        ...

    def pending(
        self, *, account: str, provider: str, limit: int | None = None
    ) -> list[IntentRecord]:
        """Pending intents of this account and provider, oldest first, leased or not."""
        ...

    def unacknowledged(self, *, account: str | None = None) -> list[IntentRecord]:
        """Settled intents whose outcome the caller has not acknowledged yet."""
        ...

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

    def check(self) -> JournalReport:
        """Integrity, schema version and what the journal holds, read at one instant."""
        ...

    def close(self) -> None: ...
