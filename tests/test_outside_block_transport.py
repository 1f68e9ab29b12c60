"""A request through ``client.transport()`` outside any block, left behind by its call: what
resume and reconcile do with it. Whatever key it carried, it is journaled as drawn for that
one call: payonce cannot tell a key the code names again from a uuid4 (r17i H3).

Plain httpx code over the transport (no SDK: tests/test_outside_block.py runs stripe-python
in killed child processes), against the sandbox on loopback, on a real journal file. The
process "dies" after its request was sent (``DiesAfterSending``: really sent, its answer
never read), or every attempt meets a fault the sandbox was told to play.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.cli import run_cli
from helpers.payments import PAYMENT, DiesAfterSending, MakeClient
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

AUTHORIZATION = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
PostOutside = Callable[..., httpx.Response]


@pytest.fixture
def post_outside(
    sandbox: SandboxServer, closing: contextlib.ExitStack
) -> Callable[..., PostOutside]:
    """``post(client, headers=..., inner=..., **transport_options)``: the shop's httpx code
    creating a payment over ``client.transport()``, outside any block."""

    def post(
        client: payonce.Client,
        *,
        headers: dict[str, str] | None = None,
        inner: httpx.BaseTransport | None = None,
        **transport_options: Any,
    ) -> httpx.Response:
        transport = client.transport(inner, **transport_options)
        http = closing.enter_context(
            httpx.Client(base_url=sandbox.url, transport=transport, headers=AUTHORIZATION)
        )
        return http.post("/v1/payments", json=PAYMENT, headers=headers)

    return post


def left_by_a_dead_call(
    make_client: MakeClient, post_outside: Callable[..., httpx.Response], **how: Any
) -> payonce.IntentRecord:
    """The request was sent; its process died before reading the answer."""
    with pytest.raises(RuntimeError, match="worker died"):
        post_outside(make_client(), inner=DiesAfterSending(), **how)
    (record,) = make_client().journal.list_intents()
    assert record.state is payonce.IntentState.PENDING
    return record


def test_a_request_outside_any_block_under_no_key_of_its_own_is_not_resent_by_resume(
    make_client: MakeClient,
    post_outside: Callable[..., httpx.Response],
    sandbox: SandboxServer,
    journal_path: Path,
) -> None:
    record = left_by_a_dead_call(make_client, post_outside)
    assert record.key_per_call
    assert sandbox.store.executions() == {record.key: 1}

    (result,) = make_client().resume()

    assert result.state is payonce.IntentState.UNKNOWN
    assert "outside any intent block under a key drawn for that one call" in result.detail
    shown = run_cli(["intents", "show", record.key, "--journal", str(journal_path)]).stdout
    assert "key_per_call\tyes: sent outside any block" in shown
    (listed,) = json.loads(
        run_cli(["intents", "list", "--json", "--journal", str(journal_path)]).stdout
    )
    assert listed["key_per_call"] is True
    assert sandbox.store.executions() == {record.key: 1}  # not even sent to be replayed
    # The sandbox's look-up by key finds it executed: settled from the provider's record.
    (reconciled,) = make_client().reconcile(record.key)
    assert reconciled.after is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {record.key: 1}


@pytest.mark.parametrize(
    ("headers", "options"),
    [
        # A key of the caller's, honoured: once resumed; but it may be a uuid4 drawn per
        # call (Square's and Adyen's examples), so it is not resent on its own either.
        pytest.param({"Idempotency-Key": "shop-order-7"}, {}, id="its-own-key-honoured"),
        pytest.param(
            {"Idempotency-Key": "uuid4-per-call"},
            {"sdk_keys": "replace"},
            id="a-key-the-transport-replaces",
        ),
    ],
)
def test_a_key_the_request_carries_is_journaled_per_call_and_not_resent_by_resume(
    make_client: MakeClient,
    post_outside: Callable[..., httpx.Response],
    sandbox: SandboxServer,
    headers: dict[str, str],
    options: dict[str, str],
) -> None:
    record = left_by_a_dead_call(make_client, post_outside, headers=headers, **options)
    assert (record.key, record.key_per_call) == (headers["Idempotency-Key"], True)

    (result,) = make_client().resume()

    assert result.state is payonce.IntentState.UNKNOWN
    assert sandbox.store.executions() == {record.key: 1}  # sent once, by its own call


def test_an_async_client_journals_a_key_the_caller_set_per_call_too(
    make_client: MakeClient, client_options: dict[str, Any], sandbox: SandboxServer
) -> None:
    async def pay_outside_any_block() -> httpx.Response:
        async with (
            payonce.AsyncClient(**client_options) as client,
            httpx.AsyncClient(
                base_url=sandbox.url, transport=client.transport(), headers=AUTHORIZATION
            ) as http,
        ):
            return await http.post(
                "/v1/payments", json=PAYMENT, headers={"Idempotency-Key": "shop-async-9"}
            )

    assert asyncio.run(pay_outside_any_block()).status_code == 201
    (record,) = make_client().journal.list_intents()
    assert (record.key, record.key_per_call) == ("shop-async-9", True)
    assert record.state is payonce.IntentState.SUCCEEDED


def test_without_a_look_up_it_stays_unknown_until_an_operator_asks_for_the_resend(
    make_client: MakeClient, post_outside: Callable[..., httpx.Response], sandbox: SandboxServer
) -> None:
    # Square's and the generic profile have no status look-up: reconciling resends under
    # the key, except a key drawn per call, whose code may have paid again since.
    generic = make_client(provider="generic", retry=payonce.RetryPolicy(max_attempts=1))
    sandbox.script(["fail_after"])  # executed, then a 503: the outcome is unknown
    with pytest.raises(payonce.OutcomeUnknown):
        post_outside(generic)
    (record,) = generic.journal.list_intents()
    assert (record.state, record.key_per_call) == (payonce.IntentState.UNKNOWN, True)

    sent: list[httpx.Request] = []
    generic._http.event_hooks["request"].append(sent.append)
    (kept,) = generic.reconcile(record.key)

    assert (kept.outcome, kept.after) == ("still_unknown", payonce.IntentState.UNKNOWN)
    assert "drawn for that one call" in kept.detail
    assert f"payonce reconcile {record.key} --resend" in kept.detail
    assert sent == []  # nothing resent, not even the provider's clock asked
    (forced,) = generic.reconcile(record.key, resend=True)
    assert forced.after is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {record.key: 1}  # the resend got the replay
