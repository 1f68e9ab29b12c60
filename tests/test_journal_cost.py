"""What one payment costs the journal, counted with SQLite's own trace of every statement
it runs: a regression in transactions, statements or fsynced commits shows here. Counts,
never times."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

import payonce
from helpers.journals import OpenJournal
from helpers.payments import PAYMENT
from payonce._journal import _acks
from payonce._journal._engine import Tx
from payonce._lifecycle import NOTHING_CHANGED
from payonce.sandbox import SandboxServer

MakeClient = Callable[..., payonce.Client]


@attrs.define
class Trace:
    statements: list[str] = attrs.field(factory=list)

    def clear(self) -> None:
        self.statements.clear()

    @property
    def transactions(self) -> int:
        return sum(s.startswith("BEGIN") for s in self.statements)

    @property
    def durable_transactions(self) -> int:
        """Write transactions committed with synchronous=FULL: each fsyncs the WAL."""
        durable, count = False, 0
        for statement in self.statements:
            if statement.startswith("PRAGMA synchronous"):
                durable = statement.endswith("FULL")
            elif statement.startswith("BEGIN IMMEDIATE"):
                count += durable
        return count

    @property
    def data_statements(self) -> list[str]:
        """What reads or writes rows: not BEGIN, COMMIT or a PRAGMA."""
        control = ("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA")
        return [s for s in self.statements if not s.startswith(control)]


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> Trace:
    """Every statement of every SQLite connection opened from now on."""
    seen = Trace()
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = connect(*args, **kwargs)
        connection.set_trace_callback(seen.statements.append)
        return connection

    monkeypatch.setattr(sqlite3, "connect", traced)
    return seen


@pytest.fixture(autouse=True)
def _no_idle_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the journal's own writes carry acknowledgements here, never the flusher's."""
    monkeypatch.setattr(_acks, "FLUSH_DELAY", 3600.0)


@pytest.fixture
def client(make_client: MakeClient, trace: Trace) -> payonce.Client:
    client = make_client()
    client.post("/v1/payments", json=PAYMENT, reference="warm-up")  # schema, pragmas
    trace.clear()
    return client


def test_a_one_shot_payment_costs_two_transactions_one_of_them_fsynced(
    client: payonce.Client, trace: Trace
) -> None:
    paid = client.post("/v1/payments", json=PAYMENT, reference="order-1")

    assert trace.transactions == 2, trace.statements  # the write-ahead, the settle
    assert trace.durable_transactions == 1, "only the write-ahead is fsynced"
    # The intent and its attempt; the answer and the attempt's end. The settle reads nothing
    # back: its UPDATE matches only the row the claim created, still held.
    verbs = [s.split()[0] for s in trace.data_statements]
    assert verbs == ["INSERT", "INSERT", "UPDATE", "UPDATE"], trace.data_statements
    (record,) = client.journal.find("order-1")
    assert record.acknowledged_at is not None, "acknowledged with the settle"
    assert payonce.response_info(paid).key == record.key  # type: ignore[union-attr]


def test_replaying_an_acknowledged_payment_is_one_transaction_that_changes_nothing(
    client: payonce.Client, trace: Trace
) -> None:
    client.post("/v1/payments", json=PAYMENT, reference="order-1")
    trace.clear()

    client.post("/v1/payments", json=PAYMENT, reference="order-1")

    # The claim finds the settled intent; no second acknowledgement is written.
    assert trace.transactions == 1, trace.statements
    verbs = [s.split()[0] for s in trace.data_statements]
    assert verbs == ["INSERT", "SELECT"], trace.data_statements  # INSERT ... ON CONFLICT


def test_a_block_costs_two_transactions_its_acknowledgement_riding_in_the_next_write(
    client: payonce.Client, trace: Trace, journal_path: Path
) -> None:
    with client.intent("order-2") as op:
        op.post("/v1/payments", json=PAYMENT)

    # Not folded into the settle (code ran in between), and no transaction of its own.
    assert (trace.transactions, trace.durable_transactions) == (2, 1), trace.statements
    assert len(trace.data_statements) == 4, trace.data_statements
    assert _acknowledged_in_the_file(journal_path, "order-2") is None, "only in memory yet"
    trace.clear()

    client.post("/v1/payments", json=PAYMENT, reference="order-3")

    # The next intent's write-ahead carries it: one statement more, no transaction more.
    assert (trace.transactions, trace.durable_transactions) == (2, 1), trace.statements
    assert len(trace.data_statements) == 5, trace.data_statements
    assert trace.data_statements[0].startswith("UPDATE intents SET acknowledged_at")
    assert _acknowledged_in_the_file(journal_path, "order-2") is not None


def test_a_read_through_the_same_journal_writes_the_waiting_acknowledgements_first(
    client: payonce.Client, trace: Trace, journal_path: Path
) -> None:
    with client.intent("order-2") as op:
        op.post("/v1/payments", json=PAYMENT)
    trace.clear()

    assert client.unacknowledged() == [], "it reads its own acknowledgements"

    assert (trace.transactions, trace.durable_transactions) == (1, 0), trace.statements
    (record,) = client.journal.find("order-2")
    assert record.acknowledged_at is not None
    assert _acknowledged_in_the_file(journal_path, "order-2") == record.acknowledged_at


def test_closing_the_client_writes_the_waiting_acknowledgements(
    client: payonce.Client, journal_path: Path
) -> None:
    with client.intent("order-2") as op:
        op.post("/v1/payments", json=PAYMENT)

    client.close()

    assert _acknowledged_in_the_file(journal_path, "order-2") is not None


def test_an_idle_worker_writes_its_acknowledgements_after_a_short_delay(
    client: payonce.Client, journal_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_acks, "FLUSH_DELAY", 0.05)
    with client.intent("order-2") as op:
        op.post("/v1/payments", json=PAYMENT)

    # No write follows: the flusher writes it. Waited for, with room for a loaded machine.
    deadline = time.monotonic() + 30.0
    while _acknowledged_in_the_file(journal_path, "order-2") is None:
        assert time.monotonic() < deadline, "the idle flush never came"
        time.sleep(0.02)


def test_a_block_left_with_its_outcome_unknown_acknowledges_nothing(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    client = make_client(retry=payonce.RetryPolicy(max_attempts=1))
    sandbox.script(["drop_after"])  # executed, the answer lost: unknown
    with client.intent("order-2") as op, pytest.raises(payonce.OutcomeUnknown):
        op.post("/v1/payments", json=PAYMENT)  # caught inside: the block ends normally
    client.close()

    assert op.state is payonce.IntentState.UNKNOWN
    assert _acknowledged_in_the_file(journal_path, "order-2") is None


def test_a_declined_one_shot_payment_stays_unacknowledged(
    client: payonce.Client, trace: Trace
) -> None:
    with pytest.raises(payonce.ProviderError):
        client.post("/v1/payments", json={"amount": 40200, "currency": "eur"}, reference="o-3")

    assert trace.transactions == 2, trace.statements
    (record,) = client.journal.find("o-3")
    assert record.state is payonce.IntentState.FAILED
    assert record.acknowledged_at is None, "the caller got an exception: it may not have seen it"
    assert [r.key for r in client.unacknowledged()] == [record.key]


@pytest.mark.anyio
async def test_an_async_one_shot_payment_costs_the_same_two_transactions(
    make_async_client: Callable[..., payonce.AsyncClient], trace: Trace
) -> None:
    client = make_async_client()
    await client.post("/v1/payments", json=PAYMENT, reference="warm-up")
    trace.clear()

    await client.post("/v1/payments", json=PAYMENT, reference="order-4")

    assert (trace.transactions, trace.durable_transactions) == (2, 1), trace.statements
    assert len(trace.data_statements) == 4, trace.data_statements
    (record,) = client.journal.find("order-4")
    assert record.acknowledged_at is not None


@pytest.mark.anyio
async def test_an_async_block_costs_the_same_and_acknowledges_on_the_loop(
    make_async_client: Callable[..., payonce.AsyncClient], trace: Trace, journal_path: Path
) -> None:
    client = make_async_client()
    await client.post("/v1/payments", json=PAYMENT, reference="warm-up")
    trace.clear()

    async with client.intent("order-5") as op:
        await op.post("/v1/payments", json=PAYMENT)
    assert (trace.transactions, trace.durable_transactions) == (2, 1), trace.statements
    assert len(trace.data_statements) == 4, trace.data_statements

    await client.post("/v1/payments", json=PAYMENT, reference="order-6")
    assert _acknowledged_in_the_file(journal_path, "order-5") is not None


def test_on_either_backend_another_process_sees_the_acknowledgement_once_written(
    make_client: MakeClient, open_journal: OpenJournal, location: str
) -> None:
    client = make_client(journal=location)
    other = open_journal()  # another host's view: it has only what was committed
    with client.intent("order-7") as op:
        op.post("/v1/payments", json=PAYMENT)
    assert [r.reference for r in other.unacknowledged()] == ["order-7"]

    client.post("/v1/payments", json=PAYMENT, reference="order-8")

    assert other.unacknowledged() == []
    (record,) = other.find("order-7")
    assert record.acknowledged_at is not None


def test_acknowledgements_whose_write_failed_wait_for_the_next_one(
    client: payonce.Client, journal_path: Path
) -> None:
    with client.intent("order-9") as op:
        op.post("/v1/payments", json=PAYMENT)

    def refused(tx: Tx) -> None:
        raise payonce.JournalError("this write fails", location="here")

    with pytest.raises(payonce.JournalError):
        client.journal._engine.write(refused, durable=False, busy=NOTHING_CHANGED)
    assert _acknowledged_in_the_file(journal_path, "order-9") is None, "rolled back with it"

    client.post("/v1/payments", json=PAYMENT, reference="order-10")
    assert _acknowledged_in_the_file(journal_path, "order-9") is not None


def _acknowledged_in_the_file(journal_path: Path, reference: str) -> float | None:
    """When the journal file, read by another connection, says ``reference`` was
    acknowledged: what another process (``payonce ack --list``) would see."""
    with payonce.open_journal(journal_path, read_only=True) as journal:
        (record,) = journal.find(reference)
    return record.acknowledged_at
