"""The reads an operator makes of a big journal go through an index, never a scan of every
intent: `payonce intents show REF`, `payonce intents list --state S --limit N` and the
queue `resume` works through. bench/journal_size.py times them at a million intents; this
checks the plans SQLite chooses for the statements the journal really runs (caught by
SQLite's own trace), so a change of statement or index that loses the index shows here.
Plans, never times."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import payonce
from helpers.journals import RESPONSE, IntentStore, draft_for, store_of
from payonce._lifecycle import Transition
from payonce.journal import SQLiteJournal

NOW = 1_800_000_000.0


@pytest.fixture
def journal(tmp_path: Path) -> SQLiteJournal:
    journal = SQLiteJournal(tmp_path / "journal.db")
    store = store_of(journal)
    for number in range(3):
        claim = store.claim(draft_for(number), owner="w", now=NOW + number, lease_seconds=60)
        if number:
            store.settle(
                claim.record.key,
                owner="w",
                now=NOW + number,
                transition=Transition.SUCCEEDED,
                response=RESPONSE,
                attempt=1,
            )
    return journal


@pytest.fixture
def store(journal: SQLiteJournal) -> IntentStore:
    """The journal's private writes, as a client on it makes them."""
    return store_of(journal)


def statements_of(journal: SQLiteJournal, read: object) -> list[str]:
    """The SELECTs of intents that ``read()`` ran, with their parameters filled in."""
    assert callable(read)
    seen: list[str] = []
    journal._engine.conn.set_trace_callback(seen.append)
    try:
        read()
    finally:
        journal._engine.conn.set_trace_callback(None)
    return [s for s in seen if s.startswith("SELECT") and "FROM intents" in s]


def plan_of(journal: SQLiteJournal, statement: str) -> list[str]:
    # The trace spells an infinite parameter "Inf", which SQLite cannot read back.
    statement = re.sub(r"\bInf\b", "9e999", statement)
    steps = journal._engine.conn.execute("EXPLAIN QUERY PLAN " + statement).fetchall()
    return [str(step[-1]) for step in steps]


def assert_no_scan_of_intents(journal: SQLiteJournal, statements: list[str]) -> list[str]:
    assert statements, "the read ran no SELECT of intents"
    details = []
    for statement in statements:
        plan = plan_of(journal, statement)
        # "SCAN intents" alone reads every row; "SEARCH intents USING INDEX" does not.
        assert not [step for step in plan if step.startswith("SCAN intents")], (statement, plan)
        details += plan
    return details


def test_showing_an_intent_by_its_reference_searches_the_reference_index(
    journal: SQLiteJournal,
) -> None:
    statements = statements_of(journal, lambda: journal.find("order-00001"))

    plan = assert_no_scan_of_intents(journal, statements)

    assert any("USING INDEX intents_reference" in step for step in plan), plan
    assert [r.reference for r in journal.find("order-00001")] == ["order-00001"]


def test_showing_an_intent_by_its_key_searches_the_primary_key(journal: SQLiteJournal) -> None:
    statements = statements_of(journal, lambda: journal.find("key-00002"))

    assert_no_scan_of_intents(journal, statements)
    assert [r.key for r in journal.find("key-00002")] == ["key-00002"]


@pytest.mark.parametrize(
    "states",
    [
        [payonce.IntentState.PENDING],
        [payonce.IntentState.PENDING, payonce.IntentState.UNKNOWN],
        [payonce.IntentState.SUCCEEDED, payonce.IntentState.FAILED],
    ],
)
def test_listing_by_state_searches_the_state_index(
    journal: SQLiteJournal, states: list[payonce.IntentState]
) -> None:
    statements = statements_of(journal, lambda: journal.list_intents(states=states, limit=50))

    plan = assert_no_scan_of_intents(journal, statements)

    # Each state read backwards from its own part of the index, LIMIT rows at most: never
    # every intent of those states sorted (succeeded and failed are nearly all of them).
    searches = [step for step in plan if step.startswith("SEARCH intents")]
    assert searches == ["SEARCH intents USING INDEX intents_state_created (state=?)"] * len(
        states
    ), plan


def test_the_resume_queue_searches_the_state_index(
    journal: SQLiteJournal, store: IntentStore
) -> None:
    def next_pending() -> None:
        claim = store.claim_next_pending(
            account="acct_demo", provider="sandbox", owner="r", now=time.time(), lease_seconds=60
        )
        assert claim is not None

    statements = statements_of(journal, next_pending)

    plan = assert_no_scan_of_intents(journal, statements)

    assert any("USING INDEX intents_state_created" in step for step in plan), plan
