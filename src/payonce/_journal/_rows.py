"""How a record is written to its row and read back: the columns, in the order every
statement of ``_sql`` reads them, and the conversions between their values and records.

Every read of an intent comes through ``intent_from_row``, and every write of headers through
``headers_to_json``: both run several times per intent, so they are written for speed.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

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
    "DamagedRow",
    "Intents",
    "UndecodableRow",
    "attempt_from_row",
    "decode_intents",
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
    return KeyTerms(_seconds(lifetime), bool(documented), _seconds(max_processing))


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


@attrs.frozen
class DamagedRow:
    """A journal row whose values no longer decode (bit rot, a hand edit, a bug elsewhere):
    a state payonce never writes, headers that are not JSON, a time that is not a finite
    number... ``journal.check()``, the listings and every recovery pass name it and leave
    it alone, and go on with the other rows.

    ``key`` is the intent the row belongs to, as stored (for a webhook event, its endpoint
    and event id: ``stripe/evt_1``); ``problem`` says which column holds what. For a row of
    ``intents``, ``state``, ``account``, ``provider`` and ``reference`` are the columns as
    stored where they are text (None otherwise), so that the row can be found and judged
    by hand.
    """

    table: str
    key: str
    problem: str
    state: str | None = None
    account: str | None = None
    provider: str | None = None
    reference: str | None = None
    created_at: object = attrs.field(default=None, eq=False, repr=False)
    """The ``created_at`` column as the database holds it: where a pass ordered by it goes
    on from (its decoded value may be no number at all)."""

    def __str__(self) -> str:
        of = "event" if self.table == "webhook_events" else "intent"
        return f"row of {self.table} for {of} {self.key}: {self.problem}"


class UndecodableRow(sqlite3.DatabaseError):
    """Raised by a read of one row that no longer decodes: damage, whichever database holds
    it. A ``sqlite3.DatabaseError``, so that SQLite's own damage handling takes it; the
    PostgreSQL journal catches it by name. ``damaged`` says which row and what is wrong."""

    def __init__(self, damaged: DamagedRow) -> None:
        super().__init__(
            f"malformed row in {damaged.table} (key {damaged.key!r}): {damaged.problem}"
        )
        self.damaged = damaged


class Intents(list[IntentRecord]):
    """Intents read from the journal, and ``damaged``: the rows the same read met that no
    longer decode, left out of the list (``DamagedRow``), so that one of them never hides
    the others. Empty on a healthy journal."""

    damaged: tuple[DamagedRow, ...] = ()

    @classmethod
    def of(cls, records: Iterable[IntentRecord], damaged: Iterable[DamagedRow] = ()) -> Intents:
        made = cls(records)
        made.damaged = tuple(damaged)
        return made


@functools.lru_cache(maxsize=64)
def _headers_from_json(text: str | None) -> tuple[tuple[str, str], ...]:
    """Cached: the same few header sets come back on every row (the request's content type,
    a provider's usual answer headers), and the tuple is immutable."""
    if not text:
        return ()
    return tuple((str(name), str(value)) for name, value in _decode(text))


_LATEST = 253402300799.0
"""9999-12-31T23:59:59Z: no time payonce writes is further from 1970 than this, and a date
can show every time up to it."""


def _time(value: Any) -> float:
    """A time column's value; not a finite number within the dates' range is damage (a NaN
    would compare false with everything: a key's age, a lease's expiry)."""
    try:
        number = float(value)
    except (ValueError, TypeError):
        raise ValueError(f"is not a time: {value!r}") from None
    if not -_LATEST <= number <= _LATEST:  # false for NaN and the infinities too
        raise ValueError(f"is not a time: {value!r}")
    return number


def _real(value: Any) -> float | None:
    return None if value is None else _time(value)


def _count(value: Any, least: int = 0) -> int:
    try:
        number = int(value)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"is not a count: {value!r}") from None
    if number < least or (isinstance(value, float) and number != value):
        raise ValueError(f"is not a count of {least} or more: {value!r}")
    return number


def _status(value: Any) -> int | None:
    if value is None:
        return None
    try:
        status = int(value)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"is not an HTTP status: {value!r}") from None
    if not 100 <= status <= 999 or (isinstance(value, float) and status != value):
        raise ValueError(f"is not an HTTP status: {value!r}")
    return status


def _seconds(value: Any) -> float:
    try:
        number = float(value)
    except (ValueError, TypeError):
        raise ValueError(f"is not a number of seconds: {value!r}") from None
    if not 0.0 <= number <= _LATEST:
        raise ValueError(f"is not a number of seconds: {value!r}")
    return number


def typed(
    fields: dict[str, Any],
    *,
    times: Sequence[str] = (),
    optional_times: Sequence[str] = (),
    counts: Sequence[str] = (),
) -> dict[str, Any]:
    """A row's values (by column name) as the records hold them: SQLite hands a REAL column
    back as the number it stored, and a NULL stays None. A time that is not a finite number
    or a negative count is ``ValueError``, naming the column."""
    for names, convert in ((times, _time), (optional_times, _real), (counts, _count)):
        for name in names:
            try:
                fields[name] = convert(fields[name])
            except ValueError as exc:
                raise ValueError(f"{name} {exc}") from None
    return fields


def _stored_response(
    status: Any, headers: Any, body: Any, body_stored: Any, stored_by: Any, schema: Any
) -> StoredResponse | None:
    """The response columns, in their table order, as the answer they store (if any)."""
    if status is None:
        return None
    return StoredResponse(
        status=_status_of(status),
        headers=_headers_from_json(headers),
        body=bytes(body or b""),
        # Rows stored by schema 1 predate the size cap: their bodies are whole.
        body_stored=body_stored is None or bool(body_stored),
        stored_by=stored_by,
        schema_version=int(schema) if schema is not None else 1,
    )


_DECODING_ERRORS = (ValueError, TypeError, LookupError)


def intent_from_row(row: Sequence[Any]) -> IntentRecord:
    """A row of ``INTENT_COLUMNS`` as its record. Read by position, without a dict of the
    columns: every read of an intent comes through here. A row whose values no longer
    decode (a state payonce never writes, headers that are not JSON, a time that is not a
    finite number) is ``UndecodableRow``."""
    try:
        return _intent(row)
    except _DECODING_ERRORS as exc:
        raise UndecodableRow(_damaged_intent(row, exc)) from exc


def decode_intents(rows: Iterable[Sequence[Any]]) -> Intents:
    """Rows of ``INTENT_COLUMNS`` as their records, each decoded as ``intent_from_row``
    decodes it; a row that does not decode is named in ``damaged`` and left out, never
    failing the read of the others."""
    records: list[IntentRecord] = []
    damaged: list[DamagedRow] = []
    for row in rows:
        try:
            records.append(_intent(row))
        except _DECODING_ERRORS as exc:
            damaged.append(_damaged_intent(row, exc))
    return Intents.of(records, damaged)


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
        created_at=_time(created_at),
        updated_at=_time(updated_at),
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


# -- naming the damage -------------------------------------------------------------------------
# Only once a row failed to decode: each column is tried alone, to say which one is wrong.


def _headers_checked(text: Any) -> object:
    try:
        return _headers_from_json(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not JSON: cut short or edited ({exc})") from None
    except (ValueError, TypeError):
        raise ValueError("is not the JSON list of [name, value] pairs payonce writes") from None


def _state_checked(value: Any) -> object:
    try:
        return IntentState(value)
    except ValueError:
        states = ", ".join(state.value for state in IntentState)
        raise ValueError(f"is {value!r}, not a state payonce writes ({states})") from None


def _text_checked(value: Any) -> object:
    if not isinstance(value, str):
        raise TypeError(f"is {value!r}, not text")
    return value


def _bytes_checked(value: Any) -> object:
    try:
        return bytes(value)
    except TypeError:
        raise TypeError(f"is {value!r}, not bytes") from None


def _optional_seconds(value: Any) -> float | None:
    return None if value is None else _seconds(value)


def _status_of(value: Any) -> int:
    status = _status(value)
    if status is None:
        raise TypeError("is empty")
    return status


_INTENT_CHECKS: tuple[tuple[str, Callable[[Any], object]], ...] = (
    ("key", _text_checked),
    ("request_headers", _headers_checked),
    ("request_body", _bytes_checked),
    ("state", _state_checked),
    ("created_at", _time),
    ("updated_at", _time),
    ("first_sent_at", _real),
    ("lease_expires_at", _real),
    ("response_status", _status),
    ("response_headers", lambda text: None if not text else _headers_checked(text)),
    ("response_body", lambda body: _bytes_checked(body or b"")),
    ("response_schema", lambda schema: None if schema is None else _count(schema, 1)),
    ("acknowledged_at", _real),
    ("key_lifetime", _optional_seconds),
    ("max_processing", _optional_seconds),
)
_INTENT_INDEX = {name: index for index, name in enumerate(INTENT_FIELDS)}


def _problem(
    row: Sequence[Any],
    checks: Sequence[tuple[str, Callable[[Any], object]]],
    index: dict[str, int],
    error: Exception,
) -> str:
    """Which column of ``row`` does not decode, and why; ``error`` (what decoding the whole
    row raised) when no one column alone says."""
    for name, check in checks:
        try:
            check(row[index[name]])
        except _DECODING_ERRORS as exc:
            return f"{name} {exc}"
    return f"{type(error).__name__}: {error}"


def _as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _damaged_intent(row: Sequence[Any], error: Exception) -> DamagedRow:
    key = row[0]
    return DamagedRow(
        table="intents",
        key=key if isinstance(key, str) else repr(key),
        problem=_problem(row, _INTENT_CHECKS, _INTENT_INDEX, error),
        state=_as_text(row[_INTENT_INDEX["state"]]),
        account=_as_text(row[_INTENT_INDEX["account"]]),
        provider=_as_text(row[_INTENT_INDEX["provider"]]),
        reference=_as_text(row[_INTENT_INDEX["reference"]]),
        created_at=row[_INTENT_INDEX["created_at"]],
    )


def _damaged(
    table: str,
    row: Sequence[Any],
    fields: Sequence[str],
    checks: Sequence[tuple[str, Callable[[Any], object]]],
    error: Exception,
) -> UndecodableRow:
    key = row[0]
    index = {name: n for n, name in enumerate(fields)}
    problem = _problem(row, checks, index, error)
    return UndecodableRow(
        DamagedRow(table=table, key=key if isinstance(key, str) else repr(key), problem=problem)
    )


_ATTEMPT_CHECKS: tuple[tuple[str, Callable[[Any], object]], ...] = (
    ("number", lambda number: _count(number, 1)),
    ("started_at", _time),
    ("ended_at", _real),
    ("status_code", _status),
    ("provider_date", _real),
    ("boottime", _real),
)
_RECONCILIATION_CHECKS: tuple[tuple[str, Callable[[Any], object]], ...] = (
    ("at", _time),
    ("status_code", _status),
)
_ESCALATION_CHECKS: tuple[tuple[str, Callable[[Any], object]], ...] = (
    ("unknown_since", _time),
    ("at", _time),
    ("tries", _count),
)


def attempt_from_row(row: Sequence[Any]) -> AttemptRecord:
    try:
        return _attempt(row)
    except _DECODING_ERRORS as exc:
        raise _damaged("attempts", row, ATTEMPT_FIELDS, _ATTEMPT_CHECKS, exc) from exc


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
        number=_count(number, 1),
        started_at=_time(started_at),
        ended_at=_real(ended_at),
        status_code=_status(status_code),
        error=error,
        ambiguous=None if ambiguous is None else bool(ambiguous),
        provider_date=_real(provider_date),
        sent_to=sent_to,
        boot=boot,
        boottime=_real(boottime),
    )


def reconciliation_from_row(row: Sequence[Any]) -> ReconciliationRecord:
    try:
        key, at, outcome, detail, status_code = row
        return ReconciliationRecord(
            key=key, at=_time(at), outcome=outcome, detail=detail, status_code=_status(status_code)
        )
    except _DECODING_ERRORS as exc:
        raise _damaged(
            "reconciliations", row, RECONCILIATION_FIELDS, _RECONCILIATION_CHECKS, exc
        ) from exc


def escalation_from_row(row: Sequence[Any]) -> EscalationRecord:
    try:
        key, unknown_since, at, tries, reason = row
        return EscalationRecord(
            key=key,
            unknown_since=_time(unknown_since),
            at=_time(at),
            tries=_count(tries),
            reason=reason,
        )
    except _DECODING_ERRORS as exc:
        raise _damaged("escalations", row, ESCALATION_FIELDS, _ESCALATION_CHECKS, exc) from exc
