"""The worker's reconcile schedule, decided without I/O: when an unknown intent is looked
up, how the waits grow, and when the worker gives up and escalates it."""

from __future__ import annotations

import pytest

import payonce
from payonce._lifecycle import (
    AttemptRecord,
    IntentRecord,
    IntentState,
    ReconciliationRecord,
    ScheduleDecision,
    current_clock_since,
    decide_lookup,
    decide_resend,
    first_unknown_since,
    tries_since,
    unknown_since,
)
from payonce.providers import ReconcileSchedule, get_profile

T0 = 1_700_000_000.0
SCHEDULE = ReconcileSchedule(
    first_after=60, interval=300, backoff=2, max_interval=1000, max_tries=5, give_up_after=7200
)


def _decide(tries: list[float], now: float, **options: bool) -> ScheduleDecision:
    return decide_lookup(SCHEDULE, since=T0, tries=tries, now=now, **options)


def test_the_first_look_up_waits_first_after_the_intent_went_unknown() -> None:
    early = _decide([], now=T0 + 59)
    on_time = _decide([], now=T0 + 60)

    assert (early.due, early.next_at, early.exhausted) == (False, T0 + 60, False)
    assert (on_time.due, on_time.tries) == (True, 0)


def test_the_waits_grow_by_the_backoff_up_to_the_longest_interval() -> None:
    tries = [T0 + 60]
    waits = []
    for _ in range(3):
        decision = _decide(tries, now=tries[-1])
        assert not decision.due
        assert decision.next_at is not None
        waits.append(decision.next_at - tries[-1])
        tries.append(decision.next_at)

    assert waits == [300, 600, 1000]  # 1200 capped at max_interval
    assert _decide(tries[:2], now=tries[1] + 600).due


def test_the_schedule_is_spent_after_max_tries() -> None:
    tries = [T0 + 60, T0 + 360, T0 + 960, T0 + 1960, T0 + 2960]

    spent = _decide(tries, now=T0 + 3000)
    one_before = _decide(tries[:4], now=T0 + 2960)

    assert (spent.due, spent.next_at, spent.exhausted, spent.tries) == (False, None, True, 5)
    assert one_before.due
    assert not one_before.exhausted


def test_the_schedule_is_spent_when_the_next_look_up_would_come_after_give_up_after() -> None:
    short = ReconcileSchedule(first_after=60, interval=300, backoff=2, give_up_after=500)
    tries = [T0 + 60, T0 + 360]  # the next would be at T0 + 960, past T0 + 500

    decision = decide_lookup(short, since=T0, tries=tries, now=T0 + 400)

    assert decision.exhausted
    assert not decision.due


def test_the_first_look_up_is_made_even_when_give_up_after_comes_first() -> None:
    # Escalating an intent no one ever asked about would send a person to do the look-up.
    hasty = ReconcileSchedule(first_after=600, give_up_after=60)

    before = decide_lookup(hasty, since=T0, tries=[], now=T0 + 30)
    at = decide_lookup(hasty, since=T0, tries=[], now=T0 + 60)
    after = decide_lookup(hasty, since=T0, tries=[T0 + 60], now=T0 + 9999)

    assert (before.due, before.next_at) == (False, T0 + 60)
    assert at.due
    assert after.exhausted


def test_a_profile_without_a_look_up_escalates_at_once() -> None:
    decision = _decide([], now=T0, can_look_up=False)

    assert decision.exhausted
    assert not decision.due


def _record(created_at: float) -> IntentRecord:
    return IntentRecord(
        key="01KEY",
        scope="acct|POST|/v1/payments",
        reference="order-1",
        account="acct",
        provider="sandbox",
        method="POST",
        url="/v1/payments",
        fingerprint="f",
        request_headers=(),
        body=b"{}",
        state=IntentState.UNKNOWN,
        created_at=created_at,
        updated_at=created_at,
        first_sent_at=created_at,
        lease_owner=None,
        lease_expires_at=None,
        unknown_reason="attempts exhausted",
        response=None,
        acknowledged_at=None,
        attempt_count=2,
    )


def _attempt(number: int, started: float, ended: float | None) -> AttemptRecord:
    return AttemptRecord("01KEY", number, started, ended, None, "timeout", True)


def _look_up(at: float) -> ReconciliationRecord:
    return ReconciliationRecord("01KEY", at, "error", "HTTP 503", 503)


def test_an_intent_went_unknown_when_its_last_attempt_ended() -> None:
    record = _record(T0)

    assert unknown_since(record, [_attempt(1, T0, T0 + 5), _attempt(2, T0 + 6, T0 + 9)]) == T0 + 9
    assert unknown_since(record, [_attempt(1, T0 + 1, None)]) == T0 + 1  # a crash mid-attempt
    assert unknown_since(record, []) == T0


def test_only_the_look_ups_since_it_went_unknown_count_as_tries() -> None:
    # An earlier look-up found nothing, the intent was sent again and went unknown anew.
    found = [_look_up(T0 + 20), _look_up(T0 + 100), _look_up(T0 + 50)]

    assert tries_since(T0 + 30, found) == [T0 + 50, T0 + 100]


def test_an_intent_sent_again_after_a_look_up_first_went_unknown_before_that_look_up() -> None:
    # Unknown at T0+9, found never executed at T0+70, sent again, unknown again at T0+80.
    attempts = [_attempt(1, T0, T0 + 9), _attempt(2, T0 + 75, T0 + 80)]

    assert first_unknown_since(T0 + 80, attempts, [_look_up(T0 + 70)]) == T0 + 9
    assert first_unknown_since(T0 + 9, attempts[:1], []) == T0 + 9  # never looked up yet


def test_a_provider_that_keeps_sending_an_intent_back_is_given_up_on_from_the_first_time() -> None:
    # Unknown since T0, then cycles of "never executed, sent again, unknown again": the
    # latest since T0 + 7000, two look-ups made in earlier cycles.
    since = T0 + 7000

    def decide(now: float) -> ScheduleDecision:
        return decide_lookup(
            SCHEDULE, since=since, tries=[], now=now, first_since=T0, earlier_tries=2
        )

    # The next cycle's first look-up waits as the third would have (600 s), not 60 s.
    assert (decide(since + 61).due, decide(since + 61).next_at) == (False, since + 600)
    assert decide(T0 + SCHEDULE.give_up_after).exhausted  # counted from T0, not from since


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("first_after", -1),
        ("interval", float("inf")),
        ("max_interval", "60"),
        ("give_up_after", float("nan")),
        ("backoff", 0.5),
        ("max_tries", 0),
        ("max_tries", True),
    ],
)
def test_a_bad_schedule_is_refused_saying_which_number(field: str, value: object) -> None:
    with pytest.raises(payonce.ConfigurationError, match=f"ReconcileSchedule.{field}"):
        ReconcileSchedule(**{field: value})  # type: ignore[arg-type]


def test_a_profile_takes_only_a_schedule() -> None:
    with pytest.raises(payonce.ConfigurationError, match="reconcile_schedule must be"):
        payonce.ProviderProfile(name="acme", reconcile_schedule=60)  # type: ignore[arg-type]


def test_every_built_in_profile_has_a_schedule_that_fits_its_provider() -> None:
    stripe, mollie = get_profile("stripe"), get_profile("mollie")
    # Stripe's Search API lags: a look-up within the first minute proves nothing.
    assert stripe.reconcile_schedule.first_after >= 60
    # Mollie forgets a key after an hour: past it no finding can let payonce resend.
    assert mollie.reconcile_schedule.give_up_after <= mollie.key_lifetime
    for name in ("generic", "sandbox", "stripe", "adyen", "mollie", "square"):
        schedule = get_profile(name).reconcile_schedule
        assert schedule.first_after <= schedule.give_up_after


def test_a_resend_is_due_at_once_then_after_the_backoff_and_never_escalated_in_its_window() -> None:
    schedule = ReconcileSchedule(interval=300.0, backoff=2.0, max_interval=3600.0)
    first = decide_resend(schedule, resent_at=[], window_passed=False, now=1000.0)
    assert (first.due, first.exhausted) == (True, False)
    failed_once = decide_resend(schedule, resent_at=[1000.0], window_passed=False, now=1200.0)
    assert (failed_once.due, failed_once.next_at, failed_once.exhausted) == (False, 1300.0, False)
    # However many resends failed, the worker keeps trying while the key window is open.
    many = [1000.0 + n * 3600 for n in range(20)]
    later = decide_resend(schedule, resent_at=many, window_passed=False, now=many[-1] + 3600)
    assert (later.due, later.exhausted) == (True, False)


def test_a_resend_whose_key_window_passed_is_escalated() -> None:
    passed = decide_resend(ReconcileSchedule(), resent_at=[1000.0], window_passed=True, now=1000.0)
    assert (passed.due, passed.next_at, passed.exhausted) == (False, None, True)


def test_an_intent_dated_by_a_clock_ahead_of_this_one_is_looked_up_now_not_days_later() -> None:
    # A red-team's case: unknown while the journal's clock was a day ahead (a stepped
    # database server), then the clock came back: the worker waited silently for a day.
    dated_ahead = _decide([], now=T0 - 86_400)
    looked_up_ahead = _decide([T0 + 60], now=T0 - 86_400)
    within_tolerance = _decide([], now=T0 - 30)

    assert (dated_ahead.due, dated_ahead.exhausted) == (True, False)
    assert (looked_up_ahead.due, looked_up_ahead.exhausted) == (True, False)
    assert not within_tolerance.due


BACK = T0 - 86_400
"""The clock now, a day behind the one that dated the intent unknown at T0."""


def test_an_intent_dated_ahead_is_looked_up_once_then_on_the_schedule_of_this_clock() -> None:
    # A red-team's case: after the first look-up made by this clock, the worker looked it
    # up again on every pass and spent max_tries in minutes.
    first = _decide([], now=BACK)
    looked_up = _decide([BACK], now=BACK + 5)
    next_one = _decide([BACK], now=BACK + 300)

    assert (first.due, first.next_at) == (True, BACK)
    assert (looked_up.due, looked_up.next_at, looked_up.exhausted) == (False, BACK + 300, False)
    assert next_one.due


def test_a_look_up_dated_ahead_counts_as_a_try_spent_but_not_as_a_time() -> None:
    ahead_then_here = _decide([T0 + 60, BACK], now=BACK + 5)
    # Two tries spent: the next waits the second interval (600 s) from this clock's one.
    assert (ahead_then_here.tries, ahead_then_here.due) == (2, False)
    assert ahead_then_here.next_at == BACK + 600


def test_an_intent_dated_ahead_is_given_up_on_from_this_clock_s_first_look_up() -> None:
    waits = [BACK, BACK + 300, BACK + 900, BACK + 1900]  # 300, 600, then 1000 (the cap)
    fourth = _decide(waits, now=BACK + 2000)
    fifth = _decide([*waits, BACK + 2900], now=BACK + 2905)
    assert (fourth.due, fourth.next_at) == (False, BACK + 2900)
    assert (fifth.due, fifth.next_at, fifth.exhausted) == (False, None, True)  # max_tries
    # give_up_after counts from this clock's first look-up, not from T0 a day ahead.
    short = ReconcileSchedule(interval=300, backoff=1, max_tries=50, give_up_after=500)
    late = decide_lookup(short, since=T0, tries=[BACK, BACK + 300], now=BACK + 400)
    assert (late.due, late.next_at, late.exhausted) == (False, None, True)


def test_the_look_ups_this_clock_made_count_for_an_intent_dated_ahead() -> None:
    record = _record(BACK - 600)
    attempts = [_attempt(1, BACK - 600, BACK - 590), _attempt(2, T0, T0 + 5)]
    since = unknown_since(record, attempts)
    earlier_wait, ahead, here = _look_up(BACK - 595), _look_up(T0 + 60), _look_up(BACK)
    current_since = current_clock_since(record, attempts, BACK + 10)

    assert since == T0 + 5
    assert current_since == BACK - 590  # the first attempt's end: dated by a clock in step
    assert tries_since(since, [earlier_wait, ahead, here]) == [T0 + 60]
    counted = tries_since(
        since, [earlier_wait, ahead, here], current_since=current_since, now=BACK + 10
    )
    assert counted == [BACK, T0 + 60]
    assert current_clock_since(_record(T0), [_attempt(1, T0, T0 + 5)], BACK) is None
