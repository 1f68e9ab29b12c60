"""The decision core, without HTTP or SQL: states, transitions, key age, leases, claims,
look-up verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import attrs
import httpx
import pytest

from payonce._lifecycle import (
    RULES,
    ClaimKind,
    IntentState,
    LookupKind,
    Transition,
    _leases,
    classify_lookup,
    classify_lookup_error,
    contract_table,
    decide_claim,
    is_mismatch,
    lease_blocks,
    may_have_executed,
    new_owner,
    owner_ended,
    owner_is_dead,
    resend_refusal,
    target,
)
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
    for rule in RULES:
        if any(s is not None and s.is_final for s in rule.sources):
            assert rule.transition is Transition.ACKNOWLEDGED


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


def test_a_live_lease_of_another_living_owner_blocks() -> None:
    other = new_owner()  # this very process: alive
    assert lease_blocks(other, 110.0, owner=new_owner(), now=100.0)
    assert not lease_blocks(other, 100.0, owner=new_owner(), now=100.0), "expired"
    assert not lease_blocks(other, 110.0, owner=other, now=100.0), "its own"
    assert not lease_blocks(None, None, owner=other, now=100.0), "free"
    assert not lease_blocks(other, 110.0, owner=new_owner(), now=100.0, is_stale=lambda o: True)


def test_an_owner_on_another_host_is_never_judged_dead() -> None:
    assert not owner_is_dead("elsewhere/abcd/123:1:1:deadbeef")
    assert not owner_is_dead(None)
    assert not owner_is_dead("garbage")


def _owner_of(pid: int) -> str:
    host = new_owner().rsplit(":", 3)[0]
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return f"{host}:{pid}:{stat[19]}:0123456789ab"


def test_an_owner_whose_process_exited_and_was_reaped_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    owner = _owner_of(child.pid)
    assert not owner_is_dead(owner)
    child.kill()
    child.wait()
    assert owner_is_dead(owner)


def test_a_zombie_process_is_dead() -> None:
    # A child that has exited but that its parent has not waited for yet keeps its pid:
    # it will never renew or release a lease again.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    owner = _owner_of(child.pid)
    try:
        assert not owner_is_dead(owner)
        os.kill(child.pid, 9)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        assert owner_is_dead(owner)
    finally:
        child.kill()
        child.wait()


def test_a_call_of_this_process_holds_its_lease_until_it_has_ended() -> None:
    ended, running = new_owner(), new_owner()
    owner_ended(ended)
    assert owner_is_dead(ended), "it will never renew nor release its lease"
    assert not lease_blocks(ended, 110.0, owner=new_owner(), now=100.0)
    assert not owner_is_dead(running), "another thread's call, still running"
    assert lease_blocks(running, 110.0, owner=new_owner(), now=100.0)


def test_only_the_latest_ended_calls_are_remembered_and_a_forgotten_one_waits_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_leases, "_ended", {})
    monkeypatch.setattr(_leases, "_ENDED_KEPT", 2)
    first, second, third = new_owner(), new_owner(), new_owner()
    for owner in (first, second, third):
        owner_ended(owner)
    assert not owner_is_dead(first), "forgotten: alive again, its lease runs to expiry"
    assert owner_is_dead(second)
    assert owner_is_dead(third)


def test_a_forked_child_starts_with_no_ended_calls_and_a_free_lock() -> None:
    """Forked while another thread registers an ended call (the lock held): the child must
    neither inherit the parent's calls nor wait forever for the lock."""
    parent_call = new_owner()
    owner_ended(parent_call)
    with _leases._ended_lock:
        pid = os.fork()
        if pid == 0:  # the child: judge, register, and say how it went
            child_call = new_owner()
            owner_ended(child_call)
            fine = owner_is_dead(child_call) and list(_leases._ended) == [child_call]
            os._exit(0 if fine else 1)
    deadline = time.monotonic() + 20
    while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the child waited for the lock its parent's thread held at the fork")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(waited[1]) == 0


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


def test_a_claim_replays_final_refuses_unknown_waits_for_a_live_lease_and_takes_a_free_one() -> (
    None
):
    me, other = new_owner(), new_owner()
    assert decide_claim(Stored(state=SUCCEEDED), owner=me, now=1.0) is ClaimKind.FINAL
    assert decide_claim(Stored(state=ABANDONED), owner=me, now=1.0) is ClaimKind.FINAL
    assert decide_claim(Stored(state=UNKNOWN), owner=me, now=1.0) is ClaimKind.UNKNOWN
    assert decide_claim(Stored(state=UNKNOWN), owner=me, now=1.0, unknown=True) is None
    leased = Stored(lease_owner=other, lease_expires_at=10.0)
    assert decide_claim(leased, owner=me, now=1.0) is ClaimKind.LEASED
    assert decide_claim(leased, owner=me, now=1.0, is_stale=lambda o: o == other) is None
    assert decide_claim(leased, owner=me, now=10.0) is None
    assert decide_claim(Stored(), owner=me, now=1.0) is None


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
    other = new_owner()
    a_year = 365 * 86_400.0
    assert not lease_blocks(other, 100.0 + a_year, owner="me", now=100.0, lease_seconds=120.0)
    assert lease_blocks(other, 100.0 + 200.0, owner="me", now=100.0, lease_seconds=120.0)
