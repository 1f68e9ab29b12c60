"""Leases: who may send an intent (or run a webhook event's handler) right now.

One rule for intents and webhook events alike. A lease is held by an owner until it
expires; the holder renews it while its attempt (or handler) runs. Another worker may take
it when it is free, expired, its own, or held by an owner that is provably dead.

Whether an owner is dead is the operating system's to say (``payonce._owners``): it comes
in here as ``is_stale``, a question asked only when the answer matters, as the time comes
in as ``now``. How long a lease lasts by default is decided here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ._key_age import CLOCK_TOLERANCE

__all__ = [
    "EVENT_LEASE_SECONDS",
    "LEASE_MARGIN",
    "abandon_blocked",
    "default_lease_seconds",
    "lease_blocks",
    "lease_live",
]

LEASE_MARGIN: Final = 30.0
"""Seconds an intent's default lease adds to the longest its holder may go without renewing
it (two stalled waits and the longest pause between attempts)."""

EVENT_LEASE_SECONDS: Final = 60.0
"""A webhook event's lease by default: renewed while its handler runs."""


def default_lease_seconds(*, slowest_wait: float, longest_pause: float) -> float:
    """An intent's lease when the caller names none: renewed while an attempt runs, it must
    still outlast a stall of the renewer (two of the slowest network waits) and the longest
    pause between attempts (backoff or Retry-After), with a margin."""
    return 2 * slowest_wait + longest_pause + LEASE_MARGIN


def lease_live(lease_owner: str | None, lease_expires_at: float | None, now: float) -> bool:
    """Whether a lease is held and not yet expired."""
    return lease_owner is not None and lease_expires_at is not None and lease_expires_at > now


def lease_blocks(
    lease_owner: str | None,
    lease_expires_at: float | None,
    *,
    owner: str,
    now: float,
    is_stale: Callable[[str], bool],
    lease_seconds: float | None = None,
) -> bool:
    """Whether the lease keeps ``owner`` from taking the intent or event now: it is live,
    held by someone else, and that holder is not provably dead (``is_stale``, asked only
    about a live lease of someone else's).

    With ``lease_seconds`` (the asking worker's lease length), a lease that expires further
    ahead than any honest worker would write (twice that length, plus the clock tolerance)
    blocks no one: it was written by a broken clock or by hand, and a dead worker's
    year-long lease would otherwise hold the intent for a year.
    """
    if lease_owner is None or lease_owner == owner:
        return False
    if not lease_live(lease_owner, lease_expires_at, now):
        return False
    assert lease_expires_at is not None
    if lease_seconds is not None and lease_expires_at > now + 2 * lease_seconds + CLOCK_TOLERANCE:
        return False
    return not is_stale(lease_owner)


def abandon_blocked(
    lease_owner: str | None,
    lease_expires_at: float | None,
    *,
    now: float,
    is_stale: Callable[[str], bool],
) -> bool:
    """Whether a lease keeps an operator from abandoning the intent now: a worker that is
    not provably dead holds a live one, and may be sending it this very moment.

    An operator holds no lease of their own, and knows no lease length: any live lease
    counts, however far ahead it runs (an operator may wait, a resend may not be undone).
    """
    return lease_blocks(lease_owner, lease_expires_at, owner="", now=now, is_stale=is_stale)
