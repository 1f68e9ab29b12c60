"""The PostgreSQL journal, one shared by every host of a service: its engine (a connection
pool) and ``PostgresJournal``, the public journal that opens it.

Needs the ``postgres`` extra (psycopg 3 and psycopg-pool). Everything but connecting,
transactions, durability settings and error translation lives in ``_engine`` and ``_sql``,
shared with the SQLite journal; the URL and its password are ``_postgres_url``'s.

Durability budget, the same as SQLite's (see docs/postgres.md): the write-ahead record of
a new intent, every lease taken and every attempt start commit with the server's
``synchronous_commit`` (``on`` unless the DBA asked for more; a server default of ``off``
is raised to ``on`` for these sessions): the WAL is flushed before the request is sent.
Attempt ends, settlements, releases, renewals, reconciliations, acknowledgements and
abandonments commit with ``SET LOCAL synchronous_commit = off``: they are visible to every
host at once and survive a crash of the client, and a crash of the database server may
roll back only the last few, each of which leaves a state payonce already handles safely.

Concurrency between hosts: every row a transaction reads to decide on is locked
``FOR UPDATE`` until it commits; two hosts creating the same intent at once are arbitrated
by the unique (scope, reference) index and ``INSERT … ON CONFLICT DO NOTHING``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from .._fork import ForkGuard
from .._lifecycle import Unwritten
from ..errors import ConfigurationError, JournalError
from . import _sql as sql
from ._engine import BEFORE_SEND, NO_SEND, Engine, Finished, Tx, migrate, schema_found
from ._postgres_url import Target
from ._reads import Journal
from ._rows import DamagedRow

__all__ = ["PostgresEngine", "PostgresJournal"]

T = TypeVar("T")

logger = logging.getLogger("payonce")

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# The advisory-lock class of payonce's migrations ("pyon"); the second key is the schema.
_MIGRATION_LOCK = 0x70796F6E
# Transactions that found their connection dead before committing are rolled back by the
# server, so they are run again on a fresh connection, as are deadlock victims.
_ROUNDS = 3
_BUSY = (pg_errors.LockNotAvailable, pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
_RETRYABLE = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)


class PostgresEngine(Engine):
    """One PostgreSQL journal's transactions (see ``PostgresJournal`` for the options)."""

    dialect = sql.POSTGRES

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 5.0,
        schema: str | None = None,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        check_integrity: bool = True,
        read_only: bool = False,
    ) -> None:
        self.read_only = read_only
        target = Target(url)
        self._target = target
        self._schema = schema if schema is not None else target.schema
        if self._schema is not None and not _SCHEMA_NAME.fullmatch(self._schema):
            raise ConfigurationError(
                f"journal schema {self._schema!r} must be a plain SQL name: letters, digits "
                "and underscores, not starting with a digit, at most 63 characters"
            )
        self._location = target.location(self._schema)
        if pool_size < 1:
            raise ConfigurationError("pool_size must be at least 1")
        self._busy_timeout = busy_timeout
        # A stuck statement or an abandoned open transaction (a host frozen mid-write)
        # would hold its row locks forever; the server ends both long after any honest wait.
        self._safety_timeout = max(30.0, 4 * busy_timeout)
        self._fsync_off_warned = False
        connect: dict[str, Any] = {"autocommit": True}
        if "application_name" not in target.parameters:
            connect["application_name"] = "payonce"
        if "connect_timeout" not in target.parameters:
            connect["connect_timeout"] = max(1, round(connect_timeout))
        self._connect_options, self._pool_size = connect, pool_size
        self._fork = ForkGuard()
        self._pool = self._new_pool()
        try:
            self._open(connect, connect_timeout, check_integrity)
        except BaseException:
            self._pool.close()
            raise

    def _new_pool(self) -> ConnectionPool[psycopg.Connection[tuple[Any, ...]]]:
        return ConnectionPool(
            self._target.conninfo,
            kwargs=self._connect_options,
            min_size=1,
            max_size=self._pool_size,
            open=False,
            configure=self._configure,
            timeout=self._busy_timeout,
            name="payonce-journal",
        )

    def _in_this_process(self) -> None:
        """After a fork, a pool of the child's own (see ``_fork``): the parent's connections
        are never used, nor closed, here."""
        if self._fork.forked(self._pool):
            self._pool = self._new_pool()
            self._pool.open(wait=False)

    @property
    def location(self) -> str:
        return self._location

    # -- opening ---------------------------------------------------------------------------

    def _open(self, connect: dict[str, Any], connect_timeout: float, check: bool) -> None:
        # One connection of its own first: a refused password or an unknown database is
        # reported as such, rather than as a pool that never filled up.
        try:
            conn = psycopg.connect(self._target.conninfo, **connect)
        except psycopg.Error as exc:
            raise self.error(
                f"cannot connect to the journal database: {self._describe(exc)}"
            ) from None
        with conn:
            try:
                self._configure(conn)
                if self.read_only:
                    self.schema_version = self._run(
                        conn, self._inspect, begin=("BEGIN READ ONLY",), busy=NO_SEND
                    )
                    check = check and self.schema_version > 0
                else:
                    self._run(conn, self._migrate, begin=_DURABLE, busy=BEFORE_SEND)
                if check:
                    self._run(conn, self._verify, begin=None, busy=NO_SEND)
            except psycopg.Error as exc:
                raise self.translate(exc, BEFORE_SEND) from None
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except PoolTimeout:
            raise self.error(
                f"the journal database accepted one connection but the pool could not "
                f"open one within {connect_timeout:g}s"
            ) from None

    def _kind(self) -> str:
        return f"PostgreSQL schema {self._schema}" if self._schema else "PostgreSQL database"

    def _inspect(self, tx: Tx) -> int:
        """The schema version found, for a read-only journal: no lock, nothing created."""
        return schema_found(tx, refuse=self._refuse(self._kind()))

    def _migrate(self, tx: Tx) -> None:
        # Hosts starting together would otherwise race to create the same tables.
        tx.one(
            "SELECT pg_advisory_xact_lock(?, hashtext(coalesce(?, current_schema(), '')))",
            (_MIGRATION_LOCK, self._schema),
        )
        if self._schema is not None and not tx.one(
            "SELECT 1 FROM pg_namespace WHERE nspname = ?", (self._schema,)
        ):
            tx.execute(f'CREATE SCHEMA "{self._schema}"')
        try:
            migrate(tx, refuse=self._refuse(self._kind()))
        except pg_errors.DuplicateTable as exc:
            raise self.error(
                f"the database already has a table or index payonce needs the name of "
                f"({self._describe(exc)}); nothing was changed. Give the journal a schema of "
                "its own: ?schema=payonce in the URL"
            ) from None

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Session settings of every connection, in one round trip."""
        ms = f"{round(self._busy_timeout * 1000)}ms"
        safety = f"{round(self._safety_timeout * 1000)}ms"
        row = conn.execute(
            "SELECT current_setting('synchronous_commit'), current_setting('fsync'),"
            " set_config('lock_timeout', %s, false),"
            " set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false),"
            " set_config('search_path', coalesce(%s, current_setting('search_path')), false),"
            " set_config('default_transaction_read_only',"
            " coalesce(%s, current_setting('default_transaction_read_only')), false)",
            (
                ms,
                safety,
                safety,
                f'"{self._schema}"' if self._schema else None,
                "on" if self.read_only else None,  # a writer keeps what the DBA set
            ),
        ).fetchone()
        assert row is not None
        synchronous_commit, fsync = row[0], row[1]
        if synchronous_commit == "off":
            # The write-ahead record must be flushed before the request leaves.
            conn.execute("SET synchronous_commit = on")
        if fsync == "off" and not self._fsync_off_warned:
            self._fsync_off_warned = True
            logger.warning(
                "the journal database %s runs with fsync=off: a crash of the database "
                "host can lose journaled intents, and a resend under a new key could pay "
                "twice. Never run a payment journal so in production",
                self.location,
            )

    # -- transactions ----------------------------------------------------------------------

    def _commit(self, work: Callable[[Tx], T], *, durable: bool, busy: Unwritten) -> T:
        begin = _DURABLE if durable else _LAZY
        return self._transact(work, begin=begin, busy=busy)

    def _query(self, work: Callable[[Tx], T], *, snapshot: bool) -> T:
        return self._transact(work, begin=_SNAPSHOT if snapshot else None, busy=NO_SEND)

    def _transact(
        self, work: Callable[[Tx], T], *, begin: tuple[str, ...] | None, busy: Unwritten
    ) -> T:
        self._in_this_process()
        for round_ in range(1, _ROUNDS + 1):
            try:
                conn = self._pool.getconn()
            except PoolClosed:
                raise self.error("this journal was closed; open it again to use it") from None
            except PoolTimeout:
                raise self.error(
                    f"no connection to the journal database became free within "
                    f"{self._busy_timeout:g}s (all in use, or the database is unreachable)",
                    busy=True,
                    then=busy,
                ) from None
            try:
                return self._run(conn, work, begin=begin, busy=busy)
            except DamagedRow as exc:
                raise self.error(
                    f"the journal cannot be read ({exc}); it is damaged: restore it from a "
                    "backup, or repair that row",
                    then=busy,
                ) from None
            except psycopg.Error as exc:
                lost = isinstance(exc, psycopg.OperationalError) and conn.broken
                if round_ < _ROUNDS and (lost or isinstance(exc, _RETRYABLE)):
                    logger.debug("journal transaction retried: %s", self._describe(exc))
                    continue
                raise self.translate(exc, busy) from None
            finally:
                self._pool.putconn(conn)
        raise AssertionError("unreachable: the last round returns or raises")

    def _run(
        self,
        conn: psycopg.Connection[Any],
        work: Callable[[Tx], T],
        *,
        begin: tuple[str, ...] | None,
        busy: Unwritten,
    ) -> T:
        if begin is None:  # reads, each statement its own round trip and transaction
            return work(Tx(conn.cursor(), self.dialect))
        tx = _Pipelined(conn, self.dialect, begin)
        try:
            result = work(tx)
            tx.commit()
        except BaseException as exc:
            tx.abandon()
            if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    conn.close()  # the pool replaces it
            if tx.committing and conn.broken and isinstance(exc, psycopg.Error):
                # Lost with the commit on its way: never run again (it may have been
                # recorded). A statement the server refused rolled everything back.
                raise self.error(
                    f"the journal database failed while committing "
                    f"({self._describe(exc)}), so whether this write was recorded is "
                    "unknown",
                    then=busy,
                ) from None
            raise
        return result

    def _describe(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split()) or type(exc).__name__
        return self._target.redact(text)

    def translate(self, exc: psycopg.Error, busy: Unwritten) -> JournalError:
        missing = isinstance(exc, pg_errors.UndefinedTable | pg_errors.UndefinedColumn)
        if missing and (reason := self._cannot_read()) is not None:
            return reason
        if isinstance(exc, pg_errors.QueryCanceled):
            return self.error(
                f"a journal statement ran for more than {self._safety_timeout:g}s and was "
                "cancelled",
                busy=True,
                then=busy,
            )
        if isinstance(exc, _BUSY):
            return self.error(
                f"the journal's rows stayed locked by another worker for more than "
                f"{self._busy_timeout:g}s",
                busy=True,
                then=busy,
            )
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return self.error(
                f"the database role lacks a privilege the journal needs "
                f"({self._describe(exc)}): grant it, or give the journal a schema it may "
                "create tables in (?schema=payonce)"
            )
        if isinstance(exc, psycopg.OperationalError):
            return self.error(f"lost the journal database ({self._describe(exc)})", then=busy)
        return self.error(f"journal operation failed ({self._describe(exc)})", then=busy)

    # -- operating --------------------------------------------------------------------------

    def between_batches(self, seconds: float) -> None:
        """Nothing to wait for: a prune batch locks only the rows it deletes (``SKIP
        LOCKED``), so no other writer was shut out of the journal meanwhile."""

    def storage_problems(self, tx: Tx) -> list[str]:
        row = tx.one("SELECT current_setting('fsync')")
        if row is not None and row[0] == "off":
            return ["the database server runs with fsync=off: committed intents can be lost"]
        return []

    def present_columns(self, tx: Tx, table: str) -> set[str]:
        rows = tx.all(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(?)"
            " AND attnum > 0 AND NOT attisdropped",
            (table,),
        )
        return {str(row[0]) for row in rows}

    def size_bytes(self, tx: Tx) -> int:
        row = tx.one(
            "SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0)"
            " FROM unnest(?::text[]) AS t",
            (list(sql.needed_columns()),),
        )
        return int(row[0]) if row else 0

    def backup(self, destination: str | os.PathLike[str]) -> Path:
        """Not payonce's to do: raises ``JournalError`` naming the database's own tools.

        A consistent copy of a live PostgreSQL database is ``pg_dump``'s (or a base backup
        with WAL archiving, or the provider's point-in-time recovery).
        """
        only_schema = f" -n {self._schema}" if self._schema is not None else ""
        raise self.error(
            f"payonce does not copy a PostgreSQL journal to {os.fspath(destination)}: back it "
            f"up with pg_dump (e.g. pg_dump -Fc{only_schema} -f payonce.dump DBNAME), or "
            "with base backups and WAL archiving"
        )

    def close(self) -> None:
        self._in_this_process()  # a child closes its own pool, never its parent's
        self.flush_acknowledgements()
        self._pool.close()


_DURABLE = ("BEGIN",)
# Settles and the like: visible to every host at once, flushed to disk a moment later.
_LAZY = ("BEGIN", "SET LOCAL synchronous_commit = off")
# A full check may scan every row: no statement timeout for it.
_SNAPSHOT = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "SET LOCAL statement_timeout = 0")


class _Pipelined(Tx):
    """A write transaction sent in as few round trips as its reads allow.

    What needs no answer yet (BEGIN, SET LOCAL, ``send``, COMMIT) is queued in psycopg's
    pipeline mode and travels with the next statement whose answer is read, so a
    transaction of ``send`` and ``commit_with`` only is one round trip. A durable
    transaction that is one ``commit_with`` alone, or one whose statement sets its own
    durability (``whole``), is that statement in autocommit, its own transaction: no
    BEGIN, no COMMIT, no pipeline (each statement a pipeline carries costs the client a
    wait of its own). Statements are prepared on the server after a few uses
    on a connection (psycopg's ``prepare_threshold``), in the same round trip.
    """

    __slots__ = ("_begin", "_conn", "_pipeline", "_pipeline_mode", "committing")

    def __init__(
        self, conn: psycopg.Connection[Any], dialect: sql.Dialect, begin: tuple[str, ...]
    ) -> None:
        super().__init__(conn.cursor(), dialect)
        self._conn = conn
        self._begin = begin
        self._pipeline_mode: contextlib.AbstractContextManager[psycopg.Pipeline] | None = None
        self._pipeline: psycopg.Pipeline | None = None
        self.committing = False
        """The commit has been sent: a connection lost from now on may have recorded it."""

    def _started(self) -> psycopg.Pipeline:
        """The pipeline, BEGIN queued in it, entered at the first statement."""
        assert not self.committing, "nothing runs in a transaction after its commit"
        if self._pipeline is None:
            self._pipeline_mode = self._conn.pipeline()
            self._pipeline = self._pipeline_mode.__enter__()
            for statement in self._begin:
                self._cursor.execute(statement, ())
        return self._pipeline

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        pipeline = self._started()
        self._cursor.execute(self.dialect.sql(statement), params)
        pipeline.sync()  # a Sync inside BEGIN ends no transaction; it fetches the count
        return int(self._cursor.rowcount)

    def send(self, statement: str, params: Sequence[Any] = ()) -> None:
        self._started()
        super().send(statement, params)

    def one(self, statement: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self._started()
        return super().one(statement, params)

    def all(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._started()
        return super().all(statement, params)

    def commit_with(
        self, statement: str, params: Sequence[Any] = (), *, whole: bool = False
    ) -> Finished:
        final = self._conn.cursor()
        if self._pipeline is None and (whole or self._begin == _DURABLE):
            self.committing = True  # one statement, one transaction of its own
            final.execute(self.dialect.sql(statement), params)
        else:
            self._started()
            final.execute(self.dialect.sql(statement), params)
            self.commit()
        rows = [tuple(row) for row in final.fetchall()] if final.description else []
        return Finished(final.rowcount, rows)

    def commit(self) -> None:
        """Queue COMMIT and send what waits: one round trip. Raises what the server
        refused, or the loss of the connection (then whether it committed is unknown)."""
        if self.committing:
            return  # committed by commit_with
        self.committing = True
        mode, self._pipeline_mode, self._pipeline = self._pipeline_mode, None, None
        if mode is None:
            return  # nothing was sent: nothing to commit
        self._cursor.execute("COMMIT", ())
        mode.__exit__(None, None, None)

    def abandon(self) -> None:
        """Leave pipeline mode after a failure; the caller rolls back what is open."""
        mode, self._pipeline_mode, self._pipeline = self._pipeline_mode, None, None
        if mode is not None:
            # The error already raised is the one to tell; the rollback follows.
            with contextlib.suppress(psycopg.Error):
                mode.__exit__(None, None, None)


class PostgresJournal(Journal):
    """A journal in a PostgreSQL database, shared by every host and thread that opens it.

    ``url`` is a libpq URL, ``postgresql://user:password@host:5432/dbname?sslmode=…``.
    ``schema`` (or ``?schema=name`` in the URL) keeps the journal's tables in a schema of
    their own, created on first open; by default they go where unqualified names resolve
    (usually ``public``). ``busy_timeout`` bounds every wait for a row lock or a pooled
    connection; ``pool_size`` is the most connections this journal holds at once.

    ``location`` is the URL without its password, which appears in no message or log.

    ``read_only`` runs every session with ``default_transaction_read_only``: the journal's
    tables and schema are never created or migrated and no lock is taken to migrate them, so
    it reads while writers hold rows. A journal of an older schema is read as it is; a read
    that needs what only a newer schema has raises ``JournalError`` saying so, and so do
    writes.
    """

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 5.0,
        schema: str | None = None,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        check_integrity: bool = True,
        read_only: bool = False,
    ) -> None:
        super().__init__(
            PostgresEngine(
                url,
                busy_timeout=busy_timeout,
                schema=schema,
                pool_size=pool_size,
                connect_timeout=connect_timeout,
                check_integrity=check_integrity,
                read_only=read_only,
            )
        )
