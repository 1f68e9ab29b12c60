"""An intent's records: its request, its state and lease, its attempts, answer and look-ups.

The lifecycle decides on these and owns them; the journal stores them and imports them from
here, so the lifecycle never imports the journal.
"""

from __future__ import annotations

import attrs

from ._leases import lease_live
from ._states import IntentState

__all__ = [
    "AttemptRecord",
    "EscalationRecord",
    "IntentDraft",
    "IntentRecord",
    "IntentRequest",
    "KeyTerms",
    "ReconciliationRecord",
    "StoredResponse",
]


@attrs.frozen
class KeyTerms:
    """What an intent's key window is judged by: its provider profile's terms when it was
    journaled. A process that drives it later (``payonce worker``, ``resume``, ``reconcile``)
    rebuilds the profile from its name alone, and an app's ``square_profile(key_lifetime=600)``
    is still named ``square``: the stricter of the two terms is kept (``stricter``)."""

    key_lifetime: float
    """Seconds the provider remembers a key (``ProviderProfile.key_lifetime``)."""
    key_lifetime_documented: bool
    """Whether the provider documents that lifetime, or it is assumed."""
    max_processing: float
    """Seconds an attempt may still run at the provider (``ProviderProfile.max_processing``)."""

    def stricter(self, other: KeyTerms) -> KeyTerms:
        """The terms no resend under either could break: the shorter lifetime, documented
        only if both say so, the longer processing time."""
        return KeyTerms(
            key_lifetime=min(self.key_lifetime, other.key_lifetime),
            key_lifetime_documented=self.key_lifetime_documented and other.key_lifetime_documented,
            max_processing=max(self.max_processing, other.max_processing),
        )


@attrs.frozen
class IntentRequest:
    """An intent's identity and the request it sends: what a draft and a record share."""

    key: str
    scope: str
    reference: str | None
    account: str
    provider: str
    method: str
    url: str
    fingerprint: str
    request_headers: tuple[tuple[str, str], ...]
    """Only headers safe to keep (never credentials)."""
    body: bytes
    credential: str | None = attrs.field(default=None, kw_only=True)
    """The fingerprint of the credential that sends it (``cred:…``, ``_credential``), never
    the secret: only a credential of that fingerprint sends it again or looks it up. None:
    it was sent with none."""
    account_scope: str | None = attrs.field(default=None, kw_only=True)
    """The account its request names where the provider keys idempotency by one (Stripe's
    ``stripe-account: acct_…``); None: its credential's own account."""

    @property
    def identity(self) -> tuple[str, str]:
        """What, with its reference, names an intent: its provider and its account (the
        fingerprint of the credential that sends it joins them, issue 27). Never its
        request: a block whose first request differs between runs (the customer created
        in the first run, skipped in the next) is the same intent under the same key."""
        return (self.provider, self.account)


@attrs.frozen
class IntentDraft(IntentRequest):
    """An intent as the client first describes it, before the journal knows it."""

    key_supplied: bool
    """True when the caller chose the key: then it must match any stored intent's key."""
    step: int = 1
    """Its position in its intent's block: 1 is the intent itself, 2 and later its steps
    (each an intent of its own, keyed from the first's key: ``step_key``)."""
    intent_key: str | None = None
    """For a step 2 or later: the key of the intent (its step 1) it is a step of."""
    intent_reference: str | None = None
    """For a step 2 or later: its intent's reference, which its errors name. The step's
    own reference (``step_reference``) is derived from it, else from ``intent_key``."""
    derived_key: str | None = None
    """For a step 2 or later: the key payonce gives that step (``step_key``), so that a
    refusal tells a key the caller's code set from payonce's own."""
    key_per_call: bool = False
    """A request through the transport outside any block: its key may have been drawn for
    this one call (an SDK's uuid4, or payonce's), which no later run of the code names
    again, so nothing but this call resends it (see ``IntentRecord.key_per_call``)."""
    key_terms: KeyTerms | None = None
    """The client's provider profile's key terms, journaled with the intent."""


@attrs.frozen
class StoredResponse:
    """A definitive answer as it was received: raw status, kept headers and body bytes."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    body_stored: bool = True
    """False when the body exceeded the size cap: only status and headers were kept."""
    stored_by: str | None = None
    """The payonce version that stored it (None for rows written by schema 1)."""
    schema_version: int | None = None


@attrs.frozen
class AttemptRecord:
    key: str
    number: int
    started_at: float
    ended_at: float | None
    status_code: int | None
    error: str | None
    ambiguous: bool | None
    """Whether the provider may have executed this attempt; None while it is in flight."""
    provider_date: float | None = None
    """The provider's time in its answer (its ``Date``, epoch seconds) beside this host's
    ``ended_at``; None: no answer, an answer without a ``Date``, or a row of schema 5 or
    older."""
    sent_to: str | None = None
    """The URL this attempt was sent to (without userinfo): the journaled URL's path on the
    sending client's base URL, which a resume by a client of another base URL changes. None
    for an attempt journaled before schema 7."""
    boot: str | None = None
    """Which boot of which host started it (``host/boot id``); None where the host did
    not tell (no Linux boot id), or for an attempt journaled before schema 8."""
    boottime: float | None = None
    """That host's boot clock when it started (``CLOCK_BOOTTIME``: seconds since its boot,
    which no step of the wall clock moves); None as for ``boot``."""

    @property
    def in_flight(self) -> bool:
        return self.ended_at is None


@attrs.frozen
class IntentRecord(IntentRequest):
    """An intent as the journal holds it: its request, its state, its lease, its outcome."""

    state: IntentState
    created_at: float
    updated_at: float
    first_sent_at: float | None
    lease_owner: str | None
    lease_expires_at: float | None
    unknown_reason: str | None
    response: StoredResponse | None
    acknowledged_at: float | None
    attempt_count: int
    abandon_reason: str | None = None
    key_per_call: bool = False
    """Journaled outside any block under a key drawn for that one call: retried and verified
    by that call only. The code that made it may have run again under another key, so a
    resume, a worker or a reconciliation never resends it on its own (an operator may:
    ``payonce reconcile KEY --resend``). False for a journal older than schema 9."""
    key_terms: KeyTerms | None = None
    """The key terms of the provider profile it was journaled with; None for an intent
    journaled before schema 10: judged by the built-in profile of its provider's name."""
    enqueued: bool = False
    """Journaled by ``client.enqueue`` (the outbox), to be sent by a worker or ``resume``:
    its caller learns the outcome from ``client.outcomes()`` and acknowledges it there."""

    def lease_live(self, now: float) -> bool:
        return lease_live(self.lease_owner, self.lease_expires_at, now)


@attrs.frozen
class ReconciliationRecord:
    """One look-up of an intent at the provider, and what payonce concluded from it."""

    key: str
    at: float
    outcome: str
    """``found``, ``not_found``, ``cannot_tell``, ``still_unknown``, ``error`` or
    ``resent``."""
    detail: str
    status_code: int | None


@attrs.frozen
class EscalationRecord:
    """A worker's escalation of an unknown intent: its look-ups (or resends) spent, it was
    handed to a person. Journaled once per time the intent went unknown (``unknown_since``
    names that time), so it is said once, by one worker, across restarts."""

    key: str
    unknown_since: float
    """When the intent went unknown, as the journal dated it (the end of its last attempt):
    which of its unknown times this escalation is of."""
    at: float
    """When it was escalated (the journal's clock)."""
    tries: int
    """The look-ups (or resends) made before it was."""
    reason: str
    """Why its outcome was still unknown."""
