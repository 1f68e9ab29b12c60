"""The API key never leaves the HTTP request: not into the journal, the logs, the errors or
the CLI, whatever happens to the payments.

A canary key, unique per test, drives a client through a success, a replay, a decline, a
retried 503, an unknown outcome and two mismatches (caught locally and by the provider);
then every place payonce writes to is searched for it.
"""

from __future__ import annotations

import json
import logging
import secrets
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import payonce
import payonce.cli
from helpers.payments import DECLINED, FAST_RETRY, PAYMENT
from payonce.sandbox import SandboxServer

ACCOUNT = "acct_canary"


@pytest.fixture
def canary() -> str:
    return "sk_test_CANARY_" + secrets.token_hex(16)


@pytest.fixture
def provider(make_sandbox: Callable[..., SandboxServer], canary: str) -> SandboxServer:
    return make_sandbox(api_keys={canary: ACCOUNT})


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Everything logged, by every logger, at DEBUG."""
    caplog.set_level(logging.DEBUG)
    for name in ("payonce", "httpx", "httpcore"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def leaks(canary: str, text: str) -> bool:
    """Whether ``text`` shows the key, or the random part that makes it a secret."""
    return canary in text or canary.removeprefix("sk_test_CANARY_") in text


def journal_bytes(directory: Path) -> dict[str, bytes]:
    """The journals' files, with their -wal and -shm files when present."""
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.db*")) if p.is_file()}


def exception_texts(error: BaseException) -> list[str]:
    return [str(error), repr(error), "".join(traceback.format_exception(error))]


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(payonce.cli.cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def drive_every_outcome(
    make_client: Callable[[Path], payonce.Client], provider: SandboxServer, directory: Path
) -> list[BaseException]:
    """A success, a replay, a decline, a retried 503, an unknown outcome, a local mismatch
    and a provider-side mismatch; returns the errors raised on the way."""
    errors: list[BaseException] = []
    client = make_client(directory / "journal.db")

    paid = client.post("/v1/payments", json=PAYMENT, reference="order-ok")
    assert paid.status_code == 201
    replayed = client.post("/v1/payments", json=PAYMENT, reference="order-ok")
    assert payonce.response_info(replayed).replayed  # type: ignore[union-attr]

    with pytest.raises(payonce.ProviderError) as declined:
        client.post("/v1/payments", json=DECLINED, reference="order-declined")
    assert declined.value.status_code == 402
    errors.append(declined.value)

    provider.script(["fail_before"])
    retried = client.post("/v1/payments", json={"amount": 1100, "currency": "eur"})
    assert retried.status_code == 201
    assert payonce.response_info(retried).attempts == 2  # type: ignore[union-attr]

    provider.script(["drop_after", "fail_before", "fail_before", "fail_before", "fail_before"])
    with pytest.raises(payonce.OutcomeUnknown) as unknown:
        client.post("/v1/payments", json={"amount": 1200, "currency": "eur"}, reference="lost")
    errors.append(unknown.value)

    with pytest.raises(payonce.IntentMismatch) as mismatch:
        client.post("/v1/payments", json={"amount": 9900, "currency": "eur"}, reference="order-ok")
    errors.append(mismatch.value)

    # Another journal, the same key for another request: only the provider can tell.
    other = make_client(directory / "other.db")
    key = payonce.response_info(paid).key  # type: ignore[union-attr]
    with pytest.raises(payonce.IntentMismatch) as provider_mismatch:
        other.post("/v1/payments", json={"amount": 9900, "currency": "eur"}, key=key)
    assert provider_mismatch.value.stored_fingerprint == "(provider)"
    errors.append(provider_mismatch.value)
    return errors


@pytest.mark.parametrize("source", ["argument", "environment"])
def test_the_api_key_appears_in_no_journal_log_error_or_cli_output(
    source: str,
    canary: str,
    provider: SandboxServer,
    tmp_path: Path,
    logs: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journals = tmp_path / "journals"
    journals.mkdir()
    if source == "environment":
        monkeypatch.setenv("PAYONCE_API_KEY", canary)
    clients: list[payonce.Client] = []

    def make_client(journal: Path) -> payonce.Client:
        options: dict[str, Any] = {"api_key": canary} if source == "argument" else {}
        client = payonce.Client(
            base_url=provider.url,
            provider="sandbox",
            account=ACCOUNT,
            journal=journal,
            retry=FAST_RETRY,
            timeout=5.0,
            **options,
        )
        clients.append(client)
        return client

    try:
        errors = drive_every_outcome(make_client, provider, journals)
        # The sandbox executed what it should: the canary really authenticated.
        assert provider.store.total_executions() == 4
        open_files = journal_bytes(journals)
        assert {"journal.db", "journal.db-wal"} <= set(open_files)
        client_reprs = [repr(c) for c in clients] + [repr(c.journal) for c in clients]
    finally:
        for client in clients:
            client.close()

    for name, data in {**open_files, **journal_bytes(journals)}.items():
        assert canary.encode() not in data, f"the key is in {name}"
        assert canary.removeprefix("sk_test_CANARY_").encode() not in data, name

    assert any(r.name == "payonce" and r.levelno == logging.DEBUG for r in logs.records)
    assert any(r.name == "httpx" for r in logs.records)
    assert not leaks(canary, logs.text)
    for record in logs.records:
        assert not leaks(canary, record.getMessage()), record.name
        assert not leaks(canary, repr(record.args)), record.name
        assert not leaks(canary, record.exc_text or ""), record.name

    assert len(errors) == 4
    for error in errors:
        for text in exception_texts(error):
            assert not leaks(canary, text), type(error).__name__

    for text in client_reprs:
        assert not leaks(canary, text)

    listed = run_cli("intents", "list", "--json", "--journal", str(journals / "journal.db"))
    assert not leaks(canary, listed)
    keys = [intent["key"] for intent in json.loads(listed)]
    assert len(keys) == 4
    for key in keys:
        shown = run_cli(
            "intents", "show", key, "--json", "--body", "--journal", str(journals / "journal.db")
        )
        assert key in shown
        assert not leaks(canary, shown)
    other = run_cli("intents", "list", "--json", "--journal", str(journals / "other.db"))
    assert len(json.loads(other)) == 1
    assert not leaks(canary, other)
