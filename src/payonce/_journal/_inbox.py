"""The webhook inbox's writes to the journal: an event's claim, lease and end.

A received event is a row of ``webhook_events`` keyed by (endpoint, event id). Handling it
works like sending an intent: the worker that will run the handler first takes the row's
lease, renews it while the handler runs, and either marks the event processed (it is then
a duplicate forever after) or releases it unprocessed (the provider's redelivery is handled
again). What a delivery amounts to is ``_lifecycle.decide_event_claim``'s answer; a lease
whose owner died is taken over at once when ``is_stale`` says so (same host, process gone,
``payonce._owners`` by default), otherwise when it expires.

``Inbox`` holds a journal's engine, as the public ``Journal`` (which has the events'
reads) and the clients' ``IntentStore`` do: it relies only on the engine's transaction
runners, so SQLite and PostgreSQL both get it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._lifecycle import EventClaimKind, Unwritten, decide_event_claim, lease_live
from .._owners import owner_is_dead
from ._engine import NO_SEND, Engine, Tx
from ._rows import EVENT_FIELDS, DamagedRow, UndecodableRow, typed

__all__ = [
    "LIST_EVENTS",
    "NOTHING_CHANGED",
    "PRUNE_EVENTS",
    "EventClaim",
    "EventClaimKind",
    "EventRecord",
    "Inbox",
    "event_from_row",
    "select_event",
]

# What a caller may conclude when the journal stayed locked past the busy timeout.
_NOT_RECORDED = (
    "the delivery was not recorded and its handler did not run: answer it with a non-2xx "
    "status so the provider redelivers it"
)
_HANDLED_NOT_RECORDED = (
    "the handler has run but the event could not be marked processed: a redelivery may run it again"
)
NOTHING_CHANGED = NO_SEND
# A webhook delivery's own conclusions: a busy journal frees itself, but the provider's
# redelivery, not a retry of this call, is what follows.
_CLAIM_UNWRITTEN = Unwritten(_NOT_RECORDED, retry_later=False)
_FINISH_UNWRITTEN = Unwritten(_HANDLED_NOT_RECORDED, retry_later=False)

_CLAIM_ROUNDS = 3
_ERROR_CHARS = 500


_COLUMNS = ", ".join(EVENT_FIELDS)
_KEY = " WHERE endpoint = ? AND event_id = ?"

SELECT_EVENT = f"SELECT {_COLUMNS} FROM webhook_events" + _KEY
INSERT_EVENT = (
    "INSERT INTO webhook_events (endpoint, event_id, type, payload_hash, received_at,"
    " updated_at, lease_owner, lease_expires_at, deliveries, handler_runs)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, 1)"
    # Workers receiving the same event at once: the primary key lets exactly one insert win.
    " ON CONFLICT DO NOTHING"
)
COUNT_DELIVERY = "UPDATE webhook_events SET deliveries = deliveries + 1, updated_at = ?" + _KEY
TAKE_EVENT = (
    "UPDATE webhook_events SET lease_owner = ?, lease_expires_at = ?, updated_at = ?,"
    " handler_runs = handler_runs + 1" + _KEY + " AND processed_at IS NULL"
)
RENEW_EVENT = (
    "UPDATE webhook_events SET lease_expires_at = ?"
    + _KEY
    + " AND lease_owner = ? AND processed_at IS NULL"
)
RELEASE_EVENT = (
    "UPDATE webhook_events SET lease_owner = NULL, lease_expires_at = NULL, updated_at = ?,"
    " last_error = ?" + _KEY + " AND lease_owner = ? AND processed_at IS NULL"
)
FINISH_EVENT = (
    "UPDATE webhook_events SET processed_at = ?, updated_at = ?, lease_owner = NULL,"
    " lease_expires_at = NULL, last_error = NULL" + _KEY + " AND processed_at IS NULL"
)
LIST_EVENTS = f"SELECT {_COLUMNS} FROM webhook_events"
PRUNE_EVENTS = "DELETE FROM webhook_events WHERE processed_at IS NOT NULL AND processed_at < ?"


@attrs.frozen
class EventRecord:
    """What the journal knows of one webhook event."""

    endpoint: str
    event_id: str
    type: str
    payload_hash: str
    """SHA-256 of the first delivery's raw body."""
    received_at: float
    """When it was first delivered."""
    updated_at: float
    processed_at: float | None
    """When a handler finished it; None while it still has to be handled."""
    lease_owner: str | None
    lease_expires_at: float | None
    deliveries: int
    """Deliveries seen, the first included (duplicates are counted too)."""
    handler_runs: int
    """Times a handler was started on it (more than 1 after a failure or a crash)."""
    last_error: str | None
    """Why the last handler run failed, while the event is unprocessed."""

    @property
    def processed(self) -> bool:
        return self.processed_at is not None

    def lease_live(self, now: float) -> bool:
        return lease_live(self.lease_owner, self.lease_expires_at, now)


@attrs.frozen
class EventClaim:
    kind: EventClaimKind
    record: EventRecord

    @property
    def run_handler(self) -> bool:
        return self.kind in (EventClaimKind.NEW, EventClaimKind.RETRY)


def select_event(tx: Tx, endpoint: str, event_id: str, *, lock: bool) -> EventRecord | None:
    suffix = tx.dialect.lock_rows if lock else ""
    row = tx.one(SELECT_EVENT + suffix, (endpoint, event_id))
    return event_from_row(row) if row else None


def event_from_row(row: Sequence[Any]) -> EventRecord:
    fields = dict(zip(EVENT_FIELDS, row, strict=True))
    try:
        typed(
            fields,
            times=("received_at", "updated_at"),
            optional_times=("processed_at", "lease_expires_at"),
            counts=("deliveries", "handler_runs"),
        )
    except (ValueError, TypeError) as exc:
        key = f"{fields['endpoint']}/{fields['event_id']}"
        raise UndecodableRow(DamagedRow("webhook_events", key, str(exc))) from exc
    return EventRecord(**fields)


class Inbox:
    """The webhook inbox's writes, in the transactions of the engine it holds."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def claim_event(
        self,
        endpoint: str,
        event_id: str,
        *,
        event_type: str,
        payload_hash: str,
        owner: str,
        now: float,
        lease_seconds: float,
        is_stale: Callable[[str], bool] = owner_is_dead,
    ) -> EventClaim:
        """Record one delivery of an event and take its lease if its handler should run.

        The first delivery inserts the row with the caller's lease (``NEW``). A later one
        is counted and finds the event processed (``DONE``), held by a live worker
        (``LEASED``), or free to be handled again (``RETRY``, lease taken): unprocessed
        with no lease, an expired one, or one whose owner ``is_stale`` judges dead.
        """

        def work(tx: Tx) -> EventClaim:
            for _ in range(_CLAIM_ROUNDS):
                inserted = tx.execute(
                    INSERT_EVENT,
                    (
                        endpoint,
                        event_id,
                        event_type,
                        payload_hash,
                        now,
                        now,
                        owner,
                        now + lease_seconds,
                    ),
                )
                if inserted == 1:
                    record = select_event(tx, endpoint, event_id, lock=False)
                    assert record is not None, "a row this transaction wrote cannot vanish"
                    return EventClaim(EventClaimKind.NEW, record)
                record = select_event(tx, endpoint, event_id, lock=True)
                if record is None:
                    continue  # pruned between the insert and the look-up: insert again
                tx.execute(COUNT_DELIVERY, (now, endpoint, event_id))
                kind = decide_event_claim(
                    processed=record.processed,
                    lease_owner=record.lease_owner,
                    lease_expires_at=record.lease_expires_at,
                    owner=owner,
                    now=now,
                    is_stale=is_stale,
                    lease_seconds=lease_seconds,
                )
                if kind is EventClaimKind.RETRY:
                    tx.execute(TAKE_EVENT, (owner, now + lease_seconds, now, endpoint, event_id))
                current = select_event(tx, endpoint, event_id, lock=False)
                assert current is not None, "a row this transaction holds cannot vanish"
                return EventClaim(kind, current)
            raise self._engine.error(
                f"webhook event {event_id}: its row kept appearing and disappearing under "
                f"concurrent writers; {_NOT_RECORDED}"
            )

        # Not fsynced: a claim only has to be visible to the other workers at once, which
        # every commit is. What must survive an operating-system crash is the processed
        # mark, and ``finish_event`` makes that durable.
        return self._engine.write(work, durable=False, busy=_CLAIM_UNWRITTEN)

    def renew_event_lease(
        self, endpoint: str, event_id: str, *, owner: str, now: float, lease_seconds: float
    ) -> bool:
        """Extend the lease of a handler still running; False when it was lost."""
        return self._engine.write(
            lambda tx: (
                tx.execute(RENEW_EVENT, (now + lease_seconds, endpoint, event_id, owner)) == 1
            ),
            durable=False,
            busy=NOTHING_CHANGED,
        )

    def finish_event(self, endpoint: str, event_id: str, *, owner: str, now: float) -> bool:
        """Mark the event processed (durably) and free its lease.

        Returns False when this owner no longer held the lease: another worker took the
        event over (or finished it first), so the handler may have run twice. The event
        is marked processed all the same, since it has been.
        """

        def work(tx: Tx) -> bool:
            record = select_event(tx, endpoint, event_id, lock=True)
            if record is None:
                raise self._engine.error(
                    f"webhook event {event_id} vanished from the journal while its handler "
                    f"ran (pruned?); {_HANDLED_NOT_RECORDED}"
                )
            if record.processed:
                return False
            tx.execute(FINISH_EVENT, (now, now, endpoint, event_id))
            return record.lease_owner == owner

        return self._engine.write(work, durable=True, busy=_FINISH_UNWRITTEN)

    def release_event(
        self, endpoint: str, event_id: str, *, owner: str, now: float, error: str | None = None
    ) -> None:
        """Give the lease up and leave the event unprocessed, noting why the handler failed."""
        if error is not None and len(error) > _ERROR_CHARS:
            error = error[: _ERROR_CHARS - 1] + "…"
        self._engine.write(
            lambda tx: tx.execute(RELEASE_EVENT, (now, error, endpoint, event_id, owner)),
            durable=False,
            busy=NOTHING_CHANGED,
        )
