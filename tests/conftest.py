"""Shared fixtures: a real sandbox provider on loopback and a real journal file.

The helpers that are not fixtures live in the ``helpers`` package beside this file.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import keyring
import keyring.backend
import pytest

import payonce
from helpers.ci import skip_or_fail
from helpers.journals import OpenJournal
from helpers.keyrings import UseKeyring
from helpers.payments import FAST_RETRY
from helpers.sandboxes import SharedSandboxes
from helpers.secret_service import SecretService, SecretServiceError, unavailable
from payonce._journal._open import open_to_write
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

# A PostgreSQL server of the session's own, started on first use, and a database per test.
from pgserver import postgres_server, postgres_url  # noqa: F401


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test may read the developer's API key, keyring or journal."""
    monkeypatch.delenv("PAYONCE_API_KEY", raising=False)
    monkeypatch.delenv("PAYONCE_JOURNAL", raising=False)
    monkeypatch.delenv("PAYONCE_ALLOW_PLAINTEXT_KEYRING", raising=False)
    # No desktop session's Secret Service either: only the one tests start (secret_service).
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home" / ".local" / "share"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    (tmp_path / "home").mkdir()


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (``pytest.mark.anyio``) run on asyncio: payonce does not support trio."""
    return "asyncio"


@pytest.fixture
def use_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[UseKeyring]:
    """Set the process's keyring backend for one test; the previous one comes back after."""
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND", raising=False)
    # Discover the installed backends now (keyring caches the list once), so that no
    # backend class a test defines can ever be picked up by keyring's auto-detection.
    keyring.backend.get_all_keyring()
    previous = keyring.get_keyring()
    yield keyring.set_keyring
    keyring.set_keyring(previous)


@pytest.fixture(scope="session")
def secret_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecretService]:
    """GNOME Keyring on a private D-Bus session bus, for this session (each xdist worker has
    its own); skips where it cannot run, fails instead with CI=true."""
    reason = unavailable()
    if reason is not None:
        skip_or_fail(reason)
    try:
        service = SecretService.start(tmp_path_factory.mktemp("secret-service"))
    except SecretServiceError as exc:
        skip_or_fail(f"the Secret Service could not be started: {exc}")
    yield service
    service.close()


@pytest.fixture
def use_secret_service(
    secret_service: SecretService, use_keyring: UseKeyring, monkeypatch: pytest.MonkeyPatch
) -> SecretService:
    """The session's Secret Service as this test's keyring, holding nothing of payonce's.

    In this process through keyring's SecretService backend, set explicitly; the processes the
    test starts find it as a user's would: keyring's own detection, through the session bus
    in DBUS_SESSION_BUS_ADDRESS (and no PYTHON_KEYRING_BACKEND).
    """
    import keyring.backends.SecretService

    secret_service.clear()
    for name, value in secret_service.env.items():
        monkeypatch.setenv(name, value)
    use_keyring(keyring.backends.SecretService.Keyring())
    return secret_service


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    """What a test's factories open (servers, clients, journals), closed at its end, last
    opened first."""
    with contextlib.ExitStack() as stack:
        yield stack


# -- the sandbox provider --------------------------------------------------------------------


@pytest.fixture(scope="session")
def shared_sandboxes() -> Iterator[SharedSandboxes]:
    sandboxes = SharedSandboxes()
    yield sandboxes
    sandboxes.close()


@pytest.fixture
def sandbox(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    """The session's sandbox in its default configuration, reset for this test."""
    return shared_sandboxes.get("default", SandboxConfig())


@pytest.fixture
def make_sandbox(closing: contextlib.ExitStack) -> Callable[..., SandboxServer]:
    """A sandbox of the test's own, for a configuration no switch at run time can give
    (``processing_seconds``, ``key_lifetime``, ``api_keys``, ...)."""

    def make(**config: Any) -> SandboxServer:
        return closing.enter_context(SandboxServer(SandboxConfig(**config)))

    return make


# -- clients and journals ----------------------------------------------------------------------


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def client_options(sandbox: SandboxServer, journal_path: Path) -> dict[str, Any]:
    """What a client of the sandbox on the test's journal file is made with."""
    return {
        "base_url": sandbox.url,
        "provider": "sandbox",
        "account": "acct_demo",
        "api_key": DEFAULT_API_KEY,
        "journal": journal_path,
        "retry": FAST_RETRY,
        "timeout": 5.0,
    }


@pytest.fixture
def make_client(
    client_options: dict[str, Any], closing: contextlib.ExitStack
) -> Callable[..., payonce.Client]:
    """Clients of the sandbox on the test's journal file; closed at the end of the test."""

    def make(**overrides: Any) -> payonce.Client:
        return closing.enter_context(payonce.Client(**{**client_options, **overrides}))

    return make


@pytest.fixture
async def make_async_client(
    client_options: dict[str, Any],
) -> AsyncIterator[Callable[..., payonce.AsyncClient]]:
    """Async clients of the sandbox on the test's journal file, closed at the end."""
    clients: list[payonce.AsyncClient] = []

    def make(**overrides: Any) -> payonce.AsyncClient:
        clients.append(payonce.AsyncClient(**{**client_options, **overrides}))
        return clients[-1]

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def client(make_client: Callable[..., payonce.Client]) -> payonce.Client:
    return make_client()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def location(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where this test's journal lives: a file, or a fresh PostgreSQL database's URL."""
    if backend == "sqlite":
        return str(tmp_path / "journal.db")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def open_journal(location: str, closing: contextlib.ExitStack) -> OpenJournal:
    """Opens journals on the test's store, one per "host"; all closed at the end."""

    def open_(**options: Any) -> payonce.Journal:
        journal = open_to_write(location, **options)
        closing.callback(journal.close)
        return journal

    return open_
