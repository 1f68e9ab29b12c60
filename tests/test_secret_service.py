"""payonce's keyring path against a real Secret Service: GNOME Keyring on a private D-Bus
session bus (``helpers/secret_service.py``), besides the file backends of test_cli_keys.py and
test_credentials.py.

``payonce keys`` and the paying clients run as real processes, where keyring finds the
Secret Service by its own detection, as on a user's desktop (with keyrings.alt installed
too, that is a chain whose first link is the Secret Service). A client in this process is
given keyring's SecretService backend explicitly. What is stored is checked on the Secret
Service itself, never only through payonce. Skipped where GNOME Keyring cannot run; with
``CI=true`` failed instead.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import payonce
from helpers.ci import skip_or_fail
from helpers.cli import CliResult, run_cli, run_cli_process
from helpers.payments import PAYMENT
from helpers.processes import python_env
from helpers.secret_service import SecretService
from payonce.sandbox import SandboxServer

SECRET = "sk_test_secret_service_4eC39HqLyjWDarjt"
OTHER_SECRET = "sk_test_secret_service_rotated_51HxYz"
SECRETS = (SECRET, OTHER_SECRET)  # never printed: every command here is run with secrets=SECRETS
BACKEND = "keyring.backends.SecretService.Keyring"
OPT_IN = {"PAYONCE_ALLOW_PLAINTEXT_KEYRING": "1"}


def keys(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> CliResult:
    """``payonce keys *args`` in a process of its own, the secret piped to it when given."""
    return run_cli_process(["keys", *args], input=input, env=env, secrets=SECRETS)


@pytest.fixture
def provider(make_sandbox: Callable[..., SandboxServer]) -> SandboxServer:
    """A sandbox that says which key paid: each key is its own provider account."""
    return make_sandbox(
        api_keys={SECRET: "acct_paid_by_secret", OTHER_SECRET: "acct_paid_by_other"}
    )


PAY = """
import json, sys
import payonce

base_url, journal, account = sys.argv[1:]
try:
    with payonce.Client(
        base_url=base_url, provider="sandbox", account=account, journal=journal
    ) as client:
        response = client.post("/v1/payments", json={"amount": 4200, "currency": "eur"})
    print(json.dumps({"paid_as": response.json()["account"]}))
except payonce.ConfigurationError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def pay_in_a_process(provider: SandboxServer, journal: Path, account: str) -> dict[str, str]:
    """A payment by a client of ``account`` in a fresh process: its key from the keyring."""
    done = subprocess.run(
        [sys.executable, "-c", PAY, provider.url, str(journal), account],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for secret in SECRETS:
        assert secret not in done.stdout + done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


# -- payonce keys --------------------------------------------------------------------------------


@pytest.mark.slow
def test_keys_set_list_delete_store_in_the_secret_service(
    use_secret_service: SecretService,
) -> None:
    stored = keys("set", "acct_ss", input=SECRET + "\n")
    assert stored.exit_code == 0, stored.output
    assert stored.stdout == f"stored the API key of account 'acct_ss' in {BACKEND}\n"
    assert "plaintext" not in stored.stderr
    # On the Secret Service itself: the key under service "payonce", and payonce's index.
    assert use_secret_service.items() == {
        "acct_ss": SECRET.encode(),
        "__accounts__": b'["acct_ss"]',
    }
    # gnome-keyring keeps the login keyring encrypted on disk: the key is not in its files.
    files = [path for path in use_secret_service.data_dir.rglob("*") if path.is_file()]
    assert files, "gnome-keyring wrote no keyring file"
    assert all(SECRET.encode() not in path.read_bytes() for path in files)

    # With the plaintext file opted in, the Secret Service is still the first usable link.
    opted_in = keys("set", "acct_ss2", input=OTHER_SECRET, env=OPT_IN)
    assert opted_in.exit_code == 0, opted_in.output
    assert opted_in.stdout == f"stored the API key of account 'acct_ss2' in {BACKEND}\n"

    listed = keys("list")
    assert listed.exit_code == 0, listed.output
    assert listed.stdout == "acct_ss\nacct_ss2\n"

    deleted = keys("delete", "acct_ss")
    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout == "deleted the API key of account 'acct_ss'\n"
    assert use_secret_service.items() == {
        "acct_ss2": OTHER_SECRET.encode(),
        "__accounts__": b'["acct_ss2"]',
    }


def test_the_rest_of_keys_in_this_process(use_secret_service: SecretService) -> None:
    """What needs no process of its own, on the same Secret Service (this process's backend)."""
    assert run_cli(["keys", "set", "acct_a"], input=SECRET, secrets=SECRETS).exit_code == 0
    assert run_cli(["keys", "set", "acct_b"], input=SECRET, secrets=SECRETS).exit_code == 0
    as_json = run_cli(["keys", "list", "--json"], secrets=SECRETS)
    assert json.loads(as_json.stdout) == [{"account": "acct_a"}, {"account": "acct_b"}]

    replaced = run_cli(["keys", "set", "acct_a"], input=OTHER_SECRET, secrets=SECRETS)
    assert replaced.exit_code == 0, replaced.output
    assert use_secret_service.items()["acct_a"] == OTHER_SECRET.encode()
    assert run_cli(["keys", "list"], secrets=SECRETS).stdout == "acct_a\nacct_b\n"  # listed once

    for account in ("acct_a", "acct_b"):
        assert run_cli(["keys", "delete", account], secrets=SECRETS).exit_code == 0
    again = run_cli(["keys", "delete", "acct_a"], secrets=SECRETS)
    assert again.exit_code == 1
    assert again.stderr == "error: no API key stored in the keyring for account 'acct_a'\n"
    assert use_secret_service.items() == {}  # no index left behind either
    empty = run_cli(["keys", "list"], secrets=SECRETS)
    assert empty.stdout == "no API keys stored by payonce in the keyring\n"


# -- a client reading its key -------------------------------------------------------------------


@pytest.mark.slow
def test_a_client_pays_with_the_key_stored_in_the_secret_service(
    use_secret_service: SecretService, provider: SandboxServer, journal_path: Path
) -> None:
    assert keys("set", "acct_ring", input=SECRET).exit_code == 0

    # In a process of its own, where keyring detects the Secret Service by itself.
    assert pay_in_a_process(provider, journal_path, "acct_ring") == {
        "paid_as": "acct_paid_by_secret"
    }
    # In this process; after a rotation, with the new key.
    assert run_cli(["keys", "set", "acct_ring"], input=OTHER_SECRET, secrets=SECRETS).exit_code == 0
    with payonce.Client(
        base_url=provider.url, provider="sandbox", account="acct_ring", journal=journal_path
    ) as client:
        response = client.post("/v1/payments", json=PAYMENT)
    assert response.status_code == 201
    assert response.json()["account"] == "acct_paid_by_other"
    assert provider.store.total_executions() == 2


def test_a_missing_entry_names_the_account_and_what_to_do(
    use_secret_service: SecretService, provider: SandboxServer, journal_path: Path
) -> None:
    stored = run_cli(["keys", "set", "acct_other"], input=SECRET, secrets=SECRETS)
    assert stored.exit_code == 0  # a working keyring, not an empty one

    with pytest.raises(payonce.ConfigurationError) as caught:
        payonce.Client(
            base_url=provider.url, provider="sandbox", account="acct_missing", journal=journal_path
        )
    message = str(caught.value)
    assert message.startswith("no API key for account 'acct_missing' in the keyring. To fix: ")
    assert "`payonce keys set acct_missing`" in message
    assert "PAYONCE_API_KEY" in message
    assert "acct_other" not in message
    assert pay_in_a_process(provider, journal_path, "acct_missing") == {"error": message}

    assert not journal_path.exists(), "the key is resolved before the journal is opened"
    assert provider.store.total_executions() == 0


# -- a locked keyring ---------------------------------------------------------------------------


def collect_leaked_connections() -> None:
    """keyring's SecretService backend leaves its D-Bus connection open when the collection
    is locked (get_preferred_collection raises before anything closes it; jaraco/keyring
    #380 is the same leak elsewhere): collected here, where its ResourceWarning is expected."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


LOCKED_COMMANDS = (
    (("set", "acct_locked"), "store the API key of account 'acct_locked'"),
    (("list",), "list the accounts with a stored API key"),
    (("delete", "acct_locked"), "delete the API key of account 'acct_locked'"),
)


def assert_refused_as_locked(result: CliResult, doing: str) -> None:
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: cannot {doing}: the keyring {BACKEND} is locked")
    assert "To fix: unlock it" in line
    assert result.stdout == ""


@pytest.fixture
def locked_with_a_key(
    use_secret_service: SecretService, provider: SandboxServer, journal_path: Path
) -> Iterator[SecretService]:
    """The Secret Service holding acct_locked's key, locked for the test; after it, the key
    is still there, unchanged, no journal was opened and nothing was sent."""
    assert run_cli(["keys", "set", "acct_locked"], input=SECRET, secrets=SECRETS).exit_code == 0
    with use_secret_service.locked():
        yield use_secret_service
        assert use_secret_service.is_locked()
        collect_leaked_connections()

    assert not journal_path.exists(), "no journal is opened without a key"
    assert provider.store.total_executions() == 0
    assert use_secret_service.items() == {
        "acct_locked": SECRET.encode(),
        "__accounts__": b'["acct_locked"]',
    }


def test_a_locked_keyring_is_a_clear_error_nothing_sent_nothing_written(
    locked_with_a_key: SecretService, provider: SandboxServer, journal_path: Path
) -> None:
    with pytest.raises(payonce.ConfigurationError) as caught:
        payonce.Client(
            base_url=provider.url, provider="sandbox", account="acct_locked", journal=journal_path
        )
    message = str(caught.value)
    assert message.startswith(
        f"no API key for account 'acct_locked': the keyring {BACKEND} is locked"
    )
    assert "To fix: unlock it" in message
    assert "PAYONCE_API_KEY" in message

    for command, doing in LOCKED_COMMANDS:
        assert_refused_as_locked(
            run_cli(["keys", *command], input=OTHER_SECRET, secrets=SECRETS), doing
        )


@pytest.mark.slow
def test_a_locked_keyring_in_processes_of_their_own(
    locked_with_a_key: SecretService, provider: SandboxServer, journal_path: Path
) -> None:
    """As above, where keyring detects the (locked) Secret Service by itself."""
    refused = pay_in_a_process(provider, journal_path, "acct_locked")["error"]
    assert refused.startswith(
        f"no API key for account 'acct_locked': the keyring {BACKEND} is locked"
    )
    for command, doing in LOCKED_COMMANDS:
        assert_refused_as_locked(keys(*command, input=OTHER_SECRET), doing)


def test_once_unlocked_the_key_is_read_again(
    use_secret_service: SecretService, provider: SandboxServer, journal_path: Path
) -> None:
    assert run_cli(["keys", "set", "acct_relocked"], input=SECRET, secrets=SECRETS).exit_code == 0
    with use_secret_service.locked():
        with pytest.raises(payonce.ConfigurationError, match="is locked"):
            payonce.Client(
                base_url=provider.url,
                provider="sandbox",
                account="acct_relocked",
                journal=journal_path,
            )
        collect_leaked_connections()
    with payonce.Client(
        base_url=provider.url, provider="sandbox", account="acct_relocked", journal=journal_path
    ) as client:
        assert client.post("/v1/payments", json=PAYMENT).json()["account"] == "acct_paid_by_secret"


# -- on CI these tests run --------------------------------------------------------------------


def test_without_a_secret_service_the_tests_skip_but_fail_on_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but this test cannot run: gnome"):
        skip_or_fail("gnome-keyring-daemon not found")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="gnome-keyring-daemon not found"):
        skip_or_fail("gnome-keyring-daemon not found")
