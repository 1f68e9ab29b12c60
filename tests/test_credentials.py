"""Where the API key comes from, with real keyring backends.

Order: the ``api_key=`` argument, then ``PAYONCE_API_KEY``, then the OS keyring (service
``payonce``, one entry per account). A keyring that stores nothing, fails, stores in
plaintext without opt-in, or would prompt for a password is refused with a message saying
how to set a key, before any journal is opened or any request is sent.

Every test sets its backend explicitly with ``keyring.set_keyring`` and the fixture puts
the previous one back; file backends write under the isolated HOME/XDG dirs of conftest.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keyring
import keyring.backend
import keyring.backends.chainer
import keyring.backends.fail
import keyring.backends.null
import keyring.util.platform_
import pytest
from keyrings.alt.file import EncryptedKeyring, PlaintextKeyring

import payonce
from helpers.keyrings import LockedKeyring, SessionKeyring, UseKeyring
from helpers.payments import PAYMENT
from helpers.processes import python_env
from payonce.sandbox import SandboxServer

ACCOUNT = "acct_demo"
ARG_KEY = "sk_test_from_argument"
ENV_KEY = "sk_test_from_environment"
RING_KEY = "sk_test_from_keyring"

Refused = Callable[..., payonce.ConfigurationError]


@pytest.fixture
def provider(make_sandbox: Callable[..., SandboxServer]) -> SandboxServer:
    """A sandbox that tells which credential paid: each key belongs to its own account."""
    return make_sandbox(
        api_keys={
            ARG_KEY: "acct_via_argument",
            ENV_KEY: "acct_via_environment",
            RING_KEY: "acct_via_keyring",
        }
    )


@pytest.fixture
def connect(provider: SandboxServer, journal_path: Path) -> Iterator[Callable[..., payonce.Client]]:
    clients: list[payonce.Client] = []

    def connect(**overrides: Any) -> payonce.Client:
        options: dict[str, Any] = {
            "base_url": provider.url,
            "provider": "sandbox",
            "account": ACCOUNT,
            "journal": journal_path,
        }
        options.update(overrides)
        client = payonce.Client(**options)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


def paid_by(client: payonce.Client) -> str:
    """The provider account that the client's credential authenticated as."""
    response = client.post("/v1/payments", json=PAYMENT)
    assert response.status_code == 201
    return str(response.json()["account"])


@pytest.fixture
def refused(
    connect: Callable[..., payonce.Client], provider: SandboxServer, journal_path: Path
) -> Refused:
    """Client construction fails, matching ``match``, before the journal is opened or
    anything is sent, and the message says how to set a key."""

    def refuse(match: str, **options: Any) -> payonce.ConfigurationError:
        with pytest.raises(payonce.ConfigurationError, match=match) as caught:
            connect(**options)
        assert not journal_path.exists(), "the key is resolved before the journal is opened"
        assert provider.store.total_executions() == 0
        assert provider.store.payments() == []
        message = str(caught.value)
        assert ACCOUNT in message
        assert "PAYONCE_API_KEY" in message, "the message must say how to set a key"
        assert RING_KEY not in message
        return caught.value

    return refuse


def plaintext_keyring_holding(secret: str, *, account: str = ACCOUNT) -> PlaintextKeyring:
    backend = PlaintextKeyring()
    backend.set_password("payonce", account, secret)
    return backend


# -- the order of sources --------------------------------------------------------------------


def test_the_isolated_home_holds_the_file_keyrings(tmp_path: Path) -> None:
    """keyrings.alt writes under XDG_DATA_HOME: never into the developer's real keyring."""
    assert keyring.util.platform_.data_root().is_relative_to(tmp_path / "home")
    assert Path(PlaintextKeyring().file_path).is_relative_to(tmp_path / "home")


@pytest.mark.parametrize(
    ("keyring_holds_a_key", "api_key", "paid_as"),
    [
        pytest.param(
            True, ARG_KEY, "acct_via_argument", id="argument-over-environment-and-keyring"
        ),
        pytest.param(True, None, "acct_via_environment", id="environment-over-keyring"),
        pytest.param(False, None, "acct_via_environment", id="environment-when-no-keyring-works"),
    ],
)
def test_the_key_comes_from_the_argument_then_the_environment_then_the_keyring(
    use_keyring: UseKeyring,
    connect: Callable[..., payonce.Client],
    monkeypatch: pytest.MonkeyPatch,
    keyring_holds_a_key: bool,
    api_key: str | None,
    paid_as: str,
) -> None:
    if keyring_holds_a_key:
        use_keyring(plaintext_keyring_holding(RING_KEY))
        monkeypatch.setenv("PAYONCE_ALLOW_PLAINTEXT_KEYRING", "1")
    else:
        use_keyring(keyring.backends.fail.Keyring())
    monkeypatch.setenv("PAYONCE_API_KEY", ENV_KEY)
    options = {} if api_key is None else {"api_key": api_key}
    assert paid_by(connect(**options)) == paid_as


# -- keyrings that must be refused -----------------------------------------------------------


def test_the_fail_backend_is_refused_with_how_to_set_a_key(
    use_keyring: UseKeyring, refused: Refused
) -> None:
    use_keyring(keyring.backends.fail.Keyring())
    error = refused("no usable keyring backend")
    assert f"payonce keys set {ACCOUNT}" in str(error)


def test_a_locked_keyring_says_it_is_locked_and_how_to_unlock_it(
    use_keyring: UseKeyring, refused: Refused
) -> None:
    use_keyring(LockedKeyring())
    error = refused("is locked")
    assert str(error).startswith(
        f"no API key for account {ACCOUNT!r}: the keyring helpers.keyrings.LockedKeyring is "
        "locked and was not unlocked"
    )
    assert "To fix: unlock it" in str(error)
    assert "keyrings.alt" not in str(error)  # another keyring is not the answer


def test_the_null_backend_is_refused(use_keyring: UseKeyring, refused: Refused) -> None:
    use_keyring(keyring.backends.null.Keyring())
    refused("stores nothing")


def test_a_plaintext_keyring_holding_the_key_is_refused_without_opt_in(
    use_keyring: UseKeyring, refused: Refused
) -> None:
    use_keyring(plaintext_keyring_holding(RING_KEY))
    error = refused("plaintext")
    assert "PAYONCE_ALLOW_PLAINTEXT_KEYRING=1" in str(error)
    assert "pip install keyrings.alt" not in str(error), "it is the keyring in use"


def test_a_plaintext_keyring_is_used_when_the_caller_opts_in(
    use_keyring: UseKeyring, connect: Callable[..., payonce.Client]
) -> None:
    use_keyring(plaintext_keyring_holding(RING_KEY))
    assert paid_by(connect(allow_plaintext_keyring=True)) == "acct_via_keyring"


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_a_plaintext_keyring_is_used_when_the_environment_opts_in(
    use_keyring: UseKeyring,
    connect: Callable[..., payonce.Client],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    use_keyring(plaintext_keyring_holding(RING_KEY))
    monkeypatch.setenv("PAYONCE_ALLOW_PLAINTEXT_KEYRING", value)
    assert paid_by(connect()) == "acct_via_keyring"


def test_an_explicit_refusal_of_plaintext_overrides_the_environment_opt_in(
    use_keyring: UseKeyring, monkeypatch: pytest.MonkeyPatch, refused: Refused
) -> None:
    use_keyring(plaintext_keyring_holding(RING_KEY))
    monkeypatch.setenv("PAYONCE_ALLOW_PLAINTEXT_KEYRING", "1")
    refused("plaintext", allow_plaintext_keyring=False)


def test_a_chained_keyring_whose_only_backend_is_plaintext_is_refused_without_opt_in(
    use_keyring: UseKeyring, monkeypatch: pytest.MonkeyPatch, refused: Refused
) -> None:
    plaintext_keyring_holding(RING_KEY)
    # keyring's own chainer, limited the way keyring.core limits it, to the plaintext file.
    monkeypatch.setattr(
        keyring.backend, "_limit", lambda backend: isinstance(backend, PlaintextKeyring)
    )
    chain = keyring.backends.chainer.ChainerBackend()
    assert [type(b) for b in chain.backends] == [PlaintextKeyring]
    assert chain.get_password("payonce", ACCOUNT) == RING_KEY
    use_keyring(chain)

    refused("plaintext")


def test_a_chained_plaintext_keyring_is_used_when_the_caller_opts_in(
    use_keyring: UseKeyring,
    connect: Callable[..., payonce.Client],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plaintext_keyring_holding(RING_KEY)
    monkeypatch.setattr(
        keyring.backend, "_limit", lambda backend: isinstance(backend, PlaintextKeyring)
    )
    use_keyring(keyring.backends.chainer.ChainerBackend())
    assert paid_by(connect(allow_plaintext_keyring=True)) == "acct_via_keyring"


def test_a_chain_with_a_secure_backend_never_falls_back_to_a_plaintext_file_without_opt_in(
    use_keyring: UseKeyring, refused: Refused
) -> None:
    """A desktop with Secret Service *and* keyrings.alt gets keyring's chainer by default.

    The secure link makes the chain acceptable, but the plaintext link must still not be
    read without opt-in: an account missing from the secure store is "no key", not a
    silent read of the plaintext file.
    """

    class DesktopChain(keyring.backends.chainer.ChainerBackend):
        viable = False
        backends = (SessionKeyring(), plaintext_keyring_holding(RING_KEY))

    use_keyring(DesktopChain())
    refused("in the keyring")


def test_an_encrypted_file_keyring_is_refused_without_ever_prompting(
    provider: SandboxServer, journal_path: Path
) -> None:
    """Run in a process of its own, with no terminal and stdin on /dev/null, so that a
    prompt shows on its stderr instead of waiting for a password that never comes."""
    # pycryptodome is not installed here, and EncryptedKeyring.__init__ only loads it for
    # encrypt/decrypt; the password prompt comes before either, so skip __init__.
    backend = EncryptedKeyring.__new__(EncryptedKeyring)
    sealed = json.dumps(
        {
            "salt": base64.b64encode(bytes(32)).decode(),
            "IV": base64.b64encode(bytes(16)).decode(),
            "password_encrypted": base64.b64encode(b"sealed").decode(),
        }
    ).encode()
    entry = "\n" + base64.encodebytes(sealed).decode()
    backend._write_config_value("keyring-setting", "password reference", entry)
    backend._write_config_value("keyring-setting", "scheme", backend.scheme)
    backend._write_config_value("keyring-setting", "version", backend.version)
    backend._write_config_value("payonce", ACCOUNT, entry)

    script = """
import json, sys
import keyring
from keyrings.alt.file import EncryptedKeyring
import payonce

backend = EncryptedKeyring.__new__(EncryptedKeyring)
keyring.set_keyring(backend)
result = {}
try:
    payonce.Client(base_url=sys.argv[1], provider="sandbox", account=sys.argv[3],
                   journal=sys.argv[2])
except payonce.ConfigurationError as exc:
    result["error"] = str(exc)
else:
    result["error"] = None
sys.stderr.write("--- control ---\\n")
sys.stderr.flush()
try:
    backend.get_password("payonce", sys.argv[3])
except BaseException as exc:
    result["control"] = type(exc).__name__
print(json.dumps(result))
"""
    env = python_env()
    done = subprocess.run(
        [sys.executable, "-c", script, provider.url, str(journal_path), ACCOUNT],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        start_new_session=True,  # no controlling terminal: getpass cannot open /dev/tty
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    during_payonce, _, during_control = done.stderr.partition("--- control ---")

    assert result["error"] is not None, "the encrypted keyring must be refused"
    assert "would prompt for a password" in result["error"]
    assert "PAYONCE_API_KEY" in result["error"]
    assert "password" not in during_payonce.lower(), during_payonce
    # The control: reading this keyring directly does prompt, so the silence above is real.
    assert "Please enter password" in during_control
    assert result["control"] == "EOFError"
    assert not journal_path.exists()
    assert provider.store.total_executions() == 0


def test_an_opted_in_plaintext_keyring_without_an_entry_for_the_account_names_it(
    use_keyring: UseKeyring, refused: Refused
) -> None:
    use_keyring(plaintext_keyring_holding(RING_KEY, account="acct_other"))
    error = refused("in the keyring", allow_plaintext_keyring=True)
    assert repr(ACCOUNT) in str(error)
    assert "acct_other" not in str(error)


def test_secret_service_without_a_session_bus_is_a_clear_error(
    use_keyring: UseKeyring, monkeypatch: pytest.MonkeyPatch, refused: Refused
) -> None:
    import keyring.backends.SecretService

    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    use_keyring(keyring.backends.SecretService.Keyring())
    error = refused("the keyring failed")
    assert "SecretService" in str(error) or "SecretStorage" in str(error)
