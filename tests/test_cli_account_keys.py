"""One API key, several accounts (red-team r17h finding 1): ``PAYONCE_API_KEY`` is one
account's key, and recovery never sends it for another account's intents.

The red-team's path, for real: a Square-like sandbox that knows two accounts by their keys,
one payment of each crashed right after its request left (a child process SIGKILLed at
``after_send``), then ``payonce resume`` / ``reconcile`` / ``worker`` run as processes with
account A's key in ``PAYONCE_API_KEY``. Before the fix, B's payment was resent with A's key,
and A (which had never seen that key) charged it again: paid on both accounts.

The rule (``payonce.credentials.recovery_api_key``): the variable serves only the account
named with ``--account`` (``PAYONCE_ACCOUNT``), never one guessed, not even a journal's only
account (red-team r17i H2: a fresh journal holding only B's intent got A's key); every other
account takes its key from the keyring, and one without is not driven, said with its name
and how to give its key.
"""

from __future__ import annotations

import collections
import contextlib
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import keyring.backends.null
import pytest

import payonce
from helpers.cli import CliResult, run_cli_process
from helpers.crash import KILLED, executions_once_arrived, worker_env
from helpers.keyrings import UseKeyring
from payonce.sandbox import SandboxConfig, SandboxServer

KEY_A, KEY_B = "sk_test_account_a", "sk_test_account_b"
ACCOUNT_A, ACCOUNT_B = "acct_a", "acct_b"
PAYMENT = {"source_id": "cnon:ok", "amount_money": {"amount": 1234, "currency": "USD"}}

_PAY = """
import sys

import payonce

url, journal, account, key, reference = sys.argv[1:]
client = payonce.Client(
    base_url=url, provider="square", account=account, api_key=key, journal=journal
)
client.post(
    "/v2/payments",
    json={"source_id": "cnon:ok", "amount_money": {"amount": 1234, "currency": "USD"}},
    reference=reference,
)
"""


@pytest.fixture
def two_accounts() -> Iterator[SandboxServer]:
    """A Square-like provider holding two merchant accounts, each known by its own key."""
    config = SandboxConfig.like(
        "square", api_keys={KEY_A: ACCOUNT_A, KEY_B: ACCOUNT_B}, processing_seconds=0.05
    )
    with SandboxServer(config) as server:
        yield server


def _crash_after_send(server: SandboxServer, journal: Path, account: str, key: str) -> None:
    """One payment of ``account``, its worker SIGKILLed right after the request left: it
    executed at the provider, and the journal holds it pending."""
    before = server.store.total_executions()
    child = subprocess.run(
        [sys.executable, "-c", _PAY, server.url, str(journal), account, key, f"order-{account}"],
        env=worker_env("after_send:1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == KILLED, child.stderr[-3000:]
    assert executions_once_arrived(server, before + 1) == before + 1


def _payments_by_account(server: SandboxServer) -> dict[str, int]:
    return dict(collections.Counter(p["account"] for p in server.store.payments()))


def _states(journal: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(journal)) as conn:
        return dict(conn.execute("SELECT account, state FROM intents").fetchall())


def _recover(
    command: str, server: SandboxServer, journal: Path, *more: str, **env: str
) -> CliResult:
    args = [command, *more, "--journal", str(journal), "--base-url", server.url]
    return run_cli_process(args, env=env, secrets=[KEY_A, KEY_B])


@pytest.fixture
def crashed_on_both(two_accounts: SandboxServer, journal_path: Path) -> Path:
    _crash_after_send(two_accounts, journal_path, ACCOUNT_A, KEY_A)
    _crash_after_send(two_accounts, journal_path, ACCOUNT_B, KEY_B)
    assert _payments_by_account(two_accounts) == {ACCOUNT_A: 1, ACCOUNT_B: 1}
    return journal_path


def test_resume_never_sends_one_account_s_environment_key_for_another_s_intents(
    two_accounts: SandboxServer, crashed_on_both: Path
) -> None:
    result = _recover("resume", two_accounts, crashed_on_both, PAYONCE_API_KEY=KEY_A)

    assert result.exit_code == 1, result.output
    for account in (ACCOUNT_A, ACCOUNT_B):
        assert f"not driven: account {account!r} (provider 'square'): no API key for " in (
            result.stderr
        )
        assert f"`payonce keys set {account}`" in result.stderr
        assert f"set PAYONCE_ACCOUNT={account} (or --account {account})" in result.stderr
    assert "no account was named (PAYONCE_ACCOUNT or --account)" in result.stderr
    assert "nothing resumed of account 'acct_a'" in result.stderr  # not "nothing to resume"
    # Nothing sent: each account paid once, and the journal holds what it held.
    assert _payments_by_account(two_accounts) == {ACCOUNT_A: 1, ACCOUNT_B: 1}
    assert _states(crashed_on_both) == {ACCOUNT_A: "pending", ACCOUNT_B: "pending"}


def test_resume_of_the_account_named_uses_the_environment_key_for_it_alone(
    two_accounts: SandboxServer, crashed_on_both: Path
) -> None:
    result = _recover(
        "resume", two_accounts, crashed_on_both, "--account", ACCOUNT_B, PAYONCE_API_KEY=KEY_B
    )

    assert result.exit_code == 0, result.output
    assert _payments_by_account(two_accounts) == {ACCOUNT_A: 1, ACCOUNT_B: 1}  # a replay
    assert _states(crashed_on_both) == {ACCOUNT_A: "pending", ACCOUNT_B: "succeeded"}


@pytest.mark.slow  # five processes: two payments killed, two `keys set`, the resume
def test_each_account_s_key_in_the_keyring_recovers_both_while_the_environment_key_serves_none(
    two_accounts: SandboxServer, crashed_on_both: Path
) -> None:
    plaintext = {
        "PYTHON_KEYRING_BACKEND": "keyrings.alt.file.PlaintextKeyring",
        "PAYONCE_ALLOW_PLAINTEXT_KEYRING": "1",
    }
    for account, key in ((ACCOUNT_A, KEY_A), (ACCOUNT_B, KEY_B)):
        stored = run_cli_process(["keys", "set", account], input=key + "\n", env=plaintext)
        assert stored.exit_code == 0, stored.output

    # A's key in the environment too: with two accounts in the journal it is nobody's.
    result = _recover("resume", two_accounts, crashed_on_both, PAYONCE_API_KEY=KEY_A, **plaintext)

    assert result.exit_code == 0, result.output
    assert _payments_by_account(two_accounts) == {ACCOUNT_A: 1, ACCOUNT_B: 1}
    assert _states(crashed_on_both) == {ACCOUNT_A: "succeeded", ACCOUNT_B: "succeeded"}


@pytest.mark.slow
def test_reconcile_never_resends_an_unknown_intent_with_another_account_s_key(
    two_accounts: SandboxServer, journal_path: Path
) -> None:
    for account, key in ((ACCOUNT_A, KEY_A), (ACCOUNT_B, KEY_B)):
        client = payonce.Client(
            base_url=two_accounts.url,
            provider="square",
            account=account,
            api_key=key,
            journal=journal_path,
            retry=payonce.RetryPolicy(max_attempts=1, initial_wait=0),
        )
        two_accounts.script(["fail_after"])  # executed, then a 503: unknown
        with client, pytest.raises(payonce.OutcomeUnknown):
            client.post("/v2/payments", json=PAYMENT, reference=f"order-{account}")
    assert _payments_by_account(two_accounts) == {ACCOUNT_A: 1, ACCOUNT_B: 1}

    result = _recover("reconcile", two_accounts, journal_path, "--all", PAYONCE_API_KEY=KEY_A)

    assert result.exit_code == 1, result.output
    assert f"not driven: account {ACCOUNT_B!r} (provider 'square'): no API key" in result.stderr
    assert _payments_by_account(two_accounts) == {ACCOUNT_A: 1, ACCOUNT_B: 1}
    assert _states(journal_path) == {ACCOUNT_A: "unknown", ACCOUNT_B: "unknown"}


@pytest.mark.slow  # four processes: two payments killed, a resume, the worker
def test_the_worker_does_not_pin_the_environment_key_to_the_one_account_with_work(
    two_accounts: SandboxServer, crashed_on_both: Path
) -> None:
    # Account A's intent is done (its own key); only B's waits. The journal still holds
    # intents of both: A's key is not known to be B's.
    settled = _recover(
        "resume", two_accounts, crashed_on_both, "--account", ACCOUNT_A, PAYONCE_API_KEY=KEY_A
    )
    assert settled.exit_code == 0, settled.output

    result = _recover("worker", two_accounts, crashed_on_both, "--once", PAYONCE_API_KEY=KEY_A)

    assert result.exit_code == 2, result.output
    assert f"account {ACCOUNT_B!r} of provider 'square' not driven: no API key" in result.stderr
    assert "no account could be driven" in result.stderr
    assert _payments_by_account(two_accounts) == {ACCOUNT_A: 1, ACCOUNT_B: 1}
    assert _states(crashed_on_both) == {ACCOUNT_A: "succeeded", ACCOUNT_B: "pending"}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["resume", "worker"])
def test_a_journal_s_only_account_never_gets_the_environment_key_of_an_account_not_named(
    two_accounts: SandboxServer, journal_path: Path, command: str
) -> None:
    # The red-team's path (r17i H2): a fresh journal holding only B's payment, executed on
    # B, then a recovery run with A's key in the environment and no account named.
    _crash_after_send(two_accounts, journal_path, ACCOUNT_B, KEY_B)
    assert _payments_by_account(two_accounts) == {ACCOUNT_B: 1}
    more = ["--once"] if command == "worker" else []

    result = _recover(command, two_accounts, journal_path, *more, PAYONCE_API_KEY=KEY_A)

    assert result.exit_code == 2, result.output  # the one account could not be driven
    assert f"account {ACCOUNT_B!r}" in result.stderr
    assert "no API key" in result.stderr
    assert f"PAYONCE_ACCOUNT={ACCOUNT_B} (or --account {ACCOUNT_B})" in result.stderr
    assert f"`payonce keys set {ACCOUNT_B}`" in result.stderr
    # Nothing sent: B paid once, A never, and the journal holds what it held.
    assert _payments_by_account(two_accounts) == {ACCOUNT_B: 1}
    assert _states(journal_path) == {ACCOUNT_B: "pending"}


@pytest.mark.slow
def test_the_account_named_in_payonce_account_takes_the_environment_key(
    two_accounts: SandboxServer, journal_path: Path
) -> None:
    _crash_after_send(two_accounts, journal_path, ACCOUNT_B, KEY_B)

    result = _recover(
        "resume", two_accounts, journal_path, PAYONCE_API_KEY=KEY_B, PAYONCE_ACCOUNT=ACCOUNT_B
    )

    assert result.exit_code == 0, result.output
    assert _payments_by_account(two_accounts) == {ACCOUNT_B: 1}  # a replay
    assert _states(journal_path) == {ACCOUNT_B: "succeeded"}


def test_the_environment_key_serves_the_named_account_only(
    monkeypatch: pytest.MonkeyPatch, use_keyring: UseKeyring
) -> None:
    use_keyring(keyring.backends.null.Keyring())  # no account has a key stored
    monkeypatch.setenv("PAYONCE_API_KEY", KEY_A)
    recovery_key = payonce.credentials.recovery_api_key
    assert recovery_key(ACCOUNT_A, named=ACCOUNT_A) == KEY_A
    for named in (None, ACCOUNT_B):
        with pytest.raises(payonce.ConfigurationError, match="never sent for it"):
            recovery_key(ACCOUNT_A, named=named)


# -- the account nobody chose (issue 29): each message's fix, followed as written, works -------

_PAY_WITHOUT_ACCOUNT = """
import sys

import httpx
import payonce

url, journal = sys.argv[1:]
# A transport under code that brings its own key, and no account= (as the integration
# snippets once read): the intent is journaled under the account 'default'.
client = payonce.Client(base_url=url, provider="stripe", journal=journal, transport_only=True)
http = httpx.Client(
    base_url=url, headers={"Authorization": "Bearer sk_test_payonce"}, transport=client.transport()
)
with client.intent("order-1"):
    http.post("/v1/payment_intents", data={"amount": 4200, "currency": "eur"})
"""
STRIPE_KEY = "sk_test_payonce"


@pytest.fixture
def stripe_like() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig.like("stripe")) as server:
        yield server


@pytest.fixture
def crashed_without_account(stripe_like: SandboxServer, journal_path: Path) -> Path:
    """A payment through the transport of a client built without ``account=``, its process
    SIGKILLed right after the request left: executed at the provider, pending here."""
    child = subprocess.run(
        [sys.executable, "-c", _PAY_WITHOUT_ACCOUNT, stripe_like.url, str(journal_path)],
        env=worker_env("after_send:1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == KILLED, child.stderr[-3000:]
    assert executions_once_arrived(stripe_like, 1) == 1
    assert _states(journal_path) == {"default": "pending"}
    return journal_path


def _followed(message: str) -> tuple[list[str], dict[str, str]]:
    """The options and environment a message's fix asks for, taken as written."""
    options = [
        word for url in re.findall(r"add --base-url (\S+)", message) for word in ("--base-url", url)
    ]
    env = {}
    if named := re.search(
        r"set PAYONCE_ACCOUNT=(\S+) .*alongside PAYONCE_API_KEY holding its key", message
    ):
        env = {"PAYONCE_ACCOUNT": named[1], "PAYONCE_API_KEY": STRIPE_KEY}
    return options, env


@pytest.mark.slow  # three processes: the payment killed, resume twice
def test_resume_with_nothing_given_says_all_a_run_needs_and_its_fix_works_as_written(
    stripe_like: SandboxServer, crashed_without_account: Path
) -> None:
    journal = ["--journal", str(crashed_without_account)]

    first = run_cli_process(["resume", *journal], secrets=[STRIPE_KEY])

    assert first.exit_code == 2, first.output
    (line,) = first.stderr.splitlines()
    assert f"add --base-url {stripe_like.url.rstrip('/')}" in line
    assert "account 'default' has no API key here" in line
    options, env = _followed(line)
    assert env, line

    again = run_cli_process(["resume", *journal, *options], env=env, secrets=[STRIPE_KEY])

    assert again.exit_code == 0, again.output
    assert _states(crashed_without_account) == {"default": "succeeded"}
    assert stripe_like.store.total_executions() == 1  # the provider replayed it


@pytest.mark.slow  # three processes: the payment killed, resume twice
def test_the_first_no_api_key_error_names_the_account_and_its_fix_works_as_written(
    stripe_like: SandboxServer, crashed_without_account: Path
) -> None:
    given = ["resume", "--journal", str(crashed_without_account), "--base-url", stripe_like.url]

    first = run_cli_process(given, secrets=[STRIPE_KEY])

    assert first.exit_code == 2, first.output
    (line,) = first.stderr.splitlines()
    assert line.startswith("error: no API key for account 'default': PAYONCE_API_KEY is not set")
    assert "`payonce keys set default`" in line
    assert _states(crashed_without_account) == {"default": "pending"}  # nothing sent
    assert stripe_like.store.total_executions() == 1
    options, env = _followed(line)
    assert env, line

    again = run_cli_process([*given, *options], env=env, secrets=[STRIPE_KEY])

    assert again.exit_code == 0, again.output
    assert _states(crashed_without_account) == {"default": "succeeded"}
    assert stripe_like.store.total_executions() == 1
