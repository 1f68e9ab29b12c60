"""The journal's logic, once, for every SQL backend.

``SQLJournal`` implements every ``Journal`` method in terms of two transaction runners a
backend provides: ``_write(work, durable=…, busy=…)`` runs ``work(tx)`` in one read-then-
write transaction (durably committed or not), ``_read(work)`` runs it for reading. A
backend adds only what is its own: connecting, opening and checking, locking, durability
settings and the translation of its driver's errors.

Inside ``_write`` every row read with ``lock=True`` stays locked until the commit (SQLite
holds the whole database with ``BEGIN IMMEDIATE``; PostgreSQL locks the rows with ``FOR
UPDATE``), so a lease tested here cannot change hands before the write that relies on it.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, Self, TypeVar

import attrs

from .._crash import crash_point
from .._intent import IntentState
from .._version import __version__
from ..errors import IntentInFlight, IntentStateError, JournalBusy, JournalError
from . import _sql as sql
from ._inbox import InboxMixin
from ._records import (
    AttemptRecord,
    Claim,
    ClaimKind,
    IntentDraft,
    IntentRecord,
    JournalReport,
    ReconciliationRecord,
    StoredResponse,
)
from ._schema import APPLICATION, SCHEMA_VERSION

__all__ = ["AFTER_SEND", "BEFORE_SEND", "NO_SEND", "Cursor", "SQLJournal", "Tx", "migrate"]

T = TypeVar("T")

# What a caller may conclude when a write could not take the journal's lock in time.
BEFORE_SEND = "nothing was sent. Retry later"
AFTER_SEND = (
    "the request may already have reached the provider, so this is not a refusal: the "
    "intent stays pending under its key, and calling again with the same reference once "
    "the journal is free settles it without paying twice"
)
NO_SEND = "nothing was changed. Retry later"

_SETTLED = (IntentState.SUCCEEDED.value, IntentState.FAILED.value)
_CLAIM_ROUNDS = 3
_QUEUE_BATCH = 32


class Cursor(Protocol):
    """What the journal needs of a DB-API cursor (sqlite3's and psycopg's both fit)."""

    def execute(self, statement: str, parameters: Sequence[Any], /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...


class Tx:
    """One transaction's cursor, speaking the shared ``?`` statements in its dialect."""

    __slots__ = ("_cursor", "dialect")

    def __init__(self, cursor: Cursor, dialect: sql.Dialect) -> None:
        self._cursor = cursor
        self.dialect = dialect

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; the number of rows it changed."""
        self._cursor.execute(self.dialect.sql(statement), params)
        return int(self._cursor.rowcount)

    def one(self, statement: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self._cursor.execute(self.dialect.sql(statement), params)
        row = self._cursor.fetchone()
        return None if row is None else tuple(row)

    def all(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._cursor.execute(self.dialect.sql(statement), params)
        return [tuple(row) for row in self._cursor.fetchall()]


def migrate(tx: Tx, *, target: int = SCHEMA_VERSION, refuse: Callable[[str], JournalError]) -> int:
    """Bring the journal's schema to ``target`` inside the caller's transaction.

    Returns the version found. ``refuse(message)`` makes the error raised for a store that
    belongs to another application or to a newer payonce; nothing is written then.
    """
    version = 0
    if tx.one(tx.dialect.has_relation, ("payonce_meta",)) is not None:
        meta = dict(tx.all(sql.META))
        if meta.get("application") != APPLICATION:
            raise refuse(
                "its payonce_meta table belongs to another application, not to payonce; "
                "payonce will not write to it"
            )
        try:
            version = int(meta.get("schema_version", "0"))
        except ValueError:
            raise refuse(
                f"its schema version {meta.get('schema_version')!r} is not a number; the "
                "journal is damaged: restore it from a backup"
            ) from None
    if version > SCHEMA_VERSION:
        raise refuse(
            f"the journal was written by a newer payonce (schema {version}, this payonce "
            f"knows {SCHEMA_VERSION}); upgrade payonce to use it"
        )
    migrations = tx.dialect.migrations
    for number in range(version + 1, target + 1):
        for statement in migrations[number - 1]:
            tx.execute(statement)
    if version < target:
        for name, value in (
            ("application", APPLICATION),
            ("schema_version", str(target)),
            ("migrated_by", __version__),
        ):
            tx.execute(sql.UPSERT_META, (name, value))
    return version


def _response_values(response: StoredResponse) -> tuple[Any, ...]:
    """The response columns' values, in STORE_RESPONSE's order."""
    return (
        response.status,
        sql.headers_to_json(response.headers),
        response.body,
        int(response.body_stored),
        __version__,
        SCHEMA_VERSION,
    )


def _created_record(
    draft: IntentDraft, owner: str, now: float, lease_seconds: float
) -> IntentRecord:
    """The row ``_create`` has just inserted, as reading it back would return it."""
    return IntentRecord(
        key=draft.key,
        scope=draft.scope,
        reference=draft.reference,
        account=draft.account,
        provider=draft.provider,
        method=draft.method,
        url=draft.url,
        fingerprint=draft.fingerprint,
        request_headers=tuple((str(n), str(v)) for n, v in draft.request_headers),
        body=bytes(draft.body),
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
    )


class SQLJournal(InboxMixin, abc.ABC):
    """Every ``Journal`` method, for any backend that can run a ``Tx``."""

    _dialect: sql.Dialect

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the journal lives (a path or a URL without credentials)."""

    # -- what a backend provides ------------------------------------------------------------

    @abc.abstractmethod
    def _write(self, work: Callable[[Tx], T], *, durable: bool, busy: str) -> T:
        """Run ``work`` in one read-then-write transaction and commit it.

        ``durable`` commits survive an operating-system crash before this returns; the
        others survive a crash of the process. ``busy`` ends the message of the
        ``JournalBusy`` raised when the journal stayed locked past the busy timeout.
        """

    @abc.abstractmethod
    def _read(self, work: Callable[[Tx], T], *, snapshot: bool = False) -> T:
        """Run ``work`` for reading; ``snapshot`` makes its statements see one instant."""

    @abc.abstractmethod
    def _storage_problems(self, tx: Tx) -> list[str]:
        """The backend's own integrity findings, for ``check``."""

    @abc.abstractmethod
    def _size_bytes(self, tx: Tx) -> int: ...

    @abc.abstractmethod
    def _present_columns(self, tx: Tx, table: str) -> set[str]:
        """The columns ``table`` has, or an empty set when there is no such table."""

    @abc.abstractmethod
    def close(self) -> None: ...

    # -- errors ----------------------------------------------------------------------------

    def _error(self, what: str, *, busy: bool = False) -> JournalError:
        cls = JournalBusy if busy else JournalError
        return cls(f"{what} (journal: {self.location})", location=self.location)

    def _refuse(self, kind: str) -> Callable[[str], JournalError]:
        return lambda why: self._error(f"this {kind} is not a usable payonce journal: {why}")

    # -- intents ---------------------------------------------------------------------------

    def _select(
        self, tx: Tx, where: str, params: Sequence[Any], *, lock: bool = False
    ) -> IntentRecord | None:
        suffix = tx.dialect.lock_rows if lock else ""
        row = tx.one(sql.SELECT_INTENT + where + suffix, params)
        return sql.intent_from_row(row) if row else None

    def _reread(self, tx: Tx, key: str) -> IntentRecord:
        record = self._select(tx, sql.BY_KEY, (key,))
        assert record is not None, "a row this transaction holds cannot vanish"
        return record

    def _held_by(self, tx: Tx, key: str, owner: str) -> IntentRecord:
        record = self._select(tx, sql.BY_KEY, (key,), lock=True)
        if record is None or record.lease_owner != owner:
            raise IntentInFlight(
                f"intent {key} is no longer held by this worker (its lease expired and "
                "another worker took it over); its outcome will be settled by that worker",
                key=key,
                reference=record.reference if record else None,
            )
        return record

    def _existing(self, tx: Tx, key: str) -> IntentRecord:
        record = self._select(tx, sql.BY_KEY, (key,), lock=True)
        if record is None:
            raise self._error(f"no intent with key {key!r}")
        return record

    def claim(
        self,
        draft: IntentDraft,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        stale_owner: str | None = None,
    ) -> Claim:
        def find(tx: Tx, lock: bool) -> IntentRecord | None:
            record = None
            if draft.reference is not None:
                record = self._select(
                    tx, sql.BY_REFERENCE, (draft.scope, draft.reference), lock=lock
                )
            return record or self._select(tx, sql.BY_KEY, (draft.key,), lock=lock)

        def created() -> Claim:
            return Claim(
                ClaimKind.CREATED,
                _created_record(draft, owner, now, lease_seconds),
                attempt_number=1,
            )

        def work(tx: Tx) -> Claim:
            if not tx.dialect.lock_rows and self._create(tx, draft, owner, now, lease_seconds):
                # Writers are serialised (SQLite holds the whole journal), so an insert the
                # unique key and (scope, reference) let through is exactly a look-up that
                # found nothing: a new intent costs no look-ups. Any other answer needs them.
                return created()
            for _ in range(_CLAIM_ROUNDS):
                claim = self._claim_row(
                    tx, find, draft, owner, now, lease_seconds, False, stale_owner
                )
                if claim is not None:
                    return claim
                if self._create(tx, draft, owner, now, lease_seconds):
                    return created()
                # Another worker created it between the look-up and the insert, and has
                # committed: the next look-up finds its row.
            raise self._error(
                f"intent {draft.key}: its row kept appearing and disappearing under "
                "concurrent writers; nothing was sent. Retry later"
            )

        return self._write(work, durable=True, busy=BEFORE_SEND)

    def _claim_row(
        self,
        tx: Tx,
        find: Callable[[Tx, bool], IntentRecord | None],
        draft: IntentDraft | None,
        owner: str,
        now: float,
        lease_seconds: float,
        unknown: bool,
        stale_owner: str | None,
    ) -> Claim | None:
        """Decide on the intent ``find`` returns and take its lease if it may be taken."""

        def verdict(record: IntentRecord) -> ClaimKind | None:
            if draft is not None and sql.is_mismatch(record, draft):
                return ClaimKind.MISMATCH
            return sql.decide_claim(
                record, owner=owner, now=now, unknown=unknown, stale_owner=stale_owner
            )

        record = find(tx, False)
        kind = verdict(record) if record is not None else None
        if record is not None and kind is None and tx.dialect.lock_rows:
            # Only taking the lease writes, so only it needs the row locked: replays,
            # refusals and waits are answered from the committed row, without a row lock
            # (and, in PostgreSQL, without the WAL flush a lock's commit would cost).
            record = find(tx, True)
            kind = verdict(record) if record is not None else None
        if record is None:
            return None
        if kind is not None:
            return Claim(kind, record)
        return self._take(tx, record, owner, now, lease_seconds, stale_owner)

    @staticmethod
    def _create(tx: Tx, draft: IntentDraft, owner: str, now: float, lease_seconds: float) -> bool:
        inserted = tx.execute(
            sql.INSERT_INTENT,
            (
                draft.key,
                draft.scope,
                draft.reference,
                draft.account,
                draft.provider,
                draft.method,
                draft.url,
                draft.fingerprint,
                sql.headers_to_json(draft.request_headers),
                draft.body,
                IntentState.PENDING.value,
                now,
                now,
                now,
                owner,
                now + lease_seconds,
            ),
        )
        if inserted != 1:
            return False
        tx.execute(sql.INSERT_ATTEMPT, (draft.key, 1, now))
        return True

    def _take(
        self,
        tx: Tx,
        record: IntentRecord,
        owner: str,
        now: float,
        lease_seconds: float,
        stale_owner: str | None,
    ) -> Claim:
        """Take the lease of a row this transaction holds and found free to take."""
        tx.execute(
            sql.TAKE_LEASE,
            (owner, now + lease_seconds, now, record.key, owner, now, stale_owner),
        )
        claimed = self._reread(tx, record.key)
        if claimed.lease_owner != owner:
            return Claim(ClaimKind.LEASED, claimed)
        return Claim(ClaimKind.CLAIMED, claimed)

    def claim_key(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        unknown: bool = False,
        stale_owner: str | None = None,
    ) -> Claim | None:
        def find(tx: Tx, lock: bool) -> IntentRecord | None:
            return self._select(tx, sql.BY_KEY, (key,), lock=lock)

        return self._write(
            lambda tx: self._claim_row(
                tx, find, None, owner, now, lease_seconds, unknown, stale_owner
            ),
            durable=True,
            busy=BEFORE_SEND,
        )

    def claim_next_pending(
        self,
        *,
        account: str,
        provider: str,
        owner: str,
        now: float,
        lease_seconds: float,
        after: tuple[float, str] | None = None,
        is_stale: Callable[[str], bool] | None = None,
    ) -> Claim | None:
        """Lease the oldest pending intent no live worker holds, after ``after``.

        ``after`` is the ``(created_at, key)`` of the intent a queue pass handled last, so
        one pass meets every intent at most once, even those it leaves pending. A lease
        held by an owner ``is_stale`` judges dead counts as free. Rows another worker is
        claiming right now are skipped, not waited for (PostgreSQL ``SKIP LOCKED``).
        """

        def work(tx: Tx) -> Claim | None:
            created_at, key = after if after is not None else (float("-inf"), "")
            while True:
                rows = tx.all(
                    sql.NEXT_PENDING + tx.dialect.skip_locked,
                    (
                        IntentState.PENDING.value,
                        account,
                        provider,
                        created_at,
                        created_at,
                        key,
                        _QUEUE_BATCH,
                    ),
                )
                for row in rows:
                    record = sql.intent_from_row(row)
                    stale = (
                        record.lease_owner
                        if record.lease_owner is not None
                        and is_stale is not None
                        and is_stale(record.lease_owner)
                        else None
                    )
                    # The row is locked already (or the whole journal is, in SQLite).
                    kind = sql.decide_claim(
                        record, owner=owner, now=now, unknown=False, stale_owner=stale
                    )
                    if kind is None:
                        return self._take(tx, record, owner, now, lease_seconds, stale)
                if len(rows) < _QUEUE_BATCH:
                    return None
                last = sql.intent_from_row(rows[-1])
                created_at, key = last.created_at, last.key

        return self._write(work, durable=True, busy=BEFORE_SEND)

    def renew_lease(self, key: str, *, owner: str, now: float, lease_seconds: float) -> bool:
        return self._write(
            lambda tx: tx.execute(sql.RENEW_LEASE, (now + lease_seconds, key, owner)) == 1,
            durable=False,
            busy=AFTER_SEND,
        )

    def start_attempt(self, key: str, *, owner: str, now: float, lease_seconds: float) -> int:
        def work(tx: Tx) -> int:
            self._held_by(tx, key, owner)
            row = tx.one(sql.LAST_ATTEMPT, (key,))
            number = int(row[0] if row else 0) + 1
            tx.execute(sql.INSERT_ATTEMPT, (key, number, now))
            tx.execute(sql.ATTEMPT_STARTED, (now, now + lease_seconds, now, key))
            return number

        return self._write(work, durable=True, busy=BEFORE_SEND)

    @staticmethod
    def _end_attempt(
        tx: Tx,
        key: str,
        number: int,
        now: float,
        status_code: int | None,
        error: str | None,
        ambiguous: bool,
    ) -> None:
        tx.execute(sql.END_ATTEMPT, (now, status_code, error, int(ambiguous), key, number))

    def end_attempt(
        self,
        key: str,
        number: int,
        *,
        owner: str,
        now: float,
        status_code: int | None,
        error: str | None,
        ambiguous: bool,
    ) -> None:
        def work(tx: Tx) -> None:
            self._held_by(tx, key, owner)
            self._end_attempt(tx, key, number, now, status_code, error, ambiguous)

        self._write(work, durable=False, busy=AFTER_SEND)

    @staticmethod
    def _store_response(tx: Tx, key: str, response: StoredResponse) -> None:
        tx.execute(sql.STORE_RESPONSE, (*_response_values(response), key))

    def settle(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        state: IntentState,
        response: StoredResponse,
        attempt: int,
    ) -> IntentRecord:
        def work(tx: Tx) -> IntentRecord:
            held = self._held_by(tx, key, owner)
            self._end_attempt(tx, key, attempt, now, response.status, None, False)
            tx.execute(
                sql.SETTLE_WITH_RESPONSE,
                (*_response_values(response), state.value, now, key),
            )
            crash_point("during_settle")
            # The row as these statements left it, without reading it back: the lease was
            # held, so no one else wrote it in between.
            return attrs.evolve(
                held,
                state=state,
                updated_at=now,
                lease_owner=None,
                lease_expires_at=None,
                unknown_reason=None,
                response=attrs.evolve(
                    response,
                    headers=tuple((str(n), str(v)) for n, v in response.headers),
                    body=bytes(response.body),
                    stored_by=__version__,
                    schema_version=SCHEMA_VERSION,
                ),
            )

        return self._write(work, durable=False, busy=AFTER_SEND)

    def mark_unknown(self, key: str, *, owner: str, now: float, reason: str) -> IntentRecord:
        def work(tx: Tx) -> IntentRecord:
            self._held_by(tx, key, owner)
            tx.execute(sql.SET_STATE, (IntentState.UNKNOWN.value, reason, now, key))
            return self._reread(tx, key)

        return self._write(work, durable=False, busy=AFTER_SEND)

    def release(self, key: str, *, owner: str) -> None:
        self._write(
            lambda tx: tx.execute(sql.RELEASE_LEASE, (key, owner)),
            durable=False,
            busy=AFTER_SEND,
        )

    def reconciled(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        outcome: str,
        detail: str,
        status_code: int | None,
        state: IntentState,
        response: StoredResponse | None = None,
    ) -> IntentRecord:
        def work(tx: Tx) -> IntentRecord:
            self._held_by(tx, key, owner)
            tx.execute(sql.INSERT_RECONCILIATION, (key, now, outcome, detail, status_code))
            if response is not None:
                self._store_response(tx, key, response)
            reason = detail if state is IntentState.UNKNOWN else None
            tx.execute(sql.SET_STATE, (state.value, reason, now, key))
            return self._reread(tx, key)

        return self._write(work, durable=False, busy=AFTER_SEND)

    def reconciliations(self, key: str) -> list[ReconciliationRecord]:
        rows = self._read(lambda tx: tx.all(sql.RECONCILIATIONS + tx.dialect.tiebreak, (key,)))
        return [sql.reconciliation_from_row(row) for row in rows]

    def abandon(self, key: str, *, reason: str, now: float) -> IntentRecord:
        def work(tx: Tx) -> IntentRecord:
            record = self._existing(tx, key)
            if record.state.is_final:
                raise IntentStateError(
                    f"intent {key} is already {record.state.value}; only pending or unknown "
                    "intents can be abandoned",
                    key=key,
                    reference=record.reference,
                )
            if record.lease_live(now):
                raise IntentInFlight(
                    f"intent {key} is being sent by {record.lease_owner} right now; abandon "
                    "it once that attempt has ended",
                    key=key,
                    reference=record.reference,
                )
            tx.execute(sql.ABANDON, (IntentState.ABANDONED.value, reason, now, key))
            return self._reread(tx, key)

        # Durable: an abandonment rolled back by an OS crash would let resume() send an
        # intent the operator closed (and perhaps paid again under a new reference).
        return self._write(work, durable=True, busy=NO_SEND)

    def acknowledge(self, key: str, *, now: float) -> IntentRecord:
        def work(tx: Tx) -> IntentRecord:
            record = self._existing(tx, key)
            if not record.state.is_final:
                raise IntentStateError(
                    f"intent {key} is {record.state.value}: only a settled intent can be "
                    "acknowledged",
                    key=key,
                    reference=record.reference,
                )
            if record.acknowledged_at is not None:
                return record  # acknowledged once: the first time stands
            tx.execute(sql.ACKNOWLEDGE, (now, key))
            return attrs.evolve(record, acknowledged_at=now)

        return self._write(work, durable=False, busy=NO_SEND)

    # -- reading ---------------------------------------------------------------------------

    def _intents(self, statement: str, params: Sequence[Any]) -> list[IntentRecord]:
        rows = self._read(lambda tx: tx.all(statement, params))
        return [sql.intent_from_row(row) for row in rows]

    def pending(
        self, *, account: str, provider: str, limit: int | None = None
    ) -> list[IntentRecord]:
        """Pending intents of this account and provider, oldest first, leased or not."""
        statement = sql.PENDING
        params: list[Any] = [IntentState.PENDING.value, account, provider]
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        return self._intents(statement, params)

    def unacknowledged(self, *, account: str | None = None) -> list[IntentRecord]:
        statement = sql.UNACKNOWLEDGED
        params: list[Any] = list(_SETTLED)
        if account is not None:
            statement += " AND account = ?"
            params.append(account)
        return self._intents(statement + " ORDER BY created_at, key", params)

    def get(self, key: str) -> IntentRecord | None:
        return self._read(lambda tx: self._select(tx, sql.BY_KEY, (key,)))

    def find(self, key_or_reference: str) -> list[IntentRecord]:
        return self._intents(sql.FIND, (key_or_reference, key_or_reference))

    def list_intents(
        self, *, states: Iterable[IntentState] | None = None, limit: int | None = None
    ) -> list[IntentRecord]:
        """Newest first."""
        statement = sql.LIST
        params: list[Any] = []
        if states is not None:
            wanted = [IntentState(s).value for s in states]
            if not wanted:
                return []
            statement += f" WHERE state IN ({', '.join('?' for _ in wanted)})"
            params.extend(wanted)
        statement += " ORDER BY created_at DESC, key DESC"
        if limit is not None:
            statement += " LIMIT ?"
            params.append(limit)
        return self._intents(statement, params)

    def attempts(self, key: str) -> list[AttemptRecord]:
        rows = self._read(lambda tx: tx.all(sql.ATTEMPTS, (key,)))
        return [sql.attempt_from_row(row) for row in rows]

    # -- pruning ----------------------------------------------------------------------------

    def prune(
        self,
        *,
        older_than: float,
        batch_size: int = 1000,
        dry_run: bool = False,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Delete final intents nothing has touched since ``older_than`` (a timestamp).

        Only succeeded and failed intents the caller has acknowledged, and abandoned ones
        (they have no outcome to hand over), with their attempts and reconciliations.
        Pending and unknown intents, and unacknowledged outcomes, are never pruned. Runs
        in batches of ``batch_size``, each its own short transaction, so writers wait for
        one batch at most; ``on_batch`` gets the running total after each. Returns how
        many intents were deleted (with ``dry_run``: would be, and nothing is deleted).

        A pruned intent is forgotten: the same reference used again is a new intent with
        a new key. Keep the cut-off well beyond any retry of a business operation.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        params = (*sql.PRUNABLE_STATES, older_than, IntentState.ABANDONED.value, older_than)
        if dry_run:
            row = self._read(lambda tx: tx.one(sql.COUNT_PRUNABLE, params))
            return int(row[0]) if row else 0

        def batch(tx: Tx) -> int:
            statement = sql.PRUNE_BATCH.format(skip_locked=tx.dialect.skip_locked)
            return tx.execute(statement, (*params, batch_size))

        total = 0
        while True:
            busy = (
                f"{total} intent(s) were pruned before it; prune again to go on"
                if total
                else NO_SEND
            )
            began = time.monotonic()
            deleted = self._write(batch, durable=False, busy=busy)
            if deleted <= 0:
                return total
            total += deleted
            if on_batch is not None:
                on_batch(total)
            self._between_batches(time.monotonic() - began)

    def _between_batches(self, seconds: float) -> None:
        """After a prune batch that held the journal ``seconds``: let writers in."""

    # -- operating --------------------------------------------------------------------------

    def _missing_parts(self, tx: Tx) -> list[str]:
        """What the statements need and the journal lacks (nothing, for an intact one)."""
        problems = []
        for table, needed in sql.needed_columns().items():
            present = self._present_columns(tx, table)
            if not present:
                problems.append(f"table {table} is missing")
            elif missing := [c for c in needed if c not in present]:
                problems.append(f"table {table} lacks column(s) {', '.join(missing)}")
        problems += [
            f"index {index} is missing"
            for index in sql.NEEDED_INDEXES
            if tx.one(tx.dialect.has_relation, (index,)) is None
        ]
        return problems

    def _verify(self, tx: Tx) -> None:
        """Refuse a journal whose schema version promises parts it does not have."""
        if problems := self._missing_parts(tx):
            raise self._error(
                f"the journal is damaged ({'; '.join(problems[:3])}); restore it from a "
                "backup or move it away to start a new one"
            )

    def check(self) -> JournalReport:
        """Integrity, schema and contents, read at one instant (writers are not blocked)."""

        def work(tx: Tx) -> JournalReport:
            problems = [p for p in self._storage_problems(tx) if p != "ok"]
            problems += self._missing_parts(tx)
            if problems:
                # Counting rows of a journal with missing parts would only fail again.
                meta: dict[str, str] = {}
                by_state: dict[str, int] = {}
                unacknowledged = 0
            else:
                meta = dict(tx.all(sql.META))
                by_state = {str(s): int(n) for s, n in tx.all(sql.COUNT_BY_STATE)}
                row = tx.one(sql.COUNT_UNACKNOWLEDGED, _SETTLED)
                unacknowledged = int(row[0]) if row else 0
            try:
                version = int(meta.get("schema_version", 0))
            except ValueError:
                version = 0
                problems.append(f"schema version {meta.get('schema_version')!r} is not a number")
            return JournalReport(
                location=self.location,
                ok=not problems,
                problems=tuple(problems),
                schema_version=version,
                intents_by_state=by_state,
                unacknowledged=unacknowledged,
                size_bytes=self._size_bytes(tx),
            )

        return self._read(work, snapshot=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
