"""What a held intent's row holds, known without reading it: the records a claim creates
and a settle leaves, and the created ones a journal object keeps for their settle.

A one-shot intent is created, sent and settled by one call, under a lease whose owner
names that call alone (``new_owner``: host, pid, start time, random). While that lease
is held no one else writes the row, so the settle need not read it back to know what it
holds: it is the record the claim returned. The settle still proves it, in the statement
that writes: its UPDATE matches only the row of that creation (``created_at``), still
held by that owner, still in that state, and falls back to reading the row when it
matches none. So a record kept here is only ever a guess the database confirms.

Any other write of the held intent (a new attempt, an attempt's end, a release) forgets
the key first. The kept records are bounded: a call that ends without any of them leaves
one, and past ``_LIMIT`` they are all dropped (each settle then reads its row, as before).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._lifecycle import IntentDraft, IntentRecord, IntentRequest, IntentState, StoredResponse
from .._version import __version__
from ._schema import SCHEMA_VERSION

__all__ = ["HeldRecords", "created_record", "settled_record"]

_LIMIT = 1024


class HeldRecords:
    """Key → the record its claim created, until the holder's next write of it."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: dict[str, IntentRecord] = {}

    def keep(self, record: IntentRecord) -> None:
        if len(self._records) >= _LIMIT:
            self._records.clear()
        self._records[record.key] = record

    def take(self, key: str, owner: str) -> IntentRecord | None:
        """The record kept for ``key`` if ``owner`` holds it, no longer kept."""
        record = self._records.pop(key, None)
        return record if record is not None and record.lease_owner == owner else None

    def forget(self, key: str) -> None:
        self._records.pop(key, None)


def _record(
    request: IntentRequest,
    headers: tuple[tuple[str, str], ...],
    body: bytes,
    **rest: Any,
) -> IntentRecord:
    """A record of ``request``'s intent, built in one go (``attrs.evolve`` costs a pass over
    every field per change, on every intent)."""
    return IntentRecord(
        key=request.key,
        scope=request.scope,
        reference=request.reference,
        account=request.account,
        provider=request.provider,
        method=request.method,
        url=request.url,
        fingerprint=request.fingerprint,
        request_headers=headers,
        body=body,
        credential=request.credential,
        account_scope=request.account_scope,
        **rest,
    )


def _kept_headers(headers: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Headers as a read of their JSON column returns them."""
    return tuple((str(name), str(value)) for name, value in headers)


def created_record(
    draft: IntentDraft, owner: str, now: float, lease_seconds: float
) -> IntentRecord:
    """The row ``IntentStore._create`` has just inserted, as reading it back would return it."""
    return _record(
        draft,
        _kept_headers(draft.request_headers),
        bytes(draft.body),
        state=IntentState.PENDING,
        created_at=now,
        updated_at=now,
        first_sent_at=now,
        lease_owner=owner,
        lease_expires_at=now + lease_seconds,
        unknown_reason=None,
        response=None,
        acknowledged_at=None,
        attempt_count=1,
        key_terms=draft.key_terms,
    )


def settled_record(
    held: IntentRecord,
    state: IntentState,
    now: float,
    acknowledged: float | None,
    response: StoredResponse,
) -> IntentRecord:
    """The held row as ``_sql.SETTLE_WITH_RESPONSE`` leaves it, without reading it back: the
    lease was held, so no one else wrote it in between."""
    return _record(
        held,
        held.request_headers,
        held.body,
        state=state,
        created_at=held.created_at,
        updated_at=now,
        first_sent_at=held.first_sent_at,
        lease_owner=None,
        lease_expires_at=None,
        unknown_reason=None,
        response=StoredResponse(
            status=response.status,
            headers=_kept_headers(response.headers),
            body=bytes(response.body),
            body_stored=response.body_stored,
            stored_by=__version__,
            schema_version=SCHEMA_VERSION,
        ),
        acknowledged_at=held.acknowledged_at if held.acknowledged_at is not None else acknowledged,
        attempt_count=held.attempt_count,
        abandon_reason=held.abandon_reason,
        key_terms=held.key_terms,
    )
