"""A PostgreSQL journal whose connection drops mid-intent (a server killed, a failover):
payonce learns whether its last write was committed before deciding anything, reconnects
within ``failover_timeout``, tells callers caught in the gap the truth, and says nothing
of the driver's on stderr.

The fast tests lose one connection on one server, at the exact moment that matters (a
relay that loses a ``COMMIT`` before or after the server has it, ``pg_terminate_backend``
between the write-ahead and the send). The slow test fails a real primary over to its
synchronous standby, again and again, under payments from several processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.cli import run_cli_process
from helpers.payments import PAYMENT, MakeClient, make_unknown
from helpers.pgproxy import PostgresRelay, relay_to
from helpers.processes import python_env
from payonce._journal._postgres import PostgresJournal
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, Faults, SandboxServer
from pgcluster import Node, ReplicatedPair
from pgserver import PostgresServer, find_bindir


@pytest.fixture
def relay(postgres_server: PostgresServer, closing: contextlib.ExitStack) -> PostgresRelay:
    """Closed after the test's clients (the ``closing`` stack closes them first)."""
    return closing.enter_context(relay_to(postgres_server.host, postgres_server.port))


@pytest.fixture
def relayed_url(postgres_url: str, relay: PostgresRelay) -> str:
    """The test's database, reached through the relay."""
    parts = urllib.parse.urlsplit(postgres_url)
    host = parts.netloc.rpartition(":")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{relay.port}"))


@pytest.fixture
def relayed(relayed_url: str, make_client: MakeClient) -> Callable[..., payonce.Client]:
    """Clients closed before their database is dropped (set up after it)."""
    return lambda **options: make_client(journal=relayed_url, **options)


class Run(payonce.Hooks):
    """Runs ``action`` as each attempt is journaled and about to be sent, or (``retrying``)
    between two attempts, where the next journal commit starts the second."""

    def __init__(self, action: Callable[[], None], *, on: str = "attempt_started") -> None:
        self._action, self._on = action, on

    def attempt_started(self, event: object) -> None:
        if self._on == "attempt_started":
            self._action()

    def retrying(self, event: object) -> None:
        if self._on == "retrying":
            self._action()


# Writes that are one statement, their own transaction (no COMMIT travels), named by words
# of their text as it goes to the server (its parameters numbered $1, $2...).
WRITE_AHEAD = b"WITH created AS"  # a new intent and its first attempt
ATTEMPT_START = b"started AS (INSERT INTO attempts"  # a held intent's next attempt
SETTLE_KNOWN = b"WITH settled AS"  # an answered first attempt's settle
SETTLE_HELD = b"changed AS (UPDATE intents SET response_status"  # any other answered settle
MARK_UNKNOWN = b"unknown_reason = $"


def states(journal: payonce.Journal) -> dict[str | None, str]:
    return {record.reference: record.state.value for record in journal.list_intents()}


# -- multi-host URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (
            "postgresql://payonce@db1:5432,db2:5432/payments",
            "names 2 hosts (db1:5432, db2:5432) without target_session_attrs=read-write",
        ),
        (
            "postgresql://payonce@db1,db2/payments?target_session_attrs=any",
            "without target_session_attrs=read-write",
        ),
        (
            "postgresql://payonce@db1,db2/payments?port=1,2,3&target_session_attrs=read-write",
            "names 2 host(s) but 3 port values",
        ),
        (
            "postgresql://u@a:1,b:2,c/db?target_session_attrs=read-write",
            "gives a port for some of its 3 hosts but not for the others",
        ),
        (
            "postgresql://payonce@db1/payments?target_session_attrs=standby",
            "asks for target_session_attrs=standby, a standby",
        ),
    ],
)
def test_a_journal_url_that_could_write_to_a_standby_is_refused_before_connecting(
    url: str, words: str
) -> None:
    # db1 and db2 resolve nowhere: the refusal comes before any connection is tried.
    with pytest.raises(
        payonce.ConfigurationError, match=words.replace("(", r"\(").replace(")", r"\)")
    ):
        PostgresJournal(url, connect_timeout=1)


def test_a_multi_host_url_with_read_write_opens_the_primary_and_a_reader_may_take_any(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """The first host is down: libpq goes on to the next one, the primary."""
    parts = urllib.parse.urlsplit(postgres_url)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    dead = f"127.0.0.1:{_closed_port()}"
    netloc = f"{userinfo}@{dead},{hostport}"
    base = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    with PostgresJournal(base + "?target_session_attrs=read-write") as journal:
        assert journal.list_intents() == []
        assert f"@{dead},{hostport}/" in journal.location
    with PostgresJournal(base + "?target_session_attrs=any", read_only=True) as reader:
        assert reader.list_intents() == []


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- a COMMIT whose answer is lost ---------------------------------------------------------------


@pytest.mark.slow
def test_a_write_ahead_committed_but_unanswered_is_found_on_a_new_connection_and_sent_once(
    relayed: Callable[..., payonce.Client], relay: PostgresRelay, sandbox: SandboxServer
) -> None:
    client = relayed()
    relay.cut_next("after_commit", at=WRITE_AHEAD)
    with client.intent("order-1") as op:
        response = op.post("/v1/payments", json=PAYMENT)
    assert response.is_success
    assert relay.cuts_made == 1
    assert sandbox.store.executions() == {op.key: 1}
    assert [a.number for a in client.journal.attempts(op.key)] == [1], (
        "found committed: attempt 1, not a resumed intent's second"
    )
    assert states(client.journal) == {"order-1": "succeeded"}


@pytest.mark.slow
def test_a_write_ahead_lost_with_its_connection_is_written_again_before_anything_is_sent(
    relayed: Callable[..., payonce.Client], relay: PostgresRelay, sandbox: SandboxServer
) -> None:
    client = relayed()
    relay.cut_next("before_commit", at=WRITE_AHEAD)
    with client.intent("order-1") as op:
        response = op.post("/v1/payments", json=PAYMENT)
    assert response.is_success
    assert relay.cuts_made == 1
    assert sandbox.store.executions() == {op.key: 1}
    assert [a.number for a in client.journal.attempts(op.key)] == [1]


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["after_commit", "before_commit"])
def test_a_settle_whose_commit_is_unknown_is_looked_for_and_written_if_lost(
    relayed: Callable[..., payonce.Client],
    relay: PostgresRelay,
    sandbox: SandboxServer,
    cut: str,
) -> None:
    client = relayed()
    with client.intent("order-0") as op:  # the pool is warm, the statements prepared
        op.post("/v1/payments", json=PAYMENT)

    def lose_the_settle() -> None:
        relay.cut_next(cut, at=SETTLE_KNOWN)  # type: ignore[arg-type]

    client = relayed(hooks=Run(lose_the_settle))
    with client.intent("order-1") as op:
        response = op.post("/v1/payments", json=PAYMENT)
    assert response.is_success
    assert relay.cuts_made == 1
    assert sandbox.store.executions()[op.key] == 1
    assert states(client.journal)["order-1"] == "succeeded"
    assert client.journal.get(op.key).lease_owner is None  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["after_commit", "before_commit"])
def test_a_second_attempt_whose_start_is_unknown_is_found_or_journaled_once_then_sent(
    relayed: Callable[..., payonce.Client],
    relay: PostgresRelay,
    sandbox: SandboxServer,
    cut: str,
) -> None:
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit"])  # attempt 1 is refused with a 429: attempt 2 follows
    client = relayed(hooks=Run(lambda: relay.cut_next(cut, at=ATTEMPT_START), on="retrying"))  # type: ignore[arg-type]
    with client.intent("order-1") as op:
        response = op.post("/v1/payments", json=PAYMENT)
    assert response.is_success
    assert relay.cuts_made == 1
    assert [a.number for a in client.journal.attempts(op.key)] == [1, 2]
    assert sandbox.store.executions() == {op.key: 1}


class Seen(payonce.Hooks):
    """The names of the events told, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def intent_started(self, event: object) -> None:
        self.names.append("intent_started")

    def replayed(self, event: object) -> None:
        self.names.append("replayed")

    def unknown(self, event: object) -> None:
        self.names.append("unknown")


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["after_commit", "before_commit"])
def test_a_new_intent_whose_one_statement_write_ahead_is_unknown_is_created_once_and_said_so(
    relayed: Callable[..., payonce.Client],
    relay: PostgresRelay,
    sandbox: SandboxServer,
    cut: str,
) -> None:
    """The write-ahead and its first attempt are one statement, its own transaction: lost
    with its answer, it is found as this claim's own row (or written again), never taken
    for another worker's intent to replay or wait for."""
    seen = Seen()
    client = relayed(hooks=seen)
    relay.cut_next(cut, at=WRITE_AHEAD)  # type: ignore[arg-type]
    response = client.post("/v1/payments", json=PAYMENT, reference="order-1")
    assert response.is_success
    assert relay.cuts_made == 1
    (record,) = client.journal.find("order-1")
    assert seen.names == ["intent_started"], "created, not replayed"
    assert [a.number for a in client.journal.attempts(record.key)] == [1]
    assert sandbox.store.executions() == {record.key: 1}
    assert record.state is payonce.IntentState.SUCCEEDED


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["after_commit", "before_commit"])
def test_a_settle_after_a_retry_whose_commit_is_unknown_is_found_or_written_once(
    relayed: Callable[..., payonce.Client],
    relay: PostgresRelay,
    sandbox: SandboxServer,
    cut: str,
) -> None:
    """Attempt 2's settle is the chained one (attempt end, response, state, lease in one
    statement, guarded by the lease): lost, it is looked for and written again only if
    the intent is still held."""
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit"])  # attempt 1 is refused with a 429: attempt 2 follows
    client = relayed(hooks=Run(lambda: relay.cut_next(cut, at=SETTLE_HELD), on="retrying"))  # type: ignore[arg-type]
    with client.intent("order-1") as op:
        response = op.post("/v1/payments", json=PAYMENT)
    assert response.is_success
    assert relay.cuts_made == 1
    record = client.journal.get(op.key)
    assert record is not None
    assert record.state is payonce.IntentState.SUCCEEDED
    assert record.lease_owner is None
    assert record.response is not None
    assert record.response.status == response.status_code
    attempts = client.journal.attempts(op.key)
    assert [(a.number, a.status_code) for a in attempts] == [(1, 429), (2, response.status_code)]
    assert sandbox.store.executions() == {op.key: 1}


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["after_commit", "before_commit"])
def test_an_intent_marked_unknown_whose_commit_is_unknown_is_found_or_marked_once(
    relayed: Callable[..., payonce.Client],
    relay: PostgresRelay,
    sandbox: SandboxServer,
    cut: str,
) -> None:
    seen = Seen()
    relay.cut_next(cut, at=MARK_UNKNOWN)  # type: ignore[arg-type]
    record = make_unknown(relayed, sandbox, "order-1", "drop_after", hooks=seen)
    assert relay.cuts_made == 1
    assert record.lease_owner is None
    assert record.unknown_reason
    assert seen.names == ["intent_started", "unknown"]
    assert [a.number for a in relayed().journal.attempts(record.key)] == [1]
    assert sandbox.store.executions() == {record.key: 1}


def test_a_one_statement_write_the_server_refused_is_retried_not_taken_for_a_lost_commit(
    postgres_server: PostgresServer,
    postgres_url: str,
    make_client: MakeClient,
    sandbox: SandboxServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A serialization failure (or deadlock) on a write that is its own transaction comes
    back on a live connection: rolled back for sure, so it simply runs again, with no
    reconnection and no look-up."""
    client = make_client(journal=postgres_url)
    client.journal.list_intents()  # the schema is there
    with postgres_server.admin(postgres_url.rsplit("/", 1)[1]) as admin:
        admin.execute("CREATE SEQUENCE refusals")
        admin.execute(
            "CREATE FUNCTION refuse_once() RETURNS trigger SECURITY DEFINER LANGUAGE plpgsql"
            " AS $$ BEGIN IF nextval('refusals') = 1 THEN RAISE EXCEPTION 'refused once'"
            " USING ERRCODE = 'serialization_failure'; END IF; RETURN NEW; END $$"
        )
        admin.execute(
            "CREATE TRIGGER refuse_once BEFORE INSERT ON attempts"
            " FOR EACH ROW EXECUTE FUNCTION refuse_once()"
        )
    caplog.set_level(logging.DEBUG, logger="payonce")
    response = client.post("/v1/payments", json=PAYMENT, reference="order-1")
    assert response.is_success
    (record,) = client.journal.find("order-1")
    assert [a.number for a in client.journal.attempts(record.key)] == [1]
    assert sandbox.store.executions() == {record.key: 1}
    said = [r.getMessage() for r in caplog.records]
    assert any("journal transaction retried" in line for line in said), said
    assert not any("lost the connection" in line for line in said), said


@pytest.mark.slow
def test_a_journal_check_whose_commit_lost_its_connection_is_read_again(
    relayed_url: str, relay: PostgresRelay
) -> None:
    with PostgresJournal(relayed_url) as journal:
        relay.cut_next("after_commit")  # the check's snapshot transaction ends with one
        report = journal.check()
    assert relay.cuts_made == 1
    assert report.ok, report.problems


# -- opening during a restart or a failover -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
def test_a_journal_opened_while_its_database_restarts_waits_for_it(
    relayed_url: str, relay: PostgresRelay, caplog: pytest.LogCaptureFixture, read_only: bool
) -> None:
    caplog.set_level(logging.INFO, logger="payonce")
    if read_only:
        PostgresJournal(relayed_url).close()  # a reader opens a journal that exists
    relay.refuse_next(3)  # the first connections find the server gone: it is restarting
    with PostgresJournal(relayed_url, read_only=read_only) as journal:
        assert journal.check().ok
    assert relay.refused == 3
    said = [r.getMessage() for r in caplog.records]
    assert any("reconnecting, for up to 30s" in line for line in said), said
    assert any("reconnected after" in line for line in said), said


def test_a_journal_whose_database_stays_gone_past_the_failover_timeout_is_not_opened(
    relayed_url: str, relay: PostgresRelay
) -> None:
    relay.refuse_next(1_000_000)
    with pytest.raises(payonce.JournalError) as caught:
        PostgresJournal(relayed_url, failover_timeout=0.5)
    message = str(caught.value)
    assert "cannot connect to the journal database" in message, message
    assert "within 0.5s (failover_timeout)" in message, message
    assert relay.refused > 1, "it never tried again"


@pytest.mark.slow
def test_a_worker_started_while_its_database_restarts_does_its_pass(
    relayed_url: str, relay: PostgresRelay, make_client: MakeClient, sandbox: SandboxServer
) -> None:
    """The red team's case: ``payonce worker`` started during a restart exited with 2."""
    lost = make_unknown(make_client, sandbox, "order-1", "drop_after", journal=relayed_url)
    relay.refuse_next(3)
    result = run_cli_process(
        ["worker", "--once", "--base-url", sandbox.url, "--journal", relayed_url],
        env={"PAYONCE_API_KEY": DEFAULT_API_KEY, "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT},
    )
    assert result.exit_code == 0, result.output
    assert relay.refused == 3
    with PostgresJournal(relayed_url) as journal:
        assert states(journal) == {"order-1": "succeeded"}
    assert sandbox.store.executions() == {lost.key: 1}


# -- a connection killed between the write-ahead and the send -------------------------------------


def test_a_connection_killed_between_write_ahead_and_send_is_replaced_and_the_payment_settles(
    postgres_server: PostgresServer,
    postgres_url: str,
    make_client: MakeClient,
    sandbox: SandboxServer,
    capfd: pytest.CaptureFixture[str],
) -> None:
    dbname = postgres_url.rsplit("/", 1)[1]

    def kill_payonce_connections() -> None:
        with postgres_server.admin(dbname) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'payonce' AND datname = %s",
                (dbname,),
            ).fetchall()
        assert killed
        assert all(ok for (ok,) in killed)

    client = make_client(journal=postgres_url, hooks=Run(kill_payonce_connections))
    with client.intent("order-1") as op:
        response = op.post("/v1/payments", json=PAYMENT)
    assert response.is_success
    assert sandbox.store.executions() == {op.key: 1}
    assert states(client.journal) == {"order-1": "succeeded"}
    client.close()
    assert "psycopg" not in capfd.readouterr().err


# -- no primary to be found -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_caller_in_the_gap_is_told_nothing_was_sent_and_to_resume_and_the_driver_stays_quiet(
    relayed_url: str,
    make_client: MakeClient,
    relay: PostgresRelay,
    sandbox: SandboxServer,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = PostgresJournal(relayed_url, failover_timeout=1.0, busy_timeout=0.5)
    client = make_client(journal=journal)
    with client.intent("order-0") as op:
        op.post("/v1/payments", json=PAYMENT)
    relay.refuse()
    caplog.set_level(logging.DEBUG, logger="payonce")
    with pytest.raises(payonce.JournalError) as raised, client.intent("order-1") as op:
        op.post("/v1/payments", json=PAYMENT)
    message = str(raised.value)
    assert "found no primary to reconnect to within 1s" in message
    assert "nothing was sent" in message
    assert "payonce resume" in message
    assert raised.value.may_have_executed is False
    assert op.key not in sandbox.store.executions()
    err = capfd.readouterr().err
    assert "psycopg" not in err
    assert "connection" not in err
    assert any("journal connection pool" in r.getMessage() for r in caplog.records)
    client.close()
    journal.close()


@pytest.mark.slow
def test_a_call_waiting_for_a_connection_in_an_outage_waits_for_the_new_primary_not_busy(
    relayed_url: str, relay: PostgresRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """One connection for two calls: one finds it dead and looks for a primary; the other
    waits for the pool meanwhile, longer than busy_timeout. Both get their answer once the
    database is back, within failover_timeout."""
    journal = PostgresJournal(relayed_url, pool_size=1, busy_timeout=0.3, failover_timeout=10.0)
    journal.list_intents()
    relay.refuse()
    caplog.set_level(logging.INFO, logger="payonce")
    answers: list[object] = []

    def read() -> None:
        try:
            answers.append(journal.list_intents())
        except payonce.JournalError as exc:
            answers.append(exc)

    callers = [threading.Thread(target=read) for _ in range(2)]
    for caller in callers:
        caller.start()
    time.sleep(1.5)  # the outage outlasts busy_timeout five times over
    relay.accept()
    for caller in callers:
        caller.join(timeout=30)
    assert answers == [[], []]
    assert any("reconnected after" in r.getMessage() for r in caplog.records)
    journal.close()


def test_with_no_outage_a_call_that_finds_no_connection_free_is_told_busy_after_busy_timeout(
    postgres_url: str,
) -> None:
    journal = PostgresJournal(postgres_url, pool_size=1, busy_timeout=0.3, failover_timeout=10.0)
    held = threading.Event()
    release = threading.Event()

    def hold(tx: Any) -> None:
        held.set()
        release.wait(10)

    holder = threading.Thread(target=lambda: journal._engine.read(hold))
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(payonce.JournalBusy, match=r"no connection .* became free"):
            journal.list_intents()
    finally:
        release.set()
        holder.join(timeout=30)
    assert journal.list_intents() == []
    journal.close()


_LOST_IN_A_CHILD = """
import sys
import payonce
from helpers.pgproxy import relay_to
from payonce.journal import PostgresJournal

url, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
with relay_to(host, port) as relay:
    journal = PostgresJournal(
        url.replace(f":{port}/", f":{relay.port}/"), failover_timeout=1.0, busy_timeout=0.5
    )
    journal.list_intents()
    relay.refuse()
    try:
        journal.list_intents()
    except payonce.JournalError as exc:
        print(type(exc).__name__, exc)
    journal.close()
"""


@pytest.mark.slow
def test_a_program_without_logging_set_up_prints_nothing_of_the_driver_when_its_database_goes(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """psycopg_pool warns of every failed reconnection on its logger; with no logging set
    up, Python would print those on stderr."""
    done = subprocess.run(
        [sys.executable, "-c", _LOST_IN_A_CHILD, postgres_url,
         postgres_server.host, str(postgres_server.port)],
        env=python_env(PYTHONPATH=f"{Path(__file__).parent}:{python_env()['PYTHONPATH']}"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("JournalError lost the journal database"), done.stdout
    assert "payonce resume" in done.stdout


# -- a real failover, five times ----------------------------------------------------------------

FAILOVERS = 5
WORKERS = 3
ASYNC_CALLERS = 4


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    started = ReplicatedPair(find_bindir())
    try:
        yield started.start()
    finally:
        started.stop()


def _lines(report: Path) -> list[dict[str, Any]]:
    if not report.exists():
        return []
    return [json.loads(line) for line in report.read_text().splitlines() if line.strip()]


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("synchronous_settles", "failovers"),
    [(False, FAILOVERS), (True, 3)],  # the second only shows what the option adds
    ids=["settles-off", "settles-sync"],
)
def test_payments_from_several_processes_survive_five_failovers_to_a_synchronous_standby(
    pair: ReplicatedPair,
    sandbox: SandboxServer,
    tmp_path: Path,
    synchronous_settles: bool,
    failovers: int,
) -> None:
    """Settles commit with ``synchronous_commit = off`` by default: a failover may lose a
    few (the intent is pending again; its caller has the answer; resume replays it, nothing
    executes twice). With ``synchronous_settles`` it loses none."""
    stop = tmp_path / "stop"
    workers = []
    for n in range(WORKERS):
        command = [
            sys.executable,
            str(Path(__file__).with_name("_failover_worker.py")),
            f"--url={sandbox.url}",
            f"--journal={pair.url}",
            f"--prefix=w{n}",
            f"--report={tmp_path / f'w{n}.jsonl'}",
            f"--log={tmp_path / f'w{n}.log'}",
            f"--stop={stop}",
            *(["--synchronous-settles"] if synchronous_settles else []),
            # The last one pays from several async callers at once on an AsyncClient.
            *([f"--async-callers={ASYNC_CALLERS}"] if n == WORKERS - 1 else []),
        ]
        workers.append(
            subprocess.Popen(
                command,
                env=python_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    reports = [tmp_path / f"w{n}.jsonl" for n in range(WORKERS)]

    def answered_by_all_since(counts: list[int]) -> bool:
        return all(
            sum(line["event"] == "answered" for line in _lines(report)) > count
            for report, count in zip(reports, counts, strict=True)
        )

    def answered_counts() -> list[int]:
        return [sum(line["event"] == "answered" for line in _lines(r)) for r in reports]

    back_after, promoted_after = [], []
    try:
        _wait_for(lambda: answered_by_all_since([5] * WORKERS), "every worker paid a few")
        for _ in range(failovers):
            killed_at, before = time.monotonic(), answered_counts()
            pair.kill_primary_and_promote()
            promoted_after.append(time.monotonic() - killed_at)
            _wait_for(lambda: answered_by_all_since(before), "every worker paid again")  # noqa: B023
            back_after.append(time.monotonic() - killed_at)
            pair.rebuild_standby()
            _wait_for(lambda: answered_by_all_since(answered_counts()), "payments go on")
        stop.touch()
        for worker in workers:
            worker.wait(timeout=120)
    finally:
        stop.touch()
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    outputs = [(worker.returncode, *worker.communicate()) for worker in workers]
    assert pair.failovers == failovers

    # Nothing of libpq's or psycopg's reached stderr; every worker ended by itself.
    assert [(code, err) for code, _, err in outputs] == [(0, "")] * WORKERS

    lines = [line for report in reports for line in _lines(report)]
    journaled = {line["key"]: line["ref"] for line in lines if line["event"] == "journaled"}
    answered = {line["ref"] for line in lines if line["event"] == "answered"}
    errors = [line for line in lines if line["event"] == "error"]
    refs = {line["ref"] for line in lines}
    # Every call ended with its answer or a payonce error, never both, never neither.
    assert {line["ref"] for line in errors}.isdisjoint(answered)
    assert answered | {line["ref"] for line in errors} == refs

    executed_before_resume = sandbox.store.executions()
    with PostgresJournal(pair.url) as journal:
        by_ref = {record.reference: record for record in journal.list_intents()}
        # Every intent whose write-ahead the caller saw committed is on the new primary.
        found = {record.key for record in by_ref.values()}
        assert set(journaled) <= found, set(journaled) - found
        # A caller told nothing was sent: nothing was.
        for error in errors:
            assert error["type"] in ("JournalError", "JournalBusy"), error
            assert "payonce resume" in error["message"], error
            record = by_ref.get(error["ref"])
            if not error["may_have_executed"] and record is not None:
                assert record.key not in executed_before_resume, error
        settles_lost = [
            ref for ref in answered if by_ref[ref].state is not payonce.IntentState.SUCCEEDED
        ]
    if synchronous_settles:
        assert settles_lost == [], "a settle committed with the standby survives the failover"

    done = run_cli_process(
        ["resume"],
        env={
            "PAYONCE_API_KEY": DEFAULT_API_KEY,
            "PAYONCE_BASE_URL": sandbox.url,
            "PAYONCE_PROVIDER": "sandbox",
            "PAYONCE_ACCOUNT": "acct_demo",
            "PAYONCE_JOURNAL": pair.url,
        },
        secrets=[pair.password],
    )
    assert done.exit_code == 0, done.output

    with PostgresJournal(pair.url) as journal:
        final = journal.list_intents()
    assert {record.state for record in final} == {payonce.IntentState.SUCCEEDED}
    assert {record.reference for record in final} >= answered
    executions = sandbox.store.executions()
    assert set(executions) == {record.key for record in final}
    assert set(executions.values()) == {1}, "no payment executed twice"

    logs = "".join((tmp_path / f"w{n}.log").read_text() for n in range(WORKERS))
    reconnections = [
        float(match)
        for match in re.findall(
            r"(?:reconnected|checked on a new connection) after ([\d.]+)s", logs
        )
    ]
    commits_checked = logs.count("checked on a new connection")
    print(
        f"\nsynchronous_settles={synchronous_settles}: "
        f"{failovers} failovers, {WORKERS} paying processes, {len(refs)} payments: "
        f"{len(journaled)} journaled, {len(answered)} answered, {len(errors)} errors, "
        f"{len(settles_lost)} settles lost with the old primary (resumed), "
        f"0 executed twice.\n"
        f"after each kill, the standby promoted: "
        f"{', '.join(f'{s:.1f}s' for s in promoted_after)}; every worker paying again: "
        f"{', '.join(f'{s:.1f}s' for s in back_after)}\n"
        f"a journal write's reconnection: median "
        f"{statistics.median(reconnections) if reconnections else 0:.2f}s, "
        f"max {max(reconnections, default=0):.2f}s over {len(reconnections)}; "
        f"{commits_checked} commits lost with their connection, looked for on the new primary"
    )


# -- a synchronous standby that stopped answering -----------------------------------------------
# Every commit then waits in ``SyncRep``. A DBA who cancels that wait (``pg_cancel_backend``)
# gets the commit kept on the primary only, with no more than a WARNING: a write-ahead so
# committed is not durable (a failover now loses it, and a retry would mint a new key), so
# payonce sends nothing on the strength of it and tells its caller so.


def _processes(node: Node) -> list[int]:
    postmaster = node.postmaster_pid()
    children = subprocess.run(
        ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
    ).stdout.split()
    return [postmaster, *map(int, children)]


@contextlib.contextmanager
def frozen(node: Node) -> Iterator[None]:
    """Every process of ``node`` stopped (SIGSTOP): it acknowledges no WAL until the end."""
    stopped = _processes(node)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _cancel_the_wait_for_the_standby(pair: ReplicatedPair, how: str) -> None:
    """What a DBA does to a session stuck in ``SyncRep``: cancel it, from another session."""
    with pair.primary.connect() as conn:
        waiting: list[int] = []

        def found() -> bool:
            waiting[:] = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE wait_event = 'SyncRep' AND application_name = 'payonce'"
                ).fetchall()
            ]
            return bool(waiting)

        _wait_for(found, "payonce's commit waits for the standby")
        for pid in waiting:
            conn.execute(f"SELECT {how}(%s)", (pid,))


def _standby_synchronous(pair: ReplicatedPair) -> bool:
    with pair.primary.connect() as conn:
        row = conn.execute(
            "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
        ).fetchone()
    return row is not None and row[0] == "sync"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("how", "said", "kind"),
    [
        (
            "pg_cancel_backend",
            "canceling wait for synchronous replication due to user request",
            "Client",
        ),
        (
            "pg_terminate_backend",
            "canceling the wait for synchronous replication and terminating connection due to "
            "administrator command",
            "Client",
        ),
        # An AsyncClient writes on its event loop, on connections of its own.
        (
            "pg_cancel_backend",
            "canceling wait for synchronous replication due to user request",
            "AsyncClient",
        ),
    ],
)
def test_a_write_ahead_whose_wait_for_the_standby_was_cancelled_sends_nothing_and_a_retry_pays_once(
    pair: ReplicatedPair,
    sandbox: SandboxServer,
    client_options: dict[str, Any],
    closing: contextlib.ExitStack,
    how: str,
    said: str,
    kind: str,
) -> None:
    # A lease longer than the test: the call again below must not wait for it.
    options = {**client_options, "journal": pair.url, "lease_seconds": 600.0}
    if kind == "AsyncClient":
        # One event loop, in a thread of its own, for every call: a service's loop.
        loop = asyncio.new_event_loop()
        running = threading.Thread(target=loop.run_forever, daemon=True)
        running.start()
        asynchronous = payonce.AsyncClient(**options)
        journal = asynchronous.journal

        def on_loop(coroutine: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=120)

        def stop_loop() -> None:
            on_loop(asynchronous.aclose())
            loop.call_soon_threadsafe(loop.stop)
            running.join()
            loop.close()

        closing.callback(stop_loop)

        def post(reference: str) -> object:
            return on_loop(asynchronous.post("/v1/payments", json=PAYMENT, reference=reference))

    else:
        client = closing.enter_context(payonce.Client(**options))
        journal = client.journal

        def post(reference: str) -> object:
            return client.post("/v1/payments", json=PAYMENT, reference=reference)

    post("before-the-standby-stopped")
    executed_before = sandbox.store.executions()

    outcome: list[BaseException | object] = []

    def pay() -> None:
        try:
            outcome.append(post("order-1"))
        except BaseException as exc:  # the test reads it below
            outcome.append(exc)

    with frozen(pair.standby):
        caller = threading.Thread(target=pay)
        caller.start()
        _cancel_the_wait_for_the_standby(pair, how)
        caller.join(timeout=60)
        assert not caller.is_alive(), "the caller is still waiting"

        [error] = outcome
        assert isinstance(error, payonce.JournalError), error
        assert not error.may_have_executed
        message = str(error)
        assert "without its synchronous standby" in message, message
        assert said in message, message
        assert "nothing was sent" in message, message
        assert "journaled on the primary only" in message, message
        assert "same reference" in message, message
        assert "payonce resume" in message, message
        assert pair.password not in message
        # Nothing reached the provider.
        assert sandbox.store.executions() == executed_before
        # The intent is journaled (on the primary), never sent.
        [record] = [r for r in journal.list_intents() if r.reference == "order-1"]
        assert record.state is payonce.IntentState.PENDING

    _wait_for(lambda: _standby_synchronous(pair), "the standby is synchronous again")
    # Called again at once, in the same process: the refused call's lease does not hold it.
    response = post("order-1")
    assert isinstance(response, httpx.Response)
    assert response.status_code == 201
    assert sandbox.store.execution_count(record.key) == 1
    assert sandbox.store.total_executions() == sum(executed_before.values()) + 1


# -- a database restarted under a program that set up no logging --------------------------------

_RESTARTED_UNDER_A_CHILD = """
import sys
import payonce

url, base_url, api_key = sys.argv[1:4]
with payonce.Client(base_url=base_url, api_key=api_key, journal=url) as client:
    client.post("/v1/payments", json={"amount": 100, "currency": "eur"}, reference="one")
    print("paid", flush=True)
    sys.stdin.readline()  # the database is restarted meanwhile
    for n in range(3):
        answer = client.post(
            "/v1/payments", json={"amount": 100, "currency": "eur"}, reference=f"two-{n}"
        )
        print(answer.status_code, flush=True)
"""


@pytest.mark.slow
def test_a_database_restart_payonce_reconnects_from_prints_nothing_on_stderr(
    postgres_server: PostgresServer, postgres_url: str, sandbox: SandboxServer
) -> None:
    """An immediate shutdown tells every session "WARNING: terminating connection due to
    immediate shutdown command"; payonce reconnects, so it is logged at INFO, and a program
    with no logging set up (Python's last-resort handler prints WARNING and above) prints
    nothing."""
    child = subprocess.Popen(
        [sys.executable, "-c", _RESTARTED_UNDER_A_CHILD, postgres_url, sandbox.url,
         DEFAULT_API_KEY],
        env=python_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "paid\n"
        postgres_server._tool(
            "pg_ctl", "-D", str(postgres_server.data), "-l", str(postgres_server.log),
            "-m", "immediate", "-w", "-t", "60", "restart",
        )  # fmt: skip
        postgres_server._wait_until_ready()
        out, err = child.communicate("go\n", timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert out.split() == ["201"] * 3
    assert err == ""
