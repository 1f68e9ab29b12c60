"""An intent's key window is judged by the profile it was journaled with, not only by the
built-in profile of its name (red-team r17h finding 2).

The app pays with a shortened profile (``square_profile(key_lifetime=600)``, Mollie with a
30-minute lifetime): still named ``square`` / ``mollie``. ``payonce worker``, ``resume`` and
``reconcile`` rebuild the profile from that name alone; before schema 10 they judged the key
by the built-in one (Square's assumed 24 h, resent for 15 minutes; Mollie's hour) and resent
after the provider had forgotten the key: it executed again. Each intent now journals its
profile's key terms, and the stricter of those and the rebuilt profile's is kept.

The red-team's path, for real: the provider keeps keys as long as the app's profile says; a
child process pays and is SIGKILLed right after its request left; the provider's clock (and
the recovering process's wall clock, through libfaketime) moves past that lifetime; then the
real command runs. The truth is the provider's execution count and the journal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

import payonce
from helpers.cli import CliResult, run_cli_process
from helpers.crash import KILLED, executions_once_arrived, worker_env
from helpers.faketime import libfaketime_env
from helpers.journals import raw_transaction
from helpers.payments import MakeClient
from payonce._journal._schema import KEY_TERMS_SCHEMA, SCHEMA_VERSION
from payonce.providers import get_profile, mollie_profile, square_profile
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxConfig, SandboxServer

SQUARE_PAYMENT = {"source_id": "cnon:ok", "amount_money": {"amount": 1234, "currency": "USD"}}
PAYMENT = {"amount": 4200, "currency": "eur"}


@attrs.frozen
class Shortened:
    """A provider whose keys the app knows to live shorter than the built-in profile says."""

    provider: str
    lifetime: float
    path: str

    def profile(self) -> payonce.ProviderProfile:
        if self.provider == "square":
            return square_profile(key_lifetime=self.lifetime)
        return attrs.evolve(mollie_profile(), key_lifetime=self.lifetime)

    @property
    def payment(self) -> dict[str, object]:
        return SQUARE_PAYMENT if self.provider == "square" else PAYMENT


SQUARE_600 = Shortened("square", 600.0, "/v2/payments")
MOLLIE_1800 = Shortened("mollie", 1800.0, "/v1/payments")

_PAY = """
import json, sys

import attrs
import payonce
from payonce.providers import mollie_profile, square_profile

url, journal, provider, lifetime, path, payment = sys.argv[1:]
if provider == "square":
    profile = square_profile(key_lifetime=float(lifetime))
else:
    profile = attrs.evolve(mollie_profile(), key_lifetime=float(lifetime))
client = payonce.Client(
    base_url=url, provider=profile, account="acct_demo", api_key="sk_test_payonce",
    journal=journal,
)
client.post(path, json=json.loads(payment), reference="order-1")
"""


@contextlib.contextmanager
def _provider(shortened: Shortened) -> Iterator[SandboxServer]:
    config = SandboxConfig.like(
        shortened.provider,  # type: ignore[arg-type]
        key_lifetime=shortened.lifetime,
        processing_seconds=0.05,
    )
    with SandboxServer(config) as server:
        yield server


def _crash_after_send(server: SandboxServer, journal: Path, shortened: Shortened) -> str:
    """The app's payment, its process SIGKILLed right after the request left: executed at
    the provider, pending in the journal. Its key."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _PAY,
            server.url,
            str(journal),
            shortened.provider,
            str(shortened.lifetime),
            shortened.path,
            json.dumps(shortened.payment),
        ],
        env=worker_env("after_send:1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == KILLED, child.stderr[-3000:]
    assert executions_once_arrived(server, 1) == 1
    (key,) = server.store.executions()
    return key


def _state(journal: Path, key: str) -> str:
    with contextlib.closing(sqlite3.connect(journal)) as conn:
        ((state,),) = conn.execute("SELECT state FROM intents WHERE key = ?", (key,))
    return str(state)


def _later(seconds: float, server: SandboxServer, args: list[str]) -> CliResult:
    """``payonce *args`` ``seconds`` from now, by the provider's clock and the command's."""
    server.advance_clock(seconds)
    # The key is sent only for the account it is named with.
    env = {
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT,
        **libfaketime_env(f"+{seconds:.0f}s"),
    }
    return run_cli_process([*args, "--base-url", server.url], env=env)


RECOVERIES = [
    pytest.param(["worker", "--once"], id="worker"),
    pytest.param(["resume"], id="resume"),
]


@pytest.mark.parametrize(
    "shortened",
    [
        pytest.param(SQUARE_600, id="square"),
        pytest.param(MOLLIE_1800, id="mollie", marks=pytest.mark.slow),  # the same path
    ],
)
@pytest.mark.parametrize("command", RECOVERIES)
def test_a_crashed_payment_is_not_resent_past_the_app_s_shortened_key_lifetime(
    journal_path: Path, shortened: Shortened, command: list[str]
) -> None:
    with _provider(shortened) as server:
        key = _crash_after_send(server, journal_path, shortened)

        # Past the app's lifetime (and 90% of it), short of the built-in profile's window.
        result = _later(
            shortened.lifetime + 100, server, [*command, "--journal", str(journal_path)]
        )

        assert server.store.executions() == {key: 1}, result.output
        assert _state(journal_path, key) == "unknown", result.output
    assert f"key_lifetime={shortened.lifetime:g}s" in result.stderr  # the difference, said


def test_reconcile_resend_keeps_to_the_app_s_shortened_key_lifetime(journal_path: Path) -> None:
    # The red-team's operator path: an unknown Square intent, the app's lifetime 1800 s;
    # `reconcile --resend` resent it up to 21.6 h (90% of the built-in's assumed 24 h).
    shortened = Shortened("square", 1800.0, "/v2/payments")
    with _provider(shortened) as server:
        client = payonce.Client(
            base_url=server.url,
            provider=shortened.profile(),
            account="acct_demo",
            api_key=DEFAULT_API_KEY,
            journal=journal_path,
            retry=payonce.RetryPolicy(max_attempts=1, initial_wait=0),
        )
        server.script(["fail_after"])  # executed, then a 503: unknown
        with client, pytest.raises(payonce.OutcomeUnknown):
            client.post(shortened.path, json=shortened.payment, reference="order-1")
        ((key, _),) = server.store.executions().items()

        result = _later(
            1900, server, ["reconcile", key, "--resend", "--journal", str(journal_path)]
        )

        assert result.exit_code == 1, result.output
        assert server.store.executions() == {key: 1}
        assert _state(journal_path, key) == "unknown"
        assert "key lifetime of 1800s" in result.output


def test_the_stricter_terms_are_kept_whichever_side_holds_them() -> None:
    built_in = get_profile("square")  # 24 h, assumed
    journaled = square_profile(key_lifetime=600, key_lifetime_documented=True).key_terms

    judged = built_in.judged_by(journaled)

    assert (judged.name, judged.key_lifetime, judged.key_lifetime_documented) == (
        "square",
        600,
        False,  # documented only where both say so
    )
    assert judged.judged_by(built_in.key_terms) is judged  # already the stricter
    assert built_in.judged_by(None) is built_in  # an intent journaled before schema 10
    slow = attrs.evolve(built_in, max_processing=120.0).key_terms
    assert built_in.judged_by(slow).max_processing == 120.0


def test_the_key_terms_are_journaled_with_each_intent(
    make_client: MakeClient, journal_path: Path
) -> None:
    profile = attrs.evolve(get_profile("sandbox"), key_lifetime=900.0, max_processing=45.0)
    client = make_client(provider=profile)
    client.post("/v1/payments", json=PAYMENT, reference="order-1")

    (record,) = client.journal.find("order-1")

    assert record.key_terms == profile.key_terms


BEFORE_KEY_TERMS = KEY_TERMS_SCHEMA - 1


def _back_to_before_key_terms(location: str) -> None:
    """What the payonce before the key terms left: its intents carry none (nor whether
    they were enqueued, nor their credential's fingerprint and account scope), and are named
    by their first request's endpoint (scope) and reference (schema 10 made that their
    identity, provider and account)."""
    key_terms = ("key_lifetime", "key_lifetime_documented", "max_processing")
    with raw_transaction(location) as tx:
        tx.execute("DROP INDEX intents_outcomes")
        for column in (*key_terms, "enqueued", "credential", "account_scope"):
            tx.execute(f"ALTER TABLE intents DROP COLUMN {column}")
        tx.execute("DROP INDEX intents_identity_reference")
        tx.execute(
            "CREATE UNIQUE INDEX intents_scope_reference ON intents (scope, reference)"
            " WHERE reference IS NOT NULL"
        )
        version = str(BEFORE_KEY_TERMS)
        tx.execute("UPDATE payonce_meta SET value = ? WHERE name = 'schema_version'", (version,))


def test_a_journal_from_before_the_key_terms_opens_migrates_and_replays(
    make_client: MakeClient, sandbox: SandboxServer, location: str
) -> None:
    first = make_client(journal=location)
    paid = first.post("/v1/payments", json=PAYMENT, reference="order-1")
    first.close()
    _back_to_before_key_terms(location)

    with payonce.open_journal(location, read_only=True) as old:  # read as it is
        assert old.schema_version == BEFORE_KEY_TERMS
        (record,) = old.find("order-1")
        assert record.key_terms is None  # judged by the built-in profile, as before
        assert old.get(record.key) == record

    again = make_client(journal=location)  # a writer migrates it on open
    replay = again.post("/v1/payments", json=PAYMENT, reference="order-1")

    assert again.journal.schema_version == SCHEMA_VERSION
    assert replay.content == paid.content
    info = payonce.response_info(replay)
    assert info is not None
    assert info.replayed
    assert sandbox.store.total_executions() == 1
    (migrated,) = again.journal.find("order-1")
    assert migrated.key_terms is None
    later = again.post("/v1/payments", json=PAYMENT, reference="order-2")
    assert later.status_code == paid.status_code
    (journaled,) = again.journal.find("order-2")
    assert journaled.key_terms == get_profile("sandbox").key_terms


def test_a_difference_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    built_in = get_profile("mollie")
    journaled = attrs.evolve(built_in, key_lifetime=1234.0).key_terms
    with caplog.at_level(logging.WARNING, logger="payonce"):
        for _ in range(3):
            built_in.judged_by(journaled)
    said = [r for r in caplog.records if "key_lifetime=1234s" in r.getMessage()]
    assert len(said) == 1
