"""Journal writes as plans: what a write says and decides, apart from how it reaches the
database, so that one write runs through a thread's connection or on an event loop alike.

A write's work is a generator (``Work``) that yields ``Statement`` objects and receives each
one's answer, in the manner of the drive (``_lifecycle._drive``): the SQL and every decision
on what the rows say exist once. A ``Write`` is such work with its durability, what its
caller may conclude if it cannot be made (``busy``) and, for a commit whose outcome was
lost with its connection, ``recover``: work that reads back whether it was recorded (see
``Engine.write``).

An operation made of several writes, or of a write and what is told around it, is a
``Plan``: a generator yielding ``Write`` objects (answered with what each returned) and
``Call`` objects (a blocking call the plan has no async form of yet: answered with its return).
Two drivers carry plans out: ``Engine.carry_out`` in the caller's thread (every backend;
each ``Write`` through ``Engine.write_planned``), and an engine's ``AsyncEdge`` on an event
loop (PostgreSQL's, in ``_postgres``: each ``Write`` on an async connection, each ``Call``
in a journal thread). SQLite has no async edge: sqlite3 has no async API, so an
``AsyncClient`` reaches it through its journal threads.

A write not yet written as statements (a function of a ``Tx``, ``Engine.write``'s) is work
too: ``threaded(function)`` yields one ``InThread`` that a thread's driver answers by calling
it with the transaction's ``Tx``, so that every write reaches a backend in one form.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import attrs

from .._lifecycle import IntentRecord, Unwritten
from . import _sql as sql
from ._rows import intent_from_row

__all__ = [
    "Ask",
    "AsyncEdge",
    "Call",
    "InThread",
    "Plan",
    "Statement",
    "Statements",
    "Work",
    "Write",
    "all_rows",
    "commit_with",
    "execute",
    "one",
    "run_on",
    "selected",
    "send",
    "threaded",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Ask(enum.Enum):
    """What a statement's answer is wanted for (the ``Tx`` method that runs it)."""

    ONE = "one"
    """The first row, or None: answered at once (on a server, a round trip)."""
    ALL = "all"
    EXECUTE = "execute"
    """The count of rows it changed: answered at once."""
    SEND = "send"
    """No answer needed before the commit: rides with the next statement."""
    COMMIT_WITH = "commit_with"
    """The transaction's last statement, answered with its commit (a ``Finished``)."""


@attrs.frozen(slots=True)
class Statement:
    """One statement of a write's work, in the shared ``?`` SQL."""

    ask: Ask
    text: str
    params: Sequence[Any] = ()
    whole: bool = False
    """``COMMIT_WITH`` only: the statement sets its own commit's durability (``Tx``)."""


@attrs.frozen(slots=True)
class InThread:
    """Work written as a function of a ``Tx`` (``Engine.write``'s): answered with what it
    returns, called in the thread that carries the transaction out (never on a loop)."""

    function: Callable[[Any], Any]


Work = Generator["Statement | InThread", Any, T]
"""A write's work: yields statements, receives their answers, returns its result."""


def threaded(function: Callable[[Any], T]) -> Callable[[], Work[T]]:
    """``function(tx)`` as work: one ``InThread``, answered with what it returns."""

    def work() -> Work[T]:
        result: T = yield InThread(function)
        return result

    return work


def one(text: str, params: Sequence[Any] = ()) -> Work[tuple[Any, ...] | None]:
    row: tuple[Any, ...] | None = yield Statement(Ask.ONE, text, params)
    return row


def all_rows(text: str, params: Sequence[Any] = ()) -> Work[list[tuple[Any, ...]]]:
    rows: list[tuple[Any, ...]] = yield Statement(Ask.ALL, text, params)
    return rows


def execute(text: str, params: Sequence[Any] = ()) -> Work[int]:
    """The count of rows the statement changed."""
    count: int = yield Statement(Ask.EXECUTE, text, params)
    return count


def send(text: str, params: Sequence[Any] = ()) -> Work[None]:
    yield Statement(Ask.SEND, text, params)


def commit_with(text: str, params: Sequence[Any] = (), *, whole: bool = False) -> Work[Any]:
    """The last statement, with the commit: its ``Finished`` (rowcount, rows)."""
    return (yield Statement(Ask.COMMIT_WITH, text, params, whole))


def selected(
    dialect: sql.Dialect, where: str, params: Sequence[Any], *, lock: bool = False
) -> Work[IntentRecord | None]:
    """The intent ``where`` finds (``_intents.select_intent`` as work)."""
    suffix = dialect.lock_rows if lock else ""
    row = yield from one(sql.SELECT_INTENT + where + suffix, params)
    return intent_from_row(row) if row else None


class Statements(Protocol):
    """What runs a statement in a thread: the engine's ``Tx``."""

    def one(self, statement: str, params: Sequence[Any] = ()) -> Any: ...

    def all(self, statement: str, params: Sequence[Any] = ()) -> Any: ...

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any: ...

    def send(self, statement: str, params: Sequence[Any] = ()) -> Any: ...

    def commit_with(
        self, statement: str, params: Sequence[Any] = (), *, whole: bool = ...
    ) -> Any: ...


def run_on(tx: Statements, work: Work[T]) -> T:
    """Carry ``work`` out in ``tx``, each statement as its ask says."""
    answer: Any = None
    try:
        while True:
            try:
                statement = work.send(answer)
            except StopIteration as done:
                result: T = done.value
                return result
            if isinstance(statement, InThread):
                answer = statement.function(tx)
                continue
            match statement.ask:
                case Ask.SEND:
                    answer = tx.send(statement.text, statement.params)
                case Ask.ONE:
                    answer = tx.one(statement.text, statement.params)
                case Ask.COMMIT_WITH:
                    answer = tx.commit_with(statement.text, statement.params, whole=statement.whole)
                case Ask.EXECUTE:
                    answer = tx.execute(statement.text, statement.params)
                case Ask.ALL:
                    answer = tx.all(statement.text, statement.params)
    finally:
        work.close()


@attrs.frozen(slots=True)
class Write(Generic[T]):
    """One write transaction, as data (see ``Engine.write`` for each field's meaning)."""

    work: Callable[[], Work[T]]
    """A fresh generator of the work each time it is called: a write may run again."""
    durable: bool
    busy: Unwritten
    recover: Callable[[], Work[T | None]] | None = None

    def acknowledging(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> Write[T]:
        """This write with ``statements`` (acknowledgements waiting in memory) sent first,
        in its transaction and in its recovery's."""
        work, recover = self.work, self.recover

        def both() -> Work[T]:
            for text, params in statements:
                yield from send(text, params)
            return (yield from work())

        def recovering() -> Work[T | None]:
            assert recover is not None
            for text, params in statements:
                yield from send(text, params)
            return (yield from recover())

        return Write(both, self.durable, self.busy, None if recover is None else recovering)


@attrs.frozen(slots=True)
class Call(Generic[T]):
    """A blocking journal call inside a plan: on an event loop, it runs in a journal
    thread. What has no ``Write`` form yet (rare writes, reads)."""

    function: Callable[[], T]


Plan = Generator["Write[Any] | Call[Any]", Any, T]
"""An operation of writes and calls: yields them, receives what each returned."""


class AsyncEdge(Protocol):
    """An engine's writes on the running event loop."""

    async def write(self, write: Write[T]) -> T: ...

    async def aclose(self) -> None:
        """Close what this loop holds open (its idle connections)."""
