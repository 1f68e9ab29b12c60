"""The journal contract, once, against both backends; then PostgreSQL end to end.

Every ``backend``-parametrised test runs on a real SQLite file and on a real PostgreSQL
database of its own (tests/pgserver.py starts the server). Another "host" is another
journal instance on the same store: its own connection (SQLite) or its own pool
(PostgreSQL). No mocks: the end-to-end tests drive ``payonce.Client`` against the real
sandbox provider on loopback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

import payonce
from helpers.journals import (
    RESPONSE,
    IntentDraft,
    IntentStore,
    OpenJournal,
    draft_for,
    raw_transaction,
    rows,
    settle,
    store_of,
)
from helpers.payments import PAYMENT, DiesAfterSending, MakeClient, paying_in_background
from payonce._journal import _rows
from payonce._journal import _sql as sql
from payonce._journal._engine import migrate
from payonce._journal._postgres import PostgresJournal
from payonce._journal._schema import SCHEMA_VERSION
from payonce._lifecycle import ClaimKind, Transition, make_scope
from payonce.journal import StoredResponse
from payonce.sandbox import SandboxServer
from pgserver import PostgresServer

SUCCEEDED = payonce.IntentState.SUCCEEDED
PENDING = payonce.IntentState.PENDING
UNKNOWN = payonce.IntentState.UNKNOWN


# -- one journal store per test, on either backend (the fixtures of conftest.py) -------------


@pytest.fixture
def journal(open_journal: OpenJournal) -> payonce.Journal:
    return open_journal()


@pytest.fixture
def store(journal: payonce.Journal) -> IntentStore:
    """The journal's private writes, as a client on it makes them."""
    return store_of(journal)


def test_a_closed_journal_raises_journal_error(open_journal: OpenJournal) -> None:
    journal = open_journal()
    store = store_of(journal)
    journal.close()
    with pytest.raises(payonce.JournalError):
        journal.get("key-00001")
    with pytest.raises(payonce.JournalError):
        store.claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)
    journal.close()  # closing twice is fine


# -- claim: create, replay, refuse ---------------------------------------------------------


def test_a_claim_creates_the_intent_with_its_first_attempt_started_for_every_reader(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    claim = store.claim(draft_for(7), owner="w1", now=1000.0, lease_seconds=30)

    assert (claim.kind, claim.attempt_number) == (ClaimKind.CREATED, 1)
    record = claim.record
    assert (record.key, record.reference, record.state) == ("key-00007", "order-00007", PENDING)
    assert (record.lease_owner, record.lease_expires_at) == ("w1", 1030.0)
    assert (record.created_at, record.first_sent_at, record.attempt_count) == (1000.0, 1000.0, 1)
    assert record.body == b'{"amount":1007,"currency":"eur"}'
    assert record.request_headers == (("content-type", "application/json"),)
    # Another host sees the write-ahead record at once.
    other = open_journal()
    assert other.get("key-00007") == record
    assert [(a.number, a.in_flight) for a in other.attempts("key-00007")] == [(1, True)]


@pytest.mark.parametrize("acknowledge", [False, True], ids=["answer-kept", "answer-returned"])
def test_the_record_a_settle_returns_is_the_row_every_reader_then_reads(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal, acknowledge: bool
) -> None:
    # Built from what the settle wrote, not read back: it must be exactly the stored row,
    # after a second attempt too (the attempt count and first send the claim did not know).
    store.claim(draft_for(3), owner="w1", now=1000.0, lease_seconds=30)
    store.end_attempt(
        "key-00003",
        1,
        transition=Transition.ATTEMPT_NOT_EXECUTED,
        owner="w1",
        now=1001.0,
        status_code=503,
        error=None,
    )
    number = store.start_attempt("key-00003", owner="w1", now=1002.0, lease_seconds=30)

    record = store.settle(
        "key-00003",
        transition=Transition.SUCCEEDED,
        owner="w1",
        now=1003.0,
        response=attrs.evolve(RESPONSE, headers=[list(pair) for pair in RESPONSE.headers]),
        attempt=number,
        acknowledge_success=acknowledge,
    )

    assert record == open_journal().get("key-00003")
    assert (record.attempt_count, record.updated_at) == (2, 1003.0)
    assert record.acknowledged_at == (1003.0 if acknowledge else None)
    assert record.response is not None
    assert record.response.headers == RESPONSE.headers


def test_a_settled_intent_is_replayed_byte_for_byte(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    created = store.claim(draft_for(1), owner="w1", now=1000.0, lease_seconds=30)
    settle(store, created.record.key, "w1", 1001.0)

    claim = store_of(open_journal()).claim(
        draft_for(1, key="another"), owner="w2", now=1002.0, lease_seconds=30
    )

    assert claim.kind is ClaimKind.FINAL
    stored = claim.record.response
    assert stored is not None
    assert (stored.status, stored.headers, stored.body) == (201, RESPONSE.headers, RESPONSE.body)
    assert (stored.body_stored, stored.stored_by, stored.schema_version) == (
        True,
        payonce.__version__,
        SCHEMA_VERSION,
    )
    assert (claim.record.state, claim.record.lease_owner) == (SUCCEEDED, None)
    assert [(a.number, a.status_code, a.ambiguous) for a in journal.attempts("key-00001")] == [
        (1, 201, False)
    ]


def test_a_body_over_the_cap_is_stored_as_not_kept(
    journal: payonce.Journal, store: IntentStore
) -> None:
    created = store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    partial = StoredResponse(status=201, headers=(), body=b"", body_stored=False)
    record = store.settle(
        created.record.key,
        owner="w",
        now=1001.0,
        transition=Transition.SUCCEEDED,
        response=partial,
        attempt=1,
    )
    assert record.response is not None
    assert record.response.body_stored is False


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(lambda: draft_for(1, amount=999), id="other-body"),
        pytest.param(
            lambda: draft_for(1, key="key-99999", key_supplied=True), id="reference-bound-to-key"
        ),
        pytest.param(lambda: draft_for(1, reference=None, path="/v1/refunds"), id="other-scope"),
    ],
)
def test_the_same_intent_asked_for_differently_is_a_mismatch_and_changes_nothing(
    journal: payonce.Journal, store: IntentStore, changed: Callable[[], IntentDraft]
) -> None:
    store.claim(draft_for(1), owner="w1", now=1000.0, lease_seconds=30)
    store.release("key-00001", owner="w1")
    before = journal.get("key-00001")

    claim = store.claim(changed(), owner="w2", now=2000.0, lease_seconds=30)

    assert claim.kind is ClaimKind.MISMATCH
    assert claim.record.key == "key-00001"
    assert journal.get("key-00001") == before
    assert len(journal.list_intents()) == 1


def test_a_supplied_key_finds_its_intent_without_a_reference(
    journal: payonce.Journal, store: IntentStore
) -> None:
    store.claim(
        draft_for(1, reference=None, key="k-1", key_supplied=True),
        owner="w",
        now=1.0,
        lease_seconds=30,
    )
    settle(store, "k-1", "w", 2.0)
    again = store.claim(
        draft_for(1, reference=None, key="k-1", key_supplied=True),
        owner="x",
        now=3.0,
        lease_seconds=30,
    )
    assert (again.kind, again.record.key) == (ClaimKind.FINAL, "k-1")


# -- leases ---------------------------------------------------------------------------------


def test_a_live_lease_is_respected_by_another_host_until_it_expires(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    store.claim(draft_for(1), owner="host-a", now=1000.0, lease_seconds=30)
    other = open_journal()
    other_store = store_of(other)

    assert other_store.claim(draft_for(1), owner="host-b", now=1029.0, lease_seconds=30).kind is (
        ClaimKind.LEASED
    )
    assert other_store.claim_key(
        "key-00001", owner="host-b", now=1029.0, lease_seconds=30
    ).kind is (  # type: ignore[union-attr]
        ClaimKind.LEASED
    )
    # The holder itself may claim again (a retry in the same worker).
    assert store.claim(draft_for(1), owner="host-a", now=1029.0, lease_seconds=30).kind is (
        ClaimKind.CLAIMED
    )
    taken = other_store.claim(draft_for(1), owner="host-b", now=1060.0, lease_seconds=30)
    assert (taken.kind, taken.record.lease_owner, taken.record.lease_expires_at) == (
        ClaimKind.CLAIMED,
        "host-b",
        1090.0,
    )


def test_a_settle_right_after_its_claim_is_refused_once_the_lease_was_taken_over(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    # The settle trusts the record its claim created only as far as its UPDATE proves it:
    # taken over meanwhile, that UPDATE matches nothing and the settle is refused.
    store.claim(draft_for(1), owner="old", now=1000.0, lease_seconds=30)
    other = open_journal()
    other_store = store_of(other)
    assert other_store.claim_key("key-00001", owner="new", now=1031.0, lease_seconds=30) is not None
    before = other.get("key-00001")

    with pytest.raises(payonce.IntentInFlight, match="no longer held"):
        settle(store, "key-00001", "old", 1032.0)

    assert other.get("key-00001") == before
    assert [a.ended_at for a in other.attempts("key-00001")] == [None]


def test_a_one_shot_settle_returns_the_row_every_reader_then_reads(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    store.claim(draft_for(4), owner="w1", now=1000.0, lease_seconds=30)
    store.renew_lease("key-00004", owner="w1", now=1010.0, lease_seconds=30)

    record = store.settle(
        "key-00004",
        transition=Transition.SUCCEEDED,
        owner="w1",
        now=1011.0,
        response=RESPONSE,
        attempt=1,
        acknowledge_success=True,
    )

    assert record == open_journal().get("key-00004")
    assert [(a.number, a.status_code, a.ended_at) for a in journal.attempts("key-00004")] == [
        (1, 201, 1011.0)
    ]


def test_a_journal_keeps_no_created_record_past_its_intent_s_next_write(
    journal: payonce.Journal,
    store: IntentStore,
) -> None:
    for number in (1, 2, 3):
        store.claim(draft_for(number), owner="w", now=1000.0, lease_seconds=30)
    settle(store, "key-00001", "w", 1001.0)
    store.release("key-00002", owner="w")
    store.end_attempt(
        "key-00003",
        1,
        transition=Transition.ATTEMPT_NOT_EXECUTED,
        owner="w",
        now=1001.0,
        status_code=503,
        error=None,
    )

    assert store._kept is not None
    assert store._kept._records == {}


def test_a_worker_whose_lease_was_taken_over_can_neither_write_nor_renew(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    store.claim(draft_for(1), owner="old", now=1000.0, lease_seconds=30)
    other = open_journal()
    other_store = store_of(other)
    assert other_store.claim_key("key-00001", owner="new", now=1031.0, lease_seconds=30) is not None

    assert store.renew_lease("key-00001", owner="old", now=1032.0, lease_seconds=30) is False
    with pytest.raises(payonce.IntentInFlight, match="no longer held"):
        store.start_attempt("key-00001", owner="old", now=1032.0, lease_seconds=30)
    with pytest.raises(payonce.IntentInFlight):
        store.end_attempt(
            "key-00001",
            1,
            owner="old",
            now=1032.0,
            status_code=503,
            error=None,
            transition=Transition.ATTEMPT_AMBIGUOUS,
        )
    with pytest.raises(payonce.IntentInFlight):
        settle(store, "key-00001", "old", 1032.0)
    with pytest.raises(payonce.IntentInFlight):
        store.mark_unknown(
            "key-00001", transition=Transition.EXHAUSTED, owner="old", now=1032.0, reason="x"
        )
    store.release("key-00001", owner="old")  # a no-op: not the holder

    record = other.get("key-00001")
    assert record is not None
    assert (record.state, record.lease_owner) == (PENDING, "new")
    assert other_store.renew_lease("key-00001", owner="new", now=1040.0, lease_seconds=30) is True
    assert other.get("key-00001").lease_expires_at == 1070.0  # type: ignore[union-attr]


def test_a_dead_owner_s_live_lease_is_broken_and_no_one_else_s(
    journal: payonce.Journal, store: IntentStore
) -> None:
    store.claim(draft_for(1), owner="dead", now=1000.0, lease_seconds=60)

    refused = store.claim(
        draft_for(1), owner="me", now=1001.0, lease_seconds=60, is_stale=lambda o: o == "x"
    )
    taken = store.claim(
        draft_for(1), owner="me", now=1001.0, lease_seconds=60, is_stale=lambda o: o == "dead"
    )

    assert refused.kind is ClaimKind.LEASED
    assert (taken.kind, taken.record.lease_owner) == (ClaimKind.CLAIMED, "me")


def test_a_lease_expiring_a_year_ahead_is_not_trusted(
    journal: payonce.Journal, store: IntentStore
) -> None:
    a_year = 365 * 86_400.0
    store.claim(draft_for(1), owner="elsewhere/x:1:1:ab", now=1000.0, lease_seconds=a_year)

    taken = store.claim(draft_for(1), owner="me", now=1001.0, lease_seconds=60)

    assert (taken.kind, taken.record.lease_owner) == (ClaimKind.CLAIMED, "me")


def test_release_leaves_the_intent_pending_and_free(
    journal: payonce.Journal, store: IntentStore
) -> None:
    store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=60)
    store.release("key-00001", owner="w")
    record = journal.get("key-00001")
    assert record is not None
    assert (record.state, record.lease_owner, record.lease_expires_at) == (PENDING, None, None)
    assert store.claim(draft_for(1), owner="x", now=1001.0, lease_seconds=60).kind is (
        ClaimKind.CLAIMED
    )


# -- attempts -------------------------------------------------------------------------------


def test_attempts_are_numbered_in_order_and_record_how_they_ended(
    journal: payonce.Journal, store: IntentStore
) -> None:
    store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    store.end_attempt(
        "key-00001",
        1,
        owner="w",
        now=1001.0,
        status_code=503,
        error=None,
        transition=Transition.ATTEMPT_NOT_EXECUTED,
    )
    assert store.start_attempt("key-00001", owner="w", now=1002.0, lease_seconds=30) == 2
    store.end_attempt(
        "key-00001",
        2,
        owner="w",
        now=1003.0,
        status_code=None,
        error="ReadTimeout",
        transition=Transition.ATTEMPT_AMBIGUOUS,
    )
    assert store.start_attempt("key-00001", owner="w", now=1004.0, lease_seconds=45) == 3

    record = journal.get("key-00001")
    assert record is not None
    assert (record.first_sent_at, record.lease_expires_at, record.attempt_count) == (
        1000.0,
        1049.0,
        3,
    )
    assert [
        (a.number, a.started_at, a.ended_at, a.status_code, a.error, a.ambiguous)
        for a in journal.attempts("key-00001")
    ] == [
        (1, 1000.0, 1001.0, 503, None, False),
        (2, 1002.0, 1003.0, None, "ReadTimeout", True),
        (3, 1004.0, None, None, None, None),
    ]


# -- unknown, reconciliation, abandon, acknowledge ------------------------------------------


def test_an_unknown_intent_is_never_claimed_for_sending_but_can_be_reconciled(
    journal: payonce.Journal,
    store: IntentStore,
) -> None:
    store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    marked = store.mark_unknown(
        "key-00001",
        transition=Transition.EXHAUSTED,
        owner="w",
        now=1001.0,
        reason="retries exhausted",
    )
    assert (marked.state, marked.unknown_reason, marked.lease_owner) == (
        UNKNOWN,
        "retries exhausted",
        None,
    )

    assert store.claim(draft_for(1), owner="x", now=1002.0, lease_seconds=30).kind is (
        ClaimKind.UNKNOWN
    )
    assert store.claim_key("key-00001", owner="x", now=1002.0, lease_seconds=30).kind is (  # type: ignore[union-attr]
        ClaimKind.UNKNOWN
    )
    claim = store.claim_key("key-00001", owner="r", now=1002.0, lease_seconds=30, unknown=True)
    assert claim is not None
    assert claim.kind is ClaimKind.CLAIMED

    still = store.reconciled(
        "key-00001",
        owner="r",
        now=1003.0,
        outcome="still_unknown",
        detail="provider says processing",
        status_code=200,
        transition=Transition.RECONCILED_AMBIGUOUS,
    )
    assert (still.state, still.unknown_reason, still.lease_owner) == (
        UNKNOWN,
        "provider says processing",
        None,
    )
    store.claim_key("key-00001", owner="r", now=1003.0, lease_seconds=30, unknown=True)
    found = store.reconciled(
        "key-00001",
        owner="r",
        now=1003.0,
        outcome="found",
        detail="paid",
        status_code=200,
        transition=Transition.RECONCILED_SUCCEEDED,
        response=RESPONSE,
    )
    assert (found.state, found.unknown_reason, found.response.body) == (  # type: ignore[union-attr]
        SUCCEEDED,
        None,
        RESPONSE.body,
    )
    assert [(r.at, r.outcome, r.status_code) for r in journal.reconciliations("key-00001")] == [
        (1003.0, "still_unknown", 200),
        (1003.0, "found", 200),
    ]
    assert store.claim_key("no-such-key", owner="r", now=1.0, lease_seconds=30) is None


def test_abandon_closes_pending_or_unknown_intents_only(
    journal: payonce.Journal, store: IntentStore
) -> None:
    store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    with pytest.raises(payonce.IntentInFlight, match="right now"):
        journal.abandon("key-00001", reason="ops", now=1001.0)

    abandoned = journal.abandon("key-00001", reason="refunded by hand", now=1031.0)

    assert (abandoned.state, abandoned.abandon_reason, abandoned.lease_owner) == (
        payonce.IntentState.ABANDONED,
        "refunded by hand",
        None,
    )
    assert store.claim(draft_for(1), owner="x", now=1032.0, lease_seconds=30).kind is (
        ClaimKind.FINAL
    )
    with pytest.raises(payonce.IntentStateError, match="already abandoned"):
        journal.abandon("key-00001", reason="again", now=1033.0)
    with pytest.raises(payonce.JournalError, match="no intent"):
        journal.abandon("key-nope", reason="x", now=1.0)


def test_acknowledge_takes_settled_intents_off_the_outbox_once(
    journal: payonce.Journal, store: IntentStore
) -> None:
    for number, account in ((1, "acct_a"), (2, "acct_b"), (3, "acct_a")):
        draft = draft_for(number, account=account)
        store.claim(draft, owner="w", now=1000.0 + number, lease_seconds=30)
        settle(store, draft.key, "w", 1010.0)
    store.claim(draft_for(4), owner="w", now=1004.0, lease_seconds=30)
    with pytest.raises(payonce.IntentStateError, match="only a settled intent"):
        journal.acknowledge("key-00004", now=1.0)

    assert [r.key for r in journal.unacknowledged()] == ["key-00001", "key-00002", "key-00003"]
    assert [r.key for r in journal.unacknowledged(account="acct_a")] == ["key-00001", "key-00003"]
    first = journal.acknowledge("key-00001", now=2000.0)
    again = journal.acknowledge("key-00001", now=3000.0)
    assert first.acknowledged_at == again.acknowledged_at == 2000.0
    assert [r.key for r in journal.unacknowledged(account="acct_a")] == ["key-00003"]


# -- listing --------------------------------------------------------------------------------


def test_pending_lists_oldest_first_leased_or_not_for_one_account_and_provider(
    journal: payonce.Journal,
    store: IntentStore,
) -> None:
    for number, now in ((1, 1003.0), (2, 1001.0), (3, 1002.0)):
        store.claim(draft_for(number), owner="w", now=now, lease_seconds=30)
    store.claim(draft_for(4, account="acct_other"), owner="w", now=1000.0, lease_seconds=30)
    settle(store, "key-00003", "w", 1005.0)
    store.release("key-00002", owner="w")

    pending = journal.pending(account="acct_demo", provider="sandbox")

    assert [r.key for r in pending] == ["key-00002", "key-00001"]
    assert [r.lease_owner for r in pending] == [None, "w"]
    assert [r.key for r in journal.pending(account="acct_demo", provider="sandbox", limit=1)] == [
        "key-00002"
    ]
    assert journal.pending(account="acct_demo", provider="stripe") == []


def test_list_and_find_order_and_filter(journal: payonce.Journal, store: IntentStore) -> None:
    for number, now in ((1, 1000.0), (2, 1002.0), (3, 1001.0), (4, 1002.0)):
        store.claim(draft_for(number), owner="w", now=now, lease_seconds=30)
    settle(store, "key-00001", "w", 1010.0)

    assert [r.key for r in journal.list_intents()] == [
        "key-00004",
        "key-00002",
        "key-00003",
        "key-00001",
    ]
    assert [r.key for r in journal.list_intents(limit=2)] == ["key-00004", "key-00002"]
    assert [r.key for r in journal.list_intents(states=[SUCCEEDED])] == ["key-00001"]
    assert [r.key for r in journal.list_intents(states=[PENDING], limit=1)] == ["key-00004"]
    assert journal.list_intents(states=[]) == []
    assert [r.key for r in journal.find("order-00003")] == ["key-00003"]
    assert [r.key for r in journal.find("key-00002")] == ["key-00002"]
    assert journal.find("nothing") == []
    assert journal.get("nothing") is None


def test_listing_several_states_merges_them_newest_first(
    journal: payonce.Journal, store: IntentStore
) -> None:
    # Created at 1000..1005, the two at 1004 tied (the greater key first); odd ones settle.
    for number, now in ((1, 1000.0), (2, 1001.0), (3, 1004.0), (4, 1004.0), (5, 1005.0)):
        store.claim(draft_for(number), owner="w", now=now, lease_seconds=30)
    for key in ("key-00001", "key-00003", "key-00005"):
        settle(store, key, "w", 1010.0)
    store.release("key-00002", owner="w")
    journal.abandon("key-00002", reason="checked by hand", now=1011.0)

    both = [SUCCEEDED, PENDING]
    assert [r.key for r in journal.list_intents(states=both)] == [
        "key-00005",
        "key-00004",
        "key-00003",
        "key-00001",
    ]
    assert [r.key for r in journal.list_intents(states=both, limit=3)] == [
        "key-00005",
        "key-00004",
        "key-00003",
    ]
    assert [r.key for r in journal.list_intents(states=[*both, PENDING], limit=9)] == [
        "key-00005",
        "key-00004",
        "key-00003",
        "key-00001",
    ], "a state named twice lists its intents once"
    abandoned = payonce.IntentState.ABANDONED
    assert journal.list_intents(states=[abandoned, PENDING], limit=1) == [
        journal.get("key-00004")
    ], "whole records, every column in its place"


# -- the resume queue -----------------------------------------------------------------------


def test_claim_next_pending_takes_free_expired_and_stale_leases_in_order_once_per_pass(
    journal: payonce.Journal,
    store: IntentStore,
) -> None:
    for number in range(1, 6):
        store.claim(draft_for(number), owner="w", now=1000.0 + number, lease_seconds=30)
    store.release("key-00001", owner="w")  # free
    store.claim_key("key-00002", owner="alive", now=1040.0, lease_seconds=30)  # live
    store.claim_key("key-00003", owner="dead", now=1040.0, lease_seconds=30)  # live, stale
    store.release("key-00004", owner="w")
    store.claim_key("key-00004", owner="alive", now=1000.0, lease_seconds=30)  # expired
    settle(store, "key-00005", "w", 1006.0)  # not pending

    taken, after = [], None
    while claim := store.claim_next_pending(
        account="acct_demo",
        provider="sandbox",
        owner="resumer",
        now=1050.0,
        lease_seconds=30,
        after=after,
        is_stale=lambda owner: owner == "dead",
    ):
        assert (claim.kind, claim.record.lease_owner) == (ClaimKind.CLAIMED, "resumer")
        taken.append(claim.record.key)
        after = (claim.record.created_at, claim.record.key)
        store.release(claim.record.key, owner="resumer")  # left pending: not met again

    assert taken == ["key-00001", "key-00003", "key-00004"]
    assert journal.get("key-00002").lease_owner == "alive"  # type: ignore[union-attr]


def test_resume_workers_on_two_hosts_drain_the_queue_each_intent_once(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    for number in range(60):
        store.claim(draft_for(number), owner="crashed", now=1000.0 + number, lease_seconds=1)
    hosts = [store, store_of(open_journal())]
    start = threading.Barrier(8)

    def worker(index: int) -> list[str]:
        host, owner, taken = hosts[index % 2], f"resumer-{index}", []
        start.wait()
        while claim := host.claim_next_pending(
            account="acct_demo", provider="sandbox", owner=owner, now=5000.0, lease_seconds=30
        ):
            taken.append(claim.record.key)
            settle(host, claim.record.key, owner, 5001.0, attempt=1)
        return taken

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(worker, range(8)))

    taken = [key for keys in results for key in keys]
    assert sorted(taken) == [f"key-{n:05d}" for n in range(60)]
    assert {r.state for r in journal.list_intents()} == {SUCCEEDED}


# -- two hosts creating the same intents at once ---------------------------------------------


def test_two_hosts_racing_to_create_the_same_intents_create_each_once(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    hosts = [store, store_of(open_journal())]
    start = threading.Barrier(16)
    drafts = [draft_for(n, key=None) for n in range(50)]

    def worker(index: int) -> Counter[ClaimKind]:
        host, kinds = hosts[index % 2], Counter[ClaimKind]()
        order = random.Random(index).sample(drafts, len(drafts))
        start.wait()
        for number, draft in enumerate(order):
            # Every worker proposes a key of its own: only one may ever be journaled.
            mine = attrs.evolve(draft, key=f"k-{index}-{number}")
            owner = f"w{index}"
            claim = host.claim(mine, owner=owner, now=time.time(), lease_seconds=60)
            kinds[claim.kind] += 1
            if claim.kind is ClaimKind.CREATED:
                settle(host, claim.record.key, owner, time.time())
        return kinds

    with ThreadPoolExecutor(max_workers=16) as pool:
        totals = sum(pool.map(worker, range(16)), Counter[ClaimKind]())

    assert totals[ClaimKind.CREATED] == 50
    assert set(totals) <= {ClaimKind.CREATED, ClaimKind.LEASED, ClaimKind.FINAL}
    intents = journal.list_intents()
    assert sorted(i.reference for i in intents) == sorted(d.reference for d in drafts)  # type: ignore[type-var]
    assert {(i.state, i.attempt_count) for i in intents} == {(SUCCEEDED, 1)}


# -- busy -----------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(location: str) -> Iterator[None]:
    """Another connection holds the journal's intents locked until the block ends."""
    if sql.is_postgres_url(location):
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("LOCK TABLE intents IN EXCLUSIVE MODE")
            yield
            conn.execute("ROLLBACK")
    else:
        with contextlib.closing(sqlite3.connect(location, isolation_level=None)) as db:
            db.execute("BEGIN EXCLUSIVE")
            yield
            db.execute("ROLLBACK")


def test_a_journal_locked_past_the_busy_timeout_raises_busy_and_says_what_happened(
    open_journal: OpenJournal, location: str
) -> None:
    journal = open_journal(busy_timeout=0.3)
    store = store_of(journal)
    store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)

    with locked(location):
        began = time.monotonic()
        with pytest.raises(payonce.JournalBusy) as before_sending:
            store.claim(draft_for(2), owner="w", now=1001.0, lease_seconds=30)
        waited = time.monotonic() - began
        with pytest.raises(payonce.JournalBusy) as after_sending:
            settle(store, "key-00001", "w", 1002.0)

    assert 0.25 <= waited < 5
    assert "nothing was sent" in str(before_sending.value)
    assert "nothing was sent" not in str(after_sending.value)
    assert "stays pending under its key" in str(after_sending.value)
    assert before_sending.value.location == journal.location
    assert [r.key for r in journal.list_intents()] == ["key-00001"]
    assert journal.get("key-00001").state is PENDING  # type: ignore[union-attr]


# -- schema: migrations, refusals, damage ----------------------------------------------------

V1_SUCCEEDED, V1_PENDING = "01JGFJJZ0000000000000000A1", "01JGFJJZ0000000000000000B2"


def _refuse(message: str) -> payonce.JournalError:
    return payonce.JournalError(message, location="test")


def write_version_1_journal(location: str) -> None:
    """Migration 1 only, through payonce's own migration function, and rows as 0.1 wrote them."""
    scope = make_scope("acct_demo", "POST", "/v1/payments")
    with raw_transaction(location) as tx:
        assert migrate(tx, target=1, refuse=_refuse) == 0
        for key, reference, state, status, body in (
            (V1_SUCCEEDED, "order-v1-1", "succeeded", 201, RESPONSE.body),
            (V1_PENDING, "order-v1-2", "pending", None, None),
        ):
            tx.execute(
                "INSERT INTO intents (key, scope, reference, account, provider, method, url,"
                " fingerprint, request_headers, request_body, state, created_at, updated_at,"
                " first_sent_at, lease_owner, lease_expires_at, response_status,"
                " response_headers, response_body)"
                " VALUES (?, ?, ?, 'acct_demo', 'sandbox', 'POST', 'http://127.0.0.1:9/v1/payments',"
                " 'f', '[[\"content-type\", \"application/json\"]]', ?, ?, 1000.0, 1001.0, 1000.0,"
                " NULL, NULL, ?, ?, ?)",
                (
                    key,
                    scope,
                    reference,
                    b'{"amount":4200}',
                    state,
                    status,
                    '[["content-type", "application/json"]]' if status else None,
                    body,
                ),
            )
        tx.execute(
            "INSERT INTO attempts (key, number, started_at, ended_at, status_code)"
            " VALUES (?, 1, 1000.0, 1000.5, 503), (?, 2, 1000.6, 1001.0, 201),"
            " (?, 1, 1000.0, NULL, NULL)",
            (V1_SUCCEEDED, V1_SUCCEEDED, V1_PENDING),
        )


def test_a_version_1_journal_migrates_on_open_and_its_rows_read_back_intact(
    location: str, open_journal: OpenJournal
) -> None:
    write_version_1_journal(location)
    assert dict(rows(location, sql.META))["schema_version"] == "1"

    journal = open_journal()

    meta = dict(rows(location, sql.META))
    assert meta == {
        "application": "payonce",
        "schema_version": str(SCHEMA_VERSION),
        "migrated_by": payonce.__version__,
    }
    succeeded = journal.get(V1_SUCCEEDED)
    assert succeeded is not None
    assert (succeeded.state, succeeded.attempt_count, succeeded.acknowledged_at) == (
        SUCCEEDED,
        2,
        None,
    )
    stored = succeeded.response
    assert stored is not None
    assert (stored.status, stored.body, stored.body_stored) == (201, RESPONSE.body, True)
    assert (stored.stored_by, stored.schema_version) == (None, 1)
    assert [(a.number, a.ambiguous, a.in_flight) for a in journal.attempts(V1_PENDING)] == [
        (1, None, True)
    ]
    assert journal.check().ok
    # Opening again migrates nothing and loses nothing.
    open_journal()
    assert rows(location, "SELECT count(*) FROM intents") == [(2,)]
    assert rows(location, "SELECT count(*) FROM attempts") == [(3,)]


def test_hosts_opening_a_new_journal_at_once_migrate_it_once(
    location: str, open_journal: OpenJournal
) -> None:
    start = threading.Barrier(6)

    def open_at_once(_: int) -> payonce.Journal:
        start.wait()
        return open_journal()

    with ThreadPoolExecutor(max_workers=6) as pool:
        journals = list(pool.map(open_at_once, range(6)))

    assert {j.check().schema_version for j in journals} == {SCHEMA_VERSION}
    assert len(rows(location, sql.META)) == 3


@pytest.mark.parametrize(
    ("change", "hint"),
    [
        pytest.param(
            "UPDATE payonce_meta SET value = '99' WHERE name = 'schema_version'",
            r"schema 99.*upgrade payonce",
            id="newer-schema",
        ),
        pytest.param(
            "UPDATE payonce_meta SET value = 'ledgerly' WHERE name = 'application'",
            r"belongs to another application",
            id="foreign-meta",
        ),
        pytest.param("DROP INDEX intents_identity_reference", r"damaged.*index", id="lost-index"),
    ],
)
def test_a_journal_payonce_cannot_trust_is_refused_and_left_as_found(
    location: str, open_journal: OpenJournal, change: str, hint: str
) -> None:
    journal = open_journal()
    store = store_of(journal)
    store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    journal.close()
    with raw_transaction(location) as tx:
        tx.execute(change)
    before = rows(location, "SELECT key, state, updated_at FROM intents")
    meta = rows(location, sql.META + " ORDER BY name")

    with pytest.raises(payonce.JournalError, match=hint) as caught:
        payonce.open_journal(location)

    assert not isinstance(caught.value, payonce.JournalBusy)
    assert rows(location, "SELECT key, state, updated_at FROM intents") == before
    assert rows(location, sql.META + " ORDER BY name") == meta


def test_check_reports_an_intact_journal_and_what_it_holds(
    journal: payonce.Journal, store: IntentStore
) -> None:
    store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    settle(store, "key-00001", "w", 1001.0)
    store.claim(draft_for(2), owner="w", now=1002.0, lease_seconds=30)

    report = journal.check()

    assert (report.ok, report.problems, report.schema_version) == (True, (), SCHEMA_VERSION)
    assert report.intents_by_state == {"succeeded": 1, "pending": 1}
    assert report.unacknowledged == 1
    assert report.size_bytes > 0
    assert report.location == journal.location


# -- the public Journal: reads and operator commands, no writes of intents -----------------


def test_prune_through_the_public_journal_deletes_only_what_is_over_and_acknowledged(
    journal: payonce.Journal, store: IntentStore, location: str
) -> None:
    for number in (1, 2, 3):
        store.claim(draft_for(number), owner="w", now=1000.0, lease_seconds=30)
    settle(store, "key-00001", "w", 1001.0)
    journal.acknowledge("key-00001", now=1002.0)
    settle(store, "key-00002", "w", 1001.0)  # its outcome not yet handed over

    operator: payonce.Journal = payonce.open_journal(location)
    try:
        assert operator.prune(older_than=2000.0, dry_run=True) == 1
        assert operator.prune(older_than=2000.0) == 1
        assert {r.key for r in operator.list_intents()} == {"key-00002", "key-00003"}
    finally:
        operator.close()


def test_backup_through_the_public_journal_copies_sqlite_and_leaves_postgres_to_pg_dump(
    backend: str, journal: payonce.Journal, store: IntentStore, location: str, tmp_path: Path
) -> None:
    store.claim(draft_for(1), owner="w", now=1000.0, lease_seconds=30)
    settle(store, "key-00001", "w", 1001.0)
    operator: payonce.Journal = journal
    destination = tmp_path / "backup.db"

    if backend == "sqlite":
        copy = operator.backup(destination)
        with payonce.journal.SQLiteJournal(copy) as restored:
            assert restored.get("key-00001") == journal.get("key-00001")
        return
    with pytest.raises(payonce.JournalError, match=r"pg_dump -Fc -f payonce\.dump") as caught:
        operator.backup(destination)
    assert journal.location in str(caught.value), "it names the journal, without its password"
    with (
        PostgresJournal(location, schema="payonce") as own_schema,
        pytest.raises(payonce.JournalError, match=r"pg_dump -Fc -n payonce -f"),
    ):
        own_schema.backup(destination)
    assert not destination.exists(), "nothing was written"


PUBLIC_JOURNAL = frozenset(name for name in dir(payonce.Journal) if not name.startswith("_"))


class ReadOnlyJournal:
    """A user's own view of a journal: the public Journal's methods, and nothing else."""

    def __init__(self, journal: payonce.Journal) -> None:
        self._journal = journal

    def __getattr__(self, name: str) -> Any:
        if name in PUBLIC_JOURNAL:
            return getattr(self._journal, name)
        raise AttributeError(name)


def test_a_journal_object_that_is_not_payonce_s_is_refused_when_a_client_is_built(
    journal: payonce.Journal,
) -> None:
    view = ReadOnlyJournal(journal)
    builders: list[Callable[[], object]] = [
        lambda: payonce.Client(base_url="http://127.0.0.1:9", api_key="k", journal=view),
        lambda: payonce.AsyncClient(base_url="http://127.0.0.1:9", api_key="k", journal=view),
        lambda: payonce.WebhookInbox(view, "whsec_test"),
    ]

    for build in builders:
        with pytest.raises(
            payonce.ConfigurationError,
            match=r"a path, a postgresql:// URL or a payonce Journal, not ReadOnlyJournal",
        ):
            build()

    assert journal.list_intents() == [], "the caller's journal is still open, and untouched"


# == PostgreSQL only =========================================================================


@pytest.fixture
def pg_url(postgres_url: str) -> str:
    return postgres_url


def admin_execute(server: PostgresServer, url: str, statement: str) -> list[tuple[Any, ...]]:
    dbname = url.rsplit("/", 1)[1].partition("?")[0]
    with server.admin(dbname) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def test_a_postgres_url_opens_a_postgres_journal_whose_location_hides_the_password(
    pg_url: str, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for url in (pg_url, pg_url.replace("postgresql://", "postgres://", 1)):
        with payonce.open_journal(url) as journal:  # type: ignore[attr-defined]
            assert isinstance(journal, PostgresJournal)
            assert postgres_server.password not in journal.location
            assert postgres_server.password not in repr(journal)
            user = postgres_server.user
            assert journal.location.startswith((f"postgresql://{user}@", f"postgres://{user}@"))
    monkeypatch.setenv("PAYONCE_JOURNAL", pg_url)
    with payonce.open_journal() as journal:  # type: ignore[attr-defined]
        assert isinstance(journal, PostgresJournal)
    assert payonce.journal.PostgresJournal is PostgresJournal


def test_the_password_appears_in_no_location_error_or_log(
    postgres_server: PostgresServer, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "p@ss:w/rd&q=1%x?"
    admin_execute(postgres_server, pg_url, f"CREATE ROLE spicy LOGIN PASSWORD '{secret}'")
    admin_execute(postgres_server, pg_url, "GRANT CREATE, USAGE ON SCHEMA public TO spicy")
    dbname = pg_url.rsplit("/", 1)[1]
    good = postgres_server.url(dbname, user="spicy", password=secret)
    wrong = postgres_server.url(dbname, user="spicy", password=secret + "!")
    closed = good.replace(f":{postgres_server.port}/", ":1/", 1)
    seen: list[str] = []
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="psycopg")  # psycopg pins its loggers at WARNING

    with payonce.open_journal(good) as journal:  # type: ignore[attr-defined]
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)
        seen += [journal.location, repr(journal), str(journal.check())]
    for url, error in (
        (wrong, r"password authentication failed"),
        (closed, r"cannot connect"),
        (good.replace(f"@{postgres_server.host}", f"@[{postgres_server.host}", 1), r"not valid"),
        (good + "?nonsense=1", r"not valid"),
    ):
        with pytest.raises(payonce.PayonceError, match=error) as caught:
            # A database that does not answer is waited for (failover_timeout), told after.
            PostgresJournal(url, failover_timeout=0.2)
        chain: BaseException | None = caught.value
        while chain is not None:
            seen.append(f"{chain!s} {chain!r}")
            chain = chain.__cause__ or chain.__context__

    assert seen[0] == f"postgresql://spicy@{postgres_server.host}:{postgres_server.port}/{dbname}"
    assert caplog.records, "the journal and its pool did log"
    for text in [*seen, caplog.text]:
        for form in (secret, secret.replace("@", "%40"), "w/rd&q"):
            assert form not in text


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("postgresql://u:s3cret@db:5432/pay", "postgresql://u@db:5432/pay"),
        ("postgres://u:p%40ss%2F@db/pay?sslmode=require", "postgres://u@db/pay?sslmode=require"),
        (
            "postgresql://u@db/pay?password=s3cret&connect_timeout=3",
            "postgresql://u@db/pay?connect_timeout=3",
        ),
        (
            "postgresql://u:s3cret@h1:5,h2:6/pay?schema=payonce",
            "postgresql://u@h1:5,h2:6/pay?schema=payonce",
        ),
        (
            "postgresql:///pay?host=/run/postgresql&user=u",
            "postgresql:///pay?host=/run/postgresql&user=u",
        ),
        ("postgresql://u%40corp:s3cret@[::1]:5/pay", "postgresql://u%40corp@[::1]:5/pay"),
    ],
)
def test_the_location_is_the_url_without_its_password(url: str, location: str) -> None:
    from payonce._journal._postgres_url import Target

    target = Target(url)
    assert target.location(target.schema) == location
    assert "schema" not in target.conninfo


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pa/ss@db/pay",
        "postgresql://u:p@ss@db/pay",
        "postgresql://u:pa?ss@db/pay",
        "postgresql://u:s3cret@[db/pay",
        "postgresql://u:s3cret@db/pay?bogus=1",
    ],
)
def test_a_url_that_cannot_be_read_unambiguously_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(payonce.ConfigurationError) as caught:
        payonce.open_journal(url)
    for secret in ("pa/ss", "p@ss", "pa?ss", "s3cret", "ss@db"):
        assert secret not in str(caught.value)


def test_a_unix_socket_url_opens_the_same_journal(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    if postgres_server.directory is None:
        pytest.skip("an external server's unix socket is not known")
    dbname = pg_url.rsplit("/", 1)[1]
    socket_url = (
        f"postgresql:///{dbname}?host={postgres_server.directory}&port={postgres_server.port}"
        f"&user={postgres_server.user}"
    )
    with payonce.open_journal(pg_url) as tcp, payonce.open_journal(socket_url) as local:  # type: ignore[attr-defined]
        store_of(tcp).claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)
        assert local.get("key-00001") == tcp.get("key-00001")
        assert local.location == socket_url


def test_without_psycopg_a_postgres_url_says_which_extra_to_install(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "payonce._journal._postgres")
    with pytest.raises(payonce.ConfigurationError, match=r"pip install 'payonce\[postgres\]'"):
        payonce.open_journal(pg_url)


def test_importing_payonce_does_not_import_psycopg() -> None:
    code = "import sys, payonce; print(sorted(m for m in sys.modules if 'psycopg' in m))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_shared_database_with_other_tables_is_fine_and_left_alone(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id SERIAL PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('Ada'), ('Grace')")

    with payonce.open_journal(pg_url) as journal:  # type: ignore[attr-defined]
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)
        assert journal.check().ok

    assert rows(pg_url, "SELECT name FROM customers ORDER BY id") == [("Ada",), ("Grace",)]


def test_a_foreign_table_of_the_same_name_is_refused_and_a_schema_of_its_own_works(
    pg_url: str,
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE attempts (id SERIAL PRIMARY KEY, score INTEGER)")

    with pytest.raises(payonce.JournalError, match=r"schema=payonce") as caught:
        payonce.open_journal(pg_url)
    assert "nothing was changed" in str(caught.value)
    assert rows(pg_url, "SELECT to_regclass('payonce_meta') IS NULL") == [(True,)]

    with payonce.open_journal(pg_url + "?schema=payonce") as journal:  # type: ignore[attr-defined]
        store = store_of(journal)
        assert journal.location.endswith("?schema=payonce")
        store.claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)
        assert journal.check().ok
    assert rows(pg_url, "SELECT count(*) FROM payonce.intents") == [(1,)]
    assert rows(pg_url, "SELECT count(*) FROM public.attempts") == [(0,)]


def test_a_role_that_may_not_create_tables_is_told_so_not_to_retry(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    # Since PostgreSQL 15 only the database owner may create tables in public.
    admin_execute(postgres_server, pg_url, "CREATE ROLE visitor LOGIN PASSWORD 'visitor-pw'")
    visitor = pg_url.replace(
        f"{postgres_server.user}:{postgres_server.password}@", "visitor:visitor-pw@"
    )

    with pytest.raises(payonce.JournalError, match="lacks a privilege") as caught:
        payonce.open_journal(visitor)

    assert "Retry later" not in str(caught.value)
    assert "visitor-pw" not in str(caught.value)


def test_two_schemas_are_two_journals(pg_url: str) -> None:
    with (
        PostgresJournal(pg_url, schema="team_a") as a,
        PostgresJournal(pg_url, schema="team_b") as b,
    ):
        store_of(a).claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)
        assert b.get("key-00001") is None
        assert [r.key for r in a.list_intents()] == ["key-00001"]
    with pytest.raises(payonce.ConfigurationError, match="plain SQL name"):
        PostgresJournal(pg_url, schema='x"; DROP TABLE intents; --')


def test_write_ahead_commits_are_synchronous_and_the_rest_are_not(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    # A server default of off must not weaken the write-ahead record.
    admin_execute(
        postgres_server,
        pg_url,
        f"ALTER DATABASE {pg_url.rsplit('/', 1)[1]} SET synchronous_commit = off",
    )
    journal = payonce.open_journal(pg_url)
    store = store_of(journal)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE commit_log (at_table TEXT, op TEXT, setting TEXT)")
        conn.execute(
            "CREATE FUNCTION log_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " INSERT INTO commit_log VALUES (TG_TABLE_NAME, TG_OP,"
            " current_setting('synchronous_commit')); RETURN NULL; END $$"
        )
        for table in ("intents", "attempts"):
            conn.execute(
                f"CREATE TRIGGER log_{table} AFTER INSERT OR UPDATE ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION log_commit()"
            )

    def settings_of(write: Callable[[], object]) -> set[str]:
        with raw_transaction(pg_url) as tx:
            tx.execute("DELETE FROM commit_log")
        write()
        return {setting for (setting,) in rows(pg_url, "SELECT setting FROM commit_log")}

    key = "key-00001"
    assert settings_of(lambda: store.claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)) == {
        "on"
    }
    assert settings_of(
        lambda: store.end_attempt(
            key,
            1,
            owner="w",
            now=2.0,
            status_code=503,
            error=None,
            transition=Transition.ATTEMPT_NOT_EXECUTED,
        )
    ) == {"off"}
    assert settings_of(lambda: store.start_attempt(key, owner="w", now=3.0, lease_seconds=30)) == {
        "on"
    }
    assert settings_of(lambda: store.renew_lease(key, owner="w", now=4.0, lease_seconds=30)) == {
        "off"
    }
    assert settings_of(lambda: settle(store, key, "w", 5.0, attempt=2)) == {"off"}
    journal.close()


def test_a_replay_is_answered_without_a_row_lock_and_a_lease_is_not(pg_url: str) -> None:
    with payonce.open_journal(pg_url, busy_timeout=1.0) as journal:  # type: ignore[attr-defined]
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)
        settle(store, "key-00001", "w", 2.0)
        store.claim(draft_for(2), owner="w", now=3.0, lease_seconds=30)
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("BEGIN")
            other.execute("SELECT key FROM intents FOR UPDATE")  # another worker mid-write

            began = time.monotonic()
            replay = store.claim(draft_for(1), owner="x", now=4.0, lease_seconds=30)
            waiting = store.claim(draft_for(2), owner="x", now=5.0, lease_seconds=30)
            answered_in = time.monotonic() - began
            with pytest.raises(payonce.JournalBusy):
                store.claim(draft_for(2), owner="x", now=100.0, lease_seconds=30)
            other.execute("ROLLBACK")

        assert (replay.kind, waiting.kind) == (ClaimKind.FINAL, ClaimKind.LEASED)
        assert answered_in < 0.5
        taken = store.claim(draft_for(2), owner="x", now=100.0, lease_seconds=30)
        assert taken.kind is ClaimKind.CLAIMED


def test_a_lost_connection_is_replaced_without_the_caller_noticing(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    with payonce.open_journal(pg_url) as journal:  # type: ignore[attr-defined]
        store = store_of(journal)
        store.claim(draft_for(1), owner="w", now=1.0, lease_seconds=30)
        killed = admin_execute(
            postgres_server,
            pg_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'payonce'",
        )
        assert killed
        assert all(ok for (ok,) in killed)

        assert journal.get("key-00001") is not None
        assert store.claim(draft_for(2), owner="w", now=2.0, lease_seconds=30).kind is (
            ClaimKind.CREATED
        )


# -- PostgreSQL end to end: payonce.Client against the sandbox ------------------------------


@pytest.fixture
def host(make_client: MakeClient, pg_url: str) -> MakeClient:
    """A client on "another host": its own PostgresJournal and pool on the shared database."""
    return lambda **overrides: make_client(journal=pg_url, **overrides)


def test_a_payment_is_journaled_in_postgres_sent_once_and_replayed_without_the_network(
    host: MakeClient, sandbox: SandboxServer, postgres_server: PostgresServer
) -> None:
    client = host()
    assert isinstance(client.journal, PostgresJournal)
    with client.intent("order-1") as op:
        first = op.post("/v1/payments", json=PAYMENT)
    assert sandbox.store.executions() == {op.key: 1}
    sandbox.stop()  # from here on, any network call would fail

    again = host().post("/v1/payments", json=PAYMENT, reference="order-1")

    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    info = payonce.response_info(again)
    assert info is not None
    assert (info.key, info.replayed, info.attempts) == (op.key, True, 1)
    assert client.unacknowledged() == []
    assert postgres_server.password not in client.journal.location


def test_another_host_resumes_what_a_dead_host_left_pending_under_the_same_key(
    host: MakeClient, sandbox: SandboxServer
) -> None:
    dying = host(transport=DiesAfterSending())
    with pytest.raises(RuntimeError, match="worker died"):
        dying.post("/v1/payments", json=PAYMENT, reference="order-2")
    (left,) = dying.journal.find("order-2")
    assert left.state is PENDING
    assert sandbox.store.executions() == {left.key: 1}

    (result,) = host().resume()

    assert (result.key, result.state) == (left.key, SUCCEEDED)
    assert sandbox.store.executions() == {left.key: 1}
    assert [a.ambiguous for a in dying.journal.attempts(left.key)] == [True, False]


def test_two_hosts_resuming_at_once_finish_each_pending_intent_once(
    host: MakeClient, sandbox: SandboxServer
) -> None:
    dying = host(transport=DiesAfterSending())
    for n in range(20):
        with pytest.raises(RuntimeError, match="worker died"):
            dying.post("/v1/payments", json=PAYMENT, reference=f"order-r{n:02d}")
    resumers = [host(), host()]
    start = threading.Barrier(2)

    def resume(client: payonce.Client) -> list[payonce.records.ResumeResult]:
        start.wait()
        return client.resume()

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [r for rs in pool.map(resume, resumers) for r in rs]

    keys = [r.key for r in results]
    assert len(keys) == len(set(keys)) == 20
    assert {r.state for r in results} == {SUCCEEDED}
    assert sandbox.store.executions() == dict.fromkeys(keys, 1)


def test_another_host_reconciles_an_unknown_intent_from_the_provider_s_record(
    host: MakeClient, sandbox: SandboxServer
) -> None:
    sandbox.script(["drop_after"])
    with pytest.raises(payonce.OutcomeUnknown):
        host(retry=payonce.RetryPolicy(max_attempts=1)).post(
            "/v1/payments", json=PAYMENT, reference="order-3"
        )
    other = host()

    (result,) = other.reconcile("order-3")

    assert (result.outcome, result.after) == ("found", SUCCEEDED)
    replay = other.post("/v1/payments", json=PAYMENT, reference="order-3")
    assert payonce.response_info(replay).replayed  # type: ignore[union-attr]
    assert sandbox.store.total_executions() == 1
    (record,) = other.journal.find("order-3")
    assert [r.outcome for r in other.journal.reconciliations(record.key)] == ["found"]


def test_two_hosts_of_eight_threads_racing_on_the_same_fifty_references_pay_each_once(
    host: MakeClient, sandbox: SandboxServer
) -> None:
    hosts = [host(), host()]
    references = [f"order-{n:02d}" for n in range(50)]
    start = threading.Barrier(16)

    def worker(index: int) -> list[int]:
        client = hosts[index % 2]
        order = random.Random(index).sample(references, len(references))
        start.wait()
        return [
            client.post(
                "/v1/payments",
                json={"amount": 100 + int(ref[-2:]), "currency": "eur"},
                reference=ref,
            ).status_code
            for ref in order
        ]

    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = [s for result in pool.map(worker, range(16)) for s in result]

    assert statuses == [201] * 800
    intents = hosts[0].journal.list_intents()
    assert sorted(i.reference for i in intents) == references  # type: ignore[type-var]
    assert {(i.state, i.attempt_count) for i in intents} == {(SUCCEEDED, 1)}
    assert sandbox.store.executions() == {i.key: 1 for i in intents}


def test_a_lease_held_by_one_host_is_respected_by_the_other(
    host: MakeClient, sandbox: SandboxServer
) -> None:
    holder = host(timeout=60.0)  # its answer outlasts the block
    patient = host(in_flight_wait=60.0)
    with ThreadPoolExecutor(1) as pool:
        with paying_in_background(holder, "o", sandbox):
            impatient = host(in_flight_wait=0.0)
            with pytest.raises(payonce.IntentInFlight):
                impatient.post("/v1/payments", json=PAYMENT, reference="o")
            assert impatient.resume() == []
            waiting = pool.submit(patient.post, "/v1/payments", json=PAYMENT, reference="o")
        waited = waiting.result()

    assert payonce.response_info(waited).replayed  # type: ignore[union-attr]
    (record,) = holder.journal.find("o")
    assert (record.state, record.attempt_count) == (SUCCEEDED, 1)
    assert sandbox.store.total_executions() == 1


@pytest.mark.parametrize(
    "headers",
    [
        (),
        (("content-type", "application/json"),),
        (("x-note", 'a "quoted" \\ back\nslash\t\x00'), ("x-name", "café ☕ 𝄞")),
        [("list", "of pairs")],
        (("x-count", 3),),  # not a string: JSON writes it as a number
    ],
    ids=["none", "one", "escapes-and-unicode", "a-list", "a-number"],
)
def test_headers_are_stored_as_the_json_every_payonce_wrote(headers: Any) -> None:
    text = _rows.headers_to_json(headers)

    assert text == json.dumps([list(pair) for pair in headers])
    assert _rows._headers_from_json(text) == tuple((str(n), str(v)) for n, v in headers)


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("state", "half-settled", "state is 'half-settled', not a state payonce writes"),
        ("request_headers", "[not json", "request_headers is not JSON"),
        ("created_at", "NaN", "created_at is not a time"),
        ("updated_at", "Infinity", "updated_at is not a time"),
    ],
)
def test_a_row_whose_values_no_longer_decode_is_damage_to_restore_on_both_backends(
    journal: payonce.Journal,
    store: IntentStore,
    location: str,
    column: str,
    value: str,
    problem: str,
) -> None:
    """Bit rot or a hand edit leaves a value payonce never writes: a read of that one row
    sends the operator to the backups and names it; a listing leaves it out and names it
    beside the others, which it never hides; nothing is changed."""
    claim = store.claim(draft_for(5), owner="w", now=1000.0, lease_seconds=30)
    key = claim.record.key
    healthy = store.claim(draft_for(6), owner="w", now=1000.0, lease_seconds=30).record.key
    with raw_transaction(location) as tx:
        tx.execute(f"UPDATE intents SET {column} = ? WHERE key = ?", (value, key))
    held = rows(location, "SELECT * FROM intents")

    with pytest.raises(payonce.JournalError, match="it is damaged") as caught:
        journal.get(key)
    assert key in str(caught.value)
    assert problem in str(caught.value)
    assert "restore it from a backup" in str(caught.value)
    with pytest.raises(payonce.JournalError, match="it is damaged"):
        store.claim(draft_for(5), owner="w2", now=1001.0, lease_seconds=30)
    for listing in (journal.find(key), journal.list_intents(), journal.list_intents(limit=5)):
        (damaged,) = listing.damaged
        assert (damaged.table, damaged.key) == ("intents", key)
        assert damaged.problem.startswith(problem)
        assert key not in [record.key for record in listing]
    assert [record.key for record in journal.list_intents()] == [healthy]
    report = journal.check()
    assert report.ok is False
    assert [(d.key, d.problem) for d in report.damaged_rows] == [(key, damaged.problem)]
    assert repr(rows(location, "SELECT * FROM intents")) == repr(held)  # a NaN is no NaN's equal


def test_an_attempt_row_that_no_longer_decodes_is_damage_to_restore(
    tmp_path: Path,
) -> None:
    """SQLite keeps what it is given (a number written as text); PostgreSQL's typed
    columns refuse such a value in the first place."""
    location = str(tmp_path / "journal.db")
    journal = payonce.open_journal(location)
    store = store_of(journal)
    try:
        key = store.claim(draft_for(6), owner="w", now=1000.0, lease_seconds=30).record.key
        with raw_transaction(location) as tx:
            tx.execute("UPDATE attempts SET started_at = 'noon' WHERE key = ?", (key,))
        held = rows(location, "SELECT * FROM attempts")
        with pytest.raises(payonce.JournalError, match="it is damaged") as caught:
            journal.attempts(key)
        assert "attempts" in str(caught.value)
        assert rows(location, "SELECT * FROM attempts") == held
    finally:
        journal.close()
