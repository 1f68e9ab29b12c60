"""The public namespace is curated: one sorted __all__, every name real, nothing private,
and what advanced users need in named public modules."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

import payonce
import payonce.errors
from helpers.processes import mypy_strict

PUBLIC_MODULES = {
    "cli",
    "credentials",
    "demo",
    "errors",
    "hooks",
    "integrations",
    "journal",
    "otel",
    "providers",
    "records",
    "sandbox",
    "webhooks",
    "worker",
}


def test_the_top_level_names_are_exactly_these() -> None:
    # Pinned: adding or removing a public name is a decision, with a changelog line.
    assert payonce.__all__ == [
        "AsyncClient",
        "AsyncOperation",
        "AuthenticationError",
        "Client",
        "ConfigurationError",
        "CredentialMismatch",
        "Hooks",
        "IntentError",
        "IntentInFlight",
        "IntentMismatch",
        "IntentRecord",
        "IntentState",
        "IntentStateError",
        "Journal",
        "JournalBusy",
        "JournalError",
        "Operation",
        "OutcomeUnknown",
        "PayonceError",
        "ProviderError",
        "ProviderProfile",
        "ProviderUnavailable",
        "RetryPolicy",
        "WebhookError",
        "WebhookInbox",
        "WebhookSignatureError",
        "__version__",
        "open_journal",
        "register_profile",
        "response_info",
    ]
    assert len(payonce.__all__) <= 30


def test_nothing_private_or_stray_is_in_the_namespace() -> None:
    public = {name for name in vars(payonce) if not name.startswith("_")}
    stray = public - set(payonce.__all__) - PUBLIC_MODULES
    assert not stray, f"names in payonce that are not exported: {sorted(stray)}"


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES - {"cli", "sandbox"}))
def test_every_public_module_exports_real_sorted_names(module: str) -> None:
    loaded = importlib.import_module(f"payonce.{module}")
    assert list(loaded.__all__) == sorted(loaded.__all__)
    for name in loaded.__all__:
        assert hasattr(loaded, name), f"payonce.{module}.{name}"


def test_every_error_is_exported_and_derives_from_the_one_root() -> None:
    for name in payonce.errors.__all__:
        assert getattr(payonce, name) is getattr(payonce.errors, name)
        assert issubclass(getattr(payonce, name), payonce.PayonceError)


def test_there_is_one_exception_root() -> None:
    assert issubclass(payonce.JournalBusy, payonce.JournalError)
    assert issubclass(payonce.IntentMismatch, payonce.IntentError)
    assert issubclass(payonce.OutcomeUnknown, payonce.IntentError)
    assert issubclass(payonce.ConfigurationError, ValueError)


def test_a_name_that_moved_still_works_with_a_warning_saying_where() -> None:
    old_name = "SQLiteJournal"
    with pytest.warns(DeprecationWarning, match=r"payonce\.journal\.SQLiteJournal"):
        moved = getattr(payonce, old_name)
    assert moved is payonce.journal.SQLiteJournal
    with pytest.raises(AttributeError):
        payonce.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


def test_client_options_are_named_in_the_signature() -> None:
    expected = {
        "base_url",
        "provider",
        "account",
        "api_key",
        "journal",
        "retry",
        "timeout",
        "attempt_timeout",
        "key_format",
        "verify",
        "max_stored_response_bytes",
        "in_flight_wait",
        "lease_seconds",
        "allow_plaintext_keyring",
        "hooks",
        "on_retry",
        "clock",
        "transport",
        "transport_only",
        "recovery_keys",
    }
    for cls in (payonce.Client, payonce.AsyncClient):
        parameters = inspect.signature(cls).parameters
        assert set(parameters) == expected
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())


MISTAKES = """
import httpx
import payonce

client = payonce.Client(base_url="https://psp.example", provder="stripe")
client = payonce.Client(base_url="https://psp.example", retry=3)
client = payonce.Client(base_url="https://psp.example", transport=httpx.AsyncHTTPTransport())
client.post("/v1/payments", jsn={"amount": 1})
client.post("/v1/payments", reference=42)
with client.intent("order-1") as op:
    op.post("/v1/payments", json={}, reference="order-1")
    op.patch("/v1/payments/1", params=[1, 2])


async def main() -> None:
    async_client = payonce.AsyncClient(base_url="https://psp.example")
    await async_client.put("/v1/payments/1", header={})
"""


def test_mypy_strict_rejects_typos_and_wrong_types_in_a_users_script(tmp_path: Path) -> None:
    script = tmp_path / "pay.py"
    script.write_text(textwrap.dedent(MISTAKES))
    result = mypy_strict(script)
    errors = {int(line.split(":")[1]) for line in result.stdout.splitlines() if ": error:" in line}
    lines = script.read_text().splitlines()
    wrong = [n for n, line in enumerate(lines, 1) if "payonce.Client(" in line or "post(" in line]
    wrong += [n for n, line in enumerate(lines, 1) if "patch(" in line or "put(" in line]
    assert set(wrong) <= errors, result.stdout


def test_known_vulnerable_releases_are_kept_out_by_the_version_floors() -> None:
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement
    from packaging.version import Version

    floors = {r.name: r.specifier for r in map(Requirement, requires("payonce") or [])}
    for name, vulnerable in [
        ("h11", "0.15.0"),  # CVE-2025-43859
        ("idna", "3.6"),  # CVE-2024-3651
        ("starlette", "0.47.1"),  # CVE-2025-54121, through the sandbox extra
    ]:
        assert not floors[name].contains(Version(vulnerable)), name
        assert floors[name].contains(Version(version(name))), f"installed {name} is allowed"


PRIVATE_WRITES = (
    "claim",
    "claim_key",
    "claim_next_pending",
    "renew_lease",
    "start_attempt",
    "end_attempt",
    "settle",
    "mark_unknown",
    "release",
    "looked_up",
    "reconciled",
    "claim_event",
    "renew_event_lease",
    "finish_event",
    "release_event",
)
"""The writes of payonce's own clients and inbox: never reachable from a public journal."""


def test_a_client_s_journal_is_the_public_journal_and_nothing_more(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    sync = payonce.Client(base_url="http://127.0.0.1:9", api_key="k", journal=path)
    asynchronous = payonce.AsyncClient(base_url="http://127.0.0.1:9", api_key="k", journal=path)
    inbox = payonce.WebhookInbox(path, "whsec_test")
    try:
        for journal in (sync.journal, asynchronous.journal, inbox.journal):
            assert isinstance(journal, payonce.journal.SQLiteJournal)
            assert isinstance(journal, payonce.Journal)
            assert [name for name in PRIVATE_WRITES if hasattr(journal, name)] == []
        opened = payonce.journal.SQLiteJournal(path)
        assert [name for name in PRIVATE_WRITES if hasattr(opened, name)] == []
        opened.close()
    finally:
        sync.close()
        asyncio.run(asynchronous.aclose())
        inbox.close()
