"""Reading commands never write: ``intents list``, ``intents show``, ``ack --list`` and
``journal check`` open the journal read-only.

They never create, migrate or lock a journal: an empty file stays empty (byte for byte,
mtime included), an older schema is read as it is, and they read the last committed state
while another connection holds the write lock. Run through click's runner against real
SQLite files and a real PostgreSQL database (tests/pgserver.py).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import payonce
from helpers.cli import CliResult, run_cli
from helpers.journals import draft_for, raw_transaction, rows, settle, store_of
from payonce._journal import _sql as sql
from payonce._journal._engine import Tx
from payonce._journal._schema import (
    ESCALATIONS_SCHEMA,
    PER_CALL_KEYS_SCHEMA,
    SCHEMA_VERSION,
)
from payonce._lifecycle import Transition

V1_JOURNAL = Path(__file__).parent / "data" / "journal_v1.sql"

READING = [
    ["intents", "list"],
    ["intents", "list", "--json"],
    ["intents", "show", "order-00001"],
    ["intents", "show", "order-00001", "--json"],
    ["ack", "--list"],
    ["ack", "--list", "--json"],
    ["journal", "check"],
    ["journal", "check", "--json"],
]


def _json(result: CliResult) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _file_state(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def _two_intents(location: str | Path) -> None:
    """order-00001 succeeded and not acknowledged yet; order-00002 pending."""
    with payonce.open_journal(str(location)) as journal:
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
        settle(store, "key-00001", "w", 1001.0)
        store.claim(draft_for(2), owner="w", now=1002.0, lease_seconds=30)
        store.release("key-00002", owner="w")


def _tables(location: str) -> list[str]:
    if sql.is_postgres_url(location):
        found = rows(location, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    else:
        found = rows(location, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return sorted(str(row[0]) for row in found)


def _schema_version(location: str) -> str:
    ((version,),) = rows(location, "SELECT value FROM payonce_meta WHERE name = 'schema_version'")
    return str(version)


# -- an empty journal stays empty ------------------------------------------------------------


def _schema_less_sqlite(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version = 7")  # a valid SQLite file with no table at all
    path.chmod(0o600)


@pytest.mark.parametrize("make", [Path.touch, _schema_less_sqlite], ids=["empty", "no-tables"])
@pytest.mark.parametrize("command", READING, ids=" ".join)
def test_a_file_that_is_no_journal_yet_is_reported_and_left_exactly_as_it_was(
    tmp_path: Path, make: Any, command: list[str]
) -> None:
    path = tmp_path / "journal.db"
    make(path)
    before = _file_state(path)

    result = run_cli([*command, "--journal", str(path)])

    assert _file_state(path) == before  # not a byte written, not even touched
    assert "Traceback" not in result.output
    if command[:2] == ["journal", "check"]:
        assert result.exit_code == 1
        if "--json" in command:
            report = json.loads(result.stdout)
            assert (report["ok"], report["schema_version"]) == (False, 0)
            (problem,) = report["problems"]
            assert problem.startswith("not a payonce journal yet")
        else:
            assert "not a payonce journal yet" in result.stdout
    else:
        assert result.exit_code == 2
        assert result.stderr.startswith("error: not a payonce journal yet")
        assert str(path) in result.stderr
        assert result.stdout == ""


@pytest.mark.parametrize("command", READING, ids=" ".join)
def test_an_empty_postgres_database_gets_no_tables_from_a_reader(
    postgres_url: str, command: list[str]
) -> None:
    result = run_cli([*command, "--journal", str(postgres_url)])

    assert _tables(postgres_url) == []
    assert result.exit_code == (1 if command[0] == "journal" else 2), result.output
    assert "not a payonce journal yet" in result.output


def test_a_missing_journal_is_not_created_by_a_read_only_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with pytest.raises(payonce.JournalError, match="never creates one"):
        payonce.open_journal(path, read_only=True)
    assert not path.exists()


# -- a writer holding the journal does not stop a reader -------------------------------------


@contextlib.contextmanager
def _writer_holding_the_journal(location: str) -> Iterator[None]:
    """Another connection in the middle of a write: it holds the write lock (SQLite: BEGIN
    IMMEDIATE; PostgreSQL: the rows, the table against other writers, and the lock writers
    take to migrate) and has changed a reference it has not committed."""
    change = "UPDATE intents SET reference = 'uncommitted' WHERE key = 'key-00001'"
    if sql.is_postgres_url(location):
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute(change)
            conn.execute("LOCK TABLE intents IN EXCLUSIVE MODE")
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(coalesce(NULL, current_schema(), '')))",
                (0x70796F6E,),
            )
            yield
            conn.execute("ROLLBACK")
    else:
        with contextlib.closing(sqlite3.connect(location, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(change)
            yield
            db.execute("ROLLBACK")


def test_reading_commands_read_the_last_commit_while_a_writer_holds_the_journal(
    location: str,
) -> None:
    _two_intents(location)
    with _writer_holding_the_journal(location):
        listed = _json(run_cli(["intents", "list", "--json", "--journal", str(location)]))
        (shown,) = _json(
            run_cli(["intents", "show", "key-00001", "--json", "--journal", str(location)])
        )
        (unacknowledged,) = _json(run_cli(["ack", "--list", "--json", "--journal", str(location)]))
        report = _json(run_cli(["journal", "check", "--json", "--journal", str(location)]))
        table = run_cli(["intents", "list", "--journal", str(location)])

    assert [item["reference"] for item in listed] == ["order-00002", "order-00001"]
    assert (shown["reference"], shown["state"]) == ("order-00001", "succeeded")
    assert unacknowledged["key"] == "key-00001"
    assert (report["ok"], report["intents"], report["unacknowledged"]) == (True, 2, 1)
    assert table.exit_code == 0, table.output
    assert "order-00001" in table.stdout
    assert "uncommitted" not in table.stdout


# -- an older schema is read as it is, never migrated ----------------------------------------


def _drop_key_terms(tx: Tx) -> None:
    """Schema 10 (key window columns) added each intent's provider profile key terms,
    whether it was enqueued with the index of outcomes not acknowledged (outcomes), its
    credential's fingerprint and account scope (credentials), and named intents by their
    identity (provider, account) and reference instead of their first request's endpoint
    (scope) and reference."""
    tx.execute("DROP INDEX intents_outcomes")
    key_terms = ("key_lifetime", "key_lifetime_documented", "max_processing")
    for column in (*key_terms, "enqueued", "credential", "account_scope"):
        tx.execute(f"ALTER TABLE intents DROP COLUMN {column}")
    tx.execute("DROP INDEX intents_identity_reference")
    tx.execute(
        "CREATE UNIQUE INDEX intents_scope_reference ON intents (scope, reference)"
        " WHERE reference IS NOT NULL"
    )


def _back_to_schema_4(location: str) -> None:
    """What payonce with schema 4 left: schema 5 added the index on references, schema 6 the
    provider's Date of each attempt."""
    with raw_transaction(location) as tx:
        tx.execute("ALTER TABLE intents DROP COLUMN key_per_call")
        _drop_key_terms(tx)
        tx.execute("DROP INDEX intents_reference")
        tx.execute("ALTER TABLE attempts DROP COLUMN provider_date")
        tx.execute("ALTER TABLE attempts DROP COLUMN sent_to")
        tx.execute("DROP TABLE escalations")
        tx.execute("ALTER TABLE attempts DROP COLUMN boot")
        tx.execute("ALTER TABLE attempts DROP COLUMN boottime")
        tx.execute("UPDATE payonce_meta SET value = '4' WHERE name = 'schema_version'")


def _back_to_schema_6(location: str) -> None:
    """What payonce with schema 6 left: schema 7 added the URL each attempt was sent to."""
    with raw_transaction(location) as tx:
        tx.execute("ALTER TABLE intents DROP COLUMN key_per_call")
        _drop_key_terms(tx)
        tx.execute("ALTER TABLE attempts DROP COLUMN sent_to")
        tx.execute("DROP TABLE escalations")
        tx.execute("ALTER TABLE attempts DROP COLUMN boot")
        tx.execute("ALTER TABLE attempts DROP COLUMN boottime")
        tx.execute("UPDATE payonce_meta SET value = '6' WHERE name = 'schema_version'")


def _back_to_schema_7(location: str) -> None:
    """What payonce with schema 7 left: schema 8 added the worker's escalations and each
    attempt's boot clock (and schema 9 whether a key was drawn per call)."""
    with raw_transaction(location) as tx:
        tx.execute("ALTER TABLE intents DROP COLUMN key_per_call")
        _drop_key_terms(tx)
        tx.execute("DROP TABLE escalations")
        tx.execute("ALTER TABLE attempts DROP COLUMN boot")
        tx.execute("ALTER TABLE attempts DROP COLUMN boottime")
        tx.execute("UPDATE payonce_meta SET value = '7' WHERE name = 'schema_version'")


def test_a_schema_6_journal_is_shown_without_urls_and_migrates_with_none_for_old_attempts(
    location: str,
) -> None:
    _two_intents(location)
    _back_to_schema_6(location)

    with payonce.open_journal(location, read_only=True) as journal:  # read as it is
        assert [a.sent_to for a in journal.attempts("key-00001")] == [None]
    (shown,) = _json(run_cli(["intents", "show", "order-00001", "--json", "--journal", location]))
    assert [a["sent_to"] for a in shown["attempts"]] == [None]
    text = run_cli(["intents", "show", "order-00001", "--journal", location]).stdout
    assert "sent_to" not in text  # no column for where attempts went
    assert _schema_version(location) == "6"

    with payonce.open_journal(location) as journal:  # a writer migrates it
        assert journal.schema_version == SCHEMA_VERSION
        store = store_of(journal)
        assert store.claim_key("key-00002", owner="w", now=1003.0, lease_seconds=30)
        store.start_attempt(
            "key-00002", owner="w", now=1004.0, lease_seconds=30, sent_to="https://b.test/v1/p"
        )
        assert [a.sent_to for a in journal.attempts("key-00001")] == [None]
        assert [a.sent_to for a in journal.attempts("key-00002")] == [None, "https://b.test/v1/p"]
    assert _schema_version(location) == str(SCHEMA_VERSION)


def test_a_schema_7_journal_is_shown_without_escalations_and_migrates_to_journal_them(
    location: str,
) -> None:
    _two_intents(location)
    with payonce.open_journal(location) as journal:
        store = store_of(journal)
        assert store.claim_key("key-00002", owner="w", now=1003.0, lease_seconds=30)
        store.mark_unknown(
            "key-00002", transition=Transition.EXHAUSTED, owner="w", now=1003.0, reason="lost"
        )
    _back_to_schema_7(location)

    with payonce.open_journal(location, read_only=True) as journal:  # read as it is
        assert journal.escalations("key-00002") == []
        assert [(a.boot, a.boottime) for a in journal.attempts("key-00002")] == [(None, None)]
    (shown,) = _json(run_cli(["intents", "show", "order-00002", "--json", "--journal", location]))
    assert (shown["state"], shown["escalations"]) == ("unknown", [])
    assert _schema_version(location) == "7"

    with payonce.open_journal(location) as journal:  # a writer migrates it
        assert journal.schema_version == SCHEMA_VERSION > ESCALATIONS_SCHEMA == 8
        store = store_of(journal)
        said = dict(unknown_since=1003.0, now=1100.0, tries=3, reason="HTTP 503")
        assert store.escalate("key-00002", **said) is True
        # The same time it went unknown, again (a restarted worker, another one): not said.
        assert store.escalate("key-00002", **{**said, "now": 1200.0}) is False
        # Another time it went unknown (sent again since) is said again, once.
        assert store.escalate("key-00002", **{**said, "unknown_since": 1500.0}) is True
        # A settled intent is escalated never.
        assert store.escalate("key-00001", **said) is False
        escalation, _ = journal.escalations("key-00002")
    assert (escalation.unknown_since, escalation.at, escalation.tries) == (1003.0, 1100.0, 3)
    assert escalation.reason == "HTTP 503"
    assert _schema_version(location) == str(SCHEMA_VERSION)
    (shown,) = _json(run_cli(["intents", "show", "order-00002", "--json", "--journal", location]))
    assert [e["tries"] for e in shown["escalations"]] == [3, 3]
    text = run_cli(["intents", "show", "order-00002", "--journal", location]).stdout
    assert "escalated\t1970-01-01T00:18:20.000+00:00 after 3 tries" in text


def _back_to_schema_8(location: str) -> None:
    """What payonce with schema 8 left: schema 9 added whether an intent's key was drawn
    for its one call."""
    with raw_transaction(location) as tx:
        tx.execute("ALTER TABLE intents DROP COLUMN key_per_call")
        _drop_key_terms(tx)
        tx.execute("UPDATE payonce_meta SET value = '8' WHERE name = 'schema_version'")


def test_a_schema_8_journal_is_read_with_every_key_named_and_migrates(
    location: str,
) -> None:
    _two_intents(location)
    _back_to_schema_8(location)

    with payonce.open_journal(location, read_only=True) as journal:  # read as it is
        assert [r.key_per_call for r in journal.list_intents()] == [False, False]
        assert journal.get("key-00001") is not None
    listed = run_cli(["intents", "list", "--journal", location])
    assert listed.exit_code == 0, listed.output
    assert "order-00001" in listed.stdout
    assert _schema_version(location) == "8"

    with payonce.open_journal(location) as journal:  # a writer migrates it
        assert journal.schema_version == SCHEMA_VERSION > PER_CALL_KEYS_SCHEMA == 9
        assert [r.key_per_call for r in journal.list_intents()] == [False, False]
    assert _schema_version(location) == str(SCHEMA_VERSION)


def test_an_older_schema_is_read_as_it_is_and_only_migrate_migrates_it(location: str) -> None:
    _two_intents(location)
    _back_to_schema_4(location)
    path = None if sql.is_postgres_url(location) else Path(location)
    before = _file_state(path) if path else None

    for command in READING:
        assert run_cli([*command, "--journal", str(location)]).exit_code == 0, command
    report = _json(run_cli(["journal", "check", "--json", "--journal", str(location)]))
    text = run_cli(["journal", "check", "--journal", str(location)]).stdout

    assert (report["ok"], report["problems"]) == (True, [])
    assert (report["schema_version"], report["latest_schema_version"]) == (4, SCHEMA_VERSION)
    assert f"4 (this payonce writes {SCHEMA_VERSION}" in text
    assert _schema_version(location) == "4"
    if path:
        assert _file_state(path) == before

    migrated = run_cli(["journal", "migrate", "--journal", str(location)])
    assert migrated.exit_code == 0, migrated.output
    assert f"from schema 4 to {SCHEMA_VERSION}" in migrated.stdout
    assert _schema_version(location) == str(SCHEMA_VERSION)
    again = run_cli(["journal", "migrate", "--journal", str(location)])
    assert "nothing to migrate" in again.stdout


def test_schema_1_is_checked_as_it_is_but_listed_only_once_migrated(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(V1_JOURNAL.read_text())
    path.chmod(0o600)
    before = _file_state(path)

    listed = run_cli(["intents", "list", "--journal", str(path)])
    report = _json(run_cli(["journal", "check", "--json", "--journal", str(path)]))

    assert listed.exit_code == 2
    assert "schema 1" in listed.stderr
    assert "payonce journal migrate" in listed.stderr
    assert (report["ok"], report["schema_version"]) == (True, 1)
    # Schema 1 predates acknowledgements: its settled outcome was never acknowledged.
    assert (report["intents_by_state"]["succeeded"], report["unacknowledged"]) == (1, 1)
    assert _file_state(path) == before

    assert run_cli(["journal", "migrate", "--journal", str(path)]).exit_code == 0
    assert "order-v1-0001" in run_cli(["intents", "list", "--journal", str(path)]).stdout


def test_migrate_leaves_a_file_that_is_no_journal_yet_alone(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    path.touch()
    result = run_cli(["journal", "migrate", "--journal", str(path)])
    assert result.exit_code == 2
    assert "not a payonce journal yet" in result.stderr
    assert path.read_bytes() == b""


# -- the library's read-only journal ---------------------------------------------------------


def test_a_read_only_journal_refuses_writes_and_cannot_be_given_to_a_client(
    journal_path: Path,
) -> None:
    _two_intents(journal_path)
    with payonce.open_journal(journal_path, read_only=True) as journal:
        assert journal.read_only
        assert journal.schema_version == SCHEMA_VERSION
        with pytest.raises(payonce.JournalError, match="opened read-only"):
            journal.acknowledge("key-00001", now=2000.0)
        with pytest.raises(payonce.ConfigurationError, match="read_only"):
            payonce.Client(
                base_url="http://127.0.0.1:9",
                provider="sandbox",
                account="acct_demo",
                api_key="sk_test",
                journal=journal,
            )
    assert rows(
        str(journal_path), "SELECT acknowledged_at FROM intents WHERE key = 'key-00001'"
    ) == [(None,)]


def test_a_read_only_open_reports_a_loose_file_mode_and_leaves_it_to_a_writer(
    journal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _two_intents(journal_path)
    journal_path.chmod(0o644)
    with payonce.open_journal(journal_path, read_only=True) as journal:
        assert len(journal.list_intents()) == 2
    assert journal_path.stat().st_mode & 0o777 == 0o644  # reported, not changed by a reader
    assert "chmod 600" in caplog.text
