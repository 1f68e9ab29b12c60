"""The SQLite journal: the embedded default.

Durability budget (see docs/contract.md): the write-ahead record of a new intent and the
start of every later attempt are committed with ``synchronous=FULL`` (the WAL is fsynced
before the request is sent). Attempt ends, settlements and releases use
``synchronous=NORMAL``: they survive a process crash, and an OS crash that rolls one back
only leaves the intent pending under its old key, which a resend replays at the provider.

Group commit (``group_commit=True``, the default): one connection writes for every thread
of the process. A write that finds no other queued commits alone, exactly as without group
commit. Writes that arrive while another is committing queue up; the first in the queue
then leads them all in one ``BEGIN IMMEDIATE`` transaction, each caller's work in a
savepoint of its own, committed with ``synchronous=FULL`` if any of them needs durability.
No caller is answered before that commit has returned, so a write-ahead record is still
fsynced before its request is sent, and an fsync is shared by the whole batch. A caller's
refusal or error rolls back its savepoint only and is raised to that caller only; a
failure of the transaction as a whole runs every member again alone. Several processes on
one file still serialise on SQLite's own lock, each with its own batches.

Everything but the file, the connection and its pragmas lives in ``_engine`` and ``_sql``,
shared with the PostgreSQL journal.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..errors import JournalError
from . import _sql as sql
from ._engine import BEFORE_SEND, NO_SEND, SQLJournal, Tx, migrate

__all__ = ["SQLiteJournal"]

T = TypeVar("T")

_SQLITE_MAGIC = b"SQLite format 3\x00"
_MAX_BATCH = 256
"""The most writes one group commit takes: bounds the wait of the batch's last member."""


class _BatchAborted(Exception):
    """SQLite rolled the whole batch transaction back on a member's statement."""


class _Member(Generic[T]):
    """One caller's write waiting in the group-commit queue, and then its answer."""

    __slots__ = ("busy", "done", "durable", "error", "finished", "result", "wake", "work")

    def __init__(self, work: Callable[[Tx], T], durable: bool, busy: str) -> None:
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


_SOLO: _Member[None] = _Member(lambda tx: None, False, "")
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


class SQLiteJournal(SQLJournal):
    """A journal in one SQLite file (WAL mode), safe for many threads and processes.

    The file is created with mode 0600. A file that is not a payonce journal, or is
    damaged, raises ``JournalError`` and is left untouched.

    ``group_commit`` (on by default) commits the writes of threads that write at the same
    time together, sharing one fsync, with each caller's write still durable before it
    returns; one writer alone commits as without it. ``check_integrity`` runs ``PRAGMA
    quick_check`` on open, which reads the whole file: readers of a big journal may skip it.
    """

    _dialect = sql.SQLITE

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        create_directories: bool = False,
        check_integrity: bool = True,
        group_commit: bool = True,
    ) -> None:
        self._path = Path(path).expanduser().absolute()
        self._busy_timeout = busy_timeout
        self._lock = threading.RLock()
        self._group_commit = group_commit
        self._queue: deque[_Member[Any]] = deque()
        self._queue_lock = threading.Lock()
        self._commits = 0
        """Write transactions committed by this instance (a figure for benchmarks)."""
        self._synchronous: str | None = None
        self._prepare_file(create_directories)
        try:
            self._conn = sqlite3.connect(
                self._path,
                timeout=busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self._error(f"cannot open the journal: {exc}") from exc
        try:
            self._open(check_integrity)
        except BaseException:
            self._conn.close()
            raise

    @property
    def location(self) -> str:
        return str(self._path)

    def __repr__(self) -> str:
        return f"SQLiteJournal({self.location!r})"

    # -- opening ---------------------------------------------------------------------------

    def _prepare_file(self, create_directories: bool) -> None:
        directory = self._path.parent
        if not directory.is_dir():
            if not create_directories:
                raise self._error(
                    f"the journal's directory {directory} does not exist; create it or "
                    "point PAYONCE_JOURNAL / journal= at an existing directory"
                )
            directory.mkdir(parents=True, mode=0o700, exist_ok=True)
        if self._path.exists():
            if not self._path.is_file():
                raise self._error("the journal path exists but is not a regular file")
            with self._path.open("rb") as handle:
                head = handle.read(len(_SQLITE_MAGIC))
            if head and head != _SQLITE_MAGIC:
                raise self._error(
                    "this file is not a payonce journal (not an SQLite database); payonce "
                    "will not overwrite it: move it away or choose another journal path"
                )
            return
        try:
            fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return  # another process created it first; it is validated on open
        except OSError as exc:
            raise self._error(f"cannot create the journal file: {exc}") from exc
        os.close(fd)

    def _open(self, check_integrity: bool) -> None:
        conn = self._conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            if check_integrity:
                problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
                if problems != ["ok"]:
                    summary = "; ".join(str(p) for p in problems[:3])
                    raise self._error(
                        f"the journal is damaged ({summary}); restore it from a backup "
                        "(payonce journal backup) or move it away to start a new one"
                    )
            tables = {
                row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            # A file of its own is the journal's: other tables mean a path typo, and a
            # journal must not grow inside someone else's database.
            if tables and "payonce_meta" not in tables:
                raise self._error(
                    "this SQLite database is not a payonce journal (it has other tables); "
                    "payonce will not write to it: choose another journal path"
                )
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise self._error(f"cannot switch the journal to WAL mode (got {mode!r})")
            conn.execute("PRAGMA foreign_keys = ON")
            self._set_synchronous("FULL")
            refuse = self._refuse("SQLite database")
            self._write(lambda tx: migrate(tx, refuse=refuse), durable=True, busy=BEFORE_SEND)
            if check_integrity:
                self._read(self._verify)
        except JournalError:
            raise
        except sqlite3.OperationalError as exc:
            raise self._translate(exc, BEFORE_SEND) from exc
        except sqlite3.DatabaseError as exc:
            raise self._error(
                f"the journal cannot be read ({exc}); it is damaged or not a payonce "
                "journal: restore it from a backup or move it away"
            ) from exc

    # -- transactions ----------------------------------------------------------------------

    def _set_synchronous(self, level: str) -> None:
        # Per connection, and reset on every new connection: set it each time it differs.
        if self._synchronous != level:
            self._conn.execute(f"PRAGMA synchronous = {level}")
            self._synchronous = level

    def _translate(self, exc: sqlite3.Error, busy: str) -> JournalError:
        message = str(exc)
        if type(exc) is sqlite3.DatabaseError:
            return self._error(
                f"the journal cannot be read ({exc}); it is damaged or not a payonce "
                "journal: restore it from a backup or move it away"
            )
        if "locked" in message or "busy" in message:
            return self._error(
                f"the journal stayed locked by another process for more than "
                f"{self._busy_timeout:g}s; {busy}",
                busy=True,
            )
        return self._error(f"journal operation failed: {message}")

    def _write(self, work: Callable[[Tx], T], *, durable: bool, busy: str) -> T:
        if not self._group_commit:
            return self._write_alone(work, durable=durable, busy=busy)
        with self._queue_lock:
            solo = not self._queue
            if solo:
                # No one else is writing: commit alone, as without group commit, while a
                # placeholder at the head of the queue makes those who come meanwhile wait.
                self._queue.append(_SOLO)
        if solo:
            try:
                return self._write_alone(work, durable=durable, busy=busy)
            finally:
                self._hand_over(1)
        member: _Member[T] = _Member(work, durable, busy)
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

    def _write_alone(self, work: Callable[[Tx], T], *, durable: bool, busy: str) -> T:
        """One write in one transaction of its own (group commit off, or a batch's fallback)."""
        # BEGIN IMMEDIATE takes the write lock up front, which avoids SQLITE_BUSY_SNAPSHOT
        # under concurrency and makes every read of the transaction a locked read.
        with self._lock:
            try:
                self._set_synchronous("FULL" if durable else "NORMAL")
                cur = self._conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._translate(exc, busy) from exc
            try:
                result = work(Tx(cur, self._dialect))
                cur.execute("COMMIT")
                self._commits += 1
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc, busy) from exc
                raise
            return result

    # -- group commit ----------------------------------------------------------------------

    def _lead(self, leader: _Member[Any]) -> None:
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

    def _commit_batch(self, batch: list[_Member[Any]]) -> None:
        if len(batch) == 1:
            self._run_alone(batch[0])
            return
        durable = any(member.durable for member in batch)
        with self._lock:
            try:
                # The safety level cannot change inside a transaction: it is the batch's.
                self._set_synchronous("FULL" if durable else "NORMAL")
                cur = self._conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                # The journal stayed locked (by another process) past the busy timeout, for
                # every member alike: each is told so, in its own words.
                for member in batch:
                    member.fail(self._translate(exc, member.busy))
                    member.finished = True
                return
            try:
                for member in batch:
                    self._run_in_savepoint(cur, member)
                cur.execute("COMMIT")
            except (_BatchAborted, sqlite3.Error):
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
            else:
                for member in batch:
                    member.finished = True
                self._commits += 1
                return
        # The transaction as a whole failed (SQLite rolled it back on an I/O error or a full
        # disk, or the commit failed): no member's write happened, and the decisions taken
        # in it may have rested on another member's rolled-back rows. Each member runs
        # again alone, so each gets the answer it would have got without batching.
        for member in batch:
            member.reset()
            self._run_alone(member)

    def _run_in_savepoint(self, cur: sqlite3.Cursor, member: _Member[Any]) -> None:
        cur.execute("SAVEPOINT member")
        try:
            member.result = member.work(Tx(cur, self._dialect))
        except Exception as exc:
            if not self._conn.in_transaction:
                raise _BatchAborted from exc
            # ROLLBACK TO keeps the transaction open: the members before this one stand.
            cur.execute("ROLLBACK TO member")
            if isinstance(exc, sqlite3.Error):
                translated = self._translate(exc, member.busy)
                translated.__cause__ = exc
                member.fail(translated)
            else:
                member.fail(exc)
        cur.execute("RELEASE member")

    def _run_alone(self, member: _Member[Any]) -> None:
        try:
            member.result = self._write_alone(member.work, durable=member.durable, busy=member.busy)
        except Exception as exc:
            member.fail(exc)
        member.finished = True

    def _read(self, work: Callable[[Tx], T], *, snapshot: bool = False) -> T:
        with self._lock:
            try:
                cur = self._conn.cursor()
                if not snapshot:
                    return work(Tx(cur, self._dialect))
                # A deferred read transaction: one WAL snapshot, no writer blocked.
                cur.execute("BEGIN")
                try:
                    return work(Tx(cur, self._dialect))
                finally:
                    cur.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._translate(exc, NO_SEND) from exc

    def _between_batches(self, seconds: float) -> None:
        # Writers in this process queue up fairly behind a batch; those of other processes
        # wait in SQLite's busy handler, which sleeps and polls, and would rarely find the
        # journal free if batches followed each other at once. A pause as long as the batch
        # (at most 100 ms) gives them at least half of the time.
        time.sleep(min(seconds, 0.1))

    # -- operating --------------------------------------------------------------------------

    def _storage_problems(self, tx: Tx) -> list[str]:
        problems = [str(row[0]) for row in tx.all("PRAGMA integrity_check")]
        problems += [
            f"foreign key violation in {row[0]} (row {row[1]})"
            for row in tx.all("PRAGMA foreign_key_check")
        ]
        return problems

    def _present_columns(self, tx: Tx, table: str) -> set[str]:
        return {str(row[1]) for row in tx.all(f"PRAGMA table_info({table})")}

    def _size_bytes(self, tx: Tx) -> int:
        return sum(
            path.stat().st_size
            for path in (self._path, self._path.with_name(self._path.name + "-wal"))
            if path.exists()
        )

    def backup(self, destination: str | os.PathLike[str]) -> Path:
        """A consistent copy through SQLite's backup API, committed WAL content included.

        Copying the .db file alone is not a backup: committed rows may still live only in
        the -wal file beside it.
        """
        target = Path(destination).expanduser().absolute()
        if target.exists():
            raise self._error(f"backup destination {target} exists; payonce will not overwrite it")
        if not target.parent.is_dir():
            raise self._error(f"backup directory {target.parent} does not exist")
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        try:
            with contextlib.closing(sqlite3.connect(target)) as copy, self._lock:
                self._conn.backup(copy)
        except sqlite3.Error as exc:
            target.unlink(missing_ok=True)
            raise self._translate(exc, NO_SEND) from exc
        return target

    def close(self) -> None:
        with self._lock:
            self._conn.close()
