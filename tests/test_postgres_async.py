"""``AsyncClient`` on a PostgreSQL journal: its journal writes run on the event loop, on
psycopg's async connections, with no journal thread between (on SQLite they still hop to
one: sqlite3 has no async API). The failover promise holds on that path too: a write whose
connection drops is run again or looked for on a new connection before anything is sent or
decided, and a caller in the gap is told the truth. A client used from one loop after
another, and the children of a forked process, each write on connections of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import payonce
from helpers.payments import FAST_RETRY, PAYMENT
from helpers.pgproxy import PostgresRelay, relay_to
from payonce._journal._postgres import PostgresJournal
from payonce._runtime._journal_threads import calls_made
from payonce.sandbox import DEFAULT_API_KEY, Faults, SandboxServer
from pgserver import PostgresServer

pytestmark = pytest.mark.anyio

MakeAsync = Callable[..., payonce.AsyncClient]

# The text of the writes the relay cuts (see tests/test_postgres_failover.py).
WRITE_AHEAD = b"WITH created AS"
SETTLE_KNOWN = b"WITH settled AS"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def make_async(sandbox: SandboxServer) -> AsyncIterator[MakeAsync]:
    """Async clients of the sandbox, closed (with the journals they opened) at the end:
    asked for after the journal's database, so that they close before it is dropped."""
    clients: list[payonce.AsyncClient] = []

    def make(
        journal: object, provider: SandboxServer = sandbox, **options: Any
    ) -> payonce.AsyncClient:
        client = payonce.AsyncClient(
            base_url=provider.url,
            provider="sandbox",
            account="acct_demo",
            api_key=DEFAULT_API_KEY,
            journal=journal,  # type: ignore[arg-type]
            retry=FAST_RETRY,
            timeout=5.0,
            **options,
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def relay(postgres_server: PostgresServer) -> Any:
    with relay_to(postgres_server.host, postgres_server.port) as relay:
        yield relay


@pytest.fixture
def relayed_url(postgres_url: str, relay: PostgresRelay) -> str:
    parts = urllib.parse.urlsplit(postgres_url)
    host = parts.netloc.rpartition(":")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{relay.port}"))


class OnAttempt(payonce.Hooks):
    """Runs ``action`` once an attempt is journaled, just before it is sent."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action = action

    def attempt_started(self, event: object) -> None:
        self._action()


async def pay_concurrently(client: payonce.AsyncClient, count: int, prefix: str = "order") -> None:
    responses = await asyncio.gather(
        *(
            client.post("/v1/payments", json=PAYMENT, reference=f"{prefix}-{n}")
            for n in range(count)
        )
    )
    assert all(response.is_success for response in responses)


async def pay_with_a_client_of_its_own(
    journal: PostgresJournal, sandbox: SandboxServer, count: int, prefix: str
) -> None:
    """``count`` payments at once from a client made (and closed) on the running loop."""
    async with payonce.AsyncClient(
        base_url=sandbox.url,
        provider="sandbox",
        account="acct_demo",
        api_key=DEFAULT_API_KEY,
        journal=journal,
        retry=FAST_RETRY,
    ) as client:
        await pay_concurrently(client, count, prefix)


# -- no thread between the loop and the journal -------------------------------------------------


async def test_payments_on_postgresql_make_no_journal_thread_hop(
    postgres_url: str, make_async: MakeAsync, sandbox: SandboxServer
) -> None:
    client = make_async(postgres_url)
    before = calls_made()

    await pay_concurrently(client, 20)
    async with client.intent("order-block") as op:
        await op.post("/v1/payments", json=PAYMENT)

    assert calls_made() == before, "every journal write of the payments ran on the loop"
    assert sandbox.store.total_executions() == 21
    states = {record.state for record in client.journal.list_intents()}
    assert states == {payonce.IntentState.SUCCEEDED}


async def test_payments_on_sqlite_still_reach_the_journal_through_its_threads(
    make_async: MakeAsync, journal_path: object
) -> None:
    """The counter above counts: the same payments on SQLite hop, a few calls each."""
    client = make_async(journal_path)
    before = calls_made()
    await pay_concurrently(client, 5)
    assert calls_made() >= before + 5 * 2  # the write-ahead and the settle of each


async def test_an_intent_left_pending_is_taken_up_again_on_the_loop_and_executed_once(
    postgres_url: str, make_async: MakeAsync, sandbox: SandboxServer
) -> None:
    """Its lease is taken with the row read and locked first: several round trips of one
    transaction, pipelined on the loop's connection."""
    client = make_async(postgres_url)
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit"] * 5)  # every attempt of the first call refused unexecuted
    with pytest.raises(payonce.ProviderUnavailable):
        await client.post("/v1/payments", json=PAYMENT, reference="order-1")
    (record,) = client.journal.find("order-1")
    assert record.state is payonce.IntentState.PENDING
    assert record.lease_owner is None

    response = await client.post("/v1/payments", json=PAYMENT, reference="order-1")
    assert response.is_success
    (record,) = client.journal.find("order-1")
    assert record.state is payonce.IntentState.SUCCEEDED
    assert len(client.journal.attempts(record.key)) == 6
    assert sandbox.store.executions() == {record.key: 1}


# -- failover on the loop ---------------------------------------------------------------------


@pytest.mark.parametrize("cut", ["after_commit", "before_commit"])
async def test_a_write_ahead_whose_commit_is_lost_on_the_loop_is_found_or_written_then_sent_once(
    relayed_url: str, relay: PostgresRelay, make_async: MakeAsync, sandbox: SandboxServer, cut: str
) -> None:
    client = make_async(relayed_url)
    relay.cut_next(cut, at=WRITE_AHEAD)  # type: ignore[arg-type]
    before = calls_made()
    response = await client.post("/v1/payments", json=PAYMENT, reference="order-1")
    assert response.is_success
    assert relay.cuts_made == 1
    (record,) = client.journal.find("order-1")
    assert [a.number for a in client.journal.attempts(record.key)] == [1], "created once"
    assert sandbox.store.executions() == {record.key: 1}
    assert record.state is payonce.IntentState.SUCCEEDED
    assert calls_made() == before, "recovered on the loop too"


@pytest.mark.parametrize("cut", ["after_commit", "before_commit"])
async def test_a_settle_whose_commit_is_lost_on_the_loop_is_looked_for_and_written_if_lost(
    relayed_url: str, relay: PostgresRelay, make_async: MakeAsync, sandbox: SandboxServer, cut: str
) -> None:
    def lose_the_settle() -> None:
        relay.cut_next(cut, at=SETTLE_KNOWN)  # type: ignore[arg-type]

    client = make_async(relayed_url, hooks=OnAttempt(lose_the_settle))
    response = await client.post("/v1/payments", json=PAYMENT, reference="order-1")
    assert response.is_success
    assert relay.cuts_made == 1
    (record,) = client.journal.find("order-1")
    assert sandbox.store.executions() == {record.key: 1}
    assert record.state is payonce.IntentState.SUCCEEDED
    assert record.lease_owner is None


async def test_connections_killed_between_write_ahead_and_send_are_replaced_on_the_loop(
    postgres_server: PostgresServer,
    postgres_url: str,
    make_async: MakeAsync,
    sandbox: SandboxServer,
    capfd: pytest.CaptureFixture[str],
) -> None:
    dbname = postgres_url.rsplit("/", 1)[1]
    killed: list[int] = []

    def kill_payonce_connections() -> None:
        with postgres_server.admin(dbname) as admin:
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'payonce' AND datname = %s",
                (dbname,),
            ).fetchall()
        killed.append(len(rows))

    client = make_async(postgres_url, hooks=OnAttempt(kill_payonce_connections))
    response = await client.post("/v1/payments", json=PAYMENT, reference="order-1")
    assert response.is_success
    assert killed, "the hook ran"
    assert killed[0] >= 1, "the loop's connection was among those ended"
    (record,) = client.journal.find("order-1")
    assert sandbox.store.executions() == {record.key: 1}
    assert record.state is payonce.IntentState.SUCCEEDED
    assert "psycopg" not in capfd.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False], ids=["connection-idle", "no-connection-yet"])
async def test_a_caller_in_the_gap_on_the_loop_is_told_nothing_was_sent_and_to_resume(
    relayed_url: str,
    relay: PostgresRelay,
    make_async: MakeAsync,
    sandbox: SandboxServer,
    capfd: pytest.CaptureFixture[str],
    warm: bool,
) -> None:
    """The database goes away with the loop's connection idle (found dead at the next
    write), or before the loop ever connected (refused at its first)."""
    journal = PostgresJournal(relayed_url, failover_timeout=1.0, busy_timeout=0.5)
    client = make_async(journal)
    if warm:
        await client.post("/v1/payments", json=PAYMENT, reference="order-0")
    relay.refuse()
    with pytest.raises(payonce.JournalError) as raised:
        await client.post("/v1/payments", json=PAYMENT, reference="order-1")
    message = str(raised.value)
    assert "found no primary to reconnect to within 1s" in message
    assert "nothing was sent" in message
    assert "payonce resume" in message
    assert raised.value.may_have_executed is False
    assert sandbox.store.total_executions() == (1 if warm else 0)
    assert "psycopg" not in capfd.readouterr().err
    journal.close()


# -- one client, several loops ---------------------------------------------------------------------


def test_a_journal_used_by_one_event_loop_after_another_writes_on_each_loops_own_connections(
    postgres_url: str, sandbox: SandboxServer
) -> None:
    """One journal, a client per ``asyncio.run`` (a test framework's loop per test does the
    same): the second loop never touches the first's connections, which ended with it."""
    journal = PostgresJournal(postgres_url)
    before = calls_made()
    asyncio.run(pay_with_a_client_of_its_own(journal, sandbox, 8, "first-loop"))
    asyncio.run(pay_with_a_client_of_its_own(journal, sandbox, 8, "second-loop"))
    assert calls_made() == before
    assert sandbox.store.total_executions() == 16
    assert len(journal.list_intents()) == 16
    journal.close()


def test_two_loops_running_at_once_in_two_threads_each_write_on_their_own(
    postgres_url: str, sandbox: SandboxServer
) -> None:
    journal = PostgresJournal(postgres_url)
    failures: list[BaseException] = []

    def run(prefix: str) -> None:
        try:
            asyncio.run(pay_with_a_client_of_its_own(journal, sandbox, 10, prefix))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(f"loop{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert sandbox.store.total_executions() == 20
    assert set(sandbox.store.executions().values()) == {1}
    assert len(journal.list_intents()) == 20
    journal.close()


async def test_a_caller_cancelled_while_its_settle_waits_still_has_its_payment_settled(
    postgres_server: PostgresServer,
    postgres_url: str,
    make_async: MakeAsync,
    sandbox: SandboxServer,
) -> None:
    """Cancelled while its settle waits on the server (a caller's timeout), the payment is
    still settled, as a write in a journal thread would have been: nothing is left for
    ``resume``, no lease held until it expires."""
    dbname = postgres_url.rsplit("/", 1)[1]
    holder = postgres_server.admin(dbname)

    def hold_the_row() -> None:  # an outbox transaction of the service's, say
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM intents WHERE reference = 'order-1' FOR UPDATE")

    def settle_waits() -> bool:
        with postgres_server.admin(dbname) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'payonce'"
                " AND wait_event_type = 'Lock'"
            ).fetchone()
        return row is not None and row[0] == 1

    client = make_async(postgres_url, hooks=OnAttempt(hold_the_row))
    paying = asyncio.ensure_future(client.post("/v1/payments", json=PAYMENT, reference="order-1"))
    await _eventually(settle_waits)
    paying.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await paying
    assert paying.cancelled()
    holder.execute("COMMIT")
    holder.close()
    await _eventually(lambda: _state(client, "order-1") == "succeeded")
    (record,) = client.journal.find("order-1")
    assert record.lease_owner is None
    assert sandbox.store.executions() == {record.key: 1}


@pytest.mark.slow
async def test_a_call_cancelled_mid_send_during_a_partition_does_not_block_the_event_loop(
    relay: PostgresRelay,
    relayed_url: str,
    make_sandbox: Callable[..., SandboxServer],
    make_async: MakeAsync,
) -> None:
    """A caller cancels its payment while the request is at the provider, and the journal
    database is cut off (every connection frozen, nothing reset). Recording what may have
    been sent waits on the frozen connection: the other tasks of the loop go on meanwhile.
    Once the partition ends the write finishes, the caller gets its ``CancelledError``, and
    the journal holds the attempt as one that may have executed."""
    sandbox = make_sandbox(processing_seconds=1.0)
    client = make_async(relayed_url, provider=sandbox)
    paying = asyncio.ensure_future(client.post("/v1/payments", json=PAYMENT, reference="cut-1"))
    await _eventually(lambda: bool(sandbox.store.keys_in_progress()))

    ticks_while_held = 0
    thawed = threading.Event()
    ticked_while_held = threading.Event()

    def thaw_once_the_loop_ticked() -> None:
        """Ends the partition once the loop has ticked while a journal write was held (or
        after a bound: the loop was blocked)."""
        relay.held.wait(30)
        for _ in range(1000):
            if ticks_while_held >= 20:
                ticked_while_held.set()
                break
            time.sleep(0.01)
        thawed.set()
        relay.thaw()

    async def tick() -> None:
        nonlocal ticks_while_held
        while not paying.done():
            await asyncio.sleep(0.005)
            if relay.held.is_set() and not thawed.is_set():
                ticks_while_held += 1

    relay.freeze()
    thawer = threading.Thread(target=thaw_once_the_loop_ticked)
    thawer.start()
    ticker = asyncio.ensure_future(tick())
    paying.cancel()
    with pytest.raises(asyncio.CancelledError):
        await paying
    await ticker
    thawer.join()

    assert relay.held.is_set(), "the cancelled call wrote nothing to the journal"
    assert ticked_while_held.is_set(), "the event loop stood still while the write waited"
    (record,) = client.journal.find("cut-1")
    assert record.attempt_count == 1
    (attempt,) = client.journal.attempts(record.key)
    assert attempt.ended_at is not None, "what may have been sent was not journaled"
    assert attempt.ambiguous
    sandbox.wait_idle()
    assert sandbox.store.executions() == {record.key: 1}


def _state(client: payonce.AsyncClient, reference: str) -> str:
    (record,) = client.journal.find(reference)
    return record.state.value


async def _eventually(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, "never came true"
        await asyncio.sleep(0.01)
