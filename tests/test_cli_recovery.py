"""``payonce resume``, ``reconcile``, ``abandon``, ``ack`` and ``journal check/backup``.

All of it for real: a real journal file, filled by a real ``payonce.Client`` talking to the
real sandbox provider over loopback, then driven by the command as an operator (or a cron
job) would. A worker "dies" by a transport that really sends the request and then fails,
leaving the intent pending exactly as a crash after sending would.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import keyring
import keyring.backend
import keyring.backends.fail
import pytest

import payonce
from helpers.cli import CliResult, run_cli, run_cli_process
from helpers.journals import store_of
from helpers.keyrings import SessionKeyring, UseKeyring
from helpers.payments import PAYMENT, MakeClient, leave_pending, make_unknown
from payonce._journal._schema import SCHEMA_VERSION
from payonce._owners import new_owner as payonce_owner
from payonce.providers import get_profile
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

ACCOUNT = "acct_demo"  # the sandbox's account for DEFAULT_API_KEY, as in conftest
DAY = 24 * 3600.0
SECRETS = (DEFAULT_API_KEY,)  # never printed: every command here is run with secrets=SECRETS
UNHEARD_ONE = (
    "note: 1 settled intent is unacknowledged: the code that made it never heard the "
    "outcome. Run it again for the same reference (the outcome replays), or record it and "
    "`payonce ack KEY` (`ack --list`)"
)
"""Said last when a run settled an intent whose code died before it heard the outcome."""


def _pay(client: payonce.Client, reference: str, *, acknowledge: bool = True) -> str:
    with client.intent(reference, acknowledge=acknowledge) as op:
        assert op.post("/v1/payments", json=PAYMENT).status_code == 201
    assert op.key is not None
    return op.key


def _state(journal_path: Path, key: str) -> payonce.IntentRecord:
    journal = payonce.open_journal(journal_path)
    try:
        record = journal.get(key)
    finally:
        journal.close()
    assert record is not None
    return record


@pytest.fixture
def env(sandbox: SandboxServer, journal_path: Path) -> dict[str, str]:
    """What an operator's shell (or a cron job) would export."""
    return {
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_PROVIDER": "sandbox",
        "PAYONCE_ACCOUNT": ACCOUNT,
        "PAYONCE_JOURNAL": str(journal_path),
        "COLUMNS": "200",
    }


def _json(result: CliResult) -> Any:
    return json.loads(result.stdout)


def _summary(result: CliResult) -> str:
    """The summary line: piped, as under the runner, it goes to stderr, first, and stdout
    holds the records alone."""
    return result.stderr.splitlines()[0]


# -- resume -----------------------------------------------------------------------------------


def test_resume_finishes_what_a_dead_worker_left_pending_under_the_same_key(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    left = [leave_pending(make_client, f"order-{n}") for n in range(3)]
    assert sandbox.store.total_executions() == 3  # the dead worker's requests did arrive

    result = run_cli(["resume"], env=env, secrets=SECRETS)

    assert result.exit_code == 0, result.output
    for record in left:
        assert record.key in result.stdout
        assert _state(journal_path, record.key).state is payonce.IntentState.SUCCEEDED
    assert _summary(result) == (
        "resumed 3 intent(s): 3 settled (3 succeeded), 0 still pending, 0 still unknown"
    )
    assert sandbox.store.executions() == {r.key: 1 for r in left}  # resent, never re-executed

    again = run_cli(["resume"], env=env, secrets=SECRETS)
    assert again.exit_code == 0
    assert "nothing to resume" in again.stderr


def test_resume_skips_pending_intents_live_workers_hold_and_says_when_to_run_again(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    """Right after a failover, settles lost with the old primary leave intents pending under
    the leases of workers still running: resume must not say "nothing to resume"."""
    held = [leave_pending(make_client, f"order-h{n}") for n in range(2)]
    free = leave_pending(make_client, "order-free")
    live_worker = payonce_owner()
    until = time.time() + 120
    journal = payonce.open_journal(journal_path)
    try:
        for record in held:
            claim = store_of(journal).claim_key(
                record.key, owner=live_worker, now=until - 120, lease_seconds=120
            )
            assert claim is not None
    finally:
        journal.close()
    executed = sandbox.store.executions()

    result = run_cli(["resume"], env=env, secrets=SECRETS)

    assert result.exit_code == 1, result.output
    assert free.key in result.stdout
    *lines, note = result.stderr.splitlines()
    assert note == UNHEARD_ONE  # the free one's code died before it heard
    summary = " ".join(" ".join(lines).split())
    assert "resumed 1 intent(s)" in summary, summary
    assert "2 other pending intents held by live workers" in summary, summary
    last = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
    assert summary.endswith(f"Run `payonce resume` again after {last}"), summary
    for record in held:
        assert _state(journal_path, record.key).state is payonce.IntentState.PENDING
    assert sandbox.store.executions() == {**executed, free.key: 1}

    again = run_cli(["resume"], env=env, secrets=SECRETS)
    assert again.exit_code == 1, again.output
    assert " ".join(again.stderr.split()) == (
        "nothing resumed of account 'acct_demo' (provider 'sandbox'); 2 pending intents held "
        f"by live workers (leases until {last} at the latest), skipped: their workers may be "
        f"sending them now. Run `payonce resume` again after {last}"
    )


def test_resume_json_is_a_list_of_results_and_the_summary_goes_to_stderr(
    make_client: MakeClient, env: dict[str, str]
) -> None:
    record = leave_pending(make_client, "order-j")

    result = run_cli(["resume", "--json"], env=env, secrets=SECRETS)

    assert result.exit_code == 0, result.output
    assert _json(result) == [
        {
            "key": record.key,
            "reference": "order-j",
            "state": "succeeded",
            "detail": "HTTP 201",
            "unknown_reason": None,
        }
    ]
    assert result.stderr.startswith("resumed 1 intent(s): 1 settled")
    assert _json(run_cli(["resume", "--json"], env=env, secrets=SECRETS)) == []


@pytest.mark.slow
def test_resume_exits_1_when_an_intent_ends_unknown_and_says_why(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    first = leave_pending(make_client, "order-a")
    second = leave_pending(make_client, "order-b")
    sandbox.script(["fail_before"] * 5)  # every resend of the first sees a 503

    result = run_cli(["resume", "--json"], env=env, secrets=SECRETS)

    assert result.exit_code == 1, result.output
    by_key = {item["key"]: item for item in _json(result)}
    assert by_key[first.key]["state"] == "unknown"
    assert by_key[first.key]["unknown_reason"] == "retries exhausted; last failure: HTTP 503"
    assert by_key[second.key]["state"] == "succeeded"
    assert result.stderr.splitlines() == [
        "resumed 2 intent(s): 1 settled (1 succeeded), 0 still pending, "
        "1 still unknown (1x retries exhausted; last failure: HTTP 503)",
        UNHEARD_ONE,
    ]
    assert sandbox.store.executions() == {first.key: 1, second.key: 1}


def test_resume_warns_once_of_each_intent_that_goes_unknown(
    make_client: MakeClient, env: dict[str, str]
) -> None:
    # Sent a day ago, beyond the sandbox's key lifetime: resume makes them unknown at once.
    left = [
        leave_pending(make_client, f"order-{n}", clock=lambda: time.time() - DAY) for n in range(2)
    ]

    # A process of its own: under pytest, whose log capture is a root handler, the command
    # leaves logging alone and prints no warning lines at all.
    done = run_cli_process(["resume"], env=env, secrets=SECRETS)

    assert done.exit_code == 1, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == len(left), done.stderr
    for record, line in zip(left, warnings, strict=True):
        assert line.startswith(f"warning: intent {record.key} ({record.reference}) went unknown")


def test_resume_only_touches_its_account(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    leave_pending(make_client, "order-x")
    result = run_cli(["resume", "--account", "acct_other"], env=env, secrets=SECRETS)
    assert result.exit_code == 0
    assert "nothing to resume: no pending intent of account 'acct_other'" in result.stderr
    assert result.stdout == ""
    assert sandbox.store.total_executions() == 1


# -- which accounts and providers, when not told -----------------------------------------------


def _without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def test_without_provider_or_account_resume_drives_what_the_journal_holds(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], use_keyring: UseKeyring
) -> None:
    ours = leave_pending(make_client, "order-a")
    theirs = leave_pending(make_client, "order-b", account="acct_other")
    # Two accounts: PAYONCE_API_KEY is neither's for sure; each has its key in the keyring.
    use_keyring(SessionKeyring())
    for account in (ACCOUNT, "acct_other"):
        payonce.credentials.store_api_key(account, DEFAULT_API_KEY)

    result = run_cli(
        ["resume", "--json"],
        env=_without(env, "PAYONCE_PROVIDER", "PAYONCE_ACCOUNT"),
        secrets=SECRETS,
    )

    assert result.exit_code == 0, result.output
    assert {i["key"]: i["state"] for i in _json(result)} == {
        ours.key: "succeeded",
        theirs.key: "succeeded",
    }
    assert sandbox.store.executions() == {ours.key: 1, theirs.key: 1}


def test_an_account_without_an_api_key_is_named_and_the_others_are_driven(
    make_client: MakeClient,
    sandbox: SandboxServer,
    env: dict[str, str],
    journal_path: Path,
    use_keyring: UseKeyring,
) -> None:
    ours = leave_pending(make_client, "order-a")
    theirs = leave_pending(make_client, "order-b", account="acct_other")
    use_keyring(SessionKeyring())
    payonce.credentials.store_api_key(ACCOUNT, DEFAULT_API_KEY)  # none for acct_other

    result = run_cli(
        ["resume"],
        env=_without(env, "PAYONCE_PROVIDER", "PAYONCE_ACCOUNT", "PAYONCE_API_KEY"),
        secrets=SECRETS,
    )

    assert result.exit_code == 1, result.output
    summary, line, note = result.stderr.splitlines()
    assert summary.startswith("resumed 1 intent(s): 1 settled")
    assert note == UNHEARD_ONE  # said last, once
    assert line.startswith("error: not driven: account 'acct_other' (provider 'sandbox'): ")
    assert "no API key for account 'acct_other'" in line
    assert _state(journal_path, ours.key).state is payonce.IntentState.SUCCEEDED
    assert _state(journal_path, theirs.key).state is payonce.IntentState.PENDING
    assert sandbox.store.executions() == {ours.key: 1, theirs.key: 1}, "sent once, before"


def test_work_for_several_providers_is_a_usage_error_that_names_them(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    sandboxed = leave_pending(make_client, "order-a")
    generic = leave_pending(make_client, "order-b", provider="generic")

    result = run_cli(
        ["resume"], env=_without(env, "PAYONCE_PROVIDER", "PAYONCE_ACCOUNT"), secrets=SECRETS
    )

    assert result.exit_code == 2
    assert "pending intents of several providers: generic (1), sandbox (1)" in result.stderr
    assert "--base-url PROVIDER=URL" in result.stderr
    for record in (sandboxed, generic):
        assert _state(journal_path, record.key).state is payonce.IntentState.PENDING


@pytest.mark.parametrize("given", ["options", "environment"])
def test_each_provider_is_driven_at_its_own_base_url(
    make_client: MakeClient,
    sandbox: SandboxServer,
    env: dict[str, str],
    journal_path: Path,
    given: str,
) -> None:
    sandboxed = leave_pending(make_client, "order-a")
    generic = leave_pending(make_client, "order-b", provider="generic")
    pairs = [f"sandbox={sandbox.url}", f"generic={sandbox.url}"]
    everywhere = _without(env, "PAYONCE_PROVIDER", "PAYONCE_BASE_URL")  # the key's account
    if given == "options":
        args = ["--base-url", pairs[0], "--base-url", pairs[1]]
    else:
        args, everywhere = [], {**everywhere, "PAYONCE_BASE_URL": " ".join(pairs)}

    result = run_cli(["resume", "--json", *args], env=everywhere, secrets=SECRETS)

    assert result.exit_code == 0, result.output
    assert {i["key"]: i["state"] for i in _json(result)} == {
        sandboxed.key: "succeeded",
        generic.key: "succeeded",
    }
    assert sandbox.store.executions() == {sandboxed.key: 1, generic.key: 1}


def test_the_one_provider_named_without_its_base_url_is_a_usage_error(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    leave_pending(make_client, "order-a", provider="generic")
    named = _without(env, "PAYONCE_BASE_URL")
    args = ["--provider", "generic", "--base-url", f"sandbox={sandbox.url}"]

    result = run_cli(["resume", *args], env=named, secrets=SECRETS)

    assert result.exit_code == 2
    assert result.stderr == "error: no --base-url for provider 'generic'\n"
    assert sandbox.store.total_executions() == 1, "sent once, before; not again"


@pytest.mark.parametrize("command", [["resume"], ["reconcile", "order-a"]])
def test_no_base_url_at_all_names_where_the_journal_says_the_intents_went(
    make_client: MakeClient,
    sandbox: SandboxServer,
    env: dict[str, str],
    journal_path: Path,
    command: list[str],
) -> None:
    # The journal keeps each request's URL, not the API root its look-ups start from, so
    # payonce shows the origin rather than guess the root; nothing is sent or changed.
    record = leave_pending(make_client, "order-a")
    origin = sandbox.url.rstrip("/")

    result = run_cli(command, env=_without(env, "PAYONCE_BASE_URL"), secrets=SECRETS)

    assert result.exit_code == 2
    assert "--base-url is required (or PAYONCE_BASE_URL)" in result.stderr
    assert f"The journal says these intents were sent to provider 'sandbox' at {origin}:" in (
        result.stderr
    )
    after = _state(journal_path, record.key)
    assert (after.state, after.lease_owner) == (payonce.IntentState.PENDING, None)
    assert sandbox.store.executions() == {record.key: 1}, "sent once, before; not again"


def test_a_provider_without_a_base_url_is_named_and_the_others_are_driven(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    sandboxed = leave_pending(make_client, "order-a")
    generic = leave_pending(make_client, "order-b", provider="generic")
    everywhere = _without(env, "PAYONCE_PROVIDER", "PAYONCE_BASE_URL")  # the key's account

    result = run_cli(
        ["resume", "--base-url", f"sandbox={sandbox.url}"], env=everywhere, secrets=SECRETS
    )

    assert result.exit_code == 1, result.output
    assert (
        "error: not driven: account 'acct_demo' (provider 'generic'): no base URL for it: "
        "add --base-url generic=URL"
    ) in result.stderr
    assert _state(journal_path, sandboxed.key).state is payonce.IntentState.SUCCEEDED
    assert _state(journal_path, generic.key).state is payonce.IntentState.PENDING


def test_nothing_for_the_account_named_says_where_the_work_is(
    make_client: MakeClient, env: dict[str, str]
) -> None:
    leave_pending(make_client, "order-a")

    result = run_cli(["resume", "--account", "acct_other"], env=env, secrets=SECRETS)

    assert result.exit_code == 0, "what it was asked to drive is settled"
    assert result.stdout == ""
    assert result.stderr.startswith("nothing to resume: no pending intent of account")
    assert "the journal holds some of --provider sandbox --account acct_demo (1)" in " ".join(
        result.stderr.split()
    )


def test_reconcile_by_reference_finds_the_intent_s_account_and_provider(
    make_client: MakeClient,
    sandbox: SandboxServer,
    env: dict[str, str],
    journal_path: Path,
    use_keyring: UseKeyring,
) -> None:
    record = make_unknown(make_client, sandbox, "order-r", "drop_after")
    # No account named: its key comes from the keyring, never guessed from the environment.
    use_keyring(SessionKeyring())
    payonce.credentials.store_api_key(ACCOUNT, DEFAULT_API_KEY)

    result = run_cli(
        ["reconcile", "order-r"],
        env=_without(env, "PAYONCE_PROVIDER", "PAYONCE_ACCOUNT", "PAYONCE_API_KEY"),
        secrets=SECRETS,
    )

    assert result.exit_code == 0, result.output
    assert _state(journal_path, record.key).state is payonce.IntentState.SUCCEEDED


# -- reconcile --------------------------------------------------------------------------------


def test_reconcile_settles_an_unknown_intent_the_provider_executed(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    record = make_unknown(make_client, sandbox, "order-1", "drop_after")
    assert sandbox.store.executions() == {record.key: 1}

    result = run_cli(["reconcile", "order-1"], env=env, secrets=SECRETS)

    assert result.exit_code == 0, result.output
    assert f"{record.key}\torder-1\tunknown\tsucceeded\tfound\t" in result.stdout
    assert _summary(result) == (
        "reconciled 1 intent(s): 1 settled (1 succeeded), 0 back to pending, 0 still unknown"
    )
    assert _state(journal_path, record.key).state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {record.key: 1}

    (again,) = _json(
        run_cli(["reconcile", record.key, "--json"], env=env, secrets=SECRETS)
    )  # by key, now settled
    assert (again["outcome"], again["before"], again["after"]) == (
        "skipped",
        "succeeded",
        "succeeded",
    )


def test_reconcile_json(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    record = make_unknown(make_client, sandbox, "order-2", "drop_after")

    result = run_cli(["reconcile", record.key, "--json"], env=env, secrets=SECRETS)

    assert result.exit_code == 0, result.output
    assert _json(result) == [
        {
            "key": record.key,
            "reference": "order-2",
            "before": "unknown",
            "after": "succeeded",
            "outcome": "found",
            "detail": "the provider has the record, status 'succeeded'",
            "unknown_reason": None,
        }
    ]


def test_reconcile_all_with_a_mix_groups_what_stays_unknown_and_exits_1(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    executed = make_unknown(make_client, sandbox, "order-executed", "drop_after")
    never_arrived = make_unknown(make_client, sandbox, "order-never", "fail_before")
    held = make_unknown(make_client, sandbox, "order-held", "fail_before")
    pending = leave_pending(make_client, "order-pending")
    settled = _pay(make_client(), "order-paid")
    # Another worker is reconciling this one right now: its lease is live.
    other = payonce.open_journal(journal_path)
    other_store = store_of(other)
    other_store.claim_key(
        held.key, owner="other-host:4242:w", now=time.time(), lease_seconds=60, unknown=True
    )
    other.close()

    result = run_cli(["reconcile", "--all", "--json"], env=env, secrets=SECRETS)

    assert result.exit_code == 1, result.output
    items = _json(result)
    assert [item["key"] for item in items] == [executed.key, never_arrived.key, held.key]
    outcomes = {item["reference"]: (item["outcome"], item["after"]) for item in items}
    assert outcomes == {
        "order-executed": ("found", "succeeded"),
        "order-never": ("not_found", "pending"),
        "order-held": ("skipped", "unknown"),
    }
    assert result.stderr.splitlines() == [
        "reconciled 3 intent(s): 1 settled (1 succeeded), 1 back to pending, "
        "1 still unknown (1x another worker holds it right now)",
        UNHEARD_ONE,  # order-executed: its code gave up on it, unknown
    ]
    assert _state(journal_path, pending.key).state is payonce.IntentState.PENDING
    assert _state(journal_path, settled).state is payonce.IntentState.SUCCEEDED

    # The one the provider never saw is resent once by resume; nothing ran twice.
    resumed = run_cli(["resume", "--json"], env=env, secrets=SECRETS)
    assert {i["key"]: i["state"] for i in _json(resumed)} == {
        never_arrived.key: "succeeded",
        pending.key: "succeeded",
    }
    assert sandbox.store.executions() == {
        executed.key: 1,
        never_arrived.key: 1,
        pending.key: 1,
        settled: 1,
    }


def test_reconcile_table_and_summary(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    make_unknown(make_client, sandbox, "order-t1", "drop_after")
    make_unknown(make_client, sandbox, "order-t2", "fail_before")

    result = run_cli(["reconcile", "--all"], env=env, secrets=SECRETS)

    assert result.exit_code == 1, "one is back to pending: not settled until resumed"
    header, *lines = result.stdout.splitlines()
    assert header == "key\treference\tbefore\tafter\toutcome\tdetail"
    assert len(lines) == 2
    assert "\torder-t2\tunknown\tpending\tnot_found\t" in result.stdout
    assert "\x1b" not in result.stdout  # not a terminal: no styling and no progress bar
    assert _summary(result) == (
        "reconciled 2 intent(s): 1 settled (1 succeeded), 1 back to pending, 0 still unknown"
    )
    nothing = run_cli(["reconcile", "--all"], env=env, secrets=SECRETS)
    assert nothing.exit_code == 0
    assert nothing.stdout == ""
    assert nothing.stderr.startswith("nothing to reconcile: no unknown intent")


def test_a_progress_bar_only_on_a_terminal_and_never_in_json(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    terminal = {**env, "TTY_COMPATIBLE": "1"}  # rich: treat stdout as a terminal
    make_unknown(make_client, sandbox, "order-p1", "drop_after")
    leave_pending(make_client, "order-p2")
    leave_pending(make_client, "order-p3")

    reconciled = run_cli(["reconcile", "--all"], env=terminal, secrets=SECRETS)
    assert reconciled.exit_code == 0, reconciled.output
    assert "reconciling" in reconciled.stdout
    assert "1/1" in reconciled.stdout

    resumed = run_cli(["resume"], env=terminal, secrets=SECRETS)
    assert resumed.exit_code == 0, resumed.output
    assert "resuming" in resumed.stdout
    assert "2/2" in resumed.stdout

    make_unknown(make_client, sandbox, "order-p4", "drop_after")
    as_json = run_cli(["reconcile", "--all", "--json"], env=terminal, secrets=SECRETS)
    assert as_json.exit_code == 0
    assert [item["reference"] for item in _json(as_json)] == ["order-p4"]  # JSON only


def test_a_refused_status_lookup_stops_only_that_intent_and_exits_1(
    make_client: MakeClient,
    make_sandbox: Any,
    env: dict[str, str],
    journal_path: Path,
) -> None:
    keys = {DEFAULT_API_KEY: ACCOUNT}
    provider = make_sandbox(api_keys=keys)  # a sandbox of its own: its key is revoked below
    first = make_unknown(make_client, provider, "order-r1", "drop_after", base_url=provider.url)
    second = make_unknown(make_client, provider, "order-r2", "drop_after", base_url=provider.url)
    # The key that sent them is revoked at the provider: each look-up (made with that key,
    # the only one that may look them up) is refused. (A key that did not send them is
    # never sent: see test_credentials_travel.py.)
    keys.clear()
    env = {**env, "PAYONCE_BASE_URL": provider.url}

    result = run_cli(["reconcile", "--all", "--json"], env=env, secrets=SECRETS)

    assert result.exit_code == 1, result.output
    assert [(i["key"], i["outcome"], i["after"]) for i in _json(result)] == [
        (first.key, "error", "unknown"),
        (second.key, "error", "unknown"),
    ]
    assert result.stderr.strip() == (
        "reconciled 2 intent(s): 0 settled, 0 back to pending, "
        "2 still unknown (2x status look-up refused: HTTP 401)"
    )
    assert _state(journal_path, first.key).lease_owner is None
    keys[DEFAULT_API_KEY] = ACCOUNT
    assert (
        _json(run_cli(["reconcile", "--all", "--json"], env=env, secrets=SECRETS))[0]["outcome"]
        == "found"
    )


def test_reconcile_needs_exactly_one_target(env: dict[str, str]) -> None:
    for args in (["reconcile"], ["reconcile", "order-1", "--all"]):
        result = run_cli(args, env=env, secrets=SECRETS)
        assert result.exit_code == 2
        assert "KEY_OR_REFERENCE or --all" in result.stderr


def test_reconcile_of_an_intent_that_is_not_there_or_not_ours(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    record = make_unknown(make_client, sandbox, "order-3", "drop_after")

    missing = run_cli(["reconcile", "order-404"], env=env, secrets=SECRETS)
    assert missing.exit_code == 1
    assert missing.stderr == "error: no intent with key or reference 'order-404'\n"

    elsewhere = run_cli(
        ["reconcile", "order-3", "--account", "acct_other"], env=env, secrets=SECRETS
    )
    assert elsewhere.exit_code == 1
    assert "--account acct_demo --provider sandbox" in elsewhere.stderr
    assert _state(journal_path, record.key).state is payonce.IntentState.UNKNOWN


def test_only_intents_of_the_given_provider_are_reconciled(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    record = make_unknown(make_client, sandbox, "order-s", "drop_after")

    other = run_cli(["reconcile", "--all", "--provider", "generic"], env=env, secrets=SECRETS)
    assert other.exit_code == 0
    assert "no unknown intent of account 'acct_demo' (provider 'generic')" in other.stderr
    named = run_cli(["reconcile", "order-s", "--provider", "generic"], env=env, secrets=SECRETS)
    assert named.exit_code == 1
    assert "--account acct_demo --provider sandbox" in named.stderr

    unknown_profile = run_cli(
        ["reconcile", "--all", "--provider", "acme"], env=env, secrets=SECRETS
    )
    assert unknown_profile.exit_code == 2
    assert "unknown provider 'acme'" in unknown_profile.stderr
    assert _state(journal_path, record.key).state is payonce.IntentState.UNKNOWN


def test_a_provider_without_a_status_lookup_is_reconciled_by_resending_under_its_key(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    record = make_unknown(make_client, sandbox, "order-g", "fail_before", provider="generic")

    result = run_cli(
        ["reconcile", "--all", "--provider", "generic", "--json"], env=env, secrets=SECRETS
    )

    assert result.exit_code == 0, result.output
    ((item),) = _json(result)
    assert (item["key"], item["outcome"], item["after"]) == (record.key, "resent", "succeeded")
    after = _state(journal_path, record.key)
    assert (after.state, after.lease_owner) == (payonce.IntentState.SUCCEEDED, None)
    assert sandbox.store.executions() == {record.key: 1}


def test_a_resend_to_another_origin_than_the_journaled_one_is_said_naming_both(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    record = make_unknown(make_client, sandbox, "order-moved", "fail_before", provider="generic")
    journaled = httpx.URL(record.url)
    assert journaled.host == "127.0.0.1"
    # The same sandbox under another host name: a failover, or a base URL changed since.
    moved = f"http://localhost:{journaled.port}"

    # A process of its own: the CLI's warnings reach its stderr as an operator sees them.
    result = run_cli_process(
        ["reconcile", record.key, "--provider", "generic", "--base-url", moved],
        env=env,
        secrets=SECRETS,
    )

    assert result.exit_code == 0, result.output
    said = f"was journaled for http://127.0.0.1:{journaled.port} and is sent to {moved}"
    assert said in result.stderr
    assert result.stderr.count(said) == 1, "once an intent, not once an attempt"
    assert _state(journal_path, record.key).state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {record.key: 1}


def test_a_resend_to_the_journaled_origin_says_nothing_of_it(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    record = make_unknown(make_client, sandbox, "order-kept", "fail_before", provider="generic")

    result = run_cli_process(
        ["reconcile", record.key, "--provider", "generic"], env=env, secrets=SECRETS
    )

    assert result.exit_code == 0, result.output
    assert "was journaled for" not in result.stderr


def test_past_its_key_window_a_provider_without_a_status_lookup_leaves_it_to_a_person(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    record = make_unknown(make_client, sandbox, "order-g2", "drop_after", provider="generic")
    lifetime = get_profile("generic").key_lifetime
    sandbox.advance_clock(lifetime)  # the provider's clock: the key may be gone there

    result = run_cli(
        ["reconcile", "--all", "--provider", "generic", "--json"], env=env, secrets=SECRETS
    )

    assert result.exit_code == 1, result.output
    ((item),) = _json(result)
    assert (item["outcome"], item["after"]) == ("still_unknown", "unknown")
    assert "no longer safe" in item["detail"]
    assert "abandon it" in item["detail"]
    after = _state(journal_path, record.key)
    assert (after.state, after.lease_owner) == (payonce.IntentState.UNKNOWN, None)
    assert sandbox.store.executions() == {record.key: 1}


def test_bad_base_url_and_missing_journal_are_configuration_errors(
    env: dict[str, str], tmp_path: Path
) -> None:
    bad = run_cli(["resume", "--base-url", "sk_live_not_a_url"], env=env, secrets=SECRETS)
    assert bad.exit_code == 2
    assert bad.stderr == "error: --base-url must be an http(s) URL (or PROVIDER=URL)\n"

    with_credentials = run_cli(
        ["resume", "--base-url", "https://user:hunter2@api.example"], env=env, secrets=SECRETS
    )
    assert with_credentials.exit_code == 2
    assert "hunter2" not in with_credentials.stderr

    nowhere = tmp_path / "nowhere.db"
    missing = run_cli(["reconcile", "--all", "--journal", str(nowhere)], env=env, secrets=SECRETS)
    assert missing.exit_code == 2
    assert missing.stderr == f"error: no journal at {nowhere}\n"
    assert not nowhere.exists()

    no_url = run_cli(
        ["resume"],
        env=({k: v for k, v in env.items() if k != "PAYONCE_BASE_URL"} or {}),
        secrets=SECRETS,
    )
    assert no_url.exit_code == 2
    assert "--base-url" in no_url.stderr


# -- no API key: a clear error, and nothing touched --------------------------------------------


@pytest.fixture
def no_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A host with no usable keyring backend; the previous backend comes back after."""
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND", raising=False)
    keyring.backend.get_all_keyring()
    previous = keyring.get_keyring()
    keyring.set_keyring(keyring.backends.fail.Keyring())
    yield
    keyring.set_keyring(previous)


def _files(journal_path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(journal_path.parent.glob("journal.db*"))}


@pytest.mark.usefixtures("no_keyring")
@pytest.mark.parametrize("command", [["resume"], ["reconcile", "--all"], ["reconcile", "o-u"]])
def test_without_an_api_key_nothing_is_sent_and_the_journal_is_left_alone(
    make_client: MakeClient,
    sandbox: SandboxServer,
    env: dict[str, str],
    journal_path: Path,
    command: list[str],
) -> None:
    unknown = make_unknown(make_client, sandbox, "o-u", "fail_before")
    pending = leave_pending(make_client, "o-p")
    executed = sandbox.store.executions()
    before = _files(journal_path)
    assert journal_path.name + "-wal" in before

    result = run_cli(
        command,
        env=({k: v for k, v in env.items() if k != "PAYONCE_API_KEY"} or {}),
        secrets=SECRETS,
    )

    assert result.exit_code == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: no API key for account 'acct_demo'")
    assert "PAYONCE_API_KEY" in line
    assert "payonce keys set acct_demo" in line
    assert _files(journal_path) == before
    assert sandbox.store.executions() == executed
    assert _state(journal_path, unknown.key).state is payonce.IntentState.UNKNOWN
    assert _state(journal_path, pending.key).state is payonce.IntentState.PENDING


# -- abandon ----------------------------------------------------------------------------------


def test_abandon_closes_an_unknown_intent_for_good(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    record = make_unknown(make_client, sandbox, "order-8", "fail_before")
    where = ["--journal", str(journal_path)]  # the journal only: no API key needed

    result = run_cli(
        ["abandon", record.key, "--reason", "refunded by hand, ticket OPS-12", *where],
        secrets=SECRETS,
    )

    assert result.exit_code == 0, result.output
    assert f"abandoned intent {record.key} (reference order-8)" in result.stdout
    after = _state(journal_path, record.key)
    assert after.state is payonce.IntentState.ABANDONED
    assert after.abandon_reason == "refunded by hand, ticket OPS-12"
    # Never sent again, by anything.
    assert _json(run_cli(["resume", "--json"], env=env, secrets=SECRETS)) == []
    assert _json(run_cli(["reconcile", "--all", "--json"], env=env, secrets=SECRETS)) == []
    assert sandbox.store.total_executions() == 0


def test_abandoning_a_pending_intent_works_and_a_settled_one_is_refused(
    make_client: MakeClient, journal_path: Path
) -> None:
    pending = leave_pending(make_client, "order-9")
    paid = _pay(make_client(), "order-10")
    where = ["--journal", str(journal_path)]

    assert (
        run_cli(
            ["abandon", pending.key, "--reason", "duplicate order", *where], secrets=SECRETS
        ).exit_code
        == 0
    )

    refused = run_cli(["abandon", paid, "--reason", "oops", *where], secrets=SECRETS)
    assert refused.exit_code == 1
    (line,) = refused.stderr.splitlines()
    assert line.startswith("error: ")
    assert "already succeeded" in line
    assert "only pending or unknown" in line
    assert refused.stdout == ""
    assert _state(journal_path, paid).state is payonce.IntentState.SUCCEEDED

    again = run_cli(["abandon", pending.key, "--reason", "twice", *where], secrets=SECRETS)
    assert again.exit_code == 1
    assert "already abandoned" in again.stderr


def test_an_intent_being_sent_cannot_be_abandoned(
    make_client: MakeClient, journal_path: Path
) -> None:
    record = leave_pending(make_client, "order-12")
    worker = payonce.open_journal(journal_path)
    worker_store = store_of(worker)
    worker_store.claim_key(record.key, owner="other-host:7:w", now=time.time(), lease_seconds=60)
    worker.close()

    result = run_cli(
        ["abandon", record.key, "--reason", "x", "--journal", str(journal_path)], secrets=SECRETS
    )

    assert result.exit_code == 1
    assert "is being sent by other-host:7:w right now" in result.stderr
    assert _state(journal_path, record.key).state is payonce.IntentState.PENDING


def test_abandon_needs_a_reason_and_an_existing_key(
    make_client: MakeClient, journal_path: Path
) -> None:
    record = leave_pending(make_client, "order-11")
    where = ["--journal", str(journal_path)]

    no_reason = run_cli(["abandon", record.key, *where], secrets=SECRETS)
    assert no_reason.exit_code == 2
    assert "--reason" in no_reason.stderr
    blank = run_cli(["abandon", record.key, "--reason", "  ", *where], secrets=SECRETS)
    assert blank.exit_code == 2

    missing = run_cli(["abandon", "01NOSUCHKEY", "--reason", "x", *where], secrets=SECRETS)
    assert missing.exit_code == 1
    assert missing.stderr == "error: no intent with key or reference '01NOSUCHKEY'\n"
    assert _state(journal_path, record.key).state is payonce.IntentState.PENDING


def test_abandon_and_ack_take_a_reference_that_names_one_intent(
    make_client: MakeClient, journal_path: Path
) -> None:
    pending = leave_pending(make_client, "order-13")
    paid = _pay(make_client(), "order-14", acknowledge=False)
    where = ["--journal", str(journal_path)]

    abandoned = run_cli(
        ["abandon", "order-13", "--reason", "checked by hand", *where], secrets=SECRETS
    )
    acked = run_cli(["ack", "order-14", *where], secrets=SECRETS)

    assert abandoned.exit_code == 0, abandoned.output
    assert f"abandoned intent {pending.key} (reference order-13)" in abandoned.stdout
    assert _state(journal_path, pending.key).state is payonce.IntentState.ABANDONED
    assert acked.exit_code == 0, acked.output
    assert acked.stdout == f"acknowledged: intent {paid} (reference order-14), succeeded\n"


def test_a_reference_naming_several_intents_is_refused_with_their_keys(
    make_client: MakeClient, journal_path: Path
) -> None:
    pending = leave_pending(make_client, "order-15")
    other = _pay(make_client(account="acct_other"), "order-15", acknowledge=False)
    where = ["--journal", str(journal_path)]

    abandoned = run_cli(["abandon", "order-15", "--reason", "x", *where], secrets=SECRETS)
    acked = run_cli(["ack", "order-15", *where], secrets=SECRETS)

    for refused in (abandoned, acked):
        assert refused.exit_code == 2, refused.output
        assert "names 2 intents" in refused.stderr
        assert pending.key in refused.stderr
        assert other in refused.stderr
    assert _state(journal_path, pending.key).state is payonce.IntentState.PENDING
    assert _state(journal_path, other).acknowledged_at is None


def test_abandon_help_names_the_states_it_accepts() -> None:
    text = " ".join(run_cli(["abandon", "--help"], secrets=SECRETS).stdout.split())
    assert "Only pending and unknown intents can be abandoned" in text
    assert "succeeded, failed and abandoned ones are final" in text


# -- ack --------------------------------------------------------------------------------------


def test_ack_lists_and_acknowledges_settled_outcomes(
    make_client: MakeClient, journal_path: Path
) -> None:
    client = make_client()
    # Acknowledged on leaving the block; the next intent's write-ahead writes that down.
    _pay(client, "order-22")
    first = _pay(client, "order-20", acknowledge=False)
    second = _pay(client, "order-21", acknowledge=False)
    where = ["--journal", str(journal_path)]

    listed = run_cli(["ack", "--list", "--json", *where], secrets=SECRETS)
    assert listed.exit_code == 0
    assert [(i["key"], i["state"]) for i in _json(listed)] == [
        (first, "succeeded"),
        (second, "succeeded"),
    ]
    table = run_cli(["ack", "--list", *where], secrets=SECRETS)
    header, *lines = table.stdout.splitlines()  # piped: a header, then a record a line
    assert header.startswith("key\treference\tstate\t")
    assert [line.split("\t")[:3] for line in lines] == [
        [first, "order-20", "succeeded"],
        [second, "order-21", "succeeded"],
    ]

    acked = run_cli(["ack", first, *where], secrets=SECRETS)
    assert acked.exit_code == 0, acked.output
    assert acked.stdout == f"acknowledged: intent {first} (reference order-20), succeeded\n"
    assert [r.key for r in client.unacknowledged()] == [second]
    assert run_cli(["ack", first, *where], secrets=SECRETS).stdout.startswith(
        "already acknowledged: "
    )

    assert (
        _json(
            run_cli(["ack", "--list", "--json", "--account", "acct_other", *where], secrets=SECRETS)
        )
        == []
    )
    assert run_cli(["ack", second, *where], secrets=SECRETS).exit_code == 0
    nothing = run_cli(["ack", "--list", *where], secrets=SECRETS)
    assert (nothing.stdout, nothing.stderr) == ("", "no unacknowledged intents\n")


def test_ack_refuses_what_is_not_settled_and_goes_on_with_the_rest(
    make_client: MakeClient, journal_path: Path
) -> None:
    pending = leave_pending(make_client, "order-30")
    paid = _pay(make_client(), "order-31", acknowledge=False)

    result = run_cli(
        ["ack", pending.key, "nope", paid, "--journal", str(journal_path)], secrets=SECRETS
    )

    assert result.exit_code == 1
    errors = result.stderr.splitlines()
    assert len(errors) == 2
    assert errors[0].startswith(f"error: intent {pending.key} is pending")
    assert errors[1] == "error: no intent with key or reference 'nope'"
    assert f"acknowledged: intent {paid}" in result.stdout
    assert _state(journal_path, paid).acknowledged_at is not None
    assert _state(journal_path, pending.key).acknowledged_at is None


def test_ack_usage(journal_path: Path, make_client: MakeClient) -> None:
    key = _pay(make_client(), "order-40", acknowledge=False)
    where = ["--journal", str(journal_path)]
    for args in (["ack"], ["ack", key, "--list"], ["ack", key, "--json"]):
        result = run_cli([*args, *where], secrets=SECRETS)
        assert result.exit_code == 2, args
        assert "Traceback" not in result.output
    text = " ".join(run_cli(["ack", "--help"], secrets=SECRETS).stdout.split())
    assert "Only succeeded and failed intents can be acknowledged" in text


# -- journal check ----------------------------------------------------------------------------


def test_journal_check_on_a_good_journal(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    _pay(make_client(), "order-50", acknowledge=False)
    with make_client() as worker:  # it ends, and its acknowledgement is written down
        _pay(worker, "order-51")
    make_unknown(make_client, sandbox, "order-52", "fail_before")
    leave_pending(make_client, "order-53")
    where = ["--journal", str(journal_path)]

    report = run_cli(["journal", "check", "--json", *where], secrets=SECRETS)

    assert report.exit_code == 0, report.output
    document = _json(report)
    assert document["ok"] is True
    assert document["problems"] == []
    assert document["location"] == str(journal_path)
    assert document["schema_version"] >= 1
    assert document["intents_by_state"] == {
        "pending": 1,
        "succeeded": 2,
        "failed": 0,
        "unknown": 1,
        "abandoned": 0,
    }
    assert document["intents"] == 4
    assert document["unacknowledged"] == 1
    assert document["size_bytes"] > 0

    piped = run_cli(["journal", "check", *where], secrets=SECRETS)
    assert piped.exit_code == 0
    lines = piped.stdout.splitlines()
    assert lines[1:4] == [
        "integrity\tok",
        f"schema_version\t{SCHEMA_VERSION}",
        "intents\t4 (1 pending, 2 succeeded, 1 unknown)",
    ]
    assert all(line.count("\t") == 1 and line == line.strip() for line in lines), lines


def _settled_copy(journal_path: Path, make_client: MakeClient, tmp_path: Path) -> Path:
    """A closed copy of a journal with a few intents (no -wal file beside it)."""
    for n in range(3):
        _pay(make_client(), f"order-{n}")
    copy = tmp_path / "copy.db"
    source = sqlite3.connect(journal_path)
    target = sqlite3.connect(copy)
    source.backup(target)
    source.close()
    target.execute("PRAGMA journal_mode = DELETE")
    target.close()
    return copy


def _flip_in_index(path: Path, index: str, needle: bytes) -> None:
    """Damage one byte of an index entry: the table and the index disagree."""
    with sqlite3.connect(path) as probe:
        (page_size,) = probe.execute("PRAGMA page_size").fetchone()
        (root,) = probe.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)
        ).fetchone()
    probe.close()
    data = bytearray(path.read_bytes())
    start = (root - 1) * page_size
    offset = data.index(needle, start, start + page_size)
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_journal_check_finds_a_damaged_index(
    make_client: MakeClient, journal_path: Path, tmp_path: Path
) -> None:
    damaged = _settled_copy(journal_path, make_client, tmp_path)
    _flip_in_index(damaged, "intents_identity_reference", b"order-1")

    result = run_cli(["journal", "check", "--journal", str(damaged)], secrets=SECRETS)

    assert result.exit_code == 1, result.output
    assert "problem(s) found" in result.stdout
    assert "intents_identity_reference" in result.stdout
    document = _json(
        run_cli(["journal", "check", "--json", "--journal", str(damaged)], secrets=SECRETS)
    )
    assert document["ok"] is False
    assert any("intents_identity_reference" in problem for problem in document["problems"])
    # The rows still read: what the file holds is reported, not "schema 0, no intents".
    assert document["contents_read"] is True
    assert (document["schema_version"], document["intents"]) == (SCHEMA_VERSION, 3)
    assert "3 (3 succeeded), as read from a damaged file" in result.stdout


def test_journal_check_piped_is_one_line_per_field_and_per_finding(
    make_client: MakeClient, journal_path: Path, tmp_path: Path
) -> None:
    damaged = _settled_copy(journal_path, make_client, tmp_path)
    _flip_in_index(damaged, "intents_identity_reference", b"order-1")

    piped = run_cli(["journal", "check", "--journal", str(damaged)], secrets=SECRETS)

    assert piped.exit_code == 1
    lines = piped.stdout.splitlines()
    names = [line.split("\t")[0] for line in lines]
    fields = [
        "journal",
        "integrity",
        "schema_version",
        "intents",
        "unacknowledged",
        "size",
        "damaged_rows",
    ]
    assert names[:7] == fields
    assert lines[6] == "damaged_rows\tnone"
    findings = [line.split("\t", 1)[1] for line in lines[7:]]
    assert set(names[7:]) == {"problem"}
    assert any("intents_identity_reference" in finding for finding in findings)
    assert all(line == line.strip() and line.count("\t") == 1 for line in lines), lines


def test_journal_check_finds_rows_that_point_nowhere(
    make_client: MakeClient, journal_path: Path, tmp_path: Path
) -> None:
    damaged = _settled_copy(journal_path, make_client, tmp_path)
    with sqlite3.connect(damaged) as raw:  # a hand edit with foreign keys off
        raw.execute("INSERT INTO attempts (key, number, started_at) VALUES ('ghost', 1, 0)")
    raw.close()

    result = run_cli(["journal", "check", "--json", "--journal", str(damaged)], secrets=SECRETS)

    assert result.exit_code == 1
    report = _json(result)
    (problem,) = report["problems"]
    assert problem.startswith("foreign key violation in attempts")
    assert "the row of intents it belongs to is gone" in problem
    # The file reads: what it holds is still reported, not "schema 0, no intents".
    assert (report["schema_version"], report["intents"]) == (SCHEMA_VERSION, 3)


def test_journal_check_on_a_file_too_damaged_to_open_exits_1_with_its_findings(
    make_client: MakeClient, journal_path: Path, tmp_path: Path
) -> None:
    damaged = _settled_copy(journal_path, make_client, tmp_path)
    data = bytearray(damaged.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    data[page_size:] = b"\x07" * (len(data) - page_size)  # every page but the schema's
    damaged.write_bytes(bytes(data))

    as_json = run_cli(["journal", "check", "--json", "--journal", str(damaged)], secrets=SECRETS)
    as_text = run_cli(["journal", "check", "--journal", str(damaged)], secrets=SECRETS)

    assert as_json.exit_code == 1, as_json.output
    report = _json(as_json)
    assert (report["ok"], report["location"]) == (False, str(damaged))
    (problem,) = report["problems"]
    assert "restore it from a backup" in problem
    assert as_text.exit_code == 1
    assert as_text.stderr.startswith("error: the journal is damaged")
    assert damaged.read_bytes() == bytes(data), "checked, never repaired or rewritten"


def test_journal_check_on_a_file_that_cannot_be_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    content = b"SQLite format 3\x00" + bytes(range(256)) * 16
    path.write_bytes(content)

    result = run_cli(["journal", "check", "--journal", str(path)], secrets=SECRETS)

    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: the journal is damaged")
    assert (
        _json(run_cli(["journal", "check", "--json", "--journal", str(path)], secrets=SECRETS))[
            "ok"
        ]
        is False
    )
    assert path.read_bytes() == content


# -- journal backup ---------------------------------------------------------------------------


def test_backup_holds_rows_still_only_in_the_wal_and_never_overwrites(
    make_client: MakeClient, journal_path: Path, tmp_path: Path
) -> None:
    client = make_client()  # stays open: its committed rows are not checkpointed yet
    keys = [_pay(client, f"order-{n}") for n in range(3)]
    wal = journal_path.with_name(journal_path.name + "-wal")
    assert wal.stat().st_size > 0
    naive = tmp_path / "naive-copy.db"  # what copying the .db file alone would keep
    shutil.copyfile(journal_path, naive)
    with sqlite3.connect(naive) as raw:
        tables = raw.execute("SELECT name FROM sqlite_master WHERE name = 'intents'").fetchall()
        assert tables == [] or raw.execute("SELECT count(*) FROM intents").fetchone() == (0,)
    raw.close()
    destination = tmp_path / "backups" / "journal-1.db"
    destination.parent.mkdir()

    result = run_cli(
        ["journal", "backup", str(destination), "--journal", str(journal_path)], secrets=SECRETS
    )

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"backed up {journal_path} to {destination} (")
    copy = payonce.open_journal(destination)
    try:
        assert [r.key for r in copy.find("order-1")] == [keys[1]]
        assert {r.key for r in copy.list_intents()} == set(keys)
    finally:
        copy.close()
    content = destination.read_bytes()

    again = run_cli(
        ["journal", "backup", str(destination), "--journal", str(journal_path)], secrets=SECRETS
    )
    assert again.exit_code == 2
    assert "will not overwrite" in again.stderr
    assert destination.read_bytes() == content


def test_backup_into_a_missing_directory_or_of_a_missing_journal(
    make_client: MakeClient, journal_path: Path, tmp_path: Path
) -> None:
    _pay(make_client(), "order-1")
    where = ["--journal", str(journal_path)]

    no_dir = run_cli(
        ["journal", "backup", str(tmp_path / "no" / "such.db"), *where], secrets=SECRETS
    )
    assert no_dir.exit_code == 2
    assert "does not exist" in no_dir.stderr

    no_journal = run_cli(
        ["journal", "backup", str(tmp_path / "b.db"), "--journal", str(tmp_path / "x.db")],
        secrets=SECRETS,
    )
    assert no_journal.exit_code == 2
    assert not (tmp_path / "x.db").exists()
    assert not (tmp_path / "b.db").exists()


def test_a_postgresql_journal_is_backed_up_with_pg_dump(tmp_path: Path) -> None:
    url = "postgresql://payonce@db.invalid/payonce"
    result = run_cli(
        ["journal", "backup", str(tmp_path / "b.db"), "--journal", url], secrets=SECRETS
    )
    assert result.exit_code == 2
    assert "pg_dump" in result.stderr
    assert not (tmp_path / "b.db").exists()


def test_resume_with_a_refused_api_key_exits_1_and_leaves_the_intents_pending(
    make_client: MakeClient, env: dict[str, str], journal_path: Path
) -> None:
    left = [leave_pending(make_client, f"order-k{n}") for n in range(2)]

    result = run_cli(
        ["resume", "--json"],
        env={**env, "PAYONCE_API_KEY": "sk_test_revoked_0000"},
        secrets=SECRETS,
    )

    assert result.exit_code == 1, result.output
    assert [(i["key"], i["state"]) for i in _json(result)] == [
        (record.key, "pending") for record in left
    ]
    assert "2 still pending" in result.stderr
    assert all(_state(journal_path, r.key).state is payonce.IntentState.PENDING for r in left)


# -- what a look-up that cannot see a request is called (issue 29) ----------------------------


@pytest.fixture
def stripe_sandbox() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig.like("stripe")) as server:
        yield server


def test_reconcile_of_a_stripe_confirm_its_search_cannot_see_says_cannot_tell(
    stripe_sandbox: SandboxServer, journal_path: Path
) -> None:
    # A confirm carries no metadata tag, so Stripe's search never finds it: its empty answer
    # says nothing about whether the card was charged, and must not be labelled not_found.
    client = payonce.Client(
        base_url=stripe_sandbox.url,
        provider="stripe",
        account=ACCOUNT,
        api_key=DEFAULT_API_KEY,
        journal=journal_path,
        retry=payonce.RetryPolicy(max_attempts=1, initial_wait=0),
    )
    with client, client.intent("order-confirm"):
        created = client.post("/v1/payment_intents", data={"amount": 4200, "currency": "eur"})
        stripe_sandbox.script(["fail_after"])  # the confirm executes, then a 503: unknown
        with pytest.raises(payonce.OutcomeUnknown) as unknown:
            client.post(
                f"/v1/payment_intents/{created.json()['id']}/confirm",
                data={"payment_method": "pm_card_visa"},
            )
    confirm = unknown.value.key
    executed = stripe_sandbox.store.executions()
    env = {
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_BASE_URL": stripe_sandbox.url,
        "PAYONCE_ACCOUNT": ACCOUNT,
        "PAYONCE_JOURNAL": str(journal_path),
    }

    result = run_cli(["reconcile", "--all"], env=env, secrets=SECRETS)

    assert result.exit_code == 1, result.output  # back to pending: settled once resumed
    (line,) = [line for line in result.stdout.splitlines() if line.startswith(confirm)]
    _, _, before, after, outcome, detail = line.split("\t")
    assert (before, after, outcome) == ("unknown", "pending", "cannot_tell")
    assert "cannot see a POST /v1/payment_intents/" in detail
    (looked_up,) = _state_reconciliations(journal_path, confirm)
    assert looked_up.outcome == "cannot_tell"
    assert stripe_sandbox.store.executions() == executed, "a look-up executes nothing"

    # Back to pending, it is resent under its key: the provider replays the one confirm.
    resumed = run_cli(["resume", "--json"], env=env, secrets=SECRETS)
    assert {item["key"]: item["state"] for item in _json(resumed)} == {confirm: "succeeded"}
    assert stripe_sandbox.store.executions() == executed


def _state_reconciliations(
    journal_path: Path, key: str
) -> list[payonce.journal.ReconciliationRecord]:
    with payonce.open_journal(journal_path, read_only=True) as journal:
        return list(journal.reconciliations(key))


# -- settled, but never heard by the code that made it (issue 29) ----------------------------


@pytest.mark.slow  # four processes: resume twice, ack --list twice
def test_resume_says_once_what_settled_unheard_and_running_the_code_again_hears_it(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    left = [leave_pending(make_client, f"order-{n}") for n in range(2)]

    result = run_cli_process(["resume"], env=env, secrets=SECRETS)

    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[-1] == (
        "note: 2 settled intents are unacknowledged: the code that made them never heard the "
        "outcome. Run it again for the same reference (the outcome replays), or record it and "
        "`payonce ack KEY` (`ack --list`)"
    )
    assert result.stderr.count("unacknowledged") == 1
    listed = run_cli_process(["ack", "--list", "--json"], env=env, secrets=SECRETS)
    assert {item["key"] for item in json.loads(listed.stdout)} == {r.key for r in left}

    # As the note says: the same code, run again for the same reference, hears the outcome.
    client = make_client()
    for record in left:
        assert record.reference is not None
        answer = client.post("/v1/payments", json=PAYMENT, reference=record.reference)
        assert answer.status_code == 201
    assert sandbox.store.executions() == {r.key: 1 for r in left}  # replayed, not paid again
    # The code's process ends: a block's acknowledgement may wait in memory for the
    # journal's next write, and is written at the latest as its client closes.
    client.close()
    heard = run_cli_process(["ack", "--list", "--json"], env=env, secrets=SECRETS)
    assert json.loads(heard.stdout) == []

    again = run_cli_process(["resume"], env=env, secrets=SECRETS)
    assert again.exit_code == 0, again.output
    assert "unacknowledged" not in again.stderr


@pytest.mark.slow  # three processes: reconcile, ack, ack --list
def test_reconcile_says_what_settled_unheard_and_payonce_ack_records_it(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    found = make_unknown(make_client, sandbox, "order-found", "drop_after")

    result = run_cli_process(["reconcile", "--all", "--json"], env=env, secrets=SECRETS)

    assert result.exit_code == 0, result.output
    assert [item["after"] for item in json.loads(result.stdout)] == ["succeeded"]
    summary, note = result.stderr.splitlines()
    assert summary.startswith("reconciled 1 intent(s): 1 settled")
    assert note == UNHEARD_ONE

    # Or, as it says: the outcome recorded by hand, then acknowledged.
    acked = run_cli_process(["ack", found.key], env=env, secrets=SECRETS)
    assert acked.exit_code == 0, acked.output
    listed = run_cli_process(["ack", "--list", "--json"], env=env, secrets=SECRETS)
    assert json.loads(listed.stdout) == []
    assert _state(journal_path, found.key).acknowledged_at is not None
    assert sandbox.store.executions() == {found.key: 1}


@pytest.mark.slow  # a resend retried five times with backoff
def test_a_resume_that_settles_nothing_says_nothing_of_acknowledging(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    leave_pending(make_client, "order-still")
    sandbox.script(["fail_before"] * 5)  # every resend sees a 503: it ends unknown

    result = run_cli(["resume", "--json"], env=env, secrets=SECRETS)

    assert result.exit_code == 1, result.output
    assert [item["state"] for item in _json(result)] == ["unknown"]
    assert "unacknowledged" not in result.stderr  # nothing settled: nothing to hear yet
