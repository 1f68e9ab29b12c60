"""Webhook signatures: Stripe's header format, rotation, tolerance, constant-time checks."""

from __future__ import annotations

import hashlib
import hmac

import pytest

import payonce
from payonce._signatures import sign, verify

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
