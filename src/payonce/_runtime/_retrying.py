"""How hard payonce retries: ``RetryPolicy``, whose ``next_wait`` every drive asks after a
retryable outcome (the waits are the policy's, the stop rule is tenacity's).

No retry loop is built: the drive decides, the executor sleeps. Most intents succeed at
once and never ask.
"""

from __future__ import annotations

import functools
import random
from typing import cast

import attrs
import tenacity

from ._events import RetryEvent
from ._options import check_count, number_field

__all__ = ["RetryEvent", "RetryPolicy"]


def _count_at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    check_count(attribute.name, value, minimum=1)


@attrs.frozen
class RetryPolicy:
    """How hard payonce tries before it gives up on an attempt loop.

    Waits grow exponentially with full jitter (a random wait between 0 and the capped
    exponential), so many clients recovering at once do not retry in lockstep. A
    ``Retry-After`` from the provider replaces the computed wait, capped by
    ``max_retry_after``. Every number must be finite and not negative: anything else is
    a ``ConfigurationError`` here, at construction.
    """

    max_attempts: int = attrs.field(default=5, validator=_count_at_least_one)
    max_elapsed: float = number_field(60.0, above=True)
    """Seconds from the first attempt after which no new attempt is started."""
    initial_wait: float = number_field(0.25)
    max_wait: float = number_field(8.0)
    multiplier: float = number_field(2.0, minimum=1.0)
    max_retry_after: float = number_field(30.0)
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

    def next_wait(self, tried: int, elapsed: float, retry_after: float | None) -> float | None:
        """After ``tried`` attempts that failed in a retryable way, ``elapsed`` seconds since
        the first one started: the wait before the next, or None once the attempts are
        over. tenacity's own stop rules decide (``stop_after_attempt | stop_before_delay``):
        no attempt starts past ``max_elapsed``."""
        wait = self.wait(tried, retry_after)
        state = _Tried(attempt_number=tried, seconds_since_start=elapsed, upcoming_sleep=wait)
        return None if self._stop(cast(tenacity.RetryCallState, state)) else wait

    @functools.cached_property
    def _stop(self) -> tenacity.stop.stop_base:
        return tenacity.stop_after_attempt(self.max_attempts) | tenacity.stop_before_delay(
            self.max_elapsed
        )


@attrs.frozen
class _Tried:
    """What tenacity's stop rules read of a retry state, as a drive knows it."""

    attempt_number: int
    seconds_since_start: float
    upcoming_sleep: float
