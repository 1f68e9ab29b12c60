"""Group commit: the writes of a SQLite journal's threads share transactions and fsyncs.

One connection writes for every thread of the process. A write that finds no other queued
commits alone, exactly as without group commit. Writes that arrive while another is
committing queue up; the first in the queue then leads them all in one ``BEGIN IMMEDIATE``
transaction, committed with ``synchronous=FULL`` if any of them needs durability. No
caller is answered before that commit has returned, so a write-ahead record is still
fsynced before its request is sent, and an fsync is shared by the whole batch. A caller's
refusal or error is raised to that caller only, and only its own writes are undone: the
batch is then run again with each caller's work in a savepoint of its own (the first run
goes without them, which saves two statements per caller when none fails). A failure of
the transaction as a whole runs every member again alone. Several processes on one file
still serialise on SQLite's own lock, each with its own batches.

``GroupCommit`` is a helper the SQLite engine owns (one per engine, a new one in a child
after a fork): it holds the queue, and reaches the engine's connection, lock and lone
writes through ``Connection``.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from .._lifecycle import Unwritten
from ..errors import JournalError
from . import _sql as sql
from ._engine import Tx

__all__ = ["Connection", "GroupCommit", "Member"]

T = TypeVar("T")

_MAX_BATCH = 256
"""The most writes one group commit takes: bounds the wait of the batch's last member."""


class _BatchAborted(Exception):
    """SQLite rolled the whole batch transaction back on a member's statement."""


class _MemberFailed(Exception):
    """A member's work raised in a batch run without savepoints: run it again with them."""


class _Ended(enum.Enum):
    """How a batch's transaction ended."""

    ANSWERED = "every member has its answer (committed, or refused for them all)"
    ISOLATE = "rolled back because a member raised: run again, a savepoint per member"
    ALONE = "rolled back as a whole by SQLite: run each member alone"


class Member(Generic[T]):
    """One caller's write waiting in the group-commit queue, and then its answer."""

    __slots__ = ("busy", "done", "durable", "error", "finished", "result", "wake", "work")

    def __init__(self, work: Callable[[Tx], T], durable: bool, busy: Unwritten) -> None:
        self.work = work
        self.durable = durable
        self.busy = busy
        self.result: T | None = None
        self.error: BaseException | None = None
        self.finished = False
        """Its transaction has ended (committed, or failed for it alone): the answer stands."""
        self.done = False
        """The answer has been handed over; read by the member's own thread once woken."""
        self.wake = threading.Lock()
        self.wake.acquire()

    def fail(self, error: BaseException) -> None:
        self.error = error

    def reset(self) -> None:
        self.result, self.error, self.finished = None, None, False

    def outcome(self) -> T:
        if self.error is not None:
            error, self.error = self.error, None  # no reference cycle through the traceback
            raise error
        return self.result  # type: ignore[return-value]


_SOLO: Member[None] = Member(lambda tx: None, False, Unwritten(""))
"""Holds the head of the queue while a write commits alone (no one else was queued)."""


def _wait(wake: threading.Lock) -> BaseException | None:
    """Block until woken. An interrupt (Ctrl-C) is held back until then, and returned: a
    member that gave up waiting could be the next leader, and the queue would stall."""
    interrupted: BaseException | None = None
    while True:
        try:
            wake.acquire()
        except BaseException as exc:
            interrupted = exc
        else:
            return interrupted


class Connection(Protocol):
    """What the group commit needs of the SQLite engine that owns it."""

    dialect: sql.Dialect
    commits: int
    """Write transactions committed (a figure for benchmarks)."""

    @property
    def conn(self) -> sqlite3.Connection: ...

    @property
    def lock(self) -> threading.RLock: ...

    def write_alone(self, work: Callable[[Tx], T], *, durable: bool, busy: Unwritten) -> T:
        """One write in one transaction of its own."""

    def begin(self, *, durable: bool) -> sqlite3.Cursor:
        """A write transaction begun on the connection, at the safety level ``durable`` asks."""

    def translate(self, exc: sqlite3.Error, busy: Unwritten) -> JournalError: ...


class GroupCommit:
    """The write queue of one SQLite engine, on top of its connection and lone writes."""

    __slots__ = ("_engine", "_queue", "_queue_lock")

    def __init__(self, engine: Connection) -> None:
        self._engine = engine
        self._queue: deque[Member[Any]] = deque()
        self._queue_lock = threading.Lock()

    def write(self, work: Callable[[Tx], T], *, durable: bool, busy: Unwritten) -> T:
        """Commit ``work`` with the writes queued beside it (or alone, if there are none)."""
        with self._queue_lock:
            solo = not self._queue
            if solo:
                # No one else is writing: commit alone, as without group commit, while a
                # placeholder at the head of the queue makes those who come meanwhile wait.
                self._queue.append(_SOLO)
        if solo:
            try:
                return self._engine.write_alone(work, durable=durable, busy=busy)
            finally:
                self._hand_over(1)
        member: Member[T] = Member(work, durable, busy)
        with self._queue_lock:
            self._queue.append(member)
            leading = len(self._queue) == 1
        if not leading:
            # Woken once a leader has committed (or failed) this write, or when this
            # member reached the head of the queue and leads the next batch itself.
            interrupted = _wait(member.wake)
            if not member.done:
                self._lead(member)
            if interrupted is not None:
                raise interrupted
            return member.outcome()
        self._lead(member)
        return member.outcome()

    def _lead(self, leader: Member[Any]) -> None:
        """Commit the writes queued at this instant, ``leader``'s first, in one transaction.

        Every member's ``work`` runs in a savepoint of its own: one that raises is rolled
        back alone, and its error goes to its caller only. The transaction is committed
        with ``synchronous=FULL`` when any member asked for durability, and no member is
        answered before that commit has returned.
        """
        with self._queue_lock:
            batch = list(itertools.islice(self._queue, _MAX_BATCH))
        try:
            self._commit_batch(batch)
        except BaseException:
            # An interrupt in the leader's thread (KeyboardInterrupt): the leader's own write
            # is given up. Members already answered are delivered; the others are still
            # queued, undone, and the next one at the head leads them again.
            finished = [m for m in batch if m.finished and m is not leader]
            for member in batch:
                if not member.finished:
                    member.reset()
            with self._queue_lock:
                self._queue.remove(leader)
                for member in finished:
                    self._queue.remove(member)
                successor = self._queue[0] if self._queue else None
            for member in finished:
                member.done = True
                member.wake.release()
            if successor is not None:
                successor.wake.release()
            raise
        for member in batch:
            if member is not leader:
                member.done = True
                member.wake.release()
        self._hand_over(len(batch))

    def _hand_over(self, finished: int) -> None:
        """Take the ``finished`` writes off the head of the queue; wake the next leader."""
        with self._queue_lock:
            for _ in range(finished):
                self._queue.popleft()
            successor = self._queue[0] if self._queue else None
        if successor is not None:
            successor.wake.release()

    def _commit_batch(self, batch: list[Member[Any]]) -> None:
        if len(batch) == 1:
            self._run_alone(batch[0])
            return
        durable = any(member.durable for member in batch)
        with self._engine.lock:
            # Members nearly always succeed: run them side by side first, without the
            # SAVEPOINT and RELEASE around each (per intent, four statements beside its own
            # four). If one raises, the whole batch is rolled back and run again, each in a
            # savepoint of its own: every answer is then the one that run gives, as if the
            # savepoints had been there from the start (a rolled-back run answered no one).
            ended = self._try_batch(batch, durable, self._run_side_by_side)
            if ended is _Ended.ISOLATE:
                for member in batch:
                    member.reset()
                ended = self._try_batch(batch, durable, self._run_in_savepoint)
            if ended is _Ended.ANSWERED:
                return
        # The transaction as a whole failed (SQLite rolled it back on an I/O error or a full
        # disk, or the commit failed): no member's write happened, and the decisions taken
        # in it may have rested on another member's rolled-back rows. Each member runs
        # again alone, so each gets the answer it would have got without batching.
        for member in batch:
            member.reset()
            self._run_alone(member)

    def _try_batch(
        self,
        batch: list[Member[Any]],
        durable: bool,
        run: Callable[[sqlite3.Cursor, Member[Any]], None],
    ) -> _Ended:
        """One transaction for the whole batch, each member's work run by ``run``."""
        try:
            # The safety level cannot change inside a transaction: it is the batch's.
            cur = self._engine.begin(durable=durable)
        except sqlite3.Error as exc:
            # The journal stayed locked (by another process) past the busy timeout, or its
            # file was removed or replaced (checked once, here, for a durable batch): for
            # every member alike, each is told so in its own words.
            for member in batch:
                member.fail(self._engine.translate(exc, member.busy))
                member.finished = True
            return _Ended.ANSWERED
        try:
            for member in batch:
                run(cur, member)
            cur.execute("COMMIT")
        except _MemberFailed:
            with contextlib.suppress(sqlite3.Error):
                self._engine.conn.execute("ROLLBACK")
            return _Ended.ISOLATE
        except (_BatchAborted, sqlite3.Error):
            with contextlib.suppress(sqlite3.Error):
                self._engine.conn.execute("ROLLBACK")
            return _Ended.ALONE
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._engine.conn.execute("ROLLBACK")
            raise
        for member in batch:
            member.finished = True
        self._engine.commits += 1
        return _Ended.ANSWERED

    def _run_side_by_side(self, cur: sqlite3.Cursor, member: Member[Any]) -> None:
        try:
            member.result = member.work(Tx(cur, self._engine.dialect))
        except Exception as exc:
            raise _MemberFailed from exc

    def _run_in_savepoint(self, cur: sqlite3.Cursor, member: Member[Any]) -> None:
        cur.execute("SAVEPOINT member")
        try:
            member.result = member.work(Tx(cur, self._engine.dialect))
        except Exception as exc:
            if not self._engine.conn.in_transaction:
                raise _BatchAborted from exc
            # ROLLBACK TO keeps the transaction open: the members before this one stand.
            cur.execute("ROLLBACK TO member")
            if isinstance(exc, sqlite3.Error):
                translated = self._engine.translate(exc, member.busy)
                translated.__cause__ = exc
                member.fail(translated)
            else:
                member.fail(exc)
        cur.execute("RELEASE member")

    def _run_alone(self, member: Member[Any]) -> None:
        try:
            member.result = self._engine.write_alone(
                member.work, durable=member.durable, busy=member.busy
            )
        except Exception as exc:
            member.fail(exc)
        member.finished = True
