"""Verify before resend, against a server whose idempotency layer does not guard a duplicate
that arrives while the first request still runs (the sandbox's ``racy`` mode), with a
handler slower than the client's timeout.

Resending at once under the same key executes the order twice there; verifying first (ask
the status look-up, resend only once nothing is found after the earlier attempt can no
longer run) executes it once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

import payonce
from helpers.payments import PAYMENT, DiesAfterSending, MakeClient
from payonce.sandbox import SandboxServer

PROCESSING = 0.8  # the handler outlives the client's timeout
TIMEOUT = 0.3
LOOKUP = payonce.providers.Lookup(path="/v1/payments")
SAME_KEY = payonce.ProviderProfile(name="racy-same-key", lookup=LOOKUP, resend="same-key")
VERIFY = payonce.ProviderProfile(name="racy-verify", lookup=LOOKUP, max_processing=3.0)
RETRY = payonce.RetryPolicy(max_attempts=4, initial_wait=0.05, max_wait=0.05, max_elapsed=20)


@pytest.fixture
def racy(make_sandbox: Callable[..., SandboxServer]) -> SandboxServer:
    return make_sandbox(processing_seconds=PROCESSING, idempotency="racy")


def _client(make_client: MakeClient, server: SandboxServer, profile: object) -> payonce.Client:
    return make_client(base_url=server.url, provider=profile, timeout=TIMEOUT, retry=RETRY)


def test_a_user_profile_with_a_consistent_look_up_verifies_by_default() -> None:
    assert VERIFY.verifies
    assert not SAME_KEY.verifies
    lagging = payonce.providers.Lookup(path="/v1/search", consistent=False)
    assert not payonce.ProviderProfile(name="lagging", lookup=lagging).verifies
    assert not payonce.ProviderProfile(name="blind").verifies, "no look-up: nothing to ask"


def test_resending_at_once_under_the_same_key_executes_twice_on_a_racy_server(
    make_client: MakeClient, racy: SandboxServer
) -> None:
    client = _client(make_client, racy, SAME_KEY)
    paid = client.post("/v1/payments", json=PAYMENT, reference="order-twice")
    info = payonce.response_info(paid)
    assert info is not None
    assert info.attempts >= 2
    assert racy.wait_idle(), "every request it sent has been handled"
    assert racy.store.executions()[info.key] >= 2, "what verify-before-resend prevents"


def test_verifying_first_settles_from_the_record_and_executes_once(
    make_client: MakeClient, racy: SandboxServer
) -> None:
    client = _client(make_client, racy, VERIFY)

    paid = client.post("/v1/payments", json=PAYMENT, reference="order-once")

    info = payonce.response_info(paid)
    assert info is not None
    assert (paid.json()["status"], info.attempts) == ("succeeded", 1), "nothing resent"
    assert racy.wait_idle()
    assert racy.store.executions() == {info.key: 1}
    outcomes = [r.outcome for r in client.journal.reconciliations(info.key)]
    assert outcomes[-1] == "found"
    assert set(outcomes[:-1]) <= {"not_found"}, "asked while it still ran: nothing yet"


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["fail_before", "drop_after", "fail_after"])
def test_a_lost_or_refused_answer_is_verified_then_settled_or_resent_once(
    make_client: MakeClient, make_sandbox: Callable[..., SandboxServer], fault: str
) -> None:
    server = make_sandbox(idempotency="racy")
    server.script([fault])
    client = _client(make_client, server, VERIFY)

    paid = client.post("/v1/payments", json=PAYMENT, reference=f"order-{fault}")

    info = payonce.response_info(paid)
    assert info is not None
    assert server.wait_idle()
    assert server.store.executions() == {info.key: 1}
    resent = info.attempts == 2
    assert resent is (fault == "fail_before"), "resent only what provably never ran"


def test_the_same_holds_for_a_server_with_no_idempotency_at_all(
    make_client: MakeClient, make_sandbox: Callable[..., SandboxServer]
) -> None:
    server = make_sandbox(processing_seconds=PROCESSING, idempotency="none")
    paid = _client(make_client, server, VERIFY).post(
        "/v1/payments", json=PAYMENT, reference="order-bare"
    )
    info = payonce.response_info(paid)
    assert info is not None
    assert server.wait_idle()
    assert server.store.executions() == {info.key: 1}


def test_resume_after_a_crash_mid_attempt_verifies_before_it_resends(
    make_client: MakeClient, racy: SandboxServer
) -> None:
    crashed = make_client(base_url=racy.url, provider=VERIFY, transport=DiesAfterSending())
    with pytest.raises(RuntimeError, match="worker died"):
        crashed.post("/v1/payments", json=PAYMENT, reference="order-crash")

    (result,) = _client(make_client, racy, VERIFY).resume()

    assert result.state is payonce.IntentState.SUCCEEDED
    assert racy.wait_idle()
    assert racy.store.executions() == {result.key: 1}, "the running first attempt was awaited"


def test_a_reconcile_while_an_attempt_may_still_run_proves_nothing_yet(
    make_client: MakeClient, racy: SandboxServer
) -> None:
    hasty = make_client(
        base_url=racy.url,
        provider=VERIFY,
        timeout=TIMEOUT,
        retry=payonce.RetryPolicy(max_attempts=1),
    )
    with pytest.raises(payonce.OutcomeUnknown) as caught:
        hasty.post("/v1/payments", json=PAYMENT, reference="order-hasty")

    (early,) = hasty.reconcile("order-hasty")  # the first attempt is still executing

    assert (early.outcome, early.after) == ("still_unknown", payonce.IntentState.UNKNOWN)
    assert "may still be executing" in early.detail
    deadline = time.monotonic() + 10
    while caught.value.key not in racy.store.executions():  # the first attempt finishes
        assert time.monotonic() < deadline, "the slow handler never finished"
        time.sleep(0.05)
    # A clock a minute ahead: the earlier attempt can no longer be running.
    later = make_client(base_url=racy.url, provider=VERIFY, clock=lambda: time.time() + 60)
    (settled,) = later.reconcile("order-hasty")
    assert (settled.outcome, settled.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert racy.wait_idle()
    assert racy.store.executions() == {caught.value.key: 1}
