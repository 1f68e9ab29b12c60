"""A step's name: the reference ``order-1#step2`` is payonce's, and every error about the
step says "step 2 of intent 'order-1'", also when ``resume`` or ``reconcile`` drive its
journaled row without its block.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.cli import run_cli
from helpers.journals import draft_for
from helpers.payments import PAYMENT, MakeClient
from payonce._journal._held import created_record
from payonce._lifecycle._refusals import of_step_row
from payonce.sandbox import DEFAULT_API_KEY, Faults, SandboxServer

SECOND = {"amount": 4300, "currency": "eur"}


# -- a caller's reference in a step's form ------------------------------------------------------


@pytest.mark.parametrize("reference", ["order-7#step2", "order-7#step1", "a#b#step12"])
def test_a_reference_of_the_caller_s_in_a_step_s_form_is_refused_and_nothing_is_journaled(
    make_client: MakeClient, sandbox: SandboxServer, reference: str
) -> None:
    client = make_client()
    client.post("/v1/payments", json=PAYMENT, reference="order-paid")
    before = client.journal.list_intents()
    base, _, step = reference.rpartition("#")

    with pytest.raises(payonce.ConfigurationError) as refused:
        client.intent(reference)
    with pytest.raises(payonce.ConfigurationError):
        client.post("/v1/payments", json=PAYMENT, reference=reference)

    message = str(refused.value)
    assert message.startswith(f"reference {reference!r} ends in '#{step}', which payonce keeps")
    assert "Nothing was journaled or sent" in message
    assert f"e.g. '{base}-{step}'. " in message
    # Orders an earlier payonce journaled under such a reference are found, not paid again.
    assert message.endswith(
        "If an earlier payonce journaled intents under it, they keep their keys: find them "
        "with `payonce intents list`, finish pending ones with `payonce resume` and "
        f"reconcile unknown ones; the renamed reference ('{base}-{step}') is another "
        "intent, and paying one of them under it again would pay twice"
    )
    assert client.journal.list_intents() == before
    assert sandbox.store.total_executions() == 1


def test_references_that_only_look_like_a_step_s_are_the_caller_s_own(
    client: payonce.Client,
) -> None:
    for reference in ("order#step", "order#stepx", "order#step2a", "order-step2"):
        assert client.post("/v1/payments", json=PAYMENT, reference=reference).status_code == 201
    # payonce's own step references keep working: a block's step 2 is journaled under one.
    with client.intent("order-7") as op:
        op.post("/v1/payments", json=PAYMENT)
        op.post("/v1/payments", json=SECOND)
    assert [r.reference for r in client.journal.steps(op.key or "")] == ["order-7#step2"]


# -- resume and reconcile name the step ------------------------------------------------------


def _step_2_left_pending(client: payonce.Client, sandbox: SandboxServer) -> str:
    """Step 2 of intent 'order-1' turned away by every attempt (a 429): left pending. The
    sandbox asks for no wait before the next attempt (a resume's meets 429s too)."""
    sandbox.set_faults(Faults(retry_after_seconds=0))
    with client.intent("order-1") as op:
        op.post("/v1/payments", json=PAYMENT)
        sandbox.script(["rate_limit"] * 5)
        with pytest.raises(payonce.ProviderUnavailable):
            op.post("/v1/payments", json=SECOND)
    (_, (_, key, _)) = op.steps
    assert key is not None
    return key


def test_client_resume_names_a_pending_step_by_its_position_and_its_block_s_reference(
    client: payonce.Client, sandbox: SandboxServer, caplog: pytest.LogCaptureFixture
) -> None:
    key = _step_2_left_pending(client, sandbox)
    sandbox.script(["rate_limit"] * 5)

    (result,) = client.resume()

    named = f"step 2 of intent 'order-1' (key {key}) was never executed by the provider"
    assert result.detail == (
        f"ProviderUnavailable: {named} (HTTP 429); it stays pending under its key: calling "
        "again later is safe"
    )
    assert (result.key, result.reference) == (key, "order-1#step2")
    assert named in caplog.text
    assert "(reference 'order-1#step2')" not in caplog.text


def test_payonce_resume_names_a_pending_step_the_same_way(
    client: payonce.Client, sandbox: SandboxServer, journal_path: Path
) -> None:
    key = _step_2_left_pending(client, sandbox)
    sandbox.script(["rate_limit"] * 5)
    env = {
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_PROVIDER": "sandbox",
        "PAYONCE_ACCOUNT": "acct_demo",
        "PAYONCE_JOURNAL": str(journal_path),
    }

    result = run_cli(["resume"], env=env, secrets=[DEFAULT_API_KEY])

    assert result.exit_code == 1
    assert f"step 2 of intent 'order-1' (key {key}) was never executed" in result.stdout
    assert "reference 'order-1#step2'" not in result.stdout
    assert client.journal.get(key).state is payonce.IntentState.PENDING  # type: ignore[union-attr]


def test_reconcile_names_a_step_whose_look_up_is_refused_by_its_position(
    make_client: MakeClient, make_sandbox: Any, caplog: pytest.LogCaptureFixture
) -> None:
    keys = {DEFAULT_API_KEY: "acct_demo"}
    provider = make_sandbox(api_keys=keys)  # a sandbox of its own: its key is revoked below
    client = make_client(base_url=provider.url, retry=payonce.RetryPolicy(max_attempts=1))
    with client.intent("order-1") as op:
        op.post("/v1/payments", json=PAYMENT)
        provider.script(["drop_after"])
        with pytest.raises(payonce.OutcomeUnknown):
            op.post("/v1/payments", json=SECOND)
    (_, (_, key, _)) = op.steps
    caplog.clear()
    # The key that sent it (the only one that may look it up) is revoked at the provider.
    keys.clear()

    (result,) = make_client(base_url=provider.url).reconcile("order-1#step2")

    assert (result.key, result.outcome) == (key, "error")
    assert (
        f"ProviderError: step 2 of intent 'order-1' (key {key}) could not be looked up: the "
        "provider refused the status look-up with HTTP 401" in caplog.text
    )
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_reconcile_names_a_step_no_key_here_sent_by_its_position(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    client = make_client(retry=payonce.RetryPolicy(max_attempts=1))
    with client.intent("order-1") as op:
        op.post("/v1/payments", json=PAYMENT)
        sandbox.script(["drop_after"])
        with pytest.raises(payonce.OutcomeUnknown):
            op.post("/v1/payments", json=SECOND)
    (_, (_, key, _)) = op.steps

    (result,) = make_client(api_key="sk_test_another_key").reconcile("order-1#step2")

    assert (result.key, result.outcome) == (key, "skipped")
    assert result.detail.startswith(f"step 2 of intent 'order-1' (key {key}) was sent with ")


def test_reconciling_a_block_by_its_reference_reconciles_its_unknown_step_too(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    # A reviewer's case: `payonce reconcile order-1` said "nothing to reconcile" and exited 0
    # while step 2 of the block was unknown (it is an intent of its own key).
    client = make_client(retry=payonce.RetryPolicy(max_attempts=1))
    with client.intent("order-1") as op:
        op.post("/v1/payments", json=PAYMENT)
        sandbox.script(["drop_after"])
        with pytest.raises(payonce.OutcomeUnknown):
            op.post("/v1/payments", json=SECOND)
    ((_, first, _), (_, second, state)) = op.steps
    assert state is payonce.IntentState.UNKNOWN, "the block shows what its step came to"

    results = make_client().reconcile("order-1")

    assert [(r.key, r.outcome) for r in results] == [(first, "skipped"), (second, "found")]
    assert client.journal.get(second).state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {first: 1, second: 1}


def test_payonce_reconcile_of_a_block_s_reference_does_not_say_all_clear_over_an_unknown_step(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    client = make_client(retry=payonce.RetryPolicy(max_attempts=1))
    with client.intent("order-2") as op:
        op.post("/v1/payments", json=PAYMENT)
        sandbox.script(["drop_after"])
        with pytest.raises(payonce.OutcomeUnknown):
            op.post("/v1/payments", json=SECOND)
    (_, (_, second, _)) = op.steps
    env = {
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_PROVIDER": "sandbox",
        "PAYONCE_ACCOUNT": client.account,
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
    }
    # The provider cannot be asked (it refuses the look-up): step 2 stays unknown.
    refused = run_cli(
        ["reconcile", "order-2", "--journal", str(journal_path), "--json"],
        env={**env, "PAYONCE_API_KEY": "sk_test_revoked"},
    )
    assert refused.exit_code == 1, refused.output
    assert second in refused.stdout
    assert client.journal.get(second).state is payonce.IntentState.UNKNOWN


def _row(key: str, reference: str) -> payonce.IntentRecord:
    return created_record(draft_for(2, key=key, reference=reference), "owner", 0.0, 30.0)


def _unknown(record: payonce.IntentRecord) -> payonce.OutcomeUnknown:
    words = f"intent {record.key} (reference {record.reference!r}) has an unknown outcome (…)"
    return payonce.OutcomeUnknown(words, key=record.key, reference=record.reference, reason="…")


@pytest.mark.parametrize(
    ("row", "named", "attributes"),
    [
        pytest.param(
            ("KEY-step2", "order-1#step2"),
            "step 2 of intent 'order-1' (key KEY-step2)",
            ("order-1", 2, "KEY"),
            id="a-block-with-a-reference",
        ),
        pytest.param(
            ("KEY-step3", "KEY#step3"),
            "step 3 of intent KEY (key KEY-step3)",
            (None, 3, "KEY"),
            id="a-block-opened-with-a-key-alone",
        ),
    ],
)
def test_an_error_about_a_step_s_row_names_the_step_its_block_and_its_key(
    row: tuple[str, str], named: str, attributes: tuple[Any, ...]
) -> None:
    record = _row(*row)

    error = of_step_row(_unknown(record), record, max_length=255)

    assert str(error) == f"{named} has an unknown outcome (…)"
    assert (error.key, error.reference, error.step, error.intent_key) == (record.key, *attributes)


@pytest.mark.parametrize(
    ("key", "reference"),
    [
        pytest.param("KEY", "order-1", id="an-intent-s-own-row"),
        pytest.param("01J9ZLEGACY", "legacy-9#step2", id="an-earlier-payonce-s-intent"),
        pytest.param("order-1-tip", "order-1#step2", id="a-key-the-caller-set-on-a-step"),
    ],
)
def test_an_error_about_a_row_not_keyed_as_a_step_is_left_as_it_was(
    key: str, reference: str
) -> None:
    """An intent an earlier payonce journaled under the reference ``legacy-9#step2`` is
    no "step 2 of intent 'legacy-9'"; a row under a key the caller set cannot be told
    from it, so neither is named as a step."""
    record = _row(key, reference)
    error = of_step_row(_unknown(record), record, max_length=255)
    assert str(error) == f"intent {key} (reference {reference!r}) has an unknown outcome (…)"
    assert (error.reference, error.step) == (reference, None)
