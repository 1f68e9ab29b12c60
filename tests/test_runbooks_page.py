"""docs/runbooks.md, each setup's runbook run as the operator runs it.

Each test builds the situation its runbook starts from for real: a shop process SIGKILLed
after its request left and a provider answering 503 to every attempt (a plain client); the
checkout service example under uvicorn, paying through stripe-python, whose create met
Stripe's 503s (an SDK integration); payments enqueued in a PostgreSQL transaction while the
worker was down (the outbox). Then it runs the runbook's ``$`` lines literally, in a shell
with the page's exports, in the directory the service ran in, checking each line's output
and exit status against the page (see helpers/pages.py), and checks the end state: each
order paid once at the sandbox, every intent settled.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import payonce
from helpers.pages import Reader, sections
from helpers.payments import free_port
from helpers.processes import python_env
from helpers.services import CheckoutService, wait_for
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxConfig, SandboxServer

PAGE = Path(__file__).resolve().parents[1] / "docs" / "runbooks.md"

SETUPS = ("A plain client", "An SDK integration", "The outbox and its worker")

SHOP = """\
import sys
import time

import payonce

client = payonce.Client(base_url=sys.argv[1], provider="sandbox", account="acct_demo",
                        api_key="sk_test_payonce", journal="journal.db")
with client.intent(f"order-{sys.argv[2]}") as op:
    op.post("/v1/payments", json={"amount": 4200, "currency": "eur"})
"""
"""A shop paying one order with a plain client, as the plain client's runbook has it."""


def _port(server: SandboxServer) -> str:
    return server.url.rsplit(":", 1)[1]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The service's directory, where the operator runs the commands."""
    home = tmp_path / "service"
    home.mkdir()
    return home


@contextlib.contextmanager
def _operator(home: Path, server: SandboxServer) -> Iterator[Reader]:
    reader = Reader(PAGE, home, _port(server))
    try:
        yield reader
    finally:
        reader.close()


def _run_the_runbook(reader: Reader, setup: str, blocks: slice = slice(None)) -> None:
    """The setup's blocks (those ``blocks`` picks), in order."""
    assert sections(PAGE)[setup], f"no runbook under {setup!r}"
    for block in sections(PAGE)[setup][blocks]:
        assert block.language == "console", f"{setup}: a {block.language} block is not run"
        reader.console(block.code)


def _acknowledged_within(journal: Path, *, seconds: float) -> None:
    """Until the journal holds no unacknowledged intent; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        with payonce.open_journal(journal, read_only=True) as reading:
            if not reading.unacknowledged():
                return
        assert time.monotonic() < deadline, "the block's acknowledgement was never written"
        time.sleep(0.05)


def test_every_setup_has_its_runbook_and_the_page_is_in_the_site() -> None:
    runbooks = sections(PAGE)
    for setup in SETUPS:
        commands = "".join(block.code for block in runbooks[setup])
        for step in ("payonce intents list", "payonce intents show", "PAYONCE_JOURNAL="):
            assert step in commands, (setup, step)
    assert "runbooks.md" in (PAGE.parents[1] / "mkdocs.yml").read_text()


@pytest.mark.slow
def test_the_plain_client_s_runbook_pays_a_crashed_and_an_unknown_order_once(
    home: Path, closing: contextlib.ExitStack
) -> None:
    server = closing.enter_context(SandboxServer(SandboxConfig()))
    (home / "shop.py").write_text(SHOP)

    def shop(order: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "shop.py", server.url, order],
            cwd=home,
            env=python_env(**env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    killed = shop("3001", PAYONCE_CRASH_AT="after_send:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # Its request left before the kill; on a loaded machine it may reach the provider only
    # now, and must not take a fault scripted for the next order.
    wait_for(lambda: server.store.total_executions() == 1, "order-3001 to reach the provider")
    server.script(["fail_before"] * 5)
    unknown = shop("3002")
    assert "OutcomeUnknown" in unknown.stderr, unknown.stderr
    assert server.wait_idle()
    assert server.store.total_executions() == 1  # 3001's, and 3002 executed nothing

    with _operator(home, server) as operator:
        _run_the_runbook(operator, "A plain client")

    assert server.wait_idle()
    assert set(server.store.executions().values()) == {1}
    assert server.store.total_executions() == 2
    with payonce.open_journal(home / "journal.db", read_only=True) as journal:
        states = {r.reference: r.state for r in journal.list_intents()}
        assert journal.unacknowledged() == []
    assert states == {"order-3001": "succeeded", "order-3002": "succeeded"}


@pytest.mark.slow
def test_the_sdk_integration_s_runbook_finishes_an_unknown_create_and_the_block_pays_once(
    home: Path, closing: contextlib.ExitStack
) -> None:
    server = closing.enter_context(SandboxServer(SandboxConfig.like("stripe")))
    service = CheckoutService(home, server.url, free_port())
    closing.callback(service.stop)
    service.start()
    server.script(["fail_before"] * 5)
    answer = service.pay("1001")
    assert answer.status_code == 202, answer.text
    assert answer.json()["state"] == "unknown"
    assert server.store.payment_intents() == []

    with _operator(home, server) as operator:
        operator.substitutions["localhost:8000"] = f"localhost:{service.port}"
        _run_the_runbook(operator, "An SDK integration", slice(-2))
        # Reconciled and resumed: the create is made, and the order is not paid, as the
        # page says: only the block, run again, makes its next request.
        assert server.wait_idle()
        (created,) = server.store.payment_intents()
        assert created["status"] != "succeeded", created
        assert server.store.total_executions() == 1
        _run_the_runbook(operator, "An SDK integration", slice(-2, -1))
        # The block's acknowledgement is written with the service's next journal write, or
        # a second after the block ended: an operator's next command comes after it.
        _acknowledged_within(Path(service.env["PAYONCE_JOURNAL"]), seconds=10)
        _run_the_runbook(operator, "An SDK integration", slice(-1, None))

    assert server.wait_idle()
    (intent,) = server.store.payment_intents()
    assert intent["metadata"]["order"] == "1001"
    assert intent["status"] == "succeeded"
    assert set(server.store.executions().values()) == {1}
    assert server.store.total_executions() == 2  # the create and the confirm, once each
    assert service.order("1001").json()["state"] == "paid"
    assert service.order("1001").json()["payment_intent"] == intent["id"]


PAGE_JOURNAL = "postgresql://payonce@db.internal:5432/shop?schema=payonce"


@pytest.mark.slow
def test_the_outbox_s_runbook_sends_what_was_enqueued_while_the_worker_was_down(
    home: Path, closing: contextlib.ExitStack, postgres_url: str
) -> None:
    server = closing.enter_context(SandboxServer(SandboxConfig()))
    journal = postgres_url + ("&" if "?" in postgres_url else "?") + "schema=payonce"
    client = closing.enter_context(
        payonce.Client(
            base_url=server.url,
            provider="sandbox",
            account=DEFAULT_ACCOUNT,
            api_key=DEFAULT_API_KEY,
            journal=journal,
        )
    )
    with psycopg.connect(postgres_url) as conn, conn.transaction():
        for order in ("order-4001", "order-4002"):
            client.enqueue(
                "POST",
                "/v1/payments",
                reference=order,
                json={"amount": 4200, "currency": "eur"},
                connection=conn,
            )
    assert server.store.total_executions() == 0

    with _operator(home, server) as operator:
        operator.substitutions[PAGE_JOURNAL] = journal
        _run_the_runbook(operator, "The outbox and its worker")

    assert server.wait_idle()
    assert set(server.store.executions().values()) == {1}
    assert server.store.total_executions() == 2
    states = {r.reference: r.state for r in client.journal.list_intents()}
    assert states == {"order-4001": "succeeded", "order-4002": "succeeded"}
