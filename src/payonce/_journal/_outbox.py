"""The outbox's write-ahead: a new intent journaled through the caller's own PostgreSQL
connection, inside the caller's open transaction, so that it commits or rolls back with the
caller's business rows (an order and its payment, together or not at all).

What is written is the journal's own write-ahead record (``_rows.write_ahead_values`` and
``_sql.INSERT_INTENT``, the statement every creation runs), pending, with nothing sent:
no attempt, no lease, no first send. After the caller commits, any ``resume`` or worker
claims it like any pending intent nobody holds, and sends it under its key.

Nothing here does I/O: ``enqueue_steps`` is a generator that yields each ``Statement`` to
run on the caller's connection and receives its ``Answer``, so the sync and async edges
(``payonce._runtime._outbox``) differ only in how they run a statement. Their runner wraps
the steps in a savepoint, so a refusal or a failed statement leaves the caller's
transaction usable and the journal as it was.

The connection must reach the very tables the journal uses: the same server, the same
database, the same schema. ``journal_place`` reads where the journal lives through the
journal's own connection; the first step reads the same facts through the caller's. The
server is known by its postmaster's start time and port (any role may read them, over TCP
or a unix socket, and two servers never share both), the database by its name, the schema
by the object id of its ``intents`` table. Every statement names the journal's tables with
their schema (``in_schema``), never through the caller's search path.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any

import attrs

from .._lifecycle import IntentDraft, IntentRecord, is_mismatch
from .._lifecycle import _refusals as refusals
from ..errors import ConfigurationError, JournalError
from . import _sql as sql
from ._engine import BEFORE_SEND, Engine, Tx
from ._intents import select_intent
from ._rows import intent_from_row, write_ahead_values

__all__ = [
    "SAVEPOINT",
    "Answer",
    "Elsewhere",
    "JournalPlace",
    "Statement",
    "StatementFailed",
    "enqueue_in_journal",
    "enqueue_steps",
    "in_schema",
    "journal_place",
]

SAVEPOINT = "payonce_enqueue"
"""The savepoint the runner wraps the steps in, in the caller's transaction."""

_PLACE = (
    "SELECT current_database(), extract(epoch FROM pg_postmaster_start_time()),"
    " current_setting('port'), to_regclass(?)::oid"
)
_HERE = "SELECT current_user, " + _PLACE.removeprefix("SELECT ")
"""``_PLACE`` through the caller's connection, with the role it writes as."""
_JOURNAL_SCHEMA = (
    "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.oid = to_regclass('intents')"
)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_JOURNAL_TABLE = re.compile(
    r"\b(FROM|INTO|JOIN|UPDATE)\s+(" + "|".join(sql.needed_columns()) + r")\b"
)


def in_schema(statement: str, schema: str) -> str:
    """``statement`` with every journal table it names qualified by ``schema``.

    Run on a caller's connection, an unqualified name would resolve by that session's
    search path, and PostgreSQL looks in the session's temporary schema first whatever the
    path says: a temporary ``intents`` table (a pooled connection may keep one) would take
    the intent, and no worker would ever send it.
    """
    return _JOURNAL_TABLE.sub(lambda m: f"{m[1]} {_quoted(schema)}.{m[2]}", statement)


@attrs.frozen
class JournalPlace:
    """Where a journal's tables are: what a connection must reach to write its intents."""

    schema: str
    database: str
    server_started: Any
    """The epoch of the server's postmaster start, as the server reports it."""
    port: str
    table: int | None
    """The object id of the journal's ``intents`` table (None: no such table there)."""

    @property
    def intents_table(self) -> str:
        return f"{_quoted(self.schema)}.intents"

    def seen_from(self, row: tuple[Any, ...]) -> JournalPlace:
        """The same facts as a connection's ``_PLACE`` row tells them."""
        database, started, port, table = row
        return JournalPlace(
            self.schema, str(database), started, str(port), None if table is None else int(table)
        )

    def differences(self, other: JournalPlace) -> str | None:
        """How ``other`` (a caller's connection) is elsewhere; None when it is here."""
        if (other.server_started, other.port) != (self.server_started, self.port):
            return (
                f"it is connected to another PostgreSQL server (database {other.database!r}, "
                f"port {other.port})"
            )
        if other.database != self.database:
            return f"it is connected to database {other.database!r}, not {self.database!r}"
        if other.table != self.table:
            return f"its database has no journal table {self.intents_table} (or another one)"
        return None


class Elsewhere(Exception):
    """The caller's connection does not reach the journal's tables (raised by the steps,
    nothing written). Never seen by callers: the runtime reads the journal's place again
    once, in case the server was restarted since it last read it, and raises a
    ``ConfigurationError`` with ``message`` when the connection is still elsewhere."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class StatementFailed(Exception):
    """A statement of the steps failed on the caller's connection: the runner throws it into
    the steps, which word what it means for the caller's transaction. ``cause`` is what the
    driver raised, ``sqlstate`` its SQLSTATE code when the server sent one."""

    def __init__(self, cause: BaseException, sqlstate: str | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.sqlstate = sqlstate

    @property
    def what(self) -> str:
        return " ".join(str(self.cause).split()) or type(self.cause).__name__


_SERIALIZATION_FAILURE = "40001"
_DEADLOCK = "40P01"
_INSUFFICIENT_PRIVILEGE = "42501"
_ROLL_BACK = (
    "Do not commit your transaction as it is: your rows would commit without their payment. "
    "Roll it back and run it again"
)


def outbox_grants(schema: str, role: str) -> str:
    """The privileges a role needs to enqueue into the journal in ``schema`` (outbox.md)."""
    s, r = _quoted(schema), _quoted(role)
    return (
        f"GRANT USAGE ON SCHEMA {s} TO {r}; GRANT SELECT, INSERT ON {s}.intents TO {r}; "
        f"GRANT SELECT ON {s}.attempts TO {r};"
    )


def write_failed(
    failed: StatementFailed,
    draft: IntentDraft,
    place: JournalPlace,
    role: str | None,
    location: str,
) -> JournalError:
    """The error of a statement that failed on the caller's connection: the intent was not
    written, so the caller's transaction must not commit as it is (its order would have no
    payment), whatever the cause."""
    intent = f"the intent for reference {draft.reference!r}"
    if failed.sqlstate == _SERIALIZATION_FAILURE:
        why = (
            "your transaction conflicted with a concurrent one (under REPEATABLE READ or "
            "SERIALIZABLE: another transaction committed the same reference after yours "
            "took its snapshot), and it cannot write it any more"
        )
        then = f"{_ROLL_BACK}: the new transaction finds the intent the other one wrote"
    elif failed.sqlstate == _DEADLOCK:
        why = "your transaction deadlocked with a concurrent one"
        then = _ROLL_BACK
    elif failed.sqlstate == _INSUFFICIENT_PRIVILEGE:
        who = f"role {role!r}" if role is not None else "your connection's role"
        why = f"{who} lacks a privilege the outbox needs on the journal's tables"
        then = (
            f"Have the journal's owner grant it: {outbox_grants(place.schema, role or 'ROLE')} "
            f"Then roll your transaction back and run it again: committing it as it is "
            "would commit your rows without their payment"
        )
    else:
        why = "the statement that writes it failed"
        then = _ROLL_BACK
    return JournalError(
        f"enqueue did not write {intent} through your connection: {why} ({failed.what}). "
        f"Nothing was written. {then}",
        location=location,
    )


def enqueue_in_journal(
    engine: Engine, draft: IntentDraft, *, now: float, reconcilable: bool
) -> IntentRecord:
    """Journal ``draft``'s intent, pending and unsent, in a transaction of the journal's own,
    committed before this returns (``enqueue`` without ``connection=``, on any journal):
    the new intent, or the one journaled for the same request already; ``IntentMismatch``
    for another request under that reference, nothing written."""

    def work(tx: Tx) -> IntentRecord:
        found = select_intent(tx, sql.BY_REFERENCE, (*draft.identity, draft.reference), lock=True)
        if found is not None:
            return found
        values = write_ahead_values(
            draft, now, first_sent_at=None, owner=None, lease_expires_at=None, enqueued=True
        )
        tx.execute(sql.INSERT_INTENT, values)
        # Inserted, or another process journaled the same reference (or key) first.
        record = select_intent(tx, sql.BY_REFERENCE, (*draft.identity, draft.reference))
        record = record or select_intent(tx, sql.BY_KEY, (draft.key,))
        if record is None:
            raise engine.error(
                f"enqueue did not write the intent for reference {draft.reference!r}: it was "
                "neither written nor found; nothing was sent. Enqueue it again"
            )
        return record

    # Durable: a worker on another host may send it the moment it commits.
    record = engine.write(work, durable=True, busy=BEFORE_SEND)
    if is_mismatch(record, draft):
        raise refusals.mismatch(draft, record, reconcilable=reconcilable, enqueuing=True)
    return record


def journal_place(engine: Engine) -> JournalPlace:
    """Where the journal ``engine`` writes to lives; ``ConfigurationError`` for a journal
    that is not in PostgreSQL (no one else's transaction can hold its writes)."""
    if engine.dialect is not sql.POSTGRES:
        raise ConfigurationError(
            f"enqueue(connection=...) writes the intent in your own PostgreSQL transaction, "
            f"but this client's journal is not in PostgreSQL ({engine.location}); nothing was "
            "written. Give the client the journal in your service's database "
            "(journal='postgresql://…/yourdb?schema=payonce'), or enqueue it on its own "
            "(connection=None) after your transaction commits"
        )

    def work(tx: Tx) -> JournalPlace:
        row = tx.one(_JOURNAL_SCHEMA)
        if row is None:
            raise engine.error("the journal's intents table is missing; the journal is damaged")
        place = JournalPlace(str(row[0]), "", None, "", None)
        found = tx.one(_PLACE, (place.intents_table,))
        assert found is not None, "a SELECT without FROM returns its one row"
        return place.seen_from(found)

    return engine.read(work)


@attrs.frozen
class Statement:
    """One statement for the caller's connection, in PostgreSQL's ``%s`` style."""

    text: str
    params: tuple[Any, ...] = ()


@attrs.frozen
class Answer:
    """What a statement did: the rows it changed, and the rows it returned."""

    rowcount: int
    rows: list[tuple[Any, ...]]


Steps = Generator[Statement, Answer, IntentRecord]


def _statement(text: str, params: tuple[Any, ...] = ()) -> Statement:
    return Statement(sql.POSTGRES.sql(text), params)


def enqueue_steps(
    draft: IntentDraft,
    *,
    now: float,
    place: JournalPlace,
    location: str,
    reconcilable: bool,
) -> Steps:
    """Journal ``draft``'s intent, pending and unsent, through the caller's connection.

    Returns the intent journaled for ``draft.reference``: the new one, or the one an
    earlier call journaled for the same request (a retried handler). Raises
    ``IntentMismatch`` when that reference holds another request, and
    ``Elsewhere`` when the connection does not reach the journal's tables, and
    ``JournalError`` when a statement fails (the runner throws ``StatementFailed`` in); the
    runner then rolls its savepoint back.
    """
    roles: list[str] = []  # the caller's role, once the first statement has told it
    try:
        return (yield from _enqueue(draft, now, place, location, reconcilable, roles))
    except StatementFailed as failed:
        role = roles[0] if roles else None
        raise write_failed(failed, draft, place, role, location) from failed.cause


def _enqueue(
    draft: IntentDraft,
    now: float,
    place: JournalPlace,
    location: str,
    reconcilable: bool,
    roles: list[str],
) -> Steps:
    here = yield _statement(_HERE, (place.intents_table,))
    roles.append(str(here.rows[0][0]))
    if (why := place.differences(place.seen_from(here.rows[0][1:]))) is not None:
        raise Elsewhere(
            f"connection= must reach the database that holds the journal ({location}, schema "
            f"{place.schema!r}) so that the intent commits with your rows, but {why}; nothing "
            "was written. Pass a connection to that database, or give the client a journal in "
            "your own database (journal='postgresql://…/yourdb?schema=payonce')"
        )
    schema = place.schema
    record = yield from _select(schema, sql.BY_REFERENCE, (*draft.identity, draft.reference))
    if record is None:
        values = write_ahead_values(
            draft, now, first_sent_at=None, owner=None, lease_expires_at=None, enqueued=True
        )
        yield _statement(in_schema(sql.INSERT_INTENT, schema), values)
        # Inserted, or another transaction committed the same reference (or the same key)
        # first: either way the row to answer with is there now.
        record = yield from _select(schema, sql.BY_REFERENCE, (*draft.identity, draft.reference))
        record = record or (yield from _select(schema, sql.BY_KEY, (draft.key,)))
    if record is None:
        raise JournalError(
            f"enqueue did not write the intent for reference {draft.reference!r}: it was "
            "neither written nor found (another transaction holds the same reference "
            f"uncommitted?). Nothing was written. {_ROLL_BACK}",
            location=location,
        )
    if is_mismatch(record, draft):
        raise refusals.mismatch(draft, record, reconcilable=reconcilable, enqueuing=True)
    return record


def _select(
    schema: str, where: str, params: tuple[Any, ...]
) -> Generator[Statement, Answer, IntentRecord | None]:
    found = yield _statement(in_schema(sql.SELECT_INTENT + where, schema), params)
    return intent_from_row(found.rows[0]) if found.rows else None
