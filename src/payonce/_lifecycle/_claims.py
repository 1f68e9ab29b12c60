"""What a claim amounts to: send, replay, wait or refuse an intent; run an event's handler."""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from ._leases import lease_blocks
from ._records import IntentDraft, IntentRecord
from ._states import IntentState

__all__ = [
    "Claim",
    "ClaimKind",
    "EventClaimKind",
    "decide_claim",
    "decide_event_claim",
    "is_mismatch",
]


class ClaimKind(enum.Enum):
    """What a claim of an intent amounts to."""

    CREATED = "created"
    """New intent journaled, lease held, attempt 1 started: send now."""
    CLAIMED = "claimed"
    """Existing pending intent, lease now held by the caller."""
    FINAL = "final"
    """Already settled: replay the stored outcome."""
    UNKNOWN = "unknown"
    """Outcome unknown: must be reconciled, never resent blindly."""
    LEASED = "leased"
    """Another worker holds a live lease on it."""
    MISMATCH = "mismatch"
    """Same intent, different request (or a supplied key bound to another intent)."""


@attrs.frozen
class Claim:
    """What a claim came to, the intent's record, and the attempt it opened (if it did)."""

    kind: ClaimKind
    record: IntentRecord
    attempt_number: int | None = None


def is_mismatch(record: IntentRecord, draft: IntentDraft) -> bool:
    """The stored intent is not the one the draft describes: refuse before sending."""
    return (
        record.fingerprint != draft.fingerprint
        or record.scope != draft.scope
        or (draft.key_supplied and record.key != draft.key)
    )


def decide_claim(
    record: IntentRecord,
    *,
    owner: str,
    now: float,
    unknown: bool = False,
    is_stale: Callable[[str], bool],
    lease_seconds: float | None = None,
) -> ClaimKind | None:
    """What a claim of an existing intent amounts to; None when its lease may be taken.

    ``unknown`` lets reconciliation take an ``unknown`` intent's lease to look it up.
    """
    if record.state.is_final:
        return ClaimKind.FINAL
    if record.state is IntentState.UNKNOWN and not unknown:
        return ClaimKind.UNKNOWN
    if lease_blocks(
        record.lease_owner,
        record.lease_expires_at,
        owner=owner,
        now=now,
        is_stale=is_stale,
        lease_seconds=lease_seconds,
    ):
        return ClaimKind.LEASED
    return None


class EventClaimKind(enum.Enum):
    """What a delivery of a webhook event amounts to."""

    NEW = "new"
    """First delivery: recorded, lease held by the caller: run the handler."""
    RETRY = "retry"
    """Seen before but never processed (its handler failed or its worker died): lease now
    held by the caller: run the handler."""
    DONE = "done"
    """Processed already: a duplicate, do not run the handler."""
    LEASED = "leased"
    """Another live worker is running the handler right now."""


def decide_event_claim(
    *,
    processed: bool,
    lease_owner: str | None,
    lease_expires_at: float | None,
    owner: str,
    now: float,
    is_stale: Callable[[str], bool],
    lease_seconds: float | None = None,
) -> EventClaimKind:
    """What a later delivery of an event already recorded amounts to (the first one is
    ``NEW``): a duplicate once processed, a wait while a live worker not provably dead holds
    its lease, else its handler runs again under ``owner``'s lease (``RETRY``)."""
    if processed:
        return EventClaimKind.DONE
    if lease_blocks(
        lease_owner,
        lease_expires_at,
        owner=owner,
        now=now,
        is_stale=is_stale,
        lease_seconds=lease_seconds,
    ):
        return EventClaimKind.LEASED
    return EventClaimKind.RETRY
