"""How long to wait between attempts, and when to stop.

tenacity drives the loop; which outcomes are retried is decided in ``_lifecycle``.
"""

from __future__ import annotations

import random

import attrs

# Re-exported while the journal and profile modules are reorganised.
from ._lifecycle import Outcome, Verdict, classify_error, classify_response, parse_retry_after

__all__ = [
    "Outcome",
    "RetryPolicy",
    "Verdict",
    "classify_error",
    "classify_response",
    "parse_retry_after",
]


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
