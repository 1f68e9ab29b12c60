"""Which outcomes are retried, how long to wait, and when to stop.

tenacity drives the loop; this module holds the decisions, free of I/O, so the sync and
async clients share them.
"""

from __future__ import annotations

import email.utils
import enum
import random
import time
from typing import TYPE_CHECKING

import attrs
import httpx

if TYPE_CHECKING:
    from ._providers import ProviderProfile

__all__ = ["Outcome", "RetryPolicy", "Verdict", "classify_error", "classify_response"]


@attrs.frozen
class RetryPolicy:
    """How hard payonce tries before it gives up on an attempt loop.

    Waits grow exponentially with full jitter (a random wait between 0 and the capped
    exponential), so many clients recovering at once do not retry in lockstep. A
    ``Retry-After`` from the provider replaces the computed wait, capped by
    ``max_retry_after``.
    """

    max_attempts: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    max_elapsed: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    """Seconds from the first attempt after which no new attempt is started."""
    initial_wait: float = attrs.field(default=0.25, validator=attrs.validators.ge(0))
    max_wait: float = attrs.field(default=8.0, validator=attrs.validators.ge(0))
    multiplier: float = attrs.field(default=2.0, validator=attrs.validators.ge(1))
    max_retry_after: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))
    jitter: bool = True

    def backoff(self, retry_number: int, rng: random.Random | None = None) -> float:
        """The wait before retry number ``retry_number`` (1 for the first retry)."""
        ceiling = min(self.max_wait, self.initial_wait * self.multiplier ** (retry_number - 1))
        if not self.jitter:
            return ceiling
        return (rng or random).uniform(0.0, ceiling)

    def wait(self, retry_number: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        return self.backoff(retry_number)


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"
    """2xx: definitive; stored and replayed."""
    FAILED = "failed"
    """Non-retryable 4xx: definitive; stored and replayed."""
    MISMATCH = "mismatch"
    """The provider says this key was used with another request: definitive."""
    RETRY = "retry"
    """Transient; try again under the same key."""


@attrs.frozen
class Verdict:
    outcome: Outcome
    ambiguous: bool
    """True when the provider may have executed the request despite the failure."""
    retry_after: float | None = None
    reason: str = ""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(seconds, 0.0)


def classify_response(response: httpx.Response, profile: ProviderProfile) -> Verdict:
    refined = profile.refine(response)
    if refined is not None:
        return refined
    status = response.status_code
    hint = profile.should_retry_hint(response)
    if 200 <= status < 300:
        return Verdict(Outcome.SUCCEEDED, ambiguous=False, reason=f"HTTP {status}")
    if hint is False:
        return Verdict(Outcome.FAILED, ambiguous=False, reason=f"HTTP {status} (do not retry)")
    if status in profile.mismatch_statuses:
        return Verdict(Outcome.MISMATCH, ambiguous=False, reason=f"HTTP {status} key mismatch")
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    if status in profile.in_flight_statuses:
        # Another request with our key is executing at the provider: it may well succeed.
        return Verdict(
            Outcome.RETRY,
            ambiguous=True,
            retry_after=retry_after,
            reason=f"HTTP {status} in flight",
        )
    if status in profile.not_executed_statuses:
        return Verdict(
            Outcome.RETRY, ambiguous=False, retry_after=retry_after, reason=f"HTTP {status}"
        )
    if status in profile.retryable_statuses or hint is True:
        # A 5xx may come after the provider executed the payment (a lost success).
        return Verdict(
            Outcome.RETRY, ambiguous=True, retry_after=retry_after, reason=f"HTTP {status}"
        )
    if 300 <= status < 500:
        return Verdict(Outcome.FAILED, ambiguous=False, reason=f"HTTP {status}")
    return Verdict(Outcome.RETRY, ambiguous=True, retry_after=retry_after, reason=f"HTTP {status}")


# Failures that happen before a byte of the request is written: the request never left.
_NEVER_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)
_AMBIGUOUS: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


def classify_error(error: BaseException) -> Verdict | None:
    """A verdict for a transport error, or None when it is not a transport failure."""
    name = type(error).__name__
    if isinstance(error, _NEVER_SENT):
        return Verdict(Outcome.RETRY, ambiguous=False, reason=f"{name} (request not sent)")
    if isinstance(error, _AMBIGUOUS):
        return Verdict(Outcome.RETRY, ambiguous=True, reason=name)
    return None
