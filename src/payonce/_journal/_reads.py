"""``Journal``: what an operator, the CLI and a user's own code may do with a journal.

Reads (of intents and of webhook events), and the operator's commands: ``abandon`` and
``acknowledge`` (refused for an intent they do not fit), ``prune`` in short batches,
``check`` and ``backup``. Writing intents and events (claims, leases, attempts, outcomes)
is the clients' and the inbox's alone, through the private ``IntentStore`` (``_store``)
and ``Inbox`` (``_inbox``), so that no one settles an intent behind a lease's back.

A ``Journal`` holds its backend's engine (``_engine``) and runs every method in the
engine's transactions; ``SQLiteJournal`` and ``PostgresJournal`` are the journals whose
constructors make that engine.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Self

import attrs

from .._crash import crash_point
from .._lifecycle import (
    AttemptRecord,
    EscalationRecord,
    IntentRecord,
    IntentState,
    ReconciliationRecord,
    Transition,
    Unwritten,
    abandon_blocked,
    step_key,
    step_of_reference,
    step_reference,
)
from .._lifecycle._key_age import PRUNE_AFTER_KEY_LIFETIMES
from .._owners import owner_is_dead
from .._providers._profile import key_lifetime_of, key_max_length_of
from ..errors import ConfigurationError, IntentInFlight
from . import _sql as sql
from ._engine import NO_SEND, NOT_A_JOURNAL_YET, Engine, Tx
from ._inbox import (
    LIST_EVENTS,
    NOTHING_CHANGED,
    PRUNE_EVENTS,
    EventRecord,
    event_from_row,
    select_event,
)
from ._intents import allowed, reread, select_intent
from ._reports import JournalReport
from ._rows import (
    INTENT_FIELDS,
    DamagedRow,
    Intents,
    UndecodableRow,
    attempt_from_row,
    decode_intents,
    escalation_from_row,
    reconciliation_from_row,
)
from ._schema import (
    BOOT_CLOCK_SCHEMA,
    ESCALATIONS_SCHEMA,
    KEY_TERMS_SCHEMA,
    PER_CALL_KEYS_SCHEMA,
    PROVIDER_DATE_SCHEMA,
    SCHEMA_VERSION,
    SENT_TO_SCHEMA,
)

__all__ = ["Journal", "Outcomes"]

_SETTLED = (IntentState.SUCCEEDED.value, IntentState.FAILED.value)
_SCAN_PAGE = 500
"""Intents per page of ``check``'s read of every row: a few MB at most, with their bodies."""
_SCAN_EVENTS = (
    LIST_EVENTS + " WHERE endpoint > ? OR (endpoint = ? AND event_id > ?)"
    " ORDER BY endpoint, event_id LIMIT ?"
)
_CANNOT_ABANDON = (
    "intent {key} is already {state}; only pending or unknown intents can be abandoned"
)
_CANNOT_ACKNOWLEDGE = (
    "intent {key} is {state}: only a settled intent (succeeded or failed) can be acknowledged"
)


@attrs.frozen
class Outcomes:
    """A page of ``outcomes()``: enqueued intents settled and not acknowledged yet, in the
    order they settled. Iterate over it; it is false when empty."""

    intents: tuple[IntentRecord, ...]
    cursor: str | None
    """Where the next page starts (pass it as ``after=``): just after this page's last
    intent. None for an empty page."""
    damaged: tuple[DamagedRow, ...] = ()
    """The rows of this page that no longer decode, left out of it (``DamagedRow``): an
    outcome the service cannot be told, to look at by hand (`payonce journal check`)."""

    def __iter__(self) -> Iterator[IntentRecord]:
        return iter(self.intents)

    def __len__(self) -> int:
        return len(self.intents)


def _cursor(record: IntentRecord) -> str:
    return f"{record.updated_at!r} {record.key}"


def _after(cursor: str) -> tuple[float, str]:
    at, _, key = cursor.partition(" ")
    try:
        when = float(at)
    except ValueError:
        when = math.nan
    if not key or not math.isfinite(when):
        raise ConfigurationError(
            f"after={cursor!r} is not a cursor that outcomes() returned: pass a page's "
            "cursor as it is, or none to start at the oldest outcome"
        )
    return when, key


class Journal:
    """The durable store of intents and attempts, as its readers and operators see it.

    Every method is atomic. ``SQLiteJournal(path)`` and ``PostgresJournal(url)`` open one,
    and ``payonce.open_journal`` opens either.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def location(self) -> str:
        """Where the journal lives (a path or a URL without credentials)."""
        return self._engine.location

    def now(self) -> float:
        """The journal's time: this host's wall clock corrected to the database server's
        for a PostgreSQL journal (its offset measured on each new connection), so that
        hosts sharing one journal date and judge its leases by one clock; this host's
        clock for SQLite."""
        return time.time() + self._engine.clock_offset

    def backup(self, destination: str | os.PathLike[str]) -> Path:
        """A consistent copy at ``destination``, a new file; ``JournalError`` where the
        journal's own database tools must do it (PostgreSQL: ``pg_dump``)."""
        return self._engine.backup(destination)

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    @property
    def read_only(self) -> bool:
        """Opened with ``read_only=True``: never created, migrated or written through."""
        return self._engine.read_only

    @property
    def schema_version(self) -> int:
        """The journal's schema version. A journal opened to write has this payonce's (it
        migrated it on open); a read-only one has the version it was found at, 0 when the
        store holds no payonce tables yet."""
        return self._engine.schema_version

    def reconciliations(self, key: str) -> list[ReconciliationRecord]:
        # Decoded inside the read: a row that no longer decodes is the journal's damage.
        return self._engine.read(
            lambda tx: [
                reconciliation_from_row(row)
                for row in tx.all(sql.RECONCILIATIONS + tx.dialect.tiebreak, (key,))
            ]
        )

    def escalations(self, key: str) -> list[EscalationRecord]:
        """The worker's escalations of the intent, one per time it went unknown and was
        given up on by its schedule, oldest first (none in a journal older than schema 8)."""
        if self._engine.schema_version < ESCALATIONS_SCHEMA:  # read-only, not migrated
            return []
        return self._engine.read(
            lambda tx: [escalation_from_row(row) for row in tx.all(sql.ESCALATIONS, (key,))]
        )

    def abandon(self, key: str, *, reason: str, now: float) -> IntentRecord:
        def work(tx: Tx) -> IntentRecord:
            record = self._existing(tx, key)
            allowed(record, Transition.ABANDONED, _CANNOT_ABANDON)
            if abandon_blocked(
                record.lease_owner, record.lease_expires_at, now=now, is_stale=owner_is_dead
            ):
                raise IntentInFlight(
                    f"intent {key} is being sent by {record.lease_owner} right now; abandon "
                    "it once that attempt has ended",
                    key=key,
                    reference=record.reference,
                )
            tx.execute(sql.ABANDON, (IntentState.ABANDONED.value, reason, now, key))
            return reread(tx, key)

        # Durable: an abandonment rolled back by an OS crash would let resume() send an
        # intent the operator closed (and perhaps paid again under a new reference).
        return self._engine.write(work, durable=True, busy=NO_SEND)

    def acknowledge(self, key: str, *, now: float) -> IntentRecord:
        crash_point("before_acknowledge")

        def work(tx: Tx) -> IntentRecord:
            record = self._existing(tx, key)
            allowed(record, Transition.ACKNOWLEDGED, _CANNOT_ACKNOWLEDGE)
            if record.acknowledged_at is not None:
                return record  # acknowledged once: the first time stands
            tx.execute(sql.ACKNOWLEDGE, (now, key))
            return attrs.evolve(record, acknowledged_at=now)

        return self._engine.write(work, durable=False, busy=NO_SEND)

    def _existing(self, tx: Tx, key: str) -> IntentRecord:
        record = select_intent(tx, sql.BY_KEY, (key,), lock=True)
        if record is None:
            raise self._engine.error(f"no intent with key {key!r}")
        return record

    # -- reading ---------------------------------------------------------------------------

    def _intents(self, statement: str, params: Sequence[Any]) -> Intents:
        # Each row decoded alone: one that no longer decodes is named in ``damaged`` and
        # never keeps the others of the page from being read.
        return self._engine.read(lambda tx: decode_intents(tx.all(statement, params)))

    def pending(self, *, account: str, provider: str, limit: int | None = None) -> Intents:
        """Pending intents of this account and provider, oldest first, leased or not.

        Like every listing of intents, the rows that no longer decode are left out and named
        in the list's ``damaged`` (``payonce.journal.DamagedRow``)."""
        statement = sql.PENDING
        params: list[Any] = [IntentState.PENDING.value, account, provider]
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        return self._intents(statement, params)

    def unacknowledged(self, *, account: str | None = None) -> Intents:
        statement = sql.UNACKNOWLEDGED
        params: list[Any] = list(_SETTLED)
        if account is not None:
            statement += " AND account = ?"
            params.append(account)
        return self._intents(statement + " ORDER BY created_at, key", params)

    def outcomes(
        self,
        *,
        account: str | None = None,
        provider: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> Outcomes:
        """The settled outcomes (succeeded or failed) of enqueued intents not acknowledged
        yet, of one account and provider if given, oldest settled first, at most ``limit``,
        after the cursor ``after`` (a page's ``cursor``). Acknowledge each (``acknowledge``)
        once its outcome is recorded: it is not listed again. Without ``after``, a page
        starts at the oldest unacknowledged outcome, however late it committed: start each
        pass there, and nothing is ever passed over."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(f"limit must be a whole number >= 1, not {limit!r}")
        statement = sql.OUTCOMES
        params: list[Any] = list(_SETTLED)
        for column, value in (("account", account), ("provider", provider)):
            if value is not None:
                statement += f" AND {column} = ?"
                params.append(value)
        if after is not None:
            when, key = _after(after)
            statement += sql.OUTCOMES_AFTER
            params += [when, when, key]
        page = self._intents(statement + sql.OUTCOMES_ORDER, [*params, limit])
        found = tuple(page)
        return Outcomes(found, _cursor(found[-1]) if found else None, page.damaged)

    def accounts(self) -> list[str]:
        """Every account the journal holds intents of, in any state, sorted."""
        rows = self._engine.read(lambda tx: tx.all(sql.ACCOUNTS, ()))
        return sorted(str(row[0]) for row in rows)

    def get(self, key: str) -> IntentRecord | None:
        return self._engine.read(lambda tx: select_intent(tx, sql.BY_KEY, (key,)))

    def find(self, key_or_reference: str) -> Intents:
        return self._intents(sql.FIND, (key_or_reference, key_or_reference))

    def block_rows(
        self, key: str, *, provider: str, account: str, named: str
    ) -> list[IntentRecord]:
        """The rows of a block whose step 1 is keyed ``key``: that one, and every row of the
        provider and account whose reference begins like a step of ``named`` (the block's
        reference, else its key: ``order-7#step``), gaps in the positions included. What
        a block reads to place a request among the steps an earlier run journaled."""
        pattern = sql.like_prefix(f"{named}#step")
        return self._intents(sql.BLOCK, (key, provider, account, pattern))

    def steps(self, key: str) -> list[IntentRecord]:
        """The steps 2, 3… of the intent keyed ``key``, in order: the later requests of its
        ``with client.intent(...)`` block, each an intent of its own keyed from this one's
        (``KEY-step2``…, or a hashed form where the provider's key limit is too short).
        Empty for an intent of one request, or for a key that is itself a step's. A step
        under a key the caller set is found by its reference (``order-1#step2``)."""
        record = self.get(key)
        if record is None or step_of_reference(record.reference) is not None:
            return []
        max_length = key_max_length_of(record.provider)
        named = record.reference or record.key
        found: list[IntentRecord] = []
        while True:
            number = len(found) + 2
            step = self.get(step_key(key, number, max_length=max_length))
            if step is None:
                step = self._step_by_reference(step_reference(named, number), record)
            if step is None:
                return found
            found.append(step)

    def _step_by_reference(self, reference: str, intent: IntentRecord) -> IntentRecord | None:
        # The first journaled since its intent: an intent of the same reference on another
        # endpoint (another scope) may have steps of its own under the same name.
        since = [r for r in self.find(reference) if r.created_at >= intent.created_at]
        return min(since, key=lambda r: r.created_at, default=None)

    def list_intents(
        self, *, states: Iterable[IntentState] | None = None, limit: int | None = None
    ) -> Intents:
        """Newest first. A row that no longer decodes is left out and named in the list's
        ``damaged`` (``payonce.journal.DamagedRow``): it never hides the other rows."""
        statement = sql.LIST
        params: list[Any] = []
        if states is not None:
            wanted = list(dict.fromkeys(IntentState(s).value for s in states))
            if not wanted:
                return Intents()
            if len(wanted) > 1 and limit is not None:
                params = [value for state in wanted for value in (state, limit)]
                return self._intents(sql.newest_in_states(len(wanted)), [*params, limit])
            statement += f" WHERE state IN ({', '.join('?' for _ in wanted)})"
            params.extend(wanted)
        statement += sql.NEWEST
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        return self._intents(statement, params)

    def _attempts_statement(self) -> str:
        if self._engine.schema_version < PROVIDER_DATE_SCHEMA:  # read-only, not migrated
            return sql.ATTEMPTS_BEFORE_PROVIDER_DATE
        if self._engine.schema_version < SENT_TO_SCHEMA:
            return sql.ATTEMPTS_BEFORE_SENT_TO
        if self._engine.schema_version < BOOT_CLOCK_SCHEMA:
            return sql.ATTEMPTS_BEFORE_BOOT_CLOCK
        return sql.ATTEMPTS

    def attempts(self, key: str) -> list[AttemptRecord]:
        statement = self._attempts_statement()
        return self._engine.read(
            lambda tx: [attempt_from_row(row) for row in tx.all(statement, (key,))]
        )

    # -- pruning ----------------------------------------------------------------------------

    def prune(
        self,
        *,
        older_than: float,
        batch_size: int = 1000,
        dry_run: bool = False,
        on_batch: Callable[[int], None] | None = None,
        include_unacknowledged: bool = False,
        now: float | None = None,
    ) -> int:
        """Delete final intents nothing has touched since ``older_than`` (a timestamp).

        Only succeeded and failed intents the caller has acknowledged, and abandoned ones
        (they have no outcome to hand over), with their attempts and reconciliations;
        ``include_unacknowledged`` gives up settled outcomes the caller never acknowledged
        too. Pending and unknown intents are never pruned (abandon them first, with the
        reason), and neither is an intent younger than ``PRUNE_AFTER_KEY_LIFETIMES`` of
        its provider's key lifetimes, whatever ``older_than`` says. Runs in batches of
        ``batch_size``, each its own short transaction, so writers wait for one batch at
        most; ``on_batch`` gets the running total after each. Returns how many intents
        were deleted (with ``dry_run``: would be, and nothing is deleted).

        A pruned intent is forgotten: the same reference used again is a new intent with
        a new key, and pays again. Keep the cut-off well beyond any retry of a business
        operation.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        selections = self._prunable(older_than, include_unacknowledged, now)
        if dry_run:
            return sum(self._count(sql.COUNT_PRUNABLE, params) for params in selections)
        total = 0
        for params in selections:
            total = self._prune_batches(params, batch_size, total, on_batch)
        return total

    def _count(self, statement: str, params: Sequence[Any]) -> int:
        row = self._engine.read(lambda tx: tx.one(statement, params))
        return int(row[0]) if row else 0

    def prunable(
        self,
        *,
        older_than: float,
        include_unacknowledged: bool = False,
        now: float | None = None,
        limit: int = 20,
    ) -> list[IntentRecord]:
        """What ``prune`` with the same arguments would delete: the least recently changed
        first, at most ``limit`` of them per provider."""
        found: list[IntentRecord] = []
        for params in self._prunable(older_than, include_unacknowledged, now):
            found += self._intents(sql.LIST_PRUNABLE, (*params, limit))
        return found

    def _prunable(
        self, older_than: float, include_unacknowledged: bool, now: float | None
    ) -> list[tuple[Any, ...]]:
        """The parameters of the prunable selection, one set per provider in the journal."""
        now = self.now() if now is None else now
        providers = [row[0] for row in self._engine.read(lambda tx: tx.all(sql.PROVIDERS, ()))]
        return [
            (
                *sql.PRUNABLE_STATES,
                older_than,
                provider,
                now - key_lifetime_of(provider) * PRUNE_AFTER_KEY_LIFETIMES,
                IntentState.ABANDONED.value,
                older_than,
                include_unacknowledged,
            )
            for provider in sorted(providers)
        ]

    def _prune_batches(
        self,
        params: tuple[Any, ...],
        batch_size: int,
        total: int,
        on_batch: Callable[[int], None] | None,
    ) -> int:
        def batch(tx: Tx) -> int:
            statement = sql.PRUNE_BATCH.format(skip_locked=tx.dialect.skip_locked)
            return tx.execute(statement, (*params, batch_size))

        while True:
            busy = (
                Unwritten(
                    f"{total} intent(s) were pruned before it; prune again to go on",
                    retry_later=False,
                )
                if total
                else NO_SEND
            )
            began = time.monotonic()
            deleted = self._engine.write(batch, durable=False, busy=busy)
            if deleted <= 0:
                return total
            total += deleted
            if on_batch is not None:
                on_batch(total)
            self._engine.between_batches(time.monotonic() - began)

    # -- operating --------------------------------------------------------------------------

    def check(self) -> JournalReport:
        """Integrity, schema and contents, read at one instant (writers are not blocked),
        and every row that no longer decodes (``JournalReport.damaged_rows``), each decoded
        as the listings and the recovery passes decode it."""

        engine = self._engine

        def work(tx: Tx) -> JournalReport:
            if engine.schema_version == 0:
                return JournalReport(
                    location=self.location,
                    ok=False,
                    problems=(NOT_A_JOURNAL_YET,),
                    schema_version=0,
                    intents_by_state={},
                    unacknowledged=0,
                    size_bytes=engine.size_bytes(tx),
                )
            size = engine.size_bytes(tx)
            storage = [p for p in engine.storage_problems(tx) if p != "ok"]
            missing = engine.missing_parts(tx)
            problems = storage + missing
            meta: dict[str, str] = {}
            by_state: dict[str, int] = {}
            unacknowledged = 0
            damaged: list[DamagedRow] = []
            contents_read = not missing
            if contents_read:
                # A damaged index or page may leave the rows readable: what can be read is
                # reported, so damage is never shown as an empty journal. Last, because a
                # read that fails may end the transaction (PostgreSQL).
                try:
                    meta, by_state, unacknowledged = self._contents(tx)
                    if self._rows_readable(tx):
                        damaged = self._damaged_rows(tx)
                except Exception:
                    if not problems:
                        raise
                    contents_read = False
            try:
                version = int(meta.get("schema_version", 0))
            except ValueError:
                version = 0
                problems.append(f"schema version {meta.get('schema_version')!r} is not a number")
            return JournalReport(
                location=self.location,
                ok=not problems and not damaged,
                problems=tuple(problems),
                schema_version=version,
                intents_by_state=by_state,
                unacknowledged=unacknowledged,
                size_bytes=size,
                contents_read=contents_read,
                damaged_rows=tuple(damaged),
            )

        return self._engine.read(work, snapshot=True)

    def _rows_readable(self, tx: Tx) -> bool:
        """Whether this payonce reads the intents' rows as they are: a read-only journal of
        an older schema is read with the columns added since as NULL, and one older than
        that only once migrated (as `intents list` says), so its rows are not judged."""
        version = self._engine.schema_version
        if version >= SCHEMA_VERSION:
            return True
        read_as_null = set()
        if version < PER_CALL_KEYS_SCHEMA:
            read_as_null.add("key_per_call")
        if version < KEY_TERMS_SCHEMA:
            read_as_null |= {
                "key_lifetime",
                "key_lifetime_documented",
                "max_processing",
                "enqueued",
            }
        present = self._engine.present_columns(tx, "intents")
        return set(INTENT_FIELDS) - read_as_null <= present

    def _damaged_rows(self, tx: Tx) -> list[DamagedRow]:
        """Every row of the intents and of what belongs to them (attempts, reconciliations,
        escalations) that does not decode, each read as every other read of payonce reads
        it: what a listing leaves out and a recovery pass skips. Read in pages of intents
        by key, each page's attempts and the rest with it."""
        per_intent = [
            (self._attempts_statement(), attempt_from_row),
            (sql.RECONCILIATIONS, reconciliation_from_row),
        ]
        if self._engine.schema_version >= ESCALATIONS_SCHEMA:
            per_intent.append((sql.ESCALATIONS, escalation_from_row))
        damaged: list[DamagedRow] = []
        after = ""
        while True:
            rows = tx.all(sql.SCAN_INTENTS, (after, _SCAN_PAGE))
            damaged += decode_intents(rows).damaged
            last = rows[-1][0] if len(rows) == _SCAN_PAGE else None
            for statement, decode in per_intent:
                # To the end of the table on the last page: rows of no intent are read too.
                bounds = (after,) if last is None else (after, last)
                for row in tx.all(sql.in_key_range(statement, bounded=last is not None), bounds):
                    try:
                        decode(row)
                    except UndecodableRow as exc:
                        damaged.append(exc.damaged)
            if last is None:
                return damaged + self._damaged_events(tx)
            after = last

    def _damaged_events(self, tx: Tx) -> list[DamagedRow]:
        """The webhook inbox's rows that do not decode, as ``get_event`` decodes them."""
        if not self._engine.present_columns(tx, "webhook_events"):
            return []  # a journal older than the inbox, read as it is
        damaged: list[DamagedRow] = []
        endpoint, event_id = "", ""
        while True:
            rows = tx.all(_SCAN_EVENTS, (endpoint, endpoint, event_id, _SCAN_PAGE))
            for row in rows:
                try:
                    event_from_row(row)
                except UndecodableRow as exc:
                    damaged.append(exc.damaged)
            if len(rows) < _SCAN_PAGE:
                return damaged
            endpoint, event_id = rows[-1][0], rows[-1][1]

    def _contents(self, tx: Tx) -> tuple[dict[str, str], dict[str, int], int]:
        """The journal's meta rows, its intents by state and how many are unacknowledged."""
        meta = dict(tx.all(sql.META))
        by_state = {str(s): int(n) for s, n in tx.all(sql.COUNT_BY_STATE)}
        if "acknowledged_at" in self._engine.present_columns(tx, "intents"):
            row = tx.one(sql.COUNT_UNACKNOWLEDGED, _SETTLED)
            unacknowledged = int(row[0]) if row else 0
        else:  # schema 1 predates acknowledgements: no outcome was ever acknowledged
            unacknowledged = sum(by_state.get(state, 0) for state in _SETTLED)
        return meta, by_state, unacknowledged

    # -- webhook events ------------------------------------------------------------------

    def get_event(self, endpoint: str, event_id: str) -> EventRecord | None:
        return self._engine.read(lambda tx: select_event(tx, endpoint, event_id, lock=False))

    def list_events(
        self,
        *,
        endpoint: str | None = None,
        unprocessed: bool = False,
        limit: int | None = None,
    ) -> list[EventRecord]:
        """Events, oldest first received first; ``unprocessed`` keeps those still to handle."""
        where: list[str] = []
        params: list[Any] = []
        if endpoint is not None:
            where.append("endpoint = ?")
            params.append(endpoint)
        if unprocessed:
            where.append("processed_at IS NULL")
        statement = LIST_EVENTS
        if where:
            statement += " WHERE " + " AND ".join(where)
        statement += " ORDER BY received_at, endpoint, event_id"
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        rows = self._engine.read(lambda tx: tx.all(statement, params))
        return [event_from_row(row) for row in rows]

    def prune_events(self, *, processed_before: float) -> int:
        """Forget events processed before this time; returns how many.

        A pruned event's redelivery is handled again: keep events longer than the
        provider redelivers (Stripe: up to 3 days).
        """
        return self._engine.write(
            lambda tx: tx.execute(PRUNE_EVENTS, (processed_before,)),
            durable=False,
            busy=NOTHING_CHANGED,
        )
