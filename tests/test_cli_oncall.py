"""On-call signals: what the commands tell an engineer paged at night, tried as one would.

A real sandbox provider, a real journal file, and real worker processes: one that holds an
intent's lease while its request is on its way, then dies of a ``SIGKILL`` with the lease
still written in the journal. The commands must not call that lease alive, must keep their
table at 80 columns for it, and ``resume`` must not say "all clear" while unknown intents
it never resends wait for ``reconcile``.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.cli import CliResult, run_cli
from helpers.payments import PAYMENT, MakeClient, leave_pending, make_unknown
from helpers.processes import python_env
from helpers.proxies import pages_in_front_of
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxServer

SECRETS = (DEFAULT_API_KEY,)

# A worker that sends its payment, then hangs before reading the answer, as one stuck on a
# slow provider does; the test kills it there.
HANGING_WORKER = textwrap.dedent(
    """
    import sys, time
    import httpx, payonce

    class Hangs(httpx.HTTPTransport):
        def handle_request(self, request):
            super().handle_request(request).close()  # the provider executed it
            print("sent", flush=True)
            time.sleep(600)
            raise RuntimeError("never")

    url, journal, reference, api_key = sys.argv[1:]
    client = payonce.Client(base_url=url, provider="sandbox", account="acct_demo",
                            api_key=api_key, journal=journal, transport=Hangs())
    client.post("/v1/payments", json={"amount": 4200, "currency": "eur"}, reference=reference)
    """
)


class Worker:
    """A real process paying ``reference``, its request sent and its answer never read."""

    def __init__(self, sandbox: SandboxServer, journal: Path, reference: str) -> None:
        args = [sandbox.url, str(journal), reference, DEFAULT_API_KEY]
        self.process = subprocess.Popen(
            [sys.executable, "-c", HANGING_WORKER, *args],
            env=python_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "sent\n", "the worker never sent its payment"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def worker(sandbox: SandboxServer, journal_path: Path) -> Iterator[Worker]:
    """A live worker holding order-held's lease, its attempt in flight."""
    worker = Worker(sandbox, journal_path, "order-held")
    yield worker
    if worker.process.poll() is None:
        worker.kill()


def _unstyled(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture
def env(sandbox: SandboxServer, journal_path: Path) -> dict[str, str]:
    return {
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_PROVIDER": "sandbox",
        "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT,
        "PAYONCE_JOURNAL": str(journal_path),
    }


def _words(text: str) -> str:
    """The words as a reader reads them, whatever the lines they were wrapped on."""
    return " ".join(text.split())


def _screen(args: list[str], journal: Path) -> str:
    """What an 80-column terminal shows."""
    result = run_cli([*args, "--journal", str(journal)], columns=80, terminal=True)
    assert result.exit_code == 0, result.output
    return _unstyled(result.stdout)


def _json(args: list[str], journal: Path) -> Any:
    result = run_cli([*args, "--journal", str(journal), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- a lease whose owner died -----------------------------------------------------------------


def test_the_lease_of_a_killed_worker_is_shown_dead_in_list_and_show(
    worker: Worker, journal_path: Path
) -> None:
    (alive,) = _json(["intents", "show", "order-held"], journal_path)
    assert alive["lease_status"] == "held"
    assert (alive["attempts"][0]["in_flight"], alive["attempts"][0]["interrupted"]) == (True, False)
    assert "lease: held until 20" in _words(_screen(["intents", "list"], journal_path))
    assert "in flight" in _words(_screen(["intents", "show", "order-held"], journal_path))

    worker.kill()

    (dead,) = _json(["intents", "show", "order-held"], journal_path)
    assert (dead["lease_owner"], dead["lease_expires_at"]) == (
        alive["lease_owner"],
        alive["lease_expires_at"],
    ), "the journal still holds the lease: only its owner is gone"
    assert dead["lease_status"] == "owner_dead"
    (attempt,) = dead["attempts"]
    assert (attempt["in_flight"], attempt["interrupted"]) == (False, True)
    (listed,) = _json(["intents", "list"], journal_path)
    assert listed["lease_status"] == "owner_dead"

    listing = _screen(["intents", "list"], journal_path)
    assert "lease: owner dead" in listing
    assert "until" not in listing
    shown = _words(_screen(["intents", "show", "order-held"], journal_path))
    assert f"{alive['lease_owner']} until 20" in shown
    assert "(owner dead)" in shown
    assert "in flight" not in shown
    assert "yes (worker died)" in shown
    piped = run_cli(["intents", "list", "--journal", str(journal_path)], terminal=False)
    header, line = piped.stdout.splitlines()
    lease = dict(zip(header.split("\t"), line.split("\t"), strict=True))["lease"]
    assert lease.startswith(alive["lease_owner"])
    assert lease.endswith(" (owner dead)")


def test_a_dead_worker_s_intent_keeps_the_table_at_80_columns(
    make_client: MakeClient, worker: Worker, journal_path: Path
) -> None:
    client = make_client()
    settled = [f"order-{n}" for n in range(7)]
    for reference in settled:
        client.post("/v1/payments", json=PAYMENT, reference=reference)
    worker.kill()

    screen = _screen(["intents", "list"], journal_path)

    lines = screen.splitlines()
    assert all(len(line) <= 80 for line in lines), screen
    assert "key / reference" in screen, "a table, not each record field by field"
    records = {r["reference"]: r for r in _json(["intents", "list"], journal_path)}
    assert len(records) == 8
    for reference, record in records.items():
        (row,) = [line for line in lines if record["key"] in line]
        assert record["state"] in row, (reference, screen)
    assert screen.count("lease: owner dead") == 1
    # Two lines an intent, a third for the lease; the title, the header and the rule.
    assert len(lines) <= 2 * len(records) + 1 + 5, screen


def test_the_intent_a_stale_lease_left_is_resumed_once(
    sandbox: SandboxServer, worker: Worker, env: dict[str, str], journal_path: Path
) -> None:
    # What "owner dead" promises: resume takes the intent at once, before the lease runs out.
    worker.kill()
    journal = payonce.open_journal(journal_path, read_only=True)
    try:
        (record,) = journal.find("order-held")
    finally:
        journal.close()

    result = run_cli(["resume"], env=env, secrets=SECRETS)

    assert result.exit_code == 0, result.output
    assert record.key in result.stdout
    assert sandbox.store.executions() == {record.key: 1}


# -- resume while unknown intents wait ---------------------------------------------------------


def _summary(result: CliResult) -> str:
    return result.stderr.splitlines()[0]


WAITS = (
    "unknown intent waits for reconciliation (resume never resends an unknown intent): "
    "run `payonce reconcile --all`, then `payonce resume`"
)


def test_resume_says_how_many_unknown_intents_wait_and_what_to_run_then_exits_1(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    unknown = make_unknown(make_client, sandbox, "order-u", "fail_before")
    pending = leave_pending(make_client, "order-p")

    resumed = run_cli(["resume"], env=env, secrets=SECRETS)

    assert resumed.exit_code == 1, resumed.output
    assert _summary(resumed) == (
        "resumed 1 intent(s): 1 settled (1 succeeded), 0 still pending, 0 still unknown; "
        f"1 other {WAITS}"
    )
    again = run_cli(["resume"], env=env, secrets=SECRETS)
    assert again.exit_code == 1
    assert _summary(again) == (
        "nothing to resume: no pending intent of account 'acct_demo' (provider 'sandbox'); "
        f"1 {WAITS}"
    )

    # What it says to run settles everything: the 503 came before executing anything.
    assert run_cli(["reconcile", "--all"], env=env, secrets=SECRETS).exit_code == 1  # pending
    last = run_cli(["resume"], env=env, secrets=SECRETS)
    assert last.exit_code == 0, last.output
    assert _summary(last).endswith("0 still pending, 0 still unknown")
    assert sandbox.store.executions() == {pending.key: 1, unknown.key: 1}


def test_resume_counts_only_the_unknown_intents_of_the_account_it_drives(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str]
) -> None:
    make_unknown(make_client, sandbox, "order-u", "fail_before", account="acct_other")

    ours = run_cli(["resume"], env=env, secrets=SECRETS)
    everyone = run_cli(
        ["resume"],
        env={k: v for k, v in env.items() if k not in ("PAYONCE_ACCOUNT", "PAYONCE_PROVIDER")},
        secrets=SECRETS,
    )

    assert ours.exit_code == 0, ours.output
    assert "unknown" not in ours.stderr
    assert everyone.exit_code == 1, everyone.output
    assert _summary(everyone).endswith(f"; 1 {WAITS}")


# -- where each attempt went -------------------------------------------------------------------


def test_show_tells_the_url_each_attempt_was_sent_to_when_resume_sent_it_elsewhere(
    make_client: MakeClient, sandbox: SandboxServer, env: dict[str, str], journal_path: Path
) -> None:
    # Attempt 1 goes to the sandbox and the worker dies; the resume runs with the same
    # sandbox behind a second port (a proxy), as after a move to another endpoint.
    record = leave_pending(make_client, "order-moved")
    with pages_in_front_of(sandbox.url, []) as other:
        moved = run_cli(["resume"], env={**env, "PAYONCE_BASE_URL": other.url}, secrets=SECRETS)
        assert moved.exit_code == 0, moved.output

    (shown,) = _json(["intents", "show", "order-moved"], journal_path)
    assert shown["url"] == f"{sandbox.url}/v1/payments"
    assert [(a["number"], a["sent_to"]) for a in shown["attempts"]] == [
        (1, f"{sandbox.url}/v1/payments"),
        (2, f"{other.url}/v1/payments"),
    ]
    assert sandbox.store.executions() == {record.key: 1}
    # A terminal shows the origin each attempt went to (the path is the intent's); at 80
    # columns, attempt by attempt.
    screen = _screen(["intents", "show", "order-moved"], journal_path)
    first, second = screen.split("attempt 2\n")
    assert re.search(rf"^  sent to +{re.escape(sandbox.url)} *$", first, re.MULTILINE), screen
    assert re.search(rf"^  sent to +{re.escape(other.url)} *$", second, re.MULTILINE), screen
    # Piped: a sent_to field, last.
    piped = run_cli(["intents", "show", "order-moved", "--journal", str(journal_path)]).stdout
    assert f"\t{other.url}\n" in piped
    assert "\tmay_have_executed\tsent_to\n" in piped


def test_show_has_no_sent_to_column_when_every_attempt_went_to_the_intent_s_url(
    make_client: MakeClient, env: dict[str, str], journal_path: Path
) -> None:
    leave_pending(make_client, "order-stays")
    assert run_cli(["resume"], env=env, secrets=SECRETS).exit_code == 0

    (shown,) = _json(["intents", "show", "order-stays"], journal_path)
    assert {a["sent_to"] for a in shown["attempts"]} == {shown["url"]}
    assert len(shown["attempts"]) == 2
    assert "sent to" not in _screen(["intents", "show", "order-stays"], journal_path)


# -- reconcile's usage error comes first -------------------------------------------------------


def test_reconcile_without_key_or_all_says_so_before_asking_for_a_base_url(
    journal_path: Path,
) -> None:
    bare = run_cli(["reconcile", "--journal", str(journal_path)])

    assert bare.exit_code == 2
    assert "give either one KEY_OR_REFERENCE or --all" in bare.stderr
    assert "base-url" not in bare.stderr

    every = run_cli(["reconcile", "--all", "--journal", str(journal_path)])
    assert every.exit_code == 2
    assert "--base-url is required" in every.stderr
