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
by the unique (provider, account, reference) index and ``INSERT … ON CONFLICT DO NOTHING``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Generator, Sequence
from pathlib import Path
from types import CoroutineType
from typing import Any, NamedTuple, TypeVar, cast

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from .._fork import ForkGuard
from .._lifecycle import Unwritten
from .._lifecycle._key_age import CLOCK_TOLERANCE
from ..errors import ConfigurationError, JournalError
from . import _sql as sql
from ._engine import BEFORE_SEND, NO_SEND, Engine, Finished, Tx, migrate, schema_found
from ._plans import Ask, InThread, Statement, Work, Write, one, threaded
from ._postgres_url import Target
from ._reads import Journal
from ._rows import UndecodableRow

__all__ = ["PostgresEngine", "PostgresJournal"]

T = TypeVar("T")

logger = logging.getLogger("payonce")

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# The advisory-lock class of payonce's migrations ("pyon"); the second key is the schema.
_MIGRATION_LOCK = 0x70796F6E
# Deadlock victims and serialisation failures were rolled back: run again, a few times.
_ROUNDS = 3
# A transaction that found its connection dead before committing was rolled back by the
# server: it runs again on a fresh connection, as often as ``failover_timeout`` allows, with
# these pauses between tries while no primary answers (a failover takes seconds).
_RECONNECT_PAUSES = (0.05, 0.1, 0.2, 0.5, 1.0)
_POOL_NAME = "payonce-journal"
_POOL_WAIT_RECONNECTING = 0.25
_LOST_BACKEND_WAIT_MS = 5000
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
        failover_timeout: float = 30.0,
        synchronous_settles: bool = False,
    ) -> None:
        self.read_only = read_only
        self._synchronous_settles = synchronous_settles
        self.settles_synchronously = synchronous_settles
        target = Target(url)
        if not read_only:
            target.refuse_standbys()
        if failover_timeout < 0:
            raise ConfigurationError("failover_timeout must be 0 or more seconds")
        self._failover_timeout = failover_timeout
        _route_driver_logs()
        _TARGETS.add(target)
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
        self._clock_off_warned = False
        self._clock_anchor: tuple[float, float, float] | None = None
        """The offset last measured, and this host's wall and monotonic clocks then."""
        connect: dict[str, Any] = {"autocommit": True}
        if "application_name" not in target.parameters:
            connect["application_name"] = "payonce"
        if "connect_timeout" not in target.parameters:
            connect["connect_timeout"] = max(1, round(connect_timeout))
        for name, value in _partition_bounds(failover_timeout).items():
            if name not in target.parameters:  # the URL's own settings win
                connect[name] = value
        self._connect_options, self._pool_size = connect, pool_size
        self._fork = ForkGuard()
        self._backends: weakref.WeakKeyDictionary[
            psycopg.Connection[Any] | psycopg.AsyncConnection[Any], _Backend
        ] = weakref.WeakKeyDictionary()
        """Which server process each connection talks to, for a recovery to wait for."""
        self._edges: dict[asyncio.AbstractEventLoop, _AsyncEdge] = {}
        """The async connections of each event loop that wrote through this journal."""
        self._edges_lock = threading.Lock()
        self._searching: _Reconnection | None = None
        """The latest search for a primary (``_outage``)."""
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
            name=_POOL_NAME,
        )

    def _in_this_process(self) -> None:
        """After a fork, a pool of the child's own (see ``_fork``): the parent's connections
        are never used, nor closed, here; its event loops' connections neither."""
        if self._fork.forked(self._pool, self._edges):
            self._pool = self._new_pool()
            self._pool.open(wait=False)
            self._edges = {}

    def async_edge(self) -> _AsyncEdge | None:
        """This journal's writes on the running event loop: its own async connections
        (``_AsyncEdge``), one set per loop. None outside a loop."""
        self._in_this_process()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        edge = self._edges.get(loop)
        if edge is None:
            with self._edges_lock:
                # A loop that has closed left idle connections that nothing will use again.
                for gone in [old for old in self._edges if old.is_closed()]:
                    self._edges.pop(gone).finish()
                edge = self._edges.setdefault(loop, _AsyncEdge(self))
        return edge

    @property
    def location(self) -> str:
        return self._location

    # -- opening ---------------------------------------------------------------------------

    def _open(self, connect: dict[str, Any], connect_timeout: float, check: bool) -> None:
        # Opening during a restart or a failover rides it out like a write that lost its
        # connection, within failover_timeout: a worker started then, or a service's first
        # client, does not fail for a database that is a moment away.
        reconnecting: _Reconnection | None = None
        while (lost := self._opened(connect, check)) is not None:
            reconnecting = _reconnecting(self, reconnecting, lost)
            pause = reconnecting.pause()
            if pause is None:
                searched = (
                    f", and it did not answer within {self._failover_timeout:g}s (failover_timeout)"
                    if self._failover_timeout > 0
                    else ""
                )
                raise self.error(
                    f"cannot connect to the journal database ({self._describe(lost)}){searched}"
                ) from None
            time.sleep(pause)
        if reconnecting is not None:
            reconnecting.over()
        try:
            with _driver_logs_routed():
                self._pool.open(wait=True, timeout=connect_timeout)
        except PoolTimeout:
            raise self.error(
                f"the journal database accepted one connection but the pool could not "
                f"open one within {connect_timeout:g}s"
            ) from None

    def _opened(self, connect: dict[str, Any], check: bool) -> psycopg.Error | None:
        """Connect, migrate (or inspect) and check, on one connection of its own first: a
        refused password or an unknown database is reported as such, rather than as a
        pool that never filled up. What lost the connection (or never made it: refused,
        unreachable, a server starting up or shutting down, no primary yet) is returned, to
        try again; the rest raises ``JournalError``."""
        try:
            conn = psycopg.connect(self._target.conninfo, **connect)
        except psycopg.Error as exc:
            if _unreachable(exc):
                return exc
            raise self.error(
                f"cannot connect to the journal database: {self._describe(exc)}"
            ) from None
        with conn:
            try:
                self._configure(conn)
                if self.read_only:
                    self.schema_version = self._now(
                        _attempt(self, conn, threaded(self._inspect), ("BEGIN READ ONLY",))
                    )
                    check = check and self.schema_version > 0
                else:
                    self._now(_attempt(self, conn, threaded(self._migrate), _DURABLE))
                if check:
                    self._now(_attempt(self, conn, threaded(self._verify), None))
            except _CommitUnknown as unknown:  # opening again finds the schema as it is
                return unknown.cause
            except _NotReplicated as unreplicated:
                raise self._not_replicated(unreplicated, BEFORE_SEND) from None
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError) and conn.broken:
                    return exc
                raise self.translate(exc, BEFORE_SEND) from None
        return None

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
        conn.add_notice_handler(self._notice)
        sent = time.time()
        row = conn.execute(_SESSION, self._session_settings()).fetchone()
        if self._configured(conn, row, sent, time.time()):
            conn.execute(_SYNCHRONOUS_COMMIT_ON)

    def _session_settings(self) -> tuple[str | None, ...]:
        """``_SESSION``'s parameters."""
        ms = f"{round(self._busy_timeout * 1000)}ms"
        safety = f"{round(self._safety_timeout * 1000)}ms"
        return (
            ms,
            safety,
            safety,
            f'"{self._schema}"' if self._schema else None,
            "on" if self.read_only else None,  # a writer keeps what the DBA set
        )

    def _configured(
        self,
        conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
        row: Any,
        sent: float,
        received: float,
    ) -> bool:
        """Note what ``_SESSION`` answered on ``conn``, asked at ``sent`` and answered at
        ``received`` by this host's wall clock; True when the session must raise
        ``synchronous_commit`` to ``on``: the write-ahead record must be flushed before the
        request leaves."""
        assert row is not None
        synchronous_commit, fsync = row[0], row[1]
        self._clock_read(float(row[2]), sent, received)
        backend = _Backend(conn.info.backend_pid, row[-1], conn.info.server_version)
        self._backends[conn] = backend
        conn.add_notice_handler(backend.hear)  # a durable commit's standby wait cancelled
        if fsync == "off" and not self._fsync_off_warned:
            self._fsync_off_warned = True
            logger.warning(
                "the journal database %s runs with fsync=off: a crash of the database "
                "host can lose journaled intents, and a resend under a new key could pay "
                "twice. Never run a payment journal so in production",
                self.location,
            )
        return bool(synchronous_commit == "off")

    @property
    def clock_offset(self) -> float:
        """The measured offset, less any step of this host's wall clock since it was
        measured (read against the monotonic clock, which no one steps): a host clock set
        right, or wrong, while a connection lives must not move the journal's clock, or a
        lease dated before the step would be judged by another clock after it."""
        if self._clock_anchor is None:
            return 0.0
        offset, wall, monotonic = self._clock_anchor
        stepped = (time.time() - wall) - (time.monotonic() - monotonic)
        return offset - stepped

    def _clock_read(self, server_now: float, sent: float, received: float) -> None:
        """The server's clock, read on a new connection: the offset every lease and date
        of this journal is judged by (``clock_offset``), taken at the middle of the round
        trip (its error is at most half of it). Hosts sharing the journal then agree on
        time however far their own clocks are apart; one far off is told, once."""
        offset = server_now - (sent + received) / 2
        before = self.clock_offset if self._clock_anchor is not None else None
        self._clock_anchor = (offset, time.time(), time.monotonic())
        if before is not None and abs(offset - before) > CLOCK_TOLERANCE:
            # This host's steps are taken out of ``before``: what moved is the server's
            # clock (stepped, or a failover to a server whose clock differs). Leases dated
            # by the old one are judged by the new one from now on, on every host.
            logger.warning(
                "the clock of the journal database %s moved by %+.0fs since this host last "
                "read it (a clock step on the server, or a failover to a server whose clock "
                "differs): leases dated by its old clock may be judged wrongly by hosts "
                "that read the new one. Keep the database servers' clocks synchronised "
                "with NTP, and never step them while payonce runs",
                self.location,
                offset - before,
            )
        if abs(offset) > CLOCK_TOLERANCE and not self._clock_off_warned:
            self._clock_off_warned = True
            logger.warning(
                "this host's clock is %.0fs %s the clock of the journal database %s: payonce "
                "dates and judges this journal's leases and attempts by the database's "
                "clock, but this host's clock is off by more than the %gs hosts may "
                "disagree by (webhook signatures, logs and your own records use it): "
                "synchronise it with NTP",
                abs(offset),
                "behind" if offset > 0 else "ahead of",
                self.location,
                CLOCK_TOLERANCE,
            )

    # -- transactions ----------------------------------------------------------------------

    def _commit(self, write: Write[T]) -> T:
        self._in_this_process()
        with _driver_logs_routed():
            return self._now(_committing(self, write))

    def _unreplicated(
        self, unreplicated: _NotReplicated, *, before_send: bool, busy: Unwritten
    ) -> object:
        """A durable commit kept on the primary only: refused when something is to be sent
        on the strength of it; else (a settle under ``synchronous_settles``) its result."""
        if before_send:
            raise self._not_replicated(unreplicated, busy) from None
        if unreplicated.lost is not None:  # its answer went with the connection
            raise self._commit_unknown(_CommitUnknown(unreplicated.lost), busy) from None
        # A settle kept on the primary only costs what a lazy settle costs: a failover may
        # put the intent back to pending, for resume.
        logger.warning(
            "journal %s: a write made after sending was committed on the primary only "
            "(%s); a failover before the standby catches up may put its intent back to "
            "pending, which payonce resume settles",
            self.location,
            unreplicated.said,
        )
        return unreplicated.result

    def _listening(
        self,
        conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
        begin: tuple[str, ...] | None,
    ) -> _Backend | None:
        """The backend of a durable transaction about to run on ``conn``, its ear reset:
        whether the server says its commit stopped waiting for the standby."""
        backend = self._backends.get(conn) if begin == _DURABLE else None
        if backend is not None:
            backend.unreplicated = None
        return backend

    def _query(self, work: Callable[[Tx], T], *, snapshot: bool) -> T:
        self._in_this_process()
        with _driver_logs_routed():
            return self._now(_reading(self, threaded(work), _SNAPSHOT if snapshot else None))

    # -- the I/O edge of a thread: the shared driver's steps, carried out at once --------------

    def _now(self, steps: Steps[T]) -> T:
        """Carry the driver's ``steps`` out in this thread: the drive of both edges
        (``_driven``), each step answered at once by a blocking call."""
        return _at_once(_driven(steps, self._carry_out))

    def _carry_out(self, step: _Step) -> Any:
        """One step, carried out by a blocking call."""
        if type(step) is _Do:  # the most frequent first
            return step.function(*step.args)
        match step:
            case _Enter(mode):
                return mode.__enter__()
            case _Leave(mode):
                return mode.__exit__(None, None, None)
            case _InThread(function, tx):
                return function(tx if isinstance(tx, Tx) else _Pipelined(tx, self._now))
            case _Take(wait):
                try:
                    return self._pool.getconn(wait)
                except PoolClosed:
                    raise self.error("this journal was closed; open it again to use it") from None
                except PoolTimeout:
                    # None free: busy, or, while reconnecting, the pool retrying its
                    # connections with a back-off of seconds (the driver then looks for the
                    # new primary at once, on a connection of its own).
                    return None
            case _Give(conn, alone):
                return conn.close() if alone else self._pool.putconn(conn)
            case _Alone():
                return self._connect_alone()
            case _Forget():
                return self._pool.check()  # the other idle connections died with one
            case _Pause(seconds):
                return time.sleep(seconds)
        raise AssertionError(f"no step {step!r}")

    def _damaged(self, exc: UndecodableRow, busy: Unwritten) -> JournalError:
        return self.error(
            f"the journal cannot be read ({exc}); it is damaged: restore it from a "
            "backup, or repair that row",
            then=busy,
        )

    def _connect_alone(self) -> psycopg.Connection[Any] | psycopg.Error:
        """A connection outside the pool, or what the database answered instead."""
        try:
            conn = psycopg.connect(self._target.conninfo, **self._connect_options)
        except psycopg.Error as exc:
            return exc
        try:
            self._configure(conn)
        except psycopg.Error as exc:
            conn.close()
            return exc
        return conn

    def _reconnection(self, cause: psycopg.Error) -> _Reconnection:
        logger.info(
            "journal %s: lost the connection to the database (%s); reconnecting, for up to %gs",
            self.location,
            self._describe(cause),
            self._failover_timeout,
        )
        searching = _Reconnection(cause, self._failover_timeout, self.location)
        self._searching = searching
        return searching

    def _outage(self) -> _Reconnection | None:
        """The search for a primary under way (a call lost its connection and looks for
        one), for a call that found no connection free meanwhile: it looks too, until that
        search's deadline, rather than give up after ``busy_timeout``. None when no search
        is under way: every connection is simply in use."""
        searching = self._searching
        return None if searching is None else searching.joined()

    def _not_replicated(self, unreplicated: _NotReplicated, busy: Unwritten) -> JournalError:
        about = busy.about or "this write"
        advice = (
            "it is journaled on the primary only, and a failover before the standby catches "
            "up would lose it (and a new key). Once the synchronous standby answers again, call "
            "again with the same reference, which carries on under the same key (from this "
            "process at once; from another once this call's lease has run out, the client's "
            "lease_seconds), or run payonce resume"
        )
        return self.error(
            f"the journal database committed {about} without its synchronous standby: the "
            f"wait for the standby was cancelled (the database said: {unreplicated.said}), "
            "so it is not durable and payonce sent nothing on the strength of it",
            then=Unwritten(
                f"{busy.words}; {advice}",
                may_have_executed=busy.may_have_executed,
                retry_later=False,
            ),
        )

    def _commit_unknown(
        self,
        unknown: _CommitUnknown,
        busy: Unwritten,
        reconnecting: _Reconnection | None = None,
    ) -> JournalError:
        searched = (
            f", and no primary answered within {self._failover_timeout:g}s to tell"
            if reconnecting is not None
            else ""
        )
        return self.error(
            f"the journal database failed while committing ({self._describe(unknown.cause)})"
            f"{searched}, so whether this write was recorded is unknown",
            then=_then_resume(busy),
        )

    def _lost(self, reconnecting: _Reconnection, busy: Unwritten) -> JournalError:
        return self.error(
            f"lost the journal database ({self._describe(reconnecting.cause)}) and found no "
            f"primary to reconnect to within {self._failover_timeout:g}s",
            then=_then_resume(busy),
        )

    def _no_connection(self, reconnecting: _Reconnection | None, busy: Unwritten) -> JournalError:
        if reconnecting is not None:
            return self._lost(reconnecting, busy)
        return self.error(
            f"no connection to the journal database became free after waiting "
            f"{self._busy_timeout:g}s for one (busy_timeout): all in use, or the database "
            "unreachable (a restart, a failover: a call waits for a new primary, up to "
            "failover_timeout, once a call has lost its connection)",
            busy=True,
            then=busy,
        )

    def _notice(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        """A server's notice or warning, in payonce's log rather than on stderr.

        What payonce handles itself is INFO: a session ended by the server's operator or a
        shutdown (class 57: payonce reconnects, and tells its callers), a cancelled wait for
        the synchronous standby (the write is refused as not durable). Other warnings stay
        warnings; notices are DEBUG."""
        severity = diagnostic.severity_nonlocalized or diagnostic.severity or "NOTICE"
        handled = (diagnostic.sqlstate or "").startswith("57") or _unreplicated(diagnostic)
        if severity != "WARNING":
            level = logging.DEBUG
        else:
            level = logging.INFO if handled else logging.WARNING
        logger.log(
            level,
            "journal %s: the database said: %s: %s",
            self.location,
            severity,
            self._target.redact(diagnostic.message_primary or ""),
        )

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
            held = f"{busy.about}: its row" if busy.about else "the journal's rows"
            return self.error(
                f"{held} stayed locked for more than {self._busy_timeout:g}s by another "
                "transaction still open: another worker's, or an uncommitted one of your "
                "service's (an outbox transaction that enqueued it with enqueue(connection=...) "
                "holds its row until it commits or rolls back)",
                busy=True,
                then=busy,
            )
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return self.error(
                f"the database role lacks a privilege the journal needs "
                f"({self._describe(exc)}): {self._privilege_advice()}",
                then=busy,
            )
        if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            return self.error(
                f"the journal database is read-only ({self._describe(exc)}): the server "
                "is a standby in recovery (or default_transaction_read_only is on for this "
                "role or database), and payonce writes only to a primary. Point the URL at "
                "the primary, or name every server with ?target_session_attrs=read-write "
                "so that libpq picks the primary",
                then=busy,
            )
        if isinstance(exc, psycopg.OperationalError):
            return self.error(
                f"lost the journal database ({self._describe(exc)})", then=_then_resume(busy)
            )
        return self.error(f"journal operation failed ({self._describe(exc)})", then=busy)

    def _denied(self, denied: _Denied, busy: Unwritten) -> JournalError:
        privileges = ", ".join(denied.missing)
        table = f"{_identifier(denied.schema)}.{_identifier(denied.table)}"
        role = _identifier(denied.role)
        return self.error(
            f"the database role {denied.role} lacks {privileges} on the journal's table "
            f"{denied.schema}.{denied.table}: GRANT {privileges} ON {table} TO {role}",
            then=busy,
        )

    def _privilege_advice(self) -> str:
        if self._schema is not None:
            return (
                f"grant the role CREATE ON DATABASE (to create the schema {self._schema}), or "
                f"have an administrator create it for the role: CREATE SCHEMA "
                f"{self._schema} AUTHORIZATION <role>"
            )
        return (
            "grant the role CREATE ON SCHEMA public (PostgreSQL 15 and later grant it to no "
            "one by default), or give the journal a schema of its own (?schema=payonce), "
            "which needs CREATE ON DATABASE or the schema created for the role by an "
            "administrator"
        )

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
        with self._edges_lock:
            edges, self._edges = list(self._edges.values()), {}
        for edge in edges:
            edge.finish()
        with _driver_logs_routed():
            self._pool.close()


def _partition_bounds(failover_timeout: float) -> dict[str, int]:
    """libpq's TCP settings that end a connection a network partition froze (no reset
    ever arrives) within about ``failover_timeout``, so that the write on it is run again,
    or looked for, on a new connection like any other lost one: unacknowledged data gives
    up after ``tcp_user_timeout``; a connection waiting for an answer (nothing unacknowledged)
    is probed from ``keepalives_idle`` on, every ``keepalives_interval``, and ends after
    ``keepalives_count`` unanswered probes. Ignored on a Unix socket, which no partition cuts."""
    bound = max(failover_timeout, _SHORTEST_PARTITION_BOUND)
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, round(bound / 3)),
        "keepalives_interval": max(1, round(bound / 9)),
        "keepalives_count": 3,
        "tcp_user_timeout": round(bound * 1000),
    }


# A failover_timeout of 0 (no reconnection) still ends a frozen connection in this time.
_SHORTEST_PARTITION_BOUND = 10.0

# Every session's settings, and what it tells of the server, in one round trip.
_SESSION = (
    "SELECT current_setting('synchronous_commit'), current_setting('fsync'),"
    " extract(epoch FROM clock_timestamp())::float8,"
    " set_config('lock_timeout', %s, false),"
    " set_config('statement_timeout', %s, false),"
    " set_config('idle_in_transaction_session_timeout', %s, false),"
    " set_config('search_path', coalesce(%s, current_setting('search_path')), false),"
    " set_config('default_transaction_read_only',"
    " coalesce(%s, current_setting('default_transaction_read_only')), false),"
    " (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())"
)
_SYNCHRONOUS_COMMIT_ON = "SET synchronous_commit = on"
# A recovery's first statement when the lost connection's server may still be committing.
_END_LOST_BACKEND = (
    "SELECT pg_terminate_backend(pid, ?) FROM pg_stat_activity WHERE pid = ? AND backend_start = ?"
)
_DURABLE = ("BEGIN",)
# Settles and the like: visible to every host at once, flushed to disk a moment later.
_LAZY = ("BEGIN", "SET LOCAL synchronous_commit = off")
# A full check may scan every row: no statement timeout for it.
_SNAPSHOT = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "SET LOCAL statement_timeout = 0")


# -- one driver for both I/O edges ----------------------------------------------------------
#
# A write's transaction, its retries, its reconnections and the recovery of a commit lost
# with its connection are written once, as generators of steps (in the manner of the
# lifecycle's drive, or of psycopg's own generators): a thread carries the steps out at once
# (``PostgresEngine._now``), an event loop awaits them (``_AsyncEdge.write``): one loop,
# ``_driven``, with each edge's ``_carry_out`` of a step. Only the
# steps' I/O differs: a pool or a loop's own connections, blocking or awaited calls.


class _Do(NamedTuple):
    """Call ``function(*args)``, a method of a connection, cursor or pipeline: a thread's
    returns its answer, an async one's is awaited."""

    function: Callable[..., Any]
    args: tuple[Any, ...] = ()


class _Enter(NamedTuple):
    """Enter pipeline mode (``mode`` from ``connection.pipeline()``): the pipeline."""

    mode: Any


class _Leave(NamedTuple):
    """Leave pipeline mode: what waits is sent, and what the server refused is raised."""

    mode: Any


class _InThread(NamedTuple):
    """Call a ``Tx`` function's work (``_plans.InThread``) with ``tx``, or with a ``Tx`` of
    the pipeline: in a thread only."""

    function: Callable[[Any], Any]
    tx: Tx | _Pipeline


class _Take(NamedTuple):
    """A connection: answered with one, with None when none became free within ``wait``
    seconds (None: the busy timeout), or with the database's refusal of a new one."""

    wait: float | None


class _Give(NamedTuple):
    """Give ``conn`` back (one of its own, ``alone``, is closed)."""

    conn: Any
    alone: bool


class _Alone(NamedTuple):
    """A connection of its own to the primary, outside the pool: answered with it, or with
    the database's refusal."""


class _Forget(NamedTuple):
    """A connection broke: the idle ones died with it, replace them."""


class _Pause(NamedTuple):
    """Sleep ``seconds`` before trying to reconnect again."""

    seconds: float


_Step = _Do | _Enter | _Leave | _InThread | _Take | _Give | _Alone | _Forget | _Pause
Steps = Generator[_Step, Any, T]


async def _driven(steps: Steps[T], carry_out: Callable[[_Step], Any]) -> T:
    """Carry the driver's ``steps`` out, each by ``carry_out`` (an edge's): each step's
    answer is sent back, what a step raised is thrown back in. An event loop's
    ``carry_out`` is a coroutine function, awaited, and so is this; a thread's answers at
    once, and this then never suspends: it runs as one call (``_at_once``)."""
    answer: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = steps.send(answer) if failure is None else steps.throw(failure)
        except StopIteration as done:
            result: T = done.value
            return result
        failure = None
        try:
            answer = carry_out(step)
            if type(answer) is CoroutineType:
                answer = await answer
        except BaseException as exc:
            answer, failure = None, exc


def _at_once(driven: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (``_driven`` with a thread's ``carry_out``) to
    its end in this thread, as one call: its first ``send`` finishes it."""
    try:
        driven.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    driven.close()
    raise AssertionError("a thread's step suspended: only an event loop may carry it out")


def _committing(engine: PostgresEngine, write: Write[T]) -> Steps[T]:
    """A write, durable or lazy as it asks, with its recovery after a commit lost with its
    connection and its refusal when the server kept a durable commit on the primary only."""
    durable = write.durable or engine._synchronous_settles
    begin = _DURABLE if durable else _LAZY
    try:
        try:
            return (yield from _transaction(engine, write.work, begin=begin, busy=write.busy))
        except _CommitUnknown as unknown:
            if write.recover is None:
                raise engine._commit_unknown(unknown, write.busy) from None
            return (yield from _recovering(engine, write, unknown, begin=begin, durable=durable))
    except _NotReplicated as unreplicated:
        result = engine._unreplicated(unreplicated, before_send=write.durable, busy=write.busy)
        return cast(T, result)


def _reading(
    engine: PostgresEngine, work: Callable[[], Work[T]], begin: tuple[str, ...] | None
) -> Steps[T]:
    """A read: a commit lost with its connection changes nothing, so it simply reads again."""
    reconnecting = None
    while True:
        try:
            return (
                yield from _transaction(
                    engine, work, begin=begin, busy=NO_SEND, reconnecting=reconnecting
                )
            )
        except _CommitUnknown as lost:
            if reconnecting is None:
                reconnecting = engine._reconnection(lost.cause)
            elif not (yield from _paused(reconnecting)):
                raise engine._lost(reconnecting, NO_SEND) from None


def _transaction(
    engine: PostgresEngine,
    work: Callable[[], Work[T]],
    *,
    begin: tuple[str, ...] | None,
    busy: Unwritten,
    reconnecting: _Reconnection | None = None,
) -> Steps[T]:
    """Run ``work`` in a transaction; raises ``_CommitUnknown`` when the connection was
    lost during its ``COMMIT``. A connection lost before it is replaced, and the work
    run again, until the reconnection's deadline; a deadlock's or serialisation failure's
    victim runs again a few times."""
    retried = 0
    while True:
        alone = False
        conn = yield _Take(reconnecting.pool_wait() if reconnecting is not None else None)
        if isinstance(conn, psycopg.Error):  # refused a new one: a failover, a restart
            reconnecting = _reconnecting(engine, reconnecting, conn)
            if (yield from _paused(reconnecting)):
                continue
            raise engine._lost(reconnecting, busy) from None
        if conn is None:  # none free in time
            if reconnecting is None:
                # Busy, or caught in an outage another call is reconnecting from: then it
                # looks for the primary too, within that search's ``failover_timeout``.
                reconnecting = engine._outage()
                if reconnecting is None:
                    raise engine._no_connection(None, busy) from None
            # While reconnecting: look for the new primary alone, on a connection of its own.
            conn = yield _Alone()
            if isinstance(conn, psycopg.Error):
                reconnecting.cause = conn
                logger.debug(
                    "journal %s: no primary yet (%s)", engine.location, engine._describe(conn)
                )
                if (yield from _paused(reconnecting)):
                    continue
                raise engine._lost(reconnecting, busy) from None
            alone = True
        try:
            result = yield from _attempt(engine, conn, work, begin)
        except UndecodableRow as exc:
            raise engine._damaged(exc, busy) from None
        except _CommitUnknown:
            raise
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError) and conn.broken:
                reconnecting = _reconnecting(engine, reconnecting, exc)
                yield _Forget()
                if (yield from _paused(reconnecting)):
                    continue
                raise engine._lost(reconnecting, busy) from None
            if isinstance(exc, _RETRYABLE) and retried < _ROUNDS - 1:
                retried += 1
                logger.debug("journal transaction retried: %s", engine._describe(exc))
                continue
            if isinstance(exc, pg_errors.InsufficientPrivilege):
                # Which of the journal's privileges on that table the role lacks, so that
                # the error can give the GRANT to run.
                denied = yield from _denied(exc, engine._schema)
                if denied is not None:
                    raise engine._denied(denied, busy) from None
            raise engine.translate(exc, busy) from None
        finally:
            yield _Give(conn, alone)
        if reconnecting is not None:
            reconnecting.over()
        return result


_TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
"""What payonce does with each table of its journal (DELETE: ``prune``)."""
_TABLE_DENIED = re.compile(r"permission denied for (?:table|relation) (\S+)")
_PRIVILEGES_LACKED = (
    "SELECT current_user, n.nspname, c.relname,"
    " array(SELECT p FROM unnest(%s::text[]) AS p WHERE NOT has_table_privilege(c.oid, p))"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.oid = to_regclass(%s)"
)


class _Denied(NamedTuple):
    role: str
    schema: str
    table: str
    missing: tuple[str, ...]


def _identifier(name: str) -> str:
    """``name`` as SQL writes it: quoted only where it must be."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _denied(exc: psycopg.Error, schema: str | None) -> Steps[_Denied | None]:
    """The journal privileges the role lacks on the table ``exc`` was refused on (in the
    journal's ``schema``, else where its name resolves); None when it names no table, or
    the question cannot be asked. Asked on a connection of its own: the refused one may
    still be leaving its pipeline."""
    said = exc.diag.message_primary or str(exc)
    found = _TABLE_DENIED.search(said)
    if found is None:
        return None
    table = found[1] if schema is None else f"{_identifier(schema)}.{_identifier(found[1])}"
    asking = yield _Alone()
    if isinstance(asking, psycopg.Error):
        return None
    row: Any = None
    try:
        cursor = yield _Do(asking.execute, (_PRIVILEGES_LACKED, (list(_TABLE_PRIVILEGES), table)))
        row = yield _Do(cursor.fetchone)
    except psycopg.Error:
        row = None
    yield _Give(asking, True)
    if row is None or not row[3]:
        return None
    return _Denied(str(row[0]), str(row[1]), str(row[2]), tuple(row[3]))


def _reconnecting(
    engine: PostgresEngine, reconnecting: _Reconnection | None, cause: psycopg.Error
) -> _Reconnection:
    """The search for a primary that ``cause`` starts, or the one under way, told of it."""
    if reconnecting is None:
        return engine._reconnection(cause)
    reconnecting.cause = cause
    return reconnecting


def _paused(reconnecting: _Reconnection) -> Steps[bool]:
    """Pause before the next try; False once the reconnection's deadline has passed."""
    pause = reconnecting.pause()
    if pause is None:
        return False
    yield _Pause(pause)
    return True


def _attempt(
    engine: PostgresEngine, conn: Any, work: Callable[[], Work[T]], begin: tuple[str, ...] | None
) -> Steps[T]:
    """One try of ``work`` on ``conn``: raises what the server refused (rolled back), or
    ``_CommitUnknown`` when the connection was lost with the commit on its way."""
    if begin is None:  # reads, each statement its own round trip and transaction
        return (yield from _carried(work(), _Plain(Tx(conn.cursor(), engine.dialect))))
    tx = _Pipeline(conn, engine.dialect, begin)
    backend = engine._listening(conn, begin)
    try:
        result = yield from _carried(work(), tx)
        if not tx.committing:  # not committed by its last statement (``commit_with``)
            yield from tx.commit()
    except BaseException as exc:
        yield from tx.abandon()
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            yield _Do(conn.close)  # left mid-protocol: never reused (the pool replaces it)
        elif not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            try:
                yield _Do(conn.execute, ("ROLLBACK",))
            except psycopg.Error:
                yield _Do(conn.close)  # the pool replaces it
        # An error the server answered with (a lock timeout, a deadlock, a serialization
        # failure, a constraint) on a connection still up is its refusal: rolled back.
        # A connection exception (08) or an operator's intervention (57: the server
        # shutting down, the session terminated) says nothing about the commit.
        refused = not conn.broken and _server_refusal(exc)
        lost = conn.broken or (isinstance(exc, psycopg.OperationalError) and not refused)
        if tx.committing and isinstance(exc, psycopg.Error) and lost:
            _NotReplicated.check(backend, None, lost=exc)
            # Lost with the commit on its way (a COMMIT, or a statement that is its own
            # transaction): whether it was recorded is learnt on a new connection
            # (``_recovering``), never by running it again blindly.
            raise _CommitUnknown(exc, engine._backends.get(conn)) from None
        raise  # refused by the server: rolled back, nothing recorded
    _NotReplicated.check(backend, result)
    return result


def _recovering(
    engine: PostgresEngine,
    write: Write[T],
    unknown: _CommitUnknown,
    *,
    begin: tuple[str, ...],
    durable: bool,
) -> Steps[T]:
    """Learn whether a write whose ``COMMIT`` lost its connection was committed, on a new
    connection (to the new primary, after a failover): ``write.recover`` finds it, or its
    work runs again in the same transaction.

    A durable write's recovery takes a transaction id, so its own commit writes a commit
    record and waits for the server's durability (the WAL flushed, synchronous standbys
    answered): what it found was committed before it, in the same WAL, and is now at least
    as durable as a commit that had answered. Nothing is sent before it returns."""
    work, recover = write.work, write.recover
    assert recover is not None

    def confirm() -> Work[T]:
        lost = unknown.backend
        if lost is not None and lost.can_wait:
            # The same server may still be carrying the COMMIT out (only the connection was
            # cut): end that process and wait for it, so that what is read below is its
            # outcome. A new primary has no process of that pid and start.
            yield from one(_END_LOST_BACKEND, (_LOST_BACKEND_WAIT_MS, lost.pid, lost.started))
        if durable:
            yield from one("SELECT pg_current_xact_id()")
        found = yield from recover()
        return (yield from work()) if found is None else found

    reconnecting = engine._reconnection(unknown.cause)
    while True:
        try:
            result = yield from _transaction(
                engine, confirm, begin=begin, busy=write.busy, reconnecting=reconnecting
            )
        except _CommitUnknown as again:  # lost once more: ask again, while time remains
            reconnecting.cause = again.cause
            if (yield from _paused(reconnecting)):
                continue
            raise engine._commit_unknown(again, write.busy, reconnecting) from None
        logger.info(
            "journal %s: a write whose commit lost its connection was checked on a new "
            "connection after %.2fs; carrying on",
            engine.location,
            reconnecting.elapsed(),
        )
        return result


def _carried(work: Work[T], tx: _Pipeline | _Plain) -> Steps[T]:
    """``work``'s statements, each answered by ``tx``'s steps."""
    with contextlib.closing(work):
        try:
            statement = next(work)
            while True:
                statement = work.send((yield from tx.answer(statement)))
        except StopIteration as done:
            result: T = done.value
            return result


class _Plain:
    """Reads outside a transaction: only a ``Tx`` function's work (``InThread``)."""

    __slots__ = ("_tx",)

    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    def answer(self, statement: Statement | InThread) -> Steps[Any]:
        assert isinstance(statement, InThread), "a read is a Tx function's work"
        return (yield _InThread(statement.function, self._tx))


class _Pipeline:
    """A write transaction sent in as few round trips as its reads allow.

    What needs no answer yet (BEGIN, SET LOCAL, a ``send``, COMMIT) is queued in psycopg's
    pipeline mode and travels with the next statement whose answer is read, so a
    transaction of ``send`` and ``commit_with`` only is one round trip. A durable
    transaction that is one ``commit_with`` alone, or one whose statement sets its own
    durability (``whole``), is that statement in autocommit, its own transaction: no
    BEGIN, no COMMIT, no pipeline (each statement a pipeline carries costs the client a
    wait of its own). Statements are prepared on the server after a few uses on a
    connection (psycopg's ``prepare_threshold``), in the same round trip.

    The same steps on a thread's connection or an event loop's (``_Do`` and the like).
    """

    __slots__ = (
        "_begin",
        "_conn",
        "_cursor",
        "_pipeline",
        "_pipeline_mode",
        "committing",
        "dialect",
    )

    def __init__(self, conn: Any, dialect: sql.Dialect, begin: tuple[str, ...]) -> None:
        self._conn = conn
        self._cursor = conn.cursor()
        self.dialect = dialect
        self._begin = begin
        self._pipeline_mode: Any = None
        self._pipeline: Any = None
        self.committing = False
        """The commit has been sent: a connection lost from now on may have recorded it."""

    def _started(self) -> Steps[Any]:
        """The pipeline, BEGIN queued in it, entered at the first statement."""
        assert not self.committing, "nothing runs in a transaction after its commit"
        if self._pipeline is None:
            self._pipeline_mode = self._conn.pipeline()
            self._pipeline = yield _Enter(self._pipeline_mode)
            for statement in self._begin:
                yield _Do(self._cursor.execute, (statement, ()))
        return self._pipeline

    def answer(self, statement: Statement | InThread) -> Steps[Any]:
        """Run ``statement``; its answer, as its ``ask`` says."""
        if isinstance(statement, InThread):
            return (yield _InThread(statement.function, self))
        text, params, cursor = self.dialect.sql(statement.text), statement.params, self._cursor
        ask = statement.ask
        if ask is Ask.COMMIT_WITH:
            return (yield from self._commit_with(text, params, statement.whole))
        pipeline = yield from self._started()
        yield _Do(cursor.execute, (text, params))
        if ask is Ask.SEND:
            return None
        if ask is Ask.ONE:
            row = yield _Do(cursor.fetchone)
            return None if row is None else tuple(row)
        if ask is Ask.ALL:
            return [tuple(row) for row in (yield _Do(cursor.fetchall))]
        assert ask is Ask.EXECUTE
        yield _Do(pipeline.sync)  # a Sync inside BEGIN ends no transaction; it fetches the count
        return int(cursor.rowcount)

    def _commit_with(self, text: str, params: Sequence[Any], whole: bool) -> Steps[Finished]:
        final = self._conn.cursor()
        if self._pipeline is None and (whole or self._begin == _DURABLE):
            self.committing = True  # one statement, one transaction of its own
            yield _Do(final.execute, (text, params))
        else:
            yield from self._started()
            yield _Do(final.execute, (text, params))
            yield from self.commit()
        rows = [tuple(row) for row in (yield _Do(final.fetchall))] if final.description else []
        return Finished(final.rowcount, rows)

    def commit(self) -> Steps[None]:
        """Queue COMMIT and send what waits: one round trip. Raises what the server
        refused, or the loss of the connection (then whether it committed is unknown)."""
        if self.committing:
            return  # committed by commit_with
        self.committing = True
        mode, self._pipeline_mode, self._pipeline = self._pipeline_mode, None, None
        if mode is None:
            return  # nothing was sent: nothing to commit
        yield _Do(self._cursor.execute, ("COMMIT", ()))
        yield _Leave(mode)

    def abandon(self) -> Steps[None]:
        """Leave pipeline mode after a failure; the caller rolls back what is open."""
        mode, self._pipeline_mode, self._pipeline = self._pipeline_mode, None, None
        if mode is not None:
            # The error already raised is the one to tell; the rollback follows.
            with contextlib.suppress(psycopg.Error):
                yield _Leave(mode)


class _Pipelined(Tx):
    """A ``Tx`` function's view of a ``_Pipeline``, in a thread: each of its statements is
    the pipeline's steps, carried out at once (``run``: ``PostgresEngine._now``)."""

    __slots__ = ("_run", "_tx")

    def __init__(self, tx: _Pipeline, run: Callable[[Steps[Any]], Any]) -> None:
        super().__init__(tx._cursor, tx.dialect)
        self._tx = tx
        self._run = run

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        return int(self._run(self._tx.answer(Statement(Ask.EXECUTE, statement, params))))

    def send(self, statement: str, params: Sequence[Any] = ()) -> None:
        self._run(self._tx.answer(Statement(Ask.SEND, statement, params)))

    def one(self, statement: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._run(
            self._tx.answer(Statement(Ask.ONE, statement, params))
        )
        return row

    def all(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = self._run(
            self._tx.answer(Statement(Ask.ALL, statement, params))
        )
        return rows

    def commit_with(
        self, statement: str, params: Sequence[Any] = (), *, whole: bool = False
    ) -> Finished:
        finished: Finished = self._run(
            self._tx.answer(Statement(Ask.COMMIT_WITH, statement, params, whole))
        )
        return finished


class PostgresJournal(Journal):
    """A journal in a PostgreSQL database, shared by every host and thread that opens it.

    ``url`` is a libpq URL, ``postgresql://user:password@host:5432/dbname?sslmode=…``.
    ``schema`` (or ``?schema=name`` in the URL) keeps the journal's tables in a schema of
    their own, created on first open; by default they go where unqualified names resolve
    (usually ``public``). ``busy_timeout`` bounds every wait for a row lock or a pooled
    connection (not a commit's wait for a synchronous standby, nor, during a database
    outage, a wait for a connection, which ``failover_timeout`` bounds: see
    docs/postgres.md);
    ``pool_size`` is the most connections this journal holds at once.

    ``location`` is the URL without its password, which appears in no message or log.

    ``read_only`` runs every session with ``default_transaction_read_only``: the journal's
    tables and schema are never created or migrated and no lock is taken to migrate them, so
    it reads while writers hold rows. A journal of an older schema is read as it is; a read
    that needs what only a newer schema has raises ``JournalError`` saying so, and so do
    writes.

    ``failover_timeout`` bounds how long a write that lost its connection (a database
    restart, a failover to a standby: give several hosts and
    ``target_session_attrs=read-write`` in the URL) keeps looking for a primary before its
    caller gets a ``JournalError``; a write whose ``COMMIT`` lost its connection is looked
    for on the new primary before anything is decided. See docs/postgres.md.

    ``synchronous_settles`` commits settles, attempt ends and every other write made after a
    request was sent with the server's ``synchronous_commit`` too, instead of ``off``: with
    a synchronous standby, a failover then loses none of them (none is put back to
    ``pending``), for one WAL flush and standby round trip more per intent. Off by default:
    a settle lost with the old primary costs a replay by ``resume``, never a payment.
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
        failover_timeout: float = 30.0,
        synchronous_settles: bool = False,
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
                failover_timeout=failover_timeout,
                synchronous_settles=synchronous_settles,
            )
        )


class _Backend:
    """The server process a connection talks to: its pid and start, whether its server
    can wait for another process's end (``pg_terminate_backend`` with a timeout, 14+), and
    whether it said its last commit did not wait for the synchronous standby."""

    __slots__ = ("can_wait", "pid", "started", "unreplicated")

    def __init__(self, pid: int, started: object, server_version: int) -> None:
        self.pid = pid
        self.started = started
        self.can_wait = started is not None and server_version >= 140000
        self.unreplicated: str | None = None

    def hear(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        """The connection's notice handler: notes a cancelled wait for the standby."""
        if _unreplicated(diagnostic):
            self.unreplicated = f"WARNING: {diagnostic.message_primary}"


# What PostgreSQL says (as a WARNING, with the COMMIT's result) when a commit stops waiting
# for its synchronous standby: a pg_cancel_backend (01000), or a pg_terminate_backend or a
# fast shutdown (57P01). "The transaction has already committed locally, but might not have
# been replicated to the standby." The messages are matched in English (lc_messages=C or en).
_SYNC_REP_CANCELLED = (
    "canceling wait for synchronous replication",
    "canceling the wait for synchronous replication",
)


def _unreplicated(diagnostic: psycopg.errors.Diagnostic) -> bool:
    severity = diagnostic.severity_nonlocalized or diagnostic.severity
    message = diagnostic.message_primary or ""
    return severity == "WARNING" and message.startswith(_SYNC_REP_CANCELLED)


class _NotReplicated(Exception):
    """A durable commit the server kept on itself only: its synchronous wait was cancelled."""

    def __init__(self, result: object, said: str, lost: psycopg.Error | None = None) -> None:
        super().__init__(said)
        self.result = result
        self.said = said
        self.lost = lost
        """The connection, ended by the server right after it said so: no result read."""

    @classmethod
    def check(
        cls, backend: _Backend | None, result: object, *, lost: psycopg.Error | None = None
    ) -> None:
        """Raise when the server said this durable transaction's commit stopped waiting for
        the synchronous standby: committed on the primary only (with the COMMIT's result:
        a ``pg_cancel_backend``), or, when ``lost``, just before ending the session (a
        ``pg_terminate_backend``, a fast shutdown). Not durable: a failover now would lose
        it, so nothing may be sent on the strength of it."""
        if backend is not None and backend.unreplicated is not None:
            raise cls(result, backend.unreplicated, lost=lost)


class _CommitUnknown(Exception):
    """The connection was lost during ``COMMIT``: the write may or may not be recorded."""

    def __init__(self, cause: psycopg.Error, backend: _Backend | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.backend = backend


class _Reconnection:
    """One caller's search for a primary after its connection was lost: bounded in time."""

    def __init__(
        self, cause: psycopg.Error, timeout: float, location: str, *, deadline: float | None = None
    ) -> None:
        self.cause = cause
        self._began = time.monotonic()
        self._deadline = self._began + timeout if deadline is None else deadline
        self._tries = 0
        self._location = location
        self._ended = False

    def joined(self) -> _Reconnection | None:
        """This search, for another call caught in the same outage: its cause and deadline.
        None once it has found a primary or run out of time."""
        if self._ended or time.monotonic() >= self._deadline:
            return None
        return _Reconnection(self.cause, 0.0, self._location, deadline=self._deadline)

    def pause(self) -> float | None:
        """How long to pause before the next try; None once the deadline has passed."""
        pause = _RECONNECT_PAUSES[min(self._tries, len(_RECONNECT_PAUSES) - 1)]
        self._tries += 1
        left = self._deadline - time.monotonic()
        return None if left <= 0 else min(pause, left)

    def pool_wait(self) -> float:
        """How long to wait for the pool before looking for a primary alone."""
        return max(0.05, min(_POOL_WAIT_RECONNECTING, self._deadline - time.monotonic()))

    def elapsed(self) -> float:
        return time.monotonic() - self._began

    def over(self) -> None:
        self._ended = True
        logger.info("journal %s: reconnected after %.2fs", self._location, self.elapsed())


def _then_resume(then: Unwritten) -> Unwritten:
    """``then``, followed by what brings every intent caught in the gap to its end."""
    return Unwritten(
        f"{then.words}; once the database answers again, payonce resume (or client.resume()) "
        "settles every intent left pending",
        may_have_executed=then.may_have_executed,
        retry_later=then.retry_later,
    )


# -- the driver's own log lines --------------------------------------------------------------

_routing = threading.local()
_TARGETS: weakref.WeakSet[Target] = weakref.WeakSet()
"""Every open engine's URL, whose passwords no routed record may carry."""
_routed_once = threading.Lock()
_ROUTED: list[bool] = []


class _PayoncePoolRecords(logging.Filter):
    """Takes psycopg_pool's records about payonce's pools ("error connecting … session is
    read-only", "discarding broken connection") out of its logger and into payonce's, at
    DEBUG: reconnecting during a failover is expected, and its outcome is payonce's to
    tell (a reconnection's duration at INFO, a caller's ``JournalError``). Without this a
    program that configured no logging would print them on stderr. Other pools' records are
    left alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.threadName is not None and record.threadName.startswith(_POOL_NAME)
        if not (ours or getattr(_routing, "active", False)):
            return True
        text = record.getMessage()
        for target in list(_TARGETS):
            text = target.redact(text)
        logger.debug("journal connection pool: %s", text)
        return False


def _route_driver_logs() -> None:
    with _routed_once:
        if not _ROUTED:
            logging.getLogger("psycopg.pool").addFilter(_PayoncePoolRecords())
            _ROUTED.append(True)


class _driver_logs_routed:
    """While payonce's own thread uses its pool, the pool's records are payonce's."""

    def __enter__(self) -> None:
        self._was = getattr(_routing, "active", False)
        _routing.active = True

    def __exit__(self, *exc: object) -> None:
        _routing.active = self._was


def _unreachable(exc: psycopg.Error) -> bool:
    """Whether a connection ``exc`` refused is worth trying again: no server answered
    (refused, unreachable, timed out), libpq found no primary among the hosts, or the
    server said it is starting up, shutting down or recovering. A server's other refusal
    (a wrong password, an unknown database) stands."""
    text = str(exc)
    return "FATAL:" not in text or any(words in text for words in _NOT_READY)


# What a server starting, stopping or recovering answers a new connection (SQLSTATE 57P03
# and the like, which libpq's connection errors do not carry).
_NOT_READY = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
)


def _server_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is the server's answer refusing a statement (which it then rolled
    back), as opposed to a connection lost or ended by the server's operator."""
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and not state.startswith(("08", "57"))


# -- the async edge: writes on the event loop --------------------------------------------------


class _AsyncEdge:
    """One event loop's writes to a PostgreSQL journal, on async connections of its own:
    an ``AsyncClient``'s journal commands run on its loop, with no journal thread between.

    The engine's own transactions (the one driver, ``_committing``: only the steps' I/O is
    this edge's, ``_carry_out``), the same statements (a plan's ``Write``), the same
    failover promise: a connection lost before
    the commit runs the write again on a new one, within ``failover_timeout``; one lost
    during the commit is looked for on a new connection (``recover``) before anything is
    decided; a caller in the gap gets the same truthful ``JournalError``.

    Connections are made on demand, at most ``pool_size`` for this loop, kept idle for the
    next write and never shared with another loop or thread: there is no background task,
    so a loop that ends leaves nothing running, and its idle connections are finished by
    the next loop's first write or by ``close()``. (psycopg_pool's ``AsyncConnectionPool``
    binds its workers to the loop that opened it; an ``AsyncClient`` used by
    ``asyncio.run`` twice, or by a test framework's loop per test, would need it reopened
    on each.) Acknowledgements flushed by the flusher thread, and everything that is not a
    plan's ``Write``, go through the engine's thread-safe pool as before."""

    __slots__ = ("_engine", "_idle", "_slots")

    def __init__(self, engine: PostgresEngine) -> None:
        self._engine = engine
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots = asyncio.Semaphore(engine._pool_size)

    # -- what a plan's driver calls ----------------------------------------------------------

    async def write(self, write: Write[T]) -> T:
        """Carry ``write`` out on this loop. A caller cancelled meanwhile does not cut it
        short: like a journal thread's, the write runs to its end (shielded), so that a
        settle is not lost to a caller's timeout."""
        task = asyncio.ensure_future(self._write(write))
        task.add_done_callback(_retrieved)
        return await asyncio.shield(task)

    async def _write(self, write: Write[T]) -> T:
        engine = self._engine
        write, taken = engine._writing(write)
        started = time.perf_counter() if engine._commit_watchers else None
        try:
            result = await _driven(_committing(engine, write), self._carry_out)
        except BaseException:
            engine._not_written(taken)
            raise
        if started is not None:
            engine._committed(started, write.durable)
        return result

    async def aclose(self) -> None:
        """Close this loop's idle connections (a client closing its own journal)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

    def finish(self) -> None:
        """Close the idle connections from any thread: their loop is gone or the journal
        is closing (closing one needs no loop: it ends its socket)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    # -- the I/O edge of a loop: the shared driver's steps, awaited -------------------------------

    async def _carry_out(self, step: _Step) -> Any:
        """One step, awaited on this loop."""
        if type(step) is _Do:  # the most frequent first
            return await step.function(*step.args)
        match step:
            case _Enter(mode):
                return await mode.__aenter__()
            case _Leave(mode):
                return await mode.__aexit__(None, None, None)
            case _Take(wait):
                return await self._take(wait)
            case _Give(conn, alone):
                return await (conn.close() if alone else self._put(conn))
            case _Alone():
                try:
                    return await self._connect()
                except psycopg.Error as exc:
                    return exc
            case _Forget():
                return self.finish()  # the other idle connections died with one
            case _Pause(seconds):
                return await asyncio.sleep(seconds)
        raise AssertionError(f"no step {step!r} on an event loop")

    async def _take(
        self, wait: float | None
    ) -> psycopg.AsyncConnection[Any] | psycopg.Error | None:
        """An idle connection of this loop's, or a new one; what the database answered when
        it refused a new one (then the slot taken is given back); None when every slot
        stayed in use for ``wait`` seconds (None: the busy timeout, as the pool's)."""
        if self._slots.locked():  # all in use: wait for one, as long as the pool would
            try:
                async with asyncio.timeout(self._engine._busy_timeout if wait is None else wait):
                    await self._slots.acquire()
            except TimeoutError:
                return None
        else:
            await self._slots.acquire()  # free: taken at once, without a timer
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        try:
            return await self._connect()
        except psycopg.Error as exc:
            self._slots.release()
            logger.debug(
                "journal %s: no connection yet (%s)",
                self._engine.location,
                self._engine._describe(exc),
            )
            return exc
        except BaseException:
            self._slots.release()
            raise

    async def _put(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Give a connection back: kept idle if it is usable and this loop still writes."""
        try:
            if conn.closed:
                return
            if not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE:
                self._idle.append(conn)
            else:
                await conn.close()
        finally:
            self._slots.release()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        engine = self._engine
        conn = await psycopg.AsyncConnection.connect(
            engine._target.conninfo, **engine._connect_options
        )
        try:
            conn.add_notice_handler(engine._notice)
            sent = time.time()
            cursor = await conn.execute(_SESSION, engine._session_settings())
            row = await cursor.fetchone()
            if engine._configured(conn, row, sent, time.time()):
                await conn.execute(_SYNCHRONOUS_COMMIT_ON)
        except BaseException:
            await conn.close()
            raise
        return conn


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A shielded write whose caller went away: its error is not left unretrieved."""
    if not task.cancelled():
        task.exception()
