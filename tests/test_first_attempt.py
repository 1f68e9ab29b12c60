"""An intent's attempts follow the retry policy: the waits, events and limits it gives,
decided by the drive (tenacity's stop rules), slept by the executor: no retry loop is built.

Every scenario runs against the real sandbox over loopback and a real journal file. The
expected numbers come from the ``RetryPolicy`` (jitter off), not from the implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import httpx
import pytest
import tenacity

import payonce
from helpers.payments import PAYMENT, MakeClient, make_unknown
from payonce.hooks import Hooks
from payonce.sandbox import Faults, SandboxServer

MakeAsyncClient = Callable[..., payonce.AsyncClient]

STEADY = payonce.RetryPolicy(initial_wait=0.01, multiplier=2.0, max_wait=1.0, jitter=False)
"""Waits of 0.01, 0.02, 0.04… seconds: known in advance, so each one can be checked."""


DRIVE_HOOKS = {"intent_started", "attempt_started", "attempt_ended", "retrying", "settled"} | {
    "unknown",
    "intent_ended",
}


class Recorder(Hooks):
    """The hook calls of a drive, in order, as (method name, event)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattribute__(self, name: str) -> Any:
        if name in DRIVE_HOOKS:
            calls = object.__getattribute__(self, "calls")
            return lambda event: calls.append((name, event))
        return super().__getattribute__(name)

    def of(self, name: str) -> list[Any]:
        return [event for called, event in self.calls if called == name]


@pytest.fixture
def loops_built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every tenacity loop built while the test runs, sync or async."""
    built: list[str] = []

    class Counted(tenacity.Retrying):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append("sync")
            super().__init__(*args, **kwargs)

    class AsyncCounted(tenacity.AsyncRetrying):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append("async")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tenacity, "Retrying", Counted)
    monkeypatch.setattr(tenacity, "AsyncRetrying", AsyncCounted)
    return built


def test_no_retry_loop_is_built_answered_at_once_or_retried(
    make_client: MakeClient, sandbox: SandboxServer, loops_built: list[str]
) -> None:
    client = make_client()
    for number in range(3):
        assert client.post("/v1/payments", json=PAYMENT, reference=f"o-{number}").is_success
    assert loops_built == []

    sandbox.script(["fail_before"])
    retried = client.post("/v1/payments", json=PAYMENT, reference="o-retried")
    assert retried.is_success
    assert payonce.response_info(retried).attempts == 2  # type: ignore[union-attr]
    assert loops_built == [], "the drive decides the retries; the executor only sleeps"


@pytest.mark.anyio
async def test_no_async_retry_loop_is_built_answered_at_once_or_retried(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer, loops_built: list[str]
) -> None:
    client = make_async_client()
    for number in range(3):
        response = await client.post("/v1/payments", json=PAYMENT, reference=f"o-{number}")
        assert response.is_success
    assert loops_built == []

    sandbox.script(["fail_before"])
    retried = await client.post("/v1/payments", json=PAYMENT, reference="o-retried")
    assert retried.is_success
    assert payonce.response_info(retried).attempts == 2  # type: ignore[union-attr]
    assert loops_built == [], "the drive decides the retries; the executor only sleeps"


SCENARIOS = {
    # scripted faults, the Retry-After the sandbox sends, and the waits the policy gives
    "one 503": (["fail_before"], 0.0, [STEADY.wait(1, None)]),
    "503, lost answer": (
        ["fail_before", "drop_after"],
        0.0,
        [STEADY.wait(1, None), STEADY.wait(2, None)],
    ),
    "429 with Retry-After, 503": (
        ["rate_limit", "fail_before"],
        0.05,
        [STEADY.wait(1, 0.05), STEADY.wait(2, None)],
    ),
}


@attrs.define
class Scenario:
    """Failures scripted at the sandbox, then a success; what the drive must look like."""

    sandbox: SandboxServer
    waits: list[float]
    recorder: Recorder = attrs.Factory(Recorder)

    def check(self, response: Any, journal: Any) -> None:
        calls = [name for name, _ in self.recorder.calls]
        failed = ["attempt_started", "attempt_ended", "retrying"] * len(self.waits)
        answered = ["attempt_started", "attempt_ended", "settled"]
        assert calls == ["intent_started", *failed, *answered, "intent_ended"]
        retries = self.recorder.of("retrying")
        assert [event.attempt for event in retries] == list(range(1, len(self.waits) + 1))
        assert [event.wait for event in retries] == pytest.approx(self.waits)
        assert all(event.reason for event in retries), "each retry says why"
        attempts = len(self.waits) + 1
        started = self.recorder.of("attempt_started")
        assert [event.attempt for event in started] == list(range(1, attempts + 1))
        assert self.recorder.of("settled")[0].attempts == attempts
        assert self.recorder.of("intent_ended")[0].attempts == attempts
        info = payonce.response_info(response)
        assert info is not None
        assert info.attempts == attempts
        assert len(journal.attempts(info.key)) == attempts
        assert self.sandbox.store.total_executions() == 1


@pytest.fixture(params=list(SCENARIOS.values()), ids=list(SCENARIOS))
def scenario(request: pytest.FixtureRequest, sandbox: SandboxServer) -> Scenario:
    faults, retry_after, waits = request.param
    sandbox.set_faults(Faults(retry_after_seconds=retry_after))
    sandbox.script(faults)
    return Scenario(sandbox, waits)


def test_a_failure_then_success_waits_and_tells_as_the_policy_says(
    make_client: MakeClient, scenario: Scenario
) -> None:
    client = make_client(retry=STEADY, hooks=scenario.recorder)
    response = client.post("/v1/payments", json=PAYMENT, reference="order-r")
    scenario.check(response, client.journal)


@pytest.mark.anyio
async def test_an_async_failure_then_success_waits_and_tells_as_the_policy_says(
    make_async_client: MakeAsyncClient, scenario: Scenario
) -> None:
    client = make_async_client(retry=STEADY, hooks=scenario.recorder)
    response = await client.post("/v1/payments", json=PAYMENT, reference="order-r")
    scenario.check(response, client.journal)


def test_max_attempts_counts_the_first_attempt(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    recorder = Recorder()
    client = make_client(
        retry=payonce.RetryPolicy(max_attempts=2, initial_wait=0.01, jitter=False), hooks=recorder
    )
    sandbox.script(["fail_before"] * 3)

    with pytest.raises(payonce.OutcomeUnknown) as caught:
        client.post("/v1/payments", json=PAYMENT, reference="order-2")

    assert len(recorder.of("attempt_started")) == 2
    assert len(recorder.of("retrying")) == 1, "no wait after the last attempt"
    assert client.journal.get(caught.value.key).attempt_count == 2  # type: ignore[arg-type,union-attr]


def test_max_elapsed_counts_from_the_first_attempt_s_start(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    # The first attempt times out after 0.2 s; the next would start 0.15 s later, 0.35 s
    # after the first began: past max_elapsed, so there is none. Counted from when the
    # first attempt failed, 0.15 s would have fitted.
    policy = payonce.RetryPolicy(initial_wait=0.15, max_elapsed=0.3, jitter=False)
    recorder = Recorder()
    client = make_client(retry=policy, timeout=0.2, hooks=recorder)
    sandbox.set_faults(Faults(delay_seconds=0.5))
    sandbox.script(["delay"])

    with pytest.raises(payonce.OutcomeUnknown) as caught:
        client.post("/v1/payments", json=PAYMENT, reference="order-slow")

    assert len(recorder.of("attempt_started")) == 1
    assert recorder.of("retrying") == []
    assert client.journal.get(caught.value.key).attempt_count == 1  # type: ignore[arg-type,union-attr]


class FirstLookUpRefused(httpx.HTTPTransport):
    """The real sandbox over loopback, except that the first status look-up (a GET) meets
    a refused connection, as when the provider's edge restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and not self.refused:
            self.refused += 1
            raise httpx.ConnectError("connection refused", request=request)
        return super().handle_request(request)


def test_a_reconciliation_s_look_ups_are_retried_with_no_retry_loop(
    make_client: MakeClient, sandbox: SandboxServer, loops_built: list[str]
) -> None:
    make_unknown(make_client, sandbox, "order-r1", "drop_after")
    make_unknown(make_client, sandbox, "order-r2", "drop_after")
    loops_built.clear()  # the payments' own retries, before reconciling
    client = make_client(retry=STEADY)

    (answered,) = client.reconcile("order-r1")
    assert (answered.outcome, answered.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert loops_built == []

    refusing = FirstLookUpRefused()
    (retried,) = make_client(retry=STEADY, transport=refusing).reconcile("order-r2")
    assert (retried.outcome, retried.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert refusing.refused == 1
    assert loops_built == [], "the drive retries the look-up; the executor only sleeps"


@pytest.mark.anyio
async def test_an_async_reconciliation_builds_no_retry_loop(
    make_client: MakeClient,
    make_async_client: MakeAsyncClient,
    sandbox: SandboxServer,
    loops_built: list[str],
) -> None:
    make_unknown(make_client, sandbox, "order-r3", "drop_after")
    loops_built.clear()
    client = make_async_client(retry=STEADY)

    (answered,) = await client.reconcile("order-r3")
    assert (answered.outcome, answered.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert loops_built == []
