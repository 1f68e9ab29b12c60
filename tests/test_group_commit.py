"""Group commit in the SQLite journal: many callers' writes in one transaction, each
caller still answered as if it had committed alone.

What must hold: no durable write (claim, start_attempt) returns before the transaction
holding it is committed with synchronous=FULL; one member's failure (a refusal, a busy
journal, a broken transaction, an interrupt) is its own and never another member's.
Batches are made deterministic by holding the head of the writer queue while the
members line up behind it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

import payonce
from helpers.crash import (
    GROUP_WORKER,
    KILLED,
    exactly_once_violations,
    run_worker,
    settled_states,
    worker_env,
)
from helpers.journals import RESPONSE, IntentStore, draft_for, store_of
from payonce._crash import CRASH_POINTS
from payonce._journal import _sqlite_file as journal_file
from payonce._journal._engine import Tx
from payonce._journal._group_commit import Member
from payonce._lifecycle import NOTHING_CHANGED, ClaimKind, Transition
from payonce.journal import SQLiteJournal
from payonce.sandbox import SandboxServer

SUCCEEDED = payonce.IntentState.SUCCEEDED
PENDING = payonce.IntentState.PENDING


def settle(store: IntentStore, key: str, owner: str) -> payonce.IntentRecord:
    return store.settle(
        key,
        owner=owner,
        now=time.time(),
        transition=Transition.SUCCEEDED,
        response=RESPONSE,
        attempt=1,
    )


def claim(store: IntentStore, number: int, owner: str, **changes: Any) -> ClaimKind:
    draft = attrs.evolve(draft_for(number), **changes)
    return store.claim(draft, owner=owner, now=time.time(), lease_seconds=60).kind


# -- a deterministic batch ------------------------------------------------------------------


@contextlib.contextmanager
def queue_held(journal: SQLiteJournal) -> Iterator[None]:
    """A placeholder at the head of the writer queue: writes line up behind it, and the
    first of them leads them all as one batch once the block ends."""
    group = journal._engine._group  # the SQLite engine's group commit
    with group._queue_lock:
        assert not group._queue, "the journal must be idle"
        group._queue.append(Member(lambda tx: None, False, ""))
    try:
        yield
    finally:
        group._hand_over(1)


def wait_for_queue(journal: SQLiteJournal, length: int) -> None:
    deadline = time.monotonic() + 10
    queue = journal._engine._group._queue
    while len(queue) < length:
        assert time.monotonic() < deadline, f"only {len(queue)} of {length} queued"
        time.sleep(0.001)


Outcome = tuple[str, Any]


def one_batch(
    journal: SQLiteJournal, calls: list[Callable[[], Any]], *, commits: int = 1
) -> list[Outcome]:
    """Run ``calls`` from threads of their own, queued in this order, as one batch, which
    makes ``commits`` commits (1: the batch's own).

    Each outcome is ("ok", value) or ("raised", exception).
    """
    outcomes: list[Outcome] = [("unset", None)] * len(calls)

    def run(index: int) -> None:
        try:
            outcomes[index] = ("ok", calls[index]())
        except BaseException as exc:
            outcomes[index] = ("raised", exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    before = journal._engine.commits
    with queue_held(journal):
        for number, thread in enumerate(threads, start=2):
            thread.start()
            wait_for_queue(journal, number)  # one at a time: the queue order is the list's
    for thread in threads:
        thread.join(30)
    assert journal._engine.commits == before + commits
    return outcomes


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[SQLiteJournal]:
    with SQLiteJournal(tmp_path / "journal.db") as journal:
        yield journal


@pytest.fixture
def store(journal: payonce.Journal) -> IntentStore:
    """The journal's private writes, as a client on it makes them."""
    return store_of(journal)


# -- isolation inside one batch --------------------------------------------------------------


class Boom(Exception):
    pass


def test_a_member_s_refusal_or_failure_stays_its_own_and_its_writes_are_undone_alone(
    journal: SQLiteJournal,
    store: IntentStore,
) -> None:
    # Before the batch: a settled intent 1, and pending intents 2 (held by "w2") and 3.
    assert claim(store, 1, "w1") is ClaimKind.CREATED
    settle(store, "key-00001", "w1")
    assert claim(store, 2, "w2") is ClaimKind.CREATED
    assert claim(store, 3, "w3") is ClaimKind.CREATED

    def write_then_fail(tx: Tx) -> None:
        tx.execute("UPDATE intents SET state = 'failed' WHERE key = 'key-00003'")
        raise Boom("this caller's own failure")

    outcomes = one_batch(
        journal,
        [
            lambda: claim(store, 10, "a"),  # new: created
            lambda: claim(store, 1, "b", fingerprint="f" * 64),  # same intent, other body
            lambda: settle(store, "key-00002", "not-the-holder"),  # refused
            lambda: journal._engine.write(write_then_fail, durable=True, busy=NOTHING_CHANGED),
            lambda: journal.acknowledge("key-00002", now=time.time()),  # pending: refused
            lambda: claim(store, 10, "c"),  # sees the created intent 10: leased
            lambda: settle(store, "key-00002", "w2"),  # the holder: settles
            lambda: claim(store, 11, "d"),  # new: created
        ],
    )

    assert outcomes[0] == ("ok", ClaimKind.CREATED)
    assert outcomes[1] == ("ok", ClaimKind.MISMATCH)
    assert outcomes[2][0] == "raised"
    assert isinstance(outcomes[2][1], payonce.IntentInFlight)
    assert outcomes[3][0] == "raised"
    assert isinstance(outcomes[3][1], Boom)
    assert outcomes[4][0] == "raised"
    assert isinstance(outcomes[4][1], payonce.IntentStateError)
    assert outcomes[5] == ("ok", ClaimKind.LEASED)
    assert outcomes[6][0] == "ok"
    assert outcomes[6][1].state is SUCCEEDED
    assert outcomes[7] == ("ok", ClaimKind.CREATED)

    states = {r.key: r.state for r in journal.list_intents()}
    assert states == {
        "key-00001": SUCCEEDED,
        "key-00002": SUCCEEDED,
        "key-00003": PENDING,  # the failed member's update was rolled back, alone
        "key-00010": PENDING,
        "key-00011": PENDING,
    }
    assert journal.get("key-00001").fingerprint == draft_for(1).fingerprint  # type: ignore[union-attr]
    assert journal.get("key-00010").lease_owner == "a"  # type: ignore[union-attr]


def test_a_batch_in_which_every_member_succeeds_costs_no_savepoints(
    journal: SQLiteJournal,
    store: IntentStore,
) -> None:
    assert claim(store, 1, "w1") is ClaimKind.CREATED
    log = StatementLog(journal)

    outcomes = one_batch(
        journal,
        [
            lambda: claim(store, 2, "a"),
            lambda: settle(store, "key-00001", "w1"),
            lambda: claim(store, 3, "b"),
        ],
    )

    assert [kind for kind, _ in outcomes] == ["ok", "ok", "ok"]
    words = [statement.split()[0].upper() for statement in log.statements]
    assert "SAVEPOINT" not in words
    assert "ROLLBACK" not in words
    assert (words.count("BEGIN"), log.commits()) == (1, 1)
    # Each member's own statements only, two each.
    assert len([w for w in words if w in ("INSERT", "UPDATE", "SELECT")]) == 6


def test_a_member_that_fails_sends_the_batch_round_again_with_savepoints(
    journal: SQLiteJournal,
    store: IntentStore,
) -> None:
    log = StatementLog(journal)

    outcomes = one_batch(
        journal,
        [
            lambda: claim(store, 1, "a"),
            lambda: settle(store, "key-00009", "nobody"),  # no such intent: refused
            lambda: claim(store, 2, "b"),
        ],
    )

    assert outcomes[0] == ("ok", ClaimKind.CREATED)
    assert outcomes[1][0] == "raised"
    assert isinstance(outcomes[1][1], payonce.IntentInFlight)
    assert outcomes[2] == ("ok", ClaimKind.CREATED)
    words = [statement.split()[0].upper() for statement in log.statements]
    assert (words.count("BEGIN"), words.count("ROLLBACK"), log.commits()) == (2, 2, 1)
    assert words.count("SAVEPOINT") == words.count("RELEASE") == 3
    assert {r.key: r.lease_owner for r in journal.list_intents()} == {
        "key-00001": "a",
        "key-00002": "b",
    }


def test_a_busy_journal_fails_each_member_with_its_own_message(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with SQLiteJournal(path, busy_timeout=0.3) as journal:
        store = store_of(journal)
        assert claim(store, 1, "w") is ClaimKind.CREATED
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # another process holds the journal
            try:
                outcomes = one_batch(
                    journal,
                    [lambda: claim(store, 2, "w"), lambda: settle(store, "key-00001", "w")],
                    commits=0,
                )
            finally:
                other.execute("ROLLBACK")

    (kind_claim, claimed), (kind_settle, settled) = outcomes
    assert (kind_claim, kind_settle) == ("raised", "raised")
    assert isinstance(claimed, payonce.JournalBusy)
    assert isinstance(settled, payonce.JournalBusy)
    assert "nothing was sent" in str(claimed)
    assert "nothing was sent" not in str(settled)
    assert "stays pending under its key" in str(settled)
    with SQLiteJournal(path) as journal:
        assert [r.key for r in journal.list_intents()] == ["key-00001"]


def test_a_journal_replaced_under_a_batch_fails_each_member_after_one_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file at the journal's path was replaced (a volume recreated): the batch's leader
    looks once, and every member is told so in its own words, with nothing written."""
    path = tmp_path / "journal.db"
    with SQLiteJournal(path) as journal:
        store = store_of(journal)
        assert claim(store, 1, "w") is ClaimKind.CREATED
        for side in ("", "-wal", "-shm"):
            path.with_name(path.name + side).unlink(missing_ok=True)
        SQLiteJournal(path).close()  # the new deploy's journal at the same path
        looks = []
        look = journal_file.identity

        def counted(path: Path) -> tuple[int, int] | None:
            looks.append(1)
            return look(path)

        monkeypatch.setattr(journal_file, "identity", counted)
        outcomes = one_batch(
            journal,
            [lambda: claim(store, 2, "w"), lambda: settle(store, "key-00001", "w")],
            commits=0,
        )
        assert len(looks) == 1, "one stat for the whole batch"

    (kind_claim, claimed), (kind_settle, settled) = outcomes
    assert (kind_claim, kind_settle) == ("raised", "raised")
    for error in (claimed, settled):
        assert isinstance(error, payonce.JournalError)
        assert "removed or replaced under this process" in str(error)
    assert "nothing was sent" in str(claimed)
    assert claimed.may_have_executed is False
    assert "stays pending under its key" in str(settled)
    assert settled.may_have_executed is True
    with SQLiteJournal(path) as journal:
        assert journal.list_intents() == [], "the new journal got nothing of the old one's"


def test_a_transaction_sqlite_aborts_is_rerun_member_by_member(
    journal: SQLiteJournal, store: IntentStore
) -> None:
    """SQLite rolls a whole transaction back on some errors (a full disk, an I/O error):
    the other members' decisions may have rested on rows that are gone, so each is
    decided again, alone, and gets the answer it would have got without batching."""

    def abort_the_transaction(tx: Tx) -> None:
        tx.execute("ROLLBACK")  # what SQLite does itself on SQLITE_FULL or SQLITE_IOERR
        raise sqlite3.OperationalError("database or disk is full")

    outcomes = one_batch(
        journal,
        [
            lambda: claim(store, 1, "a"),
            lambda: journal._engine.write(
                abort_the_transaction, durable=True, busy=NOTHING_CHANGED
            ),
            lambda: claim(store, 1, "b"),
            lambda: claim(store, 2, "c"),
        ],
        commits=3,  # the batch's commit never came: the three good members, alone
    )

    assert outcomes[0] == ("ok", ClaimKind.CREATED)
    assert outcomes[1][0] == "raised"
    assert isinstance(outcomes[1][1], payonce.JournalError)
    assert "database or disk is full" in str(outcomes[1][1])
    assert outcomes[2] == ("ok", ClaimKind.LEASED)
    assert outcomes[3] == ("ok", ClaimKind.CREATED)
    assert {r.key: r.lease_owner for r in journal.list_intents()} == {
        "key-00001": "a",
        "key-00002": "c",
    }


def test_an_interrupt_in_the_leader_gives_up_its_own_write_and_the_others_go_on(
    journal: SQLiteJournal,
    store: IntentStore,
) -> None:
    """Ctrl-C reaches the main thread while it leads a batch (here: while it runs another
    member's write): its own write is given up, the others are committed all the same."""
    interrupted = threading.Event()

    def interrupt_once(tx: Tx) -> str:
        if not interrupted.is_set():
            interrupted.set()
            raise KeyboardInterrupt
        return "written"

    results: dict[str, Any] = {}

    def member(name: str, call: Callable[[], Any]) -> threading.Thread:
        def run() -> None:
            results[name] = call()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    placeholder = Member(lambda tx: None, False, "")
    with journal._engine._group._queue_lock:
        journal._engine._group._queue.append(placeholder)

    def line_up_then_release() -> None:
        wait_for_queue(journal, 2)  # the main thread is queued first: it will lead
        threads.append(
            member(
                "other",
                lambda: journal._engine.write(interrupt_once, durable=False, busy=NOTHING_CHANGED),
            )
        )
        wait_for_queue(journal, 3)
        threads.append(member("third", lambda: claim(store, 3, "t")))
        wait_for_queue(journal, 4)
        journal._engine._group._hand_over(1)

    threads: list[threading.Thread] = []
    releaser = threading.Thread(target=line_up_then_release)
    releaser.start()
    with pytest.raises(KeyboardInterrupt):
        claim(store, 1, "main")
    releaser.join(10)
    for thread in threads:
        thread.join(10)

    assert results == {"other": "written", "third": ClaimKind.CREATED}
    assert [r.key for r in journal.list_intents()] == ["key-00003"]
    assert not journal._engine._group._queue
    assert claim(store, 1, "main") is ClaimKind.CREATED  # the journal goes on


# -- many callers, end to end ---------------------------------------------------------------


class CommittedBeforeSend(httpx.BaseTransport):
    """At the moment a request leaves, reads the journal through a connection of its own:
    the intent and the attempt being sent must already be committed there."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._inner = httpx.HTTPTransport()
        self.problems: list[str] = []
        self.sent = 0
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        with contextlib.closing(sqlite3.connect(self._path)) as other:
            row = other.execute(
                "SELECT state, lease_owner IS NOT NULL,"
                " (SELECT count(*) FROM attempts a WHERE a.key = i.key AND a.ended_at IS NULL)"
                " FROM intents i WHERE key = ?",
                (key,),
            ).fetchone()
        with self._lock:
            self.sent += 1
            if row != ("pending", 1, 1):
                self.problems.append(f"{key} was sent while the journal showed {row}")
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


_LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class StatementLog:
    """Every statement the journal's connection runs, in order (they are serialised)."""

    def __init__(self, journal: SQLiteJournal) -> None:
        level = journal._engine.conn.execute("PRAGMA synchronous").fetchone()[0]
        self.statements = [f"PRAGMA synchronous = {_LEVELS[level]}"]
        journal._engine.conn.set_trace_callback(self.statements.append)

    def durable_writes_committed_without_fsync(self) -> list[str]:
        """Transactions that wrote a write-ahead record (a new intent or a new attempt) and
        committed while synchronous was not FULL."""
        level, durable, problems = "", False, []
        for statement in self.statements:
            text = " ".join(statement.split()).upper()
            if text.startswith("PRAGMA SYNCHRONOUS ="):
                level = text.rsplit("=", 1)[1].strip()
            elif text.startswith(("INSERT INTO INTENTS", "INSERT INTO ATTEMPTS")):
                durable = True
            elif text == "COMMIT":
                if durable and level != "FULL":
                    problems.append(f"commit under synchronous={level}")
                durable = False
            elif text == "ROLLBACK":
                durable = False
        return problems

    def commits(self) -> int:
        return sum(1 for s in self.statements if s.strip().upper() == "COMMIT")


@pytest.mark.slow
def test_sixty_four_threads_each_intent_is_committed_before_its_request_is_sent(
    sandbox: SandboxServer, client_options: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "journal.db"
    journal = SQLiteJournal(path)
    log = StatementLog(journal)
    transport = CommittedBeforeSend(path)
    options = {**client_options, "journal": journal, "timeout": 10.0, "transport": transport}
    client = payonce.Client(**options)
    threads, per_thread = 64, 4
    start = threading.Barrier(threads)

    def pay(worker: int) -> Counter[str]:
        outcomes = Counter[str]()
        start.wait()
        for n in range(per_thread):
            reference = f"order-{worker:02d}-{n}"
            response = client.post(
                "/v1/payments",
                json={"amount": 1000 + n, "currency": "eur", "reference": reference},
                reference=reference,
            )
            outcomes[str(response.status_code)] += 1
        return outcomes

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            totals = sum(pool.map(pay, range(threads)), Counter[str]())
    finally:
        client.close()
        journal.close()

    payments = threads * per_thread
    assert totals == {"201": payments}
    assert transport.sent == payments
    assert transport.problems == []
    assert log.durable_writes_committed_without_fsync() == []
    executions = sandbox.store.executions()
    assert len(executions) == payments
    assert set(executions.values()) == {1}
    # Two writes per payment (claim, settle with its acknowledgement): batching happened.
    assert log.commits() < 2 * payments * 0.8, f"{log.commits()} commits"
    with SQLiteJournal(path) as reopened:
        assert Counter(r.state for r in reopened.list_intents()) == {SUCCEEDED: payments}


def test_without_group_commit_every_write_commits_alone(
    client_options: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "journal.db"
    journal = SQLiteJournal(path, group_commit=False)
    log = StatementLog(journal)
    transport = CommittedBeforeSend(path)
    with (
        payonce.Client(**{**client_options, "journal": journal, "transport": transport}) as client,
        ThreadPoolExecutor(max_workers=8) as pool,
    ):
        list(
            pool.map(
                lambda n: client.post(
                    "/v1/payments",
                    json={"amount": 100 + n, "currency": "eur"},
                    reference=f"o{n}",
                ),
                range(40),
            )
        )
    journal.close()
    assert log.commits() == 2 * 40  # the write-ahead; the settle with its acknowledgement
    assert log.durable_writes_committed_without_fsync() == []


# -- killed in the middle of batches ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_kill_in_the_middle_of_batches_still_executes_every_order_once(
    sandbox: SandboxServer, tmp_path: Path, point: str
) -> None:
    """Sixteen threads pay through one client; the process is SIGKILLed on the 12th visit
    of a crash point, with other threads' writes queued or mid-batch. A restart (the
    sequential worker: resume, reconcile, pay) must leave each order executed once."""
    provider = sandbox
    journal = tmp_path / "journal.db"
    orders = 48
    command = [sys.executable, str(GROUP_WORKER), "--url", provider.url, "--journal", str(journal)]
    done = subprocess.run(
        [*command, "--orders", str(orders), "--threads", "16"],
        env=worker_env(crash_at=f"{point}:12"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == KILLED, done.stderr[-3000:]

    assert run_worker(provider, journal, orders) == 0
    assert exactly_once_violations(provider, journal, orders) == []
    assert settled_states(journal) == {"succeeded": orders}
    assert provider.store.total_executions() == orders
