"""The decision core, without HTTP or SQL: states, transitions, key age, leases, claims,
look-up verdicts."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from payonce._lifecycle import (
    RULES,
    AttemptRecord,
    ClaimKind,
    EventClaimKind,
    IntentState,
    LookupKind,
    Outcome,
    ReconcileOutcome,
    Transition,
    abandon_blocked,
    classify_lookup,
    classify_lookup_error,
    contract_table,
    decide_claim,
    decide_event_claim,
    default_lease_seconds,
    is_mismatch,
    lease_blocks,
    may_have_executed,
    resend_refusal,
    rule,
    target,
)
from payonce._lifecycle._guards import (
    ATTEMPT_ENDED,
    DECISION_POINTS,
    GUARDS,
    RECONCILED,
    RESUMED,
    UNLOOKED,
    Moment,
    choose,
)
from payonce._lifecycle._key_age import (
    BootReading,
    boot_elapsed,
    first_sent_boot,
    provider_first_sent,
    provider_sent_before,
)
from payonce._lifecycle._leases import LEASE_MARGIN
from payonce._lifecycle._provider_clock import READING_FRESH, ProviderClock, provider_date
from payonce._providers._profile import Lookup

CONTRACT = Path(__file__).parent.parent / "docs" / "contract.md"
PENDING, UNKNOWN = IntentState.PENDING, IntentState.UNKNOWN
SUCCEEDED, FAILED, ABANDONED = IntentState.SUCCEEDED, IntentState.FAILED, IntentState.ABANDONED


# -- the transition table ------------------------------------------------------------------


def test_the_contract_page_shows_the_transition_table_the_code_applies() -> None:
    text = CONTRACT.read_text()
    start, end = "<!-- transitions: start -->", "<!-- transitions: end -->"
    shown = text[text.index(start) + len(start) : text.index(end)].strip()
    assert shown == contract_table(), (
        "docs/contract.md's transition table differs from payonce._lifecycle.RULES: paste "
        "the output of payonce._lifecycle.contract_table() between its markers"
    )


def test_every_transition_has_exactly_one_rule() -> None:
    assert sorted(r.transition.name for r in RULES) == sorted(t.name for t in Transition)


@pytest.mark.parametrize(
    ("transition", "state", "expected"),
    [
        (Transition.WRITE_AHEAD, None, PENDING),
        (Transition.SUCCEEDED, PENDING, SUCCEEDED),
        (Transition.FAILED, PENDING, FAILED),
        (Transition.EXHAUSTED, PENDING, UNKNOWN),
        (Transition.EXHAUSTED_UNSENT, PENDING, PENDING),
        (Transition.KEY_WINDOW_PASSED, PENDING, UNKNOWN),
        (Transition.RECONCILED_SUCCEEDED, UNKNOWN, SUCCEEDED),
        (Transition.RECONCILED_FAILED, UNKNOWN, FAILED),
        (Transition.RECONCILED_ABSENT, UNKNOWN, PENDING),
        (Transition.RECONCILED_AMBIGUOUS, UNKNOWN, UNKNOWN),
        (Transition.RECONCILED_BY_RESEND, UNKNOWN, PENDING),
        (Transition.RECONCILED_KEY_WINDOW_PASSED, UNKNOWN, UNKNOWN),
        (Transition.ABANDONED, PENDING, ABANDONED),
        (Transition.ABANDONED, UNKNOWN, ABANDONED),
        (Transition.ACKNOWLEDGED, SUCCEEDED, SUCCEEDED),
        (Transition.ACKNOWLEDGED, FAILED, FAILED),
    ],
)
def test_a_transition_leads_where_the_contract_says(
    transition: Transition, state: IntentState | None, expected: IntentState
) -> None:
    assert target(transition, state) is expected


@pytest.mark.parametrize(
    ("transition", "state"),
    [
        (Transition.WRITE_AHEAD, PENDING),
        (Transition.SUCCEEDED, UNKNOWN),  # only reconciliation moves an unknown intent
        (Transition.SUCCEEDED, SUCCEEDED),
        (Transition.ATTEMPT_STARTED, UNKNOWN),  # an unknown intent is never resent blindly
        (Transition.RECONCILED_ABSENT, PENDING),
        (Transition.RECONCILED_BY_RESEND, PENDING),  # only an unknown intent is reconciled
        (Transition.ABANDONED, SUCCEEDED),
        (Transition.ABANDONED, ABANDONED),
        (Transition.ACKNOWLEDGED, PENDING),
        (Transition.ACKNOWLEDGED, ABANDONED),
    ],
)
def test_a_transition_from_a_state_it_does_not_start_from_is_refused(
    transition: Transition, state: IntentState
) -> None:
    assert target(transition, state) is None


def test_final_states_are_never_left_except_by_acknowledgement() -> None:
    for each in RULES:
        if any(s is not None and s.is_final for s in each.sources):
            assert each.transition is Transition.ACKNOWLEDGED


# -- key age ---------------------------------------------------------------------------------


@attrs.frozen
class Attempt:
    in_flight: bool = False
    ambiguous: bool | None = False


def test_only_ambiguous_or_unfinished_attempts_may_have_executed() -> None:
    assert not may_have_executed([])
    assert not may_have_executed([Attempt(), Attempt()])
    assert may_have_executed([Attempt(), Attempt(ambiguous=True)])
    assert may_have_executed([Attempt(in_flight=True, ambiguous=None)])


def test_a_resend_is_safe_until_ninety_percent_of_the_key_lifetime() -> None:
    lifetime = 1000.0
    assert resend_refusal(None, now=5000.0, key_lifetime=lifetime) is None
    assert resend_refusal(100.0, now=100.0 + 899.0, key_lifetime=lifetime) is None
    refusal = resend_refusal(100.0, now=100.0 + 900.0, key_lifetime=lifetime)
    assert refusal is not None
    assert "900s ago" in refusal
    assert "1000s" in refusal


# -- leases ----------------------------------------------------------------------------------


def _alive(owner: str) -> bool:
    """No owner is provably dead: every live lease of another's stands."""
    return False


def test_a_live_lease_of_another_living_owner_blocks() -> None:
    assert lease_blocks("other", 110.0, owner="me", now=100.0, is_stale=_alive)
    assert not lease_blocks("other", 100.0, owner="me", now=100.0, is_stale=_alive), "expired"
    assert not lease_blocks("other", 110.0, owner="other", now=100.0, is_stale=_alive), "its own"
    assert not lease_blocks(None, None, owner="other", now=100.0, is_stale=_alive), "free"
    assert not lease_blocks("other", 110.0, owner="me", now=100.0, is_stale=lambda o: True)


def test_liveness_is_asked_only_about_a_live_lease_of_another_owner() -> None:
    asked: list[str] = []

    def probe(owner: str) -> bool:
        asked.append(owner)
        return False

    lease_blocks("other", 100.0, owner="me", now=100.0, is_stale=probe)  # expired
    lease_blocks("me", 110.0, owner="me", now=100.0, is_stale=probe)  # its own
    lease_blocks(None, None, owner="me", now=100.0, is_stale=probe)  # free
    assert asked == []
    assert lease_blocks("other", 110.0, owner="me", now=100.0, is_stale=probe)
    assert asked == ["other"]


def test_the_default_lease_outlasts_two_stalled_waits_and_the_longest_pause() -> None:
    # With the defaults (30 s timeouts, 30 s max_wait, 30 s max_retry_after): 120 s, as
    # docs/contract.md says.
    assert default_lease_seconds(slowest_wait=30.0, longest_pause=30.0) == 120.0
    assert default_lease_seconds(slowest_wait=5.0, longest_pause=60.0) == 2 * 5 + 60 + LEASE_MARGIN


def test_an_operator_may_not_abandon_while_a_living_worker_holds_a_live_lease() -> None:
    assert abandon_blocked("w1", 110.0, now=100.0, is_stale=_alive)
    assert not abandon_blocked("w1", 100.0, now=100.0, is_stale=_alive), "expired"
    assert not abandon_blocked(None, None, now=100.0, is_stale=_alive), "free"
    assert not abandon_blocked("w1", 110.0, now=100.0, is_stale=lambda o: o == "w1"), "dead"
    # An operator knows no lease length: a lease however far ahead still blocks.
    assert abandon_blocked("w1", 100.0 + 365 * 86_400.0, now=100.0, is_stale=_alive)


def test_a_later_delivery_of_an_event_is_a_duplicate_a_wait_or_a_retry() -> None:
    def event(**row: object) -> EventClaimKind:
        fields: dict[str, Any] = {
            "processed": False,
            "lease_owner": None,
            "lease_expires_at": None,
            "owner": "me",
            "now": 100.0,
            "is_stale": _alive,
        }
        return decide_event_claim(**(fields | row))

    assert event(processed=True, lease_owner="w1", lease_expires_at=110.0) is EventClaimKind.DONE
    assert event(lease_owner="w1", lease_expires_at=110.0) is EventClaimKind.LEASED
    assert event() is EventClaimKind.RETRY, "released unprocessed: its handler failed"
    assert event(lease_owner="w1", lease_expires_at=100.0) is EventClaimKind.RETRY, "expired"
    dead = event(lease_owner="w1", lease_expires_at=110.0, is_stale=lambda o: o == "w1")
    assert dead is EventClaimKind.RETRY, "its worker died"
    assert event(lease_owner="me", lease_expires_at=110.0) is EventClaimKind.RETRY, "its own"
    a_year = event(lease_owner="w1", lease_expires_at=100.0 + 365 * 86_400.0, lease_seconds=60.0)
    assert a_year is EventClaimKind.RETRY, "no honest worker writes such a lease"


# -- claims ----------------------------------------------------------------------------------


@attrs.frozen
class Stored:
    key: str = "k1"
    scope: str = "acct POST /v1/payments"
    fingerprint: str = "f" * 64
    state: IntentState = PENDING
    lease_owner: str | None = None
    lease_expires_at: float | None = None


@attrs.frozen
class Asked:
    key: str = "k2"
    key_supplied: bool = False
    scope: str = "acct POST /v1/payments"
    fingerprint: str = "f" * 64


def test_the_same_request_under_its_reference_is_not_a_mismatch() -> None:
    assert not is_mismatch(Stored(), Asked())


@pytest.mark.parametrize(
    "asked",
    [
        Asked(fingerprint="0" * 64),
        Asked(scope="acct POST /v1/refunds"),
        Asked(key="k2", key_supplied=True),
    ],
)
def test_another_body_scope_or_supplied_key_is_a_mismatch(asked: Asked) -> None:
    assert is_mismatch(Stored(), asked)


def test_reconcile_outcomes_are_the_strings_they_were() -> None:
    # Public (ReconcileResult.outcome, the reconciled hook, --json): a str enum, so code
    # and documents that compared or printed the strings see no difference.
    assert [outcome.value for outcome in ReconcileOutcome] == [
        "found",
        "not_found",
        "cannot_tell",
        "still_unknown",
        "error",
        "skipped",
        "resent",
    ]
    assert ReconcileOutcome.NOT_FOUND == "not_found"
    assert f"{ReconcileOutcome.NOT_FOUND}" == str(ReconcileOutcome.NOT_FOUND) == "not_found"
    assert json.dumps({"outcome": ReconcileOutcome.SKIPPED}) == '{"outcome": "skipped"}'


def test_a_claim_replays_final_refuses_unknown_waits_for_a_live_lease_and_takes_a_free_one() -> (
    None
):
    me, other = "me", "other"
    final = decide_claim(Stored(state=SUCCEEDED), owner=me, now=1.0, is_stale=_alive)
    assert final is ClaimKind.FINAL
    closed = decide_claim(Stored(state=ABANDONED), owner=me, now=1.0, is_stale=_alive)
    assert closed is ClaimKind.FINAL
    unknown = decide_claim(Stored(state=UNKNOWN), owner=me, now=1.0, is_stale=_alive)
    assert unknown is ClaimKind.UNKNOWN
    assert (
        decide_claim(Stored(state=UNKNOWN), owner=me, now=1.0, unknown=True, is_stale=_alive)
        is None
    )
    leased = Stored(lease_owner=other, lease_expires_at=10.0)
    assert decide_claim(leased, owner=me, now=1.0, is_stale=_alive) is ClaimKind.LEASED
    assert decide_claim(leased, owner=me, now=1.0, is_stale=lambda o: o == other) is None
    assert decide_claim(leased, owner=me, now=10.0, is_stale=_alive) is None
    assert decide_claim(Stored(), owner=me, now=1.0, is_stale=_alive) is None


# -- look-up verdicts ------------------------------------------------------------------------

LOOKUP = Lookup(path="/v1/payments")


def _answer(status: int, body: object) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.Response(status, content=content)


@pytest.mark.parametrize(
    ("status", "body", "kind", "state"),
    [
        (200, {"data": [{"status": "succeeded"}]}, LookupKind.FOUND, SUCCEEDED),
        (200, {"data": [{"status": "declined"}]}, LookupKind.FOUND, FAILED),
        (200, {"data": []}, LookupKind.ABSENT, None),
        (404, {}, LookupKind.UNREADABLE, None),  # the endpoint is missing: proves nothing
        (200, {"data": [{"status": "processing"}]}, LookupKind.UNDECIDED, None),
        (
            200,
            {"data": [{"status": "succeeded"}, {"status": "succeeded"}]},
            LookupKind.UNDECIDED,
            None,
        ),
        (200, {"data": ["succeeded"]}, LookupKind.UNDECIDED, None),
        (200, b"<html>", LookupKind.UNREADABLE, None),
        (200, {"items": []}, LookupKind.UNREADABLE, None),
        (403, {}, LookupKind.REFUSED, None),
        (429, {}, LookupKind.RETRY, None),
        (503, {}, LookupKind.RETRY, None),
    ],
)
def test_a_status_look_up_answer_gets_one_verdict(
    status: int, body: object, kind: LookupKind, state: IntentState | None
) -> None:
    verdict = classify_lookup(_answer(status, body), LOOKUP)
    assert verdict.kind is kind
    assert verdict.state is state
    assert (verdict.record is not None) == (kind is LookupKind.FOUND)


def test_every_transport_failure_of_a_look_up_is_asked_again() -> None:
    request = httpx.Request("GET", "http://provider.test/v1/payments")
    for error in (httpx.ConnectError("x"), httpx.ReadTimeout("x"), httpx.RemoteProtocolError("x")):
        error.request = request
        verdict = classify_lookup_error(error)
        assert verdict is not None
        assert verdict.kind is LookupKind.RETRY
    assert classify_lookup_error(ValueError("a bug")) is None


# -- clocks -----------------------------------------------------------------------------------


def test_a_first_attempt_dated_in_the_future_is_never_resent() -> None:
    refusal = resend_refusal(10_000.0, now=1_000.0, key_lifetime=86_400.0, executed=False)
    assert refusal is not None
    assert "in the future" in refusal
    assert resend_refusal(1_030.0, now=1_000.0, key_lifetime=86_400.0) is None, "tolerated"


def test_a_lease_no_honest_worker_would_write_blocks_no_one() -> None:
    other, a_year = "other", 365 * 86_400.0
    assert not lease_blocks(
        other, 100.0 + a_year, owner="me", now=100.0, is_stale=_alive, lease_seconds=120.0
    )
    assert lease_blocks(
        other, 100.0 + 200.0, owner="me", now=100.0, is_stale=_alive, lease_seconds=120.0
    )


# -- the provider's clock ---------------------------------------------------------------------

HOUR, DAY, YEAR = 3600.0, 86_400.0, 365 * 86_400.0
T0 = 1_800_000_000.0
"""When the first attempt was sent, by the provider's clock (and this host's, then)."""


@attrs.frozen
class Dated:
    number: int = 1
    started_at: float = T0
    ended_at: float | None = T0 + 2.0
    provider_date: float | None = T0 + 2.0


def test_the_provider_s_time_of_the_first_send_is_its_first_answer_s_date_less_the_wait() -> None:
    # The first attempt took 2 s here; the provider's clock was an hour ahead of this host's.
    first = Dated(provider_date=T0 + HOUR + 2.0)
    assert provider_first_sent([Dated(number=2, provider_date=T0 + 9 * HOUR), first]) == T0 + HOUR
    # A clock stepped back during the attempt never makes it look sent later than answered.
    assert provider_first_sent([Dated(ended_at=T0 - 50.0)]) == T0 + 2.0
    # No answer to the first attempt: a later answer's offset says nothing of the clock then.
    unanswered = Dated(ended_at=None, provider_date=None)
    assert provider_first_sent([unanswered, Dated(number=2, provider_date=T0 + DAY)]) is None
    assert provider_first_sent([]) is None


def test_a_host_clock_ahead_at_an_unanswered_first_send_cannot_make_the_key_look_young() -> None:
    # A red-team's case: the first attempt got no answer, sent while this host's clock was
    # 5 h ahead (so journaled at T0 + 5 h); attempts 2 and 3 were answered at T0 by the
    # provider. 25 h later, both clocks agree again: by this host's journal the key is 20 h
    # old (under Square's 21.6 h window), by the provider's answers at least 25 h.
    attempts = [
        Dated(number=1, started_at=T0 + 5 * HOUR, ended_at=None, provider_date=None),
        Dated(number=2, started_at=T0 + 5 * HOUR, provider_date=T0 + 1.0),
        Dated(number=3, started_at=T0 + 5 * HOUR, provider_date=T0 + 2.0),
    ]
    assert provider_first_sent(attempts) is None
    assert provider_sent_before(attempts) == T0 + 1.0
    now = T0 + 25 * HOUR
    refusal = resend_refusal(
        T0 + 5 * HOUR,
        now,
        DAY,
        provider_now=now,
        provider_first=None,
        provider_sent_by=provider_sent_before(attempts),
    )
    assert refusal is not None
    assert "it answered an attempt 89999s ago" in refusal
    # Without what the later answers say, the journal's own date let it through.
    assert resend_refusal(T0 + 5 * HOUR, now, DAY, provider_now=now) is None
    # And a key the provider answered recently is still resent.
    recent = T0 + 2 * HOUR
    assert resend_refusal(T0, recent, DAY, provider_now=recent, provider_sent_by=T0 + 1.0) is None
    assert provider_sent_before([]) is None


def test_the_boot_clock_tells_the_seconds_since_the_first_send_whatever_the_wall_clock_did() -> (
    None
):
    sent = BootReading("shop-1", "boot-a", 5000.0)
    assert boot_elapsed(sent, BootReading("shop-1", "boot-a", 6200.0)) == 1200.0
    # A container of the same kernel (another host name) shares its boot clock.
    assert boot_elapsed(sent, BootReading("shop-1-worker", "boot-a", 6200.0)) == 1200.0
    # Rebooted since: at least as long ago as this boot began.
    assert boot_elapsed(sent, BootReading("shop-1", "boot-b", 300.0)) == 300.0
    # Another host's boot says nothing of when this one sent it; nor does no reading.
    assert boot_elapsed(sent, BootReading("shop-2", "boot-c", 900_000.0)) is None
    # A machine that cannot be told (no machine id: "") is never taken for this one rebooted.
    unnamed = BootReading("", "boot-a", 5000.0)
    assert boot_elapsed(unnamed, BootReading("", "boot-b", 900_000.0)) is None
    assert boot_elapsed(unnamed, BootReading("", "boot-a", 6200.0)) == 1200.0  # one kernel
    assert boot_elapsed(None, BootReading("shop-1", "boot-a", 6200.0)) is None
    assert boot_elapsed(sent, None) is None
    assert boot_elapsed(sent, BootReading("shop-1", "boot-a", 4000.0)) is None  # not one clock
    # Read from the first attempt as journaled (``host/boot id``).
    first = AttemptRecord("k", 1, T0, None, None, None, None, boot="shop-1/boot-a", boottime=5e3)
    later = AttemptRecord("k", 2, T0, None, None, None, None, boot="shop-1/boot-b", boottime=9.0)
    assert first_sent_boot([later, first]) == sent
    assert first_sent_boot([attrs.evolve(first, boot=None), later]) is None


def test_a_host_clock_ahead_at_the_first_send_and_set_right_since_cannot_stretch_the_window() -> (
    None
):
    # Sent while this host's clock was 10 minutes ahead, no answer; the clock set right
    # (NTP) before the re-run 20 minutes later: by the wall clock the key is 10 minutes old,
    # inside the 15 minutes of an assumed lifetime. The boot clock says 20.
    first_sent, now, window = T0 + 600.0, T0 + 1200.0, 900.0
    assert resend_refusal(first_sent, now, DAY, within=window) is None
    refusal = resend_refusal(first_sent, now, DAY, within=window, at_least=1200.0)
    assert refusal is not None
    assert "first sent 1200s ago" in refusal
    # With the provider's time (the clocks agree now), the same.
    assert (
        resend_refusal(first_sent, now, DAY, provider_now=now, within=window, at_least=1200.0)
        is not None
    )
    # The boot clock never makes a key younger than the wall clock says...
    assert resend_refusal(T0, now, DAY, within=window, at_least=10.0) is not None
    # ...nor lets a first send dated in the future through.
    future = resend_refusal(now + 3600.0, now, DAY, within=window, at_least=10.0)
    assert future is not None
    assert "in the future" in future


def test_a_clock_set_back_25_hours_cannot_make_a_key_the_provider_aged_25_hours_look_young() -> (
    None
):
    # The case: sent at T0, the provider 25 h later; this host's clock reads T0 again.
    provider_now, now = T0 + 25 * HOUR, T0 + 60.0
    for first in (None, T0):  # the first attempt got no answer (a crash), or one
        refusal = resend_refusal(T0, now, DAY, provider_now=provider_now, provider_first=first)
        assert refusal is not None
        assert "this host's clock is 89940s behind the provider's" in refusal
        assert "first sent 90000s ago" in refusal
    # By this host's clock alone it looked an hour old: the very resend that paid twice.
    assert resend_refusal(T0, now, DAY) is None


def test_clocks_that_disagree_never_resend_while_either_says_the_key_may_be_gone() -> None:
    # This host's clock a year ahead, or the provider's Date an hour behind (a cached
    # answer, an edge with a clock of its own): either could be the wrong one, so the older
    # age stands and the intent goes to reconciliation instead of a resend.
    now = T0 + YEAR + HOUR
    assert resend_refusal(T0, now, DAY) is not None, "by this host's clock: a year old"
    disagreeing = resend_refusal(T0, now, DAY, provider_now=T0 + HOUR, provider_first=T0)
    assert disagreeing is not None
    assert "yet by this host's clock it was first sent" in disagreeing
    expired = resend_refusal(T0, now, DAY, provider_now=T0 + 23 * HOUR, provider_first=T0)
    assert expired is not None
    assert "ahead of the provider's" in expired
    # The first answer's Date five hours late (a cached answer, a skewed edge), the clocks
    # agreeing now: by this host's clock the key is 23 h old, so not resent.
    late = resend_refusal(
        T0, T0 + 23 * HOUR, DAY, provider_now=T0 + 23 * HOUR, provider_first=T0 + 5 * HOUR
    )
    assert late is not None
    assert "yet by this host's clock it was first sent" in late
    # Clocks that agree, the key an hour old by both: resent.
    agreeing = T0 + HOUR + 30.0
    assert resend_refusal(T0, agreeing, DAY, provider_now=T0 + HOUR, provider_first=T0) is None
    # Its first attempt unanswered: this host's clock may have been a year ahead then too,
    # or right, so the older age stands: never resent, never dated by a guess.
    unanswered = resend_refusal(T0, now, DAY, provider_now=T0 + HOUR)
    assert unanswered is not None
    assert "got no answer" in unanswered


def test_a_slow_clock_cannot_stretch_the_key_window() -> None:
    # 23 h passed at the provider; this host's clock, 10% slow, counted 20.7 h.
    now, provider_now = T0 + 0.9 * 23 * HOUR, T0 + 23 * HOUR
    assert resend_refusal(T0, now, DAY) is None, "by this host's clock alone: still valid"
    assert resend_refusal(T0, now, DAY, provider_now=provider_now, provider_first=T0)
    assert resend_refusal(T0, now, DAY, provider_now=provider_now)


def test_clocks_that_agree_judge_as_this_host_s_did() -> None:
    for hours in (1.0, 23.0):
        now = T0 + hours * HOUR
        alone = resend_refusal(T0, now, DAY)
        assert resend_refusal(T0, now, DAY, provider_now=now + 30.0) == alone
    # Never executed: the key's age does not matter, whatever the provider's clock says.
    assert resend_refusal(T0, T0, DAY, executed=False, provider_now=T0 + YEAR) is None


def test_a_provider_s_clock_gone_back_past_its_own_first_answer_refuses() -> None:
    refusal = resend_refusal(T0, T0, DAY, provider_now=T0 - HOUR, provider_first=T0)
    assert refusal is not None
    assert "provider's clock moved back" in refusal


def test_a_reading_of_the_provider_s_clock_is_carried_by_the_monotonic_clock_while_fresh() -> None:
    clock = ProviderClock()
    assert clock.now(10.0) is None
    clock.read(None, 10.0)  # an answer without a Date
    assert clock.now(10.0) is None
    clock.read(T0, 10.0)
    assert clock.now(40.0) == T0 + 30.0
    assert clock.now(10.0 + READING_FRESH + 1) is None, "stale: ask again"
    assert clock.now(5.0) is None, "a reading from the future of a monotonic clock"


@pytest.mark.parametrize(
    ("date", "expected"),
    [
        ("Sun, 17 Jan 2027 08:00:00 GMT", 1_800_172_800.0),
        ("Sun, 17 Jan 2027 08:00:00 -0000", 1_800_172_800.0),
        ("Sun, 17 Jan 2027 10:00:00 +0200", 1_800_172_800.0),
        ("Thu, 01 Jan 1970 00:00:10 GMT", None),  # a server without a clock
        ("yesterday", None),
        ("", None),
    ],
)
def test_an_answer_s_date_is_the_provider_s_time(date: str, expected: float | None) -> None:
    response = httpx.Response(200, headers={"Date": date} if date else {})
    assert provider_date(response) == expected


def test_a_cached_answer_s_date_is_aged_by_the_cache_s_own_count() -> None:
    date = "Sun, 17 Jan 2027 08:00:00 GMT"
    kept = httpx.Response(200, headers={"Date": date, "Age": "3600"})
    assert provider_date(kept) == 1_800_172_800.0 + 3600
    nonsense = httpx.Response(200, headers={"Date": date, "Age": "soon"})
    assert provider_date(nonsense) == 1_800_172_800.0


# -- the guards: exactly one transition per moment at each decision point -------------------


def _moments() -> Iterator[Moment]:
    """Every moment the drive can describe: a look-up's record state is known exactly when
    it found one."""
    for outcome, ambiguous, refused, lookup, found, running, per_call in itertools.product(
        [*Outcome, None],
        [False, True],
        [False, True],
        [*LookupKind, None],
        [IntentState.SUCCEEDED, IntentState.FAILED, None],
        [False, True],
        [False, True],
    ):
        if (lookup is LookupKind.FOUND) != (found is not None):
            continue
        yield Moment(outcome, ambiguous, refused, lookup, found, running, per_call)


@pytest.mark.parametrize("point", sorted(DECISION_POINTS))
def test_exactly_one_guard_holds_at_every_moment_of_a_decision_point(point: str) -> None:
    candidates = DECISION_POINTS[point]
    for moment in _moments():
        holding = [t for t in candidates if GUARDS[t](moment)]
        assert len(holding) == 1, f"{point} at {moment}: {holding}"
        assert choose(candidates, moment) is holding[0]


def test_every_chosen_transition_belongs_to_a_decision_point_and_has_a_rule() -> None:
    chosen = {t for candidates in DECISION_POINTS.values() for t in candidates}
    assert chosen == set(GUARDS)
    commands = set(Transition) - chosen
    assert commands == {
        Transition.WRITE_AHEAD,
        Transition.ABANDONED,
        Transition.ACKNOWLEDGED,
    }, "only these are applied as commands, chosen by no guard"


def test_the_guards_read_as_the_contract_does() -> None:
    assert choose(ATTEMPT_ENDED, Moment(Outcome.REFUSED, ambiguous=True)) is (
        Transition.ATTEMPT_REFUSED_UNPROVEN
    )
    assert choose(ATTEMPT_ENDED, Moment(None)) is Transition.ATTEMPT_INTERRUPTED
    assert choose(ATTEMPT_ENDED, Moment(Outcome.MISMATCH)) is Transition.FAILED
    absent = Moment(lookup=LookupKind.ABSENT)
    assert choose(RECONCILED, absent) is Transition.RECONCILED_ABSENT
    running = attrs.evolve(absent, still_running=True)
    assert choose(RECONCILED, running) is Transition.RECONCILED_AMBIGUOUS
    expired = attrs.evolve(absent, resend_refused=True)
    assert choose(RECONCILED, expired) is Transition.RECONCILED_AMBIGUOUS
    assert choose(RESUMED, Moment(resend_refused=True)) is Transition.KEY_WINDOW_PASSED
    # A key drawn per call is never resent on payonce's own, whatever its age, and "no
    # record" does not make it pending again.
    assert choose(RESUMED, Moment(per_call_key=True)) is Transition.PER_CALL_KEY
    assert choose(UNLOOKED, Moment(per_call_key=True)) is Transition.RECONCILED_PER_CALL_KEY
    per_call_absent = attrs.evolve(absent, per_call_key=True)
    assert choose(RECONCILED, per_call_absent) is Transition.RECONCILED_AMBIGUOUS


def test_whether_a_failed_write_may_have_executed_is_the_rule_s() -> None:
    # Before anything is sent, nothing can have executed; from the first attempt's end on,
    # the request may have reached the provider; a look-up's finding and an operator's
    # command change nothing at the provider either way.
    before = {Transition.WRITE_AHEAD, Transition.ATTEMPT_STARTED}
    looked = {t for t in Transition if t.name.startswith("RECONCILED_")}
    operators = {Transition.ABANDONED, Transition.ACKNOWLEDGED}
    for transition in Transition:
        unwritten = rule(transition).unwritten
        expected = transition not in before | looked | operators
        assert unwritten.may_have_executed is expected, transition
        if rule(transition).attempt_ambiguous is not None:
            assert unwritten.may_have_executed, "an attempt's end comes after its send"
