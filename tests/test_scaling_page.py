"""docs/scaling.md's partitioning example, run as written (its servers swapped for the
test's): each client and journal made once, every payment to its account's journal, all of
it closed at shutdown (it once built a client per call, never closed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.payments import PAYMENT
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

pytestmark = pytest.mark.anyio

PAGE = Path(__file__).resolve().parents[1] / "docs" / "scaling.md"


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    [example] = [block for block in blocks if "class Payments" in block]
    return example


async def test_the_partitioning_example_makes_each_client_once_and_closes_everything(
    postgres_url: str, sandbox: SandboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    code = _example()
    for region in ("eu", "us"):
        url = f"postgresql://payonce@journal-{region}.internal/payments?schema=payonce"
        assert url in code
        code = code.replace(url, f"{postgres_url}?schema=scaling_{region}")
    code = code.replace("https://api.example.com", sandbox.url)
    code = code.replace('provider="stripe"', 'provider="sandbox"')
    namespace: dict[str, Any] = {}
    exec(compile(code, str(PAGE), "exec"), namespace)  # the page's own example

    payments = namespace["Payments"]()
    eu = payments.client_for("acct_1001")
    assert payments.client_for("acct_1001") is eu, "made once, not per call"
    us = payments.client_for("acct_2002")
    assert eu.journal is payments.journals["eu"]
    assert us.journal is payments.journals["us"]
    for client in (eu, us, eu):
        response = await client.post("/v1/payments", json=PAYMENT, reference="order-1")
        assert response.status_code == 201
    assert [r.account for r in payments.journals["eu"].list_intents()] == ["acct_1001"]
    assert [r.account for r in payments.journals["us"].list_intents()] == ["acct_2002"]
    assert sandbox.store.total_executions() == 2, "the second call of order-1 replayed"

    await payments.aclose()

    for journal in payments.journals.values():
        with pytest.raises(payonce.JournalError, match="this journal was closed"):
            journal.list_intents()
