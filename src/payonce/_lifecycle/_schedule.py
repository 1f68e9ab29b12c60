"""When the worker asks the provider about an unknown intent, and when it gives up.

A schedule per provider profile, in the shape payment switches use for their status
syncs (Hyperswitch's per-connector "start after, frequency, count"): the first look-up a
while after the intent went unknown (the provider may still be processing it, its search
index may lag), then look-ups at growing intervals, until a number of tries or a duration
is spent. Then the intent stays unknown and is **escalated**: a person must look.

Nothing here is stored: the schedule's state is derived from what the journal already
keeps, the intent's attempts (when it went unknown) and its reconciliations (the tries).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from ..errors import ConfigurationError
from ._key_age import CLOCK_TOLERANCE
from ._records import AttemptRecord, IntentRecord, ReconciliationRecord

__all__ = [
    "DEFAULT_RECONCILE_SCHEDULE",
    "ReconcileSchedule",
    "ScheduleDecision",
    "current_clock_since",
    "decide_lookup",
    "decide_resend",
    "first_unknown_since",
    "tries_since",
    "unknown_since",
]


def _seconds(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigurationError(
            f"ReconcileSchedule.{attribute.name} must be a finite number of seconds >= 0, "
            f"not {value!r}"
        )


def _positive_count(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"ReconcileSchedule.{attribute.name} must be a whole number >= 1, not {value!r}"
        )


def _factor(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 1
    ):
        raise ConfigurationError(
            f"ReconcileSchedule.{attribute.name} must be a number >= 1 (1: a fixed "
            f"interval), not {value!r}"
        )


@attrs.frozen
class ReconcileSchedule:
    """How ``payonce worker`` reconciles a provider's unknown intents.

    The first look-up ``first_after`` seconds after the intent went unknown; the next
    ``interval`` seconds after that, each later one ``backoff`` times further than the one
    before (at most ``max_interval``); no more than ``max_tries`` look-ups, none later than
    ``give_up_after`` seconds after the intent went unknown. Past that the intent is
    escalated: it stays unknown for a person to check (``payonce reconcile``, ``abandon``).
    """

    first_after: float = attrs.field(default=60.0, validator=_seconds)
    interval: float = attrs.field(default=300.0, validator=_seconds)
    backoff: float = attrs.field(default=2.0, validator=_factor)
    max_interval: float = attrs.field(default=6 * 3600.0, validator=_seconds)
    max_tries: int = attrs.field(default=8, validator=_positive_count)
    give_up_after: float = attrs.field(default=24 * 3600.0, validator=_seconds)

    def wait_before(self, tries: int) -> float:
        """Seconds between the look-up number ``tries`` (1-based) and the next one."""
        # Capped before it is raised to a power that could overflow a float.
        grown = self.interval * self.backoff ** min(tries - 1, 64)
        return min(grown, self.max_interval)


DEFAULT_RECONCILE_SCHEDULE = ReconcileSchedule()
"""A minute after, then 5, 10, 20 minutes... at most 8 look-ups within a day."""


@attrs.frozen
class ScheduleDecision:
    """What the schedule says of one unknown intent at one moment."""

    tries: int
    """Look-ups made since the intent went unknown."""
    due: bool
    """Look it up now."""
    next_at: float | None
    """When the next look-up is due (epoch seconds); None once the schedule is spent."""
    exhausted: bool
    """No look-up is left: escalate the intent (it stays unknown)."""


def unknown_since(record: IntentRecord, attempts: Iterable[AttemptRecord]) -> float:
    """When the intent went unknown, as far as the journal tells: the end of its last
    attempt (or that attempt's start when a crash left it without an end), else its
    creation. An intent that went back to pending and was sent again starts anew."""
    return max([record.created_at, *map(_ended, attempts)])


def _ended(attempt: AttemptRecord) -> float:
    """When an attempt ended: its start when a crash left it without an end."""
    return attempt.ended_at if attempt.ended_at is not None else attempt.started_at


def first_unknown_since(
    since: float,
    attempts: Iterable[AttemptRecord],
    reconciliations: Iterable[ReconciliationRecord],
) -> float:
    """When the intent first went unknown, ``since`` being when it last did: a look-up
    that found it never executed sends it back to pending, and sent again it may go
    unknown again (a provider refusing every request). Those cycles are one wait for the
    provider, and the schedule's give-up time counts from its start: the end of the last
    attempt before the first look-up."""
    looked_up = [r.at for r in reconciliations]
    if not looked_up:
        return since
    first_look = min(looked_up)
    before = [moment for moment in map(_ended, attempts) if moment <= first_look]
    return min(since, max(before)) if before else since


def tries_since(
    since: float,
    reconciliations: Iterable[ReconciliationRecord],
    *,
    current_since: float | None = None,
    now: float | None = None,
) -> list[float]:
    """When the look-ups since ``since`` were made (every outcome counts: an answer that
    told nothing, or no answer at all, is a try spent all the same), oldest first.

    ``since`` dated ahead of the clock now (``now``): the look-ups this clock made since
    ``current_since`` (``current_clock_since``) are tries of the same wait, dated before
    ``since`` though they came after it."""
    if now is None or since <= now + CLOCK_TOLERANCE:
        return sorted(r.at for r in reconciliations if r.at >= since)
    floor = -math.inf if current_since is None else current_since
    return sorted(r.at for r in reconciliations if r.at >= since or floor <= r.at)


def current_clock_since(
    record: IntentRecord, attempts: Iterable[AttemptRecord], now: float
) -> float | None:
    """For an intent whose history a clock ahead of this one dated (it went unknown at a
    time past ``now``): the latest moment of it dated by a clock in step with this one
    (its creation, an attempt's start or end), after which a look-up this clock dated
    belongs to the same wait. None when no moment of it is.

    A look-up dated before that moment was made before the intent's latest sends, in an
    earlier wait (one that sent it back to pending)."""
    moments = [record.created_at]
    for attempt in attempts:
        moments += [attempt.started_at, _ended(attempt)]
    in_step = [moment for moment in moments if moment <= now + CLOCK_TOLERANCE]
    return max(in_step, default=None)


def decide_lookup(
    schedule: ReconcileSchedule,
    *,
    since: float,
    tries: Sequence[float],
    now: float,
    can_look_up: bool = True,
    first_since: float | None = None,
    earlier_tries: int = 0,
) -> ScheduleDecision:
    """Whether an intent unknown since ``since``, looked up at ``tries``, is due now, when
    its next look-up is, and whether the schedule is spent. A profile without a status
    look-up (``can_look_up=False``) has nothing to wait for: escalated at once.

    An intent that went unknown before (``first_since``, ``earlier_tries`` look-ups made
    then), was found never executed and sent again is given up on ``give_up_after`` from
    the first time, and its first look-up of this time waits as the next of the earlier
    ones would have: a provider refusing every request is not asked about, then sent,
    again and again forever."""
    count = len(tries)
    if count >= schedule.max_tries or not can_look_up:
        return ScheduleDecision(count, due=False, next_at=None, exhausted=True)
    horizon = now + CLOCK_TOLERANCE
    if max([since, *tries]) > horizon:
        # Dated by a clock ahead of this one (the journal's moved back: a stepped server,
        # a failover to one whose clock differs): the schedule would wait, silently, for
        # that clock to come round. A look-up only reads, so one is due now; then the
        # schedule runs from the look-ups this clock made (every one counts as a try),
        # the first standing for when the intent went unknown: looked up on every pass,
        # it would spend its tries in minutes.
        current = [moment for moment in tries if moment <= horizon]
        if not current:
            return ScheduleDecision(count, due=True, next_at=now, exhausted=False)
        tries = current
        since = since if since <= horizon else min(current)
    cycled = first_since is not None and first_since < since
    if cycled and first_since is not None and now >= first_since + schedule.give_up_after:
        return ScheduleDecision(count, due=False, next_at=None, exhausted=True)
    if count == 0:
        wait = schedule.first_after
        if earlier_tries:
            wait = max(wait, schedule.wait_before(earlier_tries))
        next_at = since + wait
    else:
        next_at = max(tries) + schedule.wait_before(count)
    if next_at > since + schedule.give_up_after:
        # The next look-up would come after the schedule gave up; the first one always
        # comes, or an intent would be escalated without ever being asked about.
        if count > 0:
            return ScheduleDecision(count, due=False, next_at=None, exhausted=True)
        next_at = since + schedule.give_up_after
    return ScheduleDecision(count, due=next_at <= now, next_at=next_at, exhausted=False)


def decide_resend(
    schedule: ReconcileSchedule, *, resent_at: Sequence[float], window_passed: bool, now: float
) -> ScheduleDecision:
    """For ``payonce worker``, an unknown intent of a profile without a status look-up:
    resent under its key at once, then, while its resends fail (``resent_at``: when each
    was made since it last was settled or went pending), again with the schedule's backoff
    between them, for as long as the key window is open. Escalated once it has passed
    (``window_passed``: the journal holds the reconciliation that found it so), never for
    a resend that failed while the key was still surely remembered."""
    count = len(resent_at)
    if window_passed:
        return ScheduleDecision(count, due=False, next_at=None, exhausted=True)
    if not count:
        return ScheduleDecision(0, due=True, next_at=now, exhausted=False)
    next_at = max(resent_at) + schedule.wait_before(count)
    return ScheduleDecision(count, due=next_at <= now, next_at=next_at, exhausted=False)
