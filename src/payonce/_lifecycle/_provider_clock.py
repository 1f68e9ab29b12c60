"""The provider's clock, as its answers tell it.

A provider forgets a key by its own clock, so that is the clock a key's age is judged by
(``_key_age``). Every answer says what time it is there: its ``Date`` header (RFC 9110
requires one of every origin server that has a clock; one-second resolution). The drive
reads it from each answer, journals it with the attempt the answer ended, and keeps the
latest one as a ``Reading``: the provider's time and this host's monotonic clock at that
moment. A reading is carried forward by the monotonic clock, which no step of the wall clock
moves, for ``READING_FRESH`` seconds; after that it is stale, and the drive asks the
provider again (``ReadClock``) before it trusts a key's age.
"""

from __future__ import annotations

import email.utils
import functools
import math
from datetime import UTC

import attrs
import httpx

__all__ = ["EARLIEST_DATE", "READING_FRESH", "ProviderClock", "Reading", "provider_date"]

READING_FRESH = 60.0
"""Seconds a reading of the provider's clock is carried forward by this host's monotonic
clock. Short: a monotonic clock does not count a suspended host or a paused VM, and a
reading a minute old costs one small request to renew."""

EARLIEST_DATE = 946_684_800.0
"""2000-01-01: a ``Date`` before it is not a clock anyone keeps keys by (a server without a
real-time clock counting from 1970); it is ignored."""


def provider_date(response: httpx.Response) -> float | None:
    """The provider's time, in epoch seconds, from an answer's ``Date``; None when it sent
    none, or one that does not parse as an HTTP-date, or an absurd one. An answer a cache
    kept says how long it was kept (``Age``, RFC 9111): its ``Date`` is that much old."""
    date = _parsed(response.headers.get("date"))
    if date is None:
        return None
    return date + _age(response.headers.get("age"))


def _age(value: str | None) -> float:
    try:
        age = int(value) if value else 0
    except ValueError:
        return 0.0
    return float(age) if age > 0 else 0.0


@functools.lru_cache(maxsize=16)
def _parsed(value: str | None) -> float | None:
    # Cached: answers within one second carry the very same string.
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, with no claim about local time
        when = when.replace(tzinfo=UTC)
    seconds = when.timestamp()
    if not math.isfinite(seconds) or seconds < EARLIEST_DATE:
        return None
    return seconds


@attrs.frozen
class Reading:
    """The provider's time in one answer, and this host's monotonic clock when it came."""

    provider: float
    monotonic: float

    def carried_to(self, monotonic: float) -> float:
        """The provider's time now, carried forward from the reading."""
        return self.provider + max(0.0, monotonic - self.monotonic)


class ProviderClock:
    """What one client knows of its provider's clock: the latest reading, shared by all its
    drives (a reading replaces another whole, so threads need no lock)."""

    __slots__ = ("latest",)

    def __init__(self) -> None:
        self.latest: Reading | None = None

    def read(self, date: float | None, monotonic: float) -> None:
        """Take in an answer's ``Date`` (None: it had none), come at ``monotonic``."""
        if date is not None:
            self.latest = Reading(date, monotonic)

    def now(self, monotonic: float) -> float | None:
        """The provider's time now, from a reading at most ``READING_FRESH`` seconds old;
        None without one."""
        latest = self.latest
        if latest is None or not 0.0 <= monotonic - latest.monotonic <= READING_FRESH:
            return None
        return latest.carried_to(monotonic)
