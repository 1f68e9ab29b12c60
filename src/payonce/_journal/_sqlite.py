"""The SQLite journal: the embedded default.

Durability budget (see docs/contract.md): the write-ahead record of a new intent and the
start of every later attempt are committed with ``synchronous=FULL`` (the WAL is fsynced
before the request is sent). Attempt ends, settlements and releases use
``synchronous=NORMAL``: they survive a process crash, and an OS crash that rolls one back
only leaves the intent pending under its old key, which a resend replays at the provider.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .._crash import crash_point
from .._intent import IntentState
from .._version import __version__
from ..errors import IntentInFlight, IntentStateError, JournalBusy, JournalError
from ._records import (
    AttemptRecord,
    Claim,
    ClaimKind,
    IntentDraft,
    IntentRecord,
    JournalReport,
    ReconciliationRecord,
    StoredResponse,
)
from ._schema import APPLICATION, MIGRATIONS, SCHEMA_VERSION

__all__ = ["SQLiteJournal"]

_SQLITE_MAGIC = b"SQLite format 3\x00"

_INTENT_COLUMNS = (
    "key, scope, reference, account, provider, method, url, fingerprint, request_headers, "
    "request_body, state, created_at, updated_at, first_sent_at, lease_owner, "
    "lease_expires_at, unknown_reason, response_status, response_headers, response_body, "
    "response_body_stored, response_stored_by, response_schema, acknowledged_at, "
    "(SELECT count(*) FROM attempts a WHERE a.key = intents.key), abandon_reason"
)


def _headers_to_json(headers: Sequence[tuple[str, str]]) -> str:
    return json.dumps([list(pair) for pair in headers])


def _headers_from_json(text: str | None) -> tuple[tuple[str, str], ...]:
    if not text:
        return ()
    return tuple((str(name), str(value)) for name, value in json.loads(text))


def _intent_from_row(row: Sequence[Any]) -> IntentRecord:
    (
        key,
        scope,
        reference,
        account,
        provider,
        method,
        url,
        fingerprint,
        request_headers,
        body,
        state,
        created_at,
        updated_at,
        first_sent_at,
        lease_owner,
        lease_expires_at,
        unknown_reason,
        response_status,
        response_headers,
        response_body,
        body_stored,
        stored_by,
        response_schema,
        acknowledged_at,
        attempt_count,
        abandon_reason,
    ) = row
    response = None
    if response_status is not None:
        response = StoredResponse(
            status=int(response_status),
            headers=_headers_from_json(response_headers),
            body=bytes(response_body or b""),
            body_stored=body_stored is None or bool(body_stored),
            stored_by=stored_by,
            schema_version=response_schema if response_schema is not None else 1,
        )
    return IntentRecord(
        key=key,
        scope=scope,
        reference=reference,
        account=account,
        provider=provider,
        method=method,
        url=url,
        fingerprint=fingerprint,
        request_headers=_headers_from_json(request_headers),
        body=bytes(body),
        state=IntentState(state),
        created_at=created_at,
        updated_at=updated_at,
        first_sent_at=first_sent_at,
        lease_owner=lease_owner,
        lease_expires_at=lease_expires_at,
        unknown_reason=unknown_reason,
        response=response,
        acknowledged_at=acknowledged_at,
        attempt_count=int(attempt_count),
        abandon_reason=abandon_reason,
    )


class SQLiteJournal:
    """A journal in one SQLite file (WAL mode), safe for many threads and processes.

    The file is created with mode 0600. A file that is not a payonce journal, or is
    damaged, raises ``JournalError`` and is left untouched.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        create_directories: bool = False,
        check_integrity: bool = True,
    ) -> None:
        self._path = Path(path).expanduser().absolute()
        self._busy_timeout = busy_timeout
        self._lock = threading.RLock()
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

    def _error(self, what: str, *, busy: bool = False) -> JournalError:
        cls = JournalBusy if busy else JournalError
        return cls(f"{what} (journal: {self._path})", location=str(self._path))

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
            self._migrate()
        except JournalError:
            raise
        except sqlite3.OperationalError as exc:
            raise self._translate(exc) from exc
        except sqlite3.DatabaseError as exc:
            raise self._error(
                f"the journal cannot be read ({exc}); it is damaged or not a payonce "
                "journal: restore it from a backup or move it away"
            ) from exc

    def _migrate(self) -> None:
        with self._write(durable=True) as cur:
            has_meta = cur.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='payonce_meta'"
            ).fetchone()
            version = 0
            if has_meta:
                meta = dict(cur.execute("SELECT name, value FROM payonce_meta").fetchall())
                if meta.get("application") != APPLICATION:
                    raise self._error("this SQLite database is not a payonce journal")
                version = int(meta.get("schema_version", "0"))
            if version > SCHEMA_VERSION:
                raise self._error(
                    f"the journal was written by a newer payonce (schema {version}, this "
                    f"payonce knows {SCHEMA_VERSION}); upgrade payonce to use it"
                )
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[number - 1]:
                    cur.execute(statement)
            if version < SCHEMA_VERSION:
                cur.executemany(
                    "INSERT OR REPLACE INTO payonce_meta (name, value) VALUES (?, ?)",
                    [
                        ("application", APPLICATION),
                        ("schema_version", str(SCHEMA_VERSION)),
                        ("migrated_by", __version__),
                    ],
                )

    # -- transactions ----------------------------------------------------------------------

    def _set_synchronous(self, level: str) -> None:
        # Per connection, and reset on every new connection: set it each time it differs.
        if self._synchronous != level:
            self._conn.execute(f"PRAGMA synchronous = {level}")
            self._synchronous = level

    def _translate(self, exc: sqlite3.Error) -> JournalError:
        message = str(exc)
        if "locked" in message or "busy" in message:
            return self._error(
                f"the journal stayed locked by another process for more than "
                f"{self._busy_timeout:g}s; nothing was sent. Retry later",
                busy=True,
            )
        return self._error(f"journal operation failed: {message}")

    @contextlib.contextmanager
    def _write(self, *, durable: bool) -> Iterator[sqlite3.Cursor]:
        """A read-then-write transaction: BEGIN IMMEDIATE takes the write lock up front,
        which avoids SQLITE_BUSY_SNAPSHOT under concurrency."""
        with self._lock:
            try:
                self._set_synchronous("FULL" if durable else "NORMAL")
                cur = self._conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc) from exc
                raise

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            try:
                yield self._conn.cursor()
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    # -- intents ---------------------------------------------------------------------------

    def _select(
        self, cur: sqlite3.Cursor, where: str, params: Sequence[Any]
    ) -> IntentRecord | None:
        row = cur.execute(f"SELECT {_INTENT_COLUMNS} FROM intents WHERE {where}", params).fetchone()
        return _intent_from_row(row) if row else None

    def _held_by(self, cur: sqlite3.Cursor, key: str, owner: str) -> IntentRecord:
        record = self._select(cur, "key = ?", (key,))
        if record is None or record.lease_owner != owner:
            raise IntentInFlight(
                f"intent {key} is no longer held by this worker (its lease expired and "
                "another worker took it over); its outcome will be settled by that worker",
                key=key,
                reference=record.reference if record else None,
            )
        return record

    def claim(
        self,
        draft: IntentDraft,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        stale_owner: str | None = None,
    ) -> Claim:
        with self._write(durable=True) as cur:
            record = None
            if draft.reference is not None:
                record = self._select(
                    cur, "scope = ? AND reference = ?", (draft.scope, draft.reference)
                )
            if record is None:
                record = self._select(cur, "key = ?", (draft.key,))
            if record is None:
                cur.execute(
                    "INSERT INTO intents (key, scope, reference, account, provider, method, url,"
                    " fingerprint, request_headers, request_body, state, created_at, updated_at,"
                    " first_sent_at, lease_owner, lease_expires_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        draft.key,
                        draft.scope,
                        draft.reference,
                        draft.account,
                        draft.provider,
                        draft.method,
                        draft.url,
                        draft.fingerprint,
                        _headers_to_json(draft.request_headers),
                        draft.body,
                        IntentState.PENDING.value,
                        now,
                        now,
                        now,
                        owner,
                        now + lease_seconds,
                    ),
                )
                cur.execute(
                    "INSERT INTO attempts (key, number, started_at) VALUES (?, 1, ?)",
                    (draft.key, now),
                )
                created = self._select(cur, "key = ?", (draft.key,))
                assert created is not None
                return Claim(ClaimKind.CREATED, created, attempt_number=1)

            if (
                record.fingerprint != draft.fingerprint
                or record.scope != draft.scope
                or (draft.key_supplied and record.key != draft.key)
            ):
                return Claim(ClaimKind.MISMATCH, record)
            return self._claim_existing(
                cur, record, owner, now, lease_seconds, unknown=False, stale_owner=stale_owner
            )

    def _claim_existing(
        self,
        cur: sqlite3.Cursor,
        record: IntentRecord,
        owner: str,
        now: float,
        lease_seconds: float,
        *,
        unknown: bool,
        stale_owner: str | None,
    ) -> Claim:
        if record.state.is_final:
            return Claim(ClaimKind.FINAL, record)
        if record.state is IntentState.UNKNOWN and not unknown:
            return Claim(ClaimKind.UNKNOWN, record)
        breakable = stale_owner is not None and record.lease_owner == stale_owner
        if record.lease_owner != owner and record.lease_live(now) and not breakable:
            return Claim(ClaimKind.LEASED, record)
        # The conditional UPDATE repeats the test, so the claim holds even if this method is
        # ever called outside BEGIN IMMEDIATE.
        cur.execute(
            "UPDATE intents SET lease_owner = ?, lease_expires_at = ?, updated_at = ?"
            " WHERE key = ? AND (lease_owner IS NULL OR lease_owner = ? OR lease_expires_at <= ?"
            " OR lease_owner = ?)",
            (owner, now + lease_seconds, now, record.key, owner, now, stale_owner),
        )
        claimed = self._select(cur, "key = ?", (record.key,))
        assert claimed is not None
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
        stale_owner: str | None = None,
    ) -> Claim | None:
        with self._write(durable=True) as cur:
            record = self._select(cur, "key = ?", (key,))
            if record is None:
                return None
            return self._claim_existing(
                cur, record, owner, now, lease_seconds, unknown=unknown, stale_owner=stale_owner
            )

    def renew_lease(self, key: str, *, owner: str, now: float, lease_seconds: float) -> bool:
        with self._write(durable=False) as cur:
            cur.execute(
                "UPDATE intents SET lease_expires_at = ? WHERE key = ? AND lease_owner = ?",
                (now + lease_seconds, key, owner),
            )
            return cur.rowcount == 1

    def start_attempt(self, key: str, *, owner: str, now: float, lease_seconds: float) -> int:
        with self._write(durable=True) as cur:
            self._held_by(cur, key, owner)
            (last,) = cur.execute(
                "SELECT coalesce(max(number), 0) FROM attempts WHERE key = ?", (key,)
            ).fetchone()
            number = int(last) + 1
            cur.execute(
                "INSERT INTO attempts (key, number, started_at) VALUES (?, ?, ?)",
                (key, number, now),
            )
            cur.execute(
                "UPDATE intents SET first_sent_at = coalesce(first_sent_at, ?),"
                " lease_expires_at = ?, updated_at = ? WHERE key = ?",
                (now, now + lease_seconds, now, key),
            )
            return number

    @staticmethod
    def _end_attempt(
        cur: sqlite3.Cursor,
        key: str,
        number: int,
        now: float,
        status_code: int | None,
        error: str | None,
        ambiguous: bool,
    ) -> None:
        cur.execute(
            "UPDATE attempts SET ended_at = ?, status_code = ?, error = ?, ambiguous = ?"
            " WHERE key = ? AND number = ?",
            (now, status_code, error, int(ambiguous), key, number),
        )

    def end_attempt(
        self,
        key: str,
        number: int,
        *,
        owner: str,
        now: float,
        status_code: int | None,
        error: str | None,
        ambiguous: bool,
    ) -> None:
        with self._write(durable=False) as cur:
            self._held_by(cur, key, owner)
            self._end_attempt(cur, key, number, now, status_code, error, ambiguous)

    def settle(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        state: IntentState,
        response: StoredResponse,
        attempt: int,
    ) -> IntentRecord:
        with self._write(durable=False) as cur:
            self._held_by(cur, key, owner)
            self._end_attempt(cur, key, attempt, now, response.status, None, False)
            self._store_response(cur, key, response)
            crash_point("during_settle")
            cur.execute(
                "UPDATE intents SET state = ?, updated_at = ?, lease_owner = NULL,"
                " lease_expires_at = NULL, unknown_reason = NULL WHERE key = ?",
                (state.value, now, key),
            )
            settled = self._select(cur, "key = ?", (key,))
            assert settled is not None
            return settled

    @staticmethod
    def _store_response(cur: sqlite3.Cursor, key: str, response: StoredResponse) -> None:
        cur.execute(
            "UPDATE intents SET response_status = ?, response_headers = ?, response_body = ?,"
            " response_body_stored = ?, response_stored_by = ?, response_schema = ?"
            " WHERE key = ?",
            (
                response.status,
                _headers_to_json(response.headers),
                response.body,
                int(response.body_stored),
                __version__,
                SCHEMA_VERSION,
                key,
            ),
        )

    def mark_unknown(self, key: str, *, owner: str, now: float, reason: str) -> IntentRecord:
        with self._write(durable=False) as cur:
            self._held_by(cur, key, owner)
            cur.execute(
                "UPDATE intents SET state = ?, unknown_reason = ?, updated_at = ?,"
                " lease_owner = NULL, lease_expires_at = NULL WHERE key = ?",
                (IntentState.UNKNOWN.value, reason, now, key),
            )
            record = self._select(cur, "key = ?", (key,))
            assert record is not None
            return record

    def release(self, key: str, *, owner: str) -> None:
        with self._write(durable=False) as cur:
            cur.execute(
                "UPDATE intents SET lease_owner = NULL, lease_expires_at = NULL"
                " WHERE key = ? AND lease_owner = ?",
                (key, owner),
            )

    def reconciled(
        self,
        key: str,
        *,
        owner: str,
        now: float,
        outcome: str,
        detail: str,
        status_code: int | None,
        state: IntentState,
        response: StoredResponse | None = None,
    ) -> IntentRecord:
        with self._write(durable=False) as cur:
            self._held_by(cur, key, owner)
            cur.execute(
                "INSERT INTO reconciliations (key, at, outcome, detail, status_code)"
                " VALUES (?, ?, ?, ?, ?)",
                (key, now, outcome, detail, status_code),
            )
            if response is not None:
                self._store_response(cur, key, response)
            cur.execute(
                "UPDATE intents SET state = ?, unknown_reason = ?, updated_at = ?,"
                " lease_owner = NULL, lease_expires_at = NULL WHERE key = ?",
                (
                    state.value,
                    detail if state is IntentState.UNKNOWN else None,
                    now,
                    key,
                ),
            )
            record = self._select(cur, "key = ?", (key,))
            assert record is not None
            return record

    def reconciliations(self, key: str) -> list[ReconciliationRecord]:
        with self._read() as cur:
            rows = cur.execute(
                "SELECT key, at, outcome, detail, status_code FROM reconciliations"
                " WHERE key = ? ORDER BY at, rowid",
                (key,),
            ).fetchall()
        return [ReconciliationRecord(*row) for row in rows]

    def abandon(self, key: str, *, reason: str, now: float) -> IntentRecord:
        with self._write(durable=False) as cur:
            record = self._select(cur, "key = ?", (key,))
            if record is None:
                raise self._error(f"no intent with key {key!r}")
            if record.state.is_final:
                raise IntentStateError(
                    f"intent {key} is already {record.state.value}; only pending or unknown "
                    "intents can be abandoned",
                    key=key,
                    reference=record.reference,
                )
            if record.lease_live(now):
                raise IntentInFlight(
                    f"intent {key} is being sent by {record.lease_owner} right now; abandon "
                    "it once that attempt has ended",
                    key=key,
                    reference=record.reference,
                )
            cur.execute(
                "UPDATE intents SET state = ?, abandon_reason = ?, updated_at = ?,"
                " lease_owner = NULL, lease_expires_at = NULL WHERE key = ?",
                (IntentState.ABANDONED.value, reason, now, key),
            )
            abandoned = self._select(cur, "key = ?", (key,))
            assert abandoned is not None
            return abandoned

    def acknowledge(self, key: str, *, now: float) -> IntentRecord:
        with self._write(durable=False) as cur:
            record = self._select(cur, "key = ?", (key,))
            if record is None:
                raise self._error(f"no intent with key {key!r}")
            if not record.state.is_final:
                raise IntentStateError(
                    f"intent {key} is {record.state.value}: only a settled intent can be "
                    "acknowledged",
                    key=key,
                    reference=record.reference,
                )
            cur.execute(
                "UPDATE intents SET acknowledged_at = coalesce(acknowledged_at, ?) WHERE key = ?",
                (now, key),
            )
            acknowledged = self._select(cur, "key = ?", (key,))
            assert acknowledged is not None
            return acknowledged

    # -- reading ---------------------------------------------------------------------------

    def pending(
        self, *, account: str, provider: str, limit: int | None = None
    ) -> list[IntentRecord]:
        """Pending intents of this account and provider, oldest first, leased or not."""
        sql = (
            f"SELECT {_INTENT_COLUMNS} FROM intents WHERE state = ? AND account = ?"
            " AND provider = ? ORDER BY created_at, key"
        )
        params: list[Any] = [IntentState.PENDING.value, account, provider]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._read() as cur:
            rows = cur.execute(sql, params).fetchall()
        return [_intent_from_row(row) for row in rows]

    def unacknowledged(self, *, account: str | None = None) -> list[IntentRecord]:
        sql = (
            f"SELECT {_INTENT_COLUMNS} FROM intents WHERE state IN (?, ?)"
            " AND acknowledged_at IS NULL"
        )
        params: list[Any] = [IntentState.SUCCEEDED.value, IntentState.FAILED.value]
        if account is not None:
            sql += " AND account = ?"
            params.append(account)
        sql += " ORDER BY created_at, key"
        with self._read() as cur:
            rows = cur.execute(sql, params).fetchall()
        return [_intent_from_row(row) for row in rows]

    def get(self, key: str) -> IntentRecord | None:
        with self._read() as cur:
            return self._select(cur, "key = ?", (key,))

    def find(self, key_or_reference: str) -> list[IntentRecord]:
        with self._read() as cur:
            rows = cur.execute(
                f"SELECT {_INTENT_COLUMNS} FROM intents WHERE key = ? OR reference = ?"
                " ORDER BY created_at DESC",
                (key_or_reference, key_or_reference),
            ).fetchall()
        return [_intent_from_row(row) for row in rows]

    def list_intents(
        self, *, states: Iterable[IntentState] | None = None, limit: int | None = None
    ) -> list[IntentRecord]:
        sql = f"SELECT {_INTENT_COLUMNS} FROM intents"
        params: list[Any] = []
        if states is not None:
            wanted = [IntentState(s).value for s in states]
            sql += f" WHERE state IN ({', '.join('?' for _ in wanted)})"
            params.extend(wanted)
        sql += " ORDER BY created_at DESC, key DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._read() as cur:
            rows = cur.execute(sql, params).fetchall()
        return [_intent_from_row(row) for row in rows]

    def attempts(self, key: str) -> list[AttemptRecord]:
        with self._read() as cur:
            rows = cur.execute(
                "SELECT key, number, started_at, ended_at, status_code, error, ambiguous"
                " FROM attempts WHERE key = ? ORDER BY number",
                (key,),
            ).fetchall()
        return [
            AttemptRecord(
                key=row[0],
                number=row[1],
                started_at=row[2],
                ended_at=row[3],
                status_code=row[4],
                error=row[5],
                ambiguous=None if row[6] is None else bool(row[6]),
            )
            for row in rows
        ]

    # -- operating --------------------------------------------------------------------------

    def check(self) -> JournalReport:
        """A full integrity check (reads only: writers are not blocked in WAL mode)."""
        with self._read() as cur:
            problems = [str(row[0]) for row in cur.execute("PRAGMA integrity_check")]
            problems += [
                f"foreign key violation in {row[0]} (row {row[1]})"
                for row in cur.execute("PRAGMA foreign_key_check")
            ]
            meta = dict(cur.execute("SELECT name, value FROM payonce_meta").fetchall())
            by_state = dict(cur.execute("SELECT state, count(*) FROM intents GROUP BY state"))
            (unacknowledged,) = cur.execute(
                "SELECT count(*) FROM intents WHERE state IN (?, ?) AND acknowledged_at IS NULL",
                (IntentState.SUCCEEDED.value, IntentState.FAILED.value),
            ).fetchone()
        problems = [p for p in problems if p != "ok"]
        size = sum(
            path.stat().st_size
            for path in (self._path, self._path.with_name(self._path.name + "-wal"))
            if path.exists()
        )
        return JournalReport(
            location=self.location,
            ok=not problems,
            problems=tuple(problems),
            schema_version=int(meta.get("schema_version", 0)),
            intents_by_state={str(k): int(v) for k, v in by_state.items()},
            unacknowledged=int(unacknowledged),
            size_bytes=size,
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
            raise self._translate(exc) from exc
        return target

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteJournal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
