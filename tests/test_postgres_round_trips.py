"""What one payment costs on a PostgreSQL journal, in round trips to a real server: each
transaction payonce needs reaches the server as one round trip (its statements pipelined,
dependent writes chained in one statement, prepared once a connection has used them).
Counted by a relay on the wire between the journal's pool and the server; counts, never
times."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import payonce
from helpers.payments import PAYMENT
from helpers.pgwire import RoundTripCounter, counting_round_trips
from payonce._journal import _acks
from payonce._journal._postgres import PostgresJournal
from payonce.sandbox import SandboxServer

MakeClient = Callable[..., payonce.Client]

# One of the journal's own statements, as its text travels before it is prepared.
WRITE_AHEAD_TEXT = b"INSERT INTO intents"
LAZY_COMMIT = b"synchronous_commit"  # set off for a settle, left as the server has it otherwise


@pytest.fixture(autouse=True)
def _no_idle_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the journal's own writes carry acknowledgements here, never the flusher's."""
    monkeypatch.setattr(_acks, "FLUSH_DELAY", 3600.0)


@pytest.fixture
def wire(postgres_url: str) -> Iterator[tuple[str, RoundTripCounter]]:
    with counting_round_trips(postgres_url) as relayed:
        yield relayed


@pytest.fixture
def counter(wire: tuple[str, RoundTripCounter]) -> RoundTripCounter:
    return wire[1]


@pytest.fixture
def client(
    wire: tuple[str, RoundTripCounter], counter: RoundTripCounter, make_client: MakeClient
) -> payonce.Client:
    """A client on a PostgreSQL journal reached through the counting relay (which outlives
    it), opened (its schema created, its pool filled) before counting starts."""
    client = make_client(journal=wire[0])
    counter.reset()
    return client


def pay(client: payonce.Client, reference: str, **options: Any) -> Any:
    return client.post("/v1/payments", json=PAYMENT, reference=reference, **options)


def test_a_one_shot_payment_costs_two_round_trips_the_write_ahead_and_the_settle(
    client: payonce.Client, counter: RoundTripCounter
) -> None:
    pay(client, "order-1")

    assert counter.round_trips == 2, counter.flights
    write_ahead, settle = counter.flights
    # The durability budget rides in the same round trips: the write-ahead commits with
    # the server's synchronous_commit (flushed before the request left), the settle not.
    assert WRITE_AHEAD_TEXT in write_ahead
    assert LAZY_COMMIT not in write_ahead
    assert LAZY_COMMIT in settle
    (record,) = client.journal.find("order-1")
    assert record.state is payonce.IntentState.SUCCEEDED
    assert record.acknowledged_at is not None, "acknowledged with the settle"
    assert [a.ended_at is not None for a in client.journal.attempts(record.key)] == [True]


def test_with_synchronous_settles_the_settle_waits_for_the_server_and_stays_one_round_trip(
    wire: tuple[str, RoundTripCounter],
    counter: RoundTripCounter,
    make_client: MakeClient,
    closing: contextlib.ExitStack,
) -> None:
    journal = closing.enter_context(PostgresJournal(wire[0], synchronous_settles=True))
    client = make_client(journal=journal)
    counter.reset()

    pay(client, "order-1")

    assert counter.round_trips == 2, counter.flights
    assert all(LAZY_COMMIT not in flight for flight in counter.flights), (
        "no write sets its own lazy commit: each commits as the server's setting says"
    )
    (record,) = client.journal.find("order-1")
    assert record.state is payonce.IntentState.SUCCEEDED


def test_payments_stay_at_two_round_trips_once_their_statements_are_prepared(
    client: payonce.Client, counter: RoundTripCounter
) -> None:
    for number in range(8):  # past psycopg's prepare_threshold on the pooled connection
        pay(client, f"warm-{number}")
    counter.reset()

    pay(client, "order-1")

    assert counter.round_trips == 2, counter.flights
    # Prepared on the server: the statements' text no longer travels, their names do.
    assert all(WRITE_AHEAD_TEXT not in flight for flight in counter.flights), counter.flights


def test_a_blocks_acknowledgement_rides_in_the_next_write_ahead_round_trip(
    client: payonce.Client, counter: RoundTripCounter
) -> None:
    with client.intent("order-2") as op:
        op.post("/v1/payments", json=PAYMENT)
    assert counter.round_trips == 2, counter.flights
    counter.reset()

    pay(client, "order-3")

    assert counter.round_trips == 2, "the acknowledgement costs no round trip of its own"
    (record,) = client.journal.find("order-2")
    assert record.acknowledged_at is not None


def test_replaying_a_settled_payment_sends_nothing_and_costs_one_round_trip(
    client: payonce.Client, counter: RoundTripCounter, sandbox: SandboxServer
) -> None:
    first = pay(client, "order-1")
    counter.reset()

    again = pay(client, "order-1")

    # The one-statement create finds the intent there, writes nothing and answers it.
    assert counter.round_trips == 1, counter.flights
    assert again.json() == first.json()
    assert len(client.journal.find("order-1")) == 1
    assert sandbox.store.total_executions() == 1


class Commits(payonce.Hooks):
    """Counts the journal's write transactions, as the journal reports them."""

    def __init__(self) -> None:
        self.count = 0

    def journal_committed(self, event: payonce.JournalCommitted) -> None:
        self.count += 1


@pytest.fixture
def watched(
    wire: tuple[str, RoundTripCounter], counter: RoundTripCounter, make_client: MakeClient
) -> tuple[payonce.Client, Commits]:
    commits = Commits()
    client = make_client(journal=wire[0], hooks=[commits])
    counter.reset()
    return client, commits


@pytest.mark.parametrize(
    ("faults", "options", "writes"),
    [
        # Refused before executing: the attempt's end, the next attempt's start, the settle.
        pytest.param(["fail_before"], {}, 4, id="retried"),
        # Executed, the answer lost: the attempt's end, the resend's start (under the same
        # key: the provider answers it without executing it again), the settle.
        pytest.param(["drop_after"], {}, 4, id="answer-lost-then-verified"),
        # The same with no retry left: the attempt's end, then marked unknown.
        pytest.param(
            ["drop_after"], {"retry": payonce.RetryPolicy(max_attempts=1)}, 3, id="unknown"
        ),
    ],
)
def test_every_write_of_a_troubled_payment_is_one_round_trip(
    watched: tuple[payonce.Client, Commits],
    counter: RoundTripCounter,
    sandbox: SandboxServer,
    make_client: MakeClient,
    wire: tuple[str, RoundTripCounter],
    faults: list[str],
    options: dict[str, Any],
    writes: int,
) -> None:
    client, commits = watched
    if options:
        client = make_client(journal=wire[0], hooks=[commits], **options)
        counter.reset()
    sandbox.script(faults)

    with contextlib.suppress(payonce.OutcomeUnknown):
        pay(client, "order-1")

    assert commits.count == writes
    assert counter.round_trips == writes, counter.flights
    (record,) = client.journal.find("order-1")
    assert record.state in (payonce.IntentState.SUCCEEDED, payonce.IntentState.UNKNOWN)
    assert sandbox.store.total_executions() == 1
