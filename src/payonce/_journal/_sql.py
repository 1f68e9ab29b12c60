"""What every SQL journal says and decides, written once for all dialects.

The statements are written with ``?`` placeholders in the SQL that SQLite (3.24 and later)
and PostgreSQL both accept: ``INSERT … ON CONFLICT``, ``coalesce``, ``LIMIT``. A
``Dialect`` carries the few things that differ: the placeholder, the row-locking clauses
(PostgreSQL locks rows; SQLite's ``BEGIN IMMEDIATE`` already serialises every writer), the
two column types of the schema, and how to ask whether the meta table exists. The columns
and how a record goes to and comes from its row are ``_rows``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .._lifecycle import IntentState
from ._rows import (
    ATTEMPT_COLUMNS,
    ATTEMPT_FIELDS,
    ESCALATION_COLUMNS,
    ESCALATION_FIELDS,
    EVENT_FIELDS,
    INTENT_COLUMNS,
    INTENT_FIELDS,
    KEY_TERMS_COLUMNS,
    PER_CALL_COLUMN,
    RECONCILIATION_COLUMNS,
    RECONCILIATION_FIELDS,
)
from ._schema import KEY_TERMS_SCHEMA, PER_CALL_KEYS_SCHEMA, render_migrations

__all__ = [
    "POSTGRES",
    "SQLITE",
    "Dialect",
    "is_postgres_url",
    "NEEDED_INDEXES",
    "needed_columns",
    "newest_in_states",
]


@attrs.frozen
class Dialect:
    name: str
    placeholder: str
    lock_rows: str
    """Appended to a SELECT inside a write transaction: lock what was read until commit."""
    skip_locked: str
    """Appended to a queue SELECT: skip rows another worker has locked instead of waiting."""
    tiebreak: str
    """An insertion-order column for rows with no key of their own (reconciliations)."""
    has_relation: str
    """Takes a name; returns a row when a table or index of that name exists where the
    journal's unqualified names resolve."""
    types: Mapping[str, str]
    chains_writes: bool = False
    """Data-modifying CTEs: a write and the writes that depend on its outcome go as one
    statement (PostgreSQL), so a transaction costs one round trip to the server."""
    unmigrated: tuple[tuple[str, str], ...] = ()
    """Columns a read-only journal of an older schema lacks, each with what is read in its
    place (``reading_schema``); a writer migrates the journal instead."""
    _cache: dict[str, str] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def sql(self, statement: str) -> str:
        """``statement`` with its ``?`` placeholders in this dialect's style."""
        if self.placeholder == "?" and not self.unmigrated:
            return statement
        translated = self._cache.get(statement)
        if translated is None:
            # No statement here holds a literal "?" or "%": the swap is exact.
            translated = statement.replace("?", self.placeholder)
            for column, instead in self.unmigrated:
                translated = translated.replace(column, instead)
            self._cache[statement] = translated
        return translated

    def reading_schema(self, version: int) -> Dialect:
        """This dialect for reading a journal left at schema ``version`` (read-only, never
        migrated): a column added since is read as NULL."""
        unmigrated: list[tuple[str, str]] = []
        if 0 < version < PER_CALL_KEYS_SCHEMA:
            unmigrated.append((PER_CALL_COLUMN, ", NULL AS key_per_call,"))
        if 0 < version < KEY_TERMS_SCHEMA:
            nulls = (
                "NULL AS key_lifetime, NULL AS key_lifetime_documented, NULL AS max_processing,"
                " NULL AS enqueued, NULL AS credential, NULL AS account_scope"
            )
            unmigrated.append((KEY_TERMS_COLUMNS, nulls))
        return attrs.evolve(self, unmigrated=tuple(unmigrated)) if unmigrated else self

    @property
    def migrations(self) -> tuple[tuple[str, ...], ...]:
        return render_migrations(self.types)


SQLITE = Dialect(
    name="sqlite",
    placeholder="?",
    lock_rows="",
    skip_locked="",
    tiebreak="rowid",
    has_relation="SELECT 1 FROM sqlite_master WHERE name = ?",
    types={"BLOB": "BLOB", "REAL": "REAL"},
)

POSTGRES = Dialect(
    name="postgresql",
    placeholder="%s",
    lock_rows=" FOR UPDATE",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    # Reconciliations are never updated, so their physical order is their insertion order;
    # it only breaks ties between look-ups journaled at the very same clock reading.
    tiebreak="ctid",
    has_relation="SELECT 1 WHERE to_regclass(?) IS NOT NULL",
    types={"BLOB": "BYTEA", "REAL": "DOUBLE PRECISION"},
    chains_writes=True,
)


def is_postgres_url(text: str) -> bool:
    """Whether a journal argument names a PostgreSQL database rather than a file."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in ("postgresql", "postgres")


# -- columns -------------------------------------------------------------------------------


def needed_columns() -> dict[str, tuple[str, ...]]:
    """Every column the statements here read, by table: what a journal must have."""
    return {
        "payonce_meta": ("name", "value"),
        "intents": INTENT_FIELDS,
        "attempts": ATTEMPT_FIELDS,
        "reconciliations": RECONCILIATION_FIELDS,
        "escalations": ESCALATION_FIELDS,
        "webhook_events": EVENT_FIELDS,
    }


NEEDED_INDEXES = ("intents_identity_reference",)
"""Indexes correctness depends on: the unique (provider, account, reference) index is what
lets only one of two workers create the same intent."""


def like_prefix(text: str) -> str:
    """A LIKE pattern (``ESCAPE '\\'``) for what begins with ``text``."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


# -- statements ----------------------------------------------------------------------------

SELECT_INTENT = f"SELECT {INTENT_COLUMNS} FROM intents WHERE "
BY_KEY = "key = ?"
BY_REFERENCE = "provider = ? AND account = ? AND reference = ?"
"""An intent by its identity (``IntentRequest.identity``) and reference."""

INSERT_INTENT = (
    "INSERT INTO intents (key, scope, reference, account, provider, method, url, fingerprint,"
    " request_headers, request_body, state, created_at, updated_at, first_sent_at,"
    " lease_owner, lease_expires_at, key_per_call, key_lifetime, key_lifetime_documented,"
    " max_processing, enqueued, credential, account_scope)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    # Two hosts creating the same intent at once: the unique key and (provider, account, reference)
    # let exactly one insert win; the other inserts nothing and reads the winner's row.
    " ON CONFLICT DO NOTHING"
)
INSERT_ATTEMPT = (
    "INSERT INTO attempts (key, number, started_at, sent_to, boot, boottime)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
LAST_ATTEMPT = "SELECT coalesce(max(number), 0) FROM attempts WHERE key = ?"
ATTEMPT_STARTED_AT = (
    "SELECT number FROM attempts WHERE key = ? AND started_at = ? ORDER BY number DESC LIMIT 1"
)
"""The attempt of an intent started at that time: one whose commit was unknown, found."""

# The WHERE repeats the lease test the caller made, so a claim stays atomic even where the
# row was read without a lock.
TAKE_LEASE = (
    "UPDATE intents SET lease_owner = ?, lease_expires_at = ?, updated_at = ?"
    " WHERE key = ? AND (lease_owner IS NULL OR lease_owner = ? OR lease_expires_at <= ?"
    " OR lease_owner = ?)"
)
REBIND_CREDENTIAL = "UPDATE intents SET credential = ? WHERE key = ? AND lease_owner = ?"
"""A claimed intent none of whose attempts may have executed, taken over by another
credential (``_lifecycle._credential.may_rebind``): only its lease's holder writes it."""
RENEW_LEASE = "UPDATE intents SET lease_expires_at = ? WHERE key = ? AND lease_owner = ?"
RELEASE_LEASE = (
    "UPDATE intents SET lease_owner = NULL, lease_expires_at = NULL"
    " WHERE key = ? AND lease_owner = ?"
)
ATTEMPT_STARTED = (
    "UPDATE intents SET first_sent_at = coalesce(first_sent_at, ?), lease_expires_at = ?,"
    " updated_at = ? WHERE key = ?"
)
END_ATTEMPT = (
    "UPDATE attempts SET ended_at = ?, status_code = ?, error = ?, ambiguous = ?,"
    " provider_date = ? WHERE key = ? AND number = ?"
)
STORE_RESPONSE = (
    "UPDATE intents SET response_status = ?, response_headers = ?, response_body = ?,"
    " response_body_stored = ?, response_stored_by = ?, response_schema = ? WHERE key = ?"
)
SETTLE = (
    "UPDATE intents SET state = ?, updated_at = ?, lease_owner = NULL,"
    " lease_expires_at = NULL, unknown_reason = NULL WHERE key = ?"
)
SETTLE_WITH_RESPONSE = (
    "UPDATE intents SET response_status = ?, response_headers = ?, response_body = ?,"
    " response_body_stored = ?, response_stored_by = ?, response_schema = ?,"
    " state = ?, updated_at = ?, lease_owner = NULL, lease_expires_at = NULL,"
    " unknown_reason = NULL, acknowledged_at = coalesce(acknowledged_at, ?) WHERE key = ?"
)
"""STORE_RESPONSE and SETTLE in one statement: what settling a held intent writes, with
its acknowledgement when that is known already (NULL leaves it as it was)."""
SETTLE_KNOWN = SETTLE_WITH_RESPONSE + " AND lease_owner = ? AND state = ? AND created_at = ?"
"""The same, for a row not read first: it matches only the row of that creation, still
held by that owner, in that state (see ``_held``)."""
# -- one statement per transaction, where writes chain (``Dialect.chains_writes``) ---------
# Each is what the statements above do in a transaction of several, sent to a server as one
# statement: the later writes apply only where the first one did (a data-modifying CTE
# they select from), and the answer says whether it did.

CREATE_INTENT = (
    f"WITH created AS ({INSERT_INTENT} RETURNING key),"
    " first_attempt AS (INSERT INTO attempts (key, number, started_at, sent_to, boot,"
    " boottime) SELECT key, 1, ?, ?, ?, ? FROM created)"
    " SELECT made.count, found.* FROM (SELECT count(*) FROM created) AS made"
    f" LEFT JOIN LATERAL (SELECT {INTENT_COLUMNS} FROM intents"
    " WHERE key = ? OR (provider = ? AND account = ? AND reference = ?)"
    " ORDER BY coalesce(provider = ? AND account = ? AND reference = ?, false) DESC LIMIT 1)"
    " AS found"
    " ON made.count = 0"
)
"""INSERT_INTENT and its first attempt (INSERT_ATTEMPT): parameters are INSERT_INTENT's,
then the attempt's start, where it is sent and its boot clock (boot, boottime), then the
key, identity and reference, the identity and reference again. Answers 1 if the intent was
created; else 0 and the intent already there, as committed when the statement began (the
one of that identity and reference first, else the one of that key), or NULLs when it
committed since: nothing was written."""
SETTLE_KNOWN_ENDING_ATTEMPT = (
    f"WITH settled AS ({SETTLE_KNOWN} RETURNING key),"
    " ended AS (UPDATE attempts SET ended_at = ?, status_code = ?, error = NULL,"
    " ambiguous = 0, provider_date = ? WHERE key IN (SELECT key FROM settled) AND number = ?)"
    " SELECT count(*), set_config('synchronous_commit', 'off', true) FROM settled"
)
"""SETTLE_KNOWN and END_ATTEMPT for an answered attempt: parameters are SETTLE_KNOWN's,
then the attempt's end, status and provider date, and its number. Answers 1 if settled, 0
if the row was no longer the one its claim created (nothing was written). It commits with
``synchronous_commit = off`` on its own (``set_config`` is local to the transaction, the
statement's own when it runs alone), so it needs no ``SET LOCAL`` sent before it."""

SETTLE_KNOWN_ENDING_ATTEMPT_SYNCHRONOUSLY = SETTLE_KNOWN_ENDING_ATTEMPT.replace(
    ", set_config('synchronous_commit', 'off', true)", ""
)
"""The same, committed as the server's ``synchronous_commit`` says (a journal opened with
``synchronous_settles``)."""

# A held intent's writes, each guarded as ``_held_by`` and ``allowed`` guard them in a
# transaction of several: the CTE ``held`` locks the intent only if this owner holds it in a
# state the transition may start from, and every write selects from it. The answer's first
# column says whether they applied; the intent's row follows (as it was, for the refusal's
# wording; as it is now where the write changed it). Parameters: the key, the owner, the
# states the transition starts from (an array), each write's own, then the key again.
_HELD = (
    "WITH held AS (SELECT key FROM intents WHERE key = ? AND lease_owner = ?"
    " AND state = ANY(?) FOR UPDATE)"
)
_APPLIED = f" SELECT EXISTS (SELECT 1 FROM held), {INTENT_COLUMNS} FROM intents WHERE key = ?"
_CHANGED = (
    f" SELECT true, * FROM changed UNION ALL SELECT false, {INTENT_COLUMNS} FROM intents"
    " WHERE key = ? AND NOT EXISTS (SELECT 1 FROM held)"
)
_RESPONSE_COLUMNS = (
    "response_status = ?, response_headers = ?, response_body = ?,"
    " response_body_stored = ?, response_stored_by = ?, response_schema = ?"
)
_RELEASED = "lease_owner = NULL, lease_expires_at = NULL"

START_ATTEMPT_HELD = (
    _HELD + ", started AS (INSERT INTO attempts (key, number, started_at, sent_to, boot,"
    " boottime) SELECT key, (SELECT coalesce(max(number), 0) + 1 FROM attempts"
    " WHERE attempts.key = held.key), ?, ?, ?, ? FROM held RETURNING number),"
    " touched AS (UPDATE intents SET first_sent_at = coalesce(first_sent_at, ?),"
    " lease_expires_at = ?, updated_at = ? WHERE key IN (SELECT key FROM held))"
    f" SELECT (SELECT number FROM started), {INTENT_COLUMNS} FROM intents WHERE key = ?"
)
"""INSERT_ATTEMPT numbered after LAST_ATTEMPT, and ATTEMPT_STARTED; answers the attempt's
number (NULL when not held). Writes' parameters: started_at, sent_to, boot, boottime;
first_sent_at, lease_expires_at, updated_at."""
END_ATTEMPT_HELD = (
    _HELD + ", ended AS (UPDATE attempts SET ended_at = ?, status_code = ?, error = ?,"
    " ambiguous = ?, provider_date = ? WHERE key IN (SELECT key FROM held) AND number = ?),"
    f" released AS (UPDATE intents SET {_RELEASED} WHERE key IN (SELECT key FROM held) AND ?)"
    + _APPLIED
)
"""END_ATTEMPT, and RELEASE_LEASE where the last parameter is true."""
LOOKED_UP_HELD = (
    _HELD + ", noted AS (INSERT INTO reconciliations (key, at, outcome, detail, status_code)"
    " SELECT key, ?, ?, ?, ? FROM held)" + _APPLIED
)
"""INSERT_RECONCILIATION; the lease stays."""
MARK_UNKNOWN_HELD = (
    f"{_HELD}, changed AS (UPDATE intents SET state = coalesce(?, state), unknown_reason = ?,"
    f" updated_at = ?, {_RELEASED}"
    f" WHERE key IN (SELECT key FROM held) RETURNING {INTENT_COLUMNS})" + _CHANGED
)
"""SET_STATE: the new state (NULL: the one it is in), the reason, updated_at. Answers the
intent as it is now."""
_NEW_STATE = (
    "state = coalesce(?, state), unknown_reason = CASE WHEN coalesce(?, state) = ? THEN ? END,"
    f" updated_at = ?, {_RELEASED}"
)
RECONCILED_HELD = (
    f"{_HELD}, noted AS (INSERT INTO reconciliations (key, at, outcome, detail, status_code)"
    f" SELECT key, ?, ?, ?, ? FROM held), changed AS (UPDATE intents SET {_NEW_STATE}"
    f" WHERE key IN (SELECT key FROM held) RETURNING {INTENT_COLUMNS})" + _CHANGED
)
"""INSERT_RECONCILIATION and SET_STATE: the new state (NULL: the one it is in), again, the
unknown state and the reason recorded only in it, updated_at."""
SETTLE_HELD = (
    f"{_HELD}, ended AS (UPDATE attempts SET ended_at = ?, status_code = ?, error = NULL,"
    " ambiguous = 0, provider_date = ? WHERE key IN (SELECT key FROM held) AND number = ?),"
    f" changed AS (UPDATE intents SET {_RESPONSE_COLUMNS}, state = coalesce(?, state),"
    f" updated_at = ?, {_RELEASED}, unknown_reason = NULL, acknowledged_at ="
    " coalesce(acknowledged_at, CASE WHEN coalesce(?, state) = ? THEN ?::float8 END)"
    f" WHERE key IN (SELECT key FROM held) RETURNING {INTENT_COLUMNS})" + _CHANGED
)
"""END_ATTEMPT of an answered attempt and SETTLE_WITH_RESPONSE: the attempt's end, status,
provider date and number; the response's values, the new state (NULL: the one it is in),
updated_at, the new state again, the succeeded state and when it is acknowledged if it
ends there (NULL: not yet)."""
RECONCILED_WITH_RESPONSE_HELD = RECONCILED_HELD.replace(
    f"SET {_NEW_STATE}", f"SET {_RESPONSE_COLUMNS}, {_NEW_STATE}"
)
"""The same, with STORE_RESPONSE: the response's values before the new state."""

SET_STATE = (
    "UPDATE intents SET state = ?, unknown_reason = ?, updated_at = ?,"
    " lease_owner = NULL, lease_expires_at = NULL WHERE key = ?"
)
ABANDON = (
    "UPDATE intents SET state = ?, abandon_reason = ?, updated_at = ?,"
    " lease_owner = NULL, lease_expires_at = NULL WHERE key = ?"
)
ACKNOWLEDGE = "UPDATE intents SET acknowledged_at = coalesce(acknowledged_at, ?) WHERE key = ?"
INSERT_RECONCILIATION = (
    "INSERT INTO reconciliations (key, at, outcome, detail, status_code) VALUES (?, ?, ?, ?, ?)"
)

PENDING = (
    f"SELECT {INTENT_COLUMNS} FROM intents WHERE state = ? AND account = ? AND provider = ?"
    " ORDER BY created_at, key"
)
# Keyset pagination in (created_at, key) order, so a queue pass never meets a row twice.
NEXT_PENDING = (
    f"SELECT {INTENT_COLUMNS} FROM intents WHERE state = ? AND account = ? AND provider = ?"
    " AND (created_at > ? OR (created_at = ? AND key > ?))"
    " ORDER BY created_at, key LIMIT ?"
)
UNACKNOWLEDGED = (
    f"SELECT {INTENT_COLUMNS} FROM intents WHERE state IN (?, ?) AND acknowledged_at IS NULL"
)
OUTCOMES = (
    f"SELECT {INTENT_COLUMNS} FROM intents WHERE enqueued = 1 AND acknowledged_at IS NULL"
    " AND state IN (?, ?)"
)
"""The enqueued intents settled and not acknowledged (the literals match the index
``intents_outcomes``); the caller appends its filters, ``OUTCOMES_AFTER`` and
``OUTCOMES_ORDER``."""
OUTCOMES_AFTER = " AND (updated_at > ? OR (updated_at = ? AND key > ?))"
OUTCOMES_ORDER = " ORDER BY updated_at, key LIMIT ?"
FIND = (
    f"SELECT {INTENT_COLUMNS} FROM intents WHERE key = ? OR reference = ? ORDER BY created_at DESC"
)
BLOCK = (
    f"SELECT {INTENT_COLUMNS} FROM intents WHERE key = ?"
    " OR (provider = ? AND account = ? AND reference LIKE ? ESCAPE '\\')"
)
"""A block's rows: its step 1 by key, its steps by their references' common beginning
(``order-7#step``; ``like_prefix``). LIKE ignores case in SQLite: the caller keeps the
references that are exactly its steps'."""
LIST = f"SELECT {INTENT_COLUMNS} FROM intents"
SCAN_INTENTS = LIST + " WHERE key > ? ORDER BY key LIMIT ?"
"""A page of every intent, by key: ``journal.check`` reads them all so."""
NEWEST = " ORDER BY created_at DESC, key DESC"


def newest_in_states(count: int) -> str:
    """The newest intents of ``count`` states, at most ``?`` of them: parameters are each
    state with the limit after it, then the limit again.

    One ordered, limited look-up per state, each read backwards from the (state,
    created_at) index, then merged: ``state IN (...)`` would read every intent of those
    states and sort them all (0.7 s for succeeded and failed at a million intents).
    """
    one = f"SELECT * FROM ({LIST} WHERE state = ?{NEWEST} LIMIT ?) AS s{{}}"
    merged = " UNION ALL ".join(one.format(number) for number in range(count))
    return f"SELECT * FROM ({merged}) AS newest{NEWEST} LIMIT ?"


ATTEMPTS = f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE key = ? ORDER BY number"
ATTEMPTS_BEFORE_BOOT_CLOCK = ATTEMPTS.replace("boottime", "NULL AS boottime").replace(
    "boot,", "NULL AS boot,"
)
"""The same, for a journal of schema 7 opened read-only (never migrated)."""
ATTEMPTS_BEFORE_SENT_TO = ATTEMPTS_BEFORE_BOOT_CLOCK.replace("sent_to", "NULL AS sent_to")
"""The same, for a journal of schema 6 opened read-only (never migrated)."""
ATTEMPTS_BEFORE_PROVIDER_DATE = ATTEMPTS_BEFORE_SENT_TO.replace(
    "provider_date", "NULL AS provider_date"
)
"""The same, for a journal of schema 5 or older opened read-only (never migrated)."""
RECONCILIATIONS = (
    f"SELECT {RECONCILIATION_COLUMNS} FROM reconciliations WHERE key = ? ORDER BY at, "
)
ESCALATE = (
    "INSERT INTO escalations (key, unknown_since, at, tries, reason)"
    " SELECT key, ?, ?, ?, ? FROM intents WHERE key = ? AND state = ?"
    # Several workers escalating the same time it went unknown: the primary key lets one
    # insert win; the others insert nothing, and say nothing.
    " ON CONFLICT DO NOTHING"
)
ESCALATIONS = (
    f"SELECT {ESCALATION_COLUMNS} FROM escalations WHERE key = ? ORDER BY unknown_since, at"
)


def in_key_range(statement: str, *, bounded: bool) -> str:
    """A read of one intent's rows (``... WHERE key = ? ...``) over a range of intents
    instead: those keyed after ``?`` (and up to the second ``?`` when ``bounded``)."""
    head = statement.split(" WHERE key = ?", 1)[0]
    return head + (" WHERE key > ? AND key <= ?" if bounded else " WHERE key > ?")


META = "SELECT name, value FROM payonce_meta"
UPSERT_META = (
    "INSERT INTO payonce_meta (name, value) VALUES (?, ?)"
    " ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
COUNT_BY_STATE = "SELECT state, count(*) FROM intents GROUP BY state"
COUNT_UNACKNOWLEDGED = (
    "SELECT count(*) FROM intents WHERE state IN (?, ?) AND acknowledged_at IS NULL"
)

# -- pruning -------------------------------------------------------------------------------

PRUNABLE_STATES = (
    IntentState.SUCCEEDED.value,
    IntentState.FAILED.value,
    IntentState.ABANDONED.value,
)
# Final and untouched since the cut-off, of one provider and created before its key-age
# floor, and (unless abandoned, which has no outcome to hand over, or unacknowledged ones
# are given up explicitly) acknowledged by the caller before the cut-off. Parameters: the
# three final states, the cut-off, the provider, the floor, the abandoned state, the cut-off
# again, whether unacknowledged outcomes go too.
_PRUNABLE = (
    "state IN (?, ?, ?) AND updated_at < ? AND provider = ? AND created_at < ?"
    " AND (state = ? OR acknowledged_at < ? OR (acknowledged_at IS NULL AND ?))"
)
PROVIDERS = "SELECT DISTINCT provider FROM intents"
ACCOUNTS = "SELECT DISTINCT account FROM intents"
COUNT_PRUNABLE = f"SELECT count(*) FROM intents WHERE {_PRUNABLE}"
LIST_PRUNABLE = (
    f"SELECT {INTENT_COLUMNS} FROM intents WHERE {_PRUNABLE} ORDER BY updated_at, key LIMIT ?"
)
# One bounded batch; its attempts and reconciliations go with it (ON DELETE CASCADE). The
# dialect appends SKIP LOCKED to the inner SELECT where rows are locked one by one, so a
# batch never waits for a writer: a row being written is not prunable anyway.
PRUNE_BATCH = (
    "DELETE FROM intents WHERE key IN (SELECT key FROM intents WHERE "
    + _PRUNABLE
    + " LIMIT ?{skip_locked})"
)
