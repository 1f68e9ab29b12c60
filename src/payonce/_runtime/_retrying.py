"""How hard payonce retries, and the tenacity settings both clients' loops share.

An intent's first attempt runs outside tenacity: most intents succeed at once, and building
a ``tenacity.Retrying`` (its closures, its state machine) for them is pure cost. tenacity
takes over from the first retryable outcome (``FirstAttempt``), counting that attempt as
its own first one, so waits, events and limits are those of a loop that ran it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

import attrs
import tenacity

from .._lifecycle import Verdict
from ._events import RetryEvent
from ._options import check_count, number_field

__all__ = ["FirstAttempt", "Retry", "RetryEvent", "RetryPolicy", "retrying_kwargs"]

logger = logging.getLogger("payonce")


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


class Retry(Exception):
    """Internal: an attempt (or a look-up) ended in a retryable way. Raised out of the
    loop when the attempts ran out."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


class FirstAttempt:
    """An intent's first attempt, run before tenacity's loop and handed to it on failure.

    Both clients' loops read: run the attempt; on ``Retry``, ``failed(it)``, start
    tenacity with ``retrying_kwargs(..., began=first.began)`` and call ``replay()`` first
    in every attempt of it. tenacity's first attempt then ends at once with the first
    attempt's outcome, so it numbers the retries, waits and stops as if it had run it.
    """

    __slots__ = ("_failure", "began")

    def __init__(self) -> None:
        self.began = time.monotonic()
        """When the first attempt started: ``max_elapsed`` counts from here."""
        self._failure: Retry | None = None

    def failed(self, failure: Retry) -> None:
        self._failure = failure

    def replay(self) -> None:
        """In tenacity's first attempt, raise the first attempt's outcome; then nothing."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure


class _ElapsedSince(tenacity.stop.stop_base):
    """tenacity's ``stop_before_delay``, counted from ``began`` rather than from the start of
    tenacity's loop (which begins after the first attempt)."""

    def __init__(self, began: float, max_elapsed: float) -> None:
        self.began = began
        self.max_elapsed = max_elapsed

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        ended = retry_state.outcome_timestamp or time.monotonic()
        return ended - self.began + retry_state.upcoming_sleep >= self.max_elapsed


def retrying_kwargs(
    policy: RetryPolicy,
    *,
    event: Callable[[int, float, Verdict], RetryEvent] | None = None,
    on_retry: Callable[[RetryEvent], None] | None = None,
    began: float | None = None,
) -> dict[str, Any]:
    """tenacity settings for one loop. ``event`` builds the ``RetryEvent`` of an intent's
    retry (None for a status look-up, which has no retry events). ``began`` is when the
    loop's first attempt started, when it ran before tenacity's loop (``FirstAttempt``)."""

    def wait(state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        retry_after = error.verdict.retry_after if isinstance(error, Retry) else None
        return policy.wait(state.attempt_number, retry_after)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if not isinstance(error, Retry) or event is None:
            return
        seconds = state.next_action.sleep if state.next_action else 0.0
        retry = event(state.attempt_number, seconds, error.verdict)
        logger.debug(
            "intent %s: retrying in %.3fs after %s",
            retry.key,
            seconds,
            retry.reason,
            extra={"key": retry.key, "reference": retry.reference, "state": "pending"},
        )
        if on_retry is not None:
            on_retry(retry)

    elapsed: tenacity.stop.stop_base = (
        tenacity.stop_before_delay(policy.max_elapsed)
        if began is None
        else _ElapsedSince(began, policy.max_elapsed)
    )
    return {
        "stop": tenacity.stop_after_attempt(policy.max_attempts) | elapsed,
        "wait": wait,
        "retry": tenacity.retry_if_exception_type(Retry),
        "before_sleep": before_sleep,
        "reraise": True,
    }
