"""Hooks: what a watcher is told as intents move, in which order, and what it never gets.

Every scenario runs against the real sandbox over loopback and a real journal file; a
``Recorder`` hook writes down each call, as an exporter would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

import payonce
from helpers.payments import PAYMENT, MakeClient, leave_pending, make_unknown
from payonce.hooks import (
    Hooks,
    JournalCommitted,
    RetryEvent,
)
from payonce.sandbox import DEFAULT_API_KEY, Faults, SandboxConfig, SandboxServer

BODY_MARK = "card-4242-body-mark"


HOOK_METHODS = {name for name in vars(Hooks) if not name.startswith("_")}


class Recorder(Hooks):
    """Every event but journal commits, in order, as (method name, event)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattribute__(self, name: str) -> Any:
        if name in HOOK_METHODS - {"journal_committed"}:
            calls = object.__getattribute__(self, "calls")
            return lambda event: calls.append((name, event))
        return super().__getattribute__(name)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def of(self, name: str) -> list[Any]:
        return [event for called, event in self.calls if called == name]


class Commits(Hooks):
    def __init__(self) -> None:
        self.commits: list[JournalCommitted] = []

    def journal_committed(self, event: JournalCommitted) -> None:
        self.commits.append(event)


class Broken(Hooks):
    """An exporter with a bug in every method."""

    def __getattribute__(self, name: str) -> Any:
        if name in HOOK_METHODS:

            def fail(event: object) -> None:
                raise RuntimeError(f"exporter bug in {name}")

            return fail
        return super().__getattribute__(name)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def test_one_drive_with_a_retry_is_told_in_order(
    make_client: MakeClient, sandbox: SandboxServer, recorder: Recorder
) -> None:
    client = make_client(hooks=recorder)
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit"])

    paid = client.post("/v1/payments", json=PAYMENT, reference="order-h1")

    key = paid.json()["idempotency_key"]
    assert recorder.names == [
        "intent_started",
        "attempt_started",
        "attempt_ended",
        "retrying",
        "attempt_started",
        "attempt_ended",
        "settled",
        "intent_ended",
    ]
    assert {event.key for _, event in recorder.calls} == {key}
    assert {event.reference for _, event in recorder.calls} == {"order-h1"}
    assert {(event.provider, event.account) for _, event in recorder.calls} == {
        ("sandbox", "acct_demo")
    }
    first, second = recorder.of("attempt_ended")
    assert (first.attempt, first.status_code) == (1, 429)
    assert (second.attempt, second.status_code, second.outcome) == (2, 201, "settled, succeeded")
    (settled,) = recorder.of("settled")
    assert (settled.state, settled.status_code, settled.attempts) == (
        payonce.IntentState.SUCCEEDED,
        201,
        2,
    )
    assert not recorder.of("intent_started")[0].resumed
    assert recorder.of("intent_ended")[0].state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {key: 1}


def test_a_settled_intent_called_again_is_a_replay_and_nothing_is_sent(
    make_client: MakeClient, sandbox: SandboxServer, recorder: Recorder
) -> None:
    make_client().post("/v1/payments", json=PAYMENT, reference="order-h2")
    client = make_client(hooks=recorder)

    again = client.post("/v1/payments", json=PAYMENT, reference="order-h2")

    (replayed,) = recorder.of("replayed")
    assert recorder.names == ["replayed"]
    assert (replayed.key, replayed.state, replayed.status_code) == (
        again.json()["idempotency_key"],
        payonce.IntentState.SUCCEEDED,
        201,
    )
    assert sandbox.store.total_executions() == 1


def test_an_outcome_that_cannot_be_known_is_told_as_unknown_and_logged_as_a_warning(
    make_client: MakeClient,
    sandbox: SandboxServer,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="payonce"):
        record = make_unknown(make_client, sandbox, "order-h3", "drop_after", hooks=recorder)

    (unknown,) = recorder.of("unknown")
    assert (unknown.key, unknown.reference) == (record.key, "order-h3")
    assert "retries exhausted" in unknown.reason
    ended = recorder.of("intent_ended")[-1]
    assert ended.state is payonce.IntentState.UNKNOWN
    assert recorder.names[-2:] == ["unknown", "intent_ended"]
    (warning,) = [r for r in caplog.records if "went unknown" in r.getMessage()]
    assert (warning.key, warning.reference, warning.state) == (  # type: ignore[attr-defined]
        record.key,
        "order-h3",
        "unknown",
    )


def test_resume_tells_each_intent_it_drove(
    make_client: MakeClient, sandbox: SandboxServer, recorder: Recorder
) -> None:
    left = leave_pending(make_client, "order-h4")
    client = make_client(hooks=recorder)

    client.resume()

    (started,) = recorder.of("intent_started")
    assert (started.key, started.resumed) == (left.key, True)
    (resumed,) = recorder.of("resumed")
    assert (resumed.key, resumed.state) == (left.key, payonce.IntentState.SUCCEEDED)
    assert recorder.names[-2:] == ["intent_ended", "resumed"]
    assert sandbox.store.executions() == {left.key: 1}


def test_reconcile_tells_the_look_up_and_what_it_concluded(
    make_client: MakeClient, sandbox: SandboxServer, recorder: Recorder
) -> None:
    record = make_unknown(make_client, sandbox, "order-h5", "drop_after")
    client = make_client(hooks=recorder)

    client.reconcile("order-h5")

    assert recorder.names == ["lookup_ended", "reconciled"]
    (lookup,) = recorder.of("lookup_ended")
    assert (lookup.key, lookup.reference, lookup.provider, lookup.account) == (
        record.key,
        "order-h5",
        "sandbox",
        "acct_demo",
    )
    assert (lookup.outcome, lookup.status_code, lookup.before_resend) == ("found", 200, False)
    # A real exchange over loopback: its measured duration, never the 0 of one not timed.
    assert lookup.elapsed is not None
    assert lookup.elapsed > 0
    (reconciled,) = recorder.of("reconciled")
    assert (reconciled.before, reconciled.after, reconciled.outcome) == (
        payonce.IntentState.UNKNOWN,
        payonce.IntentState.SUCCEEDED,
        "found",
    )


@pytest.mark.anyio
async def test_the_async_client_tells_the_same_story(
    make_async_client: Callable[..., payonce.AsyncClient],
    sandbox: SandboxServer,
    recorder: Recorder,
) -> None:
    client = make_async_client(hooks=recorder)
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit"])

    paid = await client.post("/v1/payments", json=PAYMENT, reference="order-h6")
    await client.post("/v1/payments", json=PAYMENT, reference="order-h6")

    assert recorder.names == [
        "intent_started",
        "attempt_started",
        "attempt_ended",
        "retrying",
        "attempt_started",
        "attempt_ended",
        "settled",
        "intent_ended",
        "replayed",
    ]
    assert sandbox.store.executions() == {paid.json()["idempotency_key"]: 1}


def test_a_hook_that_raises_never_changes_what_happens_to_the_payment(
    make_client: MakeClient, sandbox: SandboxServer, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    client = make_client(hooks=[Broken(), recorder])
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit"])

    with caplog.at_level(logging.WARNING, logger="payonce"):
        paid = client.post("/v1/payments", json=PAYMENT, reference="order-h7")

    key = paid.json()["idempotency_key"]
    assert paid.status_code == 201
    assert client.journal.get(key).state is payonce.IntentState.SUCCEEDED  # type: ignore[union-attr]
    assert sandbox.store.executions() == {key: 1}
    assert "settled" in recorder.names, "the hooks after a broken one are still told"
    failures = [r for r in caplog.records if "hook Broken." in r.getMessage()]
    assert {(r.key, r.reference) for r in failures} == {(key, "order-h7")}  # type: ignore[attr-defined]
    assert {r.state for r in failures} == {"pending", "succeeded"}  # type: ignore[attr-defined]
    assert {r.getMessage().split()[1] for r in failures} >= {
        "Broken.intent_started",
        "Broken.settled",
        "Broken.retrying",
    }


def test_events_carry_no_api_key_and_no_body(
    make_client: MakeClient, sandbox: SandboxServer, recorder: Recorder
) -> None:
    client = make_client(hooks=recorder)
    sandbox.script(["fail_before"])
    body = {**PAYMENT, "metadata": {"note": BODY_MARK}}
    paid = client.post("/v1/payments", json=body, reference="order-h8")
    client.post("/v1/payments", json=body, reference="order-h8")
    make_unknown(make_client, sandbox, "order-h9", "drop_after", hooks=recorder)
    make_client(hooks=recorder).reconcile("order-h9")

    assert BODY_MARK in paid.text, "the mark did travel"
    assert {"settled", "replayed", "unknown", "reconciled", "retrying"} <= set(recorder.names)
    for _, event in recorder.calls:
        for value in attrs.asdict(event).values():
            assert DEFAULT_API_KEY not in str(value)
            assert BODY_MARK not in str(value)


def test_journal_commits_are_timed_only_for_hooks_that_want_them(
    make_client: MakeClient, sandbox: SandboxServer, recorder: Recorder
) -> None:
    quiet = make_client(hooks=recorder)
    assert quiet.journal._engine._commit_watchers == ()
    commits = Commits()
    client = make_client(hooks=commits)

    client.post("/v1/payments", json=PAYMENT, reference="order-h10")

    assert [c.durable for c in commits.commits][:1] == [True], "the write-ahead is fsynced"
    assert len(commits.commits) >= 2
    assert {c.location for c in commits.commits} == {client.journal.location}
    assert min(c.seconds for c in commits.commits) >= 0
    client.close()
    assert client.journal._engine._commit_watchers == ()


def test_on_retry_is_the_short_form_of_a_retrying_hook(
    make_client: MakeClient, sandbox: SandboxServer, recorder: Recorder
) -> None:
    seen: list[RetryEvent] = []
    client = make_client(hooks=recorder, on_retry=seen.append)
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit"])

    client.post("/v1/payments", json=PAYMENT, reference="order-h11")

    assert seen == recorder.of("retrying")
    assert len(seen) == 1


@pytest.mark.parametrize("hooks", [print, [Recorder(), "log"], Hooks])
def test_hooks_that_are_not_hooks_are_refused_at_construction(
    make_client: MakeClient, hooks: object
) -> None:
    with pytest.raises(payonce.ConfigurationError, match=r"payonce\.Hooks instances"):
        make_client(hooks=hooks)


def test_every_log_record_about_an_intent_names_it(
    make_client: MakeClient, sandbox: SandboxServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit", "fail_before"])

    with caplog.at_level(logging.DEBUG, logger="payonce"):
        paid = client.post("/v1/payments", json=PAYMENT, reference="order-h12")

    key = paid.json()["idempotency_key"]
    about = [r for r in caplog.records if key in r.getMessage()]
    assert len(about) >= 4, "attempts, retries and the settlement are logged"
    for record in about:
        assert (record.key, record.reference) == (key, "order-h12")  # type: ignore[attr-defined]
        assert record.state in {"pending", "succeeded"}  # type: ignore[attr-defined]
    assert about[-1].state == "succeeded"  # type: ignore[attr-defined]


def test_look_ups_before_a_resend_are_told_within_the_drive(
    make_client: MakeClient, make_sandbox: Callable[..., SandboxServer], recorder: Recorder
) -> None:
    # The handler outlives the client's timeout on a server that does not guard a duplicate
    # in flight: payonce looks before it resends, and the provider's record settles it.
    racy = make_sandbox(processing_seconds=0.8, idempotency="racy")
    lookup = payonce.providers.Lookup(path="/v1/payments")
    profile = payonce.ProviderProfile(name="racy-verify", lookup=lookup, max_processing=3.0)
    retry = payonce.RetryPolicy(max_attempts=4, initial_wait=0.05, max_wait=0.05, max_elapsed=20)
    client = make_client(
        base_url=racy.url, provider=profile, timeout=0.3, retry=retry, hooks=recorder
    )

    paid = client.post("/v1/payments", json=PAYMENT, reference="order-h13")

    lookups = recorder.of("lookup_ended")
    assert lookups, "it looked before resending"
    assert all(event.before_resend for event in lookups)
    assert lookups[-1].outcome == "found"
    first, *_ = [n for n, name in enumerate(recorder.names) if name == "lookup_ended"]
    assert recorder.names.index("intent_started") < first < recorder.names.index("intent_ended")
    (settled,) = recorder.of("settled")
    assert settled.provider_replayed, "settled from the provider's record"
    assert racy.wait_idle()
    assert racy.store.executions() == {paid.json()["idempotency_key"]: 1}


def test_a_look_up_that_cannot_see_a_stripe_confirm_is_told_as_cannot_tell(
    recorder: Recorder, journal_path: Path
) -> None:
    # Stripe's search finds only creations (they carry the metadata tag): its empty answer
    # about a confirm proves nothing, and an exporter must not count it as "not found".
    with SandboxServer(SandboxConfig.like("stripe")) as stripe_like:
        client = payonce.Client(
            base_url=stripe_like.url,
            provider="stripe",
            account="acct_demo",
            api_key=DEFAULT_API_KEY,
            journal=journal_path,
            retry=payonce.RetryPolicy(max_attempts=1, initial_wait=0),
            hooks=recorder,
        )
        with client:
            with client.intent("order-h10"):
                payment = {"amount": 4200, "currency": "eur"}
                created = client.post("/v1/payment_intents", data=payment)
                stripe_like.script(["fail_after"])  # the confirm executes, then a 503
                with pytest.raises(payonce.OutcomeUnknown) as unknown:
                    client.post(
                        f"/v1/payment_intents/{created.json()['id']}/confirm",
                        data={"payment_method": "pm_card_visa"},
                    )
            (result,) = client.reconcile(unknown.value.key)

    assert result.outcome == payonce.records.ReconcileOutcome.CANNOT_TELL
    (lookup,) = recorder.of("lookup_ended")
    assert (lookup.outcome, lookup.status_code) == ("cannot_tell", 200)
    (reconciled,) = recorder.of("reconciled")
    assert (reconciled.after, reconciled.outcome) == (payonce.IntentState.PENDING, "cannot_tell")
