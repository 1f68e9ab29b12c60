"""The eight ways naive idempotency breaks (docs/guarantees.md), one end-to-end test each.

Real sandbox over loopback, real journal. Deeper variations of each case live in
test_client.py, test_recovery.py, test_crash.py and test_journal.py; these are the
headline scenarios, named after the cases.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import payonce
from helpers.payments import PAYMENT, DiesAfterSending, MakeClient
from payonce.sandbox import SandboxServer


def test_case_1_identical_retry_after_success_is_replayed_without_the_network(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    first = client.post("/v1/payments", json=PAYMENT, reference="order-1")
    sandbox.stop()

    again = client.post("/v1/payments", json=PAYMENT, reference="order-1")

    assert again.json() == first.json()
    assert payonce.response_info(again).replayed  # type: ignore[union-attr]


def test_case_2_a_concurrent_retry_while_the_first_is_in_flight_is_not_sent(
    make_sandbox: Callable[..., SandboxServer], make_client: MakeClient
) -> None:
    slow = make_sandbox(processing_seconds=0.5)
    first_worker, second_worker = make_client(base_url=slow.url), make_client(base_url=slow.url)
    results: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def pay(client: payonce.Client) -> None:
        barrier.wait()
        results.append(client.post("/v1/payments", json=PAYMENT, reference="order-2"))

    threads = [threading.Thread(target=pay, args=(c,)) for c in (first_worker, second_worker)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 2
    assert results[0].json()["id"] == results[1].json()["id"]
    assert slow.store.total_executions() == 1
    (record,) = first_worker.journal.find("order-2")
    assert record.attempt_count == 1, "the provider never saw the second worker's request"


def test_case_3_the_same_key_with_a_different_body_is_refused_before_sending(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    client.post("/v1/payments", json=PAYMENT, reference="order-3")
    with pytest.raises(payonce.IntentMismatch, match="Nothing was sent"):
        client.post("/v1/payments", json={"amount": 1, "currency": "eur"}, reference="order-3")
    assert sandbox.store.total_executions() == 1


def test_case_4_a_caller_that_crashed_before_recording_the_outcome_finds_it_on_restart(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    caller = make_client()
    with caller.intent("order-4", acknowledge=False) as op:
        op.post("/v1/payments", json=PAYMENT)
    # ... the caller dies here, before its own database recorded the payment.

    restarted = make_client()
    (outstanding,) = restarted.unacknowledged()
    assert outstanding.reference == "order-4"
    response = restarted.post("/v1/payments", json=PAYMENT, reference="order-4")
    assert payonce.response_info(response).replayed  # type: ignore[union-attr]
    assert restarted.unacknowledged() == []
    assert sandbox.store.total_executions() == 1


def test_case_5_an_unknown_outcome_is_reconciled_not_replayed_blindly(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    impatient = make_client(retry=payonce.RetryPolicy(max_attempts=1))
    sandbox.script(["drop_after"])  # executed, but the answer never arrives
    with pytest.raises(payonce.OutcomeUnknown):
        impatient.post("/v1/payments", json=PAYMENT, reference="order-5")

    (result,) = make_client().reconcile("order-5")

    assert (result.outcome, result.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert sandbox.store.total_executions() == 1


def test_case_6_a_retry_after_the_key_expired_is_reconciled_instead_of_resent(
    make_sandbox: Callable[..., SandboxServer], make_client: MakeClient
) -> None:
    provider = make_sandbox(key_lifetime=3600.0)
    profile = payonce.ProviderProfile(
        name="hourly", key_lifetime=3600.0, lookup=payonce.providers.Lookup(path="/v1/payments")
    )
    dying = make_client(base_url=provider.url, provider=profile, transport=DiesAfterSending())
    with pytest.raises(RuntimeError):
        dying.post("/v1/payments", json=PAYMENT, reference="order-6")
    provider.advance_clock(2 * 3600)  # the provider forgot the key; a resend would pay again

    later = make_client(
        base_url=provider.url, provider=profile, clock=lambda: time.time() + 2 * 3600
    )
    with pytest.raises(payonce.OutcomeUnknown, match="key lifetime"):
        later.post("/v1/payments", json=PAYMENT, reference="order-6")
    (result,) = later.reconcile("order-6")

    assert result.after is payonce.IntentState.SUCCEEDED
    assert provider.store.total_executions() == 1


def test_case_7_outcomes_stored_by_an_older_schema_still_replay_byte_for_byte(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    # tests/data/journal_v1.sql is a journal as schema 1 left it on disk, with a stored
    # payment answer whose body holds non-ASCII bytes and a trailing newline.
    script = (Path(__file__).parent / "data" / "journal_v1.sql").read_text(encoding="utf-8")
    with sqlite3.connect(journal_path) as conn:
        conn.executescript(script)
        (stored_body,) = conn.execute(
            "SELECT response_body FROM intents WHERE reference = 'order-v1-0001'"
        ).fetchone()

    upgraded = make_client()  # today's payonce opens and migrates it
    response = upgraded.post(
        "/v1/payments", json={"amount": 4200, "currency": "eur"}, reference="order-v1-0001"
    )

    assert response.content == bytes(stored_body)
    assert payonce.response_info(response).replayed  # type: ignore[union-attr]
    assert sandbox.store.total_executions() == 0


def test_case_8_a_retry_after_region_failover_reuses_the_key_from_the_shared_journal(
    make_client: MakeClient, sandbox: SandboxServer, postgres_url: str
) -> None:
    # Region A's host sends the payment and dies before the answer is journaled.
    region_a = make_client(journal=postgres_url, base_url=sandbox.url, transport=DiesAfterSending())
    with pytest.raises(RuntimeError):
        region_a.post("/v1/payments", json=PAYMENT, reference="order-8")

    # Region B's host, another process with its own connection and its own route to the
    # provider, takes over from the journal both regions share.
    region_b = make_client(
        journal=postgres_url, base_url=sandbox.url.replace("127.0.0.1", "localhost")
    )
    (result,) = region_b.resume()

    assert result.state is payonce.IntentState.SUCCEEDED
    (record,) = region_b.journal.find("order-8")
    assert sandbox.store.executions() == {record.key: 1}, "same key: the provider replayed it"
