"""The journal schema and its forward migrations, in one place, for every backend.

Migration N takes a journal from schema N-1 to N. They only ever add: a journal written by
an older payonce opens, migrates, and replays its stored responses byte for byte.

The statements are written once, in the SQL both SQLite and PostgreSQL accept, with the
two column types they spell differently left as ``{BLOB}`` and ``{REAL}``: each dialect
renders them (SQLite keeps the names its journals have always had on disk).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Mapping

import attrs

__all__ = [
    "APPLICATION",
    "BOOT_CLOCK_SCHEMA",
    "ESCALATIONS_SCHEMA",
    "KEY_TERMS_SCHEMA",
    "MIGRATIONS",
    "PER_CALL_KEYS_SCHEMA",
    "PROVIDER_DATE_SCHEMA",
    "SCHEMA_VERSION",
    "SENT_TO_SCHEMA",
    "SchemaParts",
    "parts_at",
    "render_migrations",
]

APPLICATION = "payonce"

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: intents, attempts, meta.
    (
        "CREATE TABLE payonce_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """
        CREATE TABLE intents (
            key TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            reference TEXT,
            account TEXT NOT NULL,
            provider TEXT NOT NULL,
            method TEXT NOT NULL,
            url TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            request_headers TEXT NOT NULL,
            request_body {BLOB} NOT NULL,
            state TEXT NOT NULL,
            created_at {REAL} NOT NULL,
            updated_at {REAL} NOT NULL,
            first_sent_at {REAL},
            lease_owner TEXT,
            lease_expires_at {REAL},
            response_status INTEGER,
            response_headers TEXT,
            response_body {BLOB}
        )
        """,
        "CREATE UNIQUE INDEX intents_scope_reference ON intents (scope, reference) "
        "WHERE reference IS NOT NULL",
        """
        CREATE TABLE attempts (
            key TEXT NOT NULL REFERENCES intents (key) ON DELETE CASCADE,
            number INTEGER NOT NULL,
            started_at {REAL} NOT NULL,
            ended_at {REAL},
            status_code INTEGER,
            error TEXT,
            PRIMARY KEY (key, number)
        )
        """,
    ),
    # 2: unknown and abandon reasons, outbox acknowledgement, provenance of stored
    #    responses, per-attempt ambiguity, reconciliations, and indexes for listing.
    (
        "ALTER TABLE intents ADD COLUMN unknown_reason TEXT",
        "ALTER TABLE intents ADD COLUMN acknowledged_at {REAL}",
        "ALTER TABLE intents ADD COLUMN response_body_stored INTEGER",
        "ALTER TABLE intents ADD COLUMN response_stored_by TEXT",
        "ALTER TABLE intents ADD COLUMN response_schema INTEGER",
        "ALTER TABLE attempts ADD COLUMN ambiguous INTEGER",
        "CREATE INDEX intents_state_created ON intents (state, created_at)",
        "CREATE INDEX intents_created ON intents (created_at)",
        "ALTER TABLE intents ADD COLUMN abandon_reason TEXT",
        """
        CREATE TABLE reconciliations (
            key TEXT NOT NULL REFERENCES intents (key) ON DELETE CASCADE,
            at {REAL} NOT NULL,
            outcome TEXT NOT NULL,
            detail TEXT NOT NULL,
            status_code INTEGER
        )
        """,
        "CREATE INDEX reconciliations_key ON reconciliations (key, at)",
    ),
    # 3: the webhook inbox: one row per (endpoint, event id), leased while a handler runs.
    (
        """
        CREATE TABLE webhook_events (
            endpoint TEXT NOT NULL,
            event_id TEXT NOT NULL,
            type TEXT NOT NULL,
            payload_hash TEXT NOT NULL,
            received_at {REAL} NOT NULL,
            updated_at {REAL} NOT NULL,
            processed_at {REAL},
            lease_owner TEXT,
            lease_expires_at {REAL},
            deliveries INTEGER NOT NULL,
            handler_runs INTEGER NOT NULL,
            last_error TEXT,
            PRIMARY KEY (endpoint, event_id)
        )
        """,
        "CREATE INDEX webhook_events_processed ON webhook_events (processed_at, received_at)",
    ),
    # 4: pruning finds the settled intents untouched since a cut-off through an index, in
    #    bounded batches, however big the journal has grown.
    ("CREATE INDEX intents_state_updated ON intents (state, updated_at)",),
    # 5: `payonce intents show REF` and `reconcile REF` find intents by the caller's
    #    reference alone (any scope); without this they scanned the whole table.
    ("CREATE INDEX intents_reference ON intents (reference) WHERE reference IS NOT NULL",),
    # 6: the provider's time in an attempt's answer (its Date), beside this host's: a key's
    #    age is judged by the clock the provider forgets it by.
    ("ALTER TABLE attempts ADD COLUMN provider_date {REAL}",),
    # 7: the URL each attempt was sent to: a resume by a client of another base URL sends
    #    the journaled path to its own host, so the intent's URL alone does not tell where.
    ("ALTER TABLE attempts ADD COLUMN sent_to TEXT",),
    # 8 (escalations): a worker's escalation of an unknown intent, one per time it went
    #    unknown, so it is said once across restarts and by one of the workers sharing a
    #    journal (the primary key arbitrates).
    # 8 (boot clock): each attempt dated by its host's boot and boot clock too, which no
    #    wall-clock step moves: a key's age cannot look young after a clock set right.
    (
        "ALTER TABLE attempts ADD COLUMN boot TEXT",
        "ALTER TABLE attempts ADD COLUMN boottime {REAL}",
        """
        CREATE TABLE escalations (
            key TEXT NOT NULL REFERENCES intents (key) ON DELETE CASCADE,
            unknown_since {REAL} NOT NULL,
            at {REAL} NOT NULL,
            tries INTEGER NOT NULL,
            reason TEXT NOT NULL,
            PRIMARY KEY (key, unknown_since)
        )
        """,
    ),
    # 9 (per-call keys): whether an intent's key was drawn for its one call (an SDK's own
    #    per-call key, or payonce's for a request outside any block that carried none), so
    #    that no resume or worker resends what the code run again paid under another key.
    ("ALTER TABLE intents ADD COLUMN key_per_call INTEGER",),
    # 10 (key window columns): the key terms of the provider profile each intent was
    #    journaled with (``KeyTerms``): a process that drives it later rebuilds the profile
    #    from its name alone, and an app's shortened lifetime kept that name. NULL in older
    #    rows: the built-in profile of the name, as before.
    # 10 (outcomes): whether an intent was enqueued (the outbox), whose caller learns its
    #    outcome from ``outcomes()`` rather than from a call's answer; the index finds the
    #    enqueued outcomes not acknowledged yet in the order they settled.
    # 10 (credentials): the fingerprint of the credential that sent each intent (never the
    #    secret) and the account scope its request named (Stripe-Account): only a credential
    #    of that fingerprint sends it again or looks it up (``_lifecycle._credential``).
    (
        "ALTER TABLE intents ADD COLUMN key_lifetime {REAL}",
        "ALTER TABLE intents ADD COLUMN key_lifetime_documented INTEGER",
        "ALTER TABLE intents ADD COLUMN max_processing {REAL}",
        "ALTER TABLE intents ADD COLUMN enqueued INTEGER",
        "CREATE INDEX intents_outcomes ON intents (updated_at, key)"
        " WHERE enqueued = 1 AND acknowledged_at IS NULL",
        "ALTER TABLE intents ADD COLUMN credential TEXT",
        "ALTER TABLE intents ADD COLUMN account_scope TEXT",
        # (identity) An intent is named by its identity, its provider and account (the
        # credential that sends it joins them), and the caller's reference: never by its
        # first request's endpoint (``scope``), so a block whose first request differs
        # between runs (the customer created in the first, skipped in the next) is the
        # same intent under the same key.
        "DROP INDEX intents_scope_reference",
        "CREATE UNIQUE INDEX intents_identity_reference ON intents (provider, account, reference)"
        " WHERE reference IS NOT NULL",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
PROVIDER_DATE_SCHEMA = 6
"""The schema whose attempts carry the provider's ``Date``: an older one, opened read-only,
is read with none."""
SENT_TO_SCHEMA = 7
"""The schema whose attempts carry the URL each was sent to: an older one, opened
read-only, is read with none."""
ESCALATIONS_SCHEMA = 8
"""The schema that journals escalations: an older one, opened read-only, has none."""
BOOT_CLOCK_SCHEMA = 8
"""The schema whose attempts carry their host's boot clock: an older one, opened
read-only, is read with none."""
PER_CALL_KEYS_SCHEMA = 9
"""The schema whose intents say whether their key was drawn per call: an older one, opened
read-only, is read as none (every key named by its caller or its block)."""
KEY_TERMS_SCHEMA = 10
"""The schema whose intents carry their provider profile's key terms, their credential's
fingerprint and their account scope: an older one, opened read-only, is read with none."""


def render_migrations(types: Mapping[str, str]) -> tuple[tuple[str, ...], ...]:
    """The migrations with ``{BLOB}`` and ``{REAL}`` spelled as one dialect spells them."""
    return tuple(tuple(statement.format_map(types) for statement in step) for step in MIGRATIONS)


@attrs.frozen
class SchemaParts:
    """The tables (with their columns) and indexes a journal of one schema version has."""

    columns: Mapping[str, frozenset[str]]
    indexes: frozenset[str]


@functools.cache
def parts_at(version: int) -> SchemaParts:
    """What migrations 1 to ``version`` create, read back from a scratch SQLite database.

    Read back rather than parsed from the statements, so this can never disagree with them.
    The names are the same in every dialect; only two column types differ.
    """
    with contextlib.closing(sqlite3.connect(":memory:")) as scratch:
        for step in render_migrations({"BLOB": "BLOB", "REAL": "REAL"})[:version]:
            for statement in step:
                scratch.execute(statement)
        catalog = scratch.execute("SELECT type, name FROM sqlite_master").fetchall()
        tables = [name for kind, name in catalog if kind == "table"]
        columns = {
            table: frozenset(row[1] for row in scratch.execute(f"PRAGMA table_info({table})"))
            for table in tables
        }
    indexes = frozenset(
        name for kind, name in catalog if kind == "index" and not name.startswith("sqlite_")
    )
    return SchemaParts(columns=columns, indexes=indexes)
