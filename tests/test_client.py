"""End-to-end scenarios: a payonce Client, a real journal file, the real sandbox on loopback."""

from __future__ import annotations

import logging
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

import payonce
from helpers.journals import draft_for, raw_transaction, store_of
from helpers.payments import (
    DECLINED,
    PAYMENT,
    DiesAfterSending,
    MakeClient,
    free_port,
    leave_pending,
    paying_in_background,
)
from helpers.proxies import https_server_with_an_untrusted_certificate, portal_in_front_of
from payonce.sandbox import DEFAULT_API_KEY, Faults, SandboxConfig, SandboxServer


def _states(journal_path: Path) -> dict[str, str]:
    with sqlite3.connect(journal_path) as conn:
        return dict(conn.execute("SELECT key, state FROM intents").fetchall())


# -- the happy path and replays -------------------------------------------------------------


def test_a_payment_is_journaled_sent_once_and_settled(
    client: payonce.Client, sandbox: SandboxServer, journal_path: Path
) -> None:
    with client.intent("order-1") as op:
        assert op.key is None, "the key is bound when the intent is first journaled"
        response = op.post("/v1/payments", json=PAYMENT)
        assert op.state is payonce.IntentState.SUCCEEDED

    assert response.status_code == 201
    assert response.json()["amount"] == 4200
    info = payonce.response_info(response)
    assert info is not None
    assert (info.key, info.replayed, info.attempts) == (op.key, False, 1)
    assert sandbox.store.executions() == {op.key: 1}
    assert _states(journal_path) == {op.key: "succeeded"}


def test_each_answered_attempt_journals_the_provider_s_date_beside_this_host_s_time(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    sandbox.advance_clock(3600)  # the provider's clock, an hour ahead of this host's
    sandbox.script(["fail_before", "drop_after"])  # a 503, then an answer lost on the way
    response = client.post("/v1/payments", json=PAYMENT, reference="order-dated")
    key = payonce.response_info(response).key  # type: ignore[union-attr]

    answered_503, lost, settled = client.journal.attempts(key)
    now = time.time()
    for answered in (answered_503, settled):
        assert answered.provider_date is not None
        assert answered.ended_at is not None
        assert abs(answered.provider_date - (now + 3600)) < 10
        assert abs(answered.ended_at - now) < 10
    assert lost.ended_at is not None
    assert lost.provider_date is None


def test_a_settled_intent_replays_from_the_journal_without_the_network(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    first = client.post("/v1/payments", json=PAYMENT, reference="order-1")
    sandbox.stop()  # from here on, any network call would fail

    again = client.post("/v1/payments", json=PAYMENT, reference="order-1")

    info = payonce.response_info(again)
    assert info is not None
    assert info.replayed
    assert again.status_code == first.status_code
    assert again.content == first.content
    assert again.headers["content-type"] == first.headers["content-type"]


def test_the_same_reference_under_two_accounts_is_two_intents(
    make_sandbox: Callable[..., SandboxServer], journal_path: Path
) -> None:
    server = make_sandbox(api_keys={"sk_test_a": "acct_a", "sk_test_b": "acct_b"})
    common = {"base_url": server.url, "provider": "sandbox", "journal": journal_path}
    with (
        payonce.Client(account="acct_a", api_key="sk_test_a", **common) as a,
        payonce.Client(account="acct_b", api_key="sk_test_b", **common) as b,
    ):
        paid_a = a.post("/v1/payments", json=PAYMENT, reference="order-1")
        paid_b = b.post("/v1/payments", json=PAYMENT, reference="order-1")
        replay_b = b.post("/v1/payments", json=PAYMENT, reference="order-1")

    assert paid_a.json()["account"] == "acct_a"
    assert paid_b.json()["account"] == "acct_b"
    assert replay_b.json()["id"] == paid_b.json()["id"] != paid_a.json()["id"]
    assert len(server.store.executions()) == 2
    assert server.store.total_executions() == 2


def test_a_reference_names_one_intent_whatever_endpoint_its_request_goes_to(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    """An intent is its provider, account and reference: the same reference sent to
    another endpoint is that intent asked for another request, refused before sending,
    never a second intent under a new key."""
    client = make_client()
    paid = client.post("/v1/payments", json=PAYMENT, reference="order-7")
    before = client.journal.find("order-7")

    with pytest.raises(payonce.IntentMismatch) as refused:
        client.post("/v1/refunds", json={"payment": paid.json()["id"]}, reference="order-7")

    assert refused.value.key == before[0].key
    assert client.journal.find("order-7") == before
    assert sandbox.store.total_executions() == 1


def test_the_key_survives_a_restart(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    before = make_client()
    first = before.post("/v1/payments", json=PAYMENT, reference="order-7")
    before.close()

    after = make_client()  # a new process would do exactly this
    with after.intent("order-7") as op:
        again = op.post("/v1/payments", json=PAYMENT)

    assert op.key == payonce.response_info(first).key  # type: ignore[union-attr]
    assert again.json() == first.json()
    assert sandbox.store.total_executions() == 1


def test_uuid4_keys_and_caller_supplied_keys_reach_the_provider_as_is(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    uuid_client = make_client(key_format="uuid4")
    with uuid_client.intent("order-u") as op:
        op.post("/v1/payments", json=PAYMENT)
    assert op.key is not None
    assert len(op.key) == 36

    with uuid_client.intent(key="my-own-key-0001") as mine:
        mine.post("/v1/payments", json=PAYMENT)
    assert mine.key == "my-own-key-0001"
    assert set(sandbox.store.executions()) == {op.key, "my-own-key-0001"}


def test_the_generic_profile_sends_the_key_as_a_structured_field_string(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> None:
        seen.append(request.headers["Idempotency-Key"])

    generic = make_client(provider="generic")
    generic._http.event_hooks["request"].append(record)
    with generic.intent("order-g") as op:
        op.post("/v1/payments", json=PAYMENT)
    assert seen == [f'"{op.key}"']
    assert sandbox.store.executions() == {op.key: 1}


def test_an_invalid_caller_key_is_refused_before_anything_is_journaled(
    client: payonce.Client, journal_path: Path
) -> None:
    with pytest.raises(payonce.ConfigurationError, match="printable ASCII"):
        client.post("/v1/payments", json=PAYMENT, key="not a key")
    assert _states(journal_path) == {}


@pytest.mark.parametrize(
    ("reference", "complaint"),
    [
        ("", "empty or blank"),
        ("   ", "empty or blank"),
        ("order-1 ", "whitespace"),
        ("\torder-1", "whitespace"),
        ("order\n1", "control character"),
        (42, "must be a string"),
    ],
)
def test_a_reference_that_would_merge_orders_is_refused_and_the_journal_keeps_what_it_held(
    client: payonce.Client,
    sandbox: SandboxServer,
    journal_path: Path,
    reference: object,
    complaint: str,
) -> None:
    paid = client.post("/v1/payments", json=PAYMENT, reference="order-1")
    held = _states(journal_path)

    with pytest.raises(payonce.ConfigurationError, match=complaint):
        client.post("/v1/payments", json=PAYMENT, reference=reference)  # type: ignore[arg-type]
    with pytest.raises(payonce.ConfigurationError, match=complaint):
        client.intent(reference)  # type: ignore[arg-type]

    assert _states(journal_path) == held
    assert sandbox.store.executions() == {payonce.response_info(paid).key: 1}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"headers": [("X-Order", "42")]}, "takes a mapping"),
        ({"headers": {1: "x"}}, "not a valid HTTP header name"),
        ({"headers": {"Content-Type": 5}}, "is not a str"),
        ({"params": 5}, "take a mapping or a sequence"),
        ({"params": "a=1"}, "take a mapping or a sequence"),
        ({"params": [("a", "1", "extra")]}, "pairs"),
        ({"data": [1, 2]}, "pairs"),
    ],
)
def test_a_malformed_option_is_a_clear_error_and_the_journal_keeps_what_it_held(
    client: payonce.Client,
    sandbox: SandboxServer,
    journal_path: Path,
    options: dict[str, Any],
    complaint: str,
) -> None:
    client.post("/v1/payments", json=PAYMENT, reference="order-held")
    held = _states(journal_path)

    with pytest.raises(payonce.ConfigurationError, match=complaint):
        client.post("/v1/payments", reference="order-bad", **options)

    assert _states(journal_path) == held
    assert sandbox.store.total_executions() == 1


# -- mismatches -----------------------------------------------------------------------------


def test_the_same_intent_with_another_body_is_refused_before_sending(
    client: payonce.Client, sandbox: SandboxServer, journal_path: Path
) -> None:
    client.post("/v1/payments", json=PAYMENT, reference="order-1")

    with pytest.raises(payonce.IntentMismatch) as caught:
        client.post("/v1/payments", json={"amount": 9900, "currency": "eur"}, reference="order-1")

    error = caught.value
    assert error.reference == "order-1"
    assert error.key in str(error)
    assert error.stored_fingerprint != error.new_fingerprint
    assert error.stored_fingerprint[:16] in str(error)
    assert "differs from the one first journaled for it in the body (" in str(error)
    assert "That intent succeeded" in str(error)
    assert sandbox.store.total_executions() == 1
    assert list(_states(journal_path).values()) == ["succeeded"]


def test_a_mismatch_names_the_body_fields_that_differ_never_their_values(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    client.post(
        "/v1/payments", json={**PAYMENT, "metadata": {"cart": "c-1"}}, reference="order-fields"
    )
    with pytest.raises(payonce.IntentMismatch) as caught:
        client.post(
            "/v1/payments",
            json={"amount": PAYMENT["amount"], "currency": "usd", "metadata": {"cart": "c-2"}},
            reference="order-fields",
        )
    message = str(caught.value)
    assert "in the body (fields currency, metadata.cart) (" in message
    assert "c-2" not in message
    assert "usd" not in message
    assert sandbox.store.total_executions() == 1


def _journaled(client: payonce.Client, key: str) -> tuple[Any, ...]:
    return (client.journal.get(key), client.journal.attempts(key))


@pytest.mark.parametrize(
    ("first_headers", "said"),
    [
        (None, "header x-request-id (not sent the first time)"),
        ({"X-Request-Id": "req-first-call"}, "header x-request-id (another value)"),
    ],
)
def test_an_unknown_intent_asked_for_with_another_header_says_which_and_to_reconcile(
    make_client: MakeClient,
    sandbox: SandboxServer,
    first_headers: dict[str, str] | None,
    said: str,
) -> None:
    first = make_client(retry=payonce.RetryPolicy(max_attempts=1))
    sandbox.script(["drop_after"])  # the first attempt executes; its answer is lost
    with pytest.raises(payonce.OutcomeUnknown) as lost:
        first.post("/v1/payments", json=PAYMENT, reference="order-1", headers=first_headers)
    key = lost.value.key
    held = _journaled(first, key)

    # The caller retries the same order, with a per-call tracing header.
    retry = make_client()
    with pytest.raises(payonce.IntentMismatch) as caught:
        retry.post(
            "/v1/payments", json=PAYMENT, reference="order-1", headers={"X-Request-Id": "req-retry"}
        )

    message = str(caught.value)
    assert f"differs from the one first journaled for it in {said} (" in message
    assert "the body" not in message
    assert "req-retry" not in message, "header names, never values"
    assert "req-first-call" not in message
    assert "Nothing was sent. That intent is unknown" in message
    assert "a new reference could pay twice: do not pay this operation again" in message
    assert "keep it" not in message
    assert f"Reconcile it first (`payonce reconcile {key}`)" in message
    assert "Use a new reference" not in message
    assert _journaled(retry, key) == held
    assert sandbox.store.executions() == {key: 1}


def test_a_pending_intent_asked_for_with_another_body_and_query_says_to_call_again(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = leave_pending(make_client, "order-2")
    client = make_client()
    held = _journaled(client, record.key)

    with pytest.raises(payonce.IntentMismatch) as caught:
        client.post(
            "/v1/payments",
            json={**PAYMENT, "amount": 4300},
            params={"expand": "charges"},
            reference="order-2",
        )

    message = str(caught.value)
    assert "differs from the one first journaled for it in the query string, the body (" in (
        message
    )
    assert "That intent is pending: its first request may have reached the provider" in message
    assert "call again with the request first journaled, or run `payonce resume`" in message
    assert _journaled(client, record.key) == held
    assert sandbox.store.executions() == {record.key: 1}


def test_a_second_different_request_in_one_operation_is_its_next_step(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    with client.intent("order-two-steps") as op:
        first = op.post("/v1/payments", json=PAYMENT)
        second = op.post("/v1/payments", json={"amount": 1, "currency": "eur"})
        # The same request as step 1 (its JSON in another order), after every step
        # succeeded and was answered: a second payment on purpose, the next step.
        again = op.post("/v1/payments", json=dict(reversed(PAYMENT.items())))
    assert op.key is not None
    assert payonce.response_info(first).key == op.key  # type: ignore[union-attr]
    assert payonce.response_info(second).key == f"{op.key}-step2"  # type: ignore[union-attr]
    assert not payonce.response_info(again).replayed  # type: ignore[union-attr]
    assert payonce.response_info(again).key == f"{op.key}-step3"  # type: ignore[union-attr]
    assert sandbox.store.total_executions() == 3


def test_a_step_whose_request_changed_between_runs_is_refused_naming_it(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    with client.intent("order-changed-step") as op:
        op.post("/v1/payments", json=PAYMENT)
        op.post("/v1/payments", json={"amount": 1, "currency": "eur"})
    journaled = client.journal.list_intents()

    with client.intent("order-changed-step") as again:
        replay = again.post("/v1/payments", json=PAYMENT)
        with pytest.raises(
            payonce.IntentMismatch,
            match=r"step 2 of intent 'order-changed-step' \(key .*-step2\), POST /v1/payments,",
        ):
            again.post("/v1/payments", json={"amount": 2, "currency": "eur"})
    assert payonce.response_info(replay).replayed  # type: ignore[union-attr]
    assert client.journal.list_intents() == journaled
    assert sandbox.store.total_executions() == 2


def test_a_provider_mismatch_answer_maps_to_intent_mismatch(
    make_client: MakeClient, sandbox: SandboxServer, tmp_path: Path
) -> None:
    # Another journal (another team, a lost file) already used this key for another body.
    other = make_client(journal=tmp_path / "other.db")
    other.post("/v1/payments", json={"amount": 1, "currency": "eur"}, key="shared-key-1")

    ours = make_client()
    with pytest.raises(payonce.IntentMismatch, match="different request"):
        ours.post("/v1/payments", json=PAYMENT, key="shared-key-1")
    assert sandbox.store.total_executions() == 1


# -- retries under one key ------------------------------------------------------------------


@pytest.mark.parametrize(
    "faults",
    [
        ["fail_before"],
        ["fail_after"],
        ["drop_after"],
        ["fail_before", "fail_after"],
        ["rate_limit", "fail_before", "drop_after"],
    ],
)
def test_transient_failures_are_retried_under_one_key_and_execute_once(
    make_client: MakeClient, sandbox: SandboxServer, faults: list[str]
) -> None:
    retries: list[payonce.records.RetryEvent] = []
    client = make_client(on_retry=retries.append)
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(faults)

    with client.intent("order-r") as op:
        response = op.post("/v1/payments", json=PAYMENT)

    assert response.status_code == 201
    assert sandbox.store.executions() == {op.key: 1}
    assert [event.key for event in retries] == [op.key] * len(faults)
    attempts = client.journal.attempts(op.key)  # type: ignore[arg-type]
    assert len(attempts) == len(faults) + 1
    assert attempts[-1].status_code == 201


def test_a_timed_out_request_is_retried_and_the_provider_executes_it_once(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    sandbox.set_faults(Faults(delay_seconds=1.0))
    sandbox.script(["delay"])
    retries: list[payonce.records.RetryEvent] = []
    retry = payonce.RetryPolicy(initial_wait=0.2, max_wait=0.5, max_attempts=10)
    client = make_client(timeout=0.3, retry=retry, on_retry=retries.append)

    with client.intent("order-slow") as op:
        response = op.post("/v1/payments", json=PAYMENT)

    assert response.status_code == 201
    assert retries[0].reason == "ReadTimeout"
    assert retries[0].ambiguous
    assert sandbox.store.executions() == {op.key: 1}


def test_retry_after_is_honoured_and_capped(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    waits: list[float] = []
    client = make_client(on_retry=lambda event: waits.append(event.wait))
    sandbox.set_faults(Faults(retry_after_seconds=1))
    sandbox.script(["rate_limit"])
    client.post("/v1/payments", json=PAYMENT, reference="order-429")
    assert waits == [1.0]

    capped = make_client(
        retry=payonce.RetryPolicy(max_retry_after=0.05), on_retry=lambda e: waits.append(e.wait)
    )
    sandbox.set_faults(Faults(retry_after_seconds=3600))
    sandbox.script(["rate_limit"])
    capped.post("/v1/payments", json=PAYMENT, reference="order-429b")
    assert waits == [1.0, 0.05]
    assert sandbox.store.total_executions() == 2


def test_a_declined_payment_is_stored_and_replayed_as_a_failure(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    with pytest.raises(payonce.ProviderError) as first:
        client.post("/v1/payments", json=DECLINED, reference="order-d")
    assert first.value.status_code == 402
    assert first.value.key is not None

    with pytest.raises(payonce.ProviderError) as again:
        client.post("/v1/payments", json=DECLINED, reference="order-d")

    assert payonce.response_info(again.value.response).replayed  # type: ignore[union-attr]
    assert again.value.response.json() == first.value.response.json()
    assert sandbox.store.total_executions() == 1
    assert client.journal.get(first.value.key).state is payonce.IntentState.FAILED  # type: ignore[union-attr]


def test_a_block_that_caught_a_replayed_refusal_acknowledges_it_as_it_would_a_first_one(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    # A refusal the first block did not get to acknowledge (it ended by raising) waits in
    # unacknowledged(); a later block that sees it replayed and deals with it (catches the
    # error, ends normally) has seen the settled outcome, as a block seeing it first would.
    with pytest.raises(payonce.ProviderError), client.intent("order-r") as op:
        op.post("/v1/payments", json=DECLINED)
    assert [r.reference for r in client.unacknowledged()] == ["order-r"]

    with client.intent("order-r") as again:
        with pytest.raises(payonce.ProviderError):
            again.post("/v1/payments", json=DECLINED)
        assert again.state is payonce.IntentState.FAILED
        assert again.key == client.journal.find("order-r")[0].key

    assert client.unacknowledged() == []
    assert sandbox.store.total_executions() == 1


def test_exhausted_ambiguous_retries_leave_the_intent_unknown_and_never_resend_it(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    client = make_client(retry=payonce.RetryPolicy(max_attempts=3, initial_wait=0.001))
    sandbox.script(["fail_before"] * 3)

    with pytest.raises(payonce.OutcomeUnknown) as caught:
        client.post("/v1/payments", json=PAYMENT, reference="order-u")

    error = caught.value
    assert error.reference == "order-u"
    assert "HTTP 503" in error.reason
    assert "payonce reconcile" in str(error)
    record = client.journal.get(error.key)  # type: ignore[arg-type]
    assert record is not None
    assert record.state is payonce.IntentState.UNKNOWN
    assert record.unknown_reason == error.reason

    sandbox.stop()  # a blind resend would now fail differently: it must not be attempted
    with pytest.raises(payonce.OutcomeUnknown):
        client.post("/v1/payments", json=PAYMENT, reference="order-u")
    assert client.journal.get(error.key).attempt_count == 3  # type: ignore[union-attr]


def test_a_request_that_never_left_stays_pending_and_is_sent_later_under_the_same_key(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    unreachable = make_client(base_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(
        payonce.ProviderUnavailable, match="never executed by the provider"
    ) as caught:
        unreachable.post("/v1/payments", json=PAYMENT, reference="order-p")
    key = caught.value.key
    assert unreachable.journal.get(key).state is payonce.IntentState.PENDING  # type: ignore[arg-type, union-attr]
    assert sandbox.store.total_executions() == 0

    reachable = make_client()  # e.g. the provider is back, or after a restart
    with reachable.intent("order-p") as op:
        op.post("/v1/payments", json=PAYMENT)
    assert op.key == key
    assert sandbox.store.executions() == {key: 1}


# -- concurrency in one process -------------------------------------------------------------


def test_two_threads_on_one_intent_never_have_two_requests_in_flight(
    make_sandbox: Callable[..., SandboxServer], make_client: MakeClient
) -> None:
    slow = make_sandbox(processing_seconds=0.5)
    client = make_client(base_url=slow.url)
    barrier = threading.Barrier(2)
    results: list[httpx.Response | Exception] = []

    def pay() -> None:
        barrier.wait()
        try:
            results.append(client.post("/v1/payments", json=PAYMENT, reference="order-t"))
        except payonce.IntentInFlight as exc:
            results.append(exc)

    threads = [threading.Thread(target=pay) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    responses = [r for r in results if isinstance(r, httpx.Response)]
    assert responses, results
    assert {r.json()["id"] for r in responses} == {responses[0].json()["id"]}
    assert slow.store.total_executions() == 1
    (record,) = client.journal.find("order-t")
    assert record.attempt_count == 1, "the provider never saw a second request (no 409)"


def test_a_worker_that_cannot_wait_gets_intent_in_flight(
    sandbox: SandboxServer, make_client: MakeClient
) -> None:
    patient = make_client(timeout=60.0)  # its answer outlasts the block
    impatient = make_client(in_flight_wait=0.0)
    with (
        paying_in_background(patient, "o", sandbox),
        pytest.raises(payonce.IntentInFlight, match="another worker"),
    ):
        impatient.post("/v1/payments", json=PAYMENT, reference="o")
    assert sandbox.store.total_executions() == 1


# -- key lifetime ---------------------------------------------------------------------------


@pytest.mark.parametrize(("hours_later", "resent"), [(1, True), (23, False)])
def test_an_intent_that_may_have_executed_is_resent_only_within_the_key_lifetime(
    make_client: MakeClient, sandbox: SandboxServer, hours_later: int, resent: bool
) -> None:
    record = leave_pending(make_client, "order-k")
    assert sandbox.store.total_executions() == 1

    later = make_client(clock=lambda: time.time() + hours_later * 3600)
    if resent:
        response = later.post("/v1/payments", json=PAYMENT, reference="order-k")
        assert response.status_code == 201
        assert payonce.response_info(response).provider_replayed  # type: ignore[union-attr]
    else:
        with pytest.raises(payonce.OutcomeUnknown, match="key lifetime"):
            later.post("/v1/payments", json=PAYMENT, reference="order-k")
        assert later.journal.get(record.key).state is payonce.IntentState.UNKNOWN  # type: ignore[union-attr]
    assert sandbox.store.executions() == {record.key: 1}


# -- stored responses -----------------------------------------------------------------------


def test_a_response_over_the_size_cap_settles_from_status_and_headers_only(
    make_client: MakeClient, sandbox: SandboxServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(max_stored_response_bytes=16)
    with caplog.at_level(logging.WARNING, logger="payonce"):
        live = client.post("/v1/payments", json=PAYMENT, reference="order-big")
    assert live.json()["amount"] == 4200, "the caller still gets the whole body this time"
    assert payonce.response_info(live).body_stored is False  # type: ignore[union-attr]
    assert "exceeds the 16-byte cap" in caplog.text

    # Called again, its answer is never an empty body: the journal has none, so the same
    # request goes again under the same key, and the provider replays its stored answer.
    replay = client.post("/v1/payments", json=PAYMENT, reference="order-big")
    info = payonce.response_info(replay)
    assert info is not None
    assert (info.replayed, info.provider_replayed, info.body_stored) == (True, True, False)
    assert (replay.status_code, replay.json()) == (201, live.json())
    assert sandbox.store.total_executions() == 1


LATER = 3 * 24 * 3600.0
"""Past every profile's key lifetime: a resend under the key could execute again."""


def test_a_replay_without_its_body_past_the_key_s_lifetime_answers_with_the_look_up_s_record(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    live = make_client(max_stored_response_bytes=16).post(
        "/v1/payments", json=PAYMENT, reference="order-big-later"
    )
    later = make_client(max_stored_response_bytes=16, clock=lambda: time.time() + LATER)
    replay = later.post("/v1/payments", json=PAYMENT, reference="order-big-later")
    assert replay.status_code == 201
    assert replay.json()["id"] == live.json()["id"]  # the provider's record, as it stands
    assert payonce.response_info(replay).replayed  # type: ignore[union-attr]
    assert sandbox.store.total_executions() == 1


def test_a_replay_without_its_body_asks_the_status_look_up_before_sending_anything_again(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # The intent certainly executed: a resend under its key would execute it again at a
    # provider that forgot the key early, so the look-up, which only reads, comes first.
    client = make_client(max_stored_response_bytes=16)
    live = client.post("/v1/payments", json=PAYMENT, reference="order-big-look")
    sent: list[httpx.Request] = []
    client._http.event_hooks["request"].append(sent.append)
    replay = client.post("/v1/payments", json=PAYMENT, reference="order-big-look")
    assert (replay.status_code, replay.json()["id"]) == (201, live.json()["id"])
    assert payonce.response_info(replay).replayed  # type: ignore[union-attr]
    assert [request.method for request in sent] == ["GET"], "looked up, never sent again"
    assert sandbox.store.total_executions() == 1


def test_a_replay_without_its_body_and_no_look_up_is_the_provider_s_replay_under_its_key(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    sandbox_profile = payonce.providers.get_profile("sandbox")
    blind = attrs.evolve(sandbox_profile, name="sandbox-blind-replay", lookup=None)
    client = make_client(provider=blind, max_stored_response_bytes=16)
    live = client.post("/v1/payments", json=PAYMENT, reference="order-big-again")
    replay = client.post("/v1/payments", json=PAYMENT, reference="order-big-again")
    assert (replay.status_code, replay.json()["id"]) == (201, live.json()["id"])
    assert payonce.response_info(replay).replayed  # type: ignore[union-attr]
    assert sandbox.store.execution_count(payonce.response_info(live).key) == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("faults", [["fail_before"], ["rate_limit", "fail_before"]])
def test_a_replay_without_its_body_is_asked_again_through_a_passing_failure(
    make_client: MakeClient, sandbox: SandboxServer, faults: list[str]
) -> None:
    # A reviewer's case: one 503 on the way to the provider's replay cost the caller its
    # answer, though the key was seconds old; it is asked again, as any attempt is.
    sandbox_profile = payonce.providers.get_profile("sandbox")
    blind = attrs.evolve(sandbox_profile, name="sandbox-blind-retried", lookup=None)
    sandbox.set_faults(Faults(retry_after_seconds=0))
    client = make_client(provider=blind, max_stored_response_bytes=16)
    live = client.post("/v1/payments", json=PAYMENT, reference="order-big-retried")
    sandbox.script(faults)
    replay = client.post("/v1/payments", json=PAYMENT, reference="order-big-retried")
    assert (replay.status_code, replay.json()["id"]) == (201, live.json()["id"])
    assert sandbox.store.execution_count(payonce.response_info(live).key) == 1  # type: ignore[union-attr]


def test_a_replay_without_its_body_is_never_got_again_at_another_origin(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # Red-teams' case: the request that certainly executed was sent again under its key to
    # another origin (a provider there executed it again; Square's answer was then handed
    # back as the replay). It is refused, and nothing is sent.
    sandbox_profile = payonce.providers.get_profile("sandbox")
    blind = attrs.evolve(sandbox_profile, name="sandbox-blind-moved", lookup=None)
    make_client(provider=blind, max_stored_response_bytes=16).post(
        "/v1/payments", json=PAYMENT, reference="order-big-moved"
    )
    with SandboxServer(SandboxConfig()) as other:
        moved = make_client(provider=blind, max_stored_response_bytes=16, base_url=other.url)
        with pytest.raises(payonce.IntentStateError) as refused:
            moved.post("/v1/payments", json=PAYMENT, reference="order-big-moved")
        assert other.store.total_executions() == 0
    assert "this client's base URL is http://127.0.0.1:" in str(refused.value)
    assert "a resend there could execute it again" in str(refused.value)
    assert sandbox.store.total_executions() == 1


def test_a_fresh_execution_is_never_handed_back_as_a_replay_s_answer(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # A red-team's case: a provider that forgot the key executed the request afresh, and
    # that new payment was handed back as the intent's answer, marked replayed. The sandbox
    # marks every replay; here it forgets its keys (a reset) while the client's window is open.
    sandbox_profile = payonce.providers.get_profile("sandbox")
    blind = attrs.evolve(sandbox_profile, name="sandbox-blind-fresh", lookup=None)
    client = make_client(provider=blind, max_stored_response_bytes=16)
    client.post("/v1/payments", json=PAYMENT, reference="order-big-fresh")
    sandbox.store.reset()
    with pytest.raises(payonce.IntentStateError) as refused:
        client.post("/v1/payments", json=PAYMENT, reference="order-big-fresh")
    assert sandbox.store.total_executions() == 1, "the forgetful provider executed it again"
    assert "without marking it a replay" in str(refused.value)
    assert "may have executed it a second time" in str(refused.value)


def test_a_replay_without_its_body_and_no_way_to_get_it_again_is_an_error_never_empty(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # No status look-up, and the key's lifetime over: nothing could answer without a risk
    # of executing it twice, so the caller is told so, and nothing is sent.
    sandbox_profile = payonce.providers.get_profile("sandbox")
    blind = attrs.evolve(sandbox_profile, name="sandbox-blind", lookup=None)
    options = {"provider": blind, "max_stored_response_bytes": 16}
    make_client(**options).post("/v1/payments", json=PAYMENT, reference="order-big-blind")
    later = make_client(**options, clock=lambda: time.time() + LATER)
    journaled = later.journal.list_intents()
    with pytest.raises(payonce.IntentStateError) as refused:
        later.post("/v1/payments", json=PAYMENT, reference="order-big-blind")
    # It names the intent, what it came to, why no answer could be had, and what to do.
    for said in (
        "(reference 'order-big-blind') succeeded (HTTP 201), but its answer's body",
        "beyond the provider's key lifetime",
        "has no status look-up",
        "raise max_stored_response_bytes",
    ):
        assert said in str(refused.value)
    assert later.journal.list_intents() == journaled
    assert sandbox.store.total_executions() == 1


def test_turning_tls_verification_off_is_explicit_and_logged(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="payonce"):
        make_client(verify=False)
    assert "verification is OFF" in caplog.text


def test_an_unknown_provider_is_a_configuration_error(sandbox: SandboxServer) -> None:
    with pytest.raises(payonce.ConfigurationError, match="known profiles"):
        payonce.Client(base_url=sandbox.url, provider="nope", api_key=DEFAULT_API_KEY)


def test_credentials_in_the_base_url_are_refused_before_anything_is_stored(
    journal_path: Path,
) -> None:
    with pytest.raises(payonce.ConfigurationError, match="must not carry credentials"):
        payonce.Client(
            base_url="http://sk_live_x:pw@127.0.0.1:1", api_key="k", journal=journal_path
        )
    assert not journal_path.exists()


def test_extra_headers_are_part_of_the_intent(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    connected = {"X-Connected-Account": "acct_child_1"}
    client.post("/v1/payments", json=PAYMENT, reference="order-h", headers=connected)

    with pytest.raises(payonce.IntentMismatch):
        client.post(
            "/v1/payments",
            json=PAYMENT,
            reference="order-h",
            headers={"X-Connected-Account": "acct_child_2"},
        )
    replay = client.post("/v1/payments", json=PAYMENT, reference="order-h", headers=connected)
    assert payonce.response_info(replay).replayed  # type: ignore[union-attr]
    assert sandbox.store.total_executions() == 1


def test_an_interrupted_attempt_gives_its_lease_back(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    class Interrupting(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            super().handle_request(request).close()
            raise KeyboardInterrupt

    interrupted = make_client(transport=Interrupting())
    with pytest.raises(KeyboardInterrupt):
        interrupted.post("/v1/payments", json=PAYMENT, reference="order-i")
    (record,) = interrupted.journal.find("order-i")
    assert record.lease_owner is None
    assert record.state is payonce.IntentState.PENDING

    again = make_client(in_flight_wait=0.0).post("/v1/payments", json=PAYMENT, reference="order-i")
    assert payonce.response_info(again).provider_replayed  # type: ignore[union-attr]
    assert sandbox.store.total_executions() == 1


@pytest.mark.parametrize(
    ("journal", "complaint"), [(42, "not int"), ("mysql://db/payments", "unsupported journal URL")]
)
def test_a_journal_option_payonce_cannot_use_is_a_clear_error(
    sandbox: SandboxServer, journal: object, complaint: str
) -> None:
    with pytest.raises(payonce.ConfigurationError, match=complaint):
        payonce.Client(base_url=sandbox.url, api_key="k", journal=journal)  # type: ignore[arg-type]
    assert sandbox.store.total_executions() == 0


# -- refusals that executed nothing ---------------------------------------------------------


def test_a_wrong_api_key_leaves_the_order_payable_under_the_same_key_once_fixed(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    wrong = make_client(api_key="sk_test_revoked_0000")
    with pytest.raises(payonce.AuthenticationError, match="stays pending") as refused:
        wrong.post("/v1/payments", json=PAYMENT, reference="order-auth")
    assert isinstance(refused.value, payonce.ProviderError)
    assert refused.value.status_code == 401
    record = wrong.journal.get(refused.value.key)
    assert record is not None
    assert (record.state, record.lease_owner) == (payonce.IntentState.PENDING, None)
    assert sandbox.store.total_executions() == 0

    again = make_client().post("/v1/payments", json=PAYMENT, reference="order-auth")

    assert again.status_code == 201
    assert sandbox.store.executions() == {refused.value.key: 1}, "the same key, once"


def test_resume_with_a_wrong_key_leaves_the_intents_pending_for_the_right_one(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    left = [leave_pending(make_client, f"order-r{n}") for n in range(2)]

    refused = make_client(api_key="sk_test_revoked_0000").resume()

    assert [r.state for r in refused] == [payonce.IntentState.PENDING] * 2
    # Not the key that sent them: never sent with it (a provider keeps idempotency keys
    # per account), each skipped, named with the fingerprint of the key that did.
    wanted = payonce.credentials.credential_fingerprint(DEFAULT_API_KEY)
    assert all("no key here has that fingerprint" in r.detail for r in refused)
    assert all(wanted in r.detail for r in refused)
    settled = make_client().resume()
    assert [r.state for r in settled] == [payonce.IntentState.SUCCEEDED] * 2
    assert sandbox.store.executions() == {record.key: 1 for record in left}


# -- answers that are not the provider's ------------------------------------------------------


def test_a_portal_page_is_never_taken_for_the_provider_s_success(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    with portal_in_front_of(sandbox.url, turns=2) as proxy:
        client = make_client(base_url=proxy.url)
        paid = client.post("/v1/payments", json=PAYMENT, reference="order-portal")

    assert paid.status_code == 201
    assert paid.json()["status"] == "succeeded", "the provider's own answer settled it"
    info = payonce.response_info(paid)
    assert info is not None
    assert info.attempts == 3
    first, _, third = client.journal.attempts(info.key)
    assert (first.status_code, first.ambiguous) == (200, True)
    assert first.error is not None
    assert "not the provider's answer: a text/html answer" in first.error
    assert "hotel Wi-Fi" in first.error, "what was received is kept for diagnosis"
    assert third.status_code == 201
    assert sandbox.store.executions() == {info.key: 1}


def test_a_portal_that_never_lets_go_leaves_the_intent_unknown_not_succeeded(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    with portal_in_front_of(sandbox.url, turns=100) as proxy:
        behind_portal = make_client(base_url=proxy.url)
        with pytest.raises(payonce.OutcomeUnknown, match="not the provider's answer") as caught:
            behind_portal.post("/v1/payments", json=PAYMENT, reference="order-captive")

    direct = make_client()
    (looked_up,) = direct.reconcile("order-captive")
    assert (looked_up.outcome, looked_up.after) == ("not_found", payonce.IntentState.PENDING)
    (resumed,) = direct.resume()
    assert resumed.state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {caught.value.key: 1}


# -- refused before the write-ahead -----------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "complaint"),
    [
        ({"headers": {"X-Note": "a\r\nInjected: yes"}}, "X-Note"),
        ({"headers": {"X-Note": "nul\x00"}}, "X-Note"),
        ({"headers": {"X-Note": "café"}}, "X-Note"),
        ({"headers": {"X-Note": "padded "}}, "X-Note' starts or ends with whitespace"),
        ({"headers": {"X-Note": "\ttabbed"}}, "X-Note' starts or ends with whitespace"),
        ({"headers": {"Bad Name": "x"}}, "header name"),
        ({"path": "/v1/payments\r\nX: y"}, "control character"),
        ({"content": "text, not bytes"}, "content= takes bytes"),
        ({"json": "deep"}, "nested too deeply"),
    ],
)
def test_a_request_no_http_stack_could_send_is_refused_before_it_is_journaled(
    client: payonce.Client, sandbox: SandboxServer, call: dict[str, Any], complaint: str
) -> None:
    if call.get("json") == "deep":
        deep: list[Any] = []
        for _ in range(100_000):
            deep = [deep]
        call = {"json": deep}
    path = call.pop("path", "/v1/payments")

    with pytest.raises(payonce.ConfigurationError, match=complaint):
        client.post(path, reference="order-bad", **call)

    assert client.journal.list_intents() == [], "nothing journaled, no reference burnt"
    assert sandbox.store.total_executions() == 0
    assert client.post("/v1/payments", json=PAYMENT, reference="order-bad").status_code == 201


def test_an_api_key_no_header_can_carry_is_refused_at_construction_without_quoting_it(
    make_client: MakeClient,
) -> None:
    with pytest.raises(payonce.ConfigurationError, match="API key") as refused:
        make_client(api_key="sk_test_secret\nvalue")
    assert "sk_test_secret" not in str(refused.value)


class _RefusesLocally(httpx.HTTPTransport):
    """An HTTP stack that refuses to write the request (as h11 does a header it rejects)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise httpx.LocalProtocolError("refused to send", request=request)


def test_a_request_the_http_stack_refused_to_send_leaves_the_intent_pending_and_free(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    refusing = make_client(transport=_RefusesLocally())
    with pytest.raises(httpx.LocalProtocolError):
        refusing.post("/v1/payments", json=PAYMENT, reference="order-local")

    (record,) = refusing.journal.find("order-local")
    (attempt,) = refusing.journal.attempts(record.key)
    assert (record.state, record.lease_owner) == (payonce.IntentState.PENDING, None)
    assert attempt.ambiguous is False, "it provably never left"
    assert make_client().post("/v1/payments", json=PAYMENT, reference="order-local").is_success
    assert sandbox.store.executions() == {record.key: 1}


# -- secrets and tampering --------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", ["Authorization", "Proxy-Authorization", "X-Api-Key", "Cookie", "Idempotency-Key"]
)
def test_a_secret_header_given_with_a_request_is_refused_never_journaled(
    client: payonce.Client, sandbox: SandboxServer, header: str
) -> None:
    with pytest.raises(payonce.ConfigurationError, match=header) as refused:
        client.post(
            "/v1/payments", json=PAYMENT, reference="order-s", headers={header: "hunter2-secret"}
        )
    assert "hunter2" not in str(refused.value)
    assert client.journal.list_intents() == []
    assert sandbox.store.total_executions() == 0


def test_a_profile_names_its_own_secret_headers(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    profile = payonce.ProviderProfile(
        name="sandbox",
        lookup=payonce.providers.Lookup(path="/v1/payments"),
        secret_header_names=frozenset({"X-Signing-Secret"}),
    )
    client = make_client(provider=profile)
    with pytest.raises(payonce.ConfigurationError, match="x-signing-secret"):
        client.post("/v1/payments", json=PAYMENT, headers={"x-signing-secret": "s3cr3t"})


@pytest.mark.parametrize(
    "edit",
    [
        'UPDATE intents SET request_body = CAST(\'{"amount":999999,"currency":"eur"}\' AS BLOB)',
        "UPDATE intents SET url = url || '?to=attacker'",
        'UPDATE intents SET request_headers = \'[["stripe-account", "acct_other"]]\'',
    ],
)
def test_a_journaled_request_edited_by_hand_is_never_resent(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path, edit: str
) -> None:
    record = leave_pending(make_client, "order-t")
    with sqlite3.connect(journal_path) as conn:
        conn.execute(edit)

    with pytest.raises(payonce.JournalError, match="edited by hand or damaged"):
        make_client().post("/v1/payments", json=PAYMENT, reference="order-t")
    (result,) = make_client().resume()

    assert "edited by hand or damaged" in result.detail
    assert sandbox.store.executions() == {record.key: 1}, "sent once, before the edit"
    after = make_client().journal.get(record.key)
    assert after is not None
    assert (after.state, after.lease_owner) == (payonce.IntentState.PENDING, None)


@pytest.mark.parametrize(
    "call",
    [
        {"data": {"amount": "4200", "currency": "eur", "note": "café & crème"}},
        {
            "content": b"amount=1&b=2",
            "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        },
        {"json": {"amount": 4200, "nested": {"z": 1, "a": [1, 2]}}, "params": {"expand": "x"}},
        {"json": PAYMENT, "headers": {"Stripe-Account": "acct_1"}},
    ],
)
def test_an_untouched_journaled_request_is_resent_as_it_is(
    make_client: MakeClient, sandbox: SandboxServer, call: dict[str, Any]
) -> None:
    dying = make_client(transport=DiesAfterSending())
    with pytest.raises(RuntimeError, match="worker died"):
        dying.post("/v1/payments?mode=test", reference="order-u", **call)

    (result,) = make_client().resume()

    assert "edited" not in result.detail
    resent = make_client().journal.attempts(result.key)
    assert len(resent) == 2, "the journaled request was resent as it was"
    assert resent[1].status_code is not None, "and answered by the provider"


# -- transport security -----------------------------------------------------------------------


def test_a_certificate_failure_is_called_one(make_client: MakeClient) -> None:
    with https_server_with_an_untrusted_certificate() as url:
        client = make_client(base_url=url, retry=payonce.RetryPolicy(max_attempts=1))
        with pytest.raises(payonce.ProviderUnavailable, match="TLS certificate") as refused:
            client.post("/v1/payments", json=PAYMENT, reference="order-tls")

    assert "unable to get local issuer certificate" in str(refused.value)
    (record,) = client.journal.find("order-tls")
    assert (record.state, record.lease_owner) == (payonce.IntentState.PENDING, None)


@pytest.mark.parametrize(
    ("base_url", "warned"),
    [
        ("http://psp.example.com", True),
        ("http://10.1.2.3:8080", True),
        ("http://127.0.0.1:8080", False),
        ("http://localhost:8080", False),
        ("http://[::1]:8080", False),
        ("https://psp.example.com", False),
    ],
)
def test_plain_http_to_another_host_is_warned_about(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture, base_url: str, warned: bool
) -> None:
    make_client(base_url=base_url)
    said = any("travel unencrypted" in r.getMessage() for r in caplog.records)
    assert said is warned


# -- base URLs with a path of their own --------------------------------------------------------


class RecordsUrls(httpx.BaseTransport):
    """Answers every request 201 and keeps the URL it was sent to; a HEAD, which only asks
    the provider's time (before a resend of what may have executed), apart."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.clock_reads: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = self.clock_reads if request.method == "HEAD" else self.urls
        sent.append(str(request.url))
        return httpx.Response(201, json={"id": "pay_1", "status": "succeeded"})


def test_a_base_url_with_a_path_sends_to_that_path_once_not_twice(
    make_client: MakeClient,
) -> None:
    """Adyen's checkout API lives under a version path: https://checkout-test.adyen.com/v71."""
    provider = RecordsUrls()
    client = make_client(base_url="https://checkout.test/v71", transport=provider)

    client.post("/payments", json=PAYMENT, params={"note": "a b"}, reference="order-v71")

    assert provider.urls == ["https://checkout.test/v71/payments?note=a+b"]


class DiesMidAttempt(httpx.BaseTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise RuntimeError("worker died mid-attempt")


def test_a_pending_intent_is_resumed_at_the_new_host_under_the_same_path(
    make_client: MakeClient,
) -> None:
    old_host = make_client(base_url="https://old.test/v71", transport=DiesMidAttempt())
    with pytest.raises(RuntimeError, match="worker died"):
        old_host.post("/v1/payments", json=PAYMENT, reference="order-moved")
    (record,) = old_host.journal.find("order-moved")
    provider = RecordsUrls()

    (resumed,) = make_client(base_url="https://new.test/v71", transport=provider).resume()

    assert resumed.state is payonce.IntentState.SUCCEEDED
    assert resumed.key == record.key
    assert provider.urls == ["https://new.test/v71/v1/payments"]
    assert provider.clock_reads == ["https://new.test/v71"], "its time asked at the new host"


def test_each_attempt_journals_the_url_it_was_sent_to_never_with_userinfo(
    make_client: MakeClient,
) -> None:
    old_host = make_client(base_url="https://old.test/v71", transport=DiesMidAttempt())
    with pytest.raises(RuntimeError, match="worker died"):
        old_host.post("/v1/payments", json=PAYMENT, params={"n": "1"}, reference="order-sent")
    new_host = make_client(base_url="https://new.test/v71", transport=RecordsUrls())

    (resumed,) = new_host.resume()

    assert [a.sent_to for a in new_host.journal.attempts(resumed.key)] == [
        "https://old.test/v71/v1/payments?n=1",
        "https://new.test/v71/v1/payments?n=1",
    ]
    # An intent journaled with credentials in its URL (no client takes such a base URL):
    # only its path is sent, and recorded.
    draft = attrs.evolve(draft_for(1), url="https://user:secret@old.test/v71/v1/payments")
    store_of(new_host.journal).claim(draft, owner="gone", now=time.time(), lease_seconds=30)
    store_of(new_host.journal).release(draft.key, owner="gone")
    (again,) = new_host.resume()
    assert [a.sent_to for a in new_host.journal.attempts(again.key)] == [
        None,  # journaled by the store alone, as before schema 7
        "https://new.test/v71/v1/payments",
    ]


def test_a_first_send_dated_by_a_clock_ahead_cannot_stretch_the_window_once_it_is_set_right(
    make_client: MakeClient, journal_path: Path
) -> None:
    # 20 minutes ago, this host's clock 10 minutes ahead: the first send (never answered)
    # is dated 10 minutes ago by the wall clock, inside the 15 minutes within which payonce
    # resends an assumed lifetime's intent on its own. Its attempt also carries this host's
    # boot clock, which no wall-clock step moves: moved back 20 minutes as the wall clock was.
    options: dict[str, Any] = {"provider": "generic", "base_url": "https://pay.test"}
    ahead = make_client(**options, transport=DiesMidAttempt(), clock=lambda: time.time() - 600)
    with pytest.raises(RuntimeError, match="worker died"):
        ahead.post("/v1/payments", json=PAYMENT, reference="order-clock-ahead")
    (record,) = ahead.journal.find("order-clock-ahead")
    (attempt,) = ahead.journal.attempts(record.key)
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    # The machine is its name and its machine id together (a name alone can be shared).
    machine_id_file = Path("/etc/machine-id")
    machine_id = machine_id_file.read_text().strip() if machine_id_file.exists() else ""
    machine = f"{socket.gethostname()}@{machine_id}" if machine_id else ""
    assert attempt.boot == f"{machine}/{boot_id}"
    assert attempt.boottime is not None
    assert 0 < attempt.boottime <= time.clock_gettime(time.CLOCK_BOOTTIME)
    with raw_transaction(str(journal_path)) as tx:
        tx.execute("UPDATE attempts SET boottime = boottime - 1200 WHERE key = ?", (record.key,))
    provider = RecordsUrls()

    (resumed,) = make_client(**options, transport=provider).resume()

    assert resumed.state is payonce.IntentState.UNKNOWN
    assert provider.urls == [], "never resent"
    unknown = make_client(**options).journal.get(record.key)
    assert unknown is not None
    assert unknown.unknown_reason is not None
    assert "first sent 1200s ago" in unknown.unknown_reason


def test_an_intent_journaled_at_a_host_whose_name_extends_the_base_url_s_moves_to_it(
    make_client: MakeClient,
) -> None:
    old_host = make_client(base_url="https://pay.test.old", transport=DiesMidAttempt())
    with pytest.raises(RuntimeError, match="worker died"):
        old_host.post("/v1/pay ments/é", json=PAYMENT, params={"q": "a/b"}, reference="o-e")
    provider = RecordsUrls()

    (resumed,) = make_client(base_url="https://pay.test", transport=provider).resume()

    assert resumed.state is payonce.IntentState.SUCCEEDED
    assert provider.urls == ["https://pay.test/v1/pay%20ments/%C3%A9?q=a%2Fb"]
    assert provider.clock_reads == ["https://pay.test"]
