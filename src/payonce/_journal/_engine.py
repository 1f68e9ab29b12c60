"""A journal's engine: one backend's transactions, and what every backend shares.

Everything the journal does is written in terms of two transaction runners:
``write(work, durable=…, busy=…)`` runs ``work(tx)`` in one read-then-write transaction
(durably committed or not), ``read(work)`` runs it for reading; ``write_planned(write)``
runs a plan's ``Write`` (``_plans``), the form every write reaches a backend in. They are
here, around what a backend provides (``_commit`` and ``_query``), so that every write carries the
acknowledgements waiting in memory (``_acks``) and every read sees them. A backend
(``_sqlite.SQLiteEngine``, ``_postgres.PostgresEngine``) adds only what is its own:
connecting, opening and checking, locking, durability settings and the translation of its
driver's errors. The engine decides nothing about an intent: the private store
(``_store.IntentStore``), the webhook inbox's writes (``_inbox.Inbox``) and the public
``_reads.Journal`` each hold one and run their work in it.

Inside ``write`` every row read with ``lock=True`` stays locked until the commit (SQLite
holds the whole database with ``BEGIN IMMEDIATE``; PostgreSQL locks the rows with ``FOR
UPDATE``), so a lease tested here cannot change hands before the write that relies on it.
"""

from __future__ import annotations

import abc
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs

from .._lifecycle import (
    LOOKUP_UNRECORDED,
    MAY_HAVE_EXECUTED,
    NOTHING_CHANGED,
    NOTHING_SENT,
    Unwritten,
)
from .._version import __version__
from ..errors import JournalBusy, JournalError
from . import _sql as sql
from ._acks import PendingAcknowledgements, acknowledgements, flusher
from ._plans import AsyncEdge, Plan, Write, threaded
from ._reports import JournalCommitted
from ._schema import APPLICATION, SCHEMA_VERSION, parts_at

__all__ = [
    "AFTER_LOOKUP",
    "AFTER_SEND",
    "BEFORE_SEND",
    "FOREIGN_KEY_DAMAGE",
    "NOT_A_JOURNAL_YET",
    "NO_SEND",
    "Cursor",
    "Engine",
    "Finished",
    "Tx",
    "migrate",
    "schema_found",
]

T = TypeVar("T")

logger = logging.getLogger("payonce")

_ACKS_CREATED = threading.Lock()

# What a caller may conclude when a write could not be made: a transition's own is its
# rule's (``rule(transition).unwritten``); these name the writes no transition stands for.
BEFORE_SEND = NOTHING_SENT
AFTER_SEND = MAY_HAVE_EXECUTED
NO_SEND = NOTHING_CHANGED
AFTER_LOOKUP = LOOKUP_UNRECORDED
FOREIGN_KEY_DAMAGE = "foreign key violation"
"""How a storage check words a row that lost the row it points to: the file itself reads."""
NOT_A_JOURNAL_YET = (
    "not a payonce journal yet: it has no payonce tables (an empty file, say). A payonce "
    "client creates them when it first opens it to write; a read-only open never does, and "
    "left it as it was"
)


class Cursor(Protocol):
    """What the journal needs of a DB-API cursor (sqlite3's and psycopg's both fit)."""

    def execute(self, statement: str, parameters: Sequence[Any], /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...


@attrs.frozen
class Finished:
    """What the last statement of a transaction returned, read once it committed."""

    rowcount: int
    rows: list[tuple[Any, ...]]


class Tx:
    """One transaction's cursor, speaking the shared ``?`` statements in its dialect.

    ``one``, ``all`` and ``execute`` answer at once: on a server (PostgreSQL) each costs a
    round trip. ``send`` (a write whose answer nobody reads) and ``commit_with`` (the
    transaction's last statement, answered with its commit) cost none of their own: a
    transaction made only of them reaches the server as one round trip (see
    ``_postgres``). Here, in-process (SQLite), all of them simply run.
    """

    __slots__ = ("_cursor", "dialect")

    def __init__(self, cursor: Cursor, dialect: sql.Dialect) -> None:
        self._cursor = cursor
        self.dialect = dialect

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; the number of rows it changed."""
        self._cursor.execute(self.dialect.sql(statement), params)
        return int(self._cursor.rowcount)

    def send(self, statement: str, params: Sequence[Any] = ()) -> None:
        """Run a write whose answer is not needed before the commit (an error in it still
        fails the transaction)."""
        self._cursor.execute(self.dialect.sql(statement), params)

    def commit_with(
        self, statement: str, params: Sequence[Any] = (), *, whole: bool = False
    ) -> Finished:
        """Run the transaction's last statement and commit; what it returned. Nothing may
        run in this transaction after it. ``whole``: the statement sets its own commit's
        durability, so when nothing ran before it, it may run as a transaction of its own
        (on a server: alone, without BEGIN or COMMIT)."""
        self._cursor.execute(self.dialect.sql(statement), params)
        return Finished(int(self._cursor.rowcount), [tuple(row) for row in self._cursor.fetchall()])

    def one(self, statement: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self._cursor.execute(self.dialect.sql(statement), params)
        row = self._cursor.fetchone()
        return None if row is None else tuple(row)

    def all(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._cursor.execute(self.dialect.sql(statement), params)
        return [tuple(row) for row in self._cursor.fetchall()]


def schema_found(tx: Tx, *, refuse: Callable[[str], JournalError]) -> int:
    """The schema version of the journal ``tx`` reads: 0 when it has no payonce tables yet.

    ``refuse(message)`` makes the error raised for a store that belongs to another
    application or to a newer payonce.
    """
    if tx.one(tx.dialect.has_relation, ("payonce_meta",)) is None:
        return 0
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
    return version


def migrate(tx: Tx, *, target: int = SCHEMA_VERSION, refuse: Callable[[str], JournalError]) -> int:
    """Bring the journal's schema to ``target`` inside the caller's transaction.

    Returns the version found. ``refuse(message)`` makes the error raised for a store that
    belongs to another application or to a newer payonce; nothing is written then.
    """
    version = schema_found(tx, refuse=refuse)
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


class Engine(abc.ABC):
    """One backend's transactions: what the store, the inbox and the public ``Journal``
    run their work in, each holding the same engine.

    A backend provides ``_commit`` and ``_query`` (its own transactions, locking,
    durability settings and the translation of its driver's errors), its location, close
    and backup, and the few facts ``check`` asks of its storage. The rest is here, once:
    the transaction runners ``write`` and ``read`` with the acknowledgements waiting in
    memory and the commit watchers, the read-only refusal, the errors' wording, and the
    schema check every open makes.
    """

    dialect: sql.Dialect
    read_only: bool = False
    """Opened with ``read_only=True``: never created, migrated or written through."""
    settles_synchronously: bool = False
    """Every write waits for the server's durability, settles too (PostgreSQL's
    ``synchronous_settles``): a statement that would set its own lazy commit must not."""
    _schema_version: int = SCHEMA_VERSION

    @property
    def schema_version(self) -> int:
        """A writer migrates the journal to this payonce's schema on open; a read-only
        journal keeps the version it was found at (0: no payonce tables yet)."""
        return self._schema_version

    @schema_version.setter
    def schema_version(self, version: int) -> None:
        self._schema_version = version
        # A read-only journal of an older schema lacks the columns added since: its reads
        # say NULL in their place.
        self.dialect = type(self).dialect.reading_schema(version)

    _commit_watchers: tuple[Callable[[JournalCommitted], None], ...] = ()

    @property
    def clock_offset(self) -> float:
        """Seconds to add to this host's wall clock to read the journal's clock, the one
        every host sharing the journal dates and judges leases and attempts by: a
        PostgreSQL server's (measured on each new connection, and carried between them by
        this host's monotonic clock), this host's for SQLite (0)."""
        return 0.0

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the journal lives (a path or a URL without credentials)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def backup(self, destination: str | os.PathLike[str]) -> Path:
        """A consistent copy at ``destination`` (see ``Journal.backup``)."""

    # -- what a backend provides ------------------------------------------------------------

    @abc.abstractmethod
    def _commit(self, write: Write[T]) -> T:
        """Run ``write`` in one read-then-write transaction and commit it (see
        ``write_planned``)."""

    @abc.abstractmethod
    def _query(self, work: Callable[[Tx], T], *, snapshot: bool) -> T:
        """Run ``work`` for reading (see ``read``)."""

    @abc.abstractmethod
    def storage_problems(self, tx: Tx) -> list[str]:
        """The backend's own integrity findings, for ``check``."""

    @abc.abstractmethod
    def size_bytes(self, tx: Tx) -> int: ...

    @abc.abstractmethod
    def present_columns(self, tx: Tx, table: str) -> set[str]:
        """The columns ``table`` has, or an empty set when there is no such table."""

    @abc.abstractmethod
    def between_batches(self, seconds: float) -> None:
        """After a prune batch that held the journal ``seconds``: let writers in."""

    # -- the transaction runners ----------------------------------------------------------

    def write(self, work: Callable[[Tx], T], *, durable: bool, busy: Unwritten) -> T:
        """Run ``work`` in one read-then-write transaction and commit it.

        ``durable`` commits survive an operating-system crash before this returns; the
        others survive a crash of the process. ``busy`` ends the message of the
        ``JournalBusy`` raised when the journal stayed locked past the busy timeout. A
        commit whose outcome a backend cannot know (PostgreSQL: the connection lost during
        ``COMMIT``, a failover) raises ``JournalError`` saying so: a write that can tell
        whether it was recorded is a plan's ``Write`` with a ``recover`` (``write_planned``).
        """
        return self.write_planned(Write(threaded(work), durable, busy))

    def write_planned(self, write: Write[T]) -> T:
        """Carry ``write`` (a plan's ``Write``) out in this thread, in one transaction.

        ``write.recover`` is for a commit whose outcome a backend cannot know: in a new
        transaction on a new connection, it returns what ``work`` returned if ``work`` was
        committed, or None if it was not, and then ``work`` runs again in that transaction.
        A write without one raises ``JournalError`` saying its outcome is unknown.

        The acknowledgements waiting in memory go first in the same transaction, so the
        work reads them; if it does not commit, they wait again."""
        write, taken = self._writing(write)
        try:
            if self._commit_watchers:
                return self._timed_write(lambda: self._commit(write), write.durable)
            return self._commit(write)
        except BaseException:
            self._not_written(taken)
            raise

    def carry_out(self, plan: Plan[T]) -> T:
        """Carry ``plan`` out in this thread: each ``Write`` through ``write``, each
        ``Call`` called. What a step raises ends the plan and is raised."""
        answer: Any = None
        try:
            while True:
                try:
                    step = plan.send(answer)
                except StopIteration as done:
                    result: T = done.value
                    return result
                answer = self.write_planned(step) if isinstance(step, Write) else step.function()
        finally:
            plan.close()

    def async_edge(self) -> AsyncEdge | None:
        """What carries this engine's writes out on the running event loop, or None
        where a journal thread must (no async driver, or not for this loop)."""
        return None

    def _writing(self, write: Write[T]) -> tuple[Write[T], dict[str, float] | None]:
        """``write`` as an async edge sends it: refused on a read-only journal, with the
        acknowledgements waiting in memory first (``write``'s rules). The keys taken are
        given back to ``_not_written`` if it does not commit."""
        self._refuse_writes()
        acks = self._acks
        taken = acks.take() if acks is not None else None
        if taken is not None:
            write = write.acknowledging(acknowledgements(taken))
        return write, taken

    def _not_written(self, taken: dict[str, float] | None) -> None:
        if taken is not None and self._acks is not None:
            self._acks.restore(taken)

    def _committed(self, started: float, durable: bool) -> None:
        """Tell the commit watchers of a write that began at ``started`` (perf_counter)."""
        event = JournalCommitted(self.location, time.perf_counter() - started, durable)
        for watcher in self._commit_watchers:
            watcher(event)

    def read(self, work: Callable[[Tx], T], *, snapshot: bool = False) -> T:
        """Run ``work`` for reading; ``snapshot`` makes its statements see one instant.
        Acknowledgements waiting in memory are written first: this engine reads its own."""
        if self._acks:
            self.flush_acknowledgements()
        return self._query(work, snapshot=snapshot)

    # -- acknowledgements of blocks, written lazily (see ``_acks``) ---------------------------

    _acks: PendingAcknowledgements | None = None

    def acknowledge_later(self, key: str, *, now: float) -> None:
        """Acknowledge the settled intent ``key`` in this engine's next write transaction
        (or within ``_acks.FLUSH_DELAY`` seconds, at ``close()``, at exit): no transaction
        of its own. A crash before then leaves it unacknowledged, listed by ``ack --list``."""
        if self._acks is None:
            with _ACKS_CREATED:
                if self._acks is None:
                    self._acks = PendingAcknowledgements()
        self._acks.add(key, now)
        flusher.schedule(self)

    def flush_acknowledgements(self) -> None:
        """Write the waiting acknowledgements now, in a transaction of their own. Never
        raises: one not written stays unacknowledged (the safe side) and waits for the next
        write."""
        if not self._acks:
            return
        try:
            self.write(_nothing, durable=False, busy=NO_SEND)
        except Exception as exc:  # busy, closed, gone: the next write carries them
            logger.warning(
                "acknowledgements of finished blocks not written yet to the journal %s (%s);"
                " until a later write carries them, those intents are listed as not "
                "acknowledged",
                self.location,
                exc,
            )

    # -- commit latency, for hooks ----------------------------------------------------------

    def watch_commits(self, watcher: Callable[[JournalCommitted], None]) -> None:
        """Tell ``watcher`` of every write transaction committed from now on."""
        self._commit_watchers = (*self._commit_watchers, watcher)

    def unwatch_commits(self, watcher: Callable[[JournalCommitted], None]) -> None:
        self._commit_watchers = tuple(w for w in self._commit_watchers if w is not watcher)

    def _timed_write(self, write: Callable[[], T], durable: bool) -> T:
        """``write()``, timed for the watchers (called only when there are some)."""
        started = time.perf_counter()
        result = write()
        self._committed(started, durable)
        return result

    # -- errors ----------------------------------------------------------------------------

    def error(
        self, what: str, *, busy: bool = False, then: Unwritten | None = None
    ) -> JournalError:
        """The error to raise; ``then`` is what the caller may conclude, said after
        ``what``: whether a request may have reached the provider is ``then``'s."""
        cls = JournalBusy if busy else JournalError
        message = f"{what}; {then.words}" if then else what
        if busy and then is not None and then.retry_later:
            message += ". Retry later"  # a lock or a pool frees itself; damage does not
        return cls(
            f"{message} (journal: {self.location})",
            location=self.location,
            may_have_executed=then is not None and then.may_have_executed,
        )

    def _refuse(self, kind: str) -> Callable[[str], JournalError]:
        return lambda why: self.error(f"this {kind} is not a usable payonce journal: {why}")

    def _refuse_writes(self) -> None:
        if self.read_only:
            raise self.error(
                "this journal was opened read-only: open it again without read_only=True "
                "to change it"
            )

    def _cannot_read(self) -> JournalError | None:
        """Why a read of a read-only journal found a table or column missing, when its
        schema says why: none yet, or an older one this payonce would have migrated."""
        if not self.read_only or self.schema_version >= SCHEMA_VERSION:
            return None  # the parts its schema promises are gone: damage, said as such
        if self.schema_version == 0:
            return self.error(NOT_A_JOURNAL_YET)
        return self.error(
            f"the journal has schema {self.schema_version}, older than this read needs "
            f"(this payonce writes schema {SCHEMA_VERSION}), and a read-only open never "
            "migrates it: run payonce journal migrate, or let a payonce client open it, "
            "which migrates it, then read it again"
        )

    # -- the schema's parts ------------------------------------------------------------------

    def missing_parts(self, tx: Tx) -> list[str]:
        """What the statements need, the journal's schema version promises, and the journal
        lacks (nothing, for an intact one). An older schema's journal does not lack what
        only later migrations add: a writer adds it when it opens the journal."""
        promised = parts_at(self.schema_version)
        problems = []
        for table, needed in sql.needed_columns().items():
            owed = [c for c in needed if c in promised.columns.get(table, ())]
            if not owed:
                continue
            present = self.present_columns(tx, table)
            if not present:
                problems.append(f"table {table} is missing")
            elif missing := [c for c in owed if c not in present]:
                problems.append(f"table {table} lacks column(s) {', '.join(missing)}")
        problems += [
            f"index {index} is missing"
            for index in sql.NEEDED_INDEXES
            if index in promised.indexes and tx.one(tx.dialect.has_relation, (index,)) is None
        ]
        return problems

    def _verify(self, tx: Tx) -> None:
        """Refuse a journal whose schema version promises parts it does not have."""
        if problems := self.missing_parts(tx):
            raise self.error(
                f"the journal is damaged ({'; '.join(problems[:3])}); restore it from a "
                "backup or move it away to start a new one"
            )


def _nothing(tx: Tx) -> None:
    """The work of a transaction that only carries acknowledgements."""
