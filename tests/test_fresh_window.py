"""The key window bounds every attempt that could execute a second time, over real HTTP and
a real journal (red-team r17h, finding 3 and its low items):

- a call's own retries, once one of its attempts may have executed, as a resume's are;
  judged by the provider's clock where its answers' ``Date`` show it;
- a resend's first attempt, judged when it goes out, the provider's processing time
  included, not only when the resume begins;
- the provider asked its time again when one asking fails, never left to this host's
  clock alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

import payonce
from helpers.payments import MakeClient, leave_pending
from helpers.sandboxes import SharedSandboxes
from payonce.hooks import RetryEvent
from payonce.providers import get_profile, square_profile
from payonce.sandbox import SandboxConfig, SandboxServer

TEN_MINUTES = 600.0
SQUARE_TEN_MINUTES = square_profile(key_lifetime=TEN_MINUTES, key_lifetime_documented=True)
PATIENT = payonce.RetryPolicy(
    max_attempts=1000, max_elapsed=3600.0, initial_wait=0.01, max_wait=0.01, jitter=False
)
"""A call that would retry for an hour: only the key window can stop it sooner."""
EXECUTES_THEN_FAILS_THEN_FAILS = ["fail_after"] + ["fail_before"] * 4
"""The first attempt executes and its answer is a 503; the next four fail before executing."""


@pytest.fixture
def square(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    """A Square-like sandbox that forgets keys after ten minutes of its own clock."""
    return shared_sandboxes.get(
        "square-ten-minutes", SandboxConfig.like("square", key_lifetime=TEN_MINUTES)
    )


def square_payment() -> dict[str, Any]:
    return {"source_id": "cnon:card-nonce-ok", "amount_money": {"amount": 777, "currency": "USD"}}


def retrying_while_the_provider_ages(server: SandboxServer) -> dict[str, Any]:
    """The options of a client whose call meets ``EXECUTES_THEN_FAILS_THEN_FAILS`` (now
    scripted) and, while it waits after its second attempt, the provider's clock moving on
    past the key lifetime (700 s)."""
    server.script(EXECUTES_THEN_FAILS_THEN_FAILS)

    def age(event: RetryEvent) -> None:
        if event.attempt == 2:
            server.advance_clock(TEN_MINUTES + 100)

    return {
        "base_url": server.url,
        "provider": SQUARE_TEN_MINUTES,
        "retry": PATIENT,
        "on_retry": age,
    }


def test_a_call_retrying_through_503s_stops_once_the_provider_s_clock_passes_the_key_window(
    square: SandboxServer, make_client: MakeClient
) -> None:
    # The red-team's path: the call went on retrying for max_elapsed, and its sixth
    # attempt executed the payment again at a provider that had forgotten the key.
    client = make_client(**retrying_while_the_provider_ages(square))

    with pytest.raises(payonce.OutcomeUnknown) as unknown:
        client.post("/v2/payments", json=square_payment(), reference="long")

    key = unknown.value.key
    assert key is not None
    assert square.store.executions() == {key: 1}, "executed once, never again"
    (record,) = client.journal.find("long")
    assert record.state is payonce.IntentState.UNKNOWN
    assert record.attempt_count == 3  # the one its Date showed the key past the window
    assert "by the provider's clock it was first sent" in (record.unknown_reason or "")
    assert "key lifetime of 600s" in str(unknown.value)
    assert f"payonce abandon {key}" in str(unknown.value)


@pytest.mark.anyio
async def test_an_async_call_s_retries_stop_at_the_key_window_too(
    square: SandboxServer, make_async_client: Callable[..., payonce.AsyncClient]
) -> None:
    client = make_async_client(**retrying_while_the_provider_ages(square))

    with pytest.raises(payonce.OutcomeUnknown) as unknown:
        await client.post("/v2/payments", json=square_payment(), reference="long")

    assert square.store.executions() == {unknown.value.key: 1}


def test_a_call_retrying_inside_the_key_window_still_gets_its_answer(
    square: SandboxServer, make_client: MakeClient
) -> None:
    square.script(EXECUTES_THEN_FAILS_THEN_FAILS)
    client = make_client(base_url=square.url, provider=SQUARE_TEN_MINUTES, retry=PATIENT)

    paid = client.post("/v2/payments", json=square_payment(), reference="short")

    assert paid.status_code == 200
    assert payonce.response_info(paid).provider_replayed  # Square replayed the first
    assert square.store.total_executions() == 1


SANDBOX_WINDOW = get_profile("sandbox").key_lifetime * 0.9


def test_a_resume_s_first_resend_that_could_end_past_the_key_window_is_not_sent(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # 20 s short of the window when the resume begins; the provider may run the resend for
    # 30 s (max_processing): it could end past the window, when the key may be gone.
    left = leave_pending(make_client, "order-late")
    sandbox.advance_clock(SANDBOX_WINDOW - 20)

    client = make_client()
    (result,) = client.resume()

    assert result.state is payonce.IntentState.UNKNOWN
    assert "not resent: the provider may run it for 30s" in result.detail
    assert sandbox.store.executions() == {left.key: 1}
    (record,) = client.journal.find("order-late")
    assert record.attempt_count == 1, "no attempt was started again"


class LosesTheFirstClockReading(httpx.HTTPTransport):
    """A real transport whose first ``HEAD`` (the provider asked its time) is lost."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "HEAD":
            self.heads += 1
            if self.heads == 1:
                raise httpx.ConnectError("connection reset", request=request)
        return super().handle_request(request)


def test_one_lost_answer_to_the_provider_s_clock_is_asked_again(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # The provider aged 25 h and forgot the key; this host's clock says a moment passed.
    # One lost HEAD left the key's age to this host's clock: resent, and paid twice.
    left = leave_pending(make_client, "order-aged")
    sandbox.advance_clock(25 * 3600)
    transport = LosesTheFirstClockReading()

    (result,) = make_client(transport=transport).resume()

    assert transport.heads == 2
    assert result.state is payonce.IntentState.UNKNOWN
    assert "behind the provider's" in result.detail
    assert sandbox.store.executions() == {left.key: 1}
