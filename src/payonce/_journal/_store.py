"""``IntentStore``: the writes payonce's own clients make to intents (claims, leases,
attempts, outcomes), applied in the transactions of the engine it holds.

The store is private: a user's code reads and operates a journal as ``Journal`` (``_reads``),
which holds the same engine and none of these writes, so that no one settles an intent
behind a lease's back. A client opens (or is given) a ``Journal`` and builds its store on
that journal's engine.

Nothing is decided here. What a claim amounts to is ``_lifecycle.decide_claim``'s answer
(the owner liveness it asks about is ``payonce._owners``' unless the caller passes its own);
every other write applies a named ``Transition`` the caller chose, and the transition
table says from which state it may start, where it leads and whether the lease goes with
it. Each write is applied atomically, in one transaction of the backend's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from .._crash import crash_point
from .._lifecycle import (
    BootReading,
    Claim,
    ClaimKind,
    IntentDraft,
    IntentRecord,
    IntentState,
    StoredResponse,
    Transition,
    Unwritten,
    decide_claim,
    is_mismatch,
    rule,
    target,
)
from .._owners import owner_is_dead
from ..errors import IntentInFlight
from . import _sql as sql
from ._engine import AFTER_SEND, BEFORE_SEND, NO_SEND, Engine, Tx
from ._held import HeldRecords, created_record, settled_record
from ._intents import allowed, reread, select_intent
from ._plans import (
    AsyncEdge,
    Call,
    Plan,
    Work,
    Write,
    all_rows,
    commit_with,
    execute,
    one,
    selected,
    send,
)
from ._reports import JournalCommitted
from ._rows import (
    INTENT_FIELDS,
    DamagedRow,
    UndecodableRow,
    intent_from_row,
    response_values,
    write_ahead_values,
)

__all__ = ["IntentStore"]

T = TypeVar("T")
P = ParamSpec("P")

_CLAIM_ROUNDS = 3
_QUEUE_BATCH = 32
_CREATED_AT = INTENT_FIELDS.index("created_at")


class _Found(Generic[T]):
    """A write and how to tell, after a commit whose outcome is unknown (the connection
    lost during ``COMMIT``, a failover), whether it was recorded: its ``Write``'s
    ``recover`` (see ``Engine.write_planned``). ``committed(result)`` reads whether what
    ``work`` returned was committed; ``found()``, for a write that commits itself
    (``commit_with``: on PostgreSQL one statement, its own transaction or the last of a
    pipeline) and was lost before it returned, reads back what it would have returned.
    None from either runs ``work`` again; without ``found``, a ``work`` that never returned
    had not reached its commit and simply runs again.

    What each write's unknown commit means (docs/postgres.md, "When the connection drops"):
    the write-ahead and an attempt's start are looked for on the new connection and found
    durable before anything is sent; a settle and an intent marked unknown are looked for
    and, if lost, written again under the lease this worker still holds; lease writes are
    idempotent and simply run again (``_run_again``). The writes of a dialect that does not
    chain them (SQLite's) need none of this: SQLite knows every commit's outcome."""

    __slots__ = ("_committed", "_done", "_found", "_result", "_work")

    def __init__(
        self,
        work: Callable[[], Work[T]],
        found: Callable[[], Work[T | None]] | None,
        committed: Callable[[T], Work[bool]] | None = None,
    ) -> None:
        self._work = work
        self._found = found
        self._committed = committed
        self._done = False
        self._result: T | None = None

    def work(self) -> Work[T]:
        self._done = False
        result = yield from self._work()
        self._result, self._done = result, True
        return result

    def recover(self) -> Work[T | None]:
        if not self._done:
            # Lost inside ``work``: its own commit was on its way, or it never reached one.
            return (yield from self._found()) if self._found is not None else None
        if self._committed is None:
            return None  # idempotent: run it again
        result: T = self._result  # type: ignore[assignment]  # set with _done
        return result if (yield from self._committed(result)) else None

    def write(self, *, durable: bool, busy: Unwritten) -> Write[T]:
        return Write(self.work, durable, busy, self.recover)


def _run_again() -> Work[None]:
    """The recovery of an idempotent write: it simply runs again."""
    return None
    yield  # a generator, of no statement


class _Planned(Generic[P, T]):
    """A store write written once as a plan (``_plans``): ``store.settle(...)`` carries it
    out in the caller's thread, ``store.settle.plan(...)`` is the plan, for an engine's
    async edge."""

    __slots__ = ("_plan",)

    def __init__(self, plan: Callable[Concatenate[IntentStore, P], Plan[T]]) -> None:
        self._plan = plan

    def __get__(self, store: IntentStore, owner: type[IntentStore] | None = None) -> _Bound[P, T]:
        return _Bound(store, self._plan)


class _Bound(Generic[P, T]):
    __slots__ = ("_plan", "_store")

    def __init__(
        self, store: IntentStore, plan: Callable[Concatenate[IntentStore, P], Plan[T]]
    ) -> None:
        self._store = store
        self._plan = plan

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._store._engine.carry_out(self._plan(self._store, *args, **kwargs))

    def plan(self, *args: P.args, **kwargs: P.kwargs) -> Plan[T]:
        return self._plan(self._store, *args, **kwargs)


def _boot_values(boot: BootReading | None) -> tuple[str | None, float | None]:
    """An attempt's ``boot`` and ``boottime`` columns."""
    if boot is None:
        return None, None
    return f"{boot.host}/{boot.boot_id}", boot.seconds


class IntentStore:
    """Every write of payonce's clients to an intent, on any backend's engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._kept: HeldRecords | None = None
        """The records this store's claims created, for their settles (see ``_held``)."""

    @property
    def location(self) -> str:
        return self._engine.location

    def carry_out(self, plan: Plan[T]) -> T:
        """Carry out a plan of this store's writes in this thread (``Engine.carry_out``)."""
        return self._engine.carry_out(plan)

    def async_edge(self) -> AsyncEdge | None:
        """The engine's writes on the running event loop, if it has them there."""
        return self._engine.async_edge()

    def escalate(
        self, key: str, *, unknown_since: float, now: float, tries: int, reason: str
    ) -> bool:
        """Journal the escalation of the unknown intent ``key`` for the time it went unknown
        at ``unknown_since``: True if this call did, False if it was escalated for that
        time already (by this process before a restart, or by another worker) or is no
        longer unknown. Only the caller that gets True says it."""
        values = (unknown_since, now, tries, reason, key, IntentState.UNKNOWN.value)
        return self._engine.write(
            lambda tx: tx.execute(sql.ESCALATE, values) == 1, durable=False, busy=NO_SEND
        )

    def acknowledge_later(self, key: str, *, now: float) -> None:
        """Acknowledge the settled intent ``key`` with the engine's next write (``_acks``):
        what leaving a block normally does, at no transaction of its own."""
        self._engine.acknowledge_later(key, now=now)

    def watch_commits(self, watcher: Callable[[JournalCommitted], None]) -> None:
        """Tell ``watcher`` of every write transaction the engine commits from now on (this
        store's, and any other's on the same engine)."""
        self._engine.watch_commits(watcher)

    def unwatch_commits(self, watcher: Callable[[JournalCommitted], None]) -> None:
        self._engine.unwatch_commits(watcher)

    def _keep(self, claim: Claim) -> Claim:
        if claim.kind is ClaimKind.CREATED:
            if self._kept is None:
                # Two threads racing here may each make one: a record kept in the lost
                # one only makes its settle read its row.
                self._kept = HeldRecords()
            self._kept.keep(claim.record)
        return claim

    def _held_by(self, tx: Tx, key: str, owner: str) -> IntentRecord:
        if self._kept is not None:
            self._kept.forget(key)  # written by other than its settle: read from now on
        record = select_intent(tx, sql.BY_KEY, (key,), lock=True)
        if record is None or record.lease_owner != owner:
            raise _not_held(key, record)
        return record

    def _chained(
        self,
        key: str,
        owner: str,
        transition: Transition,
        statement: str,
        params: Sequence[Any],
        *,
        durable: bool,
        found: Callable[[], Work[tuple[Any, IntentRecord] | None]] | None = None,
    ) -> Plan[tuple[Any, IntentRecord]]:
        """Apply a held intent's writes chained in one statement (``sql.*_HELD``, where
        ``Dialect.chains_writes``): one round trip. The answer's first column and the
        intent's row; refused as ``_held_by`` and ``allowed`` refuse when they did not
        apply (then nothing was written). ``found``: after a commit whose outcome is
        unknown, that answer read back if the write was committed, or None to run it again
        (see ``_Found``); without it, such a write raises ``JournalError``."""
        if self._kept is not None:
            self._kept.forget(key)
        applied = rule(transition)
        sources = [state.value for state in applied.sources if state is not None]

        def work() -> Work[tuple[Any, IntentRecord | None]]:
            finished = yield from commit_with(statement, (key, owner, sources, *params, key))
            rows = finished.rows
            # Decoded here, where a damaged row is reported as the journal's damage.
            return (rows[0][0], intent_from_row(rows[0][1:])) if rows else (None, None)

        if found is None:
            write = Write(work, durable, applied.unwritten)
        else:
            write = _Found(work, found).write(durable=durable, busy=applied.unwritten)
        first, record = yield write
        if record is None or first in (None, False):
            if record is not None and record.lease_owner == owner:
                allowed(record, transition)  # raises, worded for the state it is in
            # Not held, or its lease changed hands between the read and the lock.
            raise _not_held(key, record)
        return first, record

    def _chained_ending_lease(
        self,
        key: str,
        owner: str,
        transition: Transition,
        statement: str,
        params: Sequence[Any],
    ) -> Plan[IntentRecord]:
        """A chained write that ends this owner's lease (a settle, marking it unknown),
        found committed after an unknown commit as ``_released_in`` tells."""
        to = _state_after(transition)

        def found() -> Work[tuple[Any, IntentRecord] | None]:
            return _applied((yield from self._released_in(key, owner, to)))

        _, record = yield from self._chained(
            key, owner, transition, statement, params, durable=False, found=found
        )
        return record

    def _released_in(self, key: str, owner: str, state: str | None) -> Work[IntentRecord | None]:
        """The intent, if a write of this owner's that ends its lease (a settle, marking it
        unknown) was committed: the lease is no longer this owner's, and the intent is in
        ``state`` (None: any). While the owner held it, no one else could have written it."""
        record = yield from selected(self._engine.dialect, sql.BY_KEY, (key,), lock=True)
        if record is None or record.lease_owner == owner:
            return None
        if state is not None and record.state.value != state:
            return None
        return record

    def _attempt_started_at(
        self, key: str, owner: str, now: float
    ) -> Work[tuple[int, IntentRecord] | None]:
        """The attempt this owner started at ``now``, and the intent, if it was committed.
        Only the lease's holder adds attempts: it is there, or not."""
        record = yield from selected(self._engine.dialect, sql.BY_KEY, (key,), lock=True)
        if record is None or record.lease_owner != owner:
            return None  # run again, it is refused as no longer held
        row = yield from one(sql.ATTEMPT_STARTED_AT, (key, now))
        return (int(row[0]), record) if row is not None else None

    def _apply(
        self, tx: Tx, key: str, owner: str, transition: Transition
    ) -> tuple[IntentRecord, IntentState]:
        """The held intent and the state ``transition`` takes it to; refused when the
        transition may not start from the intent's state."""
        record = self._held_by(tx, key, owner)
        return record, allowed(record, transition)

    @_Planned
    def claim(
        self,
        draft: IntentDraft,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        is_stale: Callable[[str], bool] = owner_is_dead,
        sent_to: str | None = None,
        boot: BootReading | None = None,
    ) -> Plan[Claim]:
        """Create the intent ``draft`` describes with its first attempt, or take (or find
        held) the one already journaled. ``sent_to``: where attempt 1 of a created intent
        is sent (the URL without userinfo); ``boot``: this host's boot clock as it starts
        (``BootReading``)."""
        started = (sent_to, *_boot_values(boot))

        dialect = self._engine.dialect

        def find(lock: bool) -> Work[IntentRecord | None]:
            record = None
            if draft.reference is not None:
                where = (*draft.identity, draft.reference)
                record = yield from selected(dialect, sql.BY_REFERENCE, where, lock=lock)
            return record or (yield from selected(dialect, sql.BY_KEY, (draft.key,), lock=lock))

        def created() -> Claim:
            return Claim(
                ClaimKind.CREATED,
                created_record(draft, owner, now, lease_seconds),
                attempt_number=1,
            )

        def work() -> Work[Claim]:
            if not dialect.lock_rows and (
                yield from self._create(draft, owner, now, lease_seconds, started)
            ):
                # Writers are serialised (SQLite holds the whole journal), so an insert the
                # unique key and (provider, account, reference) let through is exactly a
                # look-up that found nothing: a new intent costs no look-ups. Any other
                # answer needs them.
                return created()
            for _ in range(_CLAIM_ROUNDS):
                claim = yield from self._claim_row(
                    find, draft, owner, now, lease_seconds, False, is_stale
                )
                if claim is not None:
                    return claim
                if (yield from self._create(draft, owner, now, lease_seconds, started)):
                    return created()
                # Another worker created it between the look-up and the insert, and has
                # committed: the next look-up finds its row.
            raise self._engine.error(
                f"intent {draft.key}: its row kept appearing and disappearing under "
                "concurrent writers; nothing was sent. Retry later"
            )

        def committed(claim: Claim) -> Work[bool]:
            if claim.kind is not ClaimKind.CREATED:
                return False  # a lease taken or a verdict: deciding again is the same
            return by_this_claim(
                (yield from selected(dialect, sql.BY_KEY, (draft.key,), lock=True))
            )

        def by_this_claim(found: IntentRecord | None) -> bool:
            return found is not None and found.lease_owner == owner and found.created_at == now

        def create_in_one() -> Work[tuple[bool, IntentRecord | None]]:
            found = (draft.key, *draft.identity, draft.reference, *draft.identity, draft.reference)
            values = (*self._intent_values(draft, owner, now, lease_seconds), now, *started)
            finished = yield from commit_with(sql.CREATE_INTENT, (*values, *found))
            made, *existing = finished.rows[0]
            # Decoded here, where a damaged row is reported as the journal's damage.
            return bool(made), intent_from_row(tuple(existing)) if existing[0] else None

        def created_in_one() -> Work[tuple[bool, IntentRecord | None] | None]:
            # Lost with its commit on its way: this claim's own row, or run it again (it
            # then finds whatever another worker committed meanwhile).
            mine = yield from selected(dialect, sql.BY_KEY, (draft.key,), lock=True)
            return (True, None) if by_this_claim(mine) else None

        unwritten = rule(Transition.WRITE_AHEAD).unwritten
        # A reference's key is the one journaled first: the draft's may not be it.
        if draft.reference is not None:
            unwritten = unwritten.for_reference(draft.reference)
        else:
            unwritten = unwritten.for_intent(draft.key)
        if self._engine.dialect.chains_writes:
            # A new intent, the common case, is one statement: one round trip to the
            # server. So is a replay, a refusal or a wait answered from the committed row
            # it finds instead; a lease to take is taken below, with the row locked.
            made, record = yield _Found(create_in_one, created_in_one).write(
                durable=True, busy=unwritten
            )
            if made:
                return self._keep(created())
            if record is not None:
                kind = _verdict(
                    record,
                    draft,
                    owner=owner,
                    is_stale=is_stale,
                    now=now,
                    unknown=False,
                    lease_seconds=lease_seconds,
                )
                if kind is not None:
                    return Claim(kind, record)
        claimed: Claim = yield _Found(work, None, committed).write(durable=True, busy=unwritten)
        return self._keep(claimed)

    def _call(self, work: Callable[[Tx], T], *, durable: bool, busy: Unwritten) -> Call[T]:
        """A write of a plan that has no ``Write`` form (it runs only on SQLite, whose
        commits' outcomes are always known): run through ``Engine.write``, in a journal
        thread on a loop."""
        return Call(lambda: self._engine.write(work, durable=durable, busy=busy))

    def _claim_row(
        self,
        find: Callable[[bool], Work[IntentRecord | None]],
        draft: IntentDraft | None,
        owner: str,
        now: float,
        lease_seconds: float,
        unknown: bool,
        is_stale: Callable[[str], bool],
    ) -> Work[Claim | None]:
        """Ask ``decide_claim`` about the intent ``find`` returns, and take its lease if it
        may be taken."""

        def verdict(record: IntentRecord) -> ClaimKind | None:
            return _verdict(
                record,
                draft,
                owner=owner,
                is_stale=is_stale,
                now=now,
                unknown=unknown,
                lease_seconds=lease_seconds,
            )

        record = yield from find(False)
        kind = verdict(record) if record is not None else None
        if record is not None and kind is None and self._engine.dialect.lock_rows:
            # Only taking the lease writes, so only it needs the row locked: replays,
            # refusals and waits are answered from the committed row, without a row lock
            # (and, in PostgreSQL, without the WAL flush a lock's commit would cost).
            record = yield from find(True)
            kind = verdict(record) if record is not None else None
        if record is None:
            return None
        if kind is not None:
            return Claim(kind, record)
        return (yield from self._take(record, owner, now, lease_seconds))

    @staticmethod
    def _intent_values(
        draft: IntentDraft, owner: str, now: float, lease_seconds: float
    ) -> tuple[object, ...]:
        """INSERT_INTENT's parameters: the write-ahead of a claim about to send it."""
        return write_ahead_values(
            draft, now, first_sent_at=now, owner=owner, lease_expires_at=now + lease_seconds
        )

    @classmethod
    def _create(
        cls,
        draft: IntentDraft,
        owner: str,
        now: float,
        lease_seconds: float,
        started: tuple[str | None, str | None, float | None],
    ) -> Work[bool]:
        """``started``: attempt 1's URL and boot clock (``INSERT_ATTEMPT``'s last values)."""
        inserted = yield from execute(
            sql.INSERT_INTENT, cls._intent_values(draft, owner, now, lease_seconds)
        )
        if inserted != 1:
            return False
        yield from send(sql.INSERT_ATTEMPT, (draft.key, 1, now, *started))
        return True

    def _take(
        self, record: IntentRecord, owner: str, now: float, lease_seconds: float
    ) -> Work[Claim]:
        """Take the lease of a row this transaction holds and found free to take.

        The update repeats the test atomically: it takes the lease only if the row still
        has the holder it was judged on (or none, or an expired one)."""
        yield from send(
            sql.TAKE_LEASE,
            (owner, now + lease_seconds, now, record.key, owner, now, record.lease_owner),
        )
        claimed = yield from selected(self._engine.dialect, sql.BY_KEY, (record.key,))
        assert claimed is not None, "a row this transaction holds cannot vanish"
        if claimed.lease_owner != owner:
            return Claim(ClaimKind.LEASED, claimed)
        return Claim(ClaimKind.CLAIMED, claimed)

    @_Planned
    def claim_key(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        unknown: bool = False,
        is_stale: Callable[[str], bool] = owner_is_dead,
    ) -> Plan[Claim | None]:
        dialect = self._engine.dialect

        def find(lock: bool) -> Work[IntentRecord | None]:
            return (yield from selected(dialect, sql.BY_KEY, (key,), lock=lock))

        def work() -> Work[Claim | None]:
            return (
                yield from self._claim_row(find, None, owner, now, lease_seconds, unknown, is_stale)
            )

        # Idempotent: run again, it decides the same.
        claim: Claim | None = yield Write(work, True, BEFORE_SEND.for_intent(key), _run_again)
        return claim

    @_Planned
    def claim_next_pending(
        self,
        *,
        account: str,
        provider: str,
        owner: str,
        now: float,
        lease_seconds: float,
        after: tuple[Any, str] | None = None,
        is_stale: Callable[[str], bool] = owner_is_dead,
    ) -> Plan[Claim | DamagedRow | None]:
        """Lease the oldest pending intent no live worker holds, after ``after``.

        ``after`` is the ``(created_at, key)`` of the intent a queue pass handled last, so
        one pass meets every intent at most once, even those it leaves pending. A lease
        held by an owner ``is_stale`` judges dead counts as free. Rows another worker is
        claiming right now are skipped, not waited for (PostgreSQL ``SKIP LOCKED``).

        A row met on the way that no longer decodes is returned as it is, ``DamagedRow``,
        leased by no one: the pass names it and goes on after it (its ``created_at`` as
        stored, whatever it holds, and its key), never sending it.
        """

        skip_locked = self._engine.dialect.skip_locked

        def work() -> Work[Claim | DamagedRow | None]:
            created_at, key = after if after is not None else (float("-inf"), "")
            while True:
                rows = yield from all_rows(
                    sql.NEXT_PENDING + skip_locked,
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
                    try:
                        record = intent_from_row(row)
                    except UndecodableRow as exc:
                        return exc.damaged
                    # The row is locked already (or the whole journal is, in SQLite).
                    verdict = decide_claim(
                        record, owner=owner, now=now, is_stale=is_stale, lease_seconds=lease_seconds
                    )
                    if verdict is None:
                        return (yield from self._take(record, owner, now, lease_seconds))
                if len(rows) < _QUEUE_BATCH:
                    return None
                # As stored: the query compares the column, not what a record makes of it.
                created_at, key = rows[-1][_CREATED_AT], rows[-1][0]

        # Run again, it leases the same intent: its own lease does not keep this owner out.
        claim: Claim | DamagedRow | None = yield Write(work, True, BEFORE_SEND, _run_again)
        return claim

    def renew_lease(self, key: str, *, owner: str, now: float, lease_seconds: float) -> bool:
        def work() -> Work[bool]:
            renewed = yield from commit_with(sql.RENEW_LEASE, (now + lease_seconds, key, owner))
            return bool(renewed.rowcount == 1)

        # Idempotent: run again whether or not it was committed.
        return self._engine.write_planned(Write(work, False, AFTER_SEND, _run_again))

    @_Planned
    def start_attempt(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        sent_to: str | None = None,
        boot: BootReading | None = None,
    ) -> Plan[int]:
        """Journal the next attempt of a held intent; ``sent_to``: where it is sent (the URL
        without userinfo); ``boot``: this host's boot clock as it starts."""
        values = (sent_to, *_boot_values(boot))
        if self._engine.dialect.chains_writes:
            writes = (now, *values, now, now + lease_seconds, now)
            number, _ = yield from self._chained(
                key,
                owner,
                Transition.ATTEMPT_STARTED,
                sql.START_ATTEMPT_HELD,
                writes,
                durable=True,
                found=lambda: self._attempt_started_at(key, owner, now),
            )
            return int(number)

        def work(tx: Tx) -> int:
            self._apply(tx, key, owner, Transition.ATTEMPT_STARTED)
            row = tx.one(sql.LAST_ATTEMPT, (key,))
            number = int(row[0] if row else 0) + 1
            tx.send(sql.INSERT_ATTEMPT, (key, number, now, *values))
            tx.send(sql.ATTEMPT_STARTED, (now, now + lease_seconds, now, key))
            return number

        started: int = yield self._call(
            work, durable=True, busy=rule(Transition.ATTEMPT_STARTED).unwritten
        )
        return started

    @staticmethod
    def _end_attempt(
        tx: Tx,
        key: str,
        number: int,
        now: float,
        status_code: int | None,
        error: str | None,
        ambiguous: bool,
        provider_date: float | None,
    ) -> None:
        tx.send(
            sql.END_ATTEMPT, (now, status_code, error, int(ambiguous), provider_date, key, number)
        )

    @_Planned
    def end_attempt(
        self,
        key: str,
        number: int,
        *,
        transition: Transition,
        owner: str,
        now: float,
        status_code: int | None,
        error: str | None,
        provider_date: float | None = None,
    ) -> Plan[None]:
        """``provider_date``: the provider's time in the attempt's answer (its ``Date``)."""
        applied = rule(transition)
        if applied.attempt_ambiguous is None:
            raise ValueError(f"'{transition.value}' does not end an attempt")
        ambiguous = applied.attempt_ambiguous
        if self._engine.dialect.chains_writes:
            ended = (now, status_code, error, int(ambiguous), provider_date, number)
            writes = (*ended, applied.releases_lease)
            yield from self._chained(
                key, owner, transition, sql.END_ATTEMPT_HELD, writes, durable=False
            )
            return

        def work(tx: Tx) -> None:
            self._apply(tx, key, owner, transition)
            self._end_attempt(tx, key, number, now, status_code, error, ambiguous, provider_date)
            if applied.releases_lease:
                tx.send(sql.RELEASE_LEASE, (key, owner))

        yield self._call(work, durable=False, busy=applied.unwritten)

    @staticmethod
    def _store_response(tx: Tx, key: str, response: StoredResponse) -> None:
        tx.send(sql.STORE_RESPONSE, (*response_values(response), key))

    @_Planned
    def settle(
        self,
        key: str,
        *,
        transition: Transition,
        owner: str,
        now: float,
        response: StoredResponse,
        attempt: int,
        acknowledge_success: bool = False,
        provider_date: float | None = None,
    ) -> Plan[IntentRecord]:
        """Settle a held intent from its answer; ``acknowledge_success`` acknowledges it in
        the same transaction when it succeeded (a caller that returns the answer at once).
        ``provider_date``: the provider's time in the answer (its ``Date``)."""

        def acknowledged(state: IntentState) -> float | None:
            return now if acknowledge_success and state is IntentState.SUCCEEDED else None

        def known(tx: Tx, held: IntentRecord, state: IntentState) -> IntentRecord | None:
            """Settle the row the claim created without reading it; None if the row is no
            longer that (the UPDATE matched nothing, and wrote nothing)."""
            values = (*response_values(response), state.value, now, acknowledged(state), key)
            guard = (owner, held.state.value, held.created_at)
            if tx.execute(sql.SETTLE_KNOWN, (*values, *guard)) != 1:
                return None
            self._end_attempt(tx, key, attempt, now, response.status, None, False, provider_date)
            crash_point("during_settle")
            return settled_record(held, state, now, acknowledged(state), response)

        def known_in_one(held: IntentRecord, state: IntentState) -> Work[IntentRecord | None]:
            """``known`` as one statement: one round trip to the server."""
            values = (*response_values(response), state.value, now, acknowledged(state), key)
            guard = (owner, held.state.value, held.created_at)
            ended = (now, response.status, provider_date, attempt)
            crash_point("during_settle")  # nothing of the settle has left yet
            statement = (
                sql.SETTLE_KNOWN_ENDING_ATTEMPT_SYNCHRONOUSLY
                if self._engine.settles_synchronously
                else sql.SETTLE_KNOWN_ENDING_ATTEMPT
            )
            finished = yield from commit_with(statement, (*values, *guard, *ended), whole=True)
            if finished.rows[0][0] != 1:
                return None
            return settled_record(held, state, now, acknowledged(state), response)

        def work(tx: Tx) -> IntentRecord:
            if kept is not None and kept.attempt_count == attempt:
                state = target(transition, kept.state)
                settled = known(tx, kept, state) if state is not None else None
                if settled is not None:
                    return settled
            held, state = self._apply(tx, key, owner, transition)
            self._end_attempt(tx, key, attempt, now, response.status, None, False, provider_date)
            tx.send(
                sql.SETTLE_WITH_RESPONSE,
                (*response_values(response), state.value, now, acknowledged(state), key),
            )
            crash_point("during_settle")
            return settled_record(held, state, now, acknowledged(state), response)

        # What the claim created, if this journal object did and nothing wrote it since.
        kept = self._kept.take(key, owner) if self._kept is not None else None
        busy = rule(transition).unwritten
        if not self._engine.dialect.chains_writes:
            done: IntentRecord = yield self._call(work, durable=False, busy=busy)
            return done

        if kept is not None and kept.attempt_count == attempt:
            state = target(transition, kept.state)
            if state is not None:
                held, settled_to = kept, state
                known_write = _Found(
                    lambda: known_in_one(held, settled_to),
                    lambda: self._released_in(key, owner, settled_to.value),
                )
                settled: IntentRecord | None = yield known_write.write(durable=False, busy=busy)
                if settled is not None:
                    return settled
        to = _state_after(transition)
        ended = (now, response.status, provider_date, attempt)
        succeeded = (to, IntentState.SUCCEEDED.value, now if acknowledge_success else None)
        writes = (*ended, *response_values(response), to, now, *succeeded)
        crash_point("during_settle")  # nothing of the settle has left yet
        return (
            yield from self._chained_ending_lease(key, owner, transition, sql.SETTLE_HELD, writes)
        )

    @_Planned
    def mark_unknown(
        self, key: str, *, transition: Transition, owner: str, now: float, reason: str
    ) -> Plan[IntentRecord]:
        if self._engine.dialect.chains_writes:
            writes = (_state_after(transition), reason, now)
            return (
                yield from self._chained_ending_lease(
                    key, owner, transition, sql.MARK_UNKNOWN_HELD, writes
                )
            )

        def work(tx: Tx) -> IntentRecord:
            _, state = self._apply(tx, key, owner, transition)
            tx.send(sql.SET_STATE, (state.value, reason, now, key))
            return reread(tx, key)

        busy = rule(transition).unwritten
        marked: IntentRecord = yield self._call(work, durable=False, busy=busy)
        return marked

    @_Planned
    def release(self, key: str, *, owner: str) -> Plan[None]:
        if self._kept is not None:
            self._kept.forget(key)
        # Idempotent: run again whether or not it was committed.
        yield Write(lambda: send(sql.RELEASE_LEASE, (key, owner)), False, AFTER_SEND, _run_again)

    @_Planned
    def rebind_credential(self, key: str, *, owner: str, credential: str | None) -> Plan[None]:
        """Journal the credential a claimed intent is sent with from now on: one none of
        whose attempts may have executed (a key refused with 401, then fixed), so no
        account at the provider holds anything under its key. Only the lease's holder."""
        if self._kept is not None:
            self._kept.forget(key)
        send_rebind = sql.REBIND_CREDENTIAL
        yield Write(
            lambda: send(send_rebind, (credential, key, owner)), True, BEFORE_SEND, _run_again
        )

    @_Planned
    def looked_up(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        outcome: str,
        detail: str,
        status_code: int | None,
    ) -> Plan[None]:
        """Journal a look-up made before a resend that settled nothing; the lease stays."""
        if self._engine.dialect.chains_writes:
            writes = (now, outcome, detail, status_code)
            yield from self._chained(
                key, owner, Transition.LOOKED_UP, sql.LOOKED_UP_HELD, writes, durable=False
            )
            return

        def work(tx: Tx) -> None:
            self._apply(tx, key, owner, Transition.LOOKED_UP)
            tx.send(sql.INSERT_RECONCILIATION, (key, now, outcome, detail, status_code))

        yield self._call(work, durable=False, busy=rule(Transition.LOOKED_UP).unwritten)

    @_Planned
    def reconciled(
        self,
        key: str,
        *,
        transition: Transition,
        owner: str,
        now: float,
        outcome: str,
        detail: str,
        status_code: int | None,
        response: StoredResponse | None = None,
    ) -> Plan[IntentRecord]:
        if self._engine.dialect.chains_writes:
            to = _state_after(transition)
            new_state = (to, to, IntentState.UNKNOWN.value, detail, now)
            noted = (now, outcome, detail, status_code)
            if response is None:
                statement, writes = sql.RECONCILED_HELD, (*noted, *new_state)
            else:
                statement = sql.RECONCILED_WITH_RESPONSE_HELD
                writes = (*noted, *response_values(response), *new_state)
            _, record = yield from self._chained(
                key, owner, transition, statement, writes, durable=False
            )
            return record

        def work(tx: Tx) -> IntentRecord:
            _, state = self._apply(tx, key, owner, transition)
            tx.send(sql.INSERT_RECONCILIATION, (key, now, outcome, detail, status_code))
            if response is not None:
                self._store_response(tx, key, response)
            reason = detail if state is IntentState.UNKNOWN else None
            tx.send(sql.SET_STATE, (state.value, reason, now, key))
            return reread(tx, key)

        reconciled: IntentRecord = yield self._call(
            work, durable=False, busy=rule(transition).unwritten
        )
        return reconciled


def _not_held(key: str, record: IntentRecord | None) -> IntentInFlight:
    return IntentInFlight(
        f"intent {key} is no longer held by this worker (its lease expired and "
        "another worker took it over); its outcome will be settled by that worker",
        key=key,
        reference=record.reference if record else None,
    )


def _applied(record: IntentRecord | None) -> tuple[bool, IntentRecord] | None:
    """A chained write's answer (applied, the intent), for one found committed."""
    return (True, record) if record is not None else None


def _state_after(transition: Transition) -> str | None:
    """Where ``transition`` leads, or None where it keeps the state it starts from."""
    to = rule(transition).to
    return to.value if to is not None else None


def _verdict(
    record: IntentRecord,
    draft: IntentDraft | None,
    *,
    owner: str,
    is_stale: Callable[[str], bool],
    now: float,
    unknown: bool,
    lease_seconds: float,
) -> ClaimKind | None:
    """What a claim of ``record`` amounts to (``decide_claim``'s answer, or a mismatch
    with ``draft``); None: its lease may be taken."""
    if draft is not None and is_mismatch(record, draft):
        return ClaimKind.MISMATCH
    return decide_claim(
        record,
        owner=owner,
        now=now,
        unknown=unknown,
        is_stale=is_stale,
        lease_seconds=lease_seconds,
    )
