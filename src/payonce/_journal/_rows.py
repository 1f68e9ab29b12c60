"""How a record is written to its row and read back: the columns, in the order every
statement of ``_sql`` reads them, and the conversions between their values and records.

Every read of an intent comes through ``intent_from_row``, and every write of headers through
``headers_to_json``: both run several times per intent, so they are written for speed.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from .._lifecycle import (
    AttemptRecord,
    EscalationRecord,
    IntentDraft,
    IntentRecord,
    IntentState,
    KeyTerms,
    ReconciliationRecord,
    StoredResponse,
)
from .._version import __version__
from ._schema import SCHEMA_VERSION

__all__ = [
    "ATTEMPT_COLUMNS",
    "ATTEMPT_FIELDS",
    "ESCALATION_COLUMNS",
    "ESCALATION_FIELDS",
    "EVENT_FIELDS",
    "INTENT_COLUMNS",
    "INTENT_FIELDS",
    "KEY_TERMS_COLUMNS",
    "PER_CALL_COLUMN",
    "RECONCILIATION_COLUMNS",
    "RECONCILIATION_FIELDS",
    "attempt_from_row",
    "DamagedRow",
    "escalation_from_row",
    "headers_to_json",
    "intent_from_row",
    "reconciliation_from_row",
    "response_values",
    "typed",
    "write_ahead_values",
]

INTENT_FIELDS = (
    "key",
    "scope",
    "reference",
    "account",
    "provider",
    "method",
    "url",
    "fingerprint",
    "request_headers",
    "request_body",
    "state",
    "created_at",
    "updated_at",
    "first_sent_at",
    "lease_owner",
    "lease_expires_at",
    "unknown_reason",
    "response_status",
    "response_headers",
    "response_body",
    "response_body_stored",
    "response_stored_by",
    "response_schema",
    "acknowledged_at",
    "abandon_reason",
    "key_per_call",
    "key_lifetime",
    "key_lifetime_documented",
    "max_processing",
    "enqueued",
    "credential",
    "account_scope",
)
"""The columns of ``intents`` in ``INTENT_COLUMNS``' order, which ``intent_from_row`` reads by
position."""
EVENT_FIELDS = (
    "endpoint",
    "event_id",
    "type",
    "payload_hash",
    "received_at",
    "updated_at",
    "processed_at",
    "lease_owner",
    "lease_expires_at",
    "deliveries",
    "handler_runs",
    "last_error",
)
"""Every column of ``webhook_events`` the statements read (checked by ``journal.check``)."""

ATTEMPT_FIELDS = (
    "key",
    "number",
    "started_at",
    "ended_at",
    "status_code",
    "error",
    "ambiguous",
    "provider_date",
    "sent_to",
    "boot",
    "boottime",
)
RECONCILIATION_FIELDS = ("key", "at", "outcome", "detail", "status_code")
ESCALATION_FIELDS = ("key", "unknown_since", "at", "tries", "reason")
PER_CALL_COLUMN = ", key_per_call,"
"""How ``INTENT_COLUMNS`` names the column schema 9 added: a read-only journal of an older
schema reads ``NULL`` in its place (``Dialect.reading_schema``)."""

INTENT_COLUMNS = (
    ", ".join(INTENT_FIELDS)
    + ", (SELECT count(*) FROM attempts a WHERE a.key = intents.key) AS attempt_count"
)
KEY_TERMS_COLUMNS = (
    "key_lifetime, key_lifetime_documented, max_processing, enqueued, credential, account_scope"
)
"""How ``INTENT_COLUMNS`` names the columns schema 10 added: a read-only journal of an older
schema reads ``NULL`` in their place (``Dialect.reading_schema``)."""


ATTEMPT_COLUMNS = ", ".join(ATTEMPT_FIELDS)
RECONCILIATION_COLUMNS = ", ".join(RECONCILIATION_FIELDS)
ESCALATION_COLUMNS = ", ".join(ESCALATION_FIELDS)


_quote = json.encoder.encode_basestring_ascii
"""How ``json.dumps`` writes a string (its C speed-up where there is one)."""
_decode = json.JSONDecoder().decode


def headers_to_json(headers: Sequence[tuple[str, str]]) -> str:
    """``json.dumps([list(pair) for pair in headers])``, character for character, written
    directly: it runs for the request's headers and the answer's, on every intent."""
    try:
        return (
            "[" + ", ".join([f"[{_quote(name)}, {_quote(value)}]" for name, value in headers]) + "]"
        )
    except TypeError:  # a name or value that is not a string: written as JSON writes it
        return json.dumps([list(pair) for pair in headers])


def write_ahead_values(
    draft: IntentDraft,
    now: float,
    *,
    first_sent_at: float | None,
    owner: str | None,
    lease_expires_at: float | None,
    enqueued: bool = False,
) -> tuple[Any, ...]:
    """The write-ahead record of ``draft``'s new intent, pending, in ``_sql.INSERT_INTENT``'s
    order: the one row every creation writes. A client about to send it holds its lease and
    dates its first send; the outbox (``_outbox``) writes it with neither, nothing sent."""
    return (
        draft.key,
        draft.scope,
        draft.reference,
        draft.account,
        draft.provider,
        draft.method,
        draft.url,
        draft.fingerprint,
        headers_to_json(draft.request_headers),
        draft.body,
        IntentState.PENDING.value,
        now,
        now,
        first_sent_at,
        owner,
        lease_expires_at,
        # NULL for a key named by its caller or its block: the column's value on every row
        # older than schema 9.
        1 if draft.key_per_call else None,
        *_key_terms_values(draft.key_terms),
        1 if enqueued else None,
        draft.credential,
        draft.account_scope,
    )


def _key_terms_values(terms: KeyTerms | None) -> tuple[float | int | None, ...]:
    if terms is None:
        return (None, None, None)
    return (terms.key_lifetime, int(terms.key_lifetime_documented), terms.max_processing)


def _key_terms(lifetime: Any, documented: Any, max_processing: Any) -> KeyTerms | None:
    if lifetime is None or documented is None or max_processing is None:
        return None  # journaled before schema 10
    return KeyTerms(float(lifetime), bool(documented), float(max_processing))


def response_values(response: StoredResponse) -> tuple[Any, ...]:
    """The response columns' values, in ``_sql.STORE_RESPONSE``'s order."""
    return (
        response.status,
        headers_to_json(response.headers),
        response.body,
        int(response.body_stored),
        __version__,
        SCHEMA_VERSION,
    )


class DamagedRow(sqlite3.DatabaseError):
    """A journal row whose values no longer decode: damage, whichever database holds it.
    A ``sqlite3.DatabaseError``, so that SQLite's own damage handling takes it; the
    PostgreSQL journal catches it by name."""


@functools.lru_cache(maxsize=64)
def _headers_from_json(text: str | None) -> tuple[tuple[str, str], ...]:
    """Cached: the same few header sets come back on every row (the request's content type,
    a provider's usual answer headers), and the tuple is immutable."""
    if not text:
        return ()
    return tuple((str(name), str(value)) for name, value in _decode(text))


def _real(value: Any) -> float | None:
    return None if value is None else float(value)


def typed(
    fields: dict[str, Any],
    *,
    times: Sequence[str] = (),
    optional_times: Sequence[str] = (),
    counts: Sequence[str] = (),
) -> dict[str, Any]:
    """A row's values (by column name) as the records hold them: SQLite hands a REAL column
    back as the number it stored, and a NULL stays None."""
    for name in times:
        fields[name] = float(fields[name])
    for name in optional_times:
        fields[name] = _real(fields[name])
    for name in counts:
        fields[name] = int(fields[name])
    return fields


def _stored_response(
    status: Any, headers: Any, body: Any, body_stored: Any, stored_by: Any, schema: Any
) -> StoredResponse | None:
    """The response columns, in their table order, as the answer they store (if any)."""
    if status is None:
        return None
    return StoredResponse(
        status=int(status),
        headers=_headers_from_json(headers),
        body=bytes(body or b""),
        # Rows stored by schema 1 predate the size cap: their bodies are whole.
        body_stored=body_stored is None or bool(body_stored),
        stored_by=stored_by,
        schema_version=int(schema) if schema is not None else 1,
    )


def intent_from_row(row: Sequence[Any]) -> IntentRecord:
    """A row of ``INTENT_COLUMNS`` as its record. Read by position, without a dict of the
    columns: every read of an intent comes through here. A row whose values no longer
    decode (a state payonce never writes, headers that are not JSON) is ``DamagedRow``."""
    try:
        return _intent(row)
    except (ValueError, TypeError, LookupError) as exc:
        raise DamagedRow(f"malformed row in intents (key {row[0]!r}): {exc}") from exc


def _intent(row: Sequence[Any]) -> IntentRecord:
    key, scope, reference, account, provider, method, url, fingerprint = row[:8]
    (
        request_headers,
        body,
        state,
        created_at,
        updated_at,
        first_sent_at,
        lease_owner,
        lease_expires_at,
        unknown_reason,
    ) = row[8:17]
    (
        acknowledged_at,
        abandon_reason,
        key_per_call,
        lifetime,
        documented,
        processing,
        enqueued,
        credential,
        account_scope,
        attempt_count,
    ) = row[23:]
    return IntentRecord(
        key=key,
        scope=scope,
        reference=reference,
        account=account,
        provider=provider,
        method=method,
        url=url,
        fingerprint=fingerprint,
        request_headers=_headers_from_json(request_headers),
        body=bytes(body),
        state=IntentState(state),
        created_at=float(created_at),
        updated_at=float(updated_at),
        first_sent_at=_real(first_sent_at),
        lease_owner=lease_owner,
        lease_expires_at=_real(lease_expires_at),
        unknown_reason=unknown_reason,
        response=_stored_response(*row[17:23]),
        acknowledged_at=_real(acknowledged_at),
        attempt_count=int(attempt_count),
        abandon_reason=abandon_reason,
        key_per_call=bool(key_per_call),
        key_terms=_key_terms(lifetime, documented, processing),
        enqueued=bool(enqueued),
        credential=credential,
        account_scope=account_scope,
    )


def attempt_from_row(row: Sequence[Any]) -> AttemptRecord:
    try:
        return _attempt(row)
    except (ValueError, TypeError) as exc:
        raise DamagedRow(f"malformed row in attempts (key {row[0]!r}): {exc}") from exc


def _attempt(row: Sequence[Any]) -> AttemptRecord:
    (
        key,
        number,
        started_at,
        ended_at,
        status_code,
        error,
        ambiguous,
        provider_date,
        sent_to,
        boot,
        boottime,
    ) = row
    return AttemptRecord(
        key=key,
        number=int(number),
        started_at=float(started_at),
        ended_at=_real(ended_at),
        status_code=None if status_code is None else int(status_code),
        error=error,
        ambiguous=None if ambiguous is None else bool(ambiguous),
        provider_date=_real(provider_date),
        sent_to=sent_to,
        boot=boot,
        boottime=_real(boottime),
    )


def reconciliation_from_row(row: Sequence[Any]) -> ReconciliationRecord:
    try:
        return _reconciliation(row)
    except (ValueError, TypeError) as exc:
        raise DamagedRow(f"malformed row in reconciliations (key {row[0]!r}): {exc}") from exc


def _reconciliation(row: Sequence[Any]) -> ReconciliationRecord:
    key, at, outcome, detail, status_code = row
    return ReconciliationRecord(
        key=key,
        at=float(at),
        outcome=outcome,
        detail=detail,
        status_code=None if status_code is None else int(status_code),
    )


def escalation_from_row(row: Sequence[Any]) -> EscalationRecord:
    try:
        key, unknown_since, at, tries, reason = row
        return EscalationRecord(
            key=key,
            unknown_since=float(unknown_since),
            at=float(at),
            tries=int(tries),
            reason=reason,
        )
    except (ValueError, TypeError) as exc:
        raise DamagedRow(f"malformed row in escalations (key {row[0]!r}): {exc}") from exc
