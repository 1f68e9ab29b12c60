"""One bad row never hides or holds back another.

Damage is made for real: a value payonce never writes (headers that are not JSON, a NaN
time, a state that does not exist, an answer cut short, a negative attempt number) is
written straight into the SQLite file or the PostgreSQL table, then the real commands run
as an operator runs them. Each scenario checks what is said about the damaged row, that
the healthy rows are driven to their end, and that the damaged row is left as it was.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.cli import CliResult, run_cli, run_cli_process
from helpers.journals import raw_transaction, rows
from helpers.payments import PAYMENT, MakeClient, leave_pending, make_unknown
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer
from pgserver import PostgresServer

ACCOUNT = "acct_demo"
SECRETS = (DEFAULT_API_KEY,)
EVERY_COLUMN = "SELECT * FROM intents ORDER BY key"


def _env(sandbox: SandboxServer, journal: str) -> dict[str, str]:
    return {
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_PROVIDER": "sandbox",
        "PAYONCE_ACCOUNT": ACCOUNT,
        "PAYONCE_JOURNAL": journal,
    }


def _damage(location: str, statement: str, *params: Any) -> None:
    with raw_transaction(location) as tx:
        assert tx.execute(statement, params) == 1


def _as_held(location: str, statement: str = EVERY_COLUMN) -> str:
    """The rows as text: a NaN is no NaN's equal, its text is."""
    return repr(rows(location, statement))


def _state(location: str, key: str) -> str:
    ((state,),) = rows(location, "SELECT state FROM intents WHERE key = ?", (key,))
    return str(state)


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, journal_path: Path) -> Iterator[str]:
    """The journal, a SQLite file or a PostgreSQL database of the test's own."""
    if request.param == "sqlite":
        yield str(journal_path)
    else:
        yield request.getfixturevalue("postgres_url")


# -- journal check ----------------------------------------------------------------------------


def test_journal_check_names_every_damaged_row_as_recovery_reads_it_and_exits_1(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    """It said "ok" (exit 0) on a journal whose damaged rows made `intents list`, `resume`
    and `worker --once` exit 2: the alert read that as healthy."""
    where = str(journal_path)
    not_json = leave_pending(make_client, "order-not-json").key
    not_a_time = leave_pending(make_client, "order-nan").key
    no_such_state = leave_pending(make_client, "order-state").key
    with make_client() as client:
        for reference in ("order-cut", "order-negative"):
            client.post("/v1/payments", json={"amount": 1, "currency": "eur"}, reference=reference)
        (cut_short_key,) = [r.key for r in client.journal.find("order-cut")]
        (negative,) = [r.key for r in client.journal.find("order-negative")]
    assert run_cli(["journal", "check", "--journal", where]).exit_code == 0
    _damage(where, "UPDATE intents SET request_headers = '[not json' WHERE key = ?", not_json)
    _damage(where, "UPDATE intents SET created_at = 'NaN' WHERE key = ?", not_a_time)
    _damage(where, "UPDATE intents SET state = 'half-settled' WHERE key = ?", no_such_state)
    _damage(
        where,
        'UPDATE intents SET response_headers = \'[["content-type", "appl\' WHERE key = ?',
        cut_short_key,
    )
    _damage(where, "UPDATE attempts SET number = -1 WHERE key = ?", negative)
    _damage(
        where,
        "INSERT INTO webhook_events (endpoint, event_id, type, payload_hash, received_at,"
        " updated_at, deliveries, handler_runs) VALUES ('stripe', 'evt_1', 'charge.succeeded',"
        " 'h', 1.0, 'NaN', 1, 0)",
    )
    held = (_as_held(where), _as_held(where, "SELECT * FROM attempts ORDER BY key, number"))

    piped = run_cli(["journal", "check", "--journal", where], secrets=SECRETS)
    as_json = run_cli(["journal", "check", "--json", "--journal", where], secrets=SECRETS)

    assert piped.exit_code == 1, piped.output
    lines = piped.stdout.splitlines()
    assert "integrity\tok" in lines, "the file itself is sound: its rows are not"
    assert (
        "damaged_rows\t6, each below: listings leave them out, resume and the worker skip them"
        in lines
    )
    damaged = sorted(line.split("\t", 1)[1] for line in lines if line.startswith("damaged\t"))
    assert damaged == sorted(
        [
            f"row of intents for intent {not_json}: request_headers is not JSON: cut short or "
            "edited (Expecting value: line 1 column 2 (char 1))",
            f"row of intents for intent {not_a_time}: created_at is not a time: 'NaN'",
            f"row of intents for intent {no_such_state}: state is 'half-settled', not a state "
            "payonce writes (pending, succeeded, failed, unknown, abandoned)",
            f"row of intents for intent {cut_short_key}: response_headers is not JSON: cut short "
            "or edited (Unterminated string starting at: line 1 column 19 (char 18))",
            f"row of attempts for intent {negative}: number is not a count of 1 or more: -1",
            "row of webhook_events for event stripe/evt_1: updated_at is not a time: 'NaN'",
        ]
    )
    report = json.loads(as_json.stdout)
    assert as_json.exit_code == 1
    assert report["ok"] is False
    assert report["problems"] == []
    by_key = {row["key"]: row for row in report["damaged_rows"]}
    assert set(by_key) == {
        not_json,
        not_a_time,
        no_such_state,
        cut_short_key,
        negative,
        "stripe/evt_1",
    }
    assert by_key[no_such_state] == {
        "table": "intents",
        "key": no_such_state,
        "problem": "state is 'half-settled', not a state payonce writes (pending, succeeded, "
        "failed, unknown, abandoned)",
        "state": "half-settled",
        "account": ACCOUNT,
        "provider": "sandbox",
        "reference": "order-state",
    }
    assert by_key[negative]["table"] == "attempts"
    assert held == (
        _as_held(where),
        _as_held(where, "SELECT * FROM attempts ORDER BY key, number"),
    ), "checked, never repaired or rewritten"


# -- listing and showing ----------------------------------------------------------------------


def test_a_nan_time_is_damage_shown_as_such_by_list_and_show_on_both_backends(
    make_client: MakeClient, location: str
) -> None:
    """`intents show` of a row with a NaN timestamp printed a traceback."""
    damaged = leave_pending(make_client, "order-nan", journal=location).key
    healthy = leave_pending(make_client, "order-fine", journal=location).key
    # PostgreSQL holds a real NaN; SQLite keeps the text, which Python reads as one.
    _damage(location, "UPDATE intents SET updated_at = 'NaN' WHERE key = ?", damaged)
    held = _as_held(location)
    problem = f"error: damaged row of intents for intent {damaged}: updated_at is not a time"

    listed = run_cli(["intents", "list", "--journal", location])
    listed_json = run_cli(["intents", "list", "--json", "--journal", location])
    shown = run_cli(["intents", "show", damaged, "--journal", location])
    by_reference = run_cli(["intents", "show", "order-nan", "--json", "--journal", location])

    assert listed.exit_code == 1, listed.output
    assert healthy in listed.stdout
    assert damaged not in listed.stdout
    assert problem in listed.stderr
    assert "check the intent at the provider" in listed.stderr
    assert [r["key"] for r in json.loads(listed_json.stdout)] == [healthy]
    assert listed_json.exit_code == 1
    assert problem in listed_json.stderr
    for result in (shown, by_reference):
        assert result.exit_code == 1, result.output
        assert problem in result.stderr
    assert by_reference.stdout == ""
    assert _as_held(location) == held


def test_ack_list_names_a_damaged_settled_row_it_cannot_show(
    make_client: MakeClient, journal_path: Path
) -> None:
    """A settled outcome the caller never recorded, whose row no longer decodes: left out
    of the list, it would read as "nothing missed"."""
    where = str(journal_path)
    keys = []
    with make_client() as client:
        for reference in ("order-1", "order-2"):
            with client.intent(reference, acknowledge=False) as op:
                op.post("/v1/payments", json={"amount": 1, "currency": "eur"})
            assert op.key is not None
            keys.append(op.key)
    _damage(where, "UPDATE intents SET response_status = 1500 WHERE key = ?", keys[0])
    held = _as_held(where)

    listed = run_cli(["ack", "--list", "--json", "--journal", where])

    assert listed.exit_code == 1, listed.output
    assert [r["key"] for r in json.loads(listed.stdout)] == [keys[1]]
    assert (
        f"error: damaged row of intents for intent {keys[0]}: response_status is not an HTTP "
        "status: 1500" in listed.stderr
    )
    assert _as_held(where) == held


# -- resume, reconcile, the worker ------------------------------------------------------------


def test_resume_skips_damaged_rows_names_them_and_finishes_every_other_intent(
    make_client: MakeClient, sandbox: SandboxServer, location: str
) -> None:
    """One malformed row stopped `resume` for the whole journal: every pending payment
    behind it waited. One damaged row here is the oldest, met first; the other's time is
    no number at all."""
    not_json = leave_pending(make_client, "order-1", journal=location).key
    not_a_time = leave_pending(make_client, "order-2", journal=location).key
    behind = [leave_pending(make_client, f"order-{n}", journal=location).key for n in (3, 4)]
    _damage(location, "UPDATE intents SET request_headers = '[not json' WHERE key = ?", not_json)
    # Sorted after every number on both backends: the pass goes on from it, to its end.
    _damage(location, "UPDATE intents SET created_at = 'NaN' WHERE key = ?", not_a_time)
    select_damaged = f"SELECT * FROM intents WHERE key IN ('{not_json}', '{not_a_time}')"
    damaged_rows = _as_held(location, select_damaged + " ORDER BY key")

    result = run_cli(["resume"], env=_env(sandbox, location), secrets=SECRETS)

    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0].startswith(
        "resumed 4 intent(s): 2 settled (2 succeeded), 0 still pending, 0 still unknown, "
        "2 damaged row(s) skipped (see `payonce journal check`)"
    )
    lines = {line.split("\t")[0]: line.split("\t") for line in result.stdout.splitlines()[1:]}
    assert lines[not_json][2:] == [
        "pending",
        "its journal row is damaged (request_headers is not JSON: cut short or edited "
        "(Expecting value: line 1 column 2 (char 1))): skipped, never sent. Check it at the "
        "provider, then restore or repair the row (`payonce journal check` lists them)",
    ]
    assert "(created_at is not a time: " in lines[not_a_time][3]
    assert [_state(location, key) for key in behind] == ["succeeded", "succeeded"]
    assert _as_held(location, select_damaged + " ORDER BY key") == damaged_rows
    # The dead worker's sends, each executed once; nothing sent again for a damaged row.
    assert sandbox.store.executions() == dict.fromkeys([not_json, not_a_time, *behind], 1)
    again = run_cli(["resume", "--json"], env=_env(sandbox, location), secrets=SECRETS)
    assert again.exit_code == 1
    assert {r["key"]: r.get("damaged") for r in json.loads(again.stdout)} == {
        not_json: True,
        not_a_time: True,
    }


def test_reconcile_all_skips_a_damaged_unknown_row_names_it_and_reconciles_the_rest(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    where = str(journal_path)
    damaged = make_unknown(make_client, sandbox, "order-u1", "fail_after").key
    healthy = make_unknown(make_client, sandbox, "order-u2", "fail_after").key
    _damage(where, "UPDATE intents SET created_at = 'NaN' WHERE key = ?", damaged)
    held = _as_held(where, f"SELECT * FROM intents WHERE key = '{damaged}'")

    result = run_cli(["reconcile", "--all"], env=_env(sandbox, where), secrets=SECRETS)

    assert result.exit_code == 1, result.output
    lines = {line.split("\t")[0]: line.split("\t") for line in result.stdout.splitlines()[1:]}
    assert lines[healthy][2:5] == ["unknown", "succeeded", "found"]
    assert lines[damaged][2:5] == ["unknown", "unknown", "error"]
    assert "its journal row is damaged (created_at is not a time: 'NaN')" in lines[damaged][5]
    assert "1 damaged row(s) skipped" in result.stderr
    assert _state(where, healthy) == "succeeded"
    named = run_cli(["reconcile", damaged, "--json"], env=_env(sandbox, where), secrets=SECRETS)
    assert named.exit_code == 1, named.output
    (document,) = json.loads(named.stdout)
    assert (document["key"], document["outcome"], document["damaged"]) == (
        damaged,
        "error",
        True,
    )
    assert _as_held(where, f"SELECT * FROM intents WHERE key = '{damaged}'") == held


@pytest.mark.slow
def test_the_worker_skips_a_damaged_row_says_it_and_sends_every_other_intent(
    make_client: MakeClient, sandbox: SandboxServer, location: str
) -> None:
    """`worker --once` exited 2 on the first malformed row: no pending payment was sent."""
    damaged = leave_pending(make_client, "order-1", journal=location).key
    behind = leave_pending(make_client, "order-2", journal=location).key
    _damage(location, "UPDATE intents SET request_headers = '[[\"a\"' WHERE key = ?", damaged)
    held = _as_held(location, f"SELECT * FROM intents WHERE key = '{damaged}'")
    env = _env(sandbox, location)

    done: CliResult = run_cli_process(["worker", "--once"], env=env, secrets=SECRETS)

    assert done.exit_code == 1, done.output
    said = [line for line in done.stderr.splitlines() if damaged in line]
    assert len(said) == 1, done.stderr
    assert "its journal row is damaged (request_headers is not JSON" in said[0]
    assert "skipped, never sent" in said[0]
    assert "1 damaged row(s) skipped" in done.stderr
    assert _state(location, behind) == "succeeded"
    assert _as_held(location, f"SELECT * FROM intents WHERE key = '{damaged}'") == held
    assert sandbox.store.executions()[damaged] == 1


# -- a privilege revoked mid-send -------------------------------------------------------------


class _RevokeOnSend(payonce.Hooks):
    """Revokes the worker role's UPDATE on the intents once its first attempt has started:
    the intent was claimed and sent, and its outcome cannot be written."""

    def __init__(self, server: PostgresServer, dbname: str, schema: str) -> None:
        self._server, self._dbname, self._schema = server, dbname, schema
        self.revoked = False

    def attempt_started(self, event: Any) -> None:
        if not self.revoked:
            with self._server.admin(self._dbname) as conn:
                conn.execute(f"REVOKE UPDATE ON {self._schema}.intents FROM payer_{self._schema}")
            self.revoked = True


@pytest.mark.slow
@pytest.mark.parametrize("schema", ["public", "payonce"])
def test_a_revoked_privilege_is_named_with_its_table_and_grant_once_a_pass_without_traceback(
    make_client: MakeClient,
    sandbox: SandboxServer,
    postgres_server: PostgresServer,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    schema: str,
) -> None:
    """It advised granting CREATE ON DATABASE (the schema exists; UPDATE is missing) and
    logged a full traceback every pass."""
    dbname = postgres_url.rsplit("/", 1)[1]
    query = "" if schema == "public" else f"?schema={schema}"
    role = f"payer_{schema}"
    journal = postgres_url + query
    first = leave_pending(make_client, "order-1", journal=journal).key
    second = leave_pending(make_client, "order-2", journal=journal).key
    with postgres_server.admin(dbname) as conn:
        # Roles are the server's, not the database's: one name per test.
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'payer-pw'")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"
        )
    as_payer = postgres_server.url(dbname, user=role, password="payer-pw") + query
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    revoking = _RevokeOnSend(postgres_server, dbname, schema)
    caplog.set_level(logging.INFO, logger="payonce")
    grant = f"GRANT UPDATE ON {schema}.intents TO {role}"

    with payonce.worker.Worker(
        journal=as_payer, base_url=sandbox.url, account=ACCOUNT, hooks=[revoking]
    ) as worker:
        passes = [worker.run_pass() for _ in range(3)]
        # payonce's own lines (psycopg may warn of the refused connection's pipeline as the
        # pool closes it).
        errors = [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("payonce")
        ]
        with postgres_server.admin(dbname) as conn:
            conn.execute(f"GRANT UPDATE ON {schema}.intents TO {role}")
        caplog.clear()
        last = worker.run_pass()

    assert revoking.revoked
    assert all(record.exc_info is None for record in errors), "no traceback"
    assert "CREATE ON DATABASE" not in caplog.text
    lacks = f"the database role {role} lacks UPDATE on the journal's table {schema}.intents"
    # The intent being sent: its outcome could not be written; it may have executed.
    (mid_send,) = [r.getMessage() for r in errors if r.getMessage().startswith(f"intent {first}")]
    assert lacks in mid_send
    assert grant in mid_send
    assert "may already have reached the provider" in mid_send
    # Then each pass, the first one included: said once, with the GRANT; the worker keeps
    # running, and the intents stay pending under their keys.
    passed = [r.getMessage() for r in errors if "the pass failed" in r.getMessage()]
    assert len(passed) == 3, [r.getMessage() for r in errors]
    assert len(errors) == 4
    for message in passed:
        assert lacks in message
        assert grant in message
        said = message.split("the pass failed: ", 1)[1]
        assert len(said.split("; ")[0]) <= 200, "what happened and what to do, short"
    assert [p.failed for p in passes] == [1, 1, 1]
    assert last.failed == 0
    with payonce.open_journal(journal, read_only=True) as settled:
        found = [settled.get(key) for key in (first, second)]
    assert [r.state if r else None for r in found] == [payonce.IntentState.SUCCEEDED] * 2
    assert sandbox.store.executions() == {first: 1, second: 1}


@pytest.mark.anyio
async def test_the_async_client_s_resume_and_reconcile_all_skip_a_damaged_row_too(
    make_client: MakeClient,
    make_async_client: Any,
    sandbox: SandboxServer,
    journal_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    where = str(journal_path)
    damaged = leave_pending(make_client, "order-1").key
    behind = leave_pending(make_client, "order-2").key
    unknown = make_unknown(make_client, sandbox, "order-3", "fail_after").key
    _damage(
        where, "UPDATE intents SET state = 'unknown', created_at = 'NaN' WHERE key = ?", damaged
    )
    held = _as_held(where, f"SELECT * FROM intents WHERE key = '{damaged}'")
    client = make_async_client()

    reconciled = await client.reconcile_all()
    resumed = await client.resume()

    assert [(r.key, r.damaged) for r in reconciled] == [(unknown, False), (damaged, True)]
    assert reconciled[1].outcome == "error"
    assert "its journal row is damaged (created_at is not a time: 'NaN')" in reconciled[1].detail
    assert [(r.key, r.state, r.damaged) for r in resumed] == [
        (behind, payonce.IntentState.SUCCEEDED, False)
    ]
    assert [r.key for r in await client.unknown()] == []
    assert [d.key for d in (await client.unknown()).damaged] == [damaged]
    assert _state(where, unknown) == "succeeded"
    assert _as_held(where, f"SELECT * FROM intents WHERE key = '{damaged}'") == held
    said = [r for r in caplog.records if damaged in r.getMessage()]
    assert [r.levelno for r in said] == [logging.ERROR]


def test_an_enqueued_outcome_whose_row_is_damaged_is_named_beside_the_others(
    make_client: MakeClient, journal_path: Path
) -> None:
    """The service's outcome reader is told of the outcome it cannot be given, and still
    gets every other."""
    where = str(journal_path)
    client = make_client()
    keys = [
        client.enqueue(
            "POST", "/v1/payments", reference=f"order-{n}", json=PAYMENT, connection=None
        ).key
        for n in (1, 2)
    ]
    assert [r.state for r in client.resume()] == [payonce.IntentState.SUCCEEDED] * 2
    _damage(where, "UPDATE intents SET response_headers = '[[' WHERE key = ?", keys[0])
    held = _as_held(where)

    page = client.outcomes()

    assert [intent.key for intent in page] == [keys[1]]
    (damaged,) = page.damaged
    assert (damaged.key, damaged.reference) == (keys[0], "order-1")
    assert damaged.problem.startswith("response_headers is not JSON")
    assert _as_held(where) == held
