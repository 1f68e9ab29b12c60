"""A key the caller sets that is another block's step key.

payonce derives the key of step n of a block keyed ``k9x`` as ``k9x-step2``, ... A caller
who sets that very key on another intent (``client.intent(key="k9x-step2")``, a one-shot's
``key=``, an ``Idempotency-Key`` on a step) meets that block's journaled step: the
refusal says whose step the key is, and to choose another key; nothing is sent and the
journal keeps what it held. A key that merely ends in ``-step2`` and holds nothing is a
key like any other.
"""

from __future__ import annotations

import contextlib

import httpx
import pytest

import payonce
from helpers.payments import PAYMENT
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

SECOND = {"amount": 4300, "currency": "eur"}
OTHER = {"amount": 990, "currency": "eur"}


def _two_step_block(client: payonce.Client) -> str:
    """Block 'order-1' keyed k9x, steps 1 and 2 journaled: step 2's derived key."""
    with client.intent("order-1", key="k9x") as op:
        op.post("/v1/payments", json=PAYMENT)
        op.post("/v1/payments", json=SECOND)
    (_, (_, derived, _)) = op.steps
    assert derived == "k9x-step2"
    return derived


def test_an_intent_keyed_with_another_block_s_step_key_is_refused_naming_that_step(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    derived = _two_step_block(client)
    before = client.journal.list_intents()

    with (
        client.intent("order-2", key=derived) as op,
        pytest.raises(payonce.IntentMismatch) as refused,
    ):
        op.post("/v1/payments", json=OTHER)

    message = str(refused.value)
    assert message.startswith("intent k9x-step2 (reference 'order-2'), POST /v1/payments,")
    assert "is the one payonce derived for step 2 of intent 'order-1'" in message
    assert "Choose another key for this intent" in message
    assert "Nothing was sent and the journal is unchanged" in message
    assert "Use a new reference" not in message
    assert (refused.value.key, refused.value.reference) == (derived, "order-2")
    assert client.journal.list_intents() == before
    assert sandbox.store.executions() == {"k9x": 1, derived: 1}


def test_a_one_shot_keyed_with_another_block_s_step_key_is_refused_the_same_way(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    derived = _two_step_block(client)
    before = client.journal.list_intents()

    with pytest.raises(payonce.IntentMismatch, match="derived for step 2 of intent 'order-1'"):
        client.post("/v1/payments", json=OTHER, key=derived)

    assert client.journal.list_intents() == before
    assert sandbox.store.executions() == {"k9x": 1, derived: 1}


def test_a_step_s_own_key_set_to_another_block_s_step_key_is_refused_naming_both(
    client: payonce.Client, sandbox: SandboxServer, closing: contextlib.ExitStack
) -> None:
    derived = _two_step_block(client)
    before = client.journal.list_intents()
    http = closing.enter_context(
        httpx.Client(
            base_url=sandbox.url,
            transport=client.transport(),
            headers={"Authorization": f"Bearer {DEFAULT_API_KEY}"},
        )
    )

    with client.intent("order-3") as op:
        http.post("/v1/payments", json=OTHER)
        with pytest.raises(payonce.IntentMismatch) as refused:
            http.post("/v1/payments", json=PAYMENT, headers={"Idempotency-Key": derived})

    message = str(refused.value)
    assert message.startswith(f"step 2 of intent 'order-3' (key {derived}), POST /v1/payments,")
    assert "is the one payonce derived for step 2 of intent 'order-1'" in message
    assert refused.value.reference == "order-3"
    after = client.journal.list_intents()
    assert [i for i in after if i.key != op.key] == before, "only order-3's step 1 was added"
    assert [i.key for i in after if i.reference == "order-3#step2"] == []
    assert sandbox.store.executions() == {"k9x": 1, derived: 1, str(op.key): 1}


def test_a_key_ending_in_step2_that_holds_nothing_is_a_key_like_any_other(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    _two_step_block(client)

    with client.intent("order-4", key="k9y-step2") as op:
        paid = op.post("/v1/payments", json=OTHER)

    assert paid.status_code == 201
    assert op.steps == [(1, "k9y-step2", payonce.IntentState.SUCCEEDED)]
    assert sandbox.store.executions()["k9y-step2"] == 1
