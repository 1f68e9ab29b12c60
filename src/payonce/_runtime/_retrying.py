"""How hard payonce retries, and the tenacity settings both clients' loops share."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import attrs
import tenacity

from .._lifecycle import Verdict
from ._events import RetryEvent
from ._options import check_count, number_field

__all__ = ["Retry", "RetryEvent", "RetryPolicy", "retrying_kwargs"]

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


def retrying_kwargs(
    policy: RetryPolicy,
    *,
    event: Callable[[int, float, Verdict], RetryEvent] | None = None,
    on_retry: Callable[[RetryEvent], None] | None = None,
) -> dict[str, Any]:
    """tenacity settings for one loop. ``event`` builds the ``RetryEvent`` of an intent's
    retry (None for a status look-up, which has no retry events)."""

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

    return {
        "stop": tenacity.stop_after_attempt(policy.max_attempts)
        | tenacity.stop_before_delay(policy.max_elapsed),
        "wait": wait,
        "retry": tenacity.retry_if_exception_type(Retry),
        "before_sleep": before_sleep,
        "reraise": True,
    }
