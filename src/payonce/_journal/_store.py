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
from typing import Any

from .._crash import crash_point
from .._lifecycle import (
    Claim,
    ClaimKind,
    IntentDraft,
    IntentRecord,
    IntentState,
    StoredResponse,
    Transition,
    decide_claim,
    is_mismatch,
    rule,
    target,
)
from .._owners import owner_is_dead
from ..errors import IntentInFlight
from . import _sql as sql
from ._engine import AFTER_SEND, BEFORE_SEND, Engine, Tx
from ._held import HeldRecords, created_record, settled_record
from ._intents import allowed, reread, select_intent
from ._reports import JournalCommitted
from ._rows import headers_to_json, intent_from_row, response_values

__all__ = ["IntentStore"]

_CLAIM_ROUNDS = 3
_QUEUE_BATCH = 32


class IntentStore:
    """Every write of payonce's clients to an intent, on any backend's engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._kept: HeldRecords | None = None
        """The records this store's claims created, for their settles (see ``_held``)."""

    @property
    def location(self) -> str:
        return self._engine.location

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
    ) -> tuple[Any, IntentRecord]:
        """Apply a held intent's writes chained in one statement (``sql.*_HELD``, where
        ``Dialect.chains_writes``): one round trip. The answer's first column and the
        intent's row; refused as ``_held_by`` and ``allowed`` refuse when they did not
        apply (then nothing was written)."""
        if self._kept is not None:
            self._kept.forget(key)
        applied = rule(transition)
        sources = [state.value for state in applied.sources if state is not None]

        def work(tx: Tx) -> tuple[Any, IntentRecord | None]:
            rows = tx.commit_with(statement, (key, owner, sources, *params, key)).rows
            # Decoded here, where a damaged row is reported as the journal's damage.
            return (rows[0][0], intent_from_row(rows[0][1:])) if rows else (None, None)

        first, record = self._engine.write(work, durable=durable, busy=applied.unwritten)
        if record is None or first in (None, False):
            if record is not None and record.lease_owner == owner:
                allowed(record, transition)  # raises, worded for the state it is in
            # Not held, or its lease changed hands between the read and the lock.
            raise _not_held(key, record)
        return first, record

    def _apply(
        self, tx: Tx, key: str, owner: str, transition: Transition
    ) -> tuple[IntentRecord, IntentState]:
        """The held intent and the state ``transition`` takes it to; refused when the
        transition may not start from the intent's state."""
        record = self._held_by(tx, key, owner)
        return record, allowed(record, transition)

    def claim(
        self,
        draft: IntentDraft,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        is_stale: Callable[[str], bool] = owner_is_dead,
        sent_to: str | None = None,
    ) -> Claim:
        """Create the intent ``draft`` describes with its first attempt, or take (or find
        held) the one already journaled. ``sent_to``: where attempt 1 of a created intent
        is sent (the URL without userinfo)."""

        def find(tx: Tx, lock: bool) -> IntentRecord | None:
            record = None
            if draft.reference is not None:
                record = select_intent(
                    tx, sql.BY_REFERENCE, (draft.scope, draft.reference), lock=lock
                )
            return record or select_intent(tx, sql.BY_KEY, (draft.key,), lock=lock)

        def created() -> Claim:
            return Claim(
                ClaimKind.CREATED,
                created_record(draft, owner, now, lease_seconds),
                attempt_number=1,
            )

        def work(tx: Tx) -> Claim:
            if not tx.dialect.lock_rows and self._create(
                tx, draft, owner, now, lease_seconds, sent_to
            ):
                # Writers are serialised (SQLite holds the whole journal), so an insert the
                # unique key and (scope, reference) let through is exactly a look-up that
                # found nothing: a new intent costs no look-ups. Any other answer needs them.
                return created()
            for _ in range(_CLAIM_ROUNDS):
                claim = self._claim_row(tx, find, draft, owner, now, lease_seconds, False, is_stale)
                if claim is not None:
                    return claim
                if self._create(tx, draft, owner, now, lease_seconds, sent_to):
                    return created()
                # Another worker created it between the look-up and the insert, and has
                # committed: the next look-up finds its row.
            raise self._engine.error(
                f"intent {draft.key}: its row kept appearing and disappearing under "
                "concurrent writers; nothing was sent. Retry later"
            )

        def create_in_one(tx: Tx) -> tuple[bool, IntentRecord | None]:
            found = (draft.key, draft.scope, draft.reference, draft.scope, draft.reference)
            values = (*self._intent_values(draft, owner, now, lease_seconds), now, sent_to)
            made, *existing = tx.commit_with(sql.CREATE_INTENT, (*values, *found)).rows[0]
            # Decoded here, where a damaged row is reported as the journal's damage.
            return bool(made), intent_from_row(tuple(existing)) if existing[0] else None

        unwritten = rule(Transition.WRITE_AHEAD).unwritten
        if self._engine.dialect.chains_writes:
            # A new intent, the common case, is one statement: one round trip to the
            # server. So is a replay, a refusal or a wait answered from the committed row
            # it finds instead; a lease to take is taken below, with the row locked.
            made, record = self._engine.write(create_in_one, durable=True, busy=unwritten)
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
        return self._keep(self._engine.write(work, durable=True, busy=unwritten))

    def _claim_row(
        self,
        tx: Tx,
        find: Callable[[Tx, bool], IntentRecord | None],
        draft: IntentDraft | None,
        owner: str,
        now: float,
        lease_seconds: float,
        unknown: bool,
        is_stale: Callable[[str], bool],
    ) -> Claim | None:
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
        return self._take(tx, record, owner, now, lease_seconds)

    @staticmethod
    def _intent_values(
        draft: IntentDraft, owner: str, now: float, lease_seconds: float
    ) -> tuple[object, ...]:
        """INSERT_INTENT's parameters."""
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
            now,
            owner,
            now + lease_seconds,
        )

    @classmethod
    def _create(
        cls,
        tx: Tx,
        draft: IntentDraft,
        owner: str,
        now: float,
        lease_seconds: float,
        sent_to: str | None,
    ) -> bool:
        inserted = tx.execute(
            sql.INSERT_INTENT, cls._intent_values(draft, owner, now, lease_seconds)
        )
        if inserted != 1:
            return False
        tx.send(sql.INSERT_ATTEMPT, (draft.key, 1, now, sent_to))
        return True

    def _take(
        self, tx: Tx, record: IntentRecord, owner: str, now: float, lease_seconds: float
    ) -> Claim:
        """Take the lease of a row this transaction holds and found free to take.

        The update repeats the test atomically: it takes the lease only if the row still
        has the holder it was judged on (or none, or an expired one)."""
        tx.send(
            sql.TAKE_LEASE,
            (owner, now + lease_seconds, now, record.key, owner, now, record.lease_owner),
        )
        claimed = reread(tx, record.key)
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
        is_stale: Callable[[str], bool] = owner_is_dead,
    ) -> Claim | None:
        def find(tx: Tx, lock: bool) -> IntentRecord | None:
            return select_intent(tx, sql.BY_KEY, (key,), lock=lock)

        return self._engine.write(
            lambda tx: self._claim_row(
                tx, find, None, owner, now, lease_seconds, unknown, is_stale
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
        is_stale: Callable[[str], bool] = owner_is_dead,
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
                    record = intent_from_row(row)
                    # The row is locked already (or the whole journal is, in SQLite).
                    verdict = decide_claim(
                        record, owner=owner, now=now, is_stale=is_stale, lease_seconds=lease_seconds
                    )
                    if verdict is None:
                        return self._take(tx, record, owner, now, lease_seconds)
                if len(rows) < _QUEUE_BATCH:
                    return None
                last = intent_from_row(rows[-1])
                created_at, key = last.created_at, last.key

        return self._engine.write(work, durable=True, busy=BEFORE_SEND)

    def renew_lease(self, key: str, *, owner: str, now: float, lease_seconds: float) -> bool:
        return self._engine.write(
            lambda tx: (
                tx.commit_with(sql.RENEW_LEASE, (now + lease_seconds, key, owner)).rowcount == 1
            ),
            durable=False,
            busy=AFTER_SEND,
        )

    def start_attempt(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        sent_to: str | None = None,
    ) -> int:
        """Journal the next attempt of a held intent; ``sent_to``: where it is sent (the URL
        without userinfo)."""

        if self._engine.dialect.chains_writes:
            writes = (now, sent_to, now, now + lease_seconds, now)
            number, _ = self._chained(
                key, owner, Transition.ATTEMPT_STARTED, sql.START_ATTEMPT_HELD, writes, durable=True
            )
            return int(number)

        def work(tx: Tx) -> int:
            self._apply(tx, key, owner, Transition.ATTEMPT_STARTED)
            row = tx.one(sql.LAST_ATTEMPT, (key,))
            number = int(row[0] if row else 0) + 1
            tx.send(sql.INSERT_ATTEMPT, (key, number, now, sent_to))
            tx.send(sql.ATTEMPT_STARTED, (now, now + lease_seconds, now, key))
            return number

        return self._engine.write(
            work, durable=True, busy=rule(Transition.ATTEMPT_STARTED).unwritten
        )

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
    ) -> None:
        """``provider_date``: the provider's time in the attempt's answer (its ``Date``)."""
        applied = rule(transition)
        if applied.attempt_ambiguous is None:
            raise ValueError(f"'{transition.value}' does not end an attempt")
        ambiguous = applied.attempt_ambiguous
        if self._engine.dialect.chains_writes:
            ended = (now, status_code, error, int(ambiguous), provider_date, number)
            writes = (*ended, applied.releases_lease)
            self._chained(key, owner, transition, sql.END_ATTEMPT_HELD, writes, durable=False)
            return

        def work(tx: Tx) -> None:
            self._apply(tx, key, owner, transition)
            self._end_attempt(tx, key, number, now, status_code, error, ambiguous, provider_date)
            if applied.releases_lease:
                tx.send(sql.RELEASE_LEASE, (key, owner))

        self._engine.write(work, durable=False, busy=applied.unwritten)

    @staticmethod
    def _store_response(tx: Tx, key: str, response: StoredResponse) -> None:
        tx.send(sql.STORE_RESPONSE, (*response_values(response), key))

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
    ) -> IntentRecord:
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

        def known_in_one(tx: Tx, held: IntentRecord, state: IntentState) -> IntentRecord | None:
            """``known`` as one statement: one round trip to the server."""
            values = (*response_values(response), state.value, now, acknowledged(state), key)
            guard = (owner, held.state.value, held.created_at)
            ended = (now, response.status, provider_date, attempt)
            crash_point("during_settle")  # nothing of the settle has left yet
            finished = tx.commit_with(
                sql.SETTLE_KNOWN_ENDING_ATTEMPT, (*values, *guard, *ended), whole=True
            )
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
            return self._engine.write(work, durable=False, busy=busy)

        if kept is not None and kept.attempt_count == attempt:
            state = target(transition, kept.state)
            if state is not None:
                held = kept
                settled = self._engine.write(
                    lambda tx: known_in_one(tx, held, state), durable=False, busy=busy
                )
                if settled is not None:
                    return settled
        to = _state_after(transition)
        ended = (now, response.status, provider_date, attempt)
        succeeded = (to, IntentState.SUCCEEDED.value, now if acknowledge_success else None)
        writes = (*ended, *response_values(response), to, now, *succeeded)
        crash_point("during_settle")  # nothing of the settle has left yet
        _, record = self._chained(key, owner, transition, sql.SETTLE_HELD, writes, durable=False)
        return record

    def mark_unknown(
        self, key: str, *, transition: Transition, owner: str, now: float, reason: str
    ) -> IntentRecord:
        if self._engine.dialect.chains_writes:
            writes = (_state_after(transition), reason, now)
            _, record = self._chained(
                key, owner, transition, sql.MARK_UNKNOWN_HELD, writes, durable=False
            )
            return record

        def work(tx: Tx) -> IntentRecord:
            _, state = self._apply(tx, key, owner, transition)
            tx.send(sql.SET_STATE, (state.value, reason, now, key))
            return reread(tx, key)

        return self._engine.write(work, durable=False, busy=rule(transition).unwritten)

    def release(self, key: str, *, owner: str) -> None:
        if self._kept is not None:
            self._kept.forget(key)
        self._engine.write(
            lambda tx: tx.send(sql.RELEASE_LEASE, (key, owner)),
            durable=False,
            busy=AFTER_SEND,
        )

    def looked_up(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        outcome: str,
        detail: str,
        status_code: int | None,
    ) -> None:
        """Journal a look-up made before a resend that settled nothing; the lease stays."""
        if self._engine.dialect.chains_writes:
            writes = (now, outcome, detail, status_code)
            self._chained(
                key, owner, Transition.LOOKED_UP, sql.LOOKED_UP_HELD, writes, durable=False
            )
            return

        def work(tx: Tx) -> None:
            self._apply(tx, key, owner, Transition.LOOKED_UP)
            tx.send(sql.INSERT_RECONCILIATION, (key, now, outcome, detail, status_code))

        self._engine.write(work, durable=False, busy=rule(Transition.LOOKED_UP).unwritten)

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
    ) -> IntentRecord:
        if self._engine.dialect.chains_writes:
            to = _state_after(transition)
            new_state = (to, to, IntentState.UNKNOWN.value, detail, now)
            noted = (now, outcome, detail, status_code)
            if response is None:
                statement, writes = sql.RECONCILED_HELD, (*noted, *new_state)
            else:
                statement = sql.RECONCILED_WITH_RESPONSE_HELD
                writes = (*noted, *response_values(response), *new_state)
            _, record = self._chained(key, owner, transition, statement, writes, durable=False)
            return record

        def work(tx: Tx) -> IntentRecord:
            _, state = self._apply(tx, key, owner, transition)
            tx.send(sql.INSERT_RECONCILIATION, (key, now, outcome, detail, status_code))
            if response is not None:
                self._store_response(tx, key, response)
            reason = detail if state is IntentState.UNKNOWN else None
            tx.send(sql.SET_STATE, (state.value, reason, now, key))
            return reread(tx, key)

        return self._engine.write(work, durable=False, busy=rule(transition).unwritten)


def _not_held(key: str, record: IntentRecord | None) -> IntentInFlight:
    return IntentInFlight(
        f"intent {key} is no longer held by this worker (its lease expired and "
        "another worker took it over); its outcome will be settled by that worker",
        key=key,
        reference=record.reference if record else None,
    )


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
