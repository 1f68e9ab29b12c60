"""A block's step left pending by a real crash, and the block run again.

A child process runs a two-step block against the sandbox and is SIGKILLed right after
step 2's request left: the provider executed it, the journal holds it pending. Run again
past the window in which payonce resends on its own where the provider's key lifetime is
only assumed (the generic profile, which has no status look-up either), step 2 is not
resent: it goes unknown, and the block shows it so.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import payonce
from helpers.crash import KILLED, executions_once_arrived, worker_env
from helpers.payments import PAYMENT, MakeClient
from payonce._lifecycle._key_age import ASSUMED_LIFETIME_RESEND_WINDOW
from payonce.sandbox import SandboxServer

SECOND = {"amount": 4300, "currency": "eur"}
PAST_THE_WINDOW = ASSUMED_LIFETIME_RESEND_WINDOW + 60.0

_CHECKOUT = """
import sys

import payonce
from payonce.sandbox import DEFAULT_API_KEY

url, journal, reference = sys.argv[1:]
client = payonce.Client(
    base_url=url, provider="generic", account="acct_demo", api_key=DEFAULT_API_KEY,
    journal=journal,
)
with client.intent(reference) as op:
    op.post("/v1/payments", json={"amount": 4200, "currency": "eur"})
    op.post("/v1/payments", json={"amount": 4300, "currency": "eur"})
"""


def _killed_after_sending_step_2(sandbox: SandboxServer, journal: Path, reference: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHECKOUT, sandbox.url, str(journal), reference],
        env=worker_env("after_send:2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == KILLED, child.stderr[-3000:]
    assert executions_once_arrived(sandbox, 2) == 2


def test_a_step_a_crash_left_pending_goes_unknown_past_the_resend_window_and_the_block_shows_it(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    _killed_after_sending_step_2(sandbox, journal_path, "order-crashed-step")
    sandbox.advance_clock(PAST_THE_WINDOW)
    client = make_client(provider="generic", clock=lambda: time.time() + PAST_THE_WINDOW)

    with client.intent("order-crashed-step") as op:
        first = op.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.OutcomeUnknown) as unknown:
            op.post("/v1/payments", json=SECOND)
    assert "payonce no longer resends it" in str(unknown.value)

    assert first.json()["amount"] == PAYMENT["amount"]
    ((_, first_key, first_state), (position, second_key, second_state)) = op.steps
    assert first_state is payonce.IntentState.SUCCEEDED
    assert (position, second_key) == (2, f"{first_key}-step2")
    assert second_state is payonce.IntentState.UNKNOWN, "the block shows what its step came to"
    journaled = client.journal.get(str(second_key))
    assert journaled is not None
    assert journaled.state is payonce.IntentState.UNKNOWN
    assert sandbox.store.executions() == {first_key: 1, second_key: 1}, "step 2 was not resent"
