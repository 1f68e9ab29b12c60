"""After something went wrong: resume, reconcile, abandon, the outbox, and lease renewal.

Everything runs against the real sandbox over loopback and a real journal file. The
crash-by-SIGKILL scenarios live in test_crash.py; here a worker "dies" by a transport that
really sends the request and then fails, leaving the intent pending exactly as a crash
after sending would.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import payonce
from helpers.journals import store_of
from helpers.payments import (
    PAYMENT,
    MakeClient,
    free_port,
    leave_pending,
    make_unknown,
    paying_in_background,
)
from payonce.providers import get_profile
from payonce.sandbox import SandboxServer

DAY = 24 * 3600.0


# -- resume ---------------------------------------------------------------------------------


def test_resume_finishes_what_a_dead_worker_left_pending_under_the_same_key(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    left = [leave_pending(make_client, f"order-{n}") for n in range(3)]
    assert sandbox.store.total_executions() == 3

    results = make_client().resume()

    assert [r.key for r in results] == [r.key for r in left]
    assert {r.state for r in results} == {payonce.IntentState.SUCCEEDED}
    assert sandbox.store.executions() == {r.key: 1 for r in left}


def test_resume_leaves_intents_held_by_a_live_worker_alone(
    sandbox: SandboxServer, make_client: MakeClient
) -> None:
    busy = make_client(timeout=60.0)  # its answer outlasts the block
    with paying_in_background(busy, "o-1", sandbox):
        assert make_client().resume() == []
    assert sandbox.store.total_executions() == 1


def test_resume_does_not_resend_past_the_key_lifetime(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = leave_pending(make_client, "order-old")

    (result,) = make_client(clock=lambda: time.time() + DAY).resume()

    assert result.key == record.key
    assert result.state is payonce.IntentState.UNKNOWN
    assert "key lifetime" in result.detail
    assert sandbox.store.total_executions() == 1


def test_one_failing_intent_does_not_stop_the_others(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    first = leave_pending(make_client, "order-a")
    second = leave_pending(make_client, "order-b")
    sandbox.script(["fail_before"] * 5)  # the first resend sees nothing but 503s

    results = make_client(retry=payonce.RetryPolicy(max_attempts=5, initial_wait=0)).resume()

    assert [(r.key, r.state) for r in results] == [
        (first.key, payonce.IntentState.UNKNOWN),
        (second.key, payonce.IntentState.SUCCEEDED),
    ]
    assert sandbox.store.executions() == {first.key: 1, second.key: 1}


def _warnings_about(key: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and getattr(r, "key", None) == key
    ]


@pytest.mark.parametrize("how", ["retries exhausted", "beyond the provider's key lifetime"])
def test_an_intent_resume_leaves_unknown_is_one_warning_and_other_failures_still_one_each(
    make_client: MakeClient,
    sandbox: SandboxServer,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    unknown = leave_pending(make_client, "order-sent")  # an attempt may have executed
    unsent = make_client(base_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(payonce.ProviderUnavailable) as never_sent:
        unsent.post("/v1/payments", json=PAYMENT, reference="order-unsent")
    policy = payonce.RetryPolicy(max_attempts=3, initial_wait=0, max_retry_after=0)
    if how == "retries exhausted":
        # The first intent's resends meet nothing but 503s, the second's 429s.
        sandbox.script(["fail_before"] * 3 + ["rate_limit"] * 3)
        resuming = make_client(retry=policy)
    else:
        sandbox.script(["rate_limit"] * 3)  # the first is never resent: the second meets them
        resuming = make_client(retry=policy, clock=lambda: time.time() + DAY)

    with caplog.at_level(logging.WARNING, logger="payonce"):
        results = resuming.resume()

    assert [(r.key, r.state) for r in results] == [
        (unknown.key, payonce.IntentState.UNKNOWN),
        (never_sent.value.key, payonce.IntentState.PENDING),
    ]
    (said,) = _warnings_about(unknown.key, caplog)
    assert "went unknown" in said
    assert how in said
    (still_pending,) = _warnings_about(never_sent.value.key, caplog)
    assert "ProviderUnavailable" in still_pending


def test_an_unknown_outcome_names_the_remedy_its_provider_profile_allows(
    make_client: MakeClient, sandbox: SandboxServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="payonce"):
        record = make_unknown(make_client, sandbox, "order-u", "drop_after")
    client = make_client()

    with pytest.raises(payonce.OutcomeUnknown) as again:
        client.post("/v1/payments", json=PAYMENT, reference="order-u")
    with pytest.raises(payonce.IntentMismatch) as changed:
        client.post("/v1/payments", json={**PAYMENT, "amount": 1}, reference="order-u")

    (warned,) = _warnings_about(record.key, caplog)
    for said in (str(again.value), warned, str(changed.value)):
        assert "payonce reconcile" in said
    assert client.journal.get(record.key).state is payonce.IntentState.UNKNOWN  # type: ignore[union-attr]
    assert sandbox.store.total_executions() == 1


def test_without_a_status_look_up_an_unknown_outcome_is_resent_only_within_its_key_window(
    make_client: MakeClient, sandbox: SandboxServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="payonce"):
        record = make_unknown(make_client, sandbox, "order-u", "drop_after", provider="generic")
    (warned,) = _warnings_about(record.key, caplog)
    assert "calling again with the same reference" in warned
    assert f"payonce abandon {record.key}" in warned  # once the key may be gone
    # The provider's clock (its answers' Date): the key may be gone there now.
    sandbox.advance_clock(get_profile("generic").key_lifetime)
    client = make_client(provider="generic")

    with pytest.raises(payonce.OutcomeUnknown) as again:
        client.post("/v1/payments", json=PAYMENT, reference="order-u")

    said = str(again.value)
    assert "no longer safe" in said
    assert f"payonce abandon {record.key}" in said
    assert "payonce reconcile" not in said, "a command that cannot work here"
    assert client.journal.get(record.key).state is payonce.IntentState.UNKNOWN  # type: ignore[union-attr]
    assert sandbox.store.total_executions() == 1


class _MangledFor(httpx.HTTPTransport):
    """A proxy that mangles the answers about one key: a body that cannot be decoded, a
    refused status look-up, or a bug after sending. Everything else passes through to the
    real sandbox."""

    def __init__(self, key: str, how: str) -> None:
        super().__init__()
        self.key, self.how = key, how

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        about_key = self.key in str(request.url) or request.headers.get("idempotency-key") == (
            self.key
        )
        if not about_key:
            return response
        response.read()
        if self.how == "broken":
            raise RuntimeError("a bug in the transport")
        if self.how == "undecodable":
            return httpx.Response(201, headers={"content-encoding": "gzip"}, content=b"not gzip")
        return httpx.Response(403, json={"error": "forbidden"})


@pytest.mark.parametrize(
    ("how", "state", "said"),
    [
        # An answer arrived: the provider may have executed it, so it goes unknown.
        ("undecodable", payonce.IntentState.UNKNOWN, "DecodingError"),
        # Not a transport failure: the error is reported, the intent left pending.
        ("broken", payonce.IntentState.PENDING, "a bug in the transport"),
    ],
)
def test_an_undecodable_answer_or_a_bug_for_one_intent_does_not_stop_resume(
    make_client: MakeClient,
    sandbox: SandboxServer,
    how: str,
    state: payonce.IntentState,
    said: str,
) -> None:
    left = [leave_pending(make_client, f"order-{n}") for n in range(3)]
    seen: list[payonce.records.ResumeResult] = []

    results = make_client(transport=_MangledFor(left[0].key, how)).resume(on_result=seen.append)

    assert seen == results
    assert [(r.key, r.state) for r in results] == [
        (left[0].key, state),
        (left[1].key, payonce.IntentState.SUCCEEDED),
        (left[2].key, payonce.IntentState.SUCCEEDED),
    ]
    assert said in results[0].detail
    assert sandbox.store.executions() == {record.key: 1 for record in left}
    held = make_client().journal.get(left[0].key)
    assert held is not None
    assert held.lease_owner is None, "the failed intent's lease was given back"


def test_a_refused_look_up_of_one_intent_does_not_stop_reconcile_all(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    unknown = [make_unknown(make_client, sandbox, f"order-{n}", "drop_after") for n in range(3)]

    results = make_client(transport=_MangledFor(unknown[1].key, "refused")).reconcile_all()

    assert [(r.key, r.outcome, r.after) for r in results] == [
        (unknown[0].key, "found", payonce.IntentState.SUCCEEDED),
        (unknown[1].key, "error", payonce.IntentState.UNKNOWN),
        (unknown[2].key, "found", payonce.IntentState.SUCCEEDED),
    ]
    assert results[1].detail == "status look-up refused: HTTP 403"
    assert sandbox.store.executions() == {record.key: 1 for record in unknown}


# -- reconcile ------------------------------------------------------------------------------


def test_an_unknown_intent_the_provider_never_saw_goes_back_to_pending_and_is_paid_once(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = make_unknown(make_client, sandbox, "order-1", "fail_before", "fail_before")
    client = make_client()

    (result,) = client.reconcile("order-1")

    assert (result.outcome, result.after) == ("not_found", payonce.IntentState.PENDING)
    (resumed,) = client.resume()
    assert resumed.state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {record.key: 1}
    outcomes = [r.outcome for r in client.journal.reconciliations(record.key)]
    assert outcomes == ["not_found"]


def test_an_unknown_intent_the_provider_executed_is_settled_from_its_record(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = make_unknown(make_client, sandbox, "order-2", "drop_after")
    assert sandbox.store.executions() == {record.key: 1}
    client = make_client()

    (result,) = client.reconcile(record.key)

    assert (result.outcome, result.after) == ("found", payonce.IntentState.SUCCEEDED)
    with client.intent("order-2") as op:
        replay = op.post("/v1/payments", json=PAYMENT)
    assert replay.json()["idempotency_key"] == record.key
    assert replay.json()["status"] == "succeeded"
    assert payonce.response_info(replay).replayed  # type: ignore[union-attr]
    assert sandbox.store.executions() == {record.key: 1}


def test_an_unknown_intent_whose_key_expired_stays_unknown_and_is_never_resent(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = make_unknown(make_client, sandbox, "order-3", "fail_before")
    sandbox.advance_clock(2 * DAY)  # the provider aged two days too, and forgot the key
    later = make_client(clock=lambda: time.time() + 2 * DAY)

    (result,) = later.reconcile("order-3")

    assert (result.outcome, result.after) == ("not_found", payonce.IntentState.UNKNOWN)
    assert "expired" in result.detail
    assert later.resume() == []
    with pytest.raises(payonce.OutcomeUnknown, match="expired"):
        later.post("/v1/payments", json=PAYMENT, reference="order-3")
    assert sandbox.store.total_executions() == 0
    assert later.journal.get(record.key).unknown_reason == result.detail  # type: ignore[union-attr]


def test_reconciliation_is_idempotent(make_client: MakeClient, sandbox: SandboxServer) -> None:
    record = make_unknown(make_client, sandbox, "order-4", "drop_after")
    client = make_client()
    client.reconcile_all()

    (again,) = client.reconcile(record.key)

    assert again.outcome is payonce.records.ReconcileOutcome.SKIPPED
    assert again.outcome == "skipped", "a str enum: equal to the string it was"
    assert again.after is payonce.IntentState.SUCCEEDED
    assert len(client.journal.reconciliations(record.key)) == 1


def test_an_unreachable_provider_leaves_the_intent_unknown_with_the_attempt_journaled(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = make_unknown(make_client, sandbox, "order-5", "fail_before")
    offline = make_client(
        base_url=f"http://127.0.0.1:{free_port()}",
        retry=payonce.RetryPolicy(max_attempts=2, initial_wait=0),
    )

    (result,) = offline.reconcile("order-5")

    assert (result.outcome, result.after) == ("error", payonce.IntentState.UNKNOWN)
    assert "ConnectError" in result.detail
    journaled = offline.journal.reconciliations(record.key)
    assert [(r.outcome, r.status_code) for r in journaled] == [("error", None)]
    assert offline.journal.get(record.key).lease_owner is None  # type: ignore[union-attr]


def test_a_malformed_status_answer_is_an_error_and_changes_nothing_else(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    odd = payonce.ProviderProfile(
        name="odd", lookup=payonce.providers.Lookup(path="/_sandbox/executions", list_field="data")
    )
    record = make_unknown(make_client, sandbox, "order-6", "drop_after", provider=odd)
    client = make_client(provider=odd)

    (result,) = client.reconcile("order-6")

    assert (result.outcome, result.after) == ("error", payonce.IntentState.UNKNOWN)
    assert "unreadable" in result.detail
    after = client.journal.get(record.key)
    assert after is not None
    assert (after.state, after.response, after.attempt_count) == (
        record.state,
        record.response,
        record.attempt_count,
    )


def test_a_profile_without_a_status_lookup_reconciles_by_resending_under_its_key(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    generic = make_client(provider="generic", retry=payonce.RetryPolicy(max_attempts=1))
    sandbox.script(["fail_before"])
    with pytest.raises(payonce.OutcomeUnknown):
        generic.post("/v1/payments", json=PAYMENT, reference="order-7")

    (result,) = generic.reconcile("order-7")

    assert (result.outcome, result.after) == ("resent", payonce.IntentState.SUCCEEDED)
    assert "no status look-up" in result.detail
    assert [r.outcome for r in generic.journal.reconciliations(result.key)] == ["resent"]
    assert sandbox.store.executions() == {result.key: 1}


def test_intents_of_another_provider_are_left_to_a_client_for_that_provider(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = make_unknown(make_client, sandbox, "order-7b", "fail_before")
    other = make_client(provider="generic")

    assert other.reconcile_all() == []
    (named,) = other.reconcile("order-7b")

    assert (named.outcome, named.after) == ("skipped", payonce.IntentState.UNKNOWN)
    assert "provider profile 'sandbox'" in named.detail
    assert other.journal.reconciliations(record.key) == []


# -- abandon --------------------------------------------------------------------------------


def test_an_operator_can_abandon_an_unknown_intent_for_good(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = make_unknown(make_client, sandbox, "order-8", "fail_before")
    client = make_client()

    abandoned = client.abandon(record.key, reason="refunded by hand, ticket OPS-12")

    assert abandoned.state is payonce.IntentState.ABANDONED
    assert abandoned.abandon_reason == "refunded by hand, ticket OPS-12"
    with pytest.raises(payonce.IntentStateError, match="abandoned by an operator"):
        client.post("/v1/payments", json=PAYMENT, reference="order-8")
    assert client.resume() == []
    assert client.reconcile("order-8")[0].outcome == "skipped"
    assert sandbox.store.total_executions() == 0


def test_a_settled_intent_cannot_be_abandoned(client: payonce.Client) -> None:
    with client.intent("order-9") as op:
        op.post("/v1/payments", json=PAYMENT)
    with pytest.raises(payonce.IntentStateError, match="already succeeded"):
        client.abandon(op.key, reason="oops")  # type: ignore[arg-type]
    assert op.state is payonce.IntentState.SUCCEEDED


# -- the client-side outbox -----------------------------------------------------------------


def test_an_outcome_the_caller_never_recorded_is_found_again_instead_of_paying_twice(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    class CallerCrashed(Exception):
        pass

    def pay_then_crash(client: payonce.Client) -> payonce.Operation:
        with client.intent("order-10") as op:
            op.post("/v1/payments", json=PAYMENT)
            raise CallerCrashed(op)  # e.g. its own database write failed

    with pytest.raises(CallerCrashed) as crashed:
        pay_then_crash(make_client())
    op = crashed.value.args[0]

    after = make_client()  # the restarted caller
    (pending,) = after.unacknowledged()
    assert (pending.key, pending.reference) == (op.key, "order-10")
    with after.intent(pending.reference) as again:
        response = again.post("/v1/payments", json=PAYMENT)
    assert payonce.response_info(response).replayed  # type: ignore[union-attr]
    assert after.unacknowledged() == []
    assert sandbox.store.total_executions() == 1


def test_acknowledgement_can_be_left_to_the_caller(client: payonce.Client) -> None:
    with client.intent("order-11", acknowledge=False) as op:
        op.post("/v1/payments", json=PAYMENT)
    assert [r.key for r in client.unacknowledged()] == [op.key]

    op.acknowledge()

    assert client.unacknowledged() == []
    assert client.journal.get(op.key).acknowledged_at is not None  # type: ignore[arg-type, union-attr]


# -- leases ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_slow_attempt_keeps_its_lease_alive_so_no_one_takes_the_intent_over(
    sandbox: SandboxServer, make_client: MakeClient
) -> None:
    # The provider holds the attempt until the other worker has been refused, well past the
    # lease first taken: only its renewals (every second) keep it. A renewal may come over
    # a second late on a loaded machine and still be in time; the holder's read timeout
    # outlasts the whole hold.
    holder = make_client(lease_seconds=3.0, timeout=60.0)
    other = make_client(lease_seconds=3.0, in_flight_wait=0.0)
    with ThreadPoolExecutor(1) as pool, sandbox.holding():
        paying = pool.submit(holder.post, "/v1/payments", json=PAYMENT, reference="o")
        assert sandbox.wait_held(1), "the payment never reached the provider"
        (claimed,) = holder.journal.find("o")
        assert claimed.lease_expires_at is not None
        while time.time() <= claimed.lease_expires_at:
            time.sleep(0.05)
        (renewed,) = holder.journal.find("o")
        assert renewed.lease_expires_at is not None
        assert renewed.lease_expires_at > claimed.lease_expires_at, "the lease was not renewed"

        with pytest.raises(payonce.IntentInFlight):
            other.post("/v1/payments", json=PAYMENT, reference="o")
        assert other.resume() == []
        assert not paying.done()
    assert paying.result().status_code == 201
    (record,) = holder.journal.find("o")
    assert record.state is payonce.IntentState.SUCCEEDED
    assert record.attempt_count == 1
    assert sandbox.store.total_executions() == 1


def test_the_lease_of_a_dead_worker_is_taken_over_once_it_expires(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    journal = payonce.journal.SQLiteJournal(journal_path)
    client = make_client(journal=journal)
    record = leave_pending(make_client, "order-12")
    # The dead worker had re-claimed it just before dying: its lease is still live.
    store_of(journal).claim_key(
        record.key, owner="dead-host:1:x", now=time.time(), lease_seconds=60
    )
    assert client.resume() == []

    (result,) = make_client(clock=lambda: time.time() + 61).resume()

    assert result.state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {record.key: 1}
    journal.close()


def test_an_intent_first_sent_in_the_future_is_never_resent_but_goes_unknown(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # The worker that sent it ran on a clock an hour ahead of this one.
    record = leave_pending(make_client, "order-clock", clock=lambda: time.time() + 3600)

    (result,) = make_client().resume()

    assert result.state is payonce.IntentState.UNKNOWN
    assert "in the future" in result.detail
    assert sandbox.store.executions() == {record.key: 1}, "sent once, by the first worker"
