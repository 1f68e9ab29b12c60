"""Operating the journal: integrity checks and backups that include the WAL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import payonce
from helpers.payments import PAYMENT


def test_a_backup_holds_rows_still_in_the_wal_file(client: payonce.Client, tmp_path: Path) -> None:
    for n in range(5):
        client.post("/v1/payments", json=PAYMENT, reference=f"order-{n}")
    journal = client.journal
    assert isinstance(journal, payonce.journal.SQLiteJournal)
    assert Path(journal.location + "-wal").stat().st_size > 0, "rows are still in the WAL"

    copy = journal.backup(tmp_path / "backup.db")

    with sqlite3.connect(copy) as conn:
        states = [state for (state,) in conn.execute("SELECT state FROM intents")]
    assert states == ["succeeded"] * 5
    restored = payonce.journal.SQLiteJournal(copy)
    assert len(restored.list_intents()) == 5
    assert copy.stat().st_mode & 0o777 == 0o600
    restored.close()


def test_a_backup_never_overwrites_an_existing_file(client: payonce.Client, tmp_path: Path) -> None:
    existing = tmp_path / "precious.db"
    existing.write_bytes(b"keep me")
    journal = client.journal
    assert isinstance(journal, payonce.journal.SQLiteJournal)
    with pytest.raises(payonce.JournalError, match="will not overwrite"):
        journal.backup(existing)
    assert existing.read_bytes() == b"keep me"


def test_check_reports_states_and_an_intact_journal(client: payonce.Client) -> None:
    client.post("/v1/payments", json=PAYMENT, reference="order-1")
    with client.intent("order-2", acknowledge=False) as op:
        op.post("/v1/payments", json=PAYMENT)
    journal = client.journal
    assert isinstance(journal, payonce.journal.SQLiteJournal)

    report = journal.check()

    assert report.ok
    assert report.problems == ()
    assert report.intents_by_state == {"succeeded": 2}
    assert report.unacknowledged == 1
    assert report.schema_version >= 2
    assert report.size_bytes > 0


def test_finding_an_intent_by_reference_uses_an_index(client: payonce.Client) -> None:
    client.post("/v1/payments", json=PAYMENT, reference="order-1")
    journal = client.journal
    assert isinstance(journal, payonce.journal.SQLiteJournal)
    with sqlite3.connect(journal.location) as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT key FROM intents WHERE key = ? OR reference = ?",
            ("x", "order-1"),
        ).fetchall()
    details = " | ".join(str(row[-1]) for row in plan)
    assert "intents_reference" in details, details
    assert "SCAN intents" not in details, details
