"""An unknown Square payment, where the profile has no status look-up: settled by resending
its journaled request under its key while Square surely still remembers the key (a re-run
of the block, ``payonce reconcile``, the worker), left unknown for a person past that.

The reviewer's scenario of issue 17: the first attempt executes and its answer is lost, the
second fails before executing, the third is rate-limited; three attempts, so it goes
unknown though Square executed it."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

import payonce
from helpers.cli import run_cli
from helpers.crash import worker_env
from helpers.faketime import libfaketime_env
from helpers.payments import FAST_RETRY, MakeClient
from helpers.sandboxes import SharedSandboxes
from payonce.hooks import WorkerPassEnded
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer
from payonce.worker import Worker

REVIEWER_FAULTS = ["fail_after", "fail_before", "rate_limit"]
THREE_ATTEMPTS = attrs.evolve(FAST_RETRY, max_attempts=3)
SQUARE_KEY_WINDOW = 24 * 3600.0 * 0.9


def payment() -> dict[str, Any]:
    return {
        "idempotency_key": "",
        "source_id": "cnon:card-nonce-ok",
        "amount_money": {"amount": 1500, "currency": "USD"},
        "reference_id": "order-17",
    }


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("square", SandboxConfig.like("square"))


@pytest.fixture
def square(server: SandboxServer, make_client: MakeClient) -> MakeClient:
    """Square clients of the sandbox on the test's journal, three attempts a call."""

    def make(**overrides: Any) -> payonce.Client:
        options: dict[str, Any] = {"provider": "square", "retry": THREE_ATTEMPTS, **overrides}
        return make_client(base_url=server.url, **options)

    return make


WorkerPasses = Callable[..., list[WorkerPassEnded]]


@pytest.fixture
def worker_passes(
    server: SandboxServer,
    journal_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> WorkerPasses:
    """``payonce worker``'s passes over the test's journal, for Square's account, logged."""
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)

    def passes(count: int, *, later: float = 0.0) -> list[WorkerPassEnded]:
        """``later``: seconds on, for the worker's schedule (Square's clock is the
        sandbox's, ``advance_clock``)."""
        with (
            caplog.at_level(logging.INFO, logger="payonce"),
            Worker(
                journal=journal_path,
                base_url=server.url,
                provider="square",
                account="acct_demo",
                clock=lambda: time.time() + later,
                retry=THREE_ATTEMPTS,
            ) as worker,
        ):
            return [worker.run_pass() for _ in range(count)]

    return passes


def cli_env(server: SandboxServer, journal_path: Path) -> dict[str, str]:
    """The environment of a `payonce` command on the test's journal and Square's account."""
    return {
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_BASE_URL": server.url,
        "PAYONCE_PROVIDER": "square",
        "PAYONCE_ACCOUNT": "acct_demo",
        "PAYONCE_JOURNAL": str(journal_path),
    }


def pay(client: payonce.Client) -> tuple[str, dict[str, Any]]:
    with client.intent("order-17") as op:
        paid = op.post("/v2/payments", json=payment())
    assert op.key is not None
    return op.key, paid.json()


def went_unknown(square: MakeClient, server: SandboxServer, **options: Any) -> str:
    """The reviewer's scenario: executed at Square, unknown in the journal."""
    server.script(REVIEWER_FAULTS)
    client = square(**options)
    with pytest.raises(payonce.OutcomeUnknown) as raised:
        pay(client)
    key = raised.value.key
    assert key is not None
    assert state_of(client, key) is payonce.IntentState.UNKNOWN
    assert server.store.executions() == {key: 1}
    return key


def state_of(client: payonce.Client, key: str) -> payonce.IntentState:
    record = client.journal.get(key)
    assert record is not None
    return record.state


def reconciled(client: payonce.Client, key: str) -> list[str]:
    """What each reconciliation of the intent came to, as the journal keeps it."""
    return [r.outcome for r in client.journal.reconciliations(key)]


def test_the_first_unknown_outcome_says_how_long_payonce_resends_it_on_its_own(
    square: MakeClient, server: SandboxServer
) -> None:
    # A reviewer's case: Square's key lifetime is assumed, so payonce resends on its own
    # only within 15 minutes; the first error must say so, not only the one after.
    server.script(REVIEWER_FAULTS)
    with pytest.raises(payonce.OutcomeUnknown) as raised:
        pay(square())
    said = str(raised.value)
    assert "within 15 minutes of its first send" in said
    assert "key lifetime is assumed, not documented" in said
    assert f"payonce reconcile {raised.value.key} --resend" in said


def test_a_re_run_of_the_block_gets_square_s_replay_of_the_payment_it_executed(
    square: MakeClient, server: SandboxServer
) -> None:
    key = went_unknown(square, server)

    client = square()
    with client.intent("order-17") as op:
        answer = op.post("/v2/payments", json=payment())
    paid = answer.json()

    assert op.key == key
    info = payonce.response_info(answer)
    assert info is not None
    # Sent again by this call (not the journal's answer), and Square said it replayed the
    # payment it had executed under the key.
    assert (info.replayed, info.provider_replayed) == (False, True)
    assert paid["payment"]["status"] == "COMPLETED"
    assert paid["payment"]["reference_id"] == "order-17"
    assert state_of(client, key) is payonce.IntentState.SUCCEEDED
    assert server.store.executions() == {key: 1}, "Square executed it once, replayed it then"
    assert reconciled(client, key) == ["resent"]
    # Settled now: a third run is the journal's replay, nothing sent.
    assert pay(client) == (key, paid)
    assert server.store.executions() == {key: 1}


def test_payonce_reconcile_all_settles_it_by_resending_under_its_key(
    square: MakeClient, server: SandboxServer, journal_path: Path
) -> None:
    key = went_unknown(square, server)
    env = cli_env(server, journal_path)

    result = run_cli(["reconcile", "--all", "--json"], env=env, secrets=(DEFAULT_API_KEY,))

    assert result.exit_code == 0, result.output
    assert '"outcome": "resent"' in result.stdout
    assert '"after": "succeeded"' in result.stdout
    assert state_of(square(), key) is payonce.IntentState.SUCCEEDED
    assert server.store.executions() == {key: 1}
    assert reconciled(square(), key) == ["resent"]


def test_the_worker_settles_it_and_escalates_nothing(
    square: MakeClient,
    server: SandboxServer,
    worker_passes: WorkerPasses,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = went_unknown(square, server)

    (ended,) = worker_passes(1)

    assert (ended.settled, ended.escalated) == (1, 0)
    assert f"intent {key} escalated" not in caplog.text
    assert state_of(square(), key) is payonce.IntentState.SUCCEEDED
    assert server.store.executions() == {key: 1}


def test_past_square_s_key_window_it_stays_unknown_and_nothing_is_sent(
    square: MakeClient,
    server: SandboxServer,
    worker_passes: WorkerPasses,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = went_unknown(square, server)
    # Square's clock (its answers' Date) says the key is past 90% of its 24 h lifetime.
    server.advance_clock(SQUARE_KEY_WINDOW + 60)
    sent_before = server.store.total_executions()

    client = square()
    with pytest.raises(payonce.OutcomeUnknown) as raised:
        pay(client)
    said = str(raised.value)
    assert "no longer safe" in said
    assert f"payonce abandon {key}" in said
    assert "payonce reconcile" not in said, "a command that cannot work here"

    ended, again = worker_passes(2)

    assert (ended.settled, ended.escalated, again.escalated) == (0, 1, 0)
    (escalation,) = [r.getMessage() for r in caplog.records if "escalated:" in r.getMessage()]
    assert "no longer safe" in escalation
    assert f"`payonce abandon {key} --reason ...`" in escalation
    assert "payonce reconcile" not in escalation, "a command that cannot work here"
    assert state_of(client, key) is payonce.IntentState.UNKNOWN
    assert server.store.total_executions() == sent_before
    assert server.store.executions() == {key: 1}
    assert "resent" not in reconciled(client, key)


def complete_order(client: payonce.Client) -> dict[str, Any]:
    """A block of two steps: create the payment (approved only), then complete it (Square's
    CompletePayment takes no key: completing twice completes once)."""
    with client.intent("order-17c") as op:
        approved = op.post("/v2/payments", json={**payment(), "autocomplete": False})
        payment_id = approved.json()["payment"]["id"]
        done = op.post(f"/v2/payments/{payment_id}/complete", json={})
    completed: dict[str, Any] = done.json()
    return completed


def test_an_unknown_complete_step_is_resent_by_a_re_run_and_its_advice_keeps_the_block(
    square: MakeClient, server: SandboxServer
) -> None:
    # Step 1 goes through; step 2 (complete) executes, then meets the reviewer's faults.
    server.script(["none", *REVIEWER_FAULTS])
    with pytest.raises(payonce.OutcomeUnknown) as raised:
        complete_order(square())
    said = str(raised.value)
    assert raised.value.step == 2
    # A new reference would run the block from step 1 again: a second payment.
    assert "never run the block again under a new reference" in said
    assert "do not pay again under a new reference" not in said
    step_key, payment_key = raised.value.key, raised.value.intent_key
    assert step_key is not None
    assert payment_key is not None

    client = square()
    done = complete_order(client)

    assert done["payment"]["status"] == "COMPLETED"
    assert state_of(client, step_key) is payonce.IntentState.SUCCEEDED
    assert reconciled(client, step_key) == ["resent"]
    assert server.store.executions()[payment_key] == 1, "the payment was created once"


@pytest.mark.anyio
async def test_the_async_client_resends_it_too_by_a_re_run_and_by_reconcile(
    square: MakeClient,
    server: SandboxServer,
    make_async_client: Callable[..., payonce.AsyncClient],
) -> None:
    key = went_unknown(square, server)
    client = make_async_client(base_url=server.url, provider="square", retry=THREE_ATTEMPTS)

    async with client.intent("order-17") as op:
        paid = await op.post("/v2/payments", json=payment())

    assert op.key == key
    assert paid.json()["payment"]["status"] == "COMPLETED"
    assert server.store.executions() == {key: 1}

    # Another payment gone unknown the same way, reconciled through the async client.
    server.script(REVIEWER_FAULTS)
    with pytest.raises(payonce.OutcomeUnknown) as raised:
        await client.post("/v2/payments", json=payment(), reference="order-17b")
    (result,) = await client.reconcile("order-17b")

    assert (result.key, result.outcome) == (raised.value.key, "resent")
    assert result.after is payonce.IntentState.SUCCEEDED
    assert server.store.executions() == {key: 1, result.key: 1}


_PAY_WITH_THE_CLOCK_AHEAD = """
import select
import sys
import time

import payonce
from payonce.sandbox import DEFAULT_API_KEY

# libfaketime with the monotonic clock left alone refuses Python's sleep (an absolute
# clock_nanosleep on it: EINVAL); a select's timeout is relative.
time.sleep = lambda seconds: select.select([], [], [], seconds) and None

url, journal = sys.argv[1:]
client = payonce.Client(
    base_url=url, provider="square", account="acct_demo", api_key=DEFAULT_API_KEY,
    journal=journal,
    retry=payonce.RetryPolicy(initial_wait=0.001, max_wait=0.01, max_attempts=3),
)
try:
    client.post("/v2/payments", json={
        "idempotency_key": "", "source_id": "cnon:card-nonce-ok",
        "amount_money": {"amount": 1500, "currency": "USD"}, "reference_id": "order-17",
    }, reference="order-17")
except payonce.OutcomeUnknown as unknown:
    print(unknown.key, flush=True)
"""
HOURS_5 = 5 * 3600.0
HOURS_25 = 25 * 3600.0


@pytest.mark.slow
def test_a_first_send_with_the_clock_5_hours_ahead_is_never_resent_once_square_forgot_it(
    square: MakeClient,
    server: SandboxServer,
    journal_path: Path,
    worker_passes: WorkerPasses,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Paid by a host whose clock was 5 hours ahead (since corrected): executed at Square,
    # its answer dropped (no Date for the first send), then a failure before executing and
    # a rate limit, whose answer Square dates.
    server.script(["drop_after", "fail_before", "rate_limit"])
    child = subprocess.run(
        [sys.executable, "-c", _PAY_WITH_THE_CLOCK_AHEAD, server.url, str(journal_path)],
        env={**worker_env(), **libfaketime_env("+5h")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    key = child.stdout.split()[-1]
    assert server.store.executions() == {key: 1}
    first = square().journal.get(key)
    assert first is not None
    assert first.first_sent_at is not None
    assert first.first_sent_at > time.time() + HOURS_5 - 600, "its clock was ahead"
    # 25 hours on by Square's clock: its key is gone. By the first send's own date it is
    # 20 hours old, within 90% of 24 h; Square's dated answer to the third attempt says
    # the first left over 25 hours ago.
    server.advance_clock(HOURS_25)

    client = square()
    with pytest.raises(payonce.OutcomeUnknown) as raised:
        pay(client)
    assert "no longer safe" in str(raised.value)
    (result,) = client.reconcile(key)
    assert (result.outcome, result.after) == ("still_unknown", payonce.IntentState.UNKNOWN)
    (ended,) = worker_passes(1)
    assert (ended.settled, ended.escalated) == (0, 1)

    assert state_of(client, key) is payonce.IntentState.UNKNOWN
    assert "resent" not in reconciled(client, key)
    assert server.store.executions() == {key: 1}, "Square executed it once, and never again"


def test_an_hour_on_only_an_operator_s_reconcile_resend_resends_it(
    square: MakeClient,
    server: SandboxServer,
    journal_path: Path,
    worker_passes: WorkerPasses,
) -> None:
    # Square publishes no key lifetime: payonce resends an unknown Square payment on its
    # own only within 15 minutes of its first send.
    key = went_unknown(square, server)
    server.advance_clock(3600)

    with pytest.raises(payonce.OutcomeUnknown) as raised:
        pay(square())
    assert "assumed, not documented" in str(raised.value)
    (ended,) = worker_passes(1)
    assert ended.settled == 0
    assert state_of(square(), key) is payonce.IntentState.UNKNOWN
    assert server.store.executions() == {key: 1}
    assert "resent" not in reconciled(square(), key)

    env = cli_env(server, journal_path)
    result = run_cli(["reconcile", key, "--resend"], env=env, secrets=(DEFAULT_API_KEY,))

    assert result.exit_code == 0, result.output
    assert state_of(square(), key) is payonce.IntentState.SUCCEEDED
    assert server.store.executions() == {key: 1}, "Square replayed the payment it executed"


def test_a_square_profile_told_its_lifetime_is_documented_resends_it_on_its_own_later(
    square: MakeClient, server: SandboxServer
) -> None:
    documented = payonce.providers.square_profile(key_lifetime_documented=True)
    key = went_unknown(square, server, provider=documented)
    server.advance_clock(3600)

    client = square(provider=documented)
    assert pay(client)[0] == key

    assert state_of(client, key) is payonce.IntentState.SUCCEEDED
    assert reconciled(client, key)[-1] == "resent"
    assert server.store.executions() == {key: 1}


def test_an_intent_journaled_with_the_lifetime_assumed_stays_judged_as_assumed(
    square: MakeClient, server: SandboxServer
) -> None:
    # Its key terms were journaled with it: a profile told later that the lifetime is
    # documented does not widen the window of what was sent under the assumption.
    key = went_unknown(square, server)
    server.advance_clock(3600)

    client = square(provider=payonce.providers.square_profile(key_lifetime_documented=True))
    with pytest.raises(payonce.OutcomeUnknown, match="is assumed, not documented"):
        pay(client)

    assert state_of(client, key) is payonce.IntentState.UNKNOWN
    assert server.store.executions() == {key: 1}


def test_a_resend_s_retries_stop_before_one_could_end_past_the_key_window(
    square: MakeClient, server: SandboxServer
) -> None:
    key = went_unknown(square, server)
    # 32 s short of 90% of 24 h by Square's clock: the resend may go (it ends, max_processing
    # later, 2 s inside the window), but not a retry that would leave 4 s later.
    server.advance_clock(SQUARE_KEY_WINDOW - 32)
    server.script(["fail_before", "fail_before", "fail_before"])
    sent_before = server.store.total_executions()

    waits_4s = attrs.evolve(THREE_ATTEMPTS, initial_wait=4.0, max_wait=4.0, jitter=False)
    client = square(retry=waits_4s)
    (result,) = client.reconcile(key, resend=True)

    assert result.outcome == "resent"
    assert result.after is payonce.IntentState.UNKNOWN
    assert "retries stopped" in result.detail
    record = client.journal.get(key)
    assert record is not None
    assert record.unknown_reason is not None
    assert record.unknown_reason.startswith("retries stopped")
    assert len(client.journal.attempts(key)) == 3 + 1, "one resend, no retry"
    assert server.store.total_executions() == sent_before
    assert server.store.executions() == {key: 1}


def test_the_worker_keeps_resending_while_the_window_is_open_then_escalates_once(
    square: MakeClient,
    server: SandboxServer,
    worker_passes: WorkerPasses,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = went_unknown(square, server)
    # Square is down for the worker's first resend (its three attempts fail before
    # executing): the key is still surely remembered, so that is no reason to escalate.
    server.script(["fail_before"] * 3)

    (down,) = worker_passes(1)

    assert (down.settled, down.escalated) == (0, 0)
    assert state_of(square(), key) is payonce.IntentState.UNKNOWN
    assert "escalated:" not in caplog.text
    # The next pass comes before the backoff (Square's schedule: 5 minutes) is over: not
    # resent yet; 20 minutes on, past the 15 minutes of an assumed lifetime: escalated.
    (waiting,) = worker_passes(1)
    assert (waiting.settled, waiting.escalated) == (0, 0)
    assert reconciled(square(), key) == ["resent"]
    server.advance_clock(20 * 60)
    caplog.clear()
    ended, again = worker_passes(2, later=20 * 60)

    assert (ended.settled, ended.escalated, again.escalated) == (0, 1, 0)
    (escalation,) = [r.getMessage() for r in caplog.records if "escalated:" in r.getMessage()]
    assert "payonce no longer resends it" in escalation
    assert "assumed, not documented" in escalation
    assert f"`payonce reconcile {key} --resend`" in escalation, "90% of 24 h is not passed"
    assert f"`payonce abandon {key} --reason ...`" in escalation
    assert "calling again with the same reference" not in escalation, "in-window advice"
    assert server.store.executions() == {key: 1}
