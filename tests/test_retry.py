"""The retry classifier and the backoff policy: one decision per test."""

from __future__ import annotations

import email.utils
import json
import random

import httpx
import hypothesis
import pytest
from hypothesis import strategies as st

from payonce import ProviderProfile, RetryPolicy
from payonce._lifecycle import Outcome, classify_error, classify_response, parse_retry_after
from payonce.providers import get_profile

# The built-in profiles, as a client given provider="stripe" (and so on) uses them.
GENERIC, STRIPE, ADYEN, MOLLIE = map(get_profile, ["generic", "stripe", "adyen", "mollie"])

REQUEST = httpx.Request("POST", "http://provider.test/v1/payments")


def _response(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, request=REQUEST)


def _problem(status: int) -> httpx.Response:
    """A refusal as the IETF draft's server writes it: a problem document (RFC 9457)."""
    body = b'{"title": "refused", "status": %d}' % status
    headers = {"content-type": "application/problem+json"}
    return httpx.Response(status, headers=headers, content=body, request=REQUEST)


@pytest.mark.parametrize("status", [200, 201, 204])
def test_2xx_is_a_definitive_success(status: int) -> None:
    assert classify_response(_response(status), GENERIC).outcome is Outcome.SUCCEEDED


@pytest.mark.parametrize("status", [401, 403])
def test_an_authentication_refusal_executed_nothing_and_is_not_final(status: int) -> None:
    for hint in ("true", "false", None):
        headers = {"Stripe-Should-Retry": hint} if hint else {}
        provider_s = _problem(status)
        provider_s.headers.update(headers)
        verdict = classify_response(provider_s, GENERIC)
        assert verdict.outcome is Outcome.REFUSED
        assert not verdict.ambiguous
        # The same status from something that is not the provider (an empty, typeless
        # answer): still a refusal, never retried, but it proves nothing about execution.
        foreign = classify_response(_response(status, **headers), GENERIC)
        assert foreign.outcome is Outcome.REFUSED
        assert foreign.ambiguous


@pytest.mark.parametrize("status", [400, 402, 404])
def test_other_4xx_are_definitive_failures(status: int) -> None:
    verdict = classify_response(_problem(status), GENERIC)
    assert verdict.outcome is Outcome.FAILED
    assert not verdict.ambiguous


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_are_retried_and_ambiguous(status: int) -> None:
    verdict = classify_response(_response(status), GENERIC)
    assert verdict.outcome is Outcome.RETRY
    assert verdict.ambiguous, "a 5xx may follow an executed payment"


def test_429_is_retried_and_proves_nothing_was_executed() -> None:
    verdict = classify_response(_response(429, **{"Retry-After": "3"}), GENERIC)
    assert verdict.outcome is Outcome.RETRY
    assert not verdict.ambiguous
    assert verdict.retry_after == 3.0


def test_409_in_flight_is_retried_and_ambiguous() -> None:
    verdict = classify_response(_response(409), GENERIC)
    assert (verdict.outcome, verdict.ambiguous) == (Outcome.RETRY, True)


def test_422_is_a_key_mismatch() -> None:
    assert classify_response(_problem(422), GENERIC).outcome is Outcome.MISMATCH


def test_a_provider_retry_hint_wins_over_the_status() -> None:
    def hint(response: httpx.Response) -> bool | None:
        value = response.headers.get("Should-Retry")
        return None if value is None else value == "true"

    profile = ProviderProfile(name="hinted", should_retry_hint=hint)
    assert classify_response(_response(503, **{"Should-Retry": "false"}), profile).outcome is (
        Outcome.FAILED
    )
    assert classify_response(_response(400, **{"Should-Retry": "true"}), profile).outcome is (
        Outcome.RETRY
    )


def test_a_refused_connection_proves_the_request_never_left() -> None:
    verdict = classify_error(httpx.ConnectError("refused", request=REQUEST))
    assert verdict is not None
    assert (verdict.outcome, verdict.ambiguous) == (Outcome.RETRY, False)


@pytest.mark.parametrize(
    "error",
    [
        httpx.ReadTimeout("slow", request=REQUEST),
        httpx.WriteTimeout("slow", request=REQUEST),
        httpx.RemoteProtocolError("peer closed connection", request=REQUEST),
        httpx.ReadError("reset", request=REQUEST),
    ],
)
def test_failures_after_sending_are_ambiguous(error: Exception) -> None:
    verdict = classify_error(error)
    assert verdict is not None
    assert (verdict.outcome, verdict.ambiguous) == (Outcome.RETRY, True)


def test_non_transport_errors_are_not_retried() -> None:
    assert classify_error(ValueError("bug")) is None


def test_retry_after_in_seconds_and_as_an_http_date() -> None:
    assert parse_retry_after("7", now=None) == 7.0
    assert parse_retry_after("1.5", now=None) == 1.5
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30.0)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon", now=None) is None
    assert parse_retry_after(None, now=None) is None
    assert parse_retry_after(date, now=None) is None, "a date with nothing to count from"


def test_an_http_date_retry_after_counts_from_the_answer_s_own_date() -> None:
    # Both dates are the provider's: this host's clock, however wrong, plays no part.
    sent = 1_000_000_000.0  # years before this host's clock
    later = email.utils.formatdate(sent + 20, usegmt=True)
    answer = _response(
        503, **{"Retry-After": later, "Date": email.utils.formatdate(sent, usegmt=True)}
    )
    assert classify_response(answer, GENERIC).retry_after == pytest.approx(20.0)
    undated = _response(503, **{"Retry-After": later})
    assert classify_response(undated, GENERIC).retry_after is None


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    policy = RetryPolicy(initial_wait=1.0, max_wait=8.0, multiplier=2.0)
    rng = random.Random(7)
    for retry_number, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (10, 8.0)]:
        waits = [policy.backoff(retry_number, rng) for _ in range(200)]
        assert all(0.0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling * 0.8, "full jitter spans the whole range"
        assert min(waits) < ceiling * 0.2


def test_retry_after_replaces_backoff_but_is_capped() -> None:
    policy = RetryPolicy(max_retry_after=10.0)
    assert policy.wait(1, retry_after=4.0) == 4.0
    assert policy.wait(1, retry_after=3600.0) == 10.0


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


# -- a 2xx must be the provider's answer ------------------------------------------------------


def _answer(status: int, content_type: str | None, body: bytes) -> httpx.Response:
    headers = {"content-type": content_type} if content_type else {}
    return httpx.Response(status, headers=headers, content=body, request=REQUEST)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/html; charset=utf-8", b"<html>Sign in to the Wi-Fi</html>"),
        ("text/plain", b"OK"),
        (None, b"<html></html>"),
        ("application/json", b"<html>not json</html>"),
        ("application/json", b""),
    ],
)
def test_a_2xx_that_is_not_the_provider_s_answer_is_ambiguous(
    content_type: str | None, body: bytes
) -> None:
    verdict = classify_response(_answer(200, content_type, body), GENERIC)
    assert (verdict.outcome, verdict.ambiguous) == (Outcome.RETRY, True)
    assert verdict.diagnosis is not None
    assert "not the provider's answer" in verdict.diagnosis


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b'{"id": "pay_1"}'),
        ("application/json; charset=utf-8", b"[]"),
        ("application/problem+json", b'{"title": "ok"}'),
        (None, b""),
    ],
)
def test_a_2xx_the_provider_sent_settles(content_type: str | None, body: bytes) -> None:
    assert classify_response(_answer(201, content_type, body), GENERIC).outcome is (
        Outcome.SUCCEEDED
    )


def test_a_profile_that_declares_no_media_types_takes_any_2xx() -> None:
    anything = ProviderProfile(name="xml-provider", answer_media_types=frozenset())
    verdict = classify_response(_answer(200, "application/xml", b"<ok/>"), anything)
    assert verdict.outcome is Outcome.SUCCEEDED


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    status=st.integers(min_value=100, max_value=599),
    headers=st.dictionaries(
        st.sampled_from(
            ["content-type", "retry-after", "stripe-should-retry", "transient-error", "x-any"]
        ),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
        max_size=4,
    ),
    body=st.binary(max_size=200)
    | st.sampled_from([b"{}", b'{"error": {"code": "idempotency_key_in_use"}}', b"[1,"]),
    profile=st.sampled_from([GENERIC, STRIPE, ADYEN, MOLLIE]),
)
def test_any_answer_gets_exactly_one_verdict_and_never_an_exception(
    status: int, headers: dict[str, str], body: bytes, profile: ProviderProfile
) -> None:
    response = httpx.Response(status, headers=headers, content=body, request=REQUEST)
    verdict = classify_response(response, profile)
    assert verdict.outcome in Outcome
    if verdict.outcome is Outcome.SUCCEEDED:
        assert 200 <= status < 300
    if 200 <= status < 300 and verdict.outcome is not Outcome.SUCCEEDED:
        assert verdict.ambiguous, "a 2xx that does not settle may have executed"
    if verdict.outcome in (Outcome.FAILED, Outcome.MISMATCH):
        told = profile.should_retry_hint(response) is False  # the provider's own header
        assert told or _is_json(response), "only the provider's own words settle a refusal"


def _is_json(response: httpx.Response) -> bool:
    media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        return False
    try:
        json.loads(response.content)
    except ValueError:
        return False
    return True
