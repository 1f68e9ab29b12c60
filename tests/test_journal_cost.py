"""What one payment costs the journal, counted with SQLite's own trace of every statement
it runs: a regression in transactions, statements or fsynced commits shows here. Counts,
never times."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import attrs
import pytest

import payonce
from helpers.payments import PAYMENT

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
    assert len(trace.data_statements) == 5, trace.data_statements
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


def test_a_block_acknowledges_when_it_ends_in_a_transaction_of_its_own(
    client: payonce.Client, trace: Trace
) -> None:
    with client.intent("order-2") as op:
        op.post("/v1/payments", json=PAYMENT)
        (settled,) = client.journal.find("order-2")
        trace.clear()
        assert settled.acknowledged_at is None, "the block has not dealt with it yet"

    # Not folded into the settle: code ran in between. Not fsynced either.
    assert (trace.transactions, trace.durable_transactions) == (1, 0), trace.statements
    (record,) = client.journal.find("order-2")
    assert record.acknowledged_at is not None


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
    assert len(trace.data_statements) == 5, trace.data_statements
    (record,) = client.journal.find("order-4")
    assert record.acknowledged_at is not None
