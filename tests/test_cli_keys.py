"""``payonce keys set/list/delete`` with real keyring backends.

Every test sets its backend explicitly with ``keyring.set_keyring`` and the fixture puts
the previous one back; file backends write under the isolated HOME/XDG dirs of conftest.
The secret is typed into the command (``input=``, or a real pseudo-terminal) and must never
come back out: not on stdout, not on stderr, not in an error.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import keyring
import keyring.backend
import keyring.backends.chainer
import keyring.backends.fail
import keyring.backends.null
import pytest
from keyrings.alt.file import PlaintextKeyring

import payonce
from helpers.cli import run_cli
from helpers.keyrings import LockedKeyring, SessionKeyring, UseKeyring
from helpers.processes import python_env
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

SECRET = "sk_test_4eC39HqLyjWDarjtT1zdp7dc"
OTHER_SECRET = "sk_test_rotated_51HxYz0000000000"
SECRETS = (SECRET, OTHER_SECRET)  # never printed: every command here is run with secrets=SECRETS
INDEX = ("payonce", "__accounts__")


@pytest.fixture
def plaintext(use_keyring: UseKeyring) -> PlaintextKeyring:
    backend = PlaintextKeyring()
    use_keyring(backend)
    return backend


OPT_IN = {"PAYONCE_ALLOW_PLAINTEXT_KEYRING": "1"}


# -- a working (opted-in) plaintext keyring ---------------------------------------------------


def test_set_list_delete_round_trip(plaintext: PlaintextKeyring) -> None:
    stored = run_cli(["keys", "set", "acct_a"], input=SECRET + "\n", env=OPT_IN, secrets=SECRETS)
    assert stored.exit_code == 0, stored.output
    assert stored.stdout == (
        f"stored the API key of account 'acct_a' in "
        f"keyrings.alt.file.PlaintextKeyring ({plaintext.file_path})\n"
    )
    assert "plaintext file" in stored.stderr
    assert plaintext.get_password("payonce", "acct_a") == SECRET
    assert (
        run_cli(
            ["keys", "set", "acct_b"], input=OTHER_SECRET, env=OPT_IN, secrets=SECRETS
        ).exit_code
        == 0
    )

    listed = run_cli(["keys", "list"], env=OPT_IN, secrets=SECRETS)
    assert listed.exit_code == 0
    assert listed.stdout == "acct_a\nacct_b\n"
    as_json = run_cli(["keys", "list", "--json"], env=OPT_IN, secrets=SECRETS)
    assert json.loads(as_json.stdout) == [{"account": "acct_a"}, {"account": "acct_b"}]
    assert plaintext.get_password(*INDEX) == '["acct_a", "acct_b"]'  # names, never secrets

    # Setting again replaces the key; the account is listed once.
    assert (
        run_cli(
            ["keys", "set", "acct_a"], input=OTHER_SECRET, env=OPT_IN, secrets=SECRETS
        ).exit_code
        == 0
    )
    assert plaintext.get_password("payonce", "acct_a") == OTHER_SECRET
    assert run_cli(["keys", "list"], env=OPT_IN, secrets=SECRETS).stdout == "acct_a\nacct_b\n"

    deleted = run_cli(["keys", "delete", "acct_a"], env=OPT_IN, secrets=SECRETS)
    assert deleted.exit_code == 0
    assert deleted.stdout == "deleted the API key of account 'acct_a'\n"
    assert plaintext.get_password("payonce", "acct_a") is None
    assert run_cli(["keys", "list"], env=OPT_IN, secrets=SECRETS).stdout == "acct_b\n"

    again = run_cli(["keys", "delete", "acct_a"], env=OPT_IN, secrets=SECRETS)
    assert again.exit_code == 1
    assert again.stderr == "error: no API key stored in the keyring for account 'acct_a'\n"

    assert run_cli(["keys", "delete", "acct_b"], env=OPT_IN, secrets=SECRETS).exit_code == 0
    assert plaintext.get_password(*INDEX) is None  # no index left behind either
    empty = run_cli(["keys", "list"], env=OPT_IN, secrets=SECRETS)
    assert empty.stdout == "no API keys stored by payonce in the keyring\n"
    assert json.loads(run_cli(["keys", "list", "--json"], env=OPT_IN, secrets=SECRETS).stdout) == []


def test_the_public_functions_behind_the_commands(plaintext: PlaintextKeyring) -> None:
    where = payonce.credentials.store_api_key("acct_p", SECRET, allow_plaintext_keyring=True)
    assert where.startswith("keyrings.alt.file.PlaintextKeyring (")
    assert payonce.credentials.stored_accounts(allow_plaintext_keyring=True) == ["acct_p"]
    assert payonce.credentials.delete_api_key("acct_p", allow_plaintext_keyring=True) is True
    assert payonce.credentials.delete_api_key("acct_p", allow_plaintext_keyring=True) is False
    with pytest.raises(payonce.ConfigurationError, match="plaintext"):
        payonce.credentials.stored_accounts(allow_plaintext_keyring=False)


def test_a_key_set_with_the_cli_is_used_by_a_client(
    plaintext: PlaintextKeyring,
    sandbox: SandboxServer,
    journal_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (
        run_cli(
            ["keys", "set", "acct_demo"], input=DEFAULT_API_KEY + "\n", env=OPT_IN, secrets=SECRETS
        ).exit_code
        == 0
    )
    monkeypatch.setenv("PAYONCE_ALLOW_PLAINTEXT_KEYRING", "1")
    assert "PAYONCE_API_KEY" not in os.environ

    with payonce.Client(
        base_url=sandbox.url, provider="sandbox", account="acct_demo", journal=journal_path
    ) as client:
        response = client.post("/v1/payments", json={"amount": 4200, "currency": "eur"})
    assert response.status_code == 201
    assert response.json()["account"] == "acct_demo"  # the provider took the stored key

    # The command line's own client finds it the same way.
    resumed = run_cli(
        ["resume", "--base-url", sandbox.url, "--provider", "sandbox", "--account", "acct_demo"],
        env={"PAYONCE_JOURNAL": str(journal_path)},
        secrets=SECRETS,
    )
    assert resumed.exit_code == 0, resumed.output
    assert "nothing to resume" in resumed.stderr
    assert DEFAULT_API_KEY not in resumed.stdout + resumed.stderr


def test_a_set_key_is_only_a_fallback_to_the_environment(plaintext: PlaintextKeyring) -> None:
    result = run_cli(
        ["keys", "set", "acct_e"],
        input=SECRET,
        env={"PAYONCE_API_KEY": OTHER_SECRET, **OPT_IN},
        secrets=SECRETS,
    )
    assert result.exit_code == 0
    assert "PAYONCE_API_KEY is set" in result.stderr


# -- what is typed in -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("", "no API key on standard input"),
        ("\n\n", "no API key on standard input"),
        (f"{SECRET}\n{OTHER_SECRET}\n", "more than one line"),
        ("sk_test_with space", "without spaces"),
        ("sk_test_\x07bell", "without spaces"),
        ("sk_test_café", "printable ASCII"),
    ],
)
def test_unusable_input_is_refused_and_nothing_is_written(
    plaintext: PlaintextKeyring, typed: str, message: str
) -> None:
    result = run_cli(["keys", "set", "acct_x"], input=typed, env=OPT_IN, secrets=SECRETS)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    assert message in line
    assert "sk_test_" not in line
    assert not Path(plaintext.file_path).exists()


@pytest.mark.parametrize(
    "args",
    [
        ["keys", "set", "acct_x", SECRET],
        ["keys", "set", "acct_x", f"--key={SECRET}"],
        ["keys", "set", f"--api-key={SECRET}", "acct_x"],
    ],
)
def test_a_key_is_never_taken_from_the_command_line(
    plaintext: PlaintextKeyring, args: list[str]
) -> None:
    result = run_cli(args, input=SECRET, env=OPT_IN, secrets=SECRETS)  # secrets=: never echoed back
    assert result.exit_code == 2
    assert "never accepted on the command line" in result.stderr
    assert not Path(plaintext.file_path).exists()


def test_the_index_entry_is_not_an_account(plaintext: PlaintextKeyring) -> None:
    result = run_cli(["keys", "set", "__accounts__"], input=SECRET, env=OPT_IN, secrets=SECRETS)
    assert result.exit_code == 2
    assert "reserved" in result.stderr
    assert not Path(plaintext.file_path).exists()
    for bad in ("", " acct", "acct\n"):
        assert (
            run_cli(["keys", "set", bad], input=SECRET, env=OPT_IN, secrets=SECRETS).exit_code == 2
        )


def test_the_index_is_never_sent_as_a_key(
    plaintext: PlaintextKeyring, sandbox: SandboxServer, journal_path: Path
) -> None:
    assert (
        run_cli(["keys", "set", "acct_i"], input=SECRET, env=OPT_IN, secrets=SECRETS).exit_code == 0
    )
    with pytest.raises(payonce.ConfigurationError, match="index of accounts"):
        payonce.Client(
            base_url=sandbox.url,
            account="__accounts__",
            journal=journal_path,
            allow_plaintext_keyring=True,
        )
    assert sandbox.store.total_executions() == 0


def test_a_damaged_index_is_reported_not_overwritten(plaintext: PlaintextKeyring) -> None:
    plaintext.set_password(*INDEX, "not json")
    result = run_cli(["keys", "list"], env=OPT_IN, secrets=SECRETS)
    assert result.exit_code == 2
    assert "keyring del payonce __accounts__" in result.stderr
    assert (
        run_cli(["keys", "set", "acct_y"], input=SECRET, env=OPT_IN, secrets=SECRETS).exit_code == 2
    )
    assert plaintext.get_password("payonce", "acct_y") is None
    assert plaintext.get_password(*INDEX) == "not json"


# -- keyrings that must be refused ------------------------------------------------------------


def test_a_plaintext_keyring_is_refused_without_opt_in_and_nothing_is_written(
    plaintext: PlaintextKeyring,
) -> None:
    result = run_cli(["keys", "set", "acct_z"], input=SECRET, secrets=SECRETS)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "plaintext file" in line
    assert "PAYONCE_ALLOW_PLAINTEXT_KEYRING=1" in line
    assert "PAYONCE_API_KEY" in line
    for command in (["keys", "list"], ["keys", "delete", "acct_z"]):
        assert run_cli(command, secrets=SECRETS).exit_code == 2
    assert not Path(plaintext.file_path).exists()


def test_the_fail_backend_says_how_to_get_a_keyring(use_keyring: UseKeyring) -> None:
    use_keyring(keyring.backends.fail.Keyring())
    for command in (["keys", "set", "acct_f"], ["keys", "list"], ["keys", "delete", "acct_f"]):
        result = run_cli(command, input=SECRET, env=OPT_IN, secrets=SECRETS)
        assert result.exit_code == 2
        (line,) = result.stderr.splitlines()
        assert "no usable keyring backend" in line
        assert "pip install keyrings.alt" in line
        assert "PAYONCE_ALLOW_PLAINTEXT_KEYRING=1" in line
        assert "PAYONCE_API_KEY" in line


def test_a_locked_keyring_says_it_is_locked_and_nothing_else(use_keyring: UseKeyring) -> None:
    use_keyring(LockedKeyring())
    for command, doing in (
        (["keys", "set", "acct_l"], "store the API key of account 'acct_l'"),
        (["keys", "list"], "list the accounts with a stored API key"),
        (["keys", "delete", "acct_l"], "delete the API key of account 'acct_l'"),
    ):
        result = run_cli(command, input=SECRET, secrets=SECRETS)
        assert result.exit_code == 2
        (line,) = result.stderr.splitlines()
        assert line.startswith(
            f"error: cannot {doing}: the keyring helpers.keyrings.LockedKeyring is locked"
        )
        assert "To fix: unlock it" in line


def test_the_null_backend_is_refused(use_keyring: UseKeyring) -> None:
    use_keyring(keyring.backends.null.Keyring())
    result = run_cli(["keys", "set", "acct_n"], input=SECRET, env=OPT_IN, secrets=SECRETS)
    assert result.exit_code == 2
    assert "stores nothing" in result.stderr


def test_a_chain_writes_to_its_first_usable_link_never_to_a_refused_one(
    use_keyring: UseKeyring,
) -> None:
    session = SessionKeyring()
    plaintext = PlaintextKeyring()

    class DesktopChain(keyring.backends.chainer.ChainerBackend):
        viable = False
        backends = (plaintext, session)  # the plaintext file comes first in the chain

    use_keyring(DesktopChain())

    result = run_cli(["keys", "set", "acct_c"], input=SECRET, secrets=SECRETS)
    assert result.exit_code == 0, result.output
    assert "SessionKeyring" in result.stdout
    assert session.entries[("payonce", "acct_c")] == SECRET
    assert not Path(plaintext.file_path).exists()  # refused without opt-in: never touched
    assert run_cli(["keys", "list"], secrets=SECRETS).stdout == "acct_c\n"

    opted_in = run_cli(["keys", "set", "acct_c2"], input=OTHER_SECRET, env=OPT_IN, secrets=SECRETS)
    assert "PlaintextKeyring" in opted_in.stdout  # now the first usable link
    assert plaintext.get_password("payonce", "acct_c2") == OTHER_SECRET
    assert run_cli(["keys", "list"], env=OPT_IN, secrets=SECRETS).stdout == "acct_c\nacct_c2\n"
    assert (
        run_cli(["keys", "list"], secrets=SECRETS).stdout == "acct_c\n"
    )  # the file is not read without opt-in

    assert run_cli(["keys", "delete", "acct_c"], secrets=SECRETS).exit_code == 0
    assert ("payonce", "acct_c") not in session.entries


# -- a real terminal --------------------------------------------------------------------------


class _Terminal:
    """The user's side of a pseudo-terminal: what was shown, and what is typed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.seen = ""
        self._position = 0

    def expect(self, wanted: str, timeout: float = 30.0) -> None:
        """Wait until ``wanted`` shows after what was expected last."""
        deadline = time.monotonic() + timeout
        while (found := self.seen.find(wanted, self._position)) < 0:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {wanted!r} in {self.seen!r}"
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # EIO: the command closed the terminal
                chunk = b""
            assert chunk, f"no {wanted!r} in {self.seen!r} before the end"
            self.seen += chunk.decode(errors="replace")
        self._position = found + len(wanted)

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")


def test_on_a_terminal_the_key_is_prompted_for_twice_and_never_echoed(
    plaintext: PlaintextKeyring,
) -> None:
    """In a process of its own on a pseudo-terminal: what the user sees is all there is."""
    env = python_env(**OPT_IN, PYTHON_KEYRING_BACKEND="keyrings.alt.file.PlaintextKeyring")
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "payonce.cli", "keys", "set", "acct_tty"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,  # not the test runner's terminal
    )
    os.close(terminal)
    user = _Terminal(controller)
    try:
        user.expect("API key for account acct_tty: ")
        user.type("typo")
        user.expect("Repeat for confirmation: ")
        user.type(SECRET)
        user.expect("do not match")
        user.expect("API key for account acct_tty: ")  # asked again, from the start
        user.type(SECRET)
        user.expect("Repeat for confirmation: ")
        user.type(SECRET)
        user.expect("stored the API key of account 'acct_tty'")
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)
    assert SECRET not in user.seen
    assert "typo" not in user.seen
    assert plaintext.get_password("payonce", "acct_tty") == SECRET
