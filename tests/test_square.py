"""Square: its key in the JSON body, through payonce's square profile and the sandbox's
Square dialect (``SandboxConfig.like("square")``), with the sandbox's faults."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
import payonce.worker
from helpers.sandboxes import SharedSandboxes
from payonce.providers import get_profile
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxConfig, SandboxServer

MakeClient = Callable[..., payonce.Client]
AUTH = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}


def payment(**more: Any) -> dict[str, Any]:
    # The key field where Square takes one: empty, payonce puts the intent's key there.
    return {
        "idempotency_key": "",
        "source_id": "cnon:card-nonce-ok",
        "amount_money": {"amount": 1500, "currency": "USD"},
        "reference_id": "order-1",
        **more,
    }


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("square", SandboxConfig.like("square"))


@pytest.fixture
def client(server: SandboxServer, make_client: MakeClient) -> payonce.Client:
    return make_client(base_url=server.url, provider="square")


def sent_requests(client: payonce.Client) -> list[httpx.Request]:
    seen: list[httpx.Request] = []
    client._http.event_hooks["request"].append(seen.append)
    return seen


def test_the_key_travels_in_the_body_and_the_payment_executes_once(
    client: payonce.Client, server: SandboxServer
) -> None:
    sent = sent_requests(client)
    with client.intent("order-1") as op:
        paid = op.post("/v2/payments", json=payment())
    again = client.post("/v2/payments", reference="order-1", json=payment())

    assert paid.json()["payment"]["status"] == "COMPLETED"
    assert len(sent) == 1, "the second call is answered by the journal"
    assert json.loads(sent[0].content)["idempotency_key"] == op.key
    assert "idempotency-key" not in sent[0].headers
    assert again.content == paid.content
    assert server.store.executions() == {op.key: 1}


@pytest.mark.parametrize("fault", ["fail_before", "fail_after", "drop_after"])
def test_a_lost_or_failed_answer_is_retried_under_the_same_body_key(
    fault: str, client: payonce.Client, server: SandboxServer
) -> None:
    server.script([fault])
    sent = sent_requests(client)
    with client.intent("order-f") as op:
        paid = op.post("/v2/payments", json=payment())

    assert paid.status_code == 200
    assert len(sent) == 2
    assert [json.loads(r.content)["idempotency_key"] for r in sent] == [op.key, op.key]
    assert sent[0].content == sent[1].content
    assert server.store.executions() == {op.key: 1}


def test_a_key_the_caller_put_in_the_body_is_the_intent_s_and_not_fingerprinted(
    client: payonce.Client, server: SandboxServer
) -> None:
    with client.intent("order-k") as op:
        op.post("/v2/payments", json=payment(idempotency_key="shop-key-1"))
    assert op.key == "shop-key-1"
    record = client.journal.get(op.key)
    assert record is not None
    # What is journaled has the key field emptied: the fingerprint does not cover it.
    assert json.loads(record.body)["idempotency_key"] == ""
    assert server.store.executions() == {"shop-key-1": 1}


def test_a_body_key_other_than_the_intent_s_is_refused_and_nothing_is_journaled(
    client: payonce.Client, server: SandboxServer
) -> None:
    with (
        pytest.raises(payonce.ConfigurationError, match="not this intent's key"),
        client.intent("order-x", key="intent-key") as op,
    ):
        op.post("/v2/payments", json=payment(idempotency_key="other-key"))
    assert client.journal.get("intent-key") is None
    assert server.store.total_executions() == 0


def test_a_create_call_without_the_key_field_gets_the_intent_s_key_in_its_body(
    client: payonce.Client, server: SandboxServer
) -> None:
    # CreatePayment requires the key: the caller need not write the field, payonce puts
    # it in (a body sent without it would be refused by Square, or pay with no key).
    without_field = {k: v for k, v in payment().items() if k != "idempotency_key"}
    sent = sent_requests(client)
    with client.intent("order-nofield") as op:
        paid = op.post("/v2/payments", json=without_field)
    assert paid.json()["payment"]["status"] == "COMPLETED"
    assert json.loads(sent[0].content)["idempotency_key"] == op.key
    # Journaled as if the caller had written the field empty: the same request either way.
    record = client.journal.get(op.key)
    assert record is not None
    assert json.loads(record.body)["idempotency_key"] == ""
    again = client.post("/v2/payments", reference="order-nofield", json=payment())
    assert again.content == paid.content
    assert len(sent) == 1
    assert server.store.executions() == {op.key: 1}


@pytest.mark.parametrize(
    ("method", "path", "takes_key"),
    [
        ("POST", "/v2/payments", True),
        ("POST", "/v2/refunds", True),
        ("POST", "/v2/orders", True),
        ("POST", "/v2/orders/o-1/pay", True),
        ("POST", "/proxy/v2/payments", True),
        ("POST", "/v2/payments/p-1/complete", False),
        ("POST", "/v2/payments/p-1/cancel", False),
        ("POST", "/v2/payments/cancel", False),  # its key names the payment to cancel
        ("PUT", "/v2/payments", False),
    ],
)
def test_square_s_create_calls_are_the_ones_that_take_the_key_in_the_body(
    method: str, path: str, takes_key: bool
) -> None:
    assert get_profile("square").body_key_required(method, path) is takes_key


def test_a_request_without_the_key_field_is_sent_as_it_is(
    client: payonce.Client, server: SandboxServer
) -> None:
    # CompletePayment takes no key: nothing is added to its body.
    with client.intent("order-c") as op:
        approved = op.post("/v2/payments", json=payment(autocomplete=False)).json()["payment"]
    assert approved["status"] == "APPROVED"
    sent = sent_requests(client)
    with client.intent("order-c-complete") as op:
        done = op.post(f"/v2/payments/{approved['id']}/complete", json={})
    assert done.json()["payment"]["status"] == "COMPLETED"
    assert sent[0].content == b"{}"
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        assert http.get(f"/v2/payments/{approved['id']}").json()["payment"]["status"] == (
            "COMPLETED"
        )


def test_a_decline_is_definitive(client: payonce.Client, server: SandboxServer) -> None:
    declined = payment(amount_money={"amount": 40200, "currency": "USD"})
    with pytest.raises(payonce.ProviderError) as caught, client.intent("order-d") as op:
        op.post("/v2/payments", json=declined)
    assert caught.value.response is not None
    assert caught.value.response.json()["errors"][0]["code"] == "GENERIC_DECLINE"
    assert server.store.executions() == {op.key: 1}


def test_a_reused_key_is_a_mismatch_in_square_s_words() -> None:
    profile = get_profile("square")
    reused = httpx.Response(
        400,
        json={"errors": [{"category": "INVALID_REQUEST_ERROR", "code": "IDEMPOTENCY_KEY_REUSED"}]},
    )
    declined = httpx.Response(400, json={"errors": [{"code": "GENERIC_DECLINE"}]})
    verdict = profile.refine(reused)
    assert verdict is not None
    assert verdict.outcome is payonce.providers.Outcome.MISMATCH
    assert profile.refine(declined) is None


def test_the_sandbox_answers_a_reused_key_and_one_in_flight_as_square_does(
    make_sandbox: Callable[..., SandboxServer],
) -> None:
    square = make_sandbox(dialect="square")

    def create(amount: int = 1500) -> httpx.Response:
        body = payment(idempotency_key="k-1", amount_money={"amount": amount, "currency": "USD"})
        with httpx.Client(base_url=square.url, headers=AUTH, timeout=30) as http:
            return http.post("/v2/payments", json=body)

    # The second request comes while the first executes: the provider holds it meanwhile.
    with ThreadPoolExecutor(1) as pool:
        with square.holding():
            first = pool.submit(create)
            assert square.wait_held(1), "the first request never reached the provider"
            in_flight = create()
        done = first.result()
    reused = create(amount=1600)  # the same key, another body

    assert (in_flight.status_code, done.status_code) == (409, 200)
    assert in_flight.json()["errors"][0]["code"] == "CONFLICT"
    assert reused.status_code == 400
    assert reused.json()["errors"][0]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert square.store.execution_count("k-1") == 1


def test_cancel_by_idempotency_key_keeps_the_payment_s_key_in_its_body(
    client: payonce.Client, server: SandboxServer
) -> None:
    # CancelPaymentByIdempotencyKey's "idempotency_key" names the payment to cancel: it is
    # neither the request's own key nor replaced by the step's.
    with client.intent("order-cancel") as op:
        approved = op.post("/v2/payments", json=payment(autocomplete=False)).json()["payment"]
        paid_key = op.key
        sent = sent_requests(client)
        op.post("/v2/payments/cancel", json={"idempotency_key": paid_key})

    assert json.loads(sent[0].content) == {"idempotency_key": paid_key}
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        assert http.get(f"/v2/payments/{approved['id']}").json()["payment"]["status"] == (
            "CANCELED"
        )
    (_, first, _), (_, cancel_step, _) = op.steps
    assert first == paid_key
    assert cancel_step not in (None, paid_key), "the cancel is a step under a key of its own"


@pytest.mark.parametrize("path", ["/v2/payments/cancel", "/sq/v2/payments/cancel"])
def test_a_transported_cancel_by_key_carries_no_key_of_its_own(path: str) -> None:
    body = json.dumps({"idempotency_key": "the-payment-s-key"}).encode()
    assert get_profile("square").take_body_key("POST", path, body, "application/json") == (
        body,
        None,
    )


def test_an_unknown_payment_without_a_look_up_is_escalated_with_advice_that_can_work(
    make_client: MakeClient,
    server: SandboxServer,
    journal_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Square has no status look-up: `payonce reconcile` cannot ask, so the escalation must
    # not send the operator there, only to the provider's dashboard and `payonce abandon`.
    client = make_client(
        base_url=server.url,
        provider="square",
        retry=payonce.RetryPolicy(max_attempts=3, initial_wait=0.01, max_wait=0.05),
    )
    server.script(["fail_after", "fail_before", "rate_limit"])
    with (
        pytest.raises(payonce.OutcomeUnknown),
        client.intent("order-escalated") as op,
    ):
        op.post("/v2/payments", json=payment())
    # Within its key window the worker would resend it under its key (test_square_unknown);
    # past 90% of Square's assumed 24 h by Square's clock, only a person can settle it.
    server.advance_clock(24 * 3600 * 0.9 + 60)
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    with (
        caplog.at_level(logging.ERROR, logger="payonce.worker"),
        payonce.worker.Worker(
            journal=journal_path, base_url=server.url, account=DEFAULT_ACCOUNT
        ) as worker,
    ):
        worker.run_pass()

    [escalated] = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.getMessage().startswith(f"intent {op.key} escalated")
    ]
    assert "no status look-up" in escalated
    assert f"payonce abandon {op.key}" in escalated
    assert "payonce reconcile" not in escalated
    assert server.store.executions() == {op.key: 1}
