"""docs/outbox.md, every fenced block run in order as its reader runs them: the SQL in the
reader's database, the Python in one interpreter session, against the sandbox and a fresh
PostgreSQL database of the test's own. The blocks that cannot run here are named, with why;
a block that is neither run nor named fails the test.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

import payonce
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

PAGE = Path(__file__).resolve().parents[1] / "docs" / "outbox.md"
NOT_RUN = {
    "pip install 'payonce[postgres]'": "installs from PyPI: this test runs the checkout's payonce",
    "stripe_payments = payonce.Client(": "a Stripe client: tests/test_localstripe.py enqueues "
    "the same request and a worker's resume sends it to localstripe",
}
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("query", ["", "?application_name=shop"], ids=["bare", "with-query"])
def test_every_block_of_the_outbox_page_runs(
    postgres_url: str, sandbox: SandboxServer, monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    """Also with a DATABASE_URL that has a query string of its own (``?sslmode=...``): the
    page's journal URL adds its schema to it rather than break it."""
    monkeypatch.setenv("DATABASE_URL", postgres_url + query)
    monkeypatch.setenv("PAYONCE_BASE_URL", sandbox.url)
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    session: dict[str, Any] = {"__name__": "outbox_page"}
    blocks = _FENCE.findall(PAGE.read_text())
    assert len(blocks) >= 6
    try:
        for language, code in blocks:
            if any(code.startswith(line) for line in NOT_RUN):
                continue
            if language == "sql":
                with psycopg.connect(postgres_url, autocommit=True) as conn:
                    conn.execute(code)
            elif language == "python":
                exec(compile(code, f"{PAGE}:{language}", "exec"), session)
            else:
                pytest.fail(f"a {language} block that is neither run nor named:\n{code}")
    finally:
        for client in session.values():
            if isinstance(client, payonce.Client):
                client.close()
        if (engine := session.get("engine")) is not None:
            engine.dispose()

    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(
            "SELECT id, amount, payment_key, status FROM orders ORDER BY id"
        ).fetchall()
        journaled = dict(conn.execute("SELECT reference, state FROM payonce.intents").fetchall())
    assert [row[:2] for row in rows] == [
        ("order-1001", 4200),
        ("order-1002", 1500),
        ("order-1003", 990),
    ]
    assert journaled == {
        "order-1001": "succeeded",
        "order-1002": "pending",
        "order-1003": "pending",
    }
    # Only the order the page resumed was paid, once, under the key stored with the order,
    # and the page's outcome reader recorded it on the order.
    assert sandbox.store.executions() == {rows[0][2]: 1}
    assert [row[3] for row in rows] == ["paid", None, None]
