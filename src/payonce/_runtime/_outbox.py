"""``client.enqueue(..., connection=)``: the outbox's I/O edge, on the caller's connection.

The steps (``payonce._journal._outbox``) say which statements journal the intent; this
module checks the connection it is given, runs them on it inside a savepoint of the
caller's open transaction, and translates what the driver raises. Supported:

- a psycopg 3 ``Connection`` (``Client``) or ``AsyncConnection`` (``AsyncClient``);
- an SQLAlchemy ``Connection`` or ``Session`` on the psycopg 3 driver
  (``postgresql+psycopg://``), and their ``AsyncConnection`` / ``AsyncSession`` for
  ``AsyncClient`` (run through their ``run_sync``).

psycopg and SQLAlchemy are never imported here: a connection of theirs can only come from
a program that imported them already, so their modules are looked up in ``sys.modules``.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from .._journal._outbox import (
    SAVEPOINT,
    Answer,
    Elsewhere,
    JournalPlace,
    Statement,
    StatementFailed,
    Steps,
    enqueue_in_journal,
    enqueue_steps,
    journal_place,
)
from .._lifecycle import IntentDraft, IntentRecord
from ..errors import ConfigurationError, JournalError
from ._core import IntentCore

__all__ = ["Outbox"]

_SQLALCHEMY_DRIVERS = ("psycopg", "psycopg_async")
_UNDO = (f"ROLLBACK TO SAVEPOINT {SAVEPOINT}", f"RELEASE SAVEPOINT {SAVEPOINT}")
"""Back to how the caller's transaction was before the steps."""
_NO_TRANSACTION = (
    "enqueue(connection=...) writes the intent inside your open transaction, so that it "
    "commits or rolls back with your own rows, but {why}; nothing was written. Call it "
    "inside a transaction: `with conn.transaction():` (psycopg), `with engine.begin() as "
    "conn:` or `with session.begin():` (SQLAlchemy)"
)
_UNSUPPORTED = (
    "connection= takes a psycopg 3 Connection, or an SQLAlchemy Connection or Session on "
    "PostgreSQL through psycopg 3 (postgresql+psycopg://){also}, not {kind}"
)


class Outbox:
    """One client's outbox: where its journal lives (read once, again when a connection
    seems to be elsewhere), and the runs of the steps on the callers' connections."""

    def __init__(self, core: IntentCore) -> None:
        self._core = core
        self._place: JournalPlace | None = None

    def place(self, *, fresh: bool = False) -> JournalPlace:
        """Where the journal lives (reads the journal: off the event loop in async code)."""
        if fresh or self._place is None:
            self._place = journal_place(self._core.journal._engine)
        return self._place

    def _steps(self, draft: IntentDraft, place: JournalPlace) -> Steps:
        core = self._core
        return enqueue_steps(
            draft,
            now=core.clock(),
            place=place,
            location=core.journal.location,
            reconcilable=core.reconcilable,
        )

    def enqueue_alone(self, draft: IntentDraft) -> IntentRecord:
        """No caller's transaction: the intent is journaled and committed on its own."""
        core = self._core
        return enqueue_in_journal(
            core.journal._engine, draft, now=core.clock(), reconcilable=core.reconcilable
        )

    # -- sync --------------------------------------------------------------------------------

    def enqueue(self, draft: IntentDraft, connection: object) -> IntentRecord:
        if connection is None:
            return self.enqueue_alone(draft)
        place = self.place()
        cursor = _sync_cursor(connection)
        try:
            return self._run(cursor, draft, place)
        except Elsewhere as elsewhere:
            fresh = self.place(fresh=True)
            if fresh == place:
                raise ConfigurationError(elsewhere.message) from None
        # The server restarted since the place was read (its start time changed).
        try:
            return self._run(_sync_cursor(connection), draft, fresh)
        except Elsewhere as elsewhere:
            raise ConfigurationError(elsewhere.message) from None

    def _run(self, cursor: Any, draft: IntentDraft, place: JournalPlace) -> IntentRecord:
        steps = self._steps(draft, place)
        try:
            self._bracket(cursor, f"SAVEPOINT {SAVEPOINT}", draft)
            try:
                answer: Any = None
                while True:
                    try:
                        statement = steps.send(answer)
                    except StopIteration as done:
                        record: IntentRecord = done.value
                        break
                    try:
                        answer = self._execute(cursor, statement)
                    except StatementFailed as failed:
                        _thrown(steps, failed)
            except BaseException as exc:
                for text in _UNDO:
                    try:
                        cursor.execute(text)
                    except Exception as lost:
                        raise self._unusable(lost, draft) from exc
                raise
            self._bracket(cursor, f"RELEASE SAVEPOINT {SAVEPOINT}", draft)
            return record
        finally:
            cursor.close()

    def _bracket(self, cursor: Any, text: str, draft: IntentDraft) -> None:
        """The savepoint's own statements: if one fails, the connection cannot go on with
        the caller's transaction (lost, or the transaction aborted)."""
        try:
            cursor.execute(text)
        except Exception as exc:
            raise self._unusable(exc, draft) from exc

    def _execute(self, cursor: Any, statement: Statement) -> Answer:
        try:
            cursor.execute(statement.text, statement.params)
            rows = cursor.fetchall() if cursor.description is not None else []
        except Exception as exc:
            raise StatementFailed(exc, getattr(exc, "sqlstate", None)) from exc
        return Answer(int(cursor.rowcount), [tuple(row) for row in rows])

    # -- async -------------------------------------------------------------------------------

    async def aenqueue(self, draft: IntentDraft, connection: object) -> IntentRecord:
        from ._journal_threads import off_loop

        if connection is None:
            return await off_loop(self.enqueue_alone, draft)
        place = await off_loop(self.place)
        try:
            return await self._arun(draft, connection, place)
        except Elsewhere as elsewhere:
            fresh = await off_loop(self.place, fresh=True)
            if fresh == place:
                raise ConfigurationError(elsewhere.message) from None
        try:
            return await self._arun(draft, connection, fresh)
        except Elsewhere as elsewhere:
            raise ConfigurationError(elsewhere.message) from None

    async def _arun(
        self, draft: IntentDraft, connection: object, place: JournalPlace
    ) -> IntentRecord:
        psycopg = sys.modules.get("psycopg")
        if psycopg is not None and isinstance(connection, psycopg.AsyncConnection):
            _check_psycopg(connection)
            cursor = connection.cursor(row_factory=psycopg.rows.tuple_row)
            return await self._arun_steps(cursor, draft, place)
        if _is_sqlalchemy_async(connection):
            # SQLAlchemy's asyncio objects run sync code against their connection in a
            # greenlet: the sync runner, unchanged.
            def run(synchronous: object) -> IntentRecord:
                cursor = _sync_cursor(synchronous)
                return self._run(cursor, draft, place)

            result: IntentRecord = await connection.run_sync(run)  # type: ignore[attr-defined]
            return result
        raise ConfigurationError(
            _UNSUPPORTED.format(
                also=", or their asyncio versions (AsyncConnection, AsyncSession)",
                kind=_kind(connection),
            )
            + ". A sync connection blocks the event loop: use Client.enqueue with it"
        )

    async def _arun_steps(
        self, cursor: Any, draft: IntentDraft, place: JournalPlace
    ) -> IntentRecord:
        steps = self._steps(draft, place)
        async with cursor:
            await self._abracket(cursor, f"SAVEPOINT {SAVEPOINT}", draft)
            try:
                answer: Any = None
                while True:
                    try:
                        statement = steps.send(answer)
                    except StopIteration as done:
                        record: IntentRecord = done.value
                        break
                    try:
                        answer = await self._aexecute(cursor, statement)
                    except StatementFailed as failed:
                        _thrown(steps, failed)
            except BaseException as exc:
                for text in _UNDO:
                    try:
                        await cursor.execute(text)
                    except Exception as lost:
                        raise self._unusable(lost, draft) from exc
                raise
            await self._abracket(cursor, f"RELEASE SAVEPOINT {SAVEPOINT}", draft)
            return record

    async def _abracket(self, cursor: Any, text: str, draft: IntentDraft) -> None:
        try:
            await cursor.execute(text)
        except Exception as exc:
            raise self._unusable(exc, draft) from exc

    async def _aexecute(self, cursor: Any, statement: Statement) -> Answer:
        try:
            await cursor.execute(statement.text, statement.params)
            rows = await cursor.fetchall() if cursor.description is not None else []
        except Exception as exc:
            raise StatementFailed(exc, getattr(exc, "sqlstate", None)) from exc
        return Answer(int(cursor.rowcount), [tuple(row) for row in rows])

    # -- errors ------------------------------------------------------------------------------

    def _unusable(self, exc: BaseException, draft: IntentDraft) -> JournalError:
        what = " ".join(str(exc).split()) or type(exc).__name__
        return JournalError(
            f"enqueue could not use your connection ({what}) to write the intent for "
            f"reference {draft.reference!r}: the connection was lost, or "
            "your transaction aborted, so nothing of that transaction commits, the intent "
            "included. Roll it back and run it again",
            location=self._core.journal.location,
        )


def _thrown(steps: Steps, failed: StatementFailed) -> NoReturn:
    """Throw a failed statement into the steps, which raise the error that words it."""
    steps.throw(failed)
    raise AssertionError("the outbox steps went on after a failed statement")


def _kind(connection: object) -> str:
    return f"{type(connection).__module__}.{type(connection).__qualname__}"


def _sync_cursor(connection: object) -> Any:
    """A cursor of ``connection`` once it is checked: PostgreSQL through psycopg 3, in an
    open transaction. Its rows are tuples whatever row factory the caller set."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(connection, psycopg.Connection):
        _check_psycopg(connection)
        return connection.cursor(row_factory=psycopg.rows.tuple_row)
    orm = sys.modules.get("sqlalchemy.orm")
    if orm is not None and isinstance(connection, orm.Session):
        if not connection.in_transaction():
            raise ConfigurationError(_NO_TRANSACTION.format(why="this Session has none begun"))
        connection = connection.connection()
    engine = sys.modules.get("sqlalchemy.engine")
    if engine is not None and isinstance(connection, engine.Connection):
        return _sqlalchemy_cursor(connection)
    if psycopg is not None and isinstance(connection, psycopg.AsyncConnection):
        raise ConfigurationError(
            "connection= is a psycopg AsyncConnection: use it with AsyncClient.enqueue (awaited)"
        )
    raise ConfigurationError(_UNSUPPORTED.format(also="", kind=_kind(connection)))


def _check_psycopg(connection: Any) -> None:
    """A psycopg connection must be inside a transaction, which must not have failed."""
    from psycopg.pq import TransactionStatus

    status = connection.info.transaction_status
    if status == TransactionStatus.INTRANS:
        return
    if status == TransactionStatus.IDLE:
        why = (
            "this connection is in autocommit mode with no transaction block open"
            if connection.autocommit
            else "this connection has no transaction open yet"
        )
        raise ConfigurationError(_NO_TRANSACTION.format(why=why))
    _refuse_status(status)


def _refuse_status(status: Any) -> None:
    from psycopg.pq import TransactionStatus

    if status == TransactionStatus.INERROR:
        raise ConfigurationError(
            "enqueue(connection=...): your transaction has already failed (a statement in it "
            "raised), so nothing it writes can commit; nothing was written. Roll it back and "
            "run it again"
        )
    if status == TransactionStatus.ACTIVE:
        raise ConfigurationError(
            "enqueue(connection=...): this connection is busy running a statement (a result "
            "still streaming?); nothing was written. Enqueue once it is done"
        )
    raise ConfigurationError(
        "enqueue(connection=...): this connection is closed or broken; nothing was written"
    )


def _sqlalchemy_cursor(connection: Any) -> Any:
    dialect = connection.dialect
    if dialect.name != "postgresql":
        raise ConfigurationError(
            f"connection= is an SQLAlchemy connection to a {dialect.name} database: the outbox "
            "writes into the PostgreSQL database that holds the journal"
        )
    if dialect.driver not in _SQLALCHEMY_DRIVERS:
        raise ConfigurationError(
            f"connection= uses SQLAlchemy's {dialect.driver} driver; enqueue supports psycopg 3 "
            "(postgresql+psycopg:// or postgresql+psycopg_async://)"
        )
    if not connection.in_transaction():
        raise ConfigurationError(
            _NO_TRANSACTION.format(why="this SQLAlchemy connection has no transaction begun")
        )
    raw = connection.connection
    driver = raw.driver_connection
    if getattr(driver, "autocommit", False):
        # engine.begin() does not help here: SQLAlchemy runs it without a transaction.
        raise ConfigurationError(
            "enqueue(connection=...) writes the intent inside your open transaction, so that "
            "it commits or rolls back with your own rows, but this SQLAlchemy connection runs "
            "in autocommit (isolation_level='AUTOCOMMIT'): each statement commits at once, "
            "even inside engine.begin() or session.begin(); nothing was written. Use a "
            "connection that is not in autocommit for the handler that enqueues: the engine "
            "without isolation_level='AUTOCOMMIT', or "
            "engine.execution_options(isolation_level='READ COMMITTED')"
        )
    from psycopg.pq import TransactionStatus

    status = driver.info.transaction_status
    # SQLAlchemy begins the driver's transaction with its first statement: IDLE is fine.
    if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
        _refuse_status(status)
    return raw.dbapi_connection.cursor()


def _is_sqlalchemy_async(connection: object) -> bool:
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    return asyncio_ext is not None and isinstance(
        connection, asyncio_ext.AsyncConnection | asyncio_ext.AsyncSession
    )
