"""What the journal stores: intents, their attempts and their stored responses."""

from __future__ import annotations

import attrs

from .._lifecycle import ClaimKind, IntentState, lease_live
from ._schema import SCHEMA_VERSION

__all__ = [
    "AttemptRecord",
    "Claim",
    "ClaimKind",
    "IntentDraft",
    "IntentRecord",
    "IntentRequest",
    "JournalReport",
    "ReconciliationRecord",
    "StoredResponse",
]


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


@attrs.frozen
class IntentDraft(IntentRequest):
    """An intent as the client first describes it, before the journal knows it."""

    key_supplied: bool
    """True when the caller chose the key: then it must match any stored intent's key."""


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

    def lease_live(self, now: float) -> bool:
        return lease_live(self.lease_owner, self.lease_expires_at, now)


@attrs.frozen
class ReconciliationRecord:
    """One look-up of an intent at the provider, and what payonce concluded from it."""

    key: str
    at: float
    outcome: str
    """``found``, ``not_found``, ``still_unknown`` or ``error``."""
    detail: str
    status_code: int | None


@attrs.frozen
class JournalReport:
    """The result of ``journal.check()``: integrity, schema, and what it holds."""

    location: str
    ok: bool
    problems: tuple[str, ...]
    schema_version: int
    intents_by_state: dict[str, int]
    unacknowledged: int
    size_bytes: int
    latest_schema_version: int = SCHEMA_VERSION
    """This payonce's schema: a journal below it is read as it is, and migrated by the next
    payonce that opens it to write."""
    contents_read: bool = True
    """False when the file is too damaged to read its schema version and counts: they are
    then 0 and mean nothing. A damaged file whose rows still read has them, as read."""


@attrs.frozen
class Claim:
    kind: ClaimKind
    record: IntentRecord
    attempt_number: int | None = None


@attrs.frozen
class JournalCommitted:
    """One journal transaction committed; ``durable`` ones were fsynced first."""

    location: str
    seconds: float
    durable: bool
