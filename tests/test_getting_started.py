"""docs/getting-started.md, run as a reader would: its ``pay()`` against the sandbox.

The page's code is read from the page itself, so what it shows is what is tested: a
decline is acknowledged once recorded, and the fault script it gives for ``OutcomeUnknown``
makes one 503 per attempt of the default retry policy, as many as the text says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

import payonce
from helpers.payments import FAST_RETRY
from payonce.sandbox import SandboxServer

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

Pay = Callable[[payonce.Client, str, int], None]


def _section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


@pytest.fixture
def pay() -> Pay:
    """The ``pay()`` of the page's "Handling each error"."""
    (code,) = re.findall(r"```python\n(.*?)```", _section("Handling each error"), re.DOTALL)[:1]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(PAGE), "exec"), namespace)
    function: Pay = namespace["pay"]
    return function


@pytest.fixture
def default_attempts_client(make_client: Callable[..., payonce.Client]) -> payonce.Client:
    """As many attempts as the default policy makes, without its waits between them."""
    default = payonce.RetryPolicy()
    return make_client(retry=attrs.evolve(FAST_RETRY, max_attempts=default.max_attempts))


def test_a_declined_payment_is_recorded_then_acknowledged_and_replayed_when_asked_again(
    pay: Pay, client: payonce.Client, sandbox: SandboxServer, capsys: pytest.CaptureFixture[str]
) -> None:
    pay(client, "1003", 40200)
    pay(client, "1003", 40200)

    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" {")[0] for line in printed] == ["declined: HTTP 402"] * 2
    (intent,) = client.journal.find("order-1003")
    assert intent.state is payonce.IntentState.FAILED
    assert intent.attempt_count == 1  # the second call was a replay: the card was tried once
    assert intent.acknowledged_at is not None
    assert client.unacknowledged() == []
    assert sum(sandbox.store.executions().values()) == 1


def test_the_pages_fault_script_makes_every_default_attempt_fail_then_reconcile_and_resume_pay_once(
    pay: Pay,
    default_attempts_client: payonce.Client,
    sandbox: SandboxServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = default_attempts_client
    section = _section("Handling each error")
    (script,) = re.findall(r"curl -X POST localhost:8765/_sandbox/script .*? -d '(.*?)'", section)
    faults = json.loads(script)["faults"]
    attempts = payonce.RetryPolicy().max_attempts
    assert faults == ["fail_before"] * attempts
    assert f"a 503 for each of the {attempts} attempts of the default retry policy" in section
    assert f"The {NUMBER_WORDS[attempts]} 503s came before the provider executed" in section

    httpx.post(f"{sandbox.url}/_sandbox/script", json={"faults": faults}).raise_for_status()
    pay(client, "1004", 500)

    assert capsys.readouterr().out.startswith("unknown (retries exhausted; last failure: HTTP 503)")
    (intent,) = client.journal.find("order-1004")
    assert intent.state is payonce.IntentState.UNKNOWN
    assert [attempt.status_code for attempt in client.journal.attempts(intent.key)] == [
        503
    ] * attempts

    (reconciled,) = client.reconcile("order-1004")
    assert (reconciled.before, reconciled.after) == ("unknown", "pending")
    (resumed,) = client.resume()
    assert resumed.state == "succeeded"
    assert sandbox.store.executions() == {intent.key: 1}
