"""An intent block as the ambient scope: every mutating request inside it is a step.

Step 1 is the intent as payonce always journaled it; step n is an intent of its own keyed
from the first's key, replayed from the journal when the same code runs again, and refused
(naming the step) when the code asks for another request at that position.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest

import payonce
from helpers.cli import run_cli
from helpers.journals import draft_for
from helpers.payments import DECLINED, PAYMENT, MakeClient
from payonce.sandbox import SandboxServer

REFUND = {"amount": 100, "currency": "eur"}
SECOND = {"amount": 4300, "currency": "eur"}


def _info(response: Any) -> payonce.ResponseInfo:
    info = payonce.response_info(response)
    assert info is not None
    return info


def _checkout(client: payonce.Client, reference: str, *, steps: int = 2) -> list[Any]:
    """A business operation of several requests, as a shop writes it."""
    with client.intent(reference) as op:
        answers = [op.post("/v1/payments", json=PAYMENT)]
        if steps > 1:
            answers.append(op.post("/v1/payments", json=SECOND))
        if steps > 2:
            answers.append(op.post("/v1/payments", json=REFUND))
    return answers


def _dies_after_step_1(client: payonce.Client, reference: str) -> None:
    with client.intent(reference) as op:
        op.post("/v1/payments", json=PAYMENT)
        raise RuntimeError("crashed between the steps")


async def _dies_after_step_1_async(client: payonce.AsyncClient, reference: str) -> None:
    async with client.intent(reference) as op:
        await op.post("/v1/payments", json=PAYMENT)
        raise RuntimeError("crashed between the steps")


def _step_2_lost(
    make_client: MakeClient, sandbox: SandboxServer, reference: str
) -> tuple[payonce.Client, payonce.Operation, payonce.OutcomeUnknown]:
    """A two-step block whose step 2 executes and loses its answer: it stays unknown."""
    client = make_client(retry=payonce.RetryPolicy(max_attempts=1))
    with client.intent(reference) as op:
        op.post("/v1/payments", json=PAYMENT)
        sandbox.script(["drop_after"])
        with pytest.raises(payonce.OutcomeUnknown) as lost:
            op.post("/v1/payments", json=SECOND)
    return client, op, lost.value


# -- step keys ------------------------------------------------------------------------------


def test_step_keys_are_derived_from_the_intent_key_and_fit_the_provider_s_limit() -> None:
    from payonce._lifecycle import step_key

    assert step_key("01JABCDEF", 2) == "01JABCDEF-step2"
    uuid_key = "0b7f1f5e-6f0b-4c1e-9d3c-2c8f7f4c9a11"
    assert len(step_key(uuid_key, 12, max_length=45)) <= 45  # Square's limit
    long_key = "k" * 64  # a caller's key at Adyen's limit
    derived = [step_key(long_key, n, max_length=64) for n in range(2, 50)]
    assert len(set(derived)) == 48
    assert all(len(key) <= 64 and key.endswith(f"-step{n}") for n, key in enumerate(derived, 2))
    # Two long keys that share their head still get different step keys.
    assert step_key("a" * 60 + "1", 2, max_length=64) != step_key("a" * 60 + "2", 2, max_length=64)
    assert step_key(long_key, 3, max_length=64) == step_key(long_key, 3, max_length=64)


# -- steps in one run -----------------------------------------------------------------------


def test_each_different_request_of_a_block_is_its_next_step_with_a_key_of_its_own(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    first, second, third = _checkout(client, "order-steps", steps=3)
    key = _info(first).key
    assert [_info(r).key for r in (second, third)] == [f"{key}-step2", f"{key}-step3"]
    assert sandbox.store.executions() == {key: 1, f"{key}-step2": 1, f"{key}-step3": 1}
    # Every step's outcome was acknowledged when the block ended normally.
    assert client.unacknowledged() == []


def test_a_step_carries_a_reference_of_its_own_and_the_journal_lists_it_with_its_intent(
    client: payonce.Client, journal_path: Path
) -> None:
    first, _ = _checkout(client, "order-listed")
    key = _info(first).key
    assert [r.key for r in client.journal.find("order-listed")] == [key]
    (step,) = client.journal.steps(key)
    assert (step.key, step.reference, step.state) == (
        f"{key}-step2",
        "order-listed#step2",
        payonce.IntentState.SUCCEEDED,
    )
    assert client.journal.steps(step.key) == []

    step_shown = run_cli(["intents", "show", step.key, "--journal", str(journal_path)])
    assert step_shown.exit_code == 0, step_shown.stderr
    assert f"step 2 of intent {key} (reference order-listed)" in step_shown.stdout

    shown = run_cli(["intents", "show", "order-listed", "--journal", str(journal_path)])
    assert shown.exit_code == 0, shown.stderr
    assert "intent of 2 steps" in shown.stdout
    assert f"step 2 of intent {key}" in shown.stdout
    as_json = run_cli(["intents", "show", "order-listed", "--json", "--journal", str(journal_path)])
    documents = json.loads(as_json.stdout)
    assert [d["key"] for d in documents] == [key, f"{key}-step2"]
    assert documents[0]["steps"] == [f"{key}-step2"]
    assert (documents[1]["step"], documents[1]["step_of"]) == (2, key)


# -- running the same code again ------------------------------------------------------------


def test_running_the_block_again_replays_settled_steps_and_continues_at_the_first_new_one(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    with pytest.raises(RuntimeError, match="crashed between the steps"):
        _dies_after_step_1(client, "order-resumed")
    assert sandbox.store.total_executions() == 1

    first, second = _checkout(client, "order-resumed")
    assert _info(first).replayed
    assert not _info(second).replayed
    assert sandbox.store.total_executions() == 2

    again = _checkout(client, "order-resumed")
    assert all(_info(r).replayed for r in again)
    assert [r.json() for r in again] == [first.json(), second.json()]
    assert sandbox.store.total_executions() == 2


def test_a_step_whose_request_changed_is_refused_naming_it_and_leaves_the_journal_as_it_was(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    _checkout(client, "order-changed", steps=3)
    before = client.journal.list_intents()
    with client.intent("order-changed") as op:
        op.post("/v1/payments", json=PAYMENT)
        # The block's second payment meets the second one journaled: another amount now.
        with pytest.raises(payonce.IntentMismatch) as refused:
            op.post("/v1/payments", json={**SECOND, "amount": 9900})
    message = str(refused.value)
    assert (
        f"step 2 of intent 'order-changed' (key {refused.value.key}), POST /v1/payments," in message
    )
    assert "its request differs from the one journaled in the body (field amount)" in message
    assert refused.value.key is not None
    assert refused.value.key.endswith("-step2")
    # The block shows what its step 2 holds: the request journaled there, as it ended.
    assert op.steps[1] == (2, refused.value.key, payonce.IntentState.SUCCEEDED)
    assert client.journal.list_intents() == before
    assert sandbox.store.total_executions() == 3


def test_an_error_about_step_2_names_the_step_its_intent_s_reference_and_its_key(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    client, op, error = _step_2_lost(make_client, sandbox, "order-named")
    ((_, intent_key, _), (_, step_key, _)) = op.steps
    assert (error.key, error.reference, error.step, error.intent_key) == (
        step_key,
        "order-named",
        2,
        intent_key,
    )
    assert str(error).startswith(f"step 2 of intent 'order-named' (key {step_key}) has an")
    # Run again, the step is refused as unknown without a send, and named the same way.
    with client.intent("order-named") as again_op:
        again_op.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.OutcomeUnknown) as again:
            again_op.post("/v1/payments", json=SECOND)
    assert str(again.value).startswith(f"step 2 of intent 'order-named' (key {step_key})")
    assert again.value.reference == "order-named"
    assert sandbox.store.total_executions() == 2


@pytest.mark.parametrize(
    ("key", "said", "named"),
    [
        pytest.param(
            "KEY-step2",
            "intent KEY-step2 has an unknown outcome (…)",
            "step 2 of intent 'order-b' (key KEY-step2) has an unknown outcome (…)",
            id="its-own-record",
        ),
        pytest.param(
            "shared-key",
            "intent shared-key (reference 'order-a') has an unknown outcome (…)",
            "step 2 of intent 'order-b' (key shared-key): intent shared-key (reference "
            "'order-a') has an unknown outcome (…)",
            id="a-key-the-caller-set-that-is-another-intent-s",
        ),
    ],
)
def test_a_step_s_error_is_named_by_the_step_and_keeps_another_intent_s_words(
    key: str, said: str, named: str
) -> None:
    from payonce._lifecycle._refusals import of_step

    draft = attrs.evolve(
        draft_for(1), key=key, reference=None, step=2, intent_key="KEY", intent_reference="order-b"
    )
    error = of_step(payonce.OutcomeUnknown(said, key=key, reference=None, reason="…"), draft)
    assert str(error) == named
    assert (error.key, error.reference, error.step, error.intent_key) == (
        key,
        "order-b",
        2,
        "KEY",
    )


def test_step_1_errors_name_the_intent_as_they_always_did(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    client = make_client(retry=payonce.RetryPolicy(max_attempts=1))
    sandbox.script(["drop_after"])
    with client.intent("order-first") as op, pytest.raises(payonce.OutcomeUnknown) as lost:
        op.post("/v1/payments", json=PAYMENT)
    assert str(lost.value).startswith(f"intent {op.key} (reference 'order-first') has an")
    assert (lost.value.step, lost.value.intent_key) == (1, None)


def test_a_step_whose_body_changed_says_what_differs(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    _checkout(client, "order-body")
    with client.intent("order-body") as op:
        op.post("/v1/payments", json=PAYMENT)
        with pytest.raises(
            payonce.IntentMismatch, match=r"step 2 .* differs from the one journaled in the body"
        ):
            op.post("/v1/payments", json={"amount": 1, "currency": "eur"})
    assert sandbox.store.total_executions() == 2


def test_a_changed_step_that_may_have_executed_warns_that_a_new_reference_could_pay_twice(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    client, _, _ = _step_2_lost(make_client, sandbox, "order-maybe")
    assert sandbox.store.total_executions() == 2

    with client.intent("order-maybe") as op:
        op.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.IntentMismatch) as refused:
            op.post("/v1/payments", json={**SECOND, "amount": 1})
    message = str(refused.value)
    assert "step 2 of intent 'order-maybe' (key " in message
    assert "), POST /v1/payments, cannot be sent" in message
    assert "This step is unknown: the provider may have executed it" in message
    assert "a new reference could pay twice" in message
    assert "use a new reference for a new operation" not in message
    assert sandbox.store.total_executions() == 2


# -- the same request again -----------------------------------------------------------------


def _step_2_turned_away(op: payonce.Operation, sandbox: SandboxServer) -> None:
    """Step 1 succeeds; every attempt of step 2 is turned away (a 429): it stays pending."""
    op.post("/v1/payments", json=PAYMENT)
    sandbox.script(["rate_limit"] * 5)
    with pytest.raises(payonce.ProviderUnavailable):
        op.post("/v1/payments", json=SECOND)


@pytest.mark.slow
def test_a_caller_s_retry_of_a_step_that_did_not_settle_is_that_step_again(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    with client.intent("order-retry-loop") as op:
        _step_2_turned_away(op, sandbox)
        # The caller's own retry loop posts the very same request again: step 2, resent
        # under its key, not a step 3.
        retried = op.post("/v1/payments", json=SECOND)
    assert _info(retried).key == f"{op.key}-step2"
    assert [n for n, _, _ in op.steps] == [1, 2]
    assert sandbox.store.total_executions() == 2


def test_a_caller_s_retry_of_a_declined_step_is_its_refusal_again_never_a_new_attempt(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    with client.intent("order-declined-twice") as op:
        with pytest.raises(payonce.ProviderError) as declined:
            op.post("/v1/payments", json=DECLINED)
        with pytest.raises(payonce.ProviderError) as again:
            op.post("/v1/payments", json=DECLINED)
    assert again.value.key == declined.value.key == op.key
    assert again.value.response.json() == declined.value.response.json()
    assert [n for n, _, _ in op.steps] == [1]
    assert sandbox.store.total_executions() == 1


# -- the same request again after its success was answered: a second one on purpose ---------


def _split_payment(client: payonce.Client, reference: str, *, die_between: bool = False) -> Any:
    """Two identical payments in one block (a bill split in two equal halves)."""
    with client.intent(reference) as op:
        first = op.post("/v1/payments", json=PAYMENT)
        if die_between:
            raise RuntimeError("crashed between the two payments")
        second = op.post("/v1/payments", json=PAYMENT)
    return first, second, op


def test_the_same_request_again_after_its_success_was_answered_is_a_second_payment(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    first, second, op = _split_payment(client, "order-split")
    assert _info(second).key == f"{_info(first).key}-step2"
    assert first.json()["id"] != second.json()["id"]
    assert not _info(second).replayed
    assert [n for n, _, _ in op.steps] == [1, 2]
    assert sandbox.store.total_executions() == 2

    # Run again, each repeat lands on the same position: both replayed, nothing sent.
    again_first, again_second, _ = _split_payment(client, "order-split")
    assert _info(again_first).replayed
    assert _info(again_second).replayed
    assert [r.json()["id"] for r in (again_first, again_second)] == [
        first.json()["id"],
        second.json()["id"],
    ]
    assert sandbox.store.total_executions() == 2


def test_a_split_payment_cut_between_its_payments_and_run_again_pays_twice_not_three_times(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    with pytest.raises(RuntimeError, match="between the two payments"):
        _split_payment(client, "order-split-cut", die_between=True)
    assert sandbox.store.total_executions() == 1
    first, second, _ = _split_payment(client, "order-split-cut")
    assert (_info(first).replayed, _info(second).replayed) == (True, False)
    _split_payment(client, "order-split-cut")
    assert sandbox.store.total_executions() == 2


@pytest.mark.slow
def test_a_repeat_of_a_step_that_succeeded_while_a_later_one_did_not_is_refused(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    # A retry loop around several steps, inside the block: step 2 was turned away, and the
    # loop starts the operation over. A next step would pay step 1's payment twice.
    with client.intent("order-loop-inside") as op:
        _step_2_turned_away(op, sandbox)
        before = client.journal.list_intents()
        with pytest.raises(payonce.ConfigurationError) as refused:
            op.post("/v1/payments", json=PAYMENT)
        assert client.journal.list_intents() == before
    message = str(refused.value)
    assert "POST /v1/payments is the same request as step 1 of intent 'order-loop-inside'" in (
        message
    )
    assert "while step 2 is pending" in message
    assert "nothing was sent" in message
    assert "run the block again" in message
    assert "idempotency key of its own" in message
    assert [n for n, _, _ in op.steps] == [1, 2]
    assert sandbox.store.total_executions() == 1

    # As the refusal says: the block run again replays step 1 and sends step 2.
    with client.intent("order-loop-inside") as op:
        assert _info(op.post("/v1/payments", json=PAYMENT)).replayed
        op.post("/v1/payments", json=SECOND)
        # Every step succeeded now: the same payment again is a third step, on purpose.
        third = op.post("/v1/payments", json=PAYMENT)
    assert _info(third).key == f"{op.key}-step3"
    assert sandbox.store.total_executions() == 3


def test_a_step_whose_outcome_stays_unknown_is_refused_again_rather_than_resent(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    client = make_client(retry=payonce.RetryPolicy(max_attempts=1, initial_wait=0))
    with client.intent("order-unknown-step") as op:
        op.post("/v1/payments", json=PAYMENT)
        sandbox.script(["drop_after"])  # step 2 executes; its answer is lost
        with pytest.raises(payonce.OutcomeUnknown):
            op.post("/v1/payments", json=SECOND)
        with pytest.raises(payonce.OutcomeUnknown, match="-step2"):
            op.post("/v1/payments", json=SECOND)
    assert sandbox.store.total_executions() == 2
    # Reconciled by its own key, the step settles from the provider's record.
    (result,) = client.reconcile(f"{op.key}-step2")
    assert result.after is payonce.IntentState.SUCCEEDED
    with client.intent("order-unknown-step") as op:
        op.post("/v1/payments", json=PAYMENT)
        found = op.post("/v1/payments", json=SECOND)
    assert found.json()["amount"] == SECOND["amount"]
    assert sandbox.store.total_executions() == 2


def test_an_abandoned_step_stops_the_block_without_suggesting_a_new_reference(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    client, op, _ = _step_2_lost(make_client, sandbox, "order-abandoned-step")
    step_key = op.steps[1][1]
    abandoned = run_cli(
        ["abandon", str(step_key), "--reason", "settled by hand", "--journal", str(journal_path)]
    )
    assert abandoned.exit_code == 0, abandoned.stderr

    with client.intent("order-abandoned-step") as again:
        again.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.IntentStateError) as refused:
            again.post("/v1/payments", json=SECOND)
    message = str(refused.value)
    assert message.startswith(f"step 2 of intent 'order-abandoned-step' (key {step_key}) was")
    assert "cannot carry on past an abandoned step" in message
    # A new reference would run the block from step 1 again: a second payment.
    assert "Use a new reference to pay again" not in message
    assert sandbox.store.total_executions() == 2


# -- the block's scope -----------------------------------------------------------------------


def test_blocks_of_one_client_do_not_nest(client: payonce.Client, sandbox: SandboxServer) -> None:
    with client.intent("order-outer") as outer:
        inner = client.intent("order-inner")
        with pytest.raises(payonce.ConfigurationError, match="do not nest") as nested:
            inner.__enter__()
        # The open block is named by its reference, and by how far it got: not key=None.
        assert "(<Operation reference='order-outer', no step yet>)" in str(nested.value)
        outer.post("/v1/payments", json=PAYMENT)
        assert repr(outer) == f"<Operation reference='order-outer' key={outer.key!r}, 1 step(s)>"
    # The refused block left the outer one current, and it ended cleanly: a new block opens.
    with client.intent("order-after") as after:
        after.post("/v1/payments", json=PAYMENT)
    assert sandbox.store.total_executions() == 2


def test_another_client_s_block_and_another_thread_s_block_are_their_own(
    make_client: MakeClient, sandbox: SandboxServer, tmp_path: Path
) -> None:
    client = make_client()
    other = make_client(journal=tmp_path / "other.db")
    seen: list[str | None] = []

    def in_a_thread() -> None:
        # A thread started inside a block does not see it: its block is its own.
        with client.intent("order-thread") as op:
            op.post("/v1/payments", json=SECOND)
            seen.append(op.key)

    with client.intent("order-main") as op, other.intent("order-other") as theirs:
        op.post("/v1/payments", json=PAYMENT)
        theirs.post("/v1/payments", json=REFUND)
        worker = threading.Thread(target=in_a_thread)
        worker.start()
        worker.join()
    assert len(seen) == 1
    assert seen[0] != op.key
    assert len(op.steps) == 1
    assert len(theirs.steps) == 1
    assert sandbox.store.total_executions() == 3


def test_a_one_shot_call_inside_a_block_is_the_block_s_next_step(
    client: payonce.Client, sandbox: SandboxServer
) -> None:
    with client.intent("order-one-shot-inside") as op:
        op.post("/v1/payments", json=PAYMENT)
        second = client.post("/v1/payments", json=SECOND)
        with pytest.raises(payonce.ConfigurationError, match="inside the block"):
            client.post("/v1/payments", json=REFUND, reference="order-elsewhere")
    assert _info(second).key == f"{op.key}-step2"
    assert sandbox.store.total_executions() == 2


# -- a block on one client, a request through another ---------------------------------------


def test_a_one_shot_through_another_client_inside_a_block_is_refused_unless_it_names_its_intent(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    client, twin = make_client(), make_client()  # the same settings, two client objects
    with client.intent("order-twin") as op:
        op.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.ConfigurationError) as refused:
            twin.post("/v1/payments", json=SECOND)
        # One that names its intent is that intent on every run: it goes, a one-shot.
        named = twin.post("/v1/payments", json=REFUND, reference="order-twin-refund")
    message = str(refused.value)
    assert "POST /v1/payments went through payonce.Client(provider='sandbox'" in message
    assert "intent 'order-twin'" in message
    assert "another client object with the same settings" in message
    assert "nothing was journaled or sent" in message
    assert "open a block on each client" in message
    assert _info(named).reference == "order-twin-refund"
    assert sorted(r.reference or "" for r in client.journal.list_intents()) == [
        "order-twin",
        "order-twin-refund",
    ]
    assert sandbox.store.total_executions() == 2


@pytest.mark.anyio
async def test_an_async_client_s_one_shot_inside_the_sync_client_s_block_is_refused(
    make_client: MakeClient, make_async_client: Any, sandbox: SandboxServer
) -> None:
    client = make_client()
    async_client: payonce.AsyncClient = make_async_client()
    with client.intent("order-sync-block"):
        with pytest.raises(payonce.ConfigurationError, match=r"through payonce\.AsyncClient\("):
            await async_client.post("/v1/payments", json=PAYMENT)
        async with async_client.intent("order-async-block") as theirs:
            await async_client.post("/v1/payments", json=PAYMENT)  # its own block: a step
        client.post("/v1/payments", json=SECOND)
    assert [n for n, _, _ in theirs.steps] == [1]
    assert sandbox.store.total_executions() == 2


def test_a_block_that_ends_without_a_request_through_its_client_warns(
    client: payonce.Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="payonce"):
        with client.intent("order-nothing"):
            pass  # the payment calls went around payonce
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1
        assert "the block of intent 'order-nothing'" in warned[0]
        assert "without a single request through payonce.Client(" in warned[0]
        assert "nothing in it was made exactly-once" in warned[0]
        assert "another client's transport" in warned[0]
        assert "not wired to this client" in warned[0]
        caplog.clear()

        with client.intent("order-something") as op:
            op.post("/v1/payments", json=PAYMENT)
        with pytest.raises(RuntimeError), client.intent("order-raised"):
            raise RuntimeError("it never got to pay")  # its exception says enough
    assert caplog.records == []


@pytest.mark.anyio
async def test_async_steps_replay_and_continue_and_follow_the_block_s_tasks(
    make_async_client: Any, sandbox: SandboxServer
) -> None:
    client: payonce.AsyncClient = make_async_client()
    with pytest.raises(RuntimeError, match="crashed between the steps"):
        await _dies_after_step_1_async(client, "order-async")

    async with client.intent("order-async") as op:
        first = await op.post("/v1/payments", json=PAYMENT)
        # A task started inside the block runs in its context: its request is a step.
        second = await asyncio.create_task(client.post("/v1/payments", json=SECOND))
    assert _info(first).replayed
    assert _info(second).key == f"{op.key}-step2"
    assert sandbox.store.total_executions() == 2


@pytest.mark.anyio
async def test_two_steps_of_one_intent_at_once_are_refused(
    make_async_client: Any, sandbox: SandboxServer
) -> None:
    client: payonce.AsyncClient = make_async_client()
    sandbox.script(["delay"])
    async with client.intent("order-concurrent") as op:
        results = await asyncio.gather(
            op.post("/v1/payments", json=PAYMENT),
            op.post("/v1/payments", json=SECOND),
            return_exceptions=True,
        )
    refused = [r for r in results if isinstance(r, payonce.ConfigurationError)]
    assert len(refused) == 1
    assert "one after another" in str(refused[0])
    # Where gather raises, the code loses the running step's answer: the way back is the
    # same block again, awaiting each step (a gather is refused every time; it replays the
    # step that ran), never new references (they would pay again).
    assert "await each request before the next" in str(refused[0])
    assert "then run this same block again: it replays the step that ran" in str(refused[0])
    assert sandbox.store.total_executions() == 1
    # The refused one took no position: the block holds its one step, settled and acked.
    assert [(n, state) for n, _, state in op.steps] == [(1, payonce.IntentState.SUCCEEDED)]
    assert await client.unacknowledged() == []


def test_a_client_built_for_its_transport_only_refuses_its_verbs(
    client_options: dict[str, Any], sandbox: SandboxServer
) -> None:
    options = {**client_options, "api_key": None, "transport_only": True}
    with payonce.Client(**options) as bare:
        with pytest.raises(payonce.ConfigurationError, match="transport_only=True"):
            bare.post("/v1/payments", json=PAYMENT)
        with pytest.raises(payonce.ConfigurationError, match="transport_only=True"):
            bare.resume()
        with pytest.raises(payonce.ConfigurationError, match="transport_only=True"):
            bare.reconcile("order-1")
        # Without the refusal it sent look-ups with no credentials and reported 401s.
        with pytest.raises(payonce.ConfigurationError, match="reconcile_all"):
            bare.reconcile_all()
    # Without transport_only, a client with no key anywhere is refused at once, as always.
    with pytest.raises(payonce.ConfigurationError):
        payonce.Client(**{**client_options, "api_key": None})
    assert sandbox.store.total_executions() == 0


def test_steps_journaled_without_a_reference_by_earlier_code_replay_when_the_block_runs_again(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    first, second = _checkout(make_client(), "order-earlier-code")
    # As the code before step references journaled a step: no reference of its own.
    with contextlib.closing(sqlite3.connect(journal_path)) as conn, conn:
        conn.execute("UPDATE intents SET reference = NULL WHERE reference LIKE '%#step%'")
    assert sandbox.store.total_executions() == 2

    again = _checkout(make_client(), "order-earlier-code")
    assert all(_info(r).replayed for r in again)
    assert [r.json() for r in again] == [first.json(), second.json()]
    assert sandbox.store.total_executions() == 2
