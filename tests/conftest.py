"""Shared fixtures: a real sandbox provider on loopback and a real journal file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import payonce
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

# A PostgreSQL server of the session's own, started on first use, and a database per test.
from pgserver import postgres_server, postgres_url  # noqa: F401

FAST_RETRY = payonce.RetryPolicy(initial_wait=0.001, max_wait=0.01, max_attempts=5)


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test may read the developer's API key, keyring or journal."""
    monkeypatch.delenv("PAYONCE_API_KEY", raising=False)
    monkeypatch.delenv("PAYONCE_JOURNAL", raising=False)
    monkeypatch.delenv("PAYONCE_ALLOW_PLAINTEXT_KEYRING", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home" / ".local" / "share"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    (tmp_path / "home").mkdir()


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (``pytest.mark.anyio``) run on asyncio: payonce does not support trio."""
    return "asyncio"


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig()) as server:
        yield server


@pytest.fixture
def make_sandbox() -> Iterator[Callable[..., SandboxServer]]:
    started: list[SandboxServer] = []

    def make(**config: Any) -> SandboxServer:
        server = SandboxServer(SandboxConfig(**config)).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def make_client(
    sandbox: SandboxServer, journal_path: Path
) -> Iterator[Callable[..., payonce.Client]]:
    """Clients of the sandbox on the test's journal file; closed at the end of the test."""
    clients: list[payonce.Client] = []

    def make(**overrides: Any) -> payonce.Client:
        options: dict[str, Any] = {
            "base_url": sandbox.url,
            "provider": "sandbox",
            "account": "acct_demo",
            "api_key": DEFAULT_API_KEY,
            "journal": journal_path,
            "retry": FAST_RETRY,
            "timeout": 5.0,
        }
        options.update(overrides)
        client = payonce.Client(**options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: Callable[..., payonce.Client]) -> payonce.Client:
    return make_client()


PAYMENT = {"amount": 4200, "currency": "eur"}
