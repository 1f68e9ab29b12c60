"""The SQLite journal on real files: durable before sending, never damaging what it finds.

No mocks: every journal here is a real SQLite file, every "other process" a real one, and
every provider the real sandbox on loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import pwd
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.cli import run_cli_process
from helpers.journals import draft_for, store_of
from helpers.payments import PAYMENT
from payonce._journal._schema import SCHEMA_VERSION
from payonce._lifecycle import ClaimKind, Transition
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

DATA = Path(__file__).parent / "data"

SQLITE_SYNCHRONOUS_FULL = 2


# -- helpers ---------------------------------------------------------------------------------


def write_real_journal(path: Path, *, intents: int) -> None:
    """A journal as payonce itself leaves it: intents claimed, answered and settled."""
    with payonce.journal.SQLiteJournal(path) as journal:
        store = store_of(journal)
        for number in range(intents):
            claim = store.claim(
                draft_for(number, padding=250),
                owner="writer",
                now=1000.0 + number,
                lease_seconds=30,
            )
            store.settle(
                claim.record.key,
                owner="writer",
                now=1000.5 + number,
                transition=Transition.SUCCEEDED,
                response=payonce.journal.StoredResponse(
                    status=201,
                    headers=(("content-type", "application/json"),),
                    body=b'{"id":"pay_%05d","status":"succeeded"}' % number,
                ),
                attempt=1,
            )


def snapshot(directory: Path) -> dict[str, str | None]:
    """Every file (by SHA-256) and directory (None) under ``directory``."""
    found: dict[str, str | None] = {}
    for entry in sorted(directory.rglob("*")):
        name = str(entry.relative_to(directory))
        found[name] = hashlib.sha256(entry.read_bytes()).hexdigest() if entry.is_file() else None
    return found


def read_rows(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the journal through a connection of its own, as another process would."""
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return connection.execute(sql, params).fetchall()


def sandbox_client(sandbox: SandboxServer, journal: Any, **overrides: Any) -> payonce.Client:
    options: dict[str, Any] = {
        "base_url": sandbox.url,
        "provider": "sandbox",
        "account": "acct_demo",
        "api_key": DEFAULT_API_KEY,
        "journal": journal,
        "retry": payonce.RetryPolicy(initial_wait=0.001, max_wait=0.01, max_attempts=5),
        "timeout": 5.0,
    }
    options.update(overrides)
    return payonce.Client(**options)


# -- a new journal ---------------------------------------------------------------------------


def test_a_new_journal_file_and_its_wal_files_are_readable_by_the_owner_only(
    journal_path: Path,
) -> None:
    with payonce.journal.SQLiteJournal(journal_path) as journal:
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
        for suffix in ("", "-wal", "-shm"):
            mode = stat.S_IMODE(os.stat(f"{journal_path}{suffix}").st_mode)
            assert mode == 0o600, f"{journal_path.name}{suffix} has mode {oct(mode)}"


@pytest.fixture
def shared_directory() -> Iterator[Path]:
    """A directory every local user may enter (pytest's own tmp dirs are root-only)."""
    directory = Path(tempfile.mkdtemp(prefix="payonce-journal-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


def test_another_local_user_can_read_neither_the_journal_nor_its_wal_files(
    shared_directory: Path,
) -> None:
    """Checked as ``nobody``: root reads any file whatever its mode."""
    path = shared_directory / "journal.db"
    control = shared_directory / "notes.txt"
    control.write_text("world-readable\n")
    control.chmod(0o644)

    def readable_by_nobody(target: Path) -> bool:
        done = subprocess.run(["cat", str(target)], user="nobody", capture_output=True, check=False)
        return done.returncode == 0

    assert readable_by_nobody(control), (
        "the control file must be readable: else this proves nothing"
    )
    with payonce.journal.SQLiteJournal(path) as journal:
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
        for suffix in ("", "-wal", "-shm"):
            assert not readable_by_nobody(Path(f"{path}{suffix}")), f"journal.db{suffix}"


def _as_nobody(open_it: Callable[[], object]) -> str:
    """Run ``open_it`` in a child process that became ``nobody`` (root reads every file
    whatever its mode, so the checks are made as an ordinary user); its outcome in words."""
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.close(read)
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            open_it()
            outcome = "opened"
        except payonce.JournalError as exc:
            outcome = f"JournalError: {exc}"
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(child, 0)
    return outcome


def test_a_journal_restored_readable_by_others_is_closed_to_its_owner_again(
    journal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with payonce.journal.SQLiteJournal(journal_path) as journal:
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    journal_path.chmod(0o644)  # as `cp` leaves a restored copy under a usual umask

    with payonce.journal.SQLiteJournal(journal_path) as journal:
        assert len(journal.list_intents()) == 1, "nothing lost"

    assert stat.S_IMODE(journal_path.stat().st_mode) == 0o600
    assert any("readable or writable by other users" in r.getMessage() for r in caplog.records)


def test_another_user_s_journal_is_refused_and_an_unreadable_one_explained(
    shared_directory: Path,
) -> None:
    path = shared_directory / "journal.db"
    with payonce.journal.SQLiteJournal(path) as journal:
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    before = snapshot(shared_directory)

    foreign = _as_nobody(lambda: payonce.journal.SQLiteJournal(path))  # root's, mode 0600
    assert foreign.startswith("JournalError: the journal file belongs to another user"), foreign
    assert "run payonce as that user" in foreign
    assert snapshot(shared_directory) == before, "nothing changed, nothing lost"

    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    path.chmod(0o200)  # its own, but not readable: a mode set wrong
    unreadable = _as_nobody(lambda: payonce.journal.SQLiteJournal(path))
    assert unreadable.startswith("JournalError: the journal file cannot be read"), unreadable
    assert "run payonce as the user that owns it" in unreadable


def test_a_backup_to_a_dangling_symbolic_link_is_refused_clearly(
    journal_path: Path, tmp_path: Path
) -> None:
    link = tmp_path / "backup.db"
    link.symlink_to(tmp_path / "nowhere" / "backup.db")
    with (
        payonce.journal.SQLiteJournal(journal_path) as journal,
        pytest.raises(payonce.JournalError, match="is a symbolic link"),
    ):
        journal.backup(link)
    assert link.is_symlink()
    assert not (tmp_path / "nowhere").exists()


def test_the_default_journal_directory_is_created_private(tmp_path: Path) -> None:
    """Only the default location's directory is created on demand, and only for its owner."""
    journal = payonce.open_journal()
    try:
        location = Path(journal.location)
        assert location.is_relative_to(tmp_path / "home"), "must honour the isolated XDG dirs"
        assert stat.S_IMODE(location.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(location.stat().st_mode) == 0o600
    finally:
        journal.close()


def test_the_journal_runs_in_wal_mode(journal_path: Path) -> None:
    with payonce.journal.SQLiteJournal(journal_path) as journal:
        (own,) = journal._engine.conn.execute("PRAGMA journal_mode").fetchone()
        assert own == "wal"
        # WAL is a property of the file: any other process opening it sees it too.
        assert read_rows(journal_path, "PRAGMA journal_mode") == [("wal",)]


def test_write_ahead_records_commit_with_synchronous_full(journal_path: Path) -> None:
    """The claim and every later attempt start are fsynced, even right after a lighter write."""
    with payonce.journal.SQLiteJournal(journal_path) as journal:
        store = store_of(journal)
        first = store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
        assert journal._engine.conn.execute("PRAGMA synchronous").fetchone() == (
            SQLITE_SYNCHRONOUS_FULL,
        )

        store.end_attempt(
            first.record.key,
            1,
            owner="w",
            now=1001.0,
            status_code=503,
            error=None,
            transition=Transition.ATTEMPT_AMBIGUOUS,
        )
        store.start_attempt(first.record.key, owner="w", now=1002.0, lease_seconds=30)
        assert journal._engine.conn.execute("PRAGMA synchronous").fetchone() == (
            SQLITE_SYNCHRONOUS_FULL,
        )

        store.end_attempt(
            first.record.key,
            2,
            owner="w",
            now=1003.0,
            status_code=503,
            error=None,
            transition=Transition.ATTEMPT_AMBIGUOUS,
        )
        store.claim(draft_for(2), owner="w", now=1004.0, lease_seconds=30)
        assert journal._engine.conn.execute("PRAGMA synchronous").fetchone() == (
            SQLITE_SYNCHRONOUS_FULL,
        )


# -- write-ahead -----------------------------------------------------------------------------


def test_a_created_intent_is_already_pending_with_attempt_one_started_for_other_readers(
    journal_path: Path,
) -> None:
    with payonce.journal.SQLiteJournal(journal_path) as journal:
        store = store_of(journal)
        claim = store.claim(draft_for(7), owner="worker-1", now=1000.0, lease_seconds=30)
        assert claim.kind is ClaimKind.CREATED
        assert claim.attempt_number == 1

        # Another connection, as a crashed process's successor would see the file.
        assert read_rows(
            journal_path,
            "SELECT state, reference, lease_owner, first_sent_at FROM intents WHERE key = ?",
            ("key-00007",),
        ) == [("pending", "order-00007", "worker-1", 1000.0)]
        assert read_rows(
            journal_path,
            "SELECT number, started_at, ended_at FROM attempts WHERE key = ?",
            ("key-00007",),
        ) == [(1, 1000.0, None)]

        # And a second payonce journal on the same file.
        with payonce.journal.SQLiteJournal(journal_path) as other:
            record = other.get("key-00007")
            assert record is not None
            assert record.state is payonce.IntentState.PENDING
            assert [(a.number, a.in_flight) for a in other.attempts("key-00007")] == [(1, True)]


class JournalWitness(httpx.HTTPTransport):
    """A real HTTP transport that reads the journal, from its own connection, as each
    request leaves: what it sees is what a crash at that instant would leave behind."""

    def __init__(self, journal_path: Path) -> None:
        super().__init__()
        self.journal_path = journal_path
        self.seen: list[tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        intent = read_rows(self.journal_path, "SELECT state FROM intents WHERE key = ?", (key,))
        attempts = read_rows(
            self.journal_path,
            "SELECT number, ended_at IS NULL FROM attempts WHERE key = ? ORDER BY number",
            (key,),
        )
        self.seen.append((key, intent, attempts))
        return super().handle_request(request)


def test_every_attempt_is_journaled_before_its_request_leaves(
    sandbox: SandboxServer, journal_path: Path
) -> None:
    witness = JournalWitness(journal_path)
    sandbox.script(["fail_before"])  # a 503 first, so there is a second attempt to watch
    with sandbox_client(sandbox, journal_path, transport=witness) as client:
        response = client.post("/v1/payments", json=PAYMENT, reference="order-wa")
    assert response.status_code == 201
    key = response.json()["idempotency_key"]

    assert witness.seen == [
        (key, [("pending",)], [(1, True)]),
        (key, [("pending",)], [(1, False), (2, True)]),
    ]


# -- journals payonce must refuse, untouched -------------------------------------------------


def _damaged_page(path: Path) -> None:
    """A real journal of ~40 pages whose fullest table leaf page is overwritten mid-page."""
    write_real_journal(path, intents=200)
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    assert len(data) // page_size > 10, "the journal must span several pages"

    def cells(page: int) -> int:
        header = page * page_size + (100 if page == 0 else 0)
        is_table_leaf = data[header] == 0x0D
        return int.from_bytes(data[header + 3 : header + 5], "big") if is_table_leaf else -1

    page = max(range(1, len(data) // page_size), key=cells)
    assert cells(page) > 5
    start = page * page_size
    data[start + page_size // 4 : start + 3 * page_size // 4] = b"\xa5" * (page_size // 2)
    path.write_bytes(bytes(data))


def _truncated(path: Path) -> None:
    write_real_journal(path, intents=200)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(7).randbytes(8192))


def _text_file(path: Path) -> None:
    path.write_text("payments to make on monday:\n- cmd_9182 42.00 EUR\n")


def _foreign_database(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER, total REAL)")
        db.execute("INSERT INTO customers (name) VALUES ('Ada'), ('Grace')")


def _newer_schema(path: Path) -> None:
    write_real_journal(path, intents=3)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE payonce_meta SET value = '99' WHERE name = 'schema_version'")


def _missing_directory(path: Path) -> None:
    pass  # the journal path is under a directory that does not exist


UNUSABLE = [
    pytest.param(_damaged_page, "journal.db", r"restore it from a backup", id="damaged-page"),
    pytest.param(_truncated, "journal.db", r"restore it from a backup", id="truncated"),
    pytest.param(_random_bytes, "journal.db", r"move it away", id="random-bytes"),
    pytest.param(_text_file, "journal.db", r"move it away", id="text-file"),
    pytest.param(_foreign_database, "journal.db", r"choose another journal path", id="foreign-db"),
    pytest.param(_newer_schema, "journal.db", r"schema 99.*upgrade payonce", id="newer-schema"),
    pytest.param(_missing_directory, "no-such-dir/journal.db", r"create it", id="missing-dir"),
]


@pytest.mark.parametrize(("make", "name", "hint"), UNUSABLE)
def test_an_unusable_journal_raises_journal_error_and_is_left_exactly_as_found(
    tmp_path: Path, make: Callable[[Path], None], name: str, hint: str
) -> None:
    path = tmp_path / "journals" / name
    (tmp_path / "journals").mkdir()
    make(path)
    before = snapshot(tmp_path / "journals")

    with pytest.raises(payonce.JournalError, match=hint) as caught:
        payonce.journal.SQLiteJournal(path)

    assert str(path) in str(caught.value)
    assert caught.value.location == str(path)
    assert not isinstance(caught.value, payonce.JournalBusy)
    assert "Retry later" not in str(caught.value), "damage does not go away by waiting"
    # Same bytes, no -wal/-shm/-journal left behind, no directory or file created.
    assert snapshot(tmp_path / "journals") == before


@pytest.mark.parametrize(("make", "name", "hint"), UNUSABLE)
def test_a_client_on_an_unusable_journal_sends_nothing(
    tmp_path: Path,
    sandbox: SandboxServer,
    make: Callable[[Path], None],
    name: str,
    hint: str,
) -> None:
    path = tmp_path / "journals" / name
    (tmp_path / "journals").mkdir()
    make(path)
    before = snapshot(tmp_path / "journals")

    with pytest.raises(payonce.JournalError, match=hint) as caught:
        sandbox_client(sandbox, path)

    assert str(path) in str(caught.value)
    assert sandbox.store.total_executions() == 0
    assert snapshot(tmp_path / "journals") == before


def test_a_journal_directory_from_the_environment_is_not_created_either(
    tmp_path: Path, sandbox: SandboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the built-in default location is created on demand; a configured one is a typo."""
    path = tmp_path / "typo-dir" / "journal.db"
    monkeypatch.setenv("PAYONCE_JOURNAL", str(path))
    with pytest.raises(payonce.JournalError, match="create it") as caught:
        sandbox_client(sandbox, None)
    assert str(path) in str(caught.value)
    assert not path.parent.exists()
    assert sandbox.store.total_executions() == 0


# -- a journal written by schema version 1 ---------------------------------------------------

V1_SUCCEEDED_KEY = "01JGFJJZ0000000000000000A1"
V1_PENDING_KEY = "01JGFJJZ0000000000000000B2"
V1_RESPONSE_BODY = (
    b'{"id":"pay_v1fixture00000000000001","object":"payment","account":"acct_demo",'
    b'"amount":4200,"currency":"eur","reference":null,"status":"succeeded",'
    b'"description":"caf\xc3\xa9 \xe2\x82\xac","metadata":{}}\n'
)


@pytest.fixture
def v1_journal(journal_path: Path) -> Path:
    """A journal file built by running tests/data/journal_v1.sql with sqlite3."""
    script = (DATA / "journal_v1.sql").read_text(encoding="utf-8")
    with contextlib.closing(sqlite3.connect(journal_path)) as db:
        db.executescript(script)
    return journal_path


def _schema_of(path: Path) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        objects = db.execute(
            "SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            " ORDER BY type, name"
        ).fetchall()
        tables = [name for kind, name, _ in objects if kind == "table"]
        columns = {t: db.execute(f"PRAGMA table_info({t})").fetchall() for t in tables}
    return {"objects": objects, "columns": columns}


def test_a_version_1_journal_migrates_to_the_current_schema_on_open(
    v1_journal: Path, tmp_path: Path
) -> None:
    assert read_rows(v1_journal, "SELECT value FROM payonce_meta WHERE name='schema_version'") == [
        ("1",)
    ]
    payonce.journal.SQLiteJournal(v1_journal).close()

    meta = dict(read_rows(v1_journal, "SELECT name, value FROM payonce_meta"))
    assert meta["application"] == "payonce"
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert meta["migrated_by"] == payonce.__version__

    # Migrated, it has exactly the tables, columns and indexes of a journal made today.
    fresh = tmp_path / "fresh.db"
    payonce.journal.SQLiteJournal(fresh).close()
    assert _schema_of(v1_journal) == _schema_of(fresh)

    # Opening it again is a no-op: nothing migrates twice, no row is lost.
    payonce.journal.SQLiteJournal(v1_journal).close()
    assert read_rows(v1_journal, "SELECT count(*) FROM intents") == [(2,)]
    assert read_rows(v1_journal, "SELECT count(*) FROM attempts") == [(3,)]


def test_rows_written_by_version_1_read_back_intact(v1_journal: Path) -> None:
    with payonce.journal.SQLiteJournal(v1_journal) as journal:
        succeeded = journal.get(V1_SUCCEEDED_KEY)
        assert succeeded is not None
        assert succeeded.state is payonce.IntentState.SUCCEEDED
        assert succeeded.reference == "order-v1-0001"
        assert succeeded.scope == "acct_demo POST /v1/payments"
        assert succeeded.body == b'{"amount":4200,"currency":"eur"}'
        assert succeeded.request_headers == (("content-type", "application/json"),)
        assert succeeded.attempt_count == 2
        assert succeeded.unknown_reason is None
        assert succeeded.acknowledged_at is None
        stored = succeeded.response
        assert stored is not None
        assert stored.status == 201
        assert stored.headers == (
            ("content-type", "application/json"),
            ("request-id", "req_v1fixture"),
        )
        assert stored.body == V1_RESPONSE_BODY
        assert stored.body_stored is True
        assert stored.stored_by is None
        assert stored.schema_version == 1
        assert [
            (a.number, a.status_code, a.in_flight) for a in journal.attempts(succeeded.key)
        ] == [
            (1, 503, False),
            (2, 201, False),
        ]

        pending = journal.get(V1_PENDING_KEY)
        assert pending is not None
        assert pending.state is payonce.IntentState.PENDING
        assert pending.response is None
        assert [(a.number, a.in_flight, a.ambiguous) for a in journal.attempts(pending.key)] == [
            (1, True, None)
        ]
        assert [r.key for r in journal.list_intents(states=["pending"])] == [V1_PENDING_KEY]
        assert [r.key for r in journal.find("order-v1-0001")] == [V1_SUCCEEDED_KEY]


class CountingTransport(httpx.HTTPTransport):
    """A real HTTP transport that counts what it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return super().handle_request(request)


def test_a_client_replays_a_version_1_stored_response_byte_for_byte_without_the_network(
    v1_journal: Path, sandbox: SandboxServer
) -> None:
    # As if that old payonce had talked to this very sandbox: a wrongful resend would
    # reach it and be counted.
    with contextlib.closing(sqlite3.connect(v1_journal)) as db, db:
        db.execute("UPDATE intents SET url = ?", (f"{sandbox.url}/v1/payments",))
    transport = CountingTransport()

    with sandbox_client(sandbox, v1_journal, transport=transport) as client:
        response = client.post("/v1/payments", json=PAYMENT, reference="order-v1-0001")

    info = payonce.response_info(response)
    assert info is not None
    assert info.replayed is True
    assert info.key == V1_SUCCEEDED_KEY
    assert info.attempts == 2
    assert response.status_code == 201
    assert response.content == V1_RESPONSE_BODY
    assert response.json()["description"] == "café €"
    assert response.headers["request-id"] == "req_v1fixture"
    assert transport.sent == []
    assert sandbox.store.total_executions() == 0


# -- a journal held locked by another process ------------------------------------------------

_LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
db.close()
"""


@contextlib.contextmanager
def held_exclusively(path: Path) -> Iterator[None]:
    """Another process holds the journal with BEGIN EXCLUSIVE until the block ends."""
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None
        assert locker.stdout.readline() == "locked\n"
        yield
    finally:
        assert locker.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            locker.stdin.write("go\n")
            locker.stdin.close()
        try:
            locker.wait(timeout=30)
        finally:
            if locker.poll() is None:
                locker.kill()
                locker.wait()
            if locker.stdout is not None:
                locker.stdout.close()
    assert locker.returncode == 0


def test_a_post_on_a_journal_locked_by_another_process_raises_busy_and_sends_nothing(
    sandbox: SandboxServer, journal_path: Path
) -> None:
    journal = payonce.journal.SQLiteJournal(journal_path, busy_timeout=0.2)
    with sandbox_client(sandbox, journal) as client:
        with held_exclusively(journal_path), pytest.raises(payonce.JournalBusy) as caught:
            client.post("/v1/payments", json=PAYMENT, reference="order-locked")
        assert str(journal_path) in str(caught.value)
        assert "nothing was sent. Retry later" in str(caught.value)
        assert sandbox.store.total_executions() == 0
        assert journal.list_intents() == []

        # The lock gone, the same call goes through once.
        response = client.post("/v1/payments", json=PAYMENT, reference="order-locked")
        assert response.status_code == 201
    journal.close()
    assert sandbox.store.total_executions() == 1


def test_a_pending_intent_is_unchanged_by_a_post_that_found_the_journal_locked(
    sandbox: SandboxServer, journal_path: Path
) -> None:
    journal = payonce.journal.SQLiteJournal(journal_path, busy_timeout=0.2)
    with sandbox_client(sandbox, journal, retry=payonce.RetryPolicy(max_attempts=1)) as client:
        sandbox.script(["rate_limit"])  # a 429: provably not executed, the intent stays pending
        with pytest.raises(payonce.ProviderUnavailable) as unavailable:
            client.post("/v1/payments", json=PAYMENT, reference="order-pending")
        key = unavailable.value.key
        assert key is not None
        before = (journal.get(key), journal.attempts(key))
        assert before[0] is not None
        assert before[0].state is payonce.IntentState.PENDING

        with held_exclusively(journal_path), pytest.raises(payonce.JournalBusy):
            client.post("/v1/payments", json=PAYMENT, reference="order-pending")

        assert (journal.get(key), journal.attempts(key)) == before
        assert len(journal.list_intents()) == 1
        assert sandbox.store.total_executions() == 0
    journal.close()


def test_opening_a_journal_another_process_holds_locked_raises_busy_and_changes_nothing(
    tmp_path: Path, sandbox: SandboxServer
) -> None:
    directory = tmp_path / "journals"
    directory.mkdir()
    path = directory / "journal.db"
    write_real_journal(path, intents=3)
    before = snapshot(directory)

    with held_exclusively(path):
        with pytest.raises(payonce.JournalBusy) as caught:
            payonce.journal.SQLiteJournal(path, busy_timeout=0.2)
        assert str(path) in str(caught.value)
        with pytest.raises(payonce.JournalBusy):
            payonce.open_journal(path, busy_timeout=0.2)

    assert snapshot(directory) == before
    assert sandbox.store.total_executions() == 0
    with payonce.journal.SQLiteJournal(path) as journal:
        assert len(journal.list_intents()) == 3


def test_a_journal_locked_right_after_the_request_left_does_not_say_nothing_was_sent(
    sandbox: SandboxServer, journal_path: Path
) -> None:
    """The provider executed the payment, then the journal could not record its answer.

    The intent stays pending with its attempt in flight, and a later call settles it
    without a second execution; but the error must not tell the caller "nothing was
    sent": that is exactly the belief that makes a caller retry under a new reference.
    """
    later = contextlib.ExitStack()

    class LockedAfterSending(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            response.read()
            later.enter_context(held_exclusively(journal_path))
            return response

    now = [time.time()]  # this host's clock, as the provider's (which its Date tells)
    journal = payonce.journal.SQLiteJournal(journal_path, busy_timeout=0.2)
    try:
        with (
            sandbox_client(
                sandbox, journal, transport=LockedAfterSending(), clock=lambda: now[0]
            ) as client,
            later,
            pytest.raises(payonce.JournalBusy) as caught,
        ):
            client.post("/v1/payments", json=PAYMENT, reference="order-late-lock")
        assert sandbox.store.total_executions() == 1

        (record,) = journal.list_intents()
        assert record.state is payonce.IntentState.PENDING
        assert [a.in_flight for a in journal.attempts(record.key)] == [True]

        now[0] += 3600  # past the dead worker's lease, well inside the key's lifetime
        with sandbox_client(sandbox, journal, clock=lambda: now[0]) as client:
            again = client.post("/v1/payments", json=PAYMENT, reference="order-late-lock")
        assert again.status_code == 201
        assert sandbox.store.total_executions() == 1
    finally:
        journal.close()

    message = str(caught.value)
    assert str(journal_path) in message
    assert "nothing was sent" not in message, message


def test_a_journal_write_failing_right_after_the_request_left_says_it_may_have_executed(
    sandbox: SandboxServer, journal_path: Path
) -> None:
    """A full disk or an I/O error while recording the answer: the payment ran, so the
    error must say so, in words and in ``may_have_executed``."""
    journal = payonce.journal.SQLiteJournal(journal_path, group_commit=False)

    class UnwritableAfterSending(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            response.read()
            # From now on every write of this connection fails, as on a full disk.
            journal._engine.conn.execute("PRAGMA query_only = 1")
            return response

    now = [time.time()]  # this host's clock, as the provider's (which its Date tells)
    try:
        with (
            sandbox_client(
                sandbox, journal, transport=UnwritableAfterSending(), clock=lambda: now[0]
            ) as client,
            pytest.raises(payonce.JournalError) as caught,
        ):
            client.post("/v1/payments", json=PAYMENT, reference="order-disk")
        assert caught.value.may_have_executed is True
        assert "may already have reached the provider" in str(caught.value)
        assert "nothing was sent" not in str(caught.value)
        assert sandbox.store.total_executions() == 1

        journal._engine.conn.execute("PRAGMA query_only = 0")  # the disk has room again
        # At once: the failed call has ended, so the lease it could not release holds
        # this process's next call back no longer (no wait for it to expire).
        with sandbox_client(sandbox, journal, clock=lambda: now[0], in_flight_wait=1) as client:
            again = client.post("/v1/payments", json=PAYMENT, reference="order-disk")
        assert again.status_code == 201
        assert sandbox.store.total_executions() == 1, "settled under the same key"
    finally:
        journal.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem of 2 MB (tmpfs) of the test's own, to fill."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        pytest.skip("no mount command here to mount a 2 MB tmpfs to fill")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 2 MB tmpfs to fill (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


class FillsTheDiskAsItIsSent(payonce.Hooks):
    """Fills the journal's filesystem as the intent of ``reference`` is sent: its answer
    comes back to a full disk, and the settle cannot be written."""

    def __init__(self, disk: Path, reference: str) -> None:
        self.filler = disk / "filler"
        self.reference = reference
        self.filled = False

    def attempt_started(self, event: payonce.hooks.AttemptStarted) -> None:
        if event.reference != self.reference or self.filled:
            return
        self.filled = True
        with self.filler.open("ab", buffering=0) as filler, contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 65536)

    def make_room(self) -> None:
        self.filler.unlink()


def _pending_on_a_full_disk(error: payonce.JournalError, journal: Path) -> tuple[Any, ...]:
    """What the failed call left: its error says to call again, and its intent is pending
    under the key the provider executed."""
    assert error.may_have_executed is True
    assert "calling again with the same reference once the journal is free settles it" in str(error)
    assert "disk is full" in str(error)
    (row,) = read_rows(journal, "SELECT key, state FROM intents WHERE reference = 'order-9'")
    assert row[1] == "pending"
    return row


def test_an_answer_a_full_disk_kept_out_is_settled_by_calling_again_at_once(
    sandbox: SandboxServer, small_disk: Path
) -> None:
    journal = small_disk / "journal.db"
    disk = FillsTheDiskAsItIsSent(small_disk, "order-9")
    with sandbox_client(sandbox, journal, hooks=disk, in_flight_wait=2) as client:
        with pytest.raises(payonce.JournalError) as caught:
            client.post("/v1/payments", json=PAYMENT, reference="order-9")
        key, _ = _pending_on_a_full_disk(caught.value, journal)
        assert sandbox.store.executions() == {key: 1}

        disk.make_room()
        # The same process calls again, as the error advised: its own ended call is not
        # "another worker" sending it, for a whole lease.
        again = client.post("/v1/payments", json=PAYMENT, reference="order-9")

    assert again.status_code == 201
    assert again.json()["idempotency_key"] == key
    assert sandbox.store.executions() == {key: 1}, "settled under the same key"
    assert read_rows(journal, "SELECT key, state FROM intents") == [(key, "succeeded")]


@pytest.mark.anyio
async def test_an_async_answer_a_full_disk_kept_out_is_settled_by_calling_again_at_once(
    sandbox: SandboxServer, small_disk: Path, make_async_client: Callable[..., payonce.AsyncClient]
) -> None:
    journal = small_disk / "journal.db"
    disk = FillsTheDiskAsItIsSent(small_disk, "order-9")
    async with make_async_client(journal=journal, hooks=disk, in_flight_wait=2) as client:
        with pytest.raises(payonce.JournalError) as caught:
            await client.post("/v1/payments", json=PAYMENT, reference="order-9")
        key, _ = _pending_on_a_full_disk(caught.value, journal)

        disk.make_room()
        again = await client.post("/v1/payments", json=PAYMENT, reference="order-9")

    assert again.status_code == 201
    assert sandbox.store.executions() == {key: 1}, "settled under the same key"
    assert read_rows(journal, "SELECT key, state FROM intents") == [(key, "succeeded")]


def _contexts(error: BaseException) -> list[BaseException]:
    """The exceptions a traceback of ``error`` shows before it, nearest first."""
    chain: list[BaseException] = []
    while error.__context__ is not None and error.__context__ not in chain:
        error = error.__context__
        chain.append(error)
    return chain


def test_a_journal_that_cannot_record_a_lost_answer_names_the_loss_as_its_context(
    sandbox: SandboxServer, small_disk: Path
) -> None:
    # The connection drops after the provider executed, and the disk fills as it does: the
    # attempt's end cannot be journaled. The caller's traceback shows both, in order.
    journal = small_disk / "journal.db"
    disk = FillsTheDiskAsItIsSent(small_disk, "order-9")
    sandbox.script(["drop_after"])
    with (
        sandbox_client(sandbox, journal, hooks=disk) as client,
        pytest.raises(payonce.JournalError) as caught,
    ):
        client.post("/v1/payments", json=PAYMENT, reference="order-9")
    assert any(isinstance(e, httpx.TransportError) for e in _contexts(caught.value))
    key, _ = _pending_on_a_full_disk(caught.value, journal)
    assert sandbox.store.executions() == {key: 1}


@pytest.mark.anyio
async def test_an_async_journal_that_cannot_record_a_lost_answer_names_the_loss(
    sandbox: SandboxServer, small_disk: Path, make_async_client: Callable[..., payonce.AsyncClient]
) -> None:
    journal = small_disk / "journal.db"
    disk = FillsTheDiskAsItIsSent(small_disk, "order-9")
    sandbox.script(["drop_after"])
    async with make_async_client(journal=journal, hooks=disk) as client:
        with pytest.raises(payonce.JournalError) as caught:
            await client.post("/v1/payments", json=PAYMENT, reference="order-9")
    assert any(isinstance(e, httpx.TransportError) for e in _contexts(caught.value))
    key, _ = _pending_on_a_full_disk(caught.value, journal)
    assert sandbox.store.executions() == {key: 1}


def test_a_journal_error_before_anything_was_sent_says_nothing_executed(
    sandbox: SandboxServer, journal_path: Path
) -> None:
    journal = payonce.journal.SQLiteJournal(journal_path, group_commit=False)
    journal._engine.conn.execute("PRAGMA query_only = 1")
    try:
        with (
            sandbox_client(sandbox, journal) as client,
            pytest.raises(payonce.JournalError) as caught,
        ):
            client.post("/v1/payments", json=PAYMENT, reference="order-early")
        assert caught.value.may_have_executed is False
        assert "nothing was sent" in str(caught.value)
        assert sandbox.store.total_executions() == 0
    finally:
        journal.close()


# -- a journal removed or replaced under a running process ----------------------------------


@contextlib.contextmanager
def a_worker_that_paid_order_0(sandbox: SandboxServer, volume: Path) -> Iterator[payonce.Client]:
    """A running client whose journal is ``volume/journal.db``, order-0 paid and settled."""
    volume.mkdir()
    with sandbox_client(sandbox, volume / "journal.db") as client:
        client.post("/v1/payments", json=PAYMENT, reference="order-0")
        yield client


def emptied(volume: Path) -> None:
    """What a clean-up, or a volume recreated by a deploy, leaves: no file at all."""
    for entry in volume.iterdir():
        entry.unlink()


def test_a_journal_removed_under_a_running_client_sends_nothing_and_keeps_what_it_held(
    sandbox: SandboxServer, tmp_path: Path
) -> None:
    """An operator "cleans up" the volume while the service runs: the client must not go
    on journaling into a file no one else can see, nor pay an order the next process will
    not know it paid."""
    volume = tmp_path / "volume"
    path = volume / "journal.db"
    with a_worker_that_paid_order_0(sandbox, volume) as client:
        emptied(volume)

        with pytest.raises(payonce.JournalError) as caught:
            client.post("/v1/payments", json={**PAYMENT, "amount": 4300}, reference="order-1")

        message = str(caught.value)
        assert f"removed or replaced under this process: {path} no longer exists" in message
        assert "nothing was sent" in message
        assert "Put the journal back at that path" in message
        assert "restart the process" in message
        assert caught.value.may_have_executed is False
        assert not isinstance(caught.value, payonce.JournalBusy)
        assert sandbox.store.total_executions() == 1, "order-1 never left"
        # The removed file still holds what it held, and this process can copy it out.
        rescued = client.journal.backup(tmp_path / "rescued.db")
        assert list(volume.iterdir()) == [], "nothing was made up at the path"
    assert read_rows(rescued, "SELECT reference, state FROM intents") == [("order-0", "succeeded")]


def test_a_journal_replaced_under_a_running_client_is_left_to_the_new_file_s_owners(
    sandbox: SandboxServer, tmp_path: Path
) -> None:
    """A deploy recreates the volume: a new journal at the path, written by a new worker,
    while an old worker still runs. The old one refuses to send, and writes nothing into
    either file."""
    volume = tmp_path / "volume"
    path = volume / "journal.db"
    with a_worker_that_paid_order_0(sandbox, volume) as old_worker:
        emptied(volume)
        with sandbox_client(sandbox, path) as new_worker:
            new_worker.post("/v1/payments", json={**PAYMENT, "amount": 4400}, reference="order-2")
        before = snapshot(volume)

        with pytest.raises(payonce.JournalError, match="names another file than the one it"):
            old_worker.post("/v1/payments", json={**PAYMENT, "amount": 4300}, reference="order-1")

        assert sandbox.store.total_executions() == 2, "order-0 and order-2 only"
        assert snapshot(volume) == before
        (order_0,) = old_worker.journal.find("order-0")
        assert order_0.state is payonce.IntentState.SUCCEEDED
    assert read_rows(path, "SELECT reference FROM intents") == [("order-2",)]


class EmptiesTheVolumeAsItIsSent(payonce.Hooks):
    """The volume is cleaned up while the intent's request is on its way."""

    def __init__(self, volume: Path) -> None:
        self.volume = volume

    def attempt_started(self, event: payonce.hooks.AttemptStarted) -> None:
        emptied(self.volume)


def test_an_answer_is_never_recorded_in_a_journal_removed_while_it_was_sent(
    sandbox: SandboxServer, tmp_path: Path
) -> None:
    """The journal goes while the request is out: its answer cannot be journaled where any
    process will find it, so the call says so (the provider may have executed it) instead
    of returning as if the payment were recorded."""
    volume = tmp_path / "volume"
    volume.mkdir()
    hooks = EmptiesTheVolumeAsItIsSent(volume)
    with sandbox_client(sandbox, volume / "journal.db", hooks=hooks) as client:
        with pytest.raises(payonce.JournalError, match="removed or replaced") as caught:
            client.post("/v1/payments", json=PAYMENT, reference="order-gone")
        assert caught.value.may_have_executed is True
        rescued = client.journal.backup(tmp_path / "rescued.db")
    assert sandbox.store.total_executions() == 1
    assert read_rows(rescued, "SELECT reference, state FROM intents") == [("order-gone", "pending")]


# -- a damaged row --------------------------------------------------------------------------


def test_a_damaged_row_is_reported_as_damage_to_restore_not_as_a_failed_operation(
    sandbox: SandboxServer, journal_path: Path
) -> None:
    """A page overwritten with garbage can leave a row whose text no longer decodes: the
    error must send the operator to the backups, as any other damage does."""
    with sandbox_client(sandbox, journal_path) as client:
        client.post("/v1/payments", json=PAYMENT, reference="order-0")
    with contextlib.closing(sqlite3.connect(journal_path)) as db, db:
        db.execute("UPDATE intents SET url = CAST(X'687474703a2f2fa5ff80c3' AS TEXT)")
    held = "SELECT key, state, hex(url), (SELECT count(*) FROM attempts) FROM intents"
    before = read_rows(journal_path, held)

    with (
        sandbox_client(sandbox, journal_path) as client,
        pytest.raises(payonce.JournalError) as caught,
    ):
        client.post("/v1/payments", json=PAYMENT, reference="order-0")

    message = str(caught.value)
    assert "it is damaged or not a payonce journal: restore it from a backup" in message
    assert "column 'url'" in message
    assert "journal operation failed" not in message
    assert "nothing was sent" in message
    assert "\ufffd" not in message, "the garbage itself is not quoted"
    assert sandbox.store.total_executions() == 1
    assert read_rows(journal_path, held) == before


# -- concurrency -----------------------------------------------------------------------------


def test_four_threads_sending_twenty_five_intents_each_execute_each_exactly_once(
    sandbox: SandboxServer, journal_path: Path
) -> None:
    start = threading.Barrier(4)

    def worker(thread: int) -> list[int]:
        start.wait()
        statuses = []
        for n in range(25):
            response = client.post(
                "/v1/payments",
                json={"amount": 100 + n, "currency": "eur"},
                reference=f"order-t{thread}-{n:02d}",
            )
            statuses.append(response.status_code)
        return statuses

    with sandbox_client(sandbox, journal_path) as client:
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(worker, range(4)))
        intents = client.journal.list_intents()

    assert [status for statuses in results for status in statuses] == [201] * 100
    assert sandbox.store.total_executions() == 100
    assert len(intents) == 100
    assert {i.state for i in intents} == {payonce.IntentState.SUCCEEDED}
    assert {i.reference for i in intents} == {
        f"order-t{t}-{n:02d}" for t in range(4) for n in range(25)
    }
    assert sandbox.store.executions() == {i.key: 1 for i in intents}


# -- several processes creating the same journal -------------------------------------------


def _open_when(path: Path, start: float) -> str:
    """In a forked child: open the journal at ``start`` (a wall-clock instant)."""
    while time.time() < start:
        pass
    try:
        payonce.open_journal(path).close()
    except payonce.JournalError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "opened"


@pytest.mark.slow
def test_workers_starting_together_on_a_new_journal_all_open_it(tmp_path: Path) -> None:
    """Like `uvicorn --workers 4` on a first start: the file does not exist yet, and each
    worker's switch to WAL mode meets the others'. SQLite answers "locked" to that switch
    without waiting; every worker must still open the journal, and it must be whole."""
    context = multiprocessing.get_context("fork")
    outcomes: list[str] = []
    for round_ in range(20):
        path = tmp_path / f"journal-{round_}.db"
        start = time.time() + 0.1
        with context.Pool(8) as workers:
            outcomes += workers.starmap(_open_when, [(path, start)] * 8)
        with payonce.journal.SQLiteJournal(path) as journal:
            assert journal.check().ok
    assert set(outcomes) == {"opened"}, [o for o in outcomes if o != "opened"][:3]


def test_a_journal_on_a_read_only_filesystem_says_so_and_sends_nothing(
    sandbox: SandboxServer, small_disk: Path
) -> None:
    journal = small_disk / "journal.db"
    with sandbox_client(sandbox, journal) as client:
        paid = client.post("/v1/payments", json=PAYMENT, reference="order-ro")
    held = read_rows(journal, "SELECT key, state FROM intents")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        with (
            pytest.raises(payonce.JournalError, match="read-only filesystem") as caught,
            sandbox_client(sandbox, journal) as client,
        ):
            client.post("/v1/payments", json=PAYMENT, reference="order-ro-2")
        assert "Make it writable" in str(caught.value)
        assert caught.value.may_have_executed is False
        # An operator can still look: the file is read as the fixed file it is.
        listed = run_cli_process(["intents", "list", "--journal", str(journal)])
        assert listed.exit_code == 0, listed.stderr
        assert "order-ro\tsucceeded" in listed.stdout
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert read_rows(journal, "SELECT key, state FROM intents") == held
    assert sandbox.store.executions() == {payonce.response_info(paid).key: 1}  # type: ignore[union-attr]


def test_a_read_only_bind_mount_of_a_journal_still_sees_what_the_service_writes(
    sandbox: SandboxServer, tmp_path: Path
) -> None:
    """A monitoring sidecar mounts the service's journal directory read-only: nothing can
    write through its mount, but the service writes through its own, so the reader must
    not take the file for a fixed one, even when it opened it while the service was down."""
    written, mounted = tmp_path / "service", tmp_path / "sidecar"
    written.mkdir()
    mounted.mkdir()
    with sandbox_client(sandbox, written / "journal.db") as client:
        client.post("/v1/payments", json=PAYMENT, reference="order-b1")
    try:
        bound = subprocess.run(
            ["mount", "--bind", str(written), str(mounted)], capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("no mount command here to bind-mount a directory")
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount a directory (needs root): {bound.stderr.strip()}")
    try:
        subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(mounted)], check=True, capture_output=True
        )
        # The service is stopped (its WAL checkpointed away) as the sidecar starts watching.
        assert not (written / "journal.db-wal").exists()
        with payonce.open_journal(mounted / "journal.db", read_only=True) as watching:
            assert [r.reference for r in watching.list_intents()] == ["order-b1"]
            with sandbox_client(sandbox, written / "journal.db") as client:
                client.post("/v1/payments", json=PAYMENT, reference="order-b2")
                copy = watching.backup(tmp_path / "copy.db")
                seen = {r.reference for r in watching.list_intents()}
        assert seen == {"order-b1", "order-b2"}
        copied = read_rows(copy, "SELECT reference FROM intents")
        assert sorted(copied) == [("order-b1",), ("order-b2",)], "a backup is no stale copy"
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=True)


def test_a_reconciliation_a_full_disk_cut_short_can_be_run_again_at_once(
    sandbox: SandboxServer, small_disk: Path
) -> None:
    """The disk fills while the status look-up is out: neither its result nor the lease's
    release can be written. The same process reconciles again once there is room: its
    ended look-up is not "another worker" holding the intent for a whole lease."""
    journal = small_disk / "journal.db"
    with sandbox_client(sandbox, journal, retry=payonce.RetryPolicy(max_attempts=1)) as client:
        sandbox.script(["drop_after"])
        with pytest.raises(payonce.OutcomeUnknown) as unknown:
            client.post("/v1/payments", json=PAYMENT, reference="order-rc")
        key = unknown.value.key
        filler = small_disk / "filler"

        def fill(request: httpx.Request) -> None:
            if request.method == "GET":
                with filler.open("ab", buffering=0) as disk, contextlib.suppress(OSError):
                    while True:
                        disk.write(b"\0" * 65536)

        client._http.event_hooks["request"].append(fill)
        (cut_short,) = client.reconcile(key)
        client._http.event_hooks["request"].remove(fill)
        filler.unlink()
        assert cut_short.outcome == "error"
        assert "disk is full" in cut_short.detail
        assert "reconcile it again" in cut_short.detail
        assert "stays pending" not in cut_short.detail, "a look-up is not a send"

        (again,) = client.reconcile(key)

    assert (again.outcome, again.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert sandbox.store.executions() == {key: 1}
