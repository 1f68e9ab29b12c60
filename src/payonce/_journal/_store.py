"""The private ``IntentStore``: the journal as the clients and the webhook inbox write it.

Every write here acts on one intent (or webhook event) and applies what the caller has
decided; those that take ``owner`` act only while that owner holds the lease and raise
``IntentInFlight`` otherwise, so a worker whose lease was taken over can never settle or
resend an intent behind the new holder's back. Users see the public ``Journal`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .._lifecycle import Transition
from ._inbox import EventJournal
from ._records import Claim, IntentDraft, IntentRecord, StoredResponse

__all__ = ["IntentStore"]


@runtime_checkable
class IntentStore(EventJournal, Protocol):
    """The public ``Journal`` plus every write the clients and the inbox make."""

    def claim(
        self,
        draft: IntentDraft,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        is_stale: Callable[[str], bool] = ...,
    ) -> Claim:
        """Find or create the intent and try to take its lease.

        A live lease is respected unless ``is_stale`` judges its owner dead (by default,
        ``owner_is_dead``); the take-over is atomic with that judgement.

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
        is_stale: Callable[[str], bool] = ...,
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
        is_stale: Callable[[str], bool] = ...,
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
        transition: Transition,
        owner: str,
        now: float,
        status_code: int | None,
        error: str | None,
    ) -> None:
        """Apply a transition that ends an attempt (and, for some, releases the lease)."""
        ...

    def settle(
        self,
        key: str,
        *,
        transition: Transition,
        owner: str,
        now: float,
        response: StoredResponse,
        attempt: int,
    ) -> IntentRecord:
        """End the attempt, store the definitive answer and release the lease, at once."""
        ...

    def mark_unknown(
        self, key: str, *, transition: Transition, owner: str, now: float, reason: str
    ) -> IntentRecord: ...

    def release(self, key: str, *, owner: str) -> None:
        """Give the lease up, leaving the intent pending."""
        ...

    def reconciled(
        self,
        key: str,
        *,
        transition: Transition,
        owner: str,
        now: float,
        outcome: str,
        detail: str,
        status_code: int | None,
        response: StoredResponse | None = None,
    ) -> IntentRecord:
        """Journal one reconciliation and the state it leads to, and release the lease."""
        ...
