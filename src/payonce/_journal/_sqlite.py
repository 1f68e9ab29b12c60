"""The SQLite journal, the embedded default: its engine (one file, one connection, its
group commit) and ``SQLiteJournal``, the public journal that opens it.

Durability budget (see docs/contract.md): the write-ahead record of a new intent and the
start of every later attempt are committed with ``synchronous=FULL`` (the WAL is fsynced
before the request is sent). Attempt ends, settlements and releases use
``synchronous=NORMAL``: they survive a process crash, and an OS crash that rolls one back
only leaves the intent pending under its old key, which a resend replays at the provider.

Group commit (``group_commit=True``, the default) is ``_group_commit``'s, a helper the
engine owns: threads that write at the same time share one transaction and one fsync.

Every write first checks that the path still names the file the connection has open
(``_sqlite_file`` watches the file on disk): a journal removed or replaced under a
running process (a clean-up, a volume recreated by a deploy) would otherwise take its
writes into an unlinked inode, without an error, while the next process starts a fresh
journal at the path and mints new keys for intents this one has already sent.

Everything but the file, the connection and its pragmas lives in ``_engine`` and ``_sql``,
shared with the PostgreSQL journal; the reads and operator commands are ``_reads.Journal``'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .._fork import ForkGuard
from .._lifecycle import Unwritten
from ..errors import JournalError
from . import _sql as sql
from . import _sqlite_file as files
from ._engine import BEFORE_SEND, FOREIGN_KEY_DAMAGE, NO_SEND, Engine, Tx, migrate, schema_found
from ._group_commit import GroupCommit
from ._plans import Write, run_on
from ._reads import Journal
from ._rows import UndecodableRow

__all__ = ["SQLiteEngine", "SQLiteJournal"]

logger = logging.getLogger("payonce")

T = TypeVar("T")

_DAMAGE_SAID = (
    "could not decode to utf-8",  # a text column holds bytes that are not text: sqlite3's
    "malformed",  # "database disk image is malformed", "malformed database schema (…)"
    "file is not a database",
    "unsupported file format",
)
"""How the ``OperationalError``s that mean a damaged file begin or read: SQLite raises its
own damage as ``DatabaseError``, but a row whose bytes no longer decode is Python's."""


class _Replaced(sqlite3.OperationalError):
    """The journal's path no longer names the file its connection has open.

    An ``OperationalError`` of SQLite's kind so that every write path (alone, or a whole
    group-commit batch) turns it into each caller's ``JournalError`` as it does an I/O
    error: ``translate`` words it."""


class SQLiteEngine(Engine):
    """One SQLite journal file's transactions (see ``SQLiteJournal`` for the options)."""

    dialect = sql.SQLITE

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        create_directories: bool = False,
        check_integrity: bool = True,
        group_commit: bool = True,
        read_only: bool = False,
    ) -> None:
        self._path = Path(path).expanduser().absolute()
        self.read_only = read_only
        self._busy_timeout = busy_timeout
        self._fork = ForkGuard()
        self.lock = threading.RLock()
        self._group = GroupCommit(self) if group_commit else None
        self.commits = 0
        """Write transactions committed by this engine (a figure for benchmarks)."""
        self._synchronous: str | None = None
        files.prepare(self._path, self.error, create=not read_only, directories=create_directories)
        # Taken before connecting: a file swapped in between is then caught as replaced
        # at the first durable write, never taken for the one that was opened.
        self._identity = files.identity(self._path)
        self.conn = self._connect()
        try:
            self._open(check_integrity)
        except BaseException:
            self.conn.close()
            raise

    @property
    def location(self) -> str:
        return str(self._path)

    # -- opening ---------------------------------------------------------------------------

    def _still_the_opened_file(self) -> None:
        """Raise ``_Replaced`` when the path no longer names the file opened as the journal.

        One ``stat`` per write transaction (a group-commit batch makes one for all of its
        writers): before a write-ahead, so that nothing is sent; before a settle, so that
        an answer is never "recorded" in a file no one will read. A child after a fork
        keeps its parent's identity: its new connection opens the path again, and must find
        the same file there."""
        now = files.identity(self._path)
        if now == self._identity and now is not None:
            return
        what = "no longer exists" if now is None else "names another file than the one it opened"
        raise _Replaced(
            f"the journal file was removed or replaced under this process: {self._path} "
            f"{what}, so what it journals would be seen by no other process, nor by itself "
            "after a restart. Put the journal back at that path (from a backup; this "
            "process can still copy the file it has open with client.journal.backup(path)) "
            "and restart the process"
        )

    def _connect(self) -> sqlite3.Connection:
        # A read-only connection cannot write the file, whatever a bug elsewhere might ask.
        target = f"{self._path.as_uri()}?mode=ro" if self.read_only else str(self._path)
        conn = self._open_connection(target)
        self._fixed_as: tuple[int, ...] | None = None
        if self.read_only and files.frozen(self._path) and not self._readable(conn):
            # On a read-only filesystem SQLite cannot create the -shm index WAL readers
            # share. With no WAL left, read the file as it is now; a service writing it
            # through another mount (a read-only bind mount of its directory) would change
            # it, so every read checks first that it has not (``_still_fixed``).
            conn.close()
            self._fixed_as = files.version(self._path)  # before: a change meanwhile shows later
            conn = self._open_connection(target + "&immutable=1")
        self._synchronous = None
        return conn

    def _still_fixed(self) -> None:
        """Reopen a journal read as a fixed file once it has changed after all: the new
        connection first, so that one that fails to open leaves the old one in use."""
        if self._fixed_as is not None and files.version(self._path) != self._fixed_as:
            old, self.conn = self.conn, self._connect()
            old.close()

    @staticmethod
    def _readable(conn: sqlite3.Connection) -> bool:
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError:
            return False
        return True

    def _open_connection(self, target: str) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                target,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=self.read_only,
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            raise self.error(f"cannot open the journal: {exc}") from exc
        return conn

    def _in_this_process(self) -> None:
        """After a fork, the child's own connection, locks and queue (see ``_fork``)."""
        if self._fork.forked(self.conn):
            self.lock = threading.RLock()
            if self._group is not None:
                self._group = GroupCommit(self)
            self.conn = self._connect()

    def _open(self, check_integrity: bool) -> None:
        conn = self.conn
        try:
            if check_integrity:
                problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
                if problems != ["ok"]:
                    summary = "; ".join(str(p) for p in problems[:3])
                    raise self.error(
                        f"the journal is damaged ({summary}); restore it from a backup "
                        "(payonce journal backup) or move it away to start a new one"
                    )
            tables = {
                row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            # A file of its own is the journal's: other tables mean a path typo, and a
            # journal must not grow inside someone else's database.
            if tables and "payonce_meta" not in tables:
                raise self.error(
                    "this SQLite database is not a payonce journal (it has other tables); "
                    "payonce will not write to it: choose another journal path"
                )
            refuse = self._refuse("SQLite database")
            if self.read_only:
                self.schema_version = self.read(lambda tx: schema_found(tx, refuse=refuse))
                if check_integrity and self.schema_version:
                    self.read(self._verify)
                return
            mode = self._switch_to_wal()
            if str(mode).lower() != "wal":
                raise self.error(f"cannot switch the journal to WAL mode (got {mode!r})")
            self._set_synchronous("FULL")
            self.write(lambda tx: migrate(tx, refuse=refuse), durable=True, busy=BEFORE_SEND)
            if check_integrity:
                self.read(self._verify)
        except JournalError:
            raise
        except sqlite3.OperationalError as exc:
            raise self.translate(exc, BEFORE_SEND) from exc
        except sqlite3.DatabaseError as exc:
            raise self.error(
                f"the journal cannot be read ({exc}); it is damaged or not a payonce "
                "journal: restore it from a backup or move it away"
            ) from exc

    def _switch_to_wal(self) -> str:
        """Switch to WAL mode, waiting for other processes doing the same.

        Workers started together on a new file (``uvicorn --workers 4``) all switch it at
        once, and SQLite answers "locked" to a switch at once, without its busy handler:
        so wait here, up to the busy timeout, as every other write does."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                return str(self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.005)

    # -- transactions ----------------------------------------------------------------------

    def _set_synchronous(self, level: str) -> None:
        # Per connection, and reset on every new connection: set it each time it differs.
        if self._synchronous != level:
            self.conn.execute(f"PRAGMA synchronous = {level}")
            self._synchronous = level

    def translate(self, exc: sqlite3.Error, busy: Unwritten) -> JournalError:
        message = str(exc)
        if isinstance(exc, _Replaced):
            return self.error(message, then=busy)
        missing = "no such table" in message or "no such column" in message
        if missing and (reason := self._cannot_read()) is not None:
            return reason
        if type(exc) in (sqlite3.DatabaseError, UndecodableRow) or any(
            said in message.lower() for said in _DAMAGE_SAID
        ):
            # The undecodable bytes themselves are garbage: name the column, not its text.
            found = message.split(" with text ", 1)[0]
            return self.error(
                f"the journal cannot be read ({found}); it is damaged or not a payonce "
                "journal: restore it from a backup or move it away",
                then=busy,
            )
        if ("readonly" in message or "unable to open" in message) and (
            why := files.unwritable(self._path)
        ):
            look = (
                "; the read-only commands (`payonce intents list`) can still look at it"
                if files.frozen(self._path)
                else ""
            )
            return self.error(
                f"the journal cannot be written ({why}): payonce writes every intent before "
                f"sending it, and a replay takes the intent's lock. Make it writable{look}",
                then=busy,
            )
        if "locked" in message or "busy" in message:
            writing = f" (writing {busy.about})" if busy.about else ""
            return self.error(
                f"the journal stayed locked by another process for more than "
                f"{self._busy_timeout:g}s{writing}",
                busy=True,
                then=busy,
            )
        return self.error(f"journal operation failed: {message}", then=busy)

    def _commit(self, write: Write[T]) -> T:
        # No recovery: a commit in this process either returns or raises having rolled back.
        self._in_this_process()
        planned = write.work

        def work(tx: Tx) -> T:
            return run_on(tx, planned())

        group = self._group
        if group is not None:
            return group.write(work, durable=write.durable, busy=write.busy)
        return self.write_alone(work, durable=write.durable, busy=write.busy)

    def begin(self, *, durable: bool) -> sqlite3.Cursor:
        # BEGIN IMMEDIATE takes the write lock up front, which avoids SQLITE_BUSY_SNAPSHOT
        # under concurrency and makes every read of the transaction a locked read.
        self._still_the_opened_file()
        self._set_synchronous("FULL" if durable else "NORMAL")
        cur = self.conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        return cur

    def write_alone(self, work: Callable[[Tx], T], *, durable: bool, busy: Unwritten) -> T:
        """One write in one transaction of its own (group commit off, or a batch's fallback)."""
        with self.lock:
            try:
                cur = self.begin(durable=durable)
            except sqlite3.Error as exc:
                raise self.translate(exc, busy) from exc
            try:
                result = work(Tx(cur, self.dialect))
                cur.execute("COMMIT")
                self.commits += 1
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self.translate(exc, busy) from exc
                raise
            return result

    def _query(self, work: Callable[[Tx], T], *, snapshot: bool) -> T:
        self._in_this_process()
        with self.lock:
            try:
                self._still_fixed()
                cur = self.conn.cursor()
                if not snapshot:
                    return work(Tx(cur, self.dialect))
                # A deferred read transaction: one WAL snapshot, no writer blocked.
                cur.execute("BEGIN")
                try:
                    return work(Tx(cur, self.dialect))
                finally:
                    cur.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self.translate(exc, NO_SEND) from exc

    def between_batches(self, seconds: float) -> None:
        # Writers in this process queue up fairly behind a batch; those of other processes
        # wait in SQLite's busy handler, which sleeps and polls, and would rarely find the
        # journal free if batches followed each other at once. A pause as long as the batch
        # (at most 100 ms) gives them at least half of the time.
        time.sleep(min(seconds, 0.1))

    # -- operating --------------------------------------------------------------------------

    def storage_problems(self, tx: Tx) -> list[str]:
        problems = [str(row[0]) for row in tx.all("PRAGMA integrity_check")]
        problems += [
            f"{FOREIGN_KEY_DAMAGE} in {row[0]} (row {row[1]}): the row of {row[2]} it "
            "belongs to is gone"
            for row in tx.all("PRAGMA foreign_key_check")
        ]
        return problems

    def present_columns(self, tx: Tx, table: str) -> set[str]:
        return {str(row[1]) for row in tx.all(f"PRAGMA table_info({table})")}

    def size_bytes(self, tx: Tx) -> int:
        return sum(
            path.stat().st_size for path in (self._path, files.wal(self._path)) if path.exists()
        )

    def backup(self, destination: str | os.PathLike[str]) -> Path:
        """A consistent copy through SQLite's backup API, committed WAL content included.

        Copying the .db file alone is not a backup: committed rows may still live only in
        the -wal file beside it.
        """
        target = Path(destination).expanduser().absolute()
        if target.is_symlink() or target.exists():
            what = "is a symbolic link" if target.is_symlink() else "exists"
            raise self.error(
                f"backup destination {target} {what}; payonce will not overwrite it, nor write "
                "through a link: name a new file"
            )
        if not target.parent.is_dir():
            raise self.error(f"backup directory {target.parent} does not exist")
        try:
            fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise self.error(f"cannot create the backup file {target}: {exc.strerror}") from None
        os.close(fd)
        self._in_this_process()
        try:
            with contextlib.closing(sqlite3.connect(target)) as copy, self.lock:
                self._still_fixed()
                self.conn.backup(copy)
        except sqlite3.Error as exc:
            target.unlink(missing_ok=True)
            raise self.translate(exc, NO_SEND) from exc
        return target

    def close(self) -> None:
        self._in_this_process()  # a child closes its own connection, never its parent's
        self.flush_acknowledgements()
        with self.lock:
            self.conn.close()


class SQLiteJournal(Journal):
    """A journal in one SQLite file (WAL mode), safe for many threads and processes.

    The file is created with mode 0600. A file that is not a payonce journal, or is
    damaged, raises ``JournalError`` and is left untouched.

    ``group_commit`` (on by default) commits the writes of threads that write at the same
    time together, sharing one fsync, with each caller's write still durable before it
    returns; one writer alone commits as without it. ``check_integrity`` runs ``PRAGMA
    quick_check`` on open, which reads the whole file: readers of a big journal may skip it.

    ``read_only`` opens an existing file for reading only (SQLite's ``mode=ro``): it is
    never created, migrated, switched to WAL mode or locked for writing, so it reads the
    last committed state while a writer holds the journal, and an empty file stays empty.
    A journal of an older schema is read as it is; a read that needs what only a newer
    schema has raises ``JournalError`` saying so. Writes raise ``JournalError``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        create_directories: bool = False,
        check_integrity: bool = True,
        group_commit: bool = True,
        read_only: bool = False,
    ) -> None:
        super().__init__(
            SQLiteEngine(
                path,
                busy_timeout=busy_timeout,
                create_directories=create_directories,
                check_integrity=check_integrity,
                group_commit=group_commit,
                read_only=read_only,
            )
        )
