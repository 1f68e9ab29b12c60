"""Whether a resend under an intent's key can still not execute twice.

A provider remembers a key for its profile's ``key_lifetime``; past it the same key is a
new request. payonce stops resending at 90% of that lifetime, so a clock a little off or a
provider a little early never turns a retry into a second payment. An intent none of whose
attempts may have reached the provider may be sent at any age: the provider never saw it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

__all__ = [
    "CLOCK_TOLERANCE",
    "KEY_LIFETIME_MARGIN",
    "PRUNE_AFTER_KEY_LIFETIMES",
    "AttemptLike",
    "may_have_executed",
    "resend_refusal",
]

KEY_LIFETIME_MARGIN = 0.1
"""Resend only while the first attempt is younger than 90% of the provider's key lifetime."""
PRUNE_AFTER_KEY_LIFETIMES = 2.0
"""An intent younger than this many of its provider's key lifetimes is never pruned: a
caller retrying the business operation that late must still find it, or pay again."""
CLOCK_TOLERANCE = 60.0
"""Seconds by which the clocks of the hosts sharing a journal may disagree. A first attempt
dated further in the future means the clock moved back or the record is foreign."""


class AttemptLike(Protocol):
    @property
    def in_flight(self) -> bool: ...

    @property
    def ambiguous(self) -> bool | None: ...


def may_have_executed(attempts: Iterable[AttemptLike]) -> bool:
    """Whether any attempt may have reached the provider: ambiguous, or still in flight
    (its worker died before journaling how it ended)."""
    return any(attempt.in_flight or attempt.ambiguous for attempt in attempts)


def resend_refusal(
    first_sent_at: float | None, now: float, key_lifetime: float, *, executed: bool = True
) -> str | None:
    """Why a resend under the key is no longer safe, or None while it still is.

    ``executed``: whether an attempt may have reached the provider. The key's age matters
    only then; a first attempt dated in the future is refused either way, since nothing
    about such a record can be trusted.
    """
    if first_sent_at is None:
        return None
    age = now - first_sent_at
    if age < -CLOCK_TOLERANCE:
        return (
            f"its first attempt is dated {-age:.0f}s in the future: this host's clock moved "
            "back, or the record is not this journal's own; a resend could execute twice"
        )
    if not executed or age < key_lifetime * (1 - KEY_LIFETIME_MARGIN):
        return None
    return (
        f"first sent {age:.0f}s ago, beyond the provider's key lifetime of "
        f"{key_lifetime:.0f}s; a resend could execute twice"
    )
