"""The sandbox provider's own state: keys, payments, PaymentIntents and execution counts."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs

from payonce.sandbox._intents import StripeIntent

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    account TEXT NOT NULL,
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('in_progress', 'completed')),
    claim TEXT NOT NULL,
    created_at REAL NOT NULL,
    response_status INTEGER,
    response_body BLOB,
    UNIQUE (account, key)
);
CREATE TABLE IF NOT EXISTS payments (
    id TEXT PRIMARY KEY,
    account TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    reference TEXT,
    status TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS payments_by_key ON payments (account, idempotency_key);
CREATE INDEX IF NOT EXISTS payments_by_reference ON payments (account, reference);
CREATE TABLE IF NOT EXISTS payment_intents (
    id TEXT PRIMARY KEY,
    account TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    status TEXT NOT NULL,
    capture_method TEXT NOT NULL,
    payment_method TEXT,
    payment_method_types TEXT NOT NULL,
    metadata TEXT NOT NULL,
    description TEXT,
    client_secret TEXT NOT NULL,
    latest_charge TEXT,
    last_payment_error TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS payment_intents_by_account ON payment_intents (account, created_at);
CREATE TABLE IF NOT EXISTS executions (
    account TEXT NOT NULL,
    key TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (account, key)
);
"""


def new_payment_id() -> str:
    return "pay_" + secrets.token_hex(12)


@attrs.frozen
class Payment:
    id: str
    account: str
    amount: int
    currency: str
    reference: str | None
    status: str
    idempotency_key: str
    metadata: Mapping[str, Any]
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "payment",
            "account": self.account,
            "amount": self.amount,
            "currency": self.currency,
            "reference": self.reference,
            "status": self.status,
            "idempotency_key": self.idempotency_key,
            "metadata": dict(self.metadata),
            "created": int(self.created_at),
        }

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Payment:
        return cls(**{**dict(row), "metadata": json.loads(row["metadata"])})

    def to_row(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "metadata": json.dumps(dict(self.metadata))}


# The payments table has a column per field of Payment, of the same name; only the metadata
# is stored as JSON text.
_PAYMENT_FIELDS = [field.name for field in attrs.fields(Payment)]
_PAYMENT_COLUMNS = ", ".join(_PAYMENT_FIELDS)
_INSERT_PAYMENT = (
    f"INSERT INTO payments ({_PAYMENT_COLUMNS}) "  # noqa: S608
    f"VALUES ({', '.join(':' + name for name in _PAYMENT_FIELDS)})"
)


# The same for StripeIntent and its table.
_INTENT_FIELDS = [field.name for field in attrs.fields(StripeIntent)]
_INTENT_COLUMNS = ", ".join(_INTENT_FIELDS)
_SAVE_INTENT = (
    f"INSERT OR REPLACE INTO payment_intents ({_INTENT_COLUMNS}) "  # noqa: S608
    f"VALUES ({', '.join(':' + name for name in _INTENT_FIELDS)})"
)


@attrs.frozen
class StoredResponse:
    status: int
    body: bytes


@attrs.frozen
class IntentChange:
    """An execution on a PaymentIntent: the intent as it now is, and the answer to store."""

    intent: StripeIntent
    response: StoredResponse


@attrs.frozen
class Claimed:
    """This request now owns the key; ``token`` proves it when completing or releasing."""

    token: str


@attrs.frozen
class InProgress:
    pass


@attrs.frozen
class Mismatch:
    request_hash: str = ""
    """The hash the key was first used with (it may name that request's endpoint)."""


@attrs.frozen
class Replay:
    response: StoredResponse


ClaimResult = Claimed | InProgress | Mismatch | Replay


class SandboxClock:
    """Wall time plus an offset kept in the store, so every process sharing the file agrees."""

    def __init__(self, store: SandboxStore) -> None:
        self._store = store

    def now(self) -> float:
        return time.time() + self._store._clock_offset()

    def advance(self, seconds: float) -> None:
        with self._store._transaction() as db:
            db.execute(
                "INSERT INTO meta (name, value) VALUES ('clock_offset', ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (repr(_offset(db) + seconds),),
            )


def _complete(
    db: sqlite3.Connection, account: str, key: str, token: str, response: StoredResponse
) -> None:
    """Count an execution under ``key`` and store its answer for the key's replays."""
    db.execute(
        "INSERT INTO executions (account, key, count) VALUES (?, ?, 1) "
        "ON CONFLICT (account, key) DO UPDATE SET count = count + 1",
        (account, key),
    )
    # Matching on the claim token: if the key expired and was re-claimed meanwhile, the
    # newer owner's row must not receive this response.
    db.execute(
        "UPDATE idempotency_keys SET state = 'completed', response_status = ?, "
        "response_body = ? WHERE account = ? AND key = ? AND claim = ?",
        (response.status, response.body, account, key, token),
    )


def _offset(db: sqlite3.Connection) -> float:
    row = db.execute("SELECT value FROM meta WHERE name = 'clock_offset'").fetchone()
    return float(row[0]) if row else 0.0


class SandboxStore:
    """SQLite-backed; safe to share between threads, and between processes via the file."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._tempdir: str | None = None
        if path is None:
            # A real file even when temporary: another process may be pointed at it.
            self._tempdir = tempfile.mkdtemp(prefix="payonce-sandbox-")
            path = Path(self._tempdir) / "sandbox.db"
        self.path = Path(path)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=10.0
        )
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        with self._lock:
            self._db.executescript(_SCHEMA)
        self.clock = SandboxClock(self)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so read-then-write cannot interleave
        # with another connection (thread or process) doing the same.
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _clock_offset(self) -> float:
        with self._lock:
            return _offset(self._db)

    def claim(self, account: str, key: str, request_hash: str, lifetime: float) -> ClaimResult:
        with self._transaction() as db:
            now = time.time() + _offset(db)
            # An expired key is forgotten; its payment (and execution count) stay.
            db.execute(
                "DELETE FROM idempotency_keys WHERE account = ? AND key = ? AND created_at <= ?",
                (account, key, now - lifetime),
            )
            token = secrets.token_hex(8)
            try:
                db.execute(
                    "INSERT INTO idempotency_keys (account, key, request_hash, state, claim, "
                    "created_at) VALUES (?, ?, ?, 'in_progress', ?, ?)",
                    (account, key, request_hash, token, now),
                )
            except sqlite3.IntegrityError:
                pass
            else:
                return Claimed(token)
            row = db.execute(
                "SELECT request_hash, state, response_status, response_body "
                "FROM idempotency_keys WHERE account = ? AND key = ?",
                (account, key),
            ).fetchone()
        if row["request_hash"] != request_hash:
            return Mismatch(row["request_hash"])
        if row["state"] == "in_progress":
            return InProgress()
        return Replay(StoredResponse(row["response_status"], bytes(row["response_body"])))

    def release(self, account: str, key: str, token: str) -> None:
        """Give up a claim that never executed, so a retry is not stuck on 409."""
        with self._transaction() as db:
            db.execute(
                "DELETE FROM idempotency_keys WHERE account = ? AND key = ? AND claim = ? "
                "AND state = 'in_progress'",
                (account, key, token),
            )

    def record_execution(self, token: str, payment: Payment, response: StoredResponse) -> None:
        """Create the payment, count it, and store the response, all or nothing."""
        with self._transaction() as db:
            db.execute(_INSERT_PAYMENT, payment.to_row())
            _complete(db, payment.account, payment.idempotency_key, token, response)

    def record_answer(self, token: str, account: str, key: str, response: StoredResponse) -> None:
        """Count an execution that changes no stored object (a capture request taken)."""
        with self._transaction() as db:
            _complete(db, account, key, token, response)

    def change_payment(
        self,
        token: str,
        account: str,
        key: str,
        payment_id: str,
        decide: Callable[[Payment | None], tuple[Payment, StoredResponse] | T],
    ) -> tuple[Payment, StoredResponse] | T:
        """Apply what ``decide`` makes of the payment as it is, in one transaction: a new
        state and its answer are saved and counted under ``key``; anything else (a refusal)
        is returned with nothing written."""
        with self._transaction() as db:
            row = db.execute(
                f"SELECT {_PAYMENT_COLUMNS} FROM payments "  # noqa: S608
                "WHERE account = ? AND id = ?",
                (account, payment_id),
            ).fetchone()
            outcome = decide(None if row is None else Payment.from_row(row))
            if isinstance(outcome, tuple):
                payment, response = outcome
                db.execute(
                    "UPDATE payments SET status = ? WHERE account = ? AND id = ?",
                    (payment.status, account, payment_id),
                )
                _complete(db, account, key, token, response)
            return outcome

    def record_intent(self, token: str, key: str, change: IntentChange) -> None:
        """Create the PaymentIntent as executed under ``key``, count it, store the answer."""
        with self._transaction() as db:
            db.execute(_SAVE_INTENT, change.intent.to_row())
            _complete(db, change.intent.account, key, token, change.response)

    def change_intent(
        self,
        token: str,
        account: str,
        key: str,
        intent_id: str,
        decide: Callable[[StripeIntent | None], IntentChange | T],
    ) -> IntentChange | T:
        """Apply what ``decide`` makes of the intent as it is, in one transaction.

        An ``IntentChange`` is saved, counted and stored under ``key``; anything else
        (a refusal) is returned with nothing written. Reading and writing under one lock
        is what keeps two confirmations of one intent, under two keys, from both charging.
        """
        with self._transaction() as db:
            row = db.execute(
                f"SELECT {_INTENT_COLUMNS} FROM payment_intents "  # noqa: S608
                "WHERE account = ? AND id = ?",
                (account, intent_id),
            ).fetchone()
            outcome = decide(None if row is None else StripeIntent.from_row(row))
            if isinstance(outcome, IntentChange):
                db.execute(_SAVE_INTENT, outcome.intent.to_row())
                _complete(db, account, key, token, outcome.response)
            return outcome

    def find_intent(self, account: str, intent_id: str) -> StripeIntent | None:
        found = self._select_intents("account = ? AND id = ?", (account, intent_id))
        return found[0] if found else None

    def account_intents(self, account: str) -> list[StripeIntent]:
        """The account's PaymentIntents, newest first (as Stripe lists and searches them)."""
        return self._select_intents("account = ?", (account,))[::-1]

    def payment_intents(self) -> list[dict[str, Any]]:
        """Every PaymentIntent, oldest first, as Stripe's API shows it."""
        return [intent.to_json() for intent in self._select_intents("1 = 1", ())]

    def _select_intents(self, where: str, params: tuple[str, ...]) -> list[StripeIntent]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_INTENT_COLUMNS} FROM payment_intents WHERE {where} "  # noqa: S608
                "ORDER BY created_at, rowid",
                params,
            ).fetchall()
        return [StripeIntent.from_row(row) for row in rows]

    def find_payment(self, account: str, payment_id: str) -> Payment | None:
        rows = self._select_payments("account = ? AND id = ?", (account, payment_id))
        return rows[0] if rows else None

    def find_payments(
        self, account: str, *, idempotency_key: str | None = None, reference: str | None = None
    ) -> list[Payment]:
        where, params = ["account = ?"], [account]
        if idempotency_key is not None:
            where.append("idempotency_key = ?")
            params.append(idempotency_key)
        if reference is not None:
            where.append("reference = ?")
            params.append(reference)
        return self._select_payments(" AND ".join(where), tuple(params))

    def search_metadata(self, account: str, name: str, value: str) -> list[Payment]:
        """Payments whose metadata maps ``name`` to ``value``, oldest first."""
        payments = self._select_payments("account = ?", (account,))
        return [p for p in payments if p.metadata.get(name) == value]

    def _select_payments(self, where: str, params: tuple[str, ...]) -> list[Payment]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_PAYMENT_COLUMNS} FROM payments WHERE {where} "  # noqa: S608
                "ORDER BY created_at, rowid",
                params,
            ).fetchall()
        return [Payment.from_row(row) for row in rows]

    def payments(self) -> list[dict[str, Any]]:
        return [payment.to_json() for payment in self._select_payments("1 = 1", ())]

    def executions(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute(
                "SELECT key, SUM(count) FROM executions GROUP BY key ORDER BY key"
            ).fetchall()
        return {row[0]: row[1] for row in rows}

    def execution_count(self, key: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(count), 0) FROM executions WHERE key = ?", (key,)
            ).fetchone()
        return int(row[0])

    def total_executions(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COALESCE(SUM(count), 0) FROM executions").fetchone()
        return int(row[0])

    def reset(self) -> None:
        """Forget everything, including the clock offset."""
        with self._transaction() as db:
            for table in ("idempotency_keys", "payments", "payment_intents", "executions", "meta"):
                db.execute(f"DELETE FROM {table}")  # noqa: S608

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)
