"""The errors about one intent, worded once: what happened, to which intent, what to do."""

from __future__ import annotations

import httpx

from .._journal._records import IntentDraft, IntentRecord
from .._lifecycle import Outcome, Verdict
from ..errors import (
    AuthenticationError,
    IntentError,
    IntentInFlight,
    IntentMismatch,
    IntentStateError,
    OutcomeUnknown,
    ProviderError,
    ProviderUnavailable,
)

__all__ = [
    "abandoned",
    "authentication",
    "in_flight",
    "mismatch",
    "refused",
    "unavailable",
    "unknown",
]


def _ref(reference: str | None) -> str:
    return f" (reference {reference!r})" if reference else ""


def in_flight(record: IntentRecord) -> IntentInFlight:
    return IntentInFlight(
        f"intent {record.key}{_ref(record.reference)} is being sent by another worker "
        f"({record.lease_owner}); wait for it, or call again to get its stored outcome",
        key=record.key,
        reference=record.reference,
    )


def unknown(record: IntentRecord) -> OutcomeUnknown:
    reason = record.unknown_reason or "outcome unknown"
    return OutcomeUnknown(
        f"the outcome of intent {record.key}{_ref(record.reference)} is unknown ({reason}); "
        f"it will not be resent blindly. Reconcile it: payonce reconcile {record.key}",
        key=record.key,
        reference=record.reference,
        reason=reason,
    )


def abandoned(record: IntentRecord) -> IntentStateError:
    return IntentStateError(
        f"intent {record.key}{_ref(record.reference)} was abandoned by an operator "
        f"({record.abandon_reason}); it is never resent. Use a new reference to pay again",
        key=record.key,
        reference=record.reference,
    )


def unavailable(record: IntentRecord, reason: str) -> ProviderUnavailable:
    return ProviderUnavailable(
        f"intent {record.key}{_ref(record.reference)} was never executed by the provider "
        f"({reason}); it stays pending under its key: calling again later is safe",
        key=record.key,
        reference=record.reference,
    )


def mismatch(draft: IntentDraft, record: IntentRecord) -> IntentMismatch:
    if draft.key_supplied and record.key != draft.key:
        what = f"reference {draft.reference!r} is bound to key {record.key}, not {draft.key}"
    elif record.scope != draft.scope:
        what = f"key {record.key} belongs to {record.scope!r}, not {draft.scope!r}"
    else:
        what = "the request differs from the one first journaled for it"
    return IntentMismatch(
        f"intent {record.key}{_ref(record.reference)}: {what} (stored fingerprint "
        f"{record.fingerprint[:16]}…, new {draft.fingerprint[:16]}…). Nothing was sent. "
        "Use a new reference for a new operation",
        key=record.key,
        reference=record.reference,
        stored_fingerprint=record.fingerprint,
        new_fingerprint=draft.fingerprint,
    )


def refused(record: IntentRecord, response: httpx.Response, verdict: Verdict) -> IntentError:
    """The error of a failed intent's stored refusal, by the verdict on it: the profile's,
    not the bare status (Stripe's mismatch is a 400 that only its body tells apart)."""
    if verdict.outcome is Outcome.MISMATCH:
        return IntentMismatch(
            f"the provider refused intent {record.key}{_ref(record.reference)}: it holds "
            f"this key for a different request (HTTP {response.status_code}). Use a new "
            "reference for a new operation",
            key=record.key,
            reference=record.reference,
            stored_fingerprint="(provider)",
            new_fingerprint=record.fingerprint,
        )
    return ProviderError(
        f"the provider refused intent {record.key}{_ref(record.reference)} with HTTP "
        f"{response.status_code}; the refusal is journaled and will be replayed for this "
        "intent. Use a new reference to try a different request",
        key=record.key,
        reference=record.reference,
        response=response,
    )


def authentication(record: IntentRecord, response: httpx.Response) -> AuthenticationError:
    return AuthenticationError(
        f"the provider refused intent {record.key}{_ref(record.reference)} with HTTP "
        f"{response.status_code} before executing it: the API key is wrong, revoked or "
        "lacks a permission. Nothing was executed and the intent stays pending under its "
        "key: fix the key, then call again (or `payonce resume`)",
        key=record.key,
        reference=record.reference,
        response=response,
    )
