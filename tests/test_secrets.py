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

import attrs
import httpx
import pytest

import payonce
from helpers.cli import run_cli
from helpers.keyrings import SessionKeyring
from helpers.payments import DECLINED, FAST_RETRY, PAYMENT, free_port
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

    listed = run_cli(["intents", "list", "--json", "--journal", str(journals / "journal.db")])
    assert listed.exit_code == 0, listed.output
    assert not leaks(canary, listed.output)
    keys = [intent["key"] for intent in json.loads(listed.output)]
    assert len(keys) == 4
    for key in keys:
        shown = run_cli(
            ["intents", "show", key, "--json", "--body", "--journal", str(journals / "journal.db")]
        )
        assert shown.exit_code == 0, shown.output
        assert key in shown.output
        assert not leaks(canary, shown.output)
    other = run_cli(["intents", "list", "--json", "--journal", str(journals / "other.db")])
    assert other.exit_code == 0, other.output
    assert len(json.loads(other.output)) == 1
    assert not leaks(canary, other.output)


# -- a key no header can carry ---------------------------------------------------------------

# How a key gets mangled on its way in: a secrets file's trailing newline, a padded
# `export PAYONCE_API_KEY="sk_live_... "`, a pasted tab, a typographic character, or an
# attempt to smuggle a header in. h11 refuses to write each of these, quoting the header.
FLAWS = {
    "trailing-space": (lambda key: key + " ", "starts or ends with whitespace"),
    "trailing-newline": (lambda key: key + "\n", "starts or ends with whitespace"),
    "leading-tab": (lambda key: "\t" + key, "starts or ends with whitespace"),
    "non-ascii": (lambda key: key + "é", "non-ASCII"),
    "header-injection": (lambda key: key + "\r\nX-Evil: 1", "control character"),
}
SOURCES = {
    "argument": "api_key=",
    "environment": "PAYONCE_API_KEY",
    "keyring": "the keyring, service 'payonce', entry 'acct_canary'",
}


def journal_rows(path: Path) -> list[tuple[payonce.IntentRecord, list[Any]]]:
    journal = payonce.open_journal(path)
    try:
        return [(r, journal.attempts(r.key)) for r in journal.list_intents()]
    finally:
        journal.close()


def leave_unsent(journal: Path, canary: str, reference: str) -> None:
    """An intent whose one attempt could not connect: pending, never executed."""
    with (
        payonce.Client(
            base_url=f"http://127.0.0.1:{free_port()}",
            provider="sandbox",
            account=ACCOUNT,
            api_key=canary,
            journal=journal,
            retry=payonce.RetryPolicy(max_attempts=1),
        ) as unreachable,
        pytest.raises(payonce.ProviderUnavailable),
    ):
        unreachable.post("/v1/payments", json=PAYMENT, reference=reference)


@pytest.mark.parametrize("flaw", FLAWS)
@pytest.mark.parametrize("source", SOURCES)
def test_a_key_no_header_can_carry_is_refused_from_every_source_and_never_shown(
    source: str,
    flaw: str,
    canary: str,
    provider: SandboxServer,
    tmp_path: Path,
    logs: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    use_keyring: Callable[[Any], None],
) -> None:
    journal = tmp_path / "journal.db"
    options: dict[str, Any] = {
        "base_url": provider.url,
        "provider": "sandbox",
        "account": ACCOUNT,
        "journal": journal,
    }
    with payonce.Client(**options, api_key=canary) as earlier:
        earlier.post("/v1/payments", json=PAYMENT, reference="order-earlier")
    held = journal_rows(journal)
    files = journal_bytes(tmp_path)

    mangle, complaint = FLAWS[flaw]
    mangled = mangle(canary)
    if source == "argument":
        options["api_key"] = mangled
    elif source == "environment":
        monkeypatch.setenv("PAYONCE_API_KEY", mangled)
    else:
        ring = SessionKeyring()
        ring.set_password("payonce", ACCOUNT, mangled)
        use_keyring(ring)

    with pytest.raises(payonce.ConfigurationError, match=complaint) as refused:
        payonce.Client(**options)

    message = str(refused.value)
    assert f"the API key of account {ACCOUNT!r} (from {SOURCES[source]})" in message
    for text in exception_texts(refused.value):
        assert not leaks(canary, text)
    assert not leaks(canary, logs.text)
    assert journal_bytes(tmp_path) == files, "the journal was not even opened"
    assert journal_rows(journal) == held
    assert provider.store.total_executions() == 1, "only the earlier payment"


@pytest.mark.parametrize("command", [["resume"], ["reconcile", "--all"]])
def test_the_cli_refuses_a_padded_key_from_the_environment_and_never_shows_it(
    command: list[str], canary: str, provider: SandboxServer, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.db"
    with payonce.Client(
        base_url=provider.url,
        provider="sandbox",
        account=ACCOUNT,
        api_key=canary,
        journal=journal,
        retry=payonce.RetryPolicy(max_attempts=1),
    ) as client:
        provider.script(["drop_after"])
        with pytest.raises(payonce.OutcomeUnknown):
            client.post("/v1/payments", json=PAYMENT, reference="order-lost")
    leave_unsent(journal, canary, "order-waiting")
    held = journal_rows(journal)

    result = run_cli(
        command,
        env={
            "PAYONCE_API_KEY": canary + " ",
            "PAYONCE_BASE_URL": provider.url,
            "PAYONCE_PROVIDER": "sandbox",
            "PAYONCE_ACCOUNT": ACCOUNT,
            "PAYONCE_JOURNAL": str(journal),
        },
    )

    assert result.exit_code != 0
    output = result.stdout + result.stderr
    assert "(from PAYONCE_API_KEY) starts or ends with whitespace" in output, output
    assert not leaks(canary, output)
    assert journal_rows(journal) == held
    assert provider.store.total_executions() == 1, "only the lost attempt executed"


# -- defence in depth: an error that quotes the auth header ---------------------------------


class PadsAuthorization(httpx.HTTPTransport):
    """A middleware that mangles the credential header on its way out: the real HTTP stack
    (h11) then refuses to write it, quoting the header value in its error, as it did for a
    padded key before payonce refused those at construction."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Authorization"] = request.headers["Authorization"] + " "
        return super().handle_request(request)


class AsyncPadsAuthorization(httpx.AsyncHTTPTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Authorization"] = request.headers["Authorization"] + " "
        return await super().handle_async_request(request)


@attrs.frozen
class Waiting:
    """A journal holding one pending intent that never reached the provider."""

    journal: Path
    held: list[tuple[payonce.IntentRecord, list[Any]]]
    options: dict[str, Any]


@pytest.fixture
def waiting(canary: str, provider: SandboxServer, tmp_path: Path) -> Waiting:
    journal = tmp_path / "journal.db"
    leave_unsent(journal, canary, "order-waiting")
    options = {
        "base_url": provider.url,
        "provider": "sandbox",
        "account": ACCOUNT,
        "api_key": canary,
        "journal": journal,
    }
    return Waiting(journal, journal_rows(journal), options)


def assert_resumed_without_the_key(
    result: payonce.ResumeResult,
    canary: str,
    logs: pytest.LogCaptureFixture,
    waiting: Waiting,
    provider: SandboxServer,
) -> None:
    assert result.state is payonce.IntentState.PENDING
    assert result.detail.startswith("LocalProtocolError: Illegal header value")
    assert "[redacted]" in result.detail
    assert not leaks(canary, repr(result))
    assert any("[redacted]" in r.getMessage() for r in logs.records if r.name == "payonce")
    for record in logs.records:
        if record.name == "payonce":
            assert not leaks(canary, record.getMessage())
            assert not leaks(canary, repr(record.args))
            assert record.exc_info is None, "a traceback quoting the key is logged as text"
    ((before, _),) = waiting.held
    ((after, attempts),) = journal_rows(waiting.journal)
    assert after.state is payonce.IntentState.PENDING
    assert after.lease_owner is None
    assert after.attempt_count == before.attempt_count + 1
    assert attempts[-1].error == "LocalProtocolError", "the journal keeps the type, never words"
    assert attempts[-1].ambiguous is False, "refused before a byte left"
    assert not leaks(canary, repr(after))
    assert provider.store.total_executions() == 0


def test_resume_redacts_the_key_from_an_error_that_quotes_the_auth_header(
    canary: str, provider: SandboxServer, waiting: Waiting, logs: pytest.LogCaptureFixture
) -> None:
    with payonce.Client(**waiting.options, transport=PadsAuthorization()) as mangling:
        (result,) = mangling.resume()

    assert_resumed_without_the_key(result, canary, logs, waiting, provider)


@pytest.mark.anyio
async def test_async_resume_redacts_the_key_from_an_error_that_quotes_the_auth_header(
    canary: str, provider: SandboxServer, waiting: Waiting, logs: pytest.LogCaptureFixture
) -> None:
    transport = AsyncPadsAuthorization()
    async with payonce.AsyncClient(**waiting.options, transport=transport) as mangling:
        (result,) = await mangling.resume()

    assert_resumed_without_the_key(result, canary, logs, waiting, provider)
