"""Every exchange has a total deadline: an answer trickled one byte at a time, each byte
well inside the read timeout, is cut, and the order is still paid exactly once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

import payonce
from helpers.payments import PAYMENT
from helpers.proxies import trickling_in_front_of
from payonce._runtime._deadline import default_attempt_timeout
from payonce.sandbox import SandboxServer

MakeClient = Callable[..., payonce.Client]
TWO_ATTEMPTS = payonce.RetryPolicy(max_attempts=2, initial_wait=0.01, max_wait=0.01)
# Every trickled byte arrives well inside the read timeout; only a total deadline cuts it.
TRICKLED = {"timeout": 2.0, "attempt_timeout": 0.5, "retry": TWO_ATTEMPTS}


def _every_attempt_was_cut(journal: payonce.Journal, key: str) -> None:
    attempts = journal.attempts(key)
    assert [a.error for a in attempts] == ["AttemptDeadlineExceeded"] * 2
    assert all(a.ambiguous for a in attempts), "cut after sending: it may have executed"


def test_a_trickled_answer_is_cut_and_the_order_is_paid_once(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    with trickling_in_front_of(sandbox.url, part="body") as proxy:
        slowed = make_client(base_url=proxy.url, **TRICKLED)
        with pytest.raises(payonce.OutcomeUnknown) as caught:
            slowed.post("/v1/payments", json=PAYMENT, reference="order-trickled")

    key = caught.value.key
    _every_attempt_was_cut(slowed.journal, key)
    (reconciled,) = make_client().reconcile(key)
    assert reconciled.after is payonce.IntentState.SUCCEEDED
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == {key: 1}


def test_an_answer_that_never_comes_is_cut_by_the_deadline_not_the_read_timeout(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # Not a byte for the whole deadline (the provider holds the payment): the wait, cut
    # short by the deadline well inside the read timeout, is the deadline's doing. (A
    # trickling proxy stalled by a loaded machine was told as a ReadTimeout.)
    once = {**TRICKLED, "retry": payonce.RetryPolicy(max_attempts=1)}
    cut = make_client(**once)
    with sandbox.holding(), pytest.raises(payonce.OutcomeUnknown) as caught:
        cut.post("/v1/payments", json=PAYMENT, reference="order-never-answered")

    key = caught.value.key
    (attempt,) = cut.journal.attempts(key)
    assert (attempt.error, attempt.ambiguous) == ("AttemptDeadlineExceeded", True)
    assert sandbox.wait_idle()
    (reconciled,) = make_client().reconcile(key)
    assert reconciled.after is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {key: 1}


def test_a_trickled_status_look_up_is_cut_too(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    sandbox.script(["drop_after"])
    with pytest.raises(payonce.OutcomeUnknown) as caught:
        make_client(retry=payonce.RetryPolicy(max_attempts=1)).post(
            "/v1/payments", json=PAYMENT, reference="order-looked-up-slowly"
        )

    with trickling_in_front_of(sandbox.url, part="body") as proxy:
        (slow,) = make_client(base_url=proxy.url, **TRICKLED).reconcile(caught.value.key)

    assert (slow.outcome, slow.after) == ("error", payonce.IntentState.UNKNOWN)
    assert "AttemptDeadlineExceeded" in slow.detail
    (direct,) = make_client().reconcile(caught.value.key)
    assert direct.after is payonce.IntentState.SUCCEEDED


MakeAsyncClient = Callable[..., payonce.AsyncClient]


@pytest.mark.anyio
@pytest.mark.parametrize("part", ["head", "body"])
async def test_async_cuts_an_answer_trickled_from_its_first_byte(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer, part: Any
) -> None:
    with trickling_in_front_of(sandbox.url, part=part) as proxy:
        slowed = make_async_client(base_url=proxy.url, **TRICKLED)
        with pytest.raises(payonce.OutcomeUnknown) as caught:
            await slowed.post("/v1/payments", json=PAYMENT, reference=f"order-{part}")

    key = caught.value.key
    _every_attempt_was_cut(slowed.journal, key)
    (reconciled,) = await make_async_client().reconcile(key)
    assert reconciled.after is payonce.IntentState.SUCCEEDED
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == {key: 1}


@pytest.mark.parametrize(
    ("timeout", "deadline"),
    [
        (httpx.Timeout(2.0), 8.0),
        (httpx.Timeout(5.0, connect=1.0, pool=None), 11.0),
        (httpx.Timeout(None), None),
    ],
)
def test_the_default_deadline_is_every_wait_of_a_well_behaved_exchange(
    timeout: httpx.Timeout, deadline: float | None
) -> None:
    assert default_attempt_timeout(timeout) == deadline


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_an_attempt_timeout_that_is_not_a_positive_number_is_refused(
    make_client: MakeClient, value: float
) -> None:
    with pytest.raises(payonce.ConfigurationError, match="attempt_timeout"):
        make_client(attempt_timeout=value)
