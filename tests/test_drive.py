"""The drive's decisions, run with scripted events: no sandbox, no journal file, no sleep.

Each scenario hands the drive what a provider and a journal would answer (``Script``), in
order, and checks the transitions it asked the journal for and what the caller gets. The
journal here is a dictionary that applies each transition by the lifecycle's own table
(``target``), so a transition asked from a state it may not start from fails the test.
Time is a ``FakeClock``: waits move it, and a scenario can step it.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import httpx
import pytest

import payonce
from payonce._lifecycle import (
    AttemptRecord,
    BootReading,
    Claim,
    ClaimKind,
    IntentDraft,
    IntentRecord,
    IntentRequest,
    IntentState,
    StoredResponse,
    Transition,
    canonical_request,
    rule,
    target,
)
from payonce._lifecycle import _drive as drive
from payonce._runtime._drafting import Drafter
from payonce.providers import Lookup, ProviderProfile, get_profile

R = TypeVar("R")
KEY_LIFETIME = 24 * 3600.0
GENERIC = get_profile("generic")
# GENERIC's 24 h is assumed: payonce resends on its own only within 15 minutes of a first
# send that may have executed. The tests of the 90% rule use a lifetime said documented.
DOCUMENTED = attrs.evolve(GENERIC, key_lifetime_documented=True)
VERIFYING = ProviderProfile(
    name="verifying",
    lookup=Lookup(path="/v1/payments"),
    resend="verify",
    max_processing=30.0,
    key_lifetime=KEY_LIFETIME,
    key_lifetime_documented=True,
)
STEADY = payonce.RetryPolicy(max_attempts=4, initial_wait=1.0, max_wait=8.0, jitter=False)


@attrs.define
class FakeClock:
    wall: float = 1_800_000_000.0
    mono: float = 1_000.0
    provider: float = 1_800_000_000.0
    """The provider's clock, which its answers' Date headers tell: stepping ``wall`` (this
    host's) leaves it alone; time passing moves both."""
    booted: BootReading | None = None
    """This host's boot clock, which time passing moves and no step of ``wall`` does; None:
    a host without one."""

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def boot(self) -> BootReading | None:
        return self.booted

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds
        self.provider += seconds
        if self.booted is not None:
            self.booted = attrs.evolve(self.booted, seconds=self.booted.seconds + seconds)

    def provider_date(self) -> str:
        return email.utils.formatdate(self.provider, usegmt=True)


def _json(status: int, body: Any, **headers: str) -> httpx.Response:
    request = httpx.Request("POST", "https://provider.test/v1/payments")
    return httpx.Response(status, json=body, headers=headers, request=request)


def _page(status: int) -> httpx.Response:
    request = httpx.Request("POST", "https://provider.test/v1/payments")
    return httpx.Response(status, html="<html>gateway</html>", request=request)


def _timeout() -> httpx.ReadTimeout:
    return httpx.ReadTimeout("timed out", request=httpx.Request("POST", "https://provider.test"))


def _refused_connection() -> httpx.ConnectError:
    return httpx.ConnectError("refused", request=httpx.Request("POST", "https://provider.test"))


def _found(status: str) -> httpx.Response:
    return _json(200, {"data": [{"id": "pay_1", "status": status}]})


ABSENT = _json(200, {"data": []})


class Script:
    """A journal (a dict, the lifecycle's table) and a provider (scripted answers) for one
    drive; ``run`` carries the drive's commands out as an executor would."""

    def __init__(
        self,
        profile: ProviderProfile = GENERIC,
        *,
        sends: list[httpx.Response | BaseException] | None = None,
        lookups: list[httpx.Response | BaseException] | None = None,
        claims: list[ClaimKind] | None = None,
        clock: FakeClock | None = None,
        retry: payonce.RetryPolicy = STEADY,
    ) -> None:
        self.profile = profile
        self.sends = list(sends or [])
        self.lookups = list(lookups or [])
        self.claims = list(claims or [])
        self.clock = clock or FakeClock()
        self.settings = drive.DriveSettings(
            profile=profile,
            retry=retry,
            clock=self.clock,
            redact=lambda text: text,
            in_flight_wait=1.0,
            journal_location="journal.db",
        )
        self.drafter = Drafter(profile, "acct", "https://provider.test", "ulid")
        self.record: IntentRecord | None = None
        self.attempts: list[AttemptRecord] = []
        self.transitions: list[Transition] = []
        self.commands: list[drive.Command] = []
        self.slept: list[float] = []
        self.on_look_up: Callable[[], None] | None = None
        """Called as each look-up is answered: a scenario's clock step, say."""
        self.released = False
        self.clock_answers: list[httpx.Response | BaseException] | None = None
        """What the provider answers when asked its time; None: a 404 dated by its clock."""

    def draft(self, amount: int = 100) -> IntentDraft:
        canonical = canonical_request("POST", "/v1/payments", json_body={"amount": amount})
        return self.drafter.draft(
            canonical, reference="order-1", key=None, key_supplied=False, headers=None
        )

    # -- the journal -------------------------------------------------------------------------

    def journaled(self, draft: IntentDraft, *, state: IntentState, **changes: Any) -> None:
        """An intent already in the journal (an earlier process's)."""
        fields = {f.name: getattr(draft, f.name) for f in attrs.fields(IntentRequest)}
        self.record = IntentRecord(
            **fields,
            state=state,
            created_at=self.clock.wall,
            updated_at=self.clock.wall,
            first_sent_at=self.clock.wall,
            lease_owner=None,
            lease_expires_at=None,
            unknown_reason=None,
            response=None,
            acknowledged_at=None,
            attempt_count=len(self.attempts),
        )
        self.record = attrs.evolve(self.record, **changes)

    def attempt(
        self,
        *,
        ended: bool,
        ambiguous: bool | None,
        at: float | None = None,
        provider_date: float | None = None,
    ) -> None:
        """An attempt journaled earlier; ``provider_date``: its answer's Date. Dated by the
        boot clock as it is now, where the host has one."""
        started = self.clock.wall if at is None else at
        number = len(self.attempts) + 1
        end = started + 1 if ended else None
        booted = self.clock.boot()
        boot = None if booted is None else f"{booted.host}/{booted.boot_id}"
        self.attempts.append(
            AttemptRecord(
                "k",
                number,
                started,
                end,
                None,
                None,
                ambiguous,
                provider_date,
                boot=boot,
                boottime=None if booted is None else booted.seconds,
            )
        )

    def _apply(self, transition: Transition, **changes: Any) -> IntentRecord:
        assert self.record is not None
        to = target(transition, self.record.state)
        assert to is not None, f"{transition} may not start from {self.record.state}"
        self.transitions.append(transition)
        self.record = attrs.evolve(self.record, state=to, **changes)
        return self.record

    def _claim(self, command: drive.ClaimIntent) -> Claim:
        kind = self.claims.pop(0) if self.claims else None
        if self.record is None:
            self.journaled(command.draft, state=IntentState.PENDING)
            self.transitions.append(Transition.WRITE_AHEAD)
            self.attempt(ended=False, ambiguous=None)
            assert self.record is not None
            self.record = attrs.evolve(self.record, attempt_count=1, lease_owner=command.owner)
            return Claim(kind or ClaimKind.CREATED, self.record, 1)
        if kind is None:
            kind = ClaimKind.FINAL if self.record.state.is_final else ClaimKind.CLAIMED
        return Claim(kind, self.record)

    def _journal(self, command: drive.Command) -> Any:
        match command:
            case drive.ClaimIntent():
                return self._claim(command)
            case drive.ReadAttempts():
                return list(self.attempts)
            case drive.StartAttempt(transition=transition):
                self._apply(transition)
                self.attempt(ended=False, ambiguous=None)
                return len(self.attempts)
            case drive.EndAttempt(transition=transition, provider_date=date):
                self._apply(transition)
                ambiguous = rule(transition).attempt_ambiguous
                last = self.attempts[-1]
                self.attempts[-1] = attrs.evolve(
                    last, ended_at=self.clock.wall, ambiguous=ambiguous, provider_date=date
                )
                return None
            case drive.Settle(transition=transition, response=response):
                stored = StoredResponse(response.status_code, (), response.content)
                return self._apply(transition, response=stored)
            case drive.MarkUnknown(transition=transition, reason=reason):
                return self._apply(transition, unknown_reason=reason)
            case drive.Release(transition=transition):
                if transition is not None:
                    self._apply(transition)
                self.released = True
                return None
            case drive.LookedUp(transition=transition):
                self._apply(transition)
                return None
            case drive.ClaimKey(owner=owner):
                assert self.record is not None
                self.record = attrs.evolve(self.record, lease_owner=owner)
                return Claim(ClaimKind.CLAIMED, self.record)
            case drive.Reconciled(transition=transition, found=found):
                body = (
                    None if found is None else StoredResponse(200, (), json.dumps(found).encode())
                )
                return self._apply(transition, response=body)
            case drive.Verified(transition=transition, response=response, found=found):
                body = json.dumps(found).encode()
                return self._apply(transition, response=StoredResponse(200, (), body))
        raise AssertionError(f"not a journal command: {command}")

    # -- the executor ------------------------------------------------------------------------

    def _answer(self, queue: list[httpx.Response | BaseException]) -> drive.Answered | drive.Failed:
        assert queue, "the drive sent more than the scenario scripted"
        event = queue.pop(0)
        if isinstance(event, BaseException):
            return drive.Failed(event)
        return drive.Answered(event)

    def _clock_answer(self) -> drive.Answered | drive.Failed:
        if self.clock_answers is not None:
            return self._answer(self.clock_answers)
        request = httpx.Request("HEAD", "https://provider.test")
        dated = {"Date": self.clock.provider_date()}
        return drive.Answered(httpx.Response(404, headers=dated, request=request))

    def _replay(self, record: IntentRecord) -> httpx.Response | None:
        if record.response is None:
            return None
        request = httpx.Request(record.method, record.url)
        stored = record.response
        return httpx.Response(stored.status, content=stored.body, request=request)

    def _carry_out(self, commands: Generator[drive.Command, Any, R]) -> R:
        answer: Any = None
        while True:
            try:
                command = commands.send(answer)
            except StopIteration as done:
                ended: R = done.value
                return ended
            self.commands.append(command)
            match command:
                case drive.Send() | drive.AskAgain():
                    answer = self._answer(self.sends)
                case drive.LookUp():
                    answer = self._answer(self.lookups)
                    if self.on_look_up is not None:
                        self.on_look_up()
                case drive.ReadClock():
                    answer = self._clock_answer()
                case drive.Sleep(seconds):
                    self.slept.append(seconds)
                    self.clock.advance(seconds)
                    answer = None
                case drive.Replay(record):
                    answer = self._replay(record)
                case drive.Holding() | drive.Resending() | drive.Leased() | drive.LookupRetried():
                    answer = None
                case _:
                    answer = self._journal(command)

    def call(self, draft: IntentDraft | None = None, *, ack: bool = False) -> httpx.Response:
        commands = drive.call(
            self.settings, draft or self.draft(), "me", acknowledge_on_success=ack
        )
        return self._carry_out(commands)

    def resume(self) -> httpx.Response:
        assert self.record is not None
        claim = Claim(ClaimKind.CLAIMED, self.record)
        return self._carry_out(drive.resume(self.settings, claim, "me"))

    def reconcile(self, *, resend: bool = False) -> drive.Reconciliation:
        assert self.record is not None
        return self._carry_out(drive.reconcile(self.settings, self.record, "me", resend=resend))

    @property
    def looked_up(self) -> int:
        return sum(isinstance(c, drive.LookUp) for c in self.commands)

    @property
    def clock_reads(self) -> int:
        return sum(isinstance(c, drive.ReadClock) for c in self.commands)

    @property
    def sent(self) -> int:
        return sum(isinstance(c, drive.Send) for c in self.commands)

    @property
    def asked_again(self) -> int:
        return sum(isinstance(c, drive.AskAgain) for c in self.commands)

    @property
    def state(self) -> IntentState:
        assert self.record is not None
        return self.record.state


OK = _json(201, {"id": "pay_1", "status": "succeeded"})
T = Transition


# -- the happy path and its replays -----------------------------------------------------------


def test_a_first_answer_settles_it_after_one_send() -> None:
    script = Script(sends=[OK])
    assert script.call().status_code == 201
    assert script.transitions == [T.WRITE_AHEAD, T.SUCCEEDED]
    assert script.sent == 1


def test_1_an_identical_retry_after_success_is_replayed_without_sending() -> None:
    script = Script(sends=[OK])
    script.call()
    again = script.call()
    assert (again.status_code, again.content) == (201, OK.content)
    assert script.sent == 1


def test_7_a_stored_refusal_is_replayed_as_the_same_error() -> None:
    script = Script(sends=[_json(402, {"error": "card_declined"})])
    with pytest.raises(payonce.ProviderError) as first:
        script.call()
    with pytest.raises(payonce.ProviderError) as replayed:
        script.call()
    assert first.value.status_code == replayed.value.status_code == 402
    assert script.transitions == [T.WRITE_AHEAD, T.FAILED]
    assert script.sent == 1


def test_4_a_one_shot_asks_for_its_acknowledgement_with_the_settle() -> None:
    script = Script(sends=[OK])
    script.call(ack=True)
    (settle,) = [c for c in script.commands if isinstance(c, drive.Settle)]
    assert settle.run.acknowledge_on_success


# -- concurrency and mismatches ---------------------------------------------------------------


def test_2_another_worker_s_intent_is_waited_for_then_replayed() -> None:
    script = Script(sends=[OK])
    script.call()
    script.claims = [ClaimKind.LEASED, ClaimKind.LEASED]
    assert script.call().status_code == 201
    assert script.slept == [drive.IN_FLIGHT_POLL, drive.IN_FLIGHT_POLL]
    assert script.sent == 1


def test_2_another_worker_s_intent_past_in_flight_wait_is_in_flight() -> None:
    script = Script()
    script.journaled(script.draft(), state=IntentState.PENDING, lease_owner="them")
    script.claims = [ClaimKind.LEASED] * 100
    with pytest.raises(payonce.IntentInFlight):
        script.call()
    assert script.sent == 0
    assert sum(script.slept) >= script.settings.in_flight_wait


def test_3_the_same_intent_with_another_body_is_refused_before_sending() -> None:
    script = Script(sends=[OK])
    script.call(script.draft(100))
    script.claims = [ClaimKind.MISMATCH]
    with pytest.raises(payonce.IntentMismatch, match="differs"):
        script.call(script.draft(999))
    assert script.sent == 1


def test_3_the_provider_s_mismatch_answer_is_intent_mismatch() -> None:
    script = Script(sends=[_json(422, {"error": "idempotency key reused"})])
    with pytest.raises(payonce.IntentMismatch):
        script.call()
    assert script.transitions == [T.WRITE_AHEAD, T.FAILED]


# -- retries, giving up, unknown outcomes ---------------------------------------------------


def test_retryable_answers_are_retried_with_the_policy_s_waits() -> None:
    script = Script(sends=[_json(503, {}), _timeout(), OK])
    assert script.call().status_code == 201
    assert script.slept == [1.0, 2.0]
    assert script.transitions == [
        T.WRITE_AHEAD,
        T.ATTEMPT_AMBIGUOUS,
        T.ATTEMPT_STARTED,
        T.ATTEMPT_AMBIGUOUS,
        T.ATTEMPT_STARTED,
        T.SUCCEEDED,
    ]


def test_retry_after_replaces_the_computed_wait() -> None:
    script = Script(sends=[_json(429, {}, **{"Retry-After": "3"}), OK])
    script.call()
    assert script.slept == [3.0]
    assert script.transitions[1] is T.ATTEMPT_NOT_EXECUTED


def test_5_ambiguous_failures_that_exhaust_the_attempts_go_unknown() -> None:
    script = Script(sends=[_timeout()] * 4)
    with pytest.raises(payonce.OutcomeUnknown, match="retries exhausted"):
        script.call()
    assert script.state is IntentState.UNKNOWN
    assert script.transitions[-1] is T.EXHAUSTED
    assert script.sent == STEADY.max_attempts


def test_attempts_that_never_executed_leave_it_pending_and_free() -> None:
    script = Script(sends=[_refused_connection()] * 4)
    with pytest.raises(payonce.ProviderUnavailable):
        script.call()
    assert script.state is IntentState.PENDING
    assert script.released
    assert script.transitions[-1] is T.EXHAUSTED_UNSENT


def test_max_elapsed_ends_the_attempts_before_max_attempts() -> None:
    policy = payonce.RetryPolicy(max_attempts=10, max_elapsed=5.0, initial_wait=2.0, jitter=False)
    script = Script(sends=[_timeout()] * 10, retry=policy)
    with pytest.raises(payonce.OutcomeUnknown):
        script.call()
    assert script.slept == [2.0]  # the next wait (4 s) would end past 5 s
    assert script.sent == 2


def test_a_refusal_by_the_provider_is_authentication_error_and_stays_pending() -> None:
    script = Script(sends=[_json(401, {"error": "bad key"})])
    with pytest.raises(payonce.AuthenticationError) as refused:
        script.call()
    assert not refused.value.may_have_executed
    assert script.transitions == [T.WRITE_AHEAD, T.ATTEMPT_REFUSED]
    assert script.state is IntentState.PENDING


def test_a_refusal_not_by_the_provider_may_have_executed() -> None:
    script = Script(sends=[_page(403)])
    with pytest.raises(payonce.AuthenticationError) as refused:
        script.call()
    assert refused.value.may_have_executed
    assert script.transitions == [T.WRITE_AHEAD, T.ATTEMPT_REFUSED_UNPROVEN]
    assert rule(T.ATTEMPT_REFUSED_UNPROVEN).attempt_ambiguous


def test_a_foreign_success_page_is_ambiguous_and_retried() -> None:
    script = Script(sends=[_page(200), OK])
    assert script.call().status_code == 201
    assert script.transitions[1] is T.ATTEMPT_AMBIGUOUS


def test_an_interrupt_mid_attempt_is_journaled_ambiguous_and_goes_through() -> None:
    script = Script(sends=[KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        script.call()
    assert script.transitions == [T.WRITE_AHEAD, T.ATTEMPT_INTERRUPTED]
    assert not any(isinstance(c, drive.Sleep) for c in script.commands)


def test_a_request_the_http_stack_refused_to_write_never_left() -> None:
    unsupported = httpx.UnsupportedProtocol("ftp", request=httpx.Request("GET", "ftp://x"))
    script = Script(sends=[unsupported])
    with pytest.raises(httpx.UnsupportedProtocol):
        script.call()
    assert script.transitions == [T.WRITE_AHEAD, T.ATTEMPT_NOT_SENT]
    assert script.state is IntentState.PENDING


def test_a_lost_lease_found_at_the_settle_ends_the_drive_with_nothing_more_sent() -> None:
    script = Script(sends=[OK])
    original = script._journal

    def journal(command: drive.Command) -> Any:
        if isinstance(command, drive.Settle):
            raise payonce.IntentInFlight("taken over", key="k", reference=None)
        return original(command)

    script._journal = journal  # type: ignore[method-assign]
    with pytest.raises(payonce.IntentInFlight):
        script.call()
    assert script.sent == 1


# -- resume: key windows and clocks ---------------------------------------------------------


def _crashed_after_sending(script: Script, *, hours_ago: float) -> None:
    """An earlier process journaled and sent it, then died with the attempt in flight."""
    at = script.clock.wall - hours_ago * 3600
    script.journaled(script.draft(), state=IntentState.PENDING, first_sent_at=at)
    script.attempt(ended=False, ambiguous=None, at=at)


def test_resume_resends_under_the_same_key_within_the_key_window() -> None:
    script = Script(DOCUMENTED, sends=[OK])
    _crashed_after_sending(script, hours_ago=1)
    key = script.record.key if script.record else None
    assert script.resume().status_code == 201
    assert script.transitions == [T.ATTEMPT_STARTED, T.SUCCEEDED]
    (send,) = [c for c in script.commands if isinstance(c, drive.Send)]
    assert send.run.key == key


def test_6_past_the_key_window_an_attempt_that_may_have_executed_is_never_resent() -> None:
    script = Script(sends=[OK])
    _crashed_after_sending(script, hours_ago=23)  # past 90% of 24 h
    with pytest.raises(payonce.OutcomeUnknown, match="key lifetime"):
        script.resume()
    assert script.transitions == [T.KEY_WINDOW_PASSED]
    assert script.sent == 0


def test_past_the_key_window_an_intent_that_never_executed_is_sent() -> None:
    script = Script(sends=[OK])
    at = script.clock.wall - 30 * 3600
    script.journaled(script.draft(), state=IntentState.PENDING, first_sent_at=at)
    script.attempt(ended=True, ambiguous=False, at=at)
    assert script.resume().status_code == 201


def test_a_clock_stepped_back_makes_every_first_attempt_look_future_and_never_resends() -> None:
    script = Script(sends=[OK])
    script.journaled(script.draft(), state=IntentState.PENDING)
    script.attempt(ended=True, ambiguous=False)
    script.clock.wall -= 3600  # NTP stepped the wall clock back an hour
    with pytest.raises(payonce.OutcomeUnknown, match="in the future"):
        script.resume()
    assert script.sent == 0


def test_a_wall_clock_step_does_not_move_max_elapsed() -> None:
    policy = payonce.RetryPolicy(max_attempts=3, max_elapsed=60.0, initial_wait=1.0, jitter=False)
    script = Script(sends=[_timeout(), OK], retry=policy)
    script.clock.wall += 10 * 24 * 3600  # a wall clock a year... ten days ahead
    assert script.call().status_code == 201


def test_a_damaged_journaled_request_is_released_and_not_sent() -> None:
    script = Script(sends=[OK])
    script.journaled(script.draft(), state=IntentState.PENDING, body=b'{"amount":999}')
    with pytest.raises(payonce.JournalError, match="fingerprint"):
        script.resume()
    assert script.released
    assert script.sent == 0


def test_8_resume_after_failover_sends_the_journaled_intent_with_its_key() -> None:
    # Another host resumes what the first journaled: the same record, the same key.
    script = Script(DOCUMENTED, sends=[OK])
    _crashed_after_sending(script, hours_ago=0.5)
    assert script.record is not None
    journaled_key = script.record.key
    script.resume()
    assert script.record.key == journaled_key


# -- resume: the provider's clock --------------------------------------------------------------

HOUR, YEAR = 3600.0, 365 * 86_400.0


def _crashed_and_aged(
    script: Script, *, aged: float, answered: bool = False, local_step: float = 0.0
) -> None:
    """Sent now and crashed (the first attempt in flight, or ended by a retryable answer
    that carried the provider's Date); then ``aged`` seconds pass, and this host's clock is
    stepped by ``local_step`` (the provider's is not)."""
    at = script.clock.wall
    script.journaled(script.draft(), state=IntentState.PENDING, first_sent_at=at)
    if answered:
        script.attempt(ended=True, ambiguous=True, at=at, provider_date=script.clock.provider + 1)
    else:
        script.attempt(ended=False, ambiguous=None, at=at)
    script.clock.advance(aged)
    script.clock.wall += local_step


def test_a_clock_set_back_25_hours_never_resends_a_key_the_provider_aged_25_hours() -> None:
    """The issue: crashed after sending; the provider aged 25 h and forgot the key, and this
    host's clock was set back 25 h, so by it the attempt looked a moment old."""
    for answered in (False, True):
        script = Script(sends=[OK])
        _crashed_and_aged(script, aged=25 * HOUR, answered=answered, local_step=-25 * HOUR)
        with pytest.raises(payonce.OutcomeUnknown) as unknown:
            script.resume()
        assert script.sent == 0
        assert script.transitions == [T.KEY_WINDOW_PASSED]
        assert script.clock_reads == 1, "the provider was asked its time before any resend"
        assert script.record is not None
        reason = script.record.unknown_reason or ""
        assert "this host's clock is 90000s behind the provider's" in reason
        assert "first sent 9000" in reason
        assert reason in str(unknown.value)


def test_a_clock_a_year_ahead_never_resends_even_where_the_provider_s_says_it_may() -> None:
    # The first answer dates the key an hour old at the provider, this host's clock a year:
    # one of them is wrong, and only the provider knows which. Not resent: reconciled.
    young = Script(DOCUMENTED, sends=[OK])
    _crashed_and_aged(young, aged=HOUR, answered=True, local_step=YEAR)
    with pytest.raises(payonce.OutcomeUnknown, match="yet by this host's clock"):
        young.resume()
    assert young.sent == 0
    assert young.transitions == [T.KEY_WINDOW_PASSED]
    # The provider forgot it: not resent, though this host's clock is the one that is off.
    forgotten = Script(sends=[OK])
    _crashed_and_aged(forgotten, aged=25 * HOUR, answered=True, local_step=YEAR)
    with pytest.raises(payonce.OutcomeUnknown, match="ahead of the provider's"):
        forgotten.resume()
    assert forgotten.sent == 0
    # No answer ever dated it at the provider: the older age stands, never resent.
    unanswered = Script(sends=[OK])
    _crashed_and_aged(unanswered, aged=HOUR, local_step=YEAR)
    with pytest.raises(payonce.OutcomeUnknown, match="got no answer"):
        unanswered.resume()
    assert unanswered.sent == 0


def test_a_slow_clock_never_resends_a_key_past_the_provider_s_window() -> None:
    for answered in (False, True):
        script = Script(sends=[OK])
        # 23 h at the provider (past 90% of 24 h); this host's clock, 10% slow, counted 20.7.
        _crashed_and_aged(script, aged=23 * HOUR, answered=answered, local_step=-2.3 * HOUR)
        with pytest.raises(payonce.OutcomeUnknown, match="behind the provider's"):
            script.resume()
        assert script.sent == 0


def test_a_fresh_reading_of_the_provider_s_clock_is_not_asked_again() -> None:
    script = Script(DOCUMENTED, sends=[OK])
    _crashed_and_aged(script, aged=HOUR)
    script.settings.provider_clock.read(script.clock.provider - 5, script.clock.mono - 5)
    assert script.resume().status_code == 201
    assert script.clock_reads == 0


def test_a_provider_that_cannot_tell_its_time_leaves_the_key_to_this_host_s_clock() -> None:
    # No answer to any try (each asked again, as a look-up is), or an answer without a
    # Date (asked once: a provider that keeps no Date will not send one the next time).
    for answers in ([_timeout()] * STEADY.max_attempts, [_json(404, {})]):
        young = Script(DOCUMENTED, sends=[OK])
        young.clock_answers = list(answers)
        _crashed_and_aged(young, aged=HOUR)
        assert young.resume().status_code == 201
        assert young.clock_reads == len(answers)
        old = Script(DOCUMENTED, sends=[OK])
        old.clock_answers = list(answers)
        _crashed_and_aged(old, aged=23 * HOUR)
        with pytest.raises(payonce.OutcomeUnknown, match="key lifetime"):
            old.resume()


def test_reconcile_judges_the_key_by_the_date_of_the_look_up_s_answer() -> None:
    script = Script(VERIFYING)
    _unknown(script, hours_ago=0)
    script.clock.advance(25 * HOUR)
    script.clock.wall -= 25 * HOUR  # this host's clock set back: by it, 1 s since the crash
    script.clock.advance(VERIFYING.max_processing + 5)  # the attempt can no longer run
    script.lookups = [_json(200, {"data": []}, date=script.clock.provider_date())]
    absent = script.reconcile()
    assert (absent.outcome, absent.after) == ("not_found", IntentState.UNKNOWN)
    assert "behind the provider's" in absent.detail
    assert script.transitions == [T.RECONCILED_AMBIGUOUS]


# -- verify before resend -------------------------------------------------------------------


def test_verify_found_succeeded_settles_from_the_record_and_sends_nothing_more() -> None:
    script = Script(VERIFYING, sends=[_timeout()], lookups=[_found("succeeded")])
    response = script.call()
    assert response.json()["status"] == "succeeded"
    assert script.sent == 1
    assert script.transitions[-1] is T.VERIFIED_SUCCEEDED


def test_verify_found_failed_raises_the_provider_s_refusal() -> None:
    script = Script(VERIFYING, sends=[_timeout()], lookups=[_found("declined")])
    with pytest.raises(payonce.ProviderError):
        script.call()
    assert script.transitions[-1] is T.VERIFIED_FAILED
    assert script.sent == 1


def test_verify_absent_resends_only_once_the_earlier_attempt_cannot_run() -> None:
    script = Script(VERIFYING, sends=[_timeout(), OK], lookups=[ABSENT] * 10)
    assert script.call().status_code == 201
    resent_at = [i for i, c in enumerate(script.commands) if isinstance(c, drive.Send)][1]
    looked = [c for c in script.commands[:resent_at] if isinstance(c, drive.LookUp)]
    assert len(looked) >= 2
    assert any(isinstance(c, drive.Resending) for c in script.commands)
    # Nothing was resent before max_processing had passed since the attempt ended.
    assert sum(script.slept) >= VERIFYING.max_processing
    assert T.LOOKED_UP in script.transitions


def test_verify_a_look_up_that_cannot_see_the_request_journals_cannot_tell() -> None:
    # A look-up that never finds this kind of request (a Stripe confirm): its empty answers
    # before the resend are journaled as what they are, not as "the provider has no record".
    blind = attrs.evolve(VERIFYING.lookup, finds=lambda method, path: False)
    profile = attrs.evolve(VERIFYING, lookup=blind)
    script = Script(profile, sends=[_timeout(), OK], lookups=[ABSENT] * 10)
    assert script.call().status_code == 201
    looked = [c for c in script.commands if isinstance(c, drive.LookedUp)]
    assert looked
    assert {c.outcome for c in looked} == {"cannot_tell"}
    assert not any(c.sees for c in looked)


def test_verify_a_wall_clock_stepped_forward_does_not_let_the_resend_out_sooner() -> None:
    script = Script(VERIFYING, sends=[_timeout(), OK], lookups=[ABSENT] * 10)

    def step_forward() -> None:
        script.clock.wall += 3600  # NTP, mid-verification: an hour ahead
        script.on_look_up = None

    script.on_look_up = step_forward
    assert script.call().status_code == 201
    # The earlier attempt could still run at the provider for max_processing after it
    # ended: that much time really passed (the monotonic clock) before the resend.
    assert sum(script.slept) >= VERIFYING.max_processing
    assert len([c for c in script.commands if isinstance(c, drive.LookUp)]) >= 2


def test_verify_look_ups_that_never_answer_give_up_unknown_without_resending() -> None:
    policy = payonce.RetryPolicy(max_attempts=5, max_elapsed=20.0, initial_wait=1.0, jitter=False)
    script = Script(VERIFYING, sends=[_timeout()], lookups=[_timeout()] * 50, retry=policy)
    with pytest.raises(payonce.OutcomeUnknown):
        script.call()
    assert script.sent == 1
    assert script.state is IntentState.UNKNOWN


def test_verify_a_record_not_final_yet_is_never_a_reason_to_resend() -> None:
    policy = payonce.RetryPolicy(max_attempts=5, max_elapsed=40.0, initial_wait=1.0, jitter=False)
    script = Script(
        VERIFYING, sends=[_timeout()], lookups=[_found("processing")] * 50, retry=policy
    )
    with pytest.raises(payonce.OutcomeUnknown):
        script.call()
    assert script.sent == 1


def test_verify_on_resume_looks_before_sending_after_a_crash_in_flight() -> None:
    script = Script(VERIFYING, lookups=[_found("succeeded")])
    _crashed_after_sending(script, hours_ago=1)
    assert script.resume().json()["status"] == "succeeded"
    assert script.sent == 0


# -- reconciliation ---------------------------------------------------------------------------


def _unknown(script: Script, *, hours_ago: float = 1.0) -> None:
    _crashed_after_sending(script, hours_ago=hours_ago)
    assert script.record is not None
    script.record = attrs.evolve(script.record, state=IntentState.UNKNOWN)
    script.attempts[-1] = attrs.evolve(
        script.attempts[-1], ended_at=script.attempts[-1].started_at + 1, ambiguous=True
    )


def test_reconcile_found_settles_from_the_provider_s_record() -> None:
    script = Script(VERIFYING, lookups=[_found("succeeded")])
    _unknown(script)
    found = script.reconcile()
    assert (found.outcome, found.after) == ("found", IntentState.SUCCEEDED)
    assert script.transitions == [T.RECONCILED_SUCCEEDED]
    assert script.sent == 0


def test_reconcile_found_failed_settles_failed() -> None:
    script = Script(VERIFYING, lookups=[_found("declined")])
    _unknown(script)
    assert script.reconcile().after is IntentState.FAILED
    assert script.transitions == [T.RECONCILED_FAILED]


def test_reconcile_absent_within_the_key_window_goes_back_to_pending() -> None:
    script = Script(VERIFYING, lookups=[ABSENT])
    _unknown(script)
    absent = script.reconcile()
    assert (absent.outcome, absent.after) == ("not_found", IntentState.PENDING)
    assert script.transitions == [T.RECONCILED_ABSENT]


def test_reconcile_absent_past_the_key_window_stays_unknown() -> None:
    script = Script(VERIFYING, lookups=[ABSENT])
    _unknown(script, hours_ago=23)
    absent = script.reconcile()
    assert (absent.outcome, absent.after) == ("not_found", IntentState.UNKNOWN)
    assert "may have expired" in absent.detail
    assert script.transitions == [T.RECONCILED_AMBIGUOUS]


@pytest.mark.parametrize("hours_ago", [1.0, 23.0], ids=["in the key window", "past it"])
def test_reconcile_of_a_request_the_look_up_cannot_see_never_says_no_record(
    hours_ago: float,
) -> None:
    # A Stripe confirm carries no metadata tag: the search's empty answer proves nothing,
    # and the operator must not read "the provider has no record" of a confirm that paid.
    blind = attrs.evolve(VERIFYING.lookup, finds=lambda method, path: False)
    script = Script(attrs.evolve(VERIFYING, lookup=blind), lookups=[ABSENT])
    _unknown(script, hours_ago=hours_ago)
    absent = script.reconcile()
    assert absent.outcome == "cannot_tell"  # the label too: not "not_found"
    assert "the status look-up cannot see a POST /v1/payments" in absent.detail
    assert "proves nothing" in absent.detail
    assert "has no record" not in absent.detail


def test_reconcile_absent_while_an_earlier_attempt_may_run_stays_unknown() -> None:
    script = Script(VERIFYING, lookups=[ABSENT])
    _unknown(script, hours_ago=0)  # its attempt ended a second ago: it may still run
    absent = script.reconcile()
    assert (absent.outcome, absent.after) == ("still_unknown", IntentState.UNKNOWN)


def test_reconcile_a_refused_look_up_is_journaled_then_raised() -> None:
    script = Script(VERIFYING, lookups=[_json(401, {"error": "bad key"})])
    _unknown(script)
    with pytest.raises(payonce.ProviderError, match="refused the status look-up"):
        script.reconcile()
    assert script.transitions == [T.RECONCILED_AMBIGUOUS]


def test_reconcile_look_ups_that_fail_are_retried_then_leave_it_unknown() -> None:
    script = Script(VERIFYING, lookups=[_timeout(), _json(503, {})] * 2)
    _unknown(script)
    failed = script.reconcile()
    assert (failed.outcome, failed.after) == ("error", IntentState.UNKNOWN)
    assert script.looked_up == STEADY.max_attempts
    assert script.slept == [1.0, 2.0, 4.0]


def test_reconcile_skips_what_is_not_unknown_without_a_command() -> None:
    script = Script(VERIFYING)
    script.journaled(script.draft(), state=IntentState.PENDING)
    skipped = script.reconcile()
    assert skipped.outcome == "skipped"
    assert script.commands == []


def test_reconcile_without_a_look_up_resends_under_the_key_within_its_window() -> None:
    script = Script(GENERIC, sends=[OK])  # GENERIC has no status look-up
    _unknown(script, hours_ago=0.1)  # 6 minutes: within the assumed lifetime's window
    resent = script.reconcile()
    assert (resent.outcome, resent.after) == ("resent", IntentState.SUCCEEDED)
    assert script.transitions == [T.RECONCILED_BY_RESEND, T.ATTEMPT_STARTED, T.SUCCEEDED]
    (send,) = [c for c in script.commands if isinstance(c, drive.Send)]
    assert script.record is not None
    assert send.run.key == script.record.key
    assert script.looked_up == 0


def test_reconcile_without_a_look_up_past_the_key_window_sends_nothing() -> None:
    script = Script(GENERIC)
    _unknown(script, hours_ago=23)
    kept = script.reconcile()
    assert (kept.outcome, kept.after) == ("still_unknown", IntentState.UNKNOWN)
    assert "no longer safe" in kept.detail
    assert script.transitions == [T.RECONCILED_KEY_WINDOW_PASSED]
    assert script.sent == 0


# A key drawn for its one call (an SDK's, outside any block): the code run again paid under
# another key, so nothing resends it on payonce's own; an operator's --resend does.


def _per_call(script: Script) -> None:
    assert script.record is not None
    script.record = attrs.evolve(script.record, key_per_call=True)


def test_resume_of_a_per_call_key_marks_it_unknown_and_sends_nothing() -> None:
    script = Script(DOCUMENTED, sends=[OK])
    _crashed_after_sending(script, hours_ago=0.1)  # well within the key window
    _per_call(script)
    with pytest.raises(payonce.OutcomeUnknown, match="drawn for that one call") as kept:
        script.resume()
    assert script.transitions == [T.PER_CALL_KEY]
    assert (script.sent, script.looked_up) == (0, 0)
    assert script.record is not None
    assert "--resend" in (script.record.unknown_reason or "")
    assert "payonce reconcile" in str(kept.value)


def test_reconcile_of_a_per_call_key_without_a_look_up_sends_nothing_unless_asked() -> None:
    script = Script(GENERIC, sends=[OK])
    _unknown(script, hours_ago=0.1)  # a key of its caller's would be resent now
    _per_call(script)
    kept = script.reconcile()
    assert (kept.outcome, kept.after) == ("still_unknown", IntentState.UNKNOWN)
    assert "drawn for that one call" in kept.detail
    assert script.transitions == [T.RECONCILED_PER_CALL_KEY]
    assert script.sent == 0
    resent = script.reconcile(resend=True)
    assert (resent.outcome, resent.after) == ("resent", IntentState.SUCCEEDED)
    assert script.sent == 1


def test_a_look_up_that_finds_no_record_of_a_per_call_key_keeps_it_unknown() -> None:
    script = Script(VERIFYING, lookups=[ABSENT])
    _unknown(script, hours_ago=1)  # a key of its caller's would go back to pending
    _per_call(script)
    kept = script.reconcile()
    assert (kept.outcome, kept.after) == ("not_found", IntentState.UNKNOWN)
    assert "drawn for that one call" in kept.detail
    assert script.transitions == [T.RECONCILED_AMBIGUOUS]
    assert script.sent == 0


def test_a_look_up_that_finds_a_per_call_key_s_record_settles_it() -> None:
    script = Script(VERIFYING, lookups=[_found("succeeded")])
    _unknown(script)
    _per_call(script)
    found = script.reconcile()
    assert (found.outcome, found.after) == ("found", IntentState.SUCCEEDED)
    assert script.sent == 0


def test_a_call_again_of_an_unknown_intent_without_a_look_up_resends_it() -> None:
    script = Script(GENERIC, sends=[OK], claims=[ClaimKind.UNKNOWN])
    _unknown(script, hours_ago=0.1)
    assert script.call().status_code == 201
    assert script.transitions == [T.RECONCILED_BY_RESEND, T.ATTEMPT_STARTED, T.SUCCEEDED]


# An assumed key lifetime (GENERIC's, Square's 24 h): resent on payonce's own only within
# ASSUMED_LIFETIME_RESEND_WINDOW of the first send; within 90% of it when an operator asks.


def test_an_hour_old_unknown_intent_of_an_assumed_lifetime_is_not_resent_on_its_own() -> None:
    script = Script(GENERIC, sends=[OK])
    _unknown(script, hours_ago=1)
    kept = script.reconcile()
    assert (kept.outcome, kept.after) == ("still_unknown", IntentState.UNKNOWN)
    assert "assumed, not documented" in kept.detail
    assert script.transitions == [T.RECONCILED_KEY_WINDOW_PASSED]
    assert script.sent == 0


def test_a_call_again_of_an_hour_old_unknown_intent_of_an_assumed_lifetime_sends_nothing() -> None:
    script = Script(GENERIC, sends=[OK], claims=[ClaimKind.UNKNOWN])
    _unknown(script, hours_ago=1)
    with pytest.raises(payonce.OutcomeUnknown, match="payonce abandon"):
        script.call()
    assert script.transitions == [T.RECONCILED_KEY_WINDOW_PASSED]
    assert script.sent == 0


def test_an_operator_s_resend_of_an_assumed_lifetime_reaches_90_percent_of_it() -> None:
    script = Script(GENERIC, sends=[OK])
    _unknown(script, hours_ago=1)
    resent = script.reconcile(resend=True)
    assert (resent.outcome, resent.after) == ("resent", IntentState.SUCCEEDED)
    assert script.transitions == [T.RECONCILED_BY_RESEND, T.ATTEMPT_STARTED, T.SUCCEEDED]


def test_an_operator_s_resend_is_refused_past_90_percent_of_the_assumed_lifetime() -> None:
    script = Script(GENERIC, sends=[OK])
    _unknown(script, hours_ago=23)
    kept = script.reconcile(resend=True)
    assert (kept.outcome, kept.after) == ("still_unknown", IntentState.UNKNOWN)
    assert script.sent == 0


def test_a_documented_lifetime_is_resent_on_its_own_within_90_percent_of_it() -> None:
    script = Script(DOCUMENTED, sends=[OK], claims=[ClaimKind.UNKNOWN])
    _unknown(script, hours_ago=20)
    assert script.call().status_code == 201
    assert script.transitions == [T.RECONCILED_BY_RESEND, T.ATTEMPT_STARTED, T.SUCCEEDED]


# The key window is a deadline for every attempt of a resend, its first included: an
# attempt that could end (max_processing after it leaves) past it is not sent.
WINDOW = KEY_LIFETIME * 0.9
SERVER_ERROR = _json(503, {"error": "unavailable"})
IN_TIME_ONCE = (WINDOW - GENERIC.max_processing - 0.5) / 3600
"""Hours since the first send after which a resend leaving now ends inside the window, and
a retry leaving a second later could not."""


def test_a_resend_s_retries_stop_before_one_could_end_past_the_key_window() -> None:
    script = Script(DOCUMENTED, sends=[SERVER_ERROR] * 4)
    _unknown(script, hours_ago=IN_TIME_ONCE)  # the first resend is in time
    kept = script.reconcile()
    # The retry would leave 1 s later and could run 30 s (max_processing): past the window.
    assert script.sent == 1
    assert kept.after is IntentState.UNKNOWN
    assert script.transitions == [
        T.RECONCILED_BY_RESEND,
        T.ATTEMPT_STARTED,
        T.ATTEMPT_AMBIGUOUS,
        T.KEY_WINDOW_PASSED,
    ]
    assert script.record is not None
    assert script.record.unknown_reason is not None
    assert script.record.unknown_reason.startswith("retries stopped")
    assert "retries stopped" in kept.detail


def test_a_resend_s_retries_go_on_while_they_end_inside_the_key_window() -> None:
    script = Script(DOCUMENTED, sends=[SERVER_ERROR, SERVER_ERROR, OK])
    _unknown(script, hours_ago=(WINDOW - 120) / 3600)
    resent = script.reconcile()
    assert (resent.outcome, resent.after) == ("resent", IntentState.SUCCEEDED)
    assert script.sent == 3


def test_a_resumed_ambiguous_intent_s_retries_stop_at_the_key_window_too() -> None:
    script = Script(DOCUMENTED, sends=[SERVER_ERROR] * 4)
    _crashed_after_sending(script, hours_ago=IN_TIME_ONCE)
    with pytest.raises(payonce.OutcomeUnknown, match="retries stopped"):
        script.resume()
    assert script.sent == 1
    assert script.transitions[-1] is T.KEY_WINDOW_PASSED


def test_a_resend_s_first_attempt_that_could_end_past_the_key_window_is_not_sent() -> None:
    # Inside the window when the resume begins, but the provider may run the resend for
    # max_processing (30 s): it could end 10 s past the window.
    for resend in ("resume", "reconcile"):
        script = Script(DOCUMENTED, sends=[OK])
        if resend == "resume":
            _crashed_after_sending(script, hours_ago=(WINDOW - 20) / 3600)
            with pytest.raises(payonce.OutcomeUnknown, match="not resent: the provider may run"):
                script.resume()
            assert script.transitions == [T.KEY_WINDOW_PASSED]
        else:
            _unknown(script, hours_ago=(WINDOW - 20) / 3600)
            kept = script.reconcile()
            assert kept.after is IntentState.UNKNOWN
            assert "not resent: the provider may run it for 30s" in kept.detail
            assert script.transitions == [T.RECONCILED_BY_RESEND, T.KEY_WINDOW_PASSED]
        assert script.sent == 0


def test_a_resend_after_verify_s_look_ups_is_judged_when_it_goes_out() -> None:
    # Sent first long ago (inside the window when the resume begins); a later attempt
    # crashed in flight a moment ago, so verify looks up until it can no longer run (30 s):
    # the resend would leave then, and could end past the window.
    script = Script(VERIFYING, lookups=[ABSENT] * 10, sends=[OK])
    first = script.clock.wall - (WINDOW - 45)
    script.journaled(script.draft(), state=IntentState.PENDING, first_sent_at=first)
    script.attempt(ended=True, ambiguous=True, at=first)
    script.attempt(ended=False, ambiguous=None, at=script.clock.wall - 5)
    with pytest.raises(payonce.OutcomeUnknown, match="not resent: the provider may run"):
        script.resume()
    assert script.looked_up >= 1
    assert script.sent == 0
    assert script.transitions[-1] is T.KEY_WINDOW_PASSED


def test_a_resumed_intent_that_never_left_is_retried_whatever_its_age() -> None:
    script = Script(sends=[SERVER_ERROR, OK])
    at = script.clock.wall - (WINDOW - 20)
    script.journaled(script.draft(), state=IntentState.PENDING, first_sent_at=at)
    script.attempt(ended=True, ambiguous=False, at=at)  # provably never executed
    assert script.resume().status_code == 201
    assert script.sent == 2


def _settled_without_its_body(script: Script, *, seconds_ago: float) -> None:
    """A payment that succeeded ``seconds_ago`` with an answer too large to journal."""
    at = script.clock.wall - seconds_ago
    stored = StoredResponse(201, (), b"", body_stored=False)
    script.journaled(script.draft(), state=IntentState.SUCCEEDED, first_sent_at=at, response=stored)
    script.attempt(ended=True, ambiguous=False, at=at)


def test_an_answer_got_again_is_not_asked_for_when_it_could_be_processed_past_the_window() -> None:
    # Asked for 20 s before the window ends, the provider may process the resend for
    # max_processing (30 s): it could end with the key forgotten and execute twice.
    script = Script(DOCUMENTED, sends=[OK])
    _settled_without_its_body(script, seconds_ago=WINDOW - 20)
    journaled = script.record
    with pytest.raises(payonce.IntentStateError) as refused:
        script.call()
    assert script.asked_again == 0
    assert "a resend under its key is no longer safe" in str(refused.value)
    assert script.record == journaled, "the journal still holds what it held"


def test_an_answer_got_again_is_asked_for_while_its_processing_ends_inside_the_window() -> None:
    script = Script(DOCUMENTED, sends=[OK])
    _settled_without_its_body(script, seconds_ago=WINDOW - 40)
    again = script.call()
    assert (again.status_code, again.json()["id"]) == (201, "pay_1")
    assert script.asked_again == 1


def test_an_answer_got_again_stops_retrying_before_a_try_could_end_past_the_window() -> None:
    # Tries at 33 s and (a 1 s wait later) 32 s before the window's end both end inside it;
    # the third, after a 2 s wait, could end at the window's end itself.
    script = Script(DOCUMENTED, sends=[SERVER_ERROR, SERVER_ERROR, OK])
    _settled_without_its_body(script, seconds_ago=WINDOW - 33)
    with pytest.raises(payonce.IntentStateError, match="no longer safe"):
        script.call()
    assert script.asked_again == 2
    assert script.slept == [1.0, 2.0]


# A first send dated by a clock ahead, set right before the re-run, looked younger than it
# was: the boot clock (CLOCK_BOOTTIME, journaled with each attempt) cannot be stepped.
AHEAD = 600.0
THIS_BOOT = BootReading("shop-1", "boot-a", 5000.0)


def _sent_ahead_then_set_right(script: Script, *, after: float) -> None:
    """Sent (no answer) while this host's clock was 10 minutes ahead; ``after`` seconds
    later the clock has been set right."""
    script.clock.wall += AHEAD
    _crashed_after_sending(script, hours_ago=0)
    script.clock.advance(after)
    script.clock.wall -= AHEAD


def test_a_clock_ahead_at_the_first_send_and_set_right_cannot_stretch_the_15_minutes() -> None:
    script = Script(sends=[OK], clock=FakeClock(booted=THIS_BOOT))
    _sent_ahead_then_set_right(script, after=20 * 60)  # 10 minutes by the wall clock
    with pytest.raises(payonce.OutcomeUnknown, match="first sent 1200s ago"):
        script.resume()
    assert script.sent == 0
    assert script.transitions == [T.KEY_WINDOW_PASSED]


def test_without_a_boot_clock_the_wall_clock_s_age_stands_as_before() -> None:
    script = Script(sends=[OK], clock=FakeClock())
    _sent_ahead_then_set_right(script, after=20 * 60)
    assert script.resume().status_code == 201  # the stretch the boot clock closes


def test_after_a_reboot_of_the_same_host_the_key_is_at_least_as_old_as_the_boot() -> None:
    script = Script(sends=[OK], clock=FakeClock(booted=THIS_BOOT))
    _sent_ahead_then_set_right(script, after=AHEAD + 300)  # 5 minutes by the wall clock
    script.clock.booted = BootReading("shop-1", "boot-b", 1000.0)  # up for 16 minutes
    with pytest.raises(payonce.OutcomeUnknown, match="first sent 1000s ago"):
        script.resume()
    assert script.sent == 0


def test_another_host_s_boot_clock_says_nothing_of_the_first_send() -> None:
    script = Script(sends=[OK], clock=FakeClock(booted=THIS_BOOT))
    _sent_ahead_then_set_right(script, after=AHEAD + 300)
    script.clock.booted = BootReading("shop-2", "boot-c", 900_000.0)
    assert script.resume().status_code == 201


def test_a_re_run_in_the_same_boot_inside_the_window_is_resent() -> None:
    script = Script(sends=[OK], clock=FakeClock(booted=THIS_BOOT))
    _sent_ahead_then_set_right(script, after=AHEAD + 120)
    assert script.resume().status_code == 201
    assert script.sent == 1


def test_a_call_again_of_an_unknown_intent_with_a_look_up_is_refused_as_before() -> None:
    script = Script(VERIFYING, sends=[OK], claims=[ClaimKind.UNKNOWN])
    _unknown(script)
    with pytest.raises(payonce.OutcomeUnknown, match="payonce reconcile"):
        script.call()
    assert script.transitions == []
    assert script.sent == 0


# -- the table, both ways ------------------------------------------------------------------


def _every_transition_the_scenarios_apply() -> Iterator[Transition]:
    for name, scenario in list(globals().items()):
        if name.startswith("test_") and name != "test_every_row_of_the_table_is_applied":
            yield from _applied_by(scenario)


def _applied_by(scenario: Any) -> list[Transition]:
    applied: list[Transition] = []
    original = Script._apply

    def recording(self: Script, transition: Transition, **changes: Any) -> IntentRecord:
        applied.append(transition)
        return original(self, transition, **changes)

    Script._apply = recording  # type: ignore[method-assign]
    try:
        with contextlib.suppress(Exception):  # the scenario asserts on its own; here we listen
            scenario()
    finally:
        Script._apply = original  # type: ignore[method-assign]
    return applied


def test_every_row_of_the_table_is_applied() -> None:
    """Every transition is asked for by some scenario of the drive's, but an operator's
    abandon and a caller's acknowledgement: the journal's own commands, applied by name."""
    applied = set(_every_transition_the_scenarios_apply()) | {T.WRITE_AHEAD}
    operators = {T.ABANDONED, T.ACKNOWLEDGED}
    assert applied | operators == set(Transition)
    journal = Path(payonce.__file__).parent / "_journal"
    applied_there = "".join(p.read_text() for p in journal.glob("*.py"))
    for transition in operators:
        assert f"Transition.{transition.name}" in applied_there


def test_a_crashed_send_of_an_assumed_lifetime_is_resumed_only_within_15_minutes() -> None:
    # A red-team's case: a pending intent (its sender killed after sending) of Square's or
    # generic's assumed 24 h was resent an hour later by a re-run, resume and the worker,
    # where the unknown intent was not: a provider keeping keys 30 minutes paid twice.
    young = Script(sends=[OK])
    _crashed_after_sending(young, hours_ago=0.2)  # 12 minutes
    assert young.resume().status_code == 201

    old = Script(sends=[OK])
    _crashed_after_sending(old, hours_ago=1)
    with pytest.raises(payonce.OutcomeUnknown, match="assumed, not documented") as kept:
        old.resume()
    key = old.record.key if old.record else None
    assert f"`payonce reconcile {key} --resend` resends it" in str(kept.value)
    assert old.sent == 0
    assert old.transitions == [T.KEY_WINDOW_PASSED]

    again = Script(sends=[OK])
    _crashed_after_sending(again, hours_ago=1)
    with pytest.raises(payonce.OutcomeUnknown, match="assumed, not documented"):
        again.call()
    assert again.sent == 0


ASSUMED_LOOKUP = attrs.evolve(VERIFYING, name="assumed-lookup", key_lifetime_documented=False)


def test_reconcile_and_resume_agree_on_an_assumed_lifetime_s_window() -> None:
    # A red-team's case: with a look-up and an assumed lifetime, reconcile sent an hour-old
    # unknown intent back to pending (90% of the lifetime) and resume sent it back to
    # unknown (15 minutes), for ever. A look-up by key finds nothing once the key is gone,
    # so "no record" counts only within the window a resend is made in.
    script = Script(ASSUMED_LOOKUP, lookups=[ABSENT], sends=[OK])
    _unknown(script, hours_ago=1)
    kept = script.reconcile()
    assert (kept.outcome, kept.after) == ("not_found", IntentState.UNKNOWN)
    assert f"`payonce reconcile {script.record.key if script.record else ''} --resend`" in (
        kept.detail
    )
    assert script.sent == 0


def test_an_operator_s_reconcile_resend_sends_it_at_once_not_through_a_resume() -> None:
    script = Script(ASSUMED_LOOKUP, lookups=[ABSENT] * 10, sends=[OK])
    _unknown(script, hours_ago=1)
    resent = script.reconcile(resend=True)
    assert resent.outcome == "not_found"
    assert resent.after is IntentState.SUCCEEDED
    assert script.sent == 1


# -- a call's own retries: bounded by the key window once an attempt may have executed --------

TEN_MINUTES = attrs.evolve(GENERIC, key_lifetime=600.0, key_lifetime_documented=True)
PATIENT = payonce.RetryPolicy(
    max_attempts=1000, max_elapsed=3600.0, initial_wait=60.0, max_wait=60.0, jitter=False
)


def _dated_503(provider_time: float) -> httpx.Response:
    return _json(503, {"error": "unavailable"}, date=email.utils.formatdate(provider_time, True))


def test_a_call_s_retries_stop_once_the_provider_s_date_shows_its_key_window_passed() -> None:
    # The red-team's case: the first attempt may have executed (a 503 after executing);
    # the provider keeps keys 10 minutes, and its next answer's Date says 700 s have passed
    # there. The call kept retrying for max_elapsed (an hour) and paid twice.
    script = Script(TEN_MINUTES, retry=PATIENT)
    provider = script.clock.provider
    script.sends = [_dated_503(provider), _dated_503(provider + 700), OK]
    with pytest.raises(payonce.OutcomeUnknown) as unknown:
        script.call()
    assert script.sent == 2
    assert script.state is IntentState.UNKNOWN
    assert script.transitions[-1] is T.KEY_WINDOW_PASSED
    assert script.record is not None
    reason = script.record.unknown_reason or ""
    assert reason.startswith("retries stopped")
    assert "by the provider's clock it was first sent" in reason
    assert "key lifetime of 600s" in str(unknown.value)


def test_a_call_s_retries_of_an_assumed_lifetime_stop_within_15_minutes_of_its_first_send() -> None:
    # No Date to go by: this host's clock, carried on by the monotonic one.
    script = Script(GENERIC, sends=[SERVER_ERROR] * 100, retry=PATIENT)
    with pytest.raises(payonce.OutcomeUnknown, match="assumed, not documented") as unknown:
        script.call()
    # Every attempt that went out could end (30 s later) inside the 15 minutes; one more,
    # a minute later, could not.
    assert script.sent == 15
    assert (script.sent - 1) * 60.0 + GENERIC.max_processing < 15 * 60
    assert script.sent * 60.0 + GENERIC.max_processing >= 15 * 60
    assert script.transitions[-1] is T.KEY_WINDOW_PASSED
    # As a resume says it: an operator who knows the provider keeps the key may resend.
    key = script.record.key if script.record else ""
    assert f"`payonce reconcile {key} --resend` resends it" in str(unknown.value)


def test_a_call_s_key_window_counts_from_its_first_attempt_that_may_have_executed() -> None:
    # Twenty minutes of rate limits (never executed: the provider has not kept the key),
    # then a 503 that may have executed: the window begins there, and the retry goes out.
    rate_limited = _json(429, {"error": "slow down"})
    script = Script(TEN_MINUTES, sends=[rate_limited] * 20 + [SERVER_ERROR, OK], retry=PATIENT)
    assert script.call().status_code == 201
    assert script.sent == 22


def test_a_call_s_retries_inside_the_key_window_go_on_as_before() -> None:
    script = Script(TEN_MINUTES, sends=[SERVER_ERROR, SERVER_ERROR, OK])
    assert script.call().status_code == 201
    assert script.sent == 3


# -- the provider's clock, when asking it fails -----------------------------------------------


def _dated_404() -> httpx.Response:
    return httpx.Response(404, request=httpx.Request("HEAD", "https://provider.test"))


def test_one_lost_answer_to_the_provider_s_clock_is_asked_again() -> None:
    # Set back 25 h, this host's clock says the key is a moment old; the provider's, 25 h.
    script = Script(sends=[OK])
    _crashed_and_aged(script, aged=25 * HOUR, local_step=-25 * HOUR)
    dated = _dated_404()
    dated.headers["Date"] = script.clock.provider_date()
    script.clock_answers = [_refused_connection(), dated]
    with pytest.raises(payonce.OutcomeUnknown, match="behind the provider's"):
        script.resume()
    assert script.clock_reads == 2
    assert script.sent == 0


def test_without_the_provider_s_clock_its_journaled_dates_judge_the_key_too() -> None:
    # This host's clock was 3 h ahead when the first attempt was sent (its answer dated by
    # the provider), and set right since: by it the key is 20 h old, short of 90% of 24 h;
    # by the provider's Date on that answer, 23 h. Asking the provider its time fails.
    script = Script(DOCUMENTED, sends=[OK])
    script.clock.wall += 3 * HOUR
    at = script.clock.wall
    script.journaled(script.draft(), state=IntentState.PENDING, first_sent_at=at)
    script.attempt(ended=True, ambiguous=True, at=at, provider_date=script.clock.provider + 1)
    script.clock.advance(23 * HOUR)
    script.clock.wall -= 3 * HOUR
    script.clock_answers = [_timeout()] * STEADY.max_attempts
    with pytest.raises(payonce.OutcomeUnknown, match="could not be read now") as unknown:
        script.resume()
    assert "dates that attempt 828" in str(unknown.value)  # 23 h (and the tries' waits)
    assert script.clock_reads == STEADY.max_attempts
    assert script.sent == 0
    assert script.transitions == [T.KEY_WINDOW_PASSED]


# -- a replay's answer got again: what a different answer means ------------------------------


def test_a_replay_s_answer_got_again_as_another_success_says_it_may_have_executed_twice() -> None:
    # Settled 201 with an answer too large to journal; asked again under its key, the
    # provider answers 200: not its replay of the first, perhaps a second execution.
    script = Script(DOCUMENTED, sends=[_json(200, {"id": "pay_2", "status": "succeeded"})])
    at = script.clock.wall - 60
    stored = StoredResponse(201, (), b"", body_stored=False)
    script.journaled(script.draft(), state=IntentState.SUCCEEDED, first_sent_at=at, response=stored)
    script.attempt(ended=True, ambiguous=False, at=at)
    journaled = script.record
    with pytest.raises(payonce.IntentStateError) as refused:
        script.call()
    message = str(refused.value)
    assert "did not replay it under its key (HTTP 200, not 201)" in message
    assert "may have executed it a second time" in message
    assert "check at the provider" in message
    assert script.record == journaled, "the journal still holds what it held"
