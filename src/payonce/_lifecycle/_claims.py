"""What asking for an intent amounts to: send it, replay it, wait, or refuse."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from ._leases import lease_blocks, owner_is_dead
from ._states import IntentState

__all__ = ["ClaimKind", "decide_claim", "is_mismatch"]


class ClaimKind(enum.Enum):
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


class _Stored(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def state(self) -> IntentState: ...
    @property
    def lease_owner(self) -> str | None: ...
    @property
    def lease_expires_at(self) -> float | None: ...


class _Asked(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def key_supplied(self) -> bool: ...
    @property
    def scope(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...


def is_mismatch(record: _Stored, draft: _Asked) -> bool:
    """The stored intent is not the one the draft describes: refuse before sending."""
    return (
        record.fingerprint != draft.fingerprint
        or record.scope != draft.scope
        or (draft.key_supplied and record.key != draft.key)
    )


def decide_claim(
    record: _Stored,
    *,
    owner: str,
    now: float,
    unknown: bool = False,
    is_stale: Callable[[str], bool] = owner_is_dead,
) -> ClaimKind | None:
    """What a claim of an existing intent amounts to; None when its lease may be taken.

    ``unknown`` lets reconciliation take an ``unknown`` intent's lease to look it up.
    """
    if record.state.is_final:
        return ClaimKind.FINAL
    if record.state is IntentState.UNKNOWN and not unknown:
        return ClaimKind.UNKNOWN
    if lease_blocks(
        record.lease_owner, record.lease_expires_at, owner=owner, now=now, is_stale=is_stale
    ):
        return ClaimKind.LEASED
    return None
