"""Pruning: old, final, acknowledged intents go in bounded batches; nothing else ever does.

The journal-level tests run on both backends (the fixtures of conftest.py);
the command is run for real on a SQLite journal.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import attrs
import pytest

import payonce
from helpers.cli import run_cli
from helpers.journals import RESPONSE, IntentStore, OpenJournal, draft_for, rows, store_of
from payonce._lifecycle import ClaimKind, Transition
from payonce.cli._journal import parse_duration
from payonce.journal import SQLiteJournal

HOUR = 3600.0
DAY = 24 * HOUR
NOW = 1_800_000_000.0
SUCCEEDED = payonce.IntentState.SUCCEEDED
FAILED = payonce.IntentState.FAILED


@pytest.fixture
def journal(open_journal: OpenJournal) -> payonce.Journal:
    return open_journal()


@pytest.fixture
def store(journal: payonce.Journal) -> IntentStore:
    """The journal's private writes, as a client on it makes them."""
    return store_of(journal)


def settle(store: IntentStore, number: int, at: float, state: payonce.IntentState) -> None:
    transition = Transition.SUCCEEDED if state is SUCCEEDED else Transition.FAILED
    store.settle(
        f"key-{number:05d}",
        transition=transition,
        owner="w",
        now=at,
        response=RESPONSE,
        attempt=1,
    )


def fill(journal: payonce.Journal, store: IntentStore) -> dict[str, str]:
    """Intents in every situation pruning must tell apart, 40 and 10 days old."""
    what = {}
    old, recent = NOW - 40 * DAY, NOW - 10 * DAY
    cases = [
        ("old succeeded, acknowledged", old, SUCCEEDED, old, True),
        ("old failed, acknowledged", old, FAILED, old, True),
        ("old succeeded, not acknowledged", old, SUCCEEDED, None, True),
        ("old abandoned", old, None, None, False),
        ("old pending", old, None, None, True),
        ("old unknown", old, None, None, True),
        ("recent succeeded, acknowledged", recent, SUCCEEDED, recent, True),
        ("old, acknowledged recently", old, SUCCEEDED, recent, True),
        ("old, settled recently", old, "late", None, True),
        ("old reconciled, acknowledged", old, "reconciled", old + 5, True),
    ]
    for number, (name, created, state, acknowledged, _) in enumerate(cases):
        store.claim(draft_for(number), owner="w", now=created, lease_seconds=30)
        key = f"key-{number:05d}"
        what[key] = name
        if state == "reconciled":
            store.mark_unknown(
                key, transition=Transition.EXHAUSTED, owner="w", now=created + 2, reason="timed out"
            )
            store.claim_key(key, owner="r", now=created + 3, lease_seconds=30, unknown=True)
            store.reconciled(
                key,
                owner="r",
                now=created + 4,
                outcome="found",
                detail="the provider has it",
                status_code=200,
                transition=Transition.RECONCILED_SUCCEEDED,
                response=RESPONSE,
            )
        elif state == "late":
            settle(store, number, recent, SUCCEEDED)
            journal.acknowledge(key, now=recent)
        elif state is not None:
            settle(store, number, created + 1, state)
        if acknowledged is not None:
            journal.acknowledge(key, now=acknowledged)
        if name == "old abandoned":  # unknown, escalated by a worker, then abandoned
            store.mark_unknown(
                key, transition=Transition.EXHAUSTED, owner="w", now=created + 1, reason="lost"
            )
            escalated = {"now": created + 1, "tries": 8, "reason": "HTTP 503"}
            assert store.escalate(key, unknown_since=created + 1, **escalated)
            journal.abandon(key, reason="checked by hand", now=created + 2)
        if name == "old unknown":
            store.mark_unknown(
                key, transition=Transition.EXHAUSTED, owner="w", now=created + 2, reason="timed out"
            )
    return what


def test_only_final_acknowledged_intents_untouched_since_the_cut_off_are_pruned(
    journal: payonce.Journal, store: IntentStore, location: str
) -> None:
    names = fill(journal, store)
    cutoff = NOW - 30 * DAY
    assert rows(location, "SELECT count(*) FROM escalations") == [(1,)]

    assert journal.prune(older_than=cutoff, dry_run=True, now=NOW) == 4
    listed = journal.prunable(older_than=cutoff, now=NOW)
    assert len(journal.list_intents()) == len(names), "a dry run deletes nothing"
    assert journal.prune(older_than=cutoff, now=NOW) == 4
    assert {names[r.key] for r in listed} == {
        "old succeeded, acknowledged",
        "old failed, acknowledged",
        "old abandoned",
        "old reconciled, acknowledged",
    }, "the listing names what the prune then deleted"

    left = {names[r.key] for r in journal.list_intents()}
    assert left == set(names.values()) - {
        "old succeeded, acknowledged",
        "old failed, acknowledged",
        "old abandoned",
        "old reconciled, acknowledged",
    }
    keys = {r.key for r in journal.list_intents()}
    attempt_keys = {key for (key,) in rows(location, "SELECT DISTINCT key FROM attempts")}
    assert attempt_keys == keys, "the attempts of pruned intents went with them"
    assert rows(location, "SELECT count(*) FROM reconciliations") == [(0,)]
    assert rows(location, "SELECT count(*) FROM escalations") == [(0,)], "nor its escalation"
    assert journal.prune(older_than=cutoff, now=NOW) == 0


def test_pruning_goes_in_batches_and_writers_get_in_between(
    journal: payonce.Journal, store: IntentStore, open_journal: OpenJournal
) -> None:
    for number in range(25):
        store.claim(draft_for(number), owner="w", now=NOW - 40 * DAY, lease_seconds=30)
        settle(store, number, NOW - 40 * DAY, SUCCEEDED)
        journal.acknowledge(f"key-{number:05d}", now=NOW - 40 * DAY)
    other_host = open_journal(busy_timeout=0.5)
    other_host_store = store_of(other_host)
    progress: list[int] = []

    def between_batches(total: int) -> None:
        progress.append(total)
        # Another writer is not locked out: the batch before has committed.
        claim = other_host_store.claim(draft_for(100 + total), owner="x", now=NOW, lease_seconds=30)
        assert claim.kind is ClaimKind.CREATED

    pruned = journal.prune(
        older_than=NOW - 30 * DAY, batch_size=10, on_batch=between_batches, now=NOW
    )

    assert pruned == 25
    assert progress == [10, 20, 25]
    assert len(journal.list_intents()) == 3  # what the other host wrote meanwhile


def test_unacknowledged_outcomes_go_only_when_given_up_by_name(
    journal: payonce.Journal, store: IntentStore
) -> None:
    names = fill(journal, store)
    cutoff = NOW - 30 * DAY

    pruned = journal.prune(older_than=cutoff, include_unacknowledged=True, now=NOW)

    assert pruned == 5
    left = {names[r.key] for r in journal.list_intents()}
    assert "old succeeded, not acknowledged" not in left
    assert {"old pending", "old unknown"} <= left, "pending and unknown: abandon them first"


def _settled(
    journal: payonce.Journal, store: IntentStore, number: int, age: float, provider: str
) -> str:
    draft = attrs.evolve(draft_for(number), provider=provider)
    store.claim(draft, owner="w", now=NOW - age, lease_seconds=30)
    settle(store, number, NOW - age, SUCCEEDED)
    journal.acknowledge(f"key-{number:05d}", now=NOW - age)
    return f"key-{number:05d}"


@pytest.mark.parametrize(
    ("provider", "kept_at", "pruned_at"),
    [
        ("sandbox", 47 * HOUR, 49 * HOUR),  # keys live 24 h: kept for two lifetimes
        ("stripe", 47 * HOUR, 49 * HOUR),
        ("adyen", 13 * DAY, 15 * DAY),  # 7 days assumed
        ("acme-unregistered", 61 * DAY, 63 * DAY),  # unknown here: the longest, 31 days
    ],
)
def test_an_intent_younger_than_two_key_lifetimes_is_never_pruned(
    journal: payonce.Journal, store: IntentStore, provider: str, kept_at: float, pruned_at: float
) -> None:
    kept = _settled(journal, store, 1, kept_at, provider)
    gone = _settled(journal, store, 2, pruned_at, provider)

    # A cut-off of one second: everything settled before it would go, but for the floor.
    assert journal.prune(older_than=NOW - 1, now=NOW) == 1

    assert [r.key for r in journal.list_intents()] == [kept]
    assert journal.get(gone) is None


def test_a_batch_size_below_one_is_refused(journal: payonce.Journal) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        journal.prune(older_than=NOW, batch_size=0)


def test_the_journal_has_the_index_pruning_reads_through(tmp_path: Path) -> None:
    with SQLiteJournal(tmp_path / "journal.db") as journal:
        plan = journal._engine.conn.execute(
            "EXPLAIN QUERY PLAN SELECT key FROM intents WHERE state IN (?, ?, ?)"
            " AND updated_at < ? LIMIT 10",
            ("succeeded", "failed", "abandoned", NOW),
        ).fetchall()
    assert "intents_state_updated" in " ".join(str(step) for step in plan)


# -- the command ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * DAY),
        ("12h", 43200.0),
        ("90m", 5400.0),
        ("90min", 5400.0),
        ("1h30min", 5400.0),
        ("1d12h", 1.5 * DAY),
        ("2w", 14 * DAY),
        ("30D", 30 * DAY),
        ("P30D", 30 * DAY),
        ("PT12H", 43200.0),
        ("P1DT12H", 1.5 * DAY),
        ("PT90M", 5400.0),  # in ISO 8601, an M after T is minutes
        ("P2W", 14 * DAY),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "d", "30x", "-1d", "0d", "1d 2q", "P", "PT", "P1X"])
def test_durations_that_are_not(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|no time"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "hint"),
    [("6M", "months or minutes"), ("P6M", "years and months"), ("P1Y", "years and months")],
)
def test_durations_that_could_mean_months_are_refused_with_a_hint(text: str, hint: str) -> None:
    with pytest.raises(ValueError, match=hint):
        parse_duration(text)


def _old_acknowledged(path: Path, ages_in_days: list[float]) -> None:
    now = time.time()
    with SQLiteJournal(path) as journal:
        store = store_of(journal)
        for number, age in enumerate(ages_in_days):
            at = now - age * DAY
            store.claim(draft_for(number), owner="w", now=at, lease_seconds=30)
            settle(store, number, at, SUCCEEDED)
            journal.acknowledge(f"key-{number:05d}", now=at)


def _keys(path: Path) -> list[str]:
    with SQLiteJournal(path) as journal:
        return sorted(r.key for r in journal.list_intents())


def test_the_command_shows_prunes_and_reports(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _old_acknowledged(path, [40, 40, 40, 10])
    base = ["prune", "--journal", str(path), "--older-than", "30d"]

    dry = run_cli([*base, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.output)
    assert (report["intents"], report["dry_run"]) == (3, True)
    assert sorted(i["key"] for i in report["sample"]) == ["key-00000", "key-00001", "key-00002"]
    listed = run_cli([*base, "--dry-run"])
    assert listed.stderr.startswith("would prune 3 intent(s)")
    header, *lines = listed.stdout.splitlines()  # piped: a header, then a record a line
    assert header == "key\tstate\tprovider\tupdated_utc\treference"
    assert [line.split("\t")[:2] for line in lines] == [
        ["key-00000", "succeeded"],
        ["key-00001", "succeeded"],
        ["key-00002", "succeeded"],
    ]

    done = run_cli([*base, "--yes"])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("pruned 3 intent(s)")

    again = run_cli([*base, "--json"])
    assert json.loads(again.output)["intents"] == 0, "nothing to delete: nothing to confirm"
    assert _keys(path) == ["key-00003"]


def test_a_script_must_say_yes_and_nothing_goes_until_it_does(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _old_acknowledged(path, [40, 40])

    refused = run_cli(["prune", "--journal", str(path), "--older-than", "30d"])

    assert refused.exit_code == 2
    assert "would delete 2 intent(s)" in refused.output
    assert "--yes" in refused.output
    assert _keys(path) == ["key-00000", "key-00001"]


@pytest.mark.parametrize(("answer", "left"), [("n\n", 2), ("y\n", 0)])
def test_at_a_terminal_prune_asks_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str, left: int
) -> None:
    path = tmp_path / "journal.db"
    _old_acknowledged(path, [40, 40])
    monkeypatch.setattr("payonce.cli._journal._can_ask", lambda: True)

    asked = run_cli(["prune", "--journal", str(path), "--older-than", "30d"], input=answer)

    assert "Delete 2 intent(s)" in asked.output
    assert "pays again" in asked.output
    # Declining is the user's answer, not a failure: exit 0, and it says nothing went.
    assert asked.exit_code == 0, asked.output
    assert ("nothing deleted" in asked.output) == bool(left)
    assert len(_keys(path)) == left


def test_six_capital_m_deletes_nothing_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _old_acknowledged(path, [0.01, 40])

    refused = run_cli(["prune", "--journal", str(path), "--older-than", "6M", "--yes"])

    assert refused.exit_code == 2
    assert "months or minutes" in refused.output
    assert _keys(path) == ["key-00000", "key-00001"]


def test_a_one_second_cut_off_still_keeps_what_the_provider_may_be_retried_for(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    _old_acknowledged(path, [0.5, 1.9, 2.1])  # days; the sandbox's keys live 24 h

    done = run_cli(["prune", "--journal", str(path), "--older-than", "1s", "--yes", "--json"])

    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["intents"] == 1
    assert _keys(path) == ["key-00000", "key-00001"]


def test_wrong_durations_are_usage_errors(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _old_acknowledged(path, [40])
    wrong = run_cli(["prune", "--journal", str(path), "--older-than", "30"])
    assert wrong.exit_code == 2
    assert "not a duration" in wrong.output
    assert _keys(path) == ["key-00000"]
