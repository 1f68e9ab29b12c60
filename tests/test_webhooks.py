"""The webhook inbox: verified, deduplicated by event id in the journal, handled once.

Everything is real: journal files (and a real PostgreSQL database for the
backend-parametrised contract), child processes racing on one journal and SIGKILLed
mid-handler, and the sandbox provider delivering signed webhooks over loopback HTTP to
a receiver served by uvicorn, the example app included.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import payonce
from helpers.journals import Inbox, OpenJournal, inbox_of, raw_transaction
from helpers.processes import EXAMPLES, deployed_env, python_env, run_example
from payonce._journal._engine import migrate
from payonce._journal._inbox import EventClaim
from payonce._journal._schema import SCHEMA_VERSION
from payonce._lifecycle import EventClaimKind
from payonce._owners import owner_is_dead
from payonce.sandbox import (
    DEFAULT_ACCOUNT,
    DEFAULT_API_KEY,
    SandboxConfig,
    SandboxServer,
    WebhookConfig,
    event_id_for,
)
from payonce.webhooks import Delivery, DeliveryOutcome, Event, WebhookInbox, sign

WORKER = Path(__file__).with_name("_webhook_worker.py")
KILLED = -signal.SIGKILL

SECRET = "whsec_test_current"
OLD_SECRET = "whsec_test_previous"
HANDLED = DeliveryOutcome.HANDLED
DUPLICATE = DeliveryOutcome.DUPLICATE
IN_PROGRESS = DeliveryOutcome.IN_PROGRESS


def event_body(event_id: str = "evt_1", event_type: str = "payment.succeeded") -> bytes:
    document = {
        "id": event_id,
        "object": "event",
        "type": event_type,
        "created": 1_800_000_000,
        "data": {"object": {"id": "pay_1", "amount": 4200, "currency": "eur"}},
    }
    return json.dumps(document, separators=(",", ":")).encode()


def signed(
    body: bytes, secrets: tuple[str, ...] = (SECRET,), *, at: float | None = None
) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Stripe-Signature": sign(body, secrets, timestamp=at),
    }


class Calls:
    """A handler that records the events it was given."""

    def __init__(self, fail: int = 0) -> None:
        self.events: list[Event] = []
        self.fail = fail
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)
            if self.fail > 0:
                self.fail -= 1
                raise RuntimeError(f"the warehouse is down (event {event.id})")

    @property
    def ids(self) -> list[str]:
        return [event.id for event in self.events]


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def make_inbox(journal_file: Path) -> Iterator[Callable[..., WebhookInbox]]:
    """Inboxes on the test's journal file (each its own connection), closed at the end."""
    opened: list[WebhookInbox] = []

    def make(*, secrets: Any = SECRET, **options: Any) -> WebhookInbox:
        inbox = WebhookInbox(options.pop("journal", journal_file), secrets, **options)
        opened.append(inbox)
        return inbox

    yield make
    for inbox in opened:
        inbox.close()


@pytest.fixture
def inbox(make_inbox: Callable[..., WebhookInbox]) -> WebhookInbox:
    return make_inbox()


# == the journal contract, on SQLite and PostgreSQL ==========================================


@pytest.fixture
def journal(open_journal: OpenJournal) -> payonce.Journal:
    """A journal on the test's store (conftest's ``location``): one "host"'s reads."""
    return open_journal()


@pytest.fixture
def events(journal: payonce.Journal) -> Inbox:
    """The same host's inbox writes, on that journal's engine."""
    return inbox_of(journal)


def claim(
    events: Inbox,
    event_id: str,
    owner: str,
    now: float,
    *,
    endpoint: str = "default",
    lease_seconds: float = 30.0,
    is_stale: Callable[[str], bool] = owner_is_dead,
) -> EventClaim:
    return events.claim_event(
        endpoint,
        event_id,
        event_type="payment.succeeded",
        payload_hash="h" * 64,
        owner=owner,
        now=now,
        lease_seconds=lease_seconds,
        is_stale=is_stale,
    )


def test_a_first_delivery_is_new_a_concurrent_one_leased_a_later_one_done(
    events: Inbox,
) -> None:
    first = claim(events, "evt_1", "host-a:1:1:a", 1000.0)
    assert first.kind is EventClaimKind.NEW
    assert (first.record.deliveries, first.record.handler_runs) == (1, 1)
    assert (first.record.lease_owner, first.record.lease_expires_at) == ("host-a:1:1:a", 1030.0)
    assert first.record.processed_at is None

    concurrent = claim(events, "evt_1", "host-b:2:2:b", 1001.0)
    assert concurrent.kind is EventClaimKind.LEASED
    assert concurrent.record.deliveries == 2

    assert events.finish_event("default", "evt_1", owner="host-a:1:1:a", now=1002.0) is True
    later = claim(events, "evt_1", "host-b:2:2:b", 1003.0)
    assert later.kind is EventClaimKind.DONE
    record = later.record
    assert (record.deliveries, record.handler_runs, record.processed_at) == (3, 1, 1002.0)
    assert (record.lease_owner, record.lease_expires_at) == (None, None)
    assert (record.type, record.received_at) == ("payment.succeeded", 1000.0)


def test_a_released_event_stays_unprocessed_and_the_next_delivery_runs_it_again(
    events: Inbox,
    journal: payonce.Journal,
) -> None:
    claim(events, "evt_1", "w1", 1000.0)
    events.release_event(
        "default", "evt_1", owner="w1", now=1001.0, error="RuntimeError: " + "x" * 900
    )
    released = journal.get_event("default", "evt_1")
    assert released is not None
    assert (released.processed_at, released.lease_owner) == (None, None)
    assert released.last_error is not None
    assert released.last_error.startswith("RuntimeError: x")
    assert len(released.last_error) == 500
    assert [e.event_id for e in journal.list_events(unprocessed=True)] == ["evt_1"]

    again = claim(events, "evt_1", "w2", 1002.0)
    assert again.kind is EventClaimKind.RETRY
    assert (again.record.handler_runs, again.record.lease_owner) == (2, "w2")
    # A release by a worker that no longer holds the event changes nothing.
    events.release_event("default", "evt_1", owner="w1", now=1003.0, error="late")
    assert events.finish_event("default", "evt_1", owner="w2", now=1004.0) is True
    done = journal.get_event("default", "evt_1")
    assert done is not None
    assert (done.processed_at, done.last_error) == (1004.0, None)
    assert journal.list_events(unprocessed=True) == []


def test_an_expired_lease_is_taken_over_and_the_slow_worker_learns_it_lost(
    events: Inbox,
    journal: payonce.Journal,
) -> None:
    claim(events, "evt_1", "other-host:1:1:a", 1000.0, lease_seconds=30)
    assert claim(events, "evt_1", "w2", 1029.0).kind is EventClaimKind.LEASED
    assert events.renew_event_lease(
        "default", "evt_1", owner="other-host:1:1:a", now=1029.5, lease_seconds=30
    )
    assert claim(events, "evt_1", "w2", 1059.0).kind is EventClaimKind.LEASED

    taken = claim(events, "evt_1", "w2", 1060.0)
    assert taken.kind is EventClaimKind.RETRY
    assert not events.renew_event_lease(
        "default", "evt_1", owner="other-host:1:1:a", now=1061.0, lease_seconds=30
    )
    # The slow worker's handler finished after all: the event is processed (it has been),
    # and the worker is told another one took it over.
    assert events.finish_event("default", "evt_1", owner="other-host:1:1:a", now=1062.0) is False
    assert events.finish_event("default", "evt_1", owner="w2", now=1063.0) is False
    record = journal.get_event("default", "evt_1")
    assert record is not None
    assert (record.processed_at, record.handler_runs, record.lease_owner) == (1062.0, 2, None)


def test_a_dead_owners_live_lease_is_broken_at_once(events: Inbox) -> None:
    claim(events, "evt_1", "dead-worker", 1000.0, lease_seconds=3600)
    judged: list[str] = []

    def is_stale(owner: str) -> bool:
        judged.append(owner)
        return owner == "dead-worker"

    # The workers of one inbox share its lease length.
    kept = claim(events, "evt_1", "w2", 1001.0, lease_seconds=3600, is_stale=lambda _: False)
    assert kept.kind is EventClaimKind.LEASED
    taken = claim(events, "evt_1", "w2", 1002.0, lease_seconds=3600, is_stale=is_stale)
    assert taken.kind is EventClaimKind.RETRY
    assert taken.record.lease_owner == "w2"
    assert judged == ["dead-worker"]


def test_event_ids_are_scoped_per_endpoint(events: Inbox, journal: payonce.Journal) -> None:
    assert claim(events, "evt_1", "w", 1000.0, endpoint="stripe:acct_1").kind is (
        EventClaimKind.NEW
    )
    assert claim(events, "evt_1", "w", 1000.0, endpoint="stripe:acct_2").kind is (
        EventClaimKind.NEW
    )
    assert events.finish_event("stripe:acct_1", "evt_1", owner="w", now=1001.0)
    assert [e.endpoint for e in journal.list_events(unprocessed=True)] == ["stripe:acct_2"]
    assert [e.endpoint for e in journal.list_events(endpoint="stripe:acct_1")] == ["stripe:acct_1"]


def test_hosts_claiming_one_event_at_once_let_exactly_one_handle_it(
    open_journal: OpenJournal,
) -> None:
    hosts = [open_journal() for _ in range(4)]
    inboxes = [inbox_of(host) for host in hosts]
    start = threading.Barrier(16)

    def deliver(number: int) -> EventClaimKind:
        start.wait()
        return claim(inboxes[number % 4], "evt_race", f"w{number}", 1000.0).kind

    with ThreadPoolExecutor(max_workers=16) as pool:
        kinds = collections.Counter(pool.map(deliver, range(16)))

    assert kinds == {EventClaimKind.NEW: 1, EventClaimKind.LEASED: 15}
    record = hosts[0].get_event("default", "evt_race")
    assert record is not None
    assert (record.deliveries, record.handler_runs) == (16, 1)


def test_processed_events_can_be_pruned_and_a_pruned_id_is_new_again(
    events: Inbox,
    journal: payonce.Journal,
) -> None:
    for number, now in ((1, 1000.0), (2, 2000.0), (3, 3000.0)):
        claim(events, f"evt_{number}", "w", now)
    events.finish_event("default", "evt_1", owner="w", now=1001.0)
    events.finish_event("default", "evt_2", owner="w", now=2001.0)

    assert journal.prune_events(processed_before=2001.0) == 1
    assert [e.event_id for e in journal.list_events()] == ["evt_2", "evt_3"]
    assert [e.event_id for e in journal.list_events(limit=1)] == ["evt_2"]
    assert claim(events, "evt_1", "w", 4000.0).kind is EventClaimKind.NEW


def test_a_schema_2_journal_gains_the_inbox_on_open(location: str) -> None:
    def refuse(why: str) -> payonce.JournalError:
        return payonce.JournalError(why, location=location)

    with raw_transaction(location) as tx:
        assert migrate(tx, target=2, refuse=refuse) == 0
        assert tx.one(tx.dialect.has_relation, ("webhook_events",)) is None

    journal = payonce.open_journal(location)
    try:
        report = journal.check()
        assert (report.ok, report.schema_version) == (True, SCHEMA_VERSION)
        assert claim(inbox_of(journal), "evt_1", "w", 1000.0).kind is EventClaimKind.NEW
    finally:
        journal.close()
    with raw_transaction(location) as tx:
        assert tx.one(tx.dialect.has_relation, ("webhook_events_processed",)) is not None


def test_a_journal_that_lost_its_inbox_table_is_reported_damaged(location: str) -> None:
    payonce.open_journal(location).close()
    with raw_transaction(location) as tx:
        tx.execute("DROP TABLE webhook_events")
    with pytest.raises(payonce.JournalError, match="table webhook_events is missing"):
        payonce.open_journal(location)


def test_the_inbox_on_either_backend_handles_once_also_after_a_restart(location: str) -> None:
    calls = Calls()
    body = event_body("evt_backend")
    with WebhookInbox(location, SECRET) as inbox:
        assert inbox.receive(body, signed(body), calls).outcome is HANDLED
        assert inbox.receive(body, signed(body), calls).outcome is DUPLICATE
    with WebhookInbox(location, [SECRET]) as restarted:
        delivery = restarted.receive(body, signed(body), calls)
        record = restarted.event("evt_backend")
    assert delivery.outcome is DUPLICATE
    assert calls.ids == ["evt_backend"]
    assert record is not None
    assert (record.deliveries, record.handler_runs) == (3, 1)


# == verification: nothing unverified is recorded or handled =================================


def test_a_well_signed_event_is_handled_once(inbox: WebhookInbox) -> None:
    calls = Calls()
    body = event_body("evt_good")

    delivery = inbox.receive(body, signed(body), calls)

    assert delivery.outcome is HANDLED
    assert (delivery.acknowledged, delivery.status_code) == (True, 200)
    assert (delivery.deliveries, delivery.handler_runs) == (1, 1)
    assert abs(delivery.signed_at - time.time()) < 5
    (event,) = calls.events
    assert (event.id, event.type, event.created) == ("evt_good", "payment.succeeded", 1.8e9)
    assert event.data["object"]["amount"] == 4200
    assert event.payload == body
    assert event.json()["object"] == "event"
    record = inbox.event("evt_good")
    assert record is not None
    assert record.processed_at is not None
    assert record.lease_owner is None


# Each case's headers are made when it runs, not at collection: a signature dated at import
# would go stale on a loaded machine before the case ran (the tolerance is 300 s).
@pytest.mark.parametrize(
    ("headers", "complaint"),
    [
        pytest.param(dict, "no signature header", id="missing"),
        pytest.param(lambda: {"Stripe-Signature": ""}, "no signature header", id="empty"),
        pytest.param(
            lambda: {"Stripe-Signature": "v1=abc"}, "no valid timestamp", id="no-timestamp"
        ),
        pytest.param(
            lambda: {"Stripe-Signature": f"t={int(time.time())}"}, "no v1 signature", id="no-v1"
        ),
        pytest.param(
            lambda: signed(event_body(), ("whsec_forged",)), "no signature matches", id="forged"
        ),
        pytest.param(
            lambda: signed(event_body() + b" "), "no signature matches", id="signed-another-body"
        ),
        pytest.param(
            lambda: signed(event_body(), at=time.time() - 3600),
            "old, beyond the 300s tolerance",
            id="stale",
        ),
        pytest.param(
            lambda: signed(event_body(), at=time.time() + 3600), "in the future", id="future"
        ),
        pytest.param(
            lambda: signed(event_body(), (OLD_SECRET,)),
            "secret that has been rotated away",
            id="rotated",
        ),
    ],
)
def test_bad_stale_or_missing_signatures_are_refused_and_nothing_is_recorded(
    inbox: WebhookInbox, headers: Callable[[], dict[str, str]], complaint: str
) -> None:
    calls = Calls()
    with pytest.raises(payonce.WebhookSignatureError, match=complaint):
        inbox.receive(event_body(), headers(), calls)
    assert calls.events == []
    assert inbox.journal.list_events() == []


def test_the_signature_header_is_found_whatever_its_case_and_the_name_is_configurable(
    make_inbox: Callable[..., WebhookInbox],
) -> None:
    body = event_body("evt_case")
    lower = {"stripe-signature": sign(body, [SECRET])}
    assert make_inbox().receive(body, lower, Calls()).outcome is HANDLED

    other = make_inbox(header="X-Provider-Signature", endpoint="other")
    with pytest.raises(payonce.WebhookSignatureError, match="no signature header"):
        other.receive(body, signed(body), Calls())
    custom = {"x-provider-signature": sign(body, [SECRET])}
    assert other.receive(body, custom, Calls()).outcome is HANDLED


def test_the_tolerance_is_configurable(make_inbox: Callable[..., WebhookInbox]) -> None:
    body = event_body("evt_old")
    old = signed(body, at=time.time() - 600)
    with pytest.raises(payonce.WebhookSignatureError, match="beyond the 300s tolerance"):
        make_inbox().receive(body, old, Calls())
    assert make_inbox(tolerance=900).receive(body, old, Calls()).outcome is HANDLED


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        pytest.param(b"not json", "not valid JSON", id="not-json"),
        pytest.param(b"[1, 2]", "not a JSON object", id="not-an-object"),
        pytest.param(b'{"type": "payment.succeeded"}', "has no id", id="no-id"),
        pytest.param(b'{"id": "", "type": "x"}', "has no id", id="empty-id"),
        pytest.param(b'{"id": "evt_1"}', "evt_1 has no type", id="no-type"),
        pytest.param(
            json.dumps({"id": "e" * 256, "type": "x"}).encode(), "at most 255", id="long-id"
        ),
    ],
)
def test_a_verified_body_that_is_no_event_is_refused_and_nothing_is_recorded(
    inbox: WebhookInbox, body: bytes, complaint: str
) -> None:
    with pytest.raises(payonce.WebhookError, match=complaint) as caught:
        inbox.receive(body, signed(body), Calls())
    assert not isinstance(caught.value, payonce.WebhookSignatureError)
    assert inbox.journal.list_events() == []


def test_a_decoded_str_body_is_refused_the_signature_covers_bytes(inbox: WebhookInbox) -> None:
    body = event_body()
    with pytest.raises(TypeError, match="raw bytes"):
        inbox.receive(body.decode(), signed(body), Calls())  # type: ignore[arg-type]


def test_misconfigurations_are_clear_errors(journal_file: Path) -> None:
    with pytest.raises(payonce.ConfigurationError, match="no webhook signing secret"):
        WebhookInbox(journal_file, [])
    with pytest.raises(payonce.ConfigurationError, match="non-empty string"):
        WebhookInbox(journal_file, [SECRET, ""])
    with pytest.raises(payonce.ConfigurationError, match="lease_seconds"):
        WebhookInbox(journal_file, SECRET, lease_seconds=0)
    assert not journal_file.exists(), "nothing is opened for a configuration it refuses"


# == rotation ================================================================================


@pytest.mark.parametrize(
    ("provider_signs_with", "receiver_knows"),
    [
        pytest.param((OLD_SECRET, SECRET), (SECRET,), id="provider-mid-rotation"),
        pytest.param((OLD_SECRET, SECRET), (OLD_SECRET,), id="receiver-not-yet-rotated"),
        pytest.param((SECRET,), (OLD_SECRET, SECRET), id="receiver-mid-rotation-new"),
        pytest.param((OLD_SECRET,), (SECRET, OLD_SECRET), id="receiver-mid-rotation-old"),
        pytest.param((OLD_SECRET, SECRET), (SECRET, OLD_SECRET), id="both-mid-rotation"),
    ],
)
def test_during_a_rotation_every_secret_on_either_side_is_tried(
    make_inbox: Callable[..., WebhookInbox],
    provider_signs_with: tuple[str, ...],
    receiver_knows: tuple[str, ...],
) -> None:
    body = event_body("evt_rotation")
    headers = signed(body, provider_signs_with)
    assert headers["Stripe-Signature"].count("v1=") == len(provider_signs_with)
    calls = Calls()
    assert make_inbox(secrets=receiver_knows).receive(body, headers, calls).outcome is HANDLED
    assert calls.ids == ["evt_rotation"]


# == redeliveries ============================================================================


def test_a_redelivery_is_recognised_and_not_handled_again_also_after_a_restart(
    make_inbox: Callable[..., WebhookInbox],
) -> None:
    calls = Calls()
    body = event_body("evt_redelivered")
    first = make_inbox()
    assert first.receive(body, signed(body), calls).outcome is HANDLED
    # A redelivery is signed afresh (a new timestamp) and carries the same event.
    again = first.receive(body, signed(body, at=time.time() + 1), calls)
    assert (again.outcome, again.acknowledged, again.status_code) == (DUPLICATE, True, 200)
    first.close()

    restarted = make_inbox()  # a new process would open the same file: same answer
    after_restart = restarted.receive(body, signed(body), calls)

    assert after_restart.outcome is DUPLICATE
    assert (after_restart.deliveries, after_restart.handler_runs) == (3, 1)
    assert calls.ids == ["evt_redelivered"]


def test_a_handler_that_raises_leaves_the_event_unprocessed_and_the_redelivery_handles_it(
    inbox: WebhookInbox,
) -> None:
    calls = Calls(fail=1)
    body = event_body("evt_flaky")

    with pytest.raises(RuntimeError, match="warehouse is down") as caught:
        inbox.receive(body, signed(body), calls)

    (unprocessed,) = inbox.unprocessed()
    assert unprocessed.event_id == "evt_flaky"
    assert unprocessed.last_error == f"RuntimeError: {caught.value}"
    assert unprocessed.lease_owner is None, "released at once, not left to expire"

    redelivery = inbox.receive(body, signed(body), calls)
    assert redelivery.outcome is HANDLED
    assert (redelivery.deliveries, redelivery.handler_runs) == (2, 2)
    assert inbox.receive(body, signed(body), calls).outcome is DUPLICATE
    assert calls.ids == ["evt_flaky", "evt_flaky"]
    assert inbox.unprocessed() == []


def test_a_delivery_while_another_worker_runs_the_handler_is_answered_409(
    make_inbox: Callable[..., WebhookInbox],
) -> None:
    body = event_body("evt_slow")
    entered, leave = threading.Event(), threading.Event()

    def slow(event: Event) -> None:
        entered.set()
        assert leave.wait(10)

    first, second = make_inbox(), make_inbox()
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(first.receive, body, signed(body), slow)
        assert entered.wait(10)
        meanwhile = second.receive(body, signed(body), Calls())
        leave.set()
        assert running.result().outcome is HANDLED

    assert (meanwhile.outcome, meanwhile.acknowledged, meanwhile.status_code) == (
        IN_PROGRESS,
        False,
        409,
    )
    assert second.receive(body, signed(body), Calls()).outcome is DUPLICATE


LONG_HANDLER_LEASE = 2.0
"""Renewed every 2/3 s: a renewal may come over a second late on a loaded machine and
still be in time."""


def _past_the_first_lease(inbox: WebhookInbox, event_id: str) -> None:
    """Until the lease the handler's worker first took has ended: only renewals keep it."""
    record = inbox.event(event_id)
    assert record is not None
    assert record.lease_expires_at is not None
    first_end = record.lease_expires_at
    while time.time() <= first_end:
        time.sleep(0.05)
    renewed = inbox.event(event_id)
    assert renewed is not None
    assert renewed.lease_expires_at is not None
    assert renewed.lease_expires_at > first_end, "the handler's lease was not renewed"


@pytest.mark.slow
def test_a_long_handler_keeps_its_lease_alive(make_inbox: Callable[..., WebhookInbox]) -> None:
    body = event_body("evt_long")
    entered, leave = threading.Event(), threading.Event()
    calls = Calls()

    def long(event: Event) -> None:
        entered.set()
        assert leave.wait(60)  # until the other worker has been answered

    first = make_inbox(lease_seconds=LONG_HANDLER_LEASE)
    second = make_inbox(lease_seconds=LONG_HANDLER_LEASE)
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(first.receive, body, signed(body), long)
        try:
            assert entered.wait(10)
            _past_the_first_lease(first, "evt_long")
            meanwhile = second.receive(body, signed(body), calls)
        finally:
            leave.set()
        assert running.result().outcome is HANDLED
    assert meanwhile.outcome is IN_PROGRESS
    assert calls.events == []


@pytest.mark.slow
def test_a_long_async_handler_keeps_its_lease_alive(
    make_inbox: Callable[..., WebhookInbox],
) -> None:
    body = event_body("evt_long_async")
    entered, leave = threading.Event(), threading.Event()

    async def long(event: Event) -> None:
        entered.set()
        while not leave.is_set():  # until the other worker has been answered
            await asyncio.sleep(0.01)

    first = make_inbox(lease_seconds=LONG_HANDLER_LEASE)
    second = make_inbox(lease_seconds=LONG_HANDLER_LEASE)
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(asyncio.run, first.areceive(body, signed(body), long))
        try:
            assert entered.wait(10)
            _past_the_first_lease(first, "evt_long_async")
            meanwhile = second.receive(body, signed(body), Calls())
        finally:
            leave.set()
        assert running.result().outcome is HANDLED
    assert meanwhile.outcome is IN_PROGRESS


def test_the_inbox_is_a_public_name(inbox: WebhookInbox) -> None:
    assert payonce.WebhookInbox is WebhookInbox


def test_a_payload_changed_under_the_same_id_is_still_deduplicated_and_logged(
    inbox: WebhookInbox, caplog: pytest.LogCaptureFixture
) -> None:
    body = event_body("evt_same")
    assert inbox.receive(body, signed(body), Calls()).outcome is HANDLED
    changed = event_body("evt_same", "payment.refunded")
    with caplog.at_level(logging.WARNING, logger="payonce"):
        assert inbox.receive(changed, signed(changed), Calls()).outcome is DUPLICATE
    assert "evt_same was delivered again with another body" in caplog.text


def test_a_coroutine_handler_given_to_receive_is_refused_and_the_event_left_unprocessed(
    inbox: WebhookInbox,
) -> None:
    async def handler(event: Event) -> None:
        raise AssertionError("never awaited")

    body = event_body("evt_async")
    with pytest.raises(payonce.ConfigurationError, match="use areceive"):
        inbox.receive(body, signed(body), handler)
    assert [e.event_id for e in inbox.unprocessed()] == ["evt_async"]


# == the async twin ==========================================================================


def test_areceive_handles_once_with_async_or_plain_handlers(inbox: WebhookInbox) -> None:
    seen: list[str] = []

    async def handler(event: Event) -> None:
        await asyncio.sleep(0)
        seen.append(event.id)

    async def scenario() -> list[Delivery]:
        first = event_body("evt_a1")
        second = event_body("evt_a2")
        return [
            await inbox.areceive(first, signed(first), handler),
            await inbox.areceive(first, signed(first), handler),
            await inbox.areceive(second, signed(second), lambda e: seen.append(e.id)),
        ]

    deliveries = asyncio.run(scenario())

    assert [d.outcome for d in deliveries] == [HANDLED, DUPLICATE, HANDLED]
    assert seen == ["evt_a1", "evt_a2"]


def test_areceive_releases_the_event_when_the_handler_raises_and_refuses_bad_signatures(
    inbox: WebhookInbox,
) -> None:
    body = event_body("evt_async_flaky")
    calls = Calls(fail=1)

    async def handler(event: Event) -> None:
        calls(event)

    async def scenario() -> Delivery:
        with pytest.raises(payonce.WebhookSignatureError):
            await inbox.areceive(body, signed(body, ("whsec_forged",)), handler)
        assert inbox.journal.list_events() == []
        with pytest.raises(RuntimeError, match="warehouse"):
            await inbox.areceive(body, signed(body), handler)
        assert [e.event_id for e in inbox.unprocessed()] == ["evt_async_flaky"]
        return await inbox.areceive(body, signed(body), handler)

    delivery = asyncio.run(scenario())
    assert (delivery.outcome, delivery.handler_runs) == (HANDLED, 2)


def test_a_cancelled_async_handler_leaves_the_event_for_its_redelivery(
    inbox: WebhookInbox,
) -> None:
    body = event_body("evt_cancelled")

    async def forever(event: Event) -> None:
        await asyncio.sleep(3600)

    async def scenario() -> None:
        task = asyncio.create_task(inbox.areceive(body, signed(body), forever))
        while not inbox.unprocessed():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    (record,) = inbox.unprocessed()
    assert (record.lease_owner, record.last_error) == (None, "CancelledError")
    assert inbox.receive(body, signed(body), Calls()).outcome is HANDLED


# == many processes, one journal =============================================================


def start_worker(tmp_path: Path, journal: str, body: bytes, *extra: str) -> subprocess.Popen[str]:
    payload = tmp_path / "payload.json"
    payload.write_bytes(body)
    command = [
        *(sys.executable, str(WORKER), "--journal", journal, "--secret", SECRET),
        *("--payload", str(payload), "--signature", sign(body, [SECRET])),
        *("--out", str(tmp_path / "handled.log")),
        *extra,
    ]
    return subprocess.Popen(
        command, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def handled_lines(tmp_path: Path) -> list[str]:
    log = tmp_path / "handled.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_one_event_delivered_5_times_at_once_to_8_processes_is_handled_exactly_once(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    journal = (
        str(tmp_path / "journal.db")
        if backend == "sqlite"
        else str(request.getfixturevalue("postgres_url"))
    )
    body = event_body("evt_stampede")
    go = tmp_path / "go"
    workers = [
        start_worker(
            tmp_path,
            journal,
            body,
            *("--deliveries", "5", "--hold", "0.5"),
            *("--ready", str(tmp_path / f"ready-{n}"), "--go", str(go)),
            *("--report", str(tmp_path / f"report-{n}.json")),
        )
        for n in range(8)
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{n}").exists() for n in range(8)):
        assert time.monotonic() < deadline, "the workers never became ready"
        assert all(w.poll() is None for w in workers), "a worker ended before the start"
        time.sleep(0.01)
    go.touch()  # all 40 deliveries start together
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr[-3000:]

    lines = handled_lines(tmp_path)
    assert len(lines) == 1, lines
    outcomes = collections.Counter[str]()
    for n in range(8):
        outcomes.update(json.loads((tmp_path / f"report-{n}.json").read_text())["outcomes"])
    assert sum(outcomes.values()) == 40
    assert outcomes["handled"] == 1
    assert outcomes["in_progress"] + outcomes["duplicate"] == 39
    assert outcomes["in_progress"] > 0, "the deliveries really overlapped"
    with WebhookInbox(journal, SECRET) as inbox:
        record = inbox.event("evt_stampede")
        assert record is not None
        assert (record.deliveries, record.handler_runs) == (40, 1)
        assert record.processed_at is not None
        assert inbox.receive(body, signed(body), Calls()).outcome is DUPLICATE


def test_a_worker_killed_mid_handler_leaves_a_claim_the_next_delivery_takes_over(
    tmp_path: Path,
) -> None:
    journal = str(tmp_path / "journal.db")
    body = event_body("evt_orphaned")
    started = tmp_path / "started"
    # A lease of an hour: only the dead-owner check can explain a take-over.
    worker = start_worker(
        tmp_path, journal, body, "--hang", "--started", str(started), "--lease-seconds", "3600"
    )
    deadline = time.monotonic() + 60
    while not started.exists():
        assert worker.poll() is None, worker.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(worker.pid, signal.SIGKILL)
    worker.communicate(timeout=30)
    assert worker.returncode == KILLED

    calls = Calls()
    with WebhookInbox(journal, SECRET, lease_seconds=3600) as inbox:
        (orphan,) = inbox.unprocessed()
        assert orphan.lease_owner is not None
        assert f":{worker.pid}:" in orphan.lease_owner
        assert orphan.lease_expires_at is not None
        assert orphan.lease_expires_at > time.time() + 3000

        delivery = inbox.receive(body, signed(body), calls)
        assert (delivery.outcome, delivery.deliveries, delivery.handler_runs) == (HANDLED, 2, 2)
        assert inbox.receive(body, signed(body), calls).outcome is DUPLICATE
    assert calls.ids == ["evt_orphaned"]
    assert len(handled_lines(tmp_path)) == 1, "the killed worker's handler had started once"


# == end to end: the sandbox delivers real webhooks over loopback ============================


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "webhook_receiver_example", EXAMPLES / "webhook_receiver.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = load_example()


def pay(sandbox: SandboxServer, journal: Path, orders: int, *, amount: int = 1000) -> None:
    with payonce.Client(
        base_url=sandbox.url,
        provider="sandbox",
        account=DEFAULT_ACCOUNT,
        api_key=DEFAULT_API_KEY,
        journal=journal,
        retry=payonce.RetryPolicy(initial_wait=0.001, max_wait=0.01, max_attempts=5),
    ) as client:
        for number in range(orders):
            with client.intent(f"order-{number:03d}") as op:
                op.post("/v1/payments", json={"amount": amount + number, "currency": "eur"})


def outcome_of(response: str) -> str:
    return str(json.loads(response)["outcome"]) if response else "?"


@pytest.mark.slow
def test_the_sandbox_redelivers_on_purpose_and_the_example_recognises_every_redelivery(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.db"
    inbox = WebhookInbox(journal, [SECRET])
    orders = EXAMPLE.Orders(tmp_path / "orders.db")
    app = EXAMPLE.create_app(inbox, orders)
    try:
        with EXAMPLE.Receiver(app) as receiver:
            webhooks = WebhookConfig(
                url=receiver.url, secrets=[OLD_SECRET, SECRET], redeliver_rate=0.5, seed=3
            )
            with SandboxServer(SandboxConfig(webhooks=webhooks)) as sandbox:
                pay(sandbox, journal, 12)
                assert sandbox.wait_for_webhooks(timeout=60)
                attempts = sandbox.webhook_attempts()
                payments = sandbox.store.payments()
                listed = httpx.get(sandbox.url + "/_sandbox/webhooks", trust_env=False).json()
        fulfilments = orders.fulfilments()
    finally:
        orders.close()
        inbox.close()

    events = {event_id_for(p["id"], "payment.succeeded"): p for p in payments}
    assert len(events) == 12
    assert {a.event_id for a in attempts} == set(events), "one stable event per payment"
    firsts = [a for a in attempts if not a.redelivery]
    redeliveries = [a for a in attempts if a.redelivery]
    assert len(firsts) == 12
    assert 2 <= len(redeliveries) <= 10, "a seeded share, on purpose"
    assert all(a.status_code == 200 and outcome_of(a.response) == "handled" for a in firsts)
    assert all(a.status_code == 200 and outcome_of(a.response) == "duplicate" for a in redeliveries)
    # Every order is fulfilled exactly once, by the event of its own payment.
    assert sorted(row[0] for row in fulfilments) == sorted(events)
    assert {row[1] for row in fulfilments} == {p["id"] for p in payments}
    # The control endpoint lists the same attempts, and never the secrets.
    assert [a["event_id"] for a in listed["attempts"]] == [a.event_id for a in attempts]
    assert listed["pending"] == 0
    assert listed["config"]["secrets"] == 2
    assert SECRET not in json.dumps(listed)


def test_a_failing_handler_is_retried_by_the_sandbox_until_the_event_is_handled(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.db"
    inbox = WebhookInbox(journal, SECRET)
    calls = Calls(fail=2)

    async def webhook(request: Request) -> JSONResponse:
        try:
            delivery = await inbox.areceive(await request.body(), request.headers, calls)
        except payonce.WebhookError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except RuntimeError:
            return JSONResponse({"outcome": "failed"}, status_code=500)
        return JSONResponse({"outcome": delivery.outcome.value}, status_code=delivery.status_code)

    app = Starlette(routes=[Route("/webhooks", webhook, methods=["POST"])])
    try:
        with EXAMPLE.Receiver(app) as receiver:
            webhooks = WebhookConfig(url=receiver.url, secrets=SECRET, retry_wait=0.01)
            with SandboxServer(SandboxConfig(webhooks=webhooks)) as sandbox:
                pay(sandbox, journal, 1)
                assert sandbox.wait_for_webhooks(timeout=30)
                attempts = sandbox.webhook_attempts()
    finally:
        inbox.close()

    assert [(a.attempt, a.status_code, outcome_of(a.response)) for a in attempts] == [
        (1, 500, "failed"),
        (2, 500, "failed"),
        (3, 200, "handled"),
    ]
    assert len(set(calls.ids)) == 1
    assert len(calls.ids) == 3


def test_the_sandbox_gives_up_after_its_attempts_and_signs_nothing_without_a_receiver(
    tmp_path: Path,
) -> None:
    with socket_without_listener() as url:
        webhooks = WebhookConfig(url=url, secrets=SECRET, max_attempts=3, retry_wait=0.01)
        with SandboxServer(SandboxConfig(webhooks=webhooks)) as sandbox:
            pay(sandbox, tmp_path / "journal.db", 1)
            assert sandbox.wait_for_webhooks(timeout=30)
            attempts = sandbox.webhook_attempts()
    assert [(a.attempt, a.status_code) for a in attempts] == [(1, None), (2, None), (3, None)]
    assert all(a.error and "ConnectError" in a.error for a in attempts)


@contextlib.contextmanager
def socket_without_listener() -> Iterator[str]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/webhooks"


def test_sandbox_webhook_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="non-empty strings"):
        WebhookConfig(url="http://127.0.0.1:1/", secrets=[])
    with pytest.raises(ValueError, match="between 0 and 1"):
        WebhookConfig(url="http://127.0.0.1:1/", secrets="s", redeliver_rate=1.5)
    with pytest.raises(ValueError, match="positive integer"):
        WebhookConfig(url="http://127.0.0.1:1/", secrets="s", max_attempts=0)
    assert WebhookConfig(url="u", secrets="s").secrets == ("s",)
    assert event_id_for("pay_1", "payment.succeeded") == event_id_for("pay_1", "payment.succeeded")
    assert event_id_for("pay_1", "payment.succeeded") != event_id_for("pay_1", "payment.failed")


def test_a_sandbox_without_webhooks_says_so(sandbox: SandboxServer) -> None:
    response = httpx.get(sandbox.url + "/_sandbox/webhooks", trust_env=False)
    assert response.status_code == 404
    with pytest.raises(RuntimeError, match="without webhooks"):
        sandbox.webhook_attempts()


@pytest.mark.slow
def test_the_example_demo_runs_as_a_user_would_run_it(tmp_path: Path) -> None:
    env = deployed_env(tmp_path / "home-example")
    result = run_example("webhook_receiver.py", cwd=tmp_path, env=env)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = result.stdout
    assert "redelivery: duplicate" in out
    assert "delivery: handled: 6" in out
    assert "orders fulfilled: 6, each once: True" in out
    assert "Traceback" not in result.stderr
