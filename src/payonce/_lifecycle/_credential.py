"""Which credential sent an intent, and which may send it again.

Every intent journals the fingerprint of the credential that first sent it (never the
secret: a keyed SHA-256 of it, cut short, ``cred:1f3a…``) and the account scope its request
names where the provider keys idempotency by one (Stripe's ``Stripe-Account``). A provider
keeps idempotency keys per account: the same key sent with another account's credential is
a new payment there, and a look-up under it answers "no such payment" for one that exists.

The one rule, for every path that sends again or looks up (a run again of the code,
``resume``, ``reconcile`` and its ``--resend``, the worker): only a credential whose
fingerprint is the journaled one. ``choose_credential`` picks it among the candidates a
process has; none is it: nothing is sent, and the intent is named with the fingerprint
wanted (``credential_missing``). A run again that brings another credential is refused
before anything is sent (``credential_mismatch``).

An intent journaled with no credential and never sent (enqueued by a service that holds no
API key: the worker sends) is bound to the credential of the first process that sends it
(``sent_by_first_sender``), before it is sent: from then on the rule above holds for it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import attrs

from ..errors import CredentialMismatch
from ._key_age import AttemptLike, may_have_executed
from ._records import IntentDraft, IntentRecord

__all__ = [
    "CREDENTIAL_PREFIX",
    "Candidate",
    "account_scope_of",
    "choose_credential",
    "credential_fingerprint",
    "credential_in",
    "credential_mismatch",
    "credential_missing",
    "may_rebind",
    "sent_by_first_sender",
]

CREDENTIAL_PREFIX = "cred:"
_FINGERPRINT_KEY = b"payonce credential fingerprint v1"
"""HMAC key: a fingerprint is payonce's own, never a bare SHA-256 of an API key that a
table of hashes of leaked keys would recognise."""
_FINGERPRINT_HEX = 16
"""64 bits: enough that two keys a process holds never share one, too few to say anything
of the key but whether a given one is it."""

T = TypeVar("T")


def credential_fingerprint(secret: str) -> str:
    """``cred:`` and 16 hex digits of an HMAC-SHA256 of ``secret``: journaled, shown and
    compared in its place. It never holds the secret nor any part of it."""
    digest = hmac.new(_FINGERPRINT_KEY, secret.encode("utf-8"), hashlib.sha256).hexdigest()
    return CREDENTIAL_PREFIX + digest[:_FINGERPRINT_HEX]


_CREDENTIAL_HEADERS = ("authorization", "x-api-key")


def credential_in(headers: Mapping[str, str], *, auth_header: str) -> str | None:
    """The secret a request's credential headers carry: the value of the provider's auth
    header (else ``Authorization`` or ``X-API-Key``), a ``Bearer`` scheme taken off, so
    that a client's own ``api_key`` and an SDK's ``Authorization: Bearer`` of the same key
    are one credential. None when the request carries none."""
    lowered = {name.lower(): value for name, value in headers.items()}
    for name in (auth_header.lower(), *_CREDENTIAL_HEADERS):
        value = lowered.get(name, "").strip()
        if not value:
            continue
        scheme, _, token = value.partition(" ")
        return token.strip() if token.strip() and scheme.lower() == "bearer" else value
    return None


def account_scope_of(
    headers: Sequence[tuple[str, str]], scope_headers: Iterable[str]
) -> str | None:
    """The account a request names where its provider keys idempotency by one (Stripe's
    ``Stripe-Account`` of a connected account): ``header: value``, or None when it names
    none (its credential's own account)."""
    wanted = {name.lower() for name in scope_headers}
    named = sorted(f"{name.lower()}: {value}" for name, value in headers if name.lower() in wanted)
    return "; ".join(named) or None


@attrs.frozen
class Candidate:
    """A credential a process may send an intent with, and where it came from (words for an
    operator: ``this client's API key``, ``the keyring entry 'acct_a'``), never the secret."""

    secret: str = attrs.field(repr=False)
    source: str

    @property
    def fingerprint(self) -> str:
        return credential_fingerprint(self.secret)


def choose_credential(journaled: str | None, candidates: Iterable[Candidate]) -> Candidate | None:
    """The first candidate whose fingerprint is the journaled one; None when none is (or
    the intent journaled no credential: no key is known to have sent it). ``candidates`` is
    consumed only as far as the match, so a slow source (the keyring) is read last."""
    if journaled is None:
        return None
    for candidate in candidates:
        if hmac.compare_digest(candidate.fingerprint, journaled):
            return candidate
    return None


def sent_by_first_sender(record: IntentRecord) -> bool:
    """Whether ``record`` takes the credential of the first process that sends it: none was
    journaled with it and nothing of it was ever sent (an enqueued intent of a service
    without a key), so no account at the provider holds anything under its key."""
    return record.credential is None and record.first_sent_at is None


def may_rebind(claimed: bool, attempts: Iterable[AttemptLike]) -> bool:
    """Whether a run again with another credential may take the intent over: only a
    pending one it holds (``claimed``) none of whose attempts may have executed (each was
    refused with proof, a 401 of a wrong key, or never left): no account at the provider
    holds anything under its key. Any other is refused (``credential_mismatch``)."""
    return claimed and not may_have_executed(attempts)


def _named(record: IntentRecord | IntentDraft) -> str:
    reference = f" (reference {record.reference!r})" if record.reference else ""
    return f"intent {record.key}{reference}"


def credential_mismatch(draft: IntentDraft, record: IntentRecord) -> CredentialMismatch:
    """A run again whose request brings another credential than the one that journaled the
    intent: refused before anything is sent (the provider keeps keys per account)."""
    given = draft.credential or "no credential"
    return CredentialMismatch(
        f"{_named(record)} was sent with credential {record.credential or 'none'}, and this "
        f"request carries {given}: nothing was sent. Send it with the key that first sent "
        "it; if that key was rotated, check the payment at the provider, then abandon the "
        "intent (`payonce abandon KEY`)",
        key=record.key,
        reference=record.reference,
        journaled=record.credential,
        offered=(given,),
    )


def credential_missing(record: IntentRecord, tried: Sequence[Candidate]) -> CredentialMismatch:
    """No credential this process has is the one that journaled ``record``: it is skipped,
    nothing sent or looked up (a look-up under another account's key would answer "no such
    payment" for one that exists)."""
    wanted = record.credential
    offered = tuple(f"{c.source} ({c.fingerprint})" for c in tried)
    if wanted is None and sent_by_first_sender(record):
        message = (
            f"{_named(record)} was never sent and no key here can send it: skipped, nothing "
            f"sent. Give its account's key: PAYONCE_API_KEY with --account {record.account}, "
            f"`payonce keys set {record.account}`, or recovery_keys="
        )
    elif wanted is None:
        message = (
            f"{_named(record)} was journaled with no credential, so no key is known to have "
            "sent it: skipped, nothing sent. Check the payment at the provider, then "
            "abandon the intent (`payonce abandon KEY`)"
        )
    else:
        message = (
            f"{_named(record)} was sent with credential {wanted}; no key here has that "
            "fingerprint: skipped, nothing sent. Give that key: PAYONCE_API_KEY with "
            f"--account {record.account}, `payonce keys set {record.account}`, or "
            "recovery_keys="
        )
    return CredentialMismatch(
        message, key=record.key, reference=record.reference, journaled=wanted, offered=offered
    )
