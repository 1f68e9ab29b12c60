"""The examples run as a user would run them: a real interpreter, a real sandbox, exit 0."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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
