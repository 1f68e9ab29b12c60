"""How hard payonce retries, and the tenacity settings both clients' loops share.

An intent's first attempt runs outside tenacity: most intents succeed at once, and building
a ``tenacity.Retrying`` (its closures, its state machine) for them is pure cost. tenacity
takes over from the first retryable outcome (``Attempts``), counting that attempt as
its own first one, so waits, events and limits are those of a loop that ran it.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar, cast

import attrs
import tenacity

from .._lifecycle import Verdict
from ._events import RetryEvent
from ._options import check_count, number_field

__all__ = ["Attempts", "Retry", "RetryEvent", "RetryPolicy", "retrying_kwargs"]

logger = logging.getLogger("payonce")

S = TypeVar("S")


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


class Retry(Exception):
    """Internal: an attempt (or a look-up) ended in a retryable way. Raised out of the
    loop when the attempts ran out."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


class Attempts(Generic[S]):
    """An intent's attempts, iterated as a tenacity loop is: ``for attempt in Attempts(...):
    with attempt: return send()`` (``async for`` in ``AsyncClient``).

    The first attempt runs outside tenacity. On its first retryable outcome tenacity's loop
    is built (``settings(subject, began)``, then ``tenacity.Retrying`` or ``AsyncRetrying``)
    and its own first attempt ends at once with that outcome: tenacity numbers the retries,
    waits and stops as if it had run that attempt, and ``max_elapsed`` counts from ``began``.
    """

    __slots__ = ("_async_loop", "_failure", "_loop", "_settings", "_started", "_subject", "began")

    def __init__(self, settings: Callable[[S, float], dict[str, Any]], subject: S) -> None:
        self.began = time.monotonic()
        """When the first attempt started."""
        self._settings = settings
        self._subject = subject
        self._started = False
        self._failure: Retry | None = None
        # tenacity's loop, once the first attempt's outcome was retryable.
        self._loop: Iterator[tenacity.AttemptManager] | None = None
        self._async_loop: tenacity.AsyncRetrying | None = None

    def __iter__(self) -> Iterator[AbstractContextManager[None]]:
        return self

    def __next__(self) -> AbstractContextManager[None]:
        if self._loop is None:
            if self._first():
                return self
            self._loop = iter(tenacity.Retrying(**self._tenacity()))
            self._hand_over(next(self._loop))
        return next(self._loop)

    def __aiter__(self) -> AsyncIterator[AbstractContextManager[None]]:
        return self

    async def __anext__(self) -> AbstractContextManager[None]:
        # Not an async generator: one left at a ``return`` is closed by a task the event
        # loop schedules, a cost for every intent.
        if self._async_loop is None:
            if self._first():
                return self
            self._async_loop = tenacity.AsyncRetrying(**self._tenacity()).__aiter__()
            self._hand_over(await self._async_loop.__anext__())
        return await self._async_loop.__anext__()

    def _first(self) -> bool:
        """True the first time: the first attempt is the next one."""
        started, self._started = self._started, True
        return not started

    def _tenacity(self) -> dict[str, Any]:
        return self._settings(self._subject, self.began)

    def _hand_over(self, attempt: tenacity.AttemptManager) -> None:
        """tenacity's first attempt ends with the first attempt's outcome."""
        with attempt:
            if self._failure is not None:
                raise self._failure

    # The first attempt's block: a retryable outcome is kept for tenacity's loop.

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> bool:
        if isinstance(error, Retry):
            self._failure = error
            return True
        return False


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
    loop's first attempt started, when it ran before tenacity's loop (``Attempts``)."""

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
