"""Webhook signatures: HMAC-SHA256 over ``timestamp.payload``, in Stripe's header format.

``Stripe-Signature: t=1492774577,v1=5257a8…,v1=9a1c…`` — a timestamp and one or more
signatures. During a secret rotation the provider signs with every active secret, and the
receiver may hold more than one too: any (signature, secret) pair that matches is enough.
The timestamp bounds replays of a captured request.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

from .errors import WebhookSignatureError

__all__ = ["DEFAULT_TOLERANCE", "sign", "verify"]

DEFAULT_TOLERANCE = 300.0
"""Seconds a signed timestamp stays acceptable, either side of now (Stripe's default)."""

_SCHEME = "v1"


def _digest(secret: str, timestamp: str, payload: bytes) -> str:
    message = timestamp.encode("ascii") + b"." + payload
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(payload: bytes, secrets: Sequence[str], *, timestamp: float | None = None) -> str:
    """The signature header value for ``payload``, signed with every secret given."""
    stamp = str(int(time.time() if timestamp is None else timestamp))
    parts = [f"t={stamp}", *(f"{_SCHEME}={_digest(s, stamp, payload)}" for s in secrets)]
    return ",".join(parts)


def verify(
    payload: bytes,
    header: str | None,
    secrets: Sequence[str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> float:
    """Check a signature header; returns its timestamp or raises WebhookSignatureError."""
    if not secrets:
        raise WebhookSignatureError("no webhook signing secret configured")
    if not header:
        raise WebhookSignatureError("the request carries no signature header")
    timestamp: str | None = None
    signatures: list[str] = []
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        if name == "t":
            timestamp = value
        elif name == _SCHEME:
            signatures.append(value)
    if timestamp is None or not timestamp.isdigit():
        raise WebhookSignatureError("the signature header has no valid timestamp (t=…)")
    if not signatures:
        raise WebhookSignatureError(f"the signature header has no {_SCHEME} signature")
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
