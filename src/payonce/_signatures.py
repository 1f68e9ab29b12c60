"""Webhook signatures: HMAC-SHA256 over ``timestamp.payload``, in Stripe's header format.

``Stripe-Signature: t=1492774577,v1=5257a8…,v1=9a1c…`` — a timestamp and one or more
signatures. During a secret rotation the provider signs with every active secret, and the
receiver may hold more than one too: any (signature, secret) pair that matches is enough.
The timestamp bounds replays of a captured request.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from collections.abc import Sequence

from .errors import ConfigurationError, WebhookSignatureError

__all__ = ["DEFAULT_TOLERANCE", "check_tolerance", "sign", "verify"]

DEFAULT_TOLERANCE = 300.0
"""Seconds a signed timestamp stays acceptable, either side of now (Stripe's default)."""

_SCHEME = "v1"
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
"""Seconds since the epoch, in ASCII digits: twelve cover the next 30,000 years, and a
longer one is an attack on int() rather than a time."""
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_MAX_HEADER = 8192


def _digest(secret: str, timestamp: str, payload: bytes) -> str:
    message = timestamp.encode("ascii") + b"." + payload
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(payload: bytes, secrets: Sequence[str], *, timestamp: float | None = None) -> str:
    """The signature header value for ``payload``, signed with every secret given."""
    stamp = str(int(time.time() if timestamp is None else timestamp))
    parts = [f"t={stamp}", *(f"{_SCHEME}={_digest(s, stamp, payload)}" for s in secrets)]
    return ",".join(parts)


def check_tolerance(tolerance: float) -> float:
    """A signature tolerance: a finite number of seconds, not negative."""
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, int | float)
        or not math.isfinite(tolerance)
        or tolerance < 0
    ):
        raise ConfigurationError(
            f"the signature tolerance must be a finite, non-negative number of seconds, not "
            f"{tolerance!r}"
        )
    return float(tolerance)


def verify(
    payload: bytes,
    header: str | None,
    secrets: Sequence[str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> float:
    """Check a signature header; returns its timestamp or raises WebhookSignatureError."""
    check_tolerance(tolerance)
    if not secrets:
        raise WebhookSignatureError("no webhook signing secret configured")
    if not header:
        raise WebhookSignatureError("the request carries no signature header")
    if len(header) > _MAX_HEADER:
        raise WebhookSignatureError("the signature header is too long to be a signature")
    timestamp: str | None = None
    signatures: list[str] = []
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        if name == "t":
            timestamp = value
        elif name == _SCHEME and _SIGNATURE.fullmatch(value):
            signatures.append(value)
    if timestamp is None or not _TIMESTAMP.fullmatch(timestamp):
        raise WebhookSignatureError("the signature header has no valid timestamp (t=…)")
    if not signatures:
        raise WebhookSignatureError(
            f"the signature header has no {_SCHEME} signature (64 lower-case hex digits)"
        )
    age = (time.time() if now is None else now) - int(timestamp)
    if abs(age) > tolerance:
        raise WebhookSignatureError(
            f"the signature is {abs(age):.0f}s {'old' if age > 0 else 'in the future'}, "
            f"beyond the {tolerance:.0f}s tolerance: a replayed or delayed request, or a "
            "clock out of sync"
        )
    expected = [_digest(secret, timestamp, payload) for secret in secrets]
    # Compare every pair in constant time; no early exit that would leak which one matched.
    matched = False
    for signature in signatures:
        for candidate in expected:
            matched |= hmac.compare_digest(signature, candidate)
    if not matched:
        raise WebhookSignatureError(
            "no signature matches any configured secret: a forged or altered request, or a "
            "secret that has been rotated away"
        )
    return float(timestamp)
