"""Verify before resend: after an attempt that may have executed, ask the provider first.

Not every server guards a retry that arrives while the first attempt still runs: one that
does not executes both. So, for a profile whose status look-up is consistent, an ambiguous
attempt is followed by look-ups, never directly by a resend:

- the provider has the record: the intent settles from it, and nothing is sent;
- it has none: ask again, with backoff, until the earlier attempt can no longer be running
  (``max_processing`` after it ended, or after it started if its worker died); a look-up
  made from then on that still finds nothing lets the intent be resent, under its key;
- anything else (a record not final yet, an unreadable or refused answer): ask again;
  never resend on it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Protocol

import attrs

from ._key_age import AttemptLike
from ._verdicts import LookupKind

__all__ = ["LOOK_UP", "LookUp", "Verification", "quiet_after"]


class LookUp(enum.Enum):
    LOOK_UP = "look up"


LOOK_UP = LookUp.LOOK_UP
"""``Verification.next``'s answer when the provider must be asked now."""


class _Timed(AttemptLike, Protocol):
    @property
    def started_at(self) -> float: ...

    @property
    def ended_at(self) -> float | None: ...


def quiet_after(attempts: Iterable[_Timed], max_processing: float) -> float | None:
    """When the latest attempt that may have executed can no longer be running at the
    provider; None when none may have."""
    times = [a.ended_at or a.started_at for a in attempts if a.in_flight or a.ambiguous]
    return max(times) + max_processing if times else None


@attrs.define
class Verification:
    """One intent's verification in progress: when to ask, and whether it may resend."""

    until: float
    """From then on, a look-up that finds nothing proves nothing is running."""
    next_at: float = 0.0
    asked: int = 0
    absent_at: float | None = None
    """When the latest look-up found no record (None: it found something, or none yet)."""

    def next(self, now: float) -> float | LookUp | None:
        """None: resend now; a number: wait that many seconds; ``LOOK_UP``: ask now."""
        if self.absent_at is not None and self.absent_at >= self.until:
            return None
        if now < self.next_at:
            return self.next_at - now
        return LOOK_UP

    def answered(self, kind: LookupKind, now: float, backoff: float) -> None:
        """Take in a look-up's verdict (anything but ``FOUND``, which settles the intent)."""
        self.asked += 1
        if kind is LookupKind.ABSENT:
            self.absent_at = now
            # Once more at the moment the earlier attempt can no longer run, not later.
            self.next_at = min(now + backoff, self.until) if now < self.until else now
        else:
            self.absent_at = None
            self.next_at = now + backoff
