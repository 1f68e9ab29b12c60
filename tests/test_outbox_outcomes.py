"""The outbox closes its loop: the service learns each enqueued payment's outcome from
``client.outcomes()`` and acknowledges it, so an unacknowledged outcome means one nobody
recorded yet.

Real parts only: the session's PostgreSQL server (a fresh database per test) or a journal
file, the sandbox provider over loopback, ``payonce worker`` as a process of its own.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import payonce
from helpers.cli import PYTHON_M_PAYONCE, run_cli
from helpers.payments import PAYMENT
from helpers.processes import python_env
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer
from payonce.sandbox._payments import DECLINE_AMOUNT

ACCOUNT = "acct_demo"
ORDERS = "CREATE TABLE orders (id text PRIMARY KEY, amount integer NOT NULL, status text)"
PASSES = ("--interval", "0.2")  # the worker looks often: the test waits less
WORKER_ENV = {"PAYONCE_API_KEY": DEFAULT_API_KEY, "PAYONCE_ACCOUNT": ACCOUNT}


@pytest.fixture
def journal_url(postgres_url: str) -> str:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(ORDERS)
    return f"{postgres_url}?schema=payonce"


@pytest.fixture
def conn(journal_url: str, postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The order service's own connection to its database."""
    with psycopg.connect(postgres_url) as connection:
        yield connection


def place_order(
    conn: psycopg.Connection[Any], client: payonce.Client, order: str, amount: int
) -> None:
    """The order service's handler: the order and its payment, in one transaction."""
    with conn.transaction():
        conn.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order, amount))
        client.enqueue(
            "POST",
            "/v1/payments",
            reference=order,
            json={**PAYMENT, "amount": amount},
            connection=conn,
        )


def record_outcomes(conn: psycopg.Connection[Any], client: payonce.Client) -> int:
    """The service's outcome reader, one pass: each outcome recorded on its order, then
    acknowledged; a page at a time (two here, to page). How many it recorded."""
    recorded = 0
    cursor = None
    while page := client.outcomes(after=cursor, limit=2):
        for intent in page:
            assert intent.response is not None
            status = "paid" if intent.state is payonce.IntentState.SUCCEEDED else "declined"
            with conn.transaction():
                conn.execute(
                    "UPDATE orders SET status = %s WHERE id = %s", (status, intent.reference)
                )
            client.acknowledge(intent.key)
            recorded += 1
        cursor = page.cursor
    return recorded


def order_statuses(conn: psycopg.Connection[Any]) -> dict[str, str | None]:
    return dict(conn.execute("SELECT id, status FROM orders").fetchall())


@pytest.fixture
def worker_process(tmp_path: Path) -> Iterator[Callable[[str, str], subprocess.Popen[bytes]]]:
    """``payonce worker`` beside the service; drained with SIGTERM at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(url: str, journal: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"worker-{len(started)}.log"
        with log.open("w") as stderr:  # a file: a pipe no one reads would fill, and stall it
            started.append(
                subprocess.Popen(
                    [*PYTHON_M_PAYONCE, "worker", "--base-url", url, "--journal", journal, *PASSES],
                    env=python_env(**WORKER_ENV),
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                )
            )
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


@pytest.mark.slow
def test_the_service_learns_each_outcome_a_worker_settled_and_acknowledges_it(
    make_client: Callable[..., payonce.Client],
    journal_url: str,
    postgres_url: str,
    sandbox: SandboxServer,
    worker_process: Callable[[str, str], subprocess.Popen[bytes]],
    conn: psycopg.Connection[Any],
) -> None:
    service = make_client(journal=journal_url, api_key=None, transport_only=True)
    for order in ("order-1", "order-2", "order-3"):
        place_order(conn, service, order, PAYMENT["amount"])
    place_order(conn, service, "order-4", DECLINE_AMOUNT)
    assert not service.outcomes()  # nothing settled yet

    worker_process(sandbox.url, journal_url)
    deadline = time.monotonic() + 60
    recorded = 0
    while recorded < 4:
        assert time.monotonic() < deadline, f"recorded {recorded} of 4 outcomes"
        recorded += record_outcomes(conn, service)
        time.sleep(0.05)

    assert order_statuses(conn) == {
        "order-1": "paid",
        "order-2": "paid",
        "order-3": "paid",
        "order-4": "declined",
    }
    assert sorted(sandbox.store.executions().values()) == [1, 1, 1, 1]  # each sent once
    # Acknowledged: not listed again, and nothing left for the crashed-caller alert.
    assert not service.outcomes()
    assert service.unacknowledged() == []
    listed = run_cli(["ack", "--list", "--json", "--journal", journal_url])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.strip() == "[]"


def test_outcomes_page_in_settling_order_and_never_list_a_block_s_own(
    make_client: Callable[..., payonce.Client], location: str
) -> None:
    """``connection=None`` enqueues on its own, on either journal; a block's intent is
    acknowledged by its block and never an outcome to read."""
    client = make_client(journal=location)
    enqueued = [
        client.enqueue("POST", "/v1/payments", reference=f"o-{n}", json=PAYMENT, connection=None)
        for n in range(5)
    ]
    assert all(record.enqueued for record in enqueued)
    with client.intent("direct") as op:
        op.post("/v1/payments", json=PAYMENT)
    listed = run_cli(["intents", "list", "--json", "--journal", location])
    assert listed.exit_code == 0, listed.output
    assert {i["reference"]: i["enqueued"] for i in json.loads(listed.stdout)} == {
        **{record.reference: True for record in enqueued},
        "direct": False,
    }
    client.resume()

    pages = []
    cursor = None
    while page := client.outcomes(after=cursor, limit=2):
        pages.append([intent.reference for intent in page])
        cursor = page.cursor
    now = [client.journal.get(record.key) for record in enqueued]
    settled = sorted((r for r in now if r is not None), key=lambda r: (r.updated_at, r.key))
    assert pages == [
        [r.reference for r in settled[:2]],
        [r.reference for r in settled[2:4]],
        [settled[4].reference],
    ]
    assert cursor is not None

    client.acknowledge(enqueued[0].key)
    left = [r.reference for r in settled if r.key != enqueued[0].key]
    assert [intent.reference for intent in client.outcomes()] == left
    assert {i.key for i in client.unacknowledged()} == {r.key for r in enqueued[1:]}


def test_a_cursor_outcomes_never_returned_is_refused_and_changes_nothing(
    make_client: Callable[..., payonce.Client],
) -> None:
    client = make_client()
    client.enqueue("POST", "/v1/payments", reference="o-1", json=PAYMENT, connection=None)
    client.resume()
    before = client.journal.list_intents()

    for cursor in ("", "tomorrow 01J", "nan 01J", "1.5"):
        with pytest.raises(payonce.ConfigurationError, match="not a cursor that outcomes"):
            client.outcomes(after=cursor)
    with pytest.raises(payonce.ConfigurationError, match="limit must be"):
        client.outcomes(limit=0)
    assert client.journal.list_intents() == before
    assert [i.reference for i in client.outcomes()] == ["o-1"]


def test_an_outcome_enqueued_again_after_its_acknowledgement_is_not_listed_again(
    make_client: Callable[..., payonce.Client], sandbox: SandboxServer
) -> None:
    client = make_client()
    first = client.enqueue("POST", "/v1/payments", reference="o-1", json=PAYMENT, connection=None)
    client.resume()
    (outcome,) = client.outcomes()
    client.acknowledge(outcome.key)

    again = client.enqueue("POST", "/v1/payments", reference="o-1", json=PAYMENT, connection=None)
    assert (again.key, again.state) == (first.key, payonce.IntentState.SUCCEEDED)
    assert not client.outcomes()
    assert client.resume() == []
    assert sandbox.store.executions() == {first.key: 1}


@pytest.mark.anyio
async def test_async_client_enqueues_on_its_own_and_reads_the_outcome(
    make_async_client: Callable[..., payonce.AsyncClient], sandbox: SandboxServer
) -> None:
    client = make_async_client()
    record = await client.enqueue(
        "POST", "/v1/payments", reference="o-1", json=PAYMENT, connection=None
    )
    assert (record.state, record.enqueued) == (payonce.IntentState.PENDING, True)
    assert not await client.outcomes()

    await client.resume()
    page = await client.outcomes()
    assert [(i.key, i.state) for i in page] == [(record.key, payonce.IntentState.SUCCEEDED)]
    await client.acknowledge(record.key)

    assert not await client.outcomes()
    assert sandbox.store.executions() == {record.key: 1}
