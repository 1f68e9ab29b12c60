"""The examples run as a user would run them: a real interpreter, a real sandbox, exit 0."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psycopg
import pytest

from helpers.processes import deployed_env, run_example


def _run_example(name: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    journal = tmp_path / "example-journal.db"
    env = deployed_env(tmp_path / "example-home", PAYONCE_JOURNAL=str(journal))
    return run_example(name, cwd=tmp_path, env=env, timeout=60)


def test_the_checkout_example_charges_once_replays_and_handles_errors(tmp_path: Path) -> None:
    result = _run_example("checkout.py", tmp_path)

    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = result.stdout
    charged = re.search(r"order-1001: charged 42\.00 EUR as (pay_\w+) .*replayed=False", out)
    assert charged, out
    payment_id = charged.group(1)
    assert re.search(r"order-1002: .*attempts=2, .*provider_replayed=True", out), out
    assert (
        "order-1001 again: replayed=True, from the journal with no network call; "
        f"same payment {payment_id}"
    ) in out
    assert "order-1003: declined (ProviderError, HTTP 402, card_declined" in out
    assert "order-1003 again: the same refusal, replayed=True" in out
    assert "order-1004: OutcomeUnknown after 3 attempts" in out
    assert "order-1004 again: still OutcomeUnknown, and nothing was sent" in out
    assert f"after a restart, order-1001: replayed=True ({payment_id})" in out
    assert "the sandbox executed 3 payments for 4 orders, at most once per key: True" in out
    assert "Traceback" not in result.stderr
    # The example keeps its own journal: the one PAYONCE_JOURNAL points at stays unused.
    assert not (tmp_path / "example-journal.db").exists()


@pytest.mark.parametrize("name", ["order_service_psycopg.py", "order_service_sqlalchemy.py"])
def test_the_order_service_examples_commit_orders_and_payments_together(
    name: str, tmp_path: Path, postgres_url: str
) -> None:
    env = deployed_env(tmp_path / "example-home", DATABASE_URL=postgres_url)
    result = run_example(name, cwd=tmp_path, env=env, timeout=60)

    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = result.stdout
    committed = re.search(r"order-1001: committed with payment (\w+) \(pending\)", out)
    assert committed, out
    key = committed.group(1)
    assert "order-1001 retried: same payment True" in out
    assert "order-1002: the handler failed after enqueuing: rolled back" in out
    assert "order-1002: payments journaled 0" in out
    assert "resumed order-1001: succeeded (HTTP 201)" in out
    assert "resumed again: 0 to send" in out
    assert "the sandbox executed 1 payment(s) for 1 committed order" in out
    assert "Traceback" not in result.stderr
    # What the service's database holds: the order with its payment's key, paid once; no
    # trace of the order whose handler failed.
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT id, amount, payment_key FROM orders").fetchall() == [
            ("order-1001", 4200, key)
        ]
        states = conn.execute("SELECT reference, state FROM payonce.intents").fetchall()
    assert states == [("order-1001", "succeeded")]
