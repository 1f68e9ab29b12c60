"""Webhook signatures: Stripe's header format, rotation, tolerance, constant-time checks."""

from __future__ import annotations

import hashlib
import hmac

import hypothesis
import pytest
from hypothesis import strategies as st

import payonce
from payonce.webhooks import sign, verify

PAYLOAD = b'{"id":"evt_1","type":"payment.succeeded"}'
NOW = 1_800_000_000.0


def test_a_stripe_format_signature_verifies() -> None:
    digest = hmac.new(b"whsec_a", b"1800000000." + PAYLOAD, hashlib.sha256).hexdigest()
    header = f"t=1800000000,v1={digest}"
    assert verify(PAYLOAD, header, ["whsec_a"], now=NOW) == NOW
    assert sign(PAYLOAD, ["whsec_a"], timestamp=NOW) == header


def test_during_a_rotation_any_matching_pair_is_enough() -> None:
    header = sign(PAYLOAD, ["whsec_old", "whsec_new"], timestamp=NOW)
    assert header.count("v1=") == 2
    assert verify(PAYLOAD, header, ["whsec_new"], now=NOW) == NOW
    assert verify(PAYLOAD, header, ["whsec_unrelated", "whsec_old"], now=NOW) == NOW
    assert verify(PAYLOAD, sign(PAYLOAD, ["whsec_old"], timestamp=NOW), ["x", "whsec_old"], now=NOW)


@pytest.mark.parametrize(
    ("payload", "header", "complaint"),
    [
        (PAYLOAD, None, "no signature header"),
        (PAYLOAD, "", "no signature header"),
        (PAYLOAD, "v1=abc", "no valid timestamp"),
        (PAYLOAD, "t=soon,v1=abc", "no valid timestamp"),
        (PAYLOAD, "t=1800000000", "no v1 signature"),
        (PAYLOAD, sign(PAYLOAD, ["whsec_other"], timestamp=NOW), "no signature matches"),
        (PAYLOAD + b" ", sign(PAYLOAD, ["whsec_a"], timestamp=NOW), "no signature matches"),
        (PAYLOAD, sign(PAYLOAD, ["whsec_a"], timestamp=NOW - 301), "beyond the 300s tolerance"),
        (PAYLOAD, sign(PAYLOAD, ["whsec_a"], timestamp=NOW + 301), "in the future"),
    ],
)
def test_bad_and_stale_signatures_are_rejected_clearly(
    payload: bytes, header: str | None, complaint: str
) -> None:
    with pytest.raises(payonce.WebhookSignatureError, match=complaint):
        verify(payload, header, ["whsec_a"], now=NOW)


def test_no_configured_secret_is_an_error_not_an_open_door() -> None:
    with pytest.raises(payonce.WebhookSignatureError, match="no webhook signing secret"):
        verify(PAYLOAD, sign(PAYLOAD, ["x"], timestamp=NOW), [], now=NOW)


def test_the_tolerance_is_configurable() -> None:
    old = sign(PAYLOAD, ["whsec_a"], timestamp=NOW - 3600)
    assert verify(PAYLOAD, old, ["whsec_a"], now=NOW, tolerance=7200) == NOW - 3600


# -- hostile input ----------------------------------------------------------------------------

GOOD = sign(PAYLOAD, ["whsec_a"], timestamp=NOW)
DIGEST = GOOD.split("v1=")[1]


@pytest.mark.parametrize(
    "header",
    [
        f"t=١٨٠٠٠٠٠٠٠٠,v1={DIGEST}",  # Arabic-Indic digits: isdigit() says yes
        f"t={'9' * 5000},v1={DIGEST}",  # longer than int() converts
        f"t=1800000000,v1={'é' * 64}",  # hmac.compare_digest refuses non-ASCII str
        f"t=1800000000,v1={DIGEST.upper()}",
        "t=1800000000,v1=",
        "t=-1800000000,v1=" + DIGEST,
        "t=1e9,v1=" + DIGEST,
        "," * 10_000,
        "\x00\r\n",
    ],
)
def test_a_malformed_signature_header_is_a_signature_error_never_a_crash(header: str) -> None:
    with pytest.raises(payonce.WebhookSignatureError):
        verify(PAYLOAD, header, ["whsec_a"], now=NOW)


@pytest.mark.parametrize("tolerance", [float("nan"), float("inf"), -1.0])
def test_a_tolerance_that_is_not_a_finite_number_of_seconds_is_refused(tolerance: float) -> None:
    with pytest.raises(payonce.ConfigurationError, match="tolerance"):
        verify(PAYLOAD, GOOD, ["whsec_a"], now=NOW, tolerance=tolerance)
    with pytest.raises(payonce.ConfigurationError, match="tolerance"):
        payonce.WebhookInbox(None, "whsec_a", tolerance=tolerance)


@hypothesis.settings(max_examples=500, deadline=None)
@hypothesis.given(
    header=st.text(max_size=300) | st.from_regex(r"t=[0-9]{1,20}(,v1=[0-9a-f]{0,70})*")
)
@pytest.mark.slow
def test_any_header_verifies_or_is_a_signature_error(header: str) -> None:
    try:
        stamp = verify(PAYLOAD, header, ["whsec_a"], now=NOW)
    except payonce.WebhookSignatureError:
        return
    assert stamp == NOW, "only a genuine signature passes"
