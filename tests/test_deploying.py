"""docs/deploying.md, run: its WSGI module for gunicorn ``--preload`` and its alert counts.

The code is read from the page itself, so the page shows what these tests run.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.payments import PAYMENT, MakeClient, leave_pending, make_unknown
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

PAGE = Path(__file__).resolve().parents[1] / "docs" / "deploying.md"


def _python_block(containing: str) -> str:
    (code,) = [
        block
        for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
        if containing in block
    ]
    return code


def _run_block(containing: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "deploying_page"}
    exec(compile(_python_block(containing), str(PAGE), "exec"), namespace)
    return namespace


@pytest.fixture
def provider_environment(
    monkeypatch: pytest.MonkeyPatch, sandbox: SandboxServer, journal_path: Path
) -> None:
    """The service's settings, from the environment as the page has them."""
    for name, value in {
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_PROVIDER": "sandbox",
        "PAYONCE_ACCOUNT": "acct_demo",
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_JOURNAL": str(journal_path),
    }.items():
        monkeypatch.setenv(name, value)


def _serve(application: Callable[..., list[bytes]], order_id: str) -> dict[str, Any]:
    status: list[str] = []
    body = application(
        {"PATH_INFO": f"/orders/{order_id}"}, lambda code, headers: status.append(code)
    )
    assert status == ["200 OK"]
    answer: dict[str, Any] = json.loads(b"".join(body))
    return answer


def test_the_preloaded_wsgi_module_resumes_once_then_forked_workers_each_pay_on_their_own(
    provider_environment: None,
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
) -> None:
    left = leave_pending(make_client, "order-7")  # a killed run left it

    # What gunicorn --preload does: import the module in the master, then fork the workers.
    module = _run_block("def application(")
    (resumed,) = module["client"].journal.find("order-7")
    assert resumed.state is payonce.IntentState.SUCCEEDED

    workers = []
    for order_id in ("1", "2", "7"):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the worker
            code = 1
            try:
                os.write(write_end, json.dumps(_serve(module["application"], order_id)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        workers.append((pid, read_end))
    answers = []
    for pid, read_end in workers:
        with os.fdopen(read_end, "rb") as pipe:
            answers.append(json.loads(pipe.read()))
        assert os.waitpid(pid, 0)[1] == 0

    assert len({answer["pid"] for answer in answers}) == 3
    assert os.getpid() not in {answer["pid"] for answer in answers}
    executions = sandbox.store.executions()
    assert executions[left.key] == 1  # order-7: resumed in the master, replayed in a worker
    assert sorted(executions.values()) == [1, 1, 1]
    module["client"].close()


def test_the_alert_counts_are_zero_when_healthy_and_count_what_needs_a_look(
    provider_environment: None,
    make_client: MakeClient,
    sandbox: SandboxServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    long_ago = time.time() - 20 * 60
    make_client().close()  # the service started: its journal exists, and holds nothing yet
    _run_block("def payment_alerts(")  # the check opens it read-only: all is well
    assert (
        capsys.readouterr().out
        == "{'unknown': 0, 'pending_too_long': 0, 'unacknowledged_too_long': 0}\n"
    )

    # Needs a look: unknown, pending for 20 minutes, settled 20 minutes ago and not recorded.
    make_unknown(make_client, sandbox, "order-unknown", "fail_before", "fail_before")
    leave_pending(make_client, "order-stuck", clock=lambda: long_ago)
    old = make_client(clock=lambda: long_ago)
    with old.intent("order-not-recorded", acknowledge=False) as op:
        op.post("/v1/payments", json=PAYMENT)
    # Normal: a payment in flight right now, outcomes just settled or recorded.
    leave_pending(make_client, "order-in-flight")
    with make_client().intent("order-just-paid", acknowledge=False) as op:
        op.post("/v1/payments", json=PAYMENT)
    old.post("/v1/payments", json=PAYMENT, reference="order-recorded")

    _run_block("def payment_alerts(")
    assert (
        capsys.readouterr().out
        == "{'unknown': 1, 'pending_too_long': 1, 'unacknowledged_too_long': 1}\n"
    )
