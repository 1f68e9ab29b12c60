"""docs/observability.md, run: its hooks, its OpenTelemetry set-up and its log formatter.

The code is read from the page itself, so the page shows what these tests run.
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.payments import PAYMENT, MakeClient, make_unknown
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

PAGE = Path(__file__).resolve().parents[1] / "docs" / "observability.md"


def _run_block(containing: str) -> dict[str, Any]:
    (code,) = [
        block
        for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
        if containing in block
    ]
    namespace: dict[str, Any] = {"__name__": "observability_page"}
    exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace


@pytest.fixture
def service_environment(monkeypatch: pytest.MonkeyPatch, journal_path: Path) -> None:
    """What the page's client needs to be built: a key and a journal, from the environment."""
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    monkeypatch.setenv("PAYONCE_JOURNAL", str(journal_path))


@pytest.mark.usefixtures("service_environment")
def test_the_pages_hooks_print_settlements_and_unknown_outcomes(
    make_client: MakeClient, sandbox: SandboxServer, capsys: pytest.CaptureFixture[str]
) -> None:
    page = _run_block("class PaymentMetrics")
    page["client"].close()

    paid = make_client(hooks=page["PaymentMetrics"]()).post(
        "/v1/payments", json=PAYMENT, reference="order-p1"
    )
    lost = make_unknown(
        make_client, sandbox, "order-p2", "drop_after", hooks=page["PaymentMetrics"]()
    )

    printed = capsys.readouterr().out.splitlines()
    assert f"settled {paid.json()['idempotency_key']} order-p1 succeeded 1" in printed
    (unknown,) = [line for line in printed if line.startswith("UNKNOWN")]
    assert unknown.startswith(f"UNKNOWN {lost.key} order-p2 retries exhausted")


@pytest.mark.usefixtures("service_environment")
def test_the_pages_opentelemetry_client_is_built_with_its_hooks() -> None:
    page = _run_block("OpenTelemetryHooks()")
    client = page["client"]
    try:
        assert isinstance(client, payonce.Client)
        assert type(client._core.hooks._hooks[0]).__name__ == "OpenTelemetryHooks"
    finally:
        client.close()


def test_the_pages_formatter_adds_each_records_intent(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    page = _run_block("class IntentFields")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(page["IntentFields"]("%(levelname)s %(message)s"))
    logger = logging.getLogger("payonce")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        paid = make_client().post("/v1/payments", json=PAYMENT, reference="order-p3")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)

    key = paid.json()["idempotency_key"]
    (settled,) = [line for line in stream.getvalue().splitlines() if "succeeded after" in line]
    assert settled.endswith(f"key={key} reference=order-p3 state=succeeded")
