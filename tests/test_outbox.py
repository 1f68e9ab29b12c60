"""The outbox: ``client.enqueue(..., connection=)`` journals a payment intent inside the
caller's own PostgreSQL transaction, so the order and its payment commit together or not at
all; ``resume()`` sends it after the commit, exactly once.

Real parts only: the session's PostgreSQL server (a fresh database per test), the sandbox
provider over loopback, child processes SIGKILLed around the commit.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import payonce
from helpers.cli import run_cli
from helpers.payments import PAYMENT
from helpers.processes import python_env
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer
from pgserver import PostgresServer

SCHEMA = "payments_journal"
ORDERS = "CREATE TABLE orders (id text PRIMARY KEY, amount integer NOT NULL)"


@pytest.fixture
def journal_url(postgres_url: str) -> str:
    """The journal in the service's own database, in a schema of its own."""
    return f"{postgres_url}?schema={SCHEMA}"


@pytest.fixture
def pg_client(
    make_client: Callable[..., payonce.Client], journal_url: str, postgres_url: str
) -> payonce.Client:
    """A client whose journal is in the test's database, which has an orders table."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(ORDERS)
    return make_client(journal=journal_url)


@pytest.fixture
def connect(postgres_url: str) -> Iterator[Callable[..., psycopg.Connection[Any]]]:
    """The service's own connections to its database (closed at the end of the test)."""
    opened: list[psycopg.Connection[Any]] = []

    def open_connection(url: str = postgres_url, **options: Any) -> psycopg.Connection[Any]:
        opened.append(psycopg.connect(url, **options))
        return opened[-1]

    yield open_connection
    for conn in opened:
        conn.close()


def orders(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        return [tuple(row) for row in conn.execute("SELECT id, amount FROM orders ORDER BY id")]


def intents(client: payonce.Client) -> list[payonce.IntentRecord]:
    return client.journal.list_intents()


def place_order(conn: Any, order_id: str, amount: int = PAYMENT["amount"]) -> None:
    conn.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order_id, amount))


def enqueue_payment(
    client: payonce.Client | payonce.AsyncClient,
    conn: object,
    order_id: str,
    amount: int = PAYMENT["amount"],
) -> Any:
    """The payment of an order, enqueued (awaitable, with an ``AsyncClient``)."""
    return client.enqueue(
        "POST",
        "/v1/payments",
        reference=order_id,
        json={**PAYMENT, "amount": amount},
        connection=conn,
    )


def assert_sent_once(
    results: list[payonce.ResumeResult], record: payonce.IntentRecord, sandbox: SandboxServer
) -> None:
    (result,) = results
    assert (result.key, result.state) == (record.key, payonce.IntentState.SUCCEEDED)
    assert sandbox.store.executions() == {record.key: 1}


# -- committed together, or not at all ----------------------------------------------------------


def test_the_order_and_its_payment_commit_together_and_resume_sends_it_once(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_url: str,
    sandbox: SandboxServer,
) -> None:
    conn = connect()
    place_order(conn, "order-1")
    record = enqueue_payment(pg_client, conn, "order-1")

    assert record.state is payonce.IntentState.PENDING
    assert record.reference == "order-1"
    assert record.attempt_count == 0
    assert record.first_sent_at is None
    assert record.lease_owner is None
    # Not committed yet: nobody else sees the order or the intent, nothing can send it.
    assert pg_client.journal.get(record.key) is None
    assert pg_client.resume() == []
    assert orders(postgres_url) == []

    conn.commit()
    assert orders(postgres_url) == [("order-1", PAYMENT["amount"])]
    assert pg_client.journal.get(record.key) == record

    assert_sent_once(pg_client.resume(), record, sandbox)
    (attempt,) = pg_client.journal.attempts(record.key)
    assert attempt.status_code == 201

    # Settled: a second pass, and the same enqueue again, send nothing.
    assert pg_client.resume() == []
    with conn.transaction():
        again = enqueue_payment(pg_client, conn, "order-1")
    assert again.key == record.key
    assert again.state is payonce.IntentState.SUCCEEDED
    assert pg_client.resume() == []
    assert sandbox.store.executions() == {record.key: 1}


def test_a_rolled_back_order_leaves_no_intent_and_nothing_is_sent(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_url: str,
    sandbox: SandboxServer,
) -> None:
    conn = connect()
    place_order(conn, "order-2")
    record = enqueue_payment(pg_client, conn, "order-2")
    conn.rollback()

    assert orders(postgres_url) == []
    assert pg_client.journal.get(record.key) is None
    assert intents(pg_client) == []
    assert pg_client.resume() == []
    assert sandbox.store.total_executions() == 0


def test_the_intent_written_is_the_one_a_call_would_have_journaled(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    sandbox: SandboxServer,
) -> None:
    """Same key derivation, scope, fingerprint and stored request as a direct call: a caller
    who later calls ``intent(reference).post(...)`` with the same request finds it, and
    sends it, rather than a second payment."""
    conn = connect()
    with conn.transaction():
        record = enqueue_payment(pg_client, conn, "order-3")
    with pg_client.intent("order-3") as op:
        response = op.post("/v1/payments", json=PAYMENT)
    assert response.status_code == 201
    assert op.key == record.key
    assert sandbox.store.executions() == {record.key: 1}
    assert pg_client.resume() == []


# -- a retried handler ---------------------------------------------------------------------------


def test_the_same_reference_enqueued_twice_is_one_intent(
    pg_client: payonce.Client, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    conn = connect()
    with conn.transaction():
        first = enqueue_payment(pg_client, conn, "order-4")
        second = enqueue_payment(pg_client, conn, "order-4")
    with conn.transaction():  # the handler retried after its first commit
        third = enqueue_payment(pg_client, conn, "order-4")
    assert first.key == second.key == third.key
    assert [r.key for r in intents(pg_client)] == [first.key]


def handler(
    client: payonce.Client, conn: psycopg.Connection[Any], order_id: str
) -> payonce.IntentRecord:
    """A request handler's transaction (a savepoint, inside one already open)."""
    with conn.transaction():
        return enqueue_payment(client, conn, order_id)


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_two_handlers_enqueuing_the_same_order_at_once_make_one_intent(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    first_ends: str,
) -> None:
    """The second handler waits for the first one's transaction: it finds the first one's
    intent once that commits, or journals its own when it rolls back."""
    first_conn, second_conn = connect(), connect()
    place_order(first_conn, "order-7")
    first = enqueue_payment(pg_client, first_conn, "order-7")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(handler, pg_client, second_conn, "order-7")
        if first_ends == "commit":
            first_conn.commit()
        else:
            first_conn.rollback()
        record = second.result(timeout=30)

    assert pg_client.journal.find("order-7") == [record]
    assert (record.key == first.key) is (first_ends == "commit")


def test_under_repeatable_read_the_second_handler_is_told_to_retry_its_transaction(
    pg_client: payonce.Client, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    """Its snapshot cannot see the first handler's intent once committed: it fails to
    serialize, is told to roll back and retry (never that its transaction may go on and
    commit without the payment), and a new transaction finds that intent."""
    first_conn, second_conn = connect(), connect()
    second_conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    place_order(first_conn, "order-29")
    first = enqueue_payment(pg_client, first_conn, "order-29")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second_conn.execute("SELECT 1")  # the snapshot is taken before the first commits
        second = pool.submit(handler, pg_client, second_conn, "order-29")
        first_conn.commit()
        with pytest.raises(payonce.JournalError, match="could not serialize") as caught:
            second.result(timeout=30)
    message = str(caught.value)
    assert "reference 'order-29'" in message
    assert "Nothing was written" in message
    assert "Do not commit your transaction as it is" in message
    assert "Roll it back and run it again" in message
    assert "goes on" not in message
    second_conn.rollback()
    assert handler(pg_client, second_conn, "order-29").key == first.key


def test_another_request_for_the_reference_is_refused_and_the_transaction_goes_on(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_url: str,
) -> None:
    conn = connect()
    with conn.transaction():
        place_order(conn, "order-5")
        first = enqueue_payment(pg_client, conn, "order-5")
    before = intents(pg_client)

    place_order(conn, "order-6")
    with pytest.raises(payonce.IntentMismatch, match="body") as caught:
        enqueue_payment(pg_client, conn, "order-5", amount=9900)
    assert caught.value.key == first.key
    assert "enqueued and has not been sent yet" in str(caught.value)
    # The caller's transaction is still usable: their order commits.
    conn.commit()
    assert orders(postgres_url) == [("order-5", 4200), ("order-6", 4200)]
    assert intents(pg_client) == before


def test_the_reference_names_one_intent_whatever_endpoint_is_enqueued_under_it(
    pg_client: payonce.Client, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    """An intent is its provider, account and reference: a refund enqueued under an order
    whose payment is enqueued is that intent asked for another request, refused, never a
    second intent of the same name."""
    conn = connect()
    with conn.transaction():
        place_order(conn, "order-one-name")
        first = enqueue_payment(pg_client, conn, "order-one-name")
    before = intents(pg_client)

    with conn.transaction(), pytest.raises(payonce.IntentMismatch) as refused:
        pg_client.enqueue(
            "POST", "/v1/refunds", reference="order-one-name", json=PAYMENT, connection=conn
        )

    assert refused.value.key == first.key
    assert intents(pg_client) == before


def test_a_direct_call_blocked_by_an_uncommitted_enqueue_names_the_intent_and_the_holder(
    make_client: Callable[..., payonce.Client],
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    journal_url: str,
    sandbox: SandboxServer,
) -> None:
    """The outbox transaction holds the new intent's row until it ends: a direct call for the
    same reference waits, then ``JournalBusy`` names that intent and says an uncommitted
    transaction (an outbox one, say) may hold it. Nothing is sent meanwhile."""
    conn = connect()
    place_order(conn, "order-busy")
    record = enqueue_payment(pg_client, conn, "order-busy")
    impatient = make_client(journal=payonce.open_journal(journal_url, busy_timeout=0.5))

    with pytest.raises(payonce.JournalBusy) as caught:
        impatient.post("/v1/payments", json=PAYMENT, reference="order-busy")

    message = str(caught.value)
    assert "the intent of reference 'order-busy': its row stayed locked" in message
    assert "enqueue(connection=...)" in message
    assert "nothing was sent" in message
    assert not caught.value.may_have_executed
    assert sandbox.store.total_executions() == 0
    conn.commit()
    assert_sent_once(pg_client.resume(), record, sandbox)


def test_another_amount_for_an_enqueued_order_says_how_to_pay_it_instead(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    journal_url: str,
    sandbox: SandboxServer,
) -> None:
    """The cart changed after its payment was enqueued: the refusal names the field that
    differs and the whole procedure (abandon, then a new reference), and following it pays
    the new amount once, and the old one never."""
    conn = connect()
    with conn.transaction():
        first = enqueue_payment(pg_client, conn, "cart-1", amount=100)

    with pytest.raises(payonce.IntentMismatch) as caught, conn.transaction():
        enqueue_payment(pg_client, conn, "cart-1", amount=150)
    message = str(caught.value)
    assert message.startswith(
        f"intent {first.key} (reference 'cart-1') cannot be enqueued again for another "
        "request: the request differs from the one first journaled for it in the body "
        "(field amount) ("
    )
    assert "Nothing was written by this call" in message
    assert "keep it" not in message
    assert f"first abandon it (`payonce abandon {first.key} --reason ...`" in message
    assert "then use a new reference for the new request" in message

    abandoned = run_cli(
        ["abandon", first.key, "--reason", "cart changed", "--journal", journal_url]
    )
    assert abandoned.exit_code == 0, abandoned.output
    with (
        pytest.raises(payonce.IntentMismatch, match="use a new reference for the new request"),
        conn.transaction(),
    ):
        enqueue_payment(pg_client, conn, "cart-1", amount=150)
    with conn.transaction():
        second = enqueue_payment(pg_client, conn, "cart-1-v2", amount=150)

    assert_sent_once(pg_client.resume(), second, sandbox)
    assert pg_client.journal.get(first.key).state is payonce.IntentState.ABANDONED


# -- refused, nothing written --------------------------------------------------------------------


def test_an_sqlite_journal_cannot_take_part_in_the_callers_transaction(
    make_client: Callable[..., payonce.Client],
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_url: str,
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(ORDERS)
    client = make_client()  # the test's journal file
    conn = connect()
    place_order(conn, "order-7")
    with pytest.raises(payonce.ConfigurationError, match="not in PostgreSQL"):
        enqueue_payment(client, conn, "order-7")
    conn.commit()
    assert orders(postgres_url) == [("order-7", 4200)]
    assert intents(client) == []


def test_a_connection_to_another_database_is_refused(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_server: PostgresServer,
) -> None:
    other = postgres_server.create_database()
    try:
        conn = connect(postgres_server.url(other))
        conn.execute(ORDERS)
        place_order(conn, "order-8")
        with pytest.raises(payonce.ConfigurationError, match=f"database '{other}'") as caught:
            enqueue_payment(pg_client, conn, "order-8")
        assert "nothing was written" in str(caught.value)
        # The public class itself: a traceback shows no private module's path.
        assert type(caught.value) is payonce.ConfigurationError
        assert caught.value.__cause__ is None
        conn.commit()  # still usable
        assert orders(postgres_server.url(other)) == [("order-8", 4200)]
        tables = conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.intents",)).fetchone()
        assert tables == (None,)
        conn.close()
    finally:
        postgres_server.drop_database(other)
    assert intents(pg_client) == []


def test_a_connection_to_another_database_with_a_journal_of_its_own_is_refused(
    make_client: Callable[..., payonce.Client],
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_url: str,
    postgres_server: PostgresServer,
) -> None:
    """Same server, same schema name, but another database (with a journal of its own): the
    caller's rows and the client's journal could never commit together."""
    other = postgres_server.create_database()
    try:
        make_client(journal=f"{postgres_server.url(other)}?schema={SCHEMA}")
        client = make_client(journal=f"{postgres_url}?schema={SCHEMA}")
        conn = connect(postgres_server.url(other))
        with (
            pytest.raises(payonce.ConfigurationError, match="connected to database"),
            conn.transaction(),
        ):
            enqueue_payment(client, conn, "order-9")
        conn.close()
    finally:
        postgres_server.drop_database(other)
    assert intents(client) == []


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "idle"])
def test_a_connection_with_no_open_transaction_is_refused(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    autocommit: bool,
) -> None:
    conn = connect(autocommit=autocommit)
    expected = "autocommit" if autocommit else "no transaction open"
    with pytest.raises(payonce.ConfigurationError, match=expected):
        enqueue_payment(pg_client, conn, "order-10")
    assert intents(pg_client) == []


def test_an_autocommit_connection_inside_a_transaction_block_is_fine(
    pg_client: payonce.Client, connect: Callable[..., psycopg.Connection[Any]], postgres_url: str
) -> None:
    conn = connect(autocommit=True)
    with contextlib.suppress(RuntimeError), conn.transaction():
        place_order(conn, "order-10")
        rolled_back = enqueue_payment(pg_client, conn, "order-10")
        raise RuntimeError("the handler failed")
    with conn.transaction():
        place_order(conn, "order-10")
        committed = enqueue_payment(pg_client, conn, "order-10")
    assert orders(postgres_url) == [("order-10", 4200)]
    assert pg_client.journal.get(rolled_back.key) is None
    assert intents(pg_client) == [committed]


def test_a_failed_transaction_is_refused(
    pg_client: payonce.Client, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    conn = connect()
    with pytest.raises(psycopg.errors.UndefinedTable):
        conn.execute("SELECT * FROM no_such_table")
    with pytest.raises(payonce.ConfigurationError, match="already failed"):
        enqueue_payment(pg_client, conn, "order-11")
    conn.rollback()
    assert intents(pg_client) == []


def test_a_role_that_may_not_write_the_journal_is_told_the_grants_and_to_retry(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_server: PostgresServer,
    postgres_url: str,
) -> None:
    """The service's role may read the journal but not write to it: the insert fails inside
    the savepoint, which is rolled back. The error names the reference, the privileges to
    grant, and says to roll back and retry (committing as it is would commit the order
    without its payment); doing just that commits both."""
    if postgres_server.directory is None:
        pytest.skip("an external server: its role may not create roles")
    database = str(psycopg.conninfo.conninfo_to_dict(postgres_url)["dbname"])
    role = f"shop_{database}"
    with postgres_server.admin(database) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'shop-pw'")
        admin.execute(f"GRANT USAGE ON SCHEMA {SCHEMA} TO {role}")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {SCHEMA} TO {role}")
        admin.execute(f"GRANT SELECT, INSERT ON orders TO {role}")
    try:
        conn = connect(postgres_server.url(database, user=role, password="shop-pw"))
        place_order(conn, "order-26")
        with pytest.raises(
            payonce.JournalError, match="permission denied for table intents"
        ) as caught:
            enqueue_payment(pg_client, conn, "order-26")
        message = str(caught.value)
        assert "reference 'order-26'" in message
        assert f"role '{role}' lacks a privilege" in message
        assert "Nothing was written" in message
        assert "goes on" not in message
        grants = re.search(r"GRANT .*;", message)
        assert grants is not None
        assert f'GRANT SELECT, INSERT ON "{SCHEMA}".intents TO "{role}";' in grants.group()
        # The transaction is still usable (the savepoint was rolled back), but the advice is
        # to roll it back: follow it, grant what it names, and run the transaction again.
        conn.rollback()
        assert orders(postgres_url) == []
        with postgres_server.admin(database) as admin:
            admin.execute(grants.group())
        with conn.transaction():
            place_order(conn, "order-26")
            record = enqueue_payment(pg_client, conn, "order-26")
        conn.close()
        assert orders(postgres_url) == [("order-26", 4200)]
        assert intents(pg_client) == [record]
    finally:
        with postgres_server.admin(database) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_a_connection_lost_before_the_enqueue_says_the_transaction_is_gone(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_server: PostgresServer,
    postgres_url: str,
) -> None:
    conn = connect()
    place_order(conn, "order-28")
    with postgres_server.admin() as admin:  # the database server ends the service's session
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    with pytest.raises(payonce.JournalError, match="nothing of that transaction commits"):
        enqueue_payment(pg_client, conn, "order-28")
    assert orders(postgres_url) == []
    assert intents(pg_client) == []


@pytest.mark.parametrize("method", ["GET", "head"])
def test_a_read_is_not_an_intent_to_enqueue(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_url: str,
    method: str,
) -> None:
    """Only a request that changes something is made to happen once: a GET or HEAD is
    refused before anything is written (a resume would send a read nobody waits for)."""
    conn = connect()
    place_order(conn, "order-read")
    with pytest.raises(payonce.ConfigurationError, match="only a request that changes") as caught:
        pg_client.enqueue(method, "/v1/payments/pay_1", reference="order-read", connection=conn)
    assert "nothing was written" in str(caught.value)
    conn.commit()
    assert orders(postgres_url) == [("order-read", 4200)]
    assert intents(pg_client) == []


def test_a_blank_reference_is_refused_without_offering_none(
    pg_client: payonce.Client, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    """enqueue requires a reference: its refusal of a blank one does not offer to leave it
    out, as a direct call's does."""
    conn = connect()
    with pytest.raises(payonce.ConfigurationError, match="empty or blank") as caught:
        enqueue_payment(pg_client, conn, "  ")
    assert "no reference at all" not in str(caught.value)
    with pytest.raises(payonce.ConfigurationError, match="no reference at all"):
        pg_client.post("/v1/payments", json=PAYMENT, reference="  ")
    assert intents(pg_client) == []


def test_what_is_not_a_connection_is_refused(pg_client: payonce.Client) -> None:
    with pytest.raises(payonce.ConfigurationError, match="psycopg 3 Connection"):
        enqueue_payment(pg_client, object(), "order-12")


# -- where the connection comes from ------------------------------------------------------------


def test_a_unix_socket_connection_reaches_the_same_database(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_server: PostgresServer,
    postgres_url: str,
) -> None:
    """The journal connects over TCP, the service through the server's unix socket."""
    if postgres_server.directory is None:
        pytest.skip("an external server: no unix socket of ours")
    database = psycopg.conninfo.conninfo_to_dict(postgres_url)["dbname"]
    conn = connect(
        host=str(postgres_server.directory),
        port=postgres_server.port,
        user=postgres_server.user,
        dbname=database,
    )
    with conn.transaction():
        record = enqueue_payment(pg_client, conn, "order-13")
    assert pg_client.journal.get(record.key) == record


def test_the_callers_session_is_left_as_it_was(
    pg_client: payonce.Client, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    """A dict row factory and a search path of the caller's own: neither gets in the way,
    and the search path is the caller's again after the enqueue."""
    conn = connect(row_factory=dict_row)
    with conn.transaction():
        conn.execute("SET LOCAL search_path = pg_catalog, public")
        record = enqueue_payment(pg_client, conn, "order-14")
        shown = conn.execute("SHOW search_path").fetchone()
    assert shown == {"search_path": "pg_catalog, public"}
    assert pg_client.journal.get(record.key) == record


def test_the_journal_server_restarted_since_the_client_last_looked(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    postgres_server: PostgresServer,
) -> None:
    """The server is known by its start time: after a restart the client looks again rather
    than refuse the very database its journal is in."""
    if postgres_server.directory is None:
        pytest.skip("an external server: not ours to restart")
    conn = connect()
    with conn.transaction():
        first = enqueue_payment(pg_client, conn, "order-15")
    conn.close()
    postgres_server.restart()

    conn = connect()
    with conn.transaction():
        second = enqueue_payment(pg_client, conn, "order-16")
    assert {r.key for r in intents(pg_client)} == {first.key, second.key}


def test_payonce_resume_sends_what_was_enqueued(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    journal_url: str,
    sandbox: SandboxServer,
) -> None:
    conn = connect()
    with conn.transaction():
        enqueued = [enqueue_payment(pg_client, conn, f"order-{n}") for n in (17, 18)]
    env = {
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_PROVIDER": "sandbox",
        "PAYONCE_ACCOUNT": "acct_demo",
        "PAYONCE_JOURNAL": journal_url,
    }

    result = run_cli(["resume"], env=env, secrets=[DEFAULT_API_KEY])

    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        "resumed 2 intent(s): 2 settled (2 succeeded), 0 still pending, 0 still unknown"
    )
    assert sandbox.store.executions() == {r.key: 1 for r in enqueued}


# -- SQLAlchemy ----------------------------------------------------------------------------------


@pytest.fixture
def sqlalchemy_url(postgres_url: str) -> str:
    return postgres_url.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def engine(sqlalchemy_url: str) -> Iterator[sqlalchemy.Engine]:
    engine = sqlalchemy.create_engine(sqlalchemy_url)
    yield engine
    engine.dispose()


ORDER_INSERT = sqlalchemy.text("INSERT INTO orders (id, amount) VALUES (:id, :amount)")


def test_an_sqlalchemy_connection_commits_the_order_and_intent_together(
    pg_client: payonce.Client,
    engine: sqlalchemy.Engine,
    postgres_url: str,
    sandbox: SandboxServer,
) -> None:
    with engine.begin() as conn:
        record = enqueue_payment(pg_client, conn, "order-20")  # before any statement of ours
        conn.execute(ORDER_INSERT, {"id": "order-20", "amount": 4200})
    with contextlib.suppress(RuntimeError), engine.begin() as conn:
        conn.execute(ORDER_INSERT, {"id": "order-21", "amount": 4200})
        rolled_back = enqueue_payment(pg_client, conn, "order-21")
        raise RuntimeError("the handler failed after enqueuing")

    assert orders(postgres_url) == [("order-20", 4200)]
    assert pg_client.journal.get(rolled_back.key) is None
    assert_sent_once(pg_client.resume(), record, sandbox)


def test_an_sqlalchemy_session_keeps_its_transaction_after_a_mismatch(
    pg_client: payonce.Client, engine: sqlalchemy.Engine, postgres_url: str
) -> None:
    with Session(engine) as session, session.begin():
        session.execute(ORDER_INSERT, {"id": "order-22", "amount": 4200})
        first = enqueue_payment(pg_client, session, "order-22")
        with pytest.raises(payonce.IntentMismatch):
            enqueue_payment(pg_client, session, "order-22", amount=100)
        session.execute(ORDER_INSERT, {"id": "order-23", "amount": 4200})
    assert orders(postgres_url) == [("order-22", 4200), ("order-23", 4200)]
    assert [r.key for r in intents(pg_client)] == [first.key]


def test_sqlalchemy_without_a_transaction_or_on_autocommit_is_refused(
    pg_client: payonce.Client, engine: sqlalchemy.Engine, sqlalchemy_url: str
) -> None:
    with (
        engine.connect() as conn,
        pytest.raises(payonce.ConfigurationError, match="no transaction begun"),
    ):
        enqueue_payment(pg_client, conn, "order-24")
    with (
        Session(engine) as session,
        pytest.raises(payonce.ConfigurationError, match="Session has none begun"),
    ):
        enqueue_payment(pg_client, session, "order-24")
    autocommit = sqlalchemy.create_engine(sqlalchemy_url, isolation_level="AUTOCOMMIT")
    with (
        autocommit.begin() as conn,
        pytest.raises(payonce.ConfigurationError, match="autocommit") as caught,
    ):
        enqueue_payment(pg_client, conn, "order-24")
    # Not the advice to open engine.begin(), which this caller did: what to change instead.
    advice = str(caught.value)
    assert "with engine.begin() as conn" not in advice
    assert "even inside engine.begin()" in advice
    assert "execution_options(isolation_level='READ COMMITTED')" in advice
    assert intents(pg_client) == []
    # Following the advice works.
    with autocommit.execution_options(isolation_level="READ COMMITTED").begin() as conn:
        record = enqueue_payment(pg_client, conn, "order-24")
    autocommit.dispose()
    assert intents(pg_client) == [record]


def test_sqlalchemy_on_another_database_kind_is_refused(
    pg_client: payonce.Client, tmp_path: Path
) -> None:
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    try:
        with (
            engine.begin() as conn,
            pytest.raises(payonce.ConfigurationError, match="sqlite database"),
        ):
            enqueue_payment(pg_client, conn, "order-25")
    finally:
        engine.dispose()
    assert intents(pg_client) == []


# -- a temporary table named like the journal's -------------------------------------------------


def _run(conn: Any, statement: str, params: dict[str, Any] | None = None) -> Any:
    """A statement on the service's psycopg or SQLAlchemy connection: its first row."""
    if isinstance(conn, sqlalchemy.Connection):
        return tuple(conn.execute(sqlalchemy.text(statement), params).one())
    return conn.execute(statement.replace(":id", "%(id)s"), params).fetchone()


@pytest.mark.parametrize("library", ["psycopg", "sqlalchemy"])
def test_a_temporary_table_named_like_the_journals_never_takes_the_intent(
    library: str,
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    engine: sqlalchemy.Engine,
    journal_url: str,
    sandbox: SandboxServer,
) -> None:
    """A pooled connection may keep temporary tables between requests, and PostgreSQL looks
    in the session's temporary schema first, whatever the search path says: the intent
    must still land in the journal, where a worker finds it."""
    with contextlib.ExitStack() as stack:
        conn: Any = connect() if library == "psycopg" else stack.enter_context(engine.connect())
        for table in ("intents", "attempts"):
            conn.execute(
                sqlalchemy.text(f"CREATE TEMPORARY TABLE {table} (LIKE {SCHEMA}.{table})")
                if library == "sqlalchemy"
                else f"CREATE TEMPORARY TABLE {table} (LIKE {SCHEMA}.{table})"
            )
        conn.commit()  # kept by the session, as a pool keeps it between requests

        _run(conn, "INSERT INTO orders (id, amount) VALUES (:id, 4200) RETURNING id", {"id": "o"})
        record = enqueue_payment(pg_client, conn, "o")
        conn.commit()

        assert _run(conn, "SELECT count(*) FROM pg_temp.intents") == (0,)
    assert pg_client.journal.get(record.key) == record

    worker = run_cli(
        ["worker", "--once", "--journal", journal_url, "--base-url", sandbox.url],
        env={"PAYONCE_API_KEY": DEFAULT_API_KEY, "PAYONCE_ACCOUNT": "acct_demo"},
        secrets=[DEFAULT_API_KEY],
    )
    assert worker.exit_code == 0, worker.output
    assert sandbox.store.executions() == {record.key: 1}


# -- AsyncClient ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_client_enqueues_through_an_async_psycopg_connection(
    make_async_client: Callable[..., payonce.AsyncClient],
    journal_url: str,
    postgres_url: str,
    sandbox: SandboxServer,
) -> None:
    client = make_async_client(journal=journal_url)
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        await conn.execute(ORDERS)
        await conn.commit()
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES ('order-30', 4200)")
            record = await enqueue_payment(client, conn, "order-30")
        with pytest.raises(payonce.ConfigurationError, match="no transaction open"):
            await enqueue_payment(client, conn, "order-31")
    assert_sent_once(await client.resume(), record, sandbox)


@pytest.mark.anyio
async def test_async_client_enqueues_through_an_sqlalchemy_async_session(
    make_async_client: Callable[..., payonce.AsyncClient],
    journal_url: str,
    postgres_url: str,
    sandbox: SandboxServer,
) -> None:
    client = make_async_client(journal=journal_url)
    engine = create_async_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        async with engine.begin() as conn:
            await conn.execute(sqlalchemy.text(ORDERS))
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(ORDER_INSERT, {"id": "order-32", "amount": 4200})
            record = await enqueue_payment(client, session, "order-32")
            with pytest.raises(payonce.IntentMismatch):
                await enqueue_payment(client, session, "order-32", amount=100)
    finally:
        await engine.dispose()
    assert orders(postgres_url) == [("order-32", 4200)]
    assert_sent_once(await client.resume(), record, sandbox)


@pytest.mark.anyio
async def test_async_client_refuses_a_sync_connection(
    make_async_client: Callable[..., payonce.AsyncClient],
    journal_url: str,
    connect: Callable[..., psycopg.Connection[Any]],
) -> None:
    client = make_async_client(journal=journal_url)
    conn = connect()
    with pytest.raises(payonce.ConfigurationError, match="blocks the event loop"):
        await enqueue_payment(client, conn, "order-33")


# -- crashes -------------------------------------------------------------------------------------

SERVICE = textwrap.dedent(
    """
    import sys, time
    import psycopg, payonce

    journal_url, database_url, base_url, api_key, commit = sys.argv[1:]
    client = payonce.Client(
        base_url=base_url, provider="sandbox", account="acct_demo", api_key=api_key,
        journal=journal_url,
    )
    conn = psycopg.connect(database_url)
    conn.execute("INSERT INTO orders (id, amount) VALUES ('order-40', 4200)")
    record = client.enqueue(
        "POST", "/v1/payments", reference="order-40",
        json={"amount": 4200, "currency": "eur"}, connection=conn,
    )
    if commit == "commit":
        conn.commit()
    print(record.key, flush=True)
    time.sleep(60)  # killed here
    """
)


def _killed_service(
    journal_url: str, postgres_url: str, sandbox: SandboxServer, *, commit: bool
) -> str:
    """A service process that inserts an order and enqueues its payment, commits them (or
    not), and is SIGKILLed: the key it enqueued."""
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            SERVICE,
            journal_url,
            postgres_url,
            sandbox.url,
            DEFAULT_API_KEY,
            "commit" if commit else "no",
        ],
        env=python_env(),
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            key = child.stdout.readline().strip()
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert key, "the service died before it enqueued"
    return key


def test_a_crash_after_the_commit_is_sent_exactly_once_on_resume(
    pg_client: payonce.Client,
    journal_url: str,
    postgres_url: str,
    sandbox: SandboxServer,
) -> None:
    key = _killed_service(journal_url, postgres_url, sandbox, commit=True)

    assert orders(postgres_url) == [("order-40", 4200)]
    (result,) = pg_client.resume()
    assert (result.key, result.state) == (key, payonce.IntentState.SUCCEEDED)
    assert pg_client.resume() == []
    assert sandbox.store.executions() == {key: 1}


def test_a_crash_before_the_commit_leaves_neither_order_nor_intent(
    pg_client: payonce.Client,
    journal_url: str,
    postgres_url: str,
    sandbox: SandboxServer,
) -> None:
    key = _killed_service(journal_url, postgres_url, sandbox, commit=False)

    assert orders(postgres_url) == []
    assert pg_client.journal.get(key) is None
    assert pg_client.resume() == []
    assert sandbox.store.total_executions() == 0


def test_intents_show_says_an_enqueued_intent_is_not_sent_yet_and_what_sends_it(
    pg_client: payonce.Client,
    connect: Callable[..., psycopg.Connection[Any]],
    journal_url: str,
) -> None:
    conn = connect()
    place_order(conn, "order-shown")
    record = enqueue_payment(pg_client, conn, "order-shown")
    conn.commit()

    def shown() -> str:
        result = run_cli(["intents", "show", "order-shown", "--journal", journal_url])
        assert result.exit_code == 0, result.stderr
        return result.stdout

    assert f"key\t{record.key}" in shown()
    assert "first_sent\tnot yet: `payonce resume` or `payonce worker` sends it" in shown()
    pg_client.resume()
    assert "not yet" not in shown()
