"""Credentials travel with the intent (issue 27, class 2): a platform with a key per merchant.

A platform sends every merchant's payments with that merchant's own key through one
transport-only payonce client (``StripeClient(merchant_key, http_client=HTTPClient(...))``).
A provider keeps idempotency keys per account: the same key sent with another merchant's
key is a new payment on that merchant's account. So every intent journals the fingerprint
of the credential that sent it (never the secret), and every path that sends again — the
code run again, ``payonce resume``, the worker, ``payonce reconcile`` (its look-ups and
``--resend``) — sends only with the key of that fingerprint; with none at hand the intent
is skipped, named with the fingerprint wanted, and the exit status says so.

The sandbox plays Stripe with three accounts, each known by its key, and keeps idempotency
keys (and PaymentIntents) per account, as Stripe does: a resend under the wrong key would
show as a PaymentIntent on the wrong account.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe

import payonce
import payonce.worker
from helpers.cli import CliResult, run_cli, run_cli_process
from helpers.crash import KILLED, executions_once_arrived, worker_env
from helpers.payments import PAYMENT, DiesAfterSending
from payonce._lifecycle import AttemptRecord, Candidate, choose_credential, credential_in
from payonce._lifecycle._credential import may_rebind
from payonce.credentials import credential_fingerprint
from payonce.integrations.stripe import HTTPClient
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

KEY_A, KEY_B, KEY_PLATFORM = "sk_test_merchant_a_0001", "sk_test_merchant_b_0002", "sk_test_pf_3"
MERCHANT_A, MERCHANT_B, PLATFORM = "acct_merchant_a", "acct_merchant_b", "acct_platform"
SECRETS = (KEY_A, KEY_B, KEY_PLATFORM)
JOURNAL_ACCOUNT = "platform"
"""The payonce account of the platform's one transport-only client: every merchant's."""

_PAY = """
import sys

import stripe

import payonce
import payonce.worker
from payonce.integrations.stripe import HTTPClient

url, journal, merchant_key, order = sys.argv[1:]
payments = payonce.Client(
    base_url=url,
    provider="stripe",
    account="platform",
    journal=journal,
    transport_only=True,
    retry=payonce.RetryPolicy(max_attempts=1, initial_wait=0),
)
merchant = stripe.StripeClient(
    merchant_key, base_addresses={"api": url}, http_client=HTTPClient(payments)
)
with payments.intent(order):
    merchant.v1.payment_intents.create(
        params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
    )
"""


@pytest.fixture
def provider() -> Iterator[SandboxServer]:
    """Stripe with three accounts, each known by its own key."""
    keys = {KEY_A: MERCHANT_A, KEY_B: MERCHANT_B, KEY_PLATFORM: PLATFORM}
    with SandboxServer(SandboxConfig.like("stripe", api_keys=keys)) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "journal.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


def _paid(server: SandboxServer) -> dict[str, int]:
    """PaymentIntents per account: what each account was charged for."""
    counts = {account: len(server.store.account_intents(account)) for account in _ACCOUNTS}
    return {account: count for account, count in counts.items() if count}


_ACCOUNTS = (MERCHANT_A, MERCHANT_B, PLATFORM)


def _killed_in_flight(server: SandboxServer, journal: str, key: str, order: str) -> None:
    """``order`` paid with ``key`` by the platform's code, SIGKILLed right after its request
    left: it executed at the provider, and the journal holds it pending."""
    before = server.store.total_executions()
    child = subprocess.run(
        [sys.executable, "-c", _PAY, server.url, journal, key, order],
        env=worker_env("after_send:1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == KILLED, child.stderr[-3000:]
    assert executions_once_arrived(server, before + 1) == before + 1


def _journaled(journal: str, reference: str) -> payonce.IntentRecord:
    with contextlib.closing(payonce.open_journal(journal)) as opened:
        (record,) = opened.find(reference)
        return record


def _attempts(journal: str, key: str) -> int:
    with contextlib.closing(payonce.open_journal(journal)) as opened:
        return len(opened.attempts(key))


def _recover(command: list[str], server: SandboxServer, journal: str, **env: str) -> CliResult:
    args = [*command, "--journal", journal, "--base-url", server.url, "--provider", "stripe"]
    if command[0] == "worker":  # a process of its own: its log lines are what it says
        return run_cli_process(args, env=env, secrets=SECRETS)
    return run_cli(args, env=env, secrets=SECRETS)


COMMANDS = {
    "resume": ["resume"],
    "worker": ["worker", "--once"],
}


# -- the fingerprint --------------------------------------------------------------------------


def test_a_credential_fingerprint_names_the_key_and_holds_no_part_of_it() -> None:
    fingerprint = credential_fingerprint(KEY_A)

    assert fingerprint.startswith("cred:")
    assert len(fingerprint) == len("cred:") + 16
    assert fingerprint == credential_fingerprint(KEY_A)  # the same key, the same fingerprint
    assert fingerprint != credential_fingerprint(KEY_B)
    for size in range(4, len(KEY_A) + 1):
        for start in range(len(KEY_A) - size + 1):
            assert KEY_A[start : start + size] not in fingerprint


def test_the_one_rule_picks_the_key_of_the_journaled_fingerprint_and_reads_no_further() -> None:
    wanted = credential_fingerprint(KEY_B)
    read: list[str] = []

    def candidates() -> Iterator[Candidate]:
        for source, key in (("own", KEY_A), ("given", KEY_B), ("keyring", KEY_PLATFORM)):
            read.append(source)
            yield Candidate(key, source)

    chosen = choose_credential(wanted, candidates())

    assert chosen is not None
    assert chosen.source == "given"
    assert read == ["own", "given"]  # the keyring, last and slow, was never read
    assert choose_credential(credential_fingerprint("sk_other"), candidates()) is None
    assert choose_credential(None, candidates()) is None  # no key is known to have sent it


def test_a_request_s_credential_is_its_key_whatever_header_carries_it() -> None:
    bearer = {"Authorization": f"Bearer {KEY_A}"}
    assert credential_in(bearer, auth_header="Authorization") == KEY_A
    assert credential_in({"X-API-Key": KEY_A}, auth_header="X-API-Key") == KEY_A
    assert credential_in({"Cookie": "session=1"}, auth_header="Authorization") is None
    basic = {"Authorization": "Basic c2tfdGVzdDo="}  # another form: another credential
    assert credential_in(basic, auth_header="Authorization") == "Basic c2tfdGVzdDo="


def test_only_an_intent_nothing_of_which_reached_the_provider_may_change_hands() -> None:
    refused = AttemptRecord("k", 1, 0.0, 1.0, 401, None, ambiguous=False)
    in_flight = AttemptRecord("k", 2, 2.0, None, None, None, ambiguous=None)
    lost = AttemptRecord("k", 2, 2.0, 3.0, None, "ReadTimeout", ambiguous=True)

    assert may_rebind(True, [])
    assert may_rebind(True, [refused])
    assert not may_rebind(True, [refused, in_flight])
    assert not may_rebind(True, [refused, lost])
    assert not may_rebind(False, [refused])  # settled or unknown: never


def test_the_provider_keeps_idempotency_keys_per_account(provider: SandboxServer) -> None:
    """Why a key must never travel to another account: the same idempotency key sent with
    another merchant's key is a second payment (the sandbox does as Stripe does)."""
    form = {"amount": "2000", "currency": "eur"}
    for key in (KEY_A, KEY_B, KEY_A):
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "order-9"}
        answer = httpx.post(f"{provider.url}/v1/payment_intents", data=form, headers=headers)
        assert answer.status_code == 200, answer.text
    assert _paid(provider) == {MERCHANT_A: 1, MERCHANT_B: 1}


def test_intents_show_names_the_credential_by_its_fingerprint_only(
    provider: SandboxServer, tmp_path: Path
) -> None:
    journal = str(tmp_path / "journal.db")
    with (
        _platform(provider, journal) as payments,
        _merchant(payments, KEY_A, provider.url) as a,
        payments.intent("order-10"),
    ):
        _create(a, "order-10")

    shown = run_cli(["intents", "show", "order-10", "--journal", journal], secrets=SECRETS)
    as_json = run_cli(
        ["intents", "show", "order-10", "--journal", journal, "--json"], secrets=SECRETS
    )

    assert shown.exit_code == 0, shown.output
    assert credential_fingerprint(KEY_A) in shown.stdout
    assert f'"credential": "{credential_fingerprint(KEY_A)}"' in as_json.stdout


# -- a run again of the code ------------------------------------------------------------------


def _merchant_http(payments: payonce.Client, key: str, url: str) -> httpx.Client:
    """A merchant's HTTP client through the platform's one payonce client."""
    return httpx.Client(
        base_url=url,
        transport=payments.transport(),
        headers={"Authorization": f"Bearer {key}"},
    )


def _platform(provider: SandboxServer, journal: str) -> payonce.Client:
    """The platform's one payonce client: transport only, every merchant's requests."""
    return payonce.Client(
        base_url=provider.url,
        provider="stripe",
        account=JOURNAL_ACCOUNT,
        journal=journal,
        transport_only=True,
        retry=payonce.RetryPolicy(max_attempts=1, initial_wait=0),
    )


def _create(merchant: stripe.StripeClient, order: str) -> Any:
    """What the child's code does for ``order`` (the same request, run again)."""
    return merchant.v1.payment_intents.create(
        params={"amount": 2000, "currency": "eur", "metadata": {"order": order}}
    )


@contextlib.contextmanager
def _merchant(payments: payonce.Client, key: str, url: str) -> Iterator[stripe.StripeClient]:
    """A merchant's stripe-python client with its own key, over the platform's client."""
    with contextlib.closing(HTTPClient(payments)) as http_client:
        yield stripe.StripeClient(key, base_addresses={"api": url}, http_client=http_client)


@pytest.mark.slow  # a child process killed
def test_a_run_again_with_another_merchant_s_key_is_refused_before_sending(
    provider: SandboxServer, journal: str
) -> None:
    _killed_in_flight(provider, journal, KEY_A, "order-7")
    pending = _journaled(journal, "order-7")
    assert pending.credential == credential_fingerprint(KEY_A)
    attempts = _attempts(journal, pending.key)

    # The code runs again, this time (a bug, a mixed-up config) with merchant B's key.
    with _platform(provider, journal) as payments:
        with (
            _merchant(payments, KEY_B, provider.url) as merchant_b,
            pytest.raises(stripe.IdempotencyError) as raised,
            payments.intent("order-7"),
        ):
            _create(merchant_b, "order-7")
        error = raised.value.payonce_error  # type: ignore[attr-defined]

        assert isinstance(error, payonce.CredentialMismatch)
        message = str(error)
        assert credential_fingerprint(KEY_A) in message
        assert credential_fingerprint(KEY_B) in message
        assert "nothing was sent" in message
        assert error.journaled == credential_fingerprint(KEY_A)
        assert not any(key in str(raised.value) for key in SECRETS)
        assert _paid(provider) == {MERCHANT_A: 1}
        # The journal holds what it held: pending, its attempts, no lease left behind.
        after = _journaled(journal, "order-7")
        assert (after.state, after.credential) == (pending.state, pending.credential)
        assert after.lease_owner is None
        assert _attempts(journal, after.key) == attempts

        # With merchant A's key, the one that journaled it: completed, paid once, on A's.
        with _merchant(payments, KEY_A, provider.url) as merchant_a, payments.intent("order-7"):
            paid = _create(merchant_a, "order-7")
    assert paid.object == "payment_intent"
    assert _paid(provider) == {MERCHANT_A: 1}


def test_an_intent_nothing_of_which_reached_the_provider_is_the_next_key_s(
    provider: SandboxServer, journal: str
) -> None:
    """A key refused before anything executed (here a 429; a wrong key's 401 alike): no
    account holds anything under the intent's key, so the code run again with another key
    takes it over, journaled with that key from now on."""
    with _platform(provider, journal) as payments:
        provider.script(["rate_limit"])
        with (
            _merchant(payments, KEY_A, provider.url) as merchant_a,
            pytest.raises(stripe.APIConnectionError),
            payments.intent("order-8"),
        ):
            _create(merchant_a, "order-8")
        assert _journaled(journal, "order-8").credential == credential_fingerprint(KEY_A)

        with _merchant(payments, KEY_B, provider.url) as merchant_b, payments.intent("order-8"):
            _create(merchant_b, "order-8")
    assert _journaled(journal, "order-8").credential == credential_fingerprint(KEY_B)
    assert _paid(provider) == {MERCHANT_B: 1}


# -- recovery: resume and the worker ----------------------------------------------------------


@pytest.mark.slow  # a child process killed, four recoveries
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_killed_payment_is_recovered_only_with_the_key_that_sent_it(
    provider: SandboxServer, journal: str, command: str
) -> None:
    _killed_in_flight(provider, journal, KEY_A, "order-a1")
    wanted = credential_fingerprint(KEY_A)
    record = _journaled(journal, "order-a1")
    assert (record.state, record.credential) == (payonce.IntentState.PENDING, wanted)
    assert _paid(provider) == {MERCHANT_A: 1}
    named = ["--account", JOURNAL_ACCOUNT]

    # The other merchant's key, and the platform's own, given for the account: skipped.
    for other in (KEY_B, KEY_PLATFORM):
        result = _recover([*COMMANDS[command], *named], provider, journal, PAYONCE_API_KEY=other)
        assert result.exit_code == 1, result.output
        assert record.key in result.stderr + result.stdout
        assert wanted in result.stderr + result.stdout
        assert "no key here has that fingerprint" in result.stderr + result.stdout
    # The environment key without an account named, and no key at all: not driven, the
    # fingerprint its intents want named.
    for env in ({"PAYONCE_API_KEY": KEY_B}, {}):
        result = _recover(COMMANDS[command], provider, journal, **env)
        assert result.exit_code in (1, 2), result.output  # the worker: 2, nothing driven
        assert f"no API key for account {JOURNAL_ACCOUNT!r}" in result.stderr
        assert f"sent with credential(s) {wanted}" in result.stderr

    # Never sent under a key that did not journal it: nothing on B's or the platform's
    # account, and the journal holds what it held.
    assert _paid(provider) == {MERCHANT_A: 1}
    left = _journaled(journal, "order-a1")
    assert (left.state, left.lease_owner) == (payonce.IntentState.PENDING, None)

    # The right key: completed once (the provider replays what it executed).
    result = _recover([*COMMANDS[command], *named], provider, journal, PAYONCE_API_KEY=KEY_A)
    assert result.exit_code == 0, result.output
    assert _journaled(journal, "order-a1").state is payonce.IntentState.SUCCEEDED
    assert _paid(provider) == {MERCHANT_A: 1}


@pytest.mark.slow  # two child processes killed, two recoveries
def test_the_platform_recovers_each_merchant_s_payment_with_that_merchant_s_key(
    provider: SandboxServer, journal: str
) -> None:
    _killed_in_flight(provider, journal, KEY_A, "order-a2")
    _killed_in_flight(provider, journal, KEY_B, "order-b2")
    merchant_keys = {MERCHANT_A: KEY_A, MERCHANT_B: KEY_B}
    asked: list[str | None] = []

    def candidates(record: payonce.IntentRecord) -> list[str]:
        asked.append(record.reference)
        return list(merchant_keys.values())  # the platform's own store of merchant keys

    # The worker, given only merchant B's key: A's payment is skipped, named.
    with payonce.worker.Worker(
        journal=journal, base_url=provider.url, provider="stripe", recovery_keys=[KEY_B]
    ) as worker:
        ended = worker.run_pass()
    assert (ended.settled, ended.failed) == (1, 1)
    assert _journaled(journal, "order-a2").state is payonce.IntentState.PENDING
    assert _journaled(journal, "order-b2").state is payonce.IntentState.SUCCEEDED

    # The platform's transport-only client, handed every merchant's key: each is sent with
    # its own.
    with payonce.Client(
        base_url=provider.url,
        provider="stripe",
        account=JOURNAL_ACCOUNT,
        journal=journal,
        transport_only=True,
        recovery_keys=candidates,
    ) as payments:
        (resumed,) = payments.resume()
    assert (resumed.reference, resumed.state) == ("order-a2", payonce.IntentState.SUCCEEDED)
    assert asked == ["order-a2"]
    assert _paid(provider) == {MERCHANT_A: 1, MERCHANT_B: 1}


# -- reconciliation: look-ups and --resend ----------------------------------------------------


def _unknown(provider: SandboxServer, journal: str, key: str, order: str) -> payonce.IntentRecord:
    """``order`` paid with ``key``, its answer lost on every attempt: unknown."""
    payments = _platform(provider, journal)
    provider.script(["drop_after"])
    with (
        payments,
        _merchant_http(payments, key, provider.url) as merchant,
        pytest.raises(payonce.OutcomeUnknown),
        payments.intent(order),
    ):
        merchant.post(
            "/v1/payment_intents",
            data={"amount": "2000", "currency": "eur", "metadata[order]": order},
        )
    provider.wait_idle()
    record = _journaled(journal, order)
    assert record.state is payonce.IntentState.UNKNOWN
    return record


def _reconciliations(journal: str, key: str) -> list[Any]:
    with contextlib.closing(payonce.open_journal(journal)) as opened:
        return list(opened.reconciliations(key))


@pytest.mark.slow  # two reconciliations, each a client of its own
@pytest.mark.parametrize("resend", [[], ["--resend"]], ids=["look-up", "resend"])
def test_an_unknown_payment_is_never_looked_up_or_resent_under_another_merchant_s_key(
    provider: SandboxServer, journal: str, resend: list[str]
) -> None:
    record = _unknown(provider, journal, KEY_A, "order-a3")
    asked_before = _reconciliations(journal, record.key)
    assert _paid(provider) == {MERCHANT_A: 1}
    command = ["reconcile", "--all", *resend, "--account", JOURNAL_ACCOUNT, "--json"]

    result = _recover(command, provider, journal, PAYONCE_API_KEY=KEY_B)

    # Under B's key the look-up would answer "no such payment" (it searches B's account):
    # read as absent, it would be resent. It is skipped instead, named, and never asked.
    assert result.exit_code == 1, result.output
    assert '"outcome": "skipped"' in result.stdout
    assert credential_fingerprint(KEY_A) in result.stdout
    assert _reconciliations(journal, record.key) == asked_before
    assert _journaled(journal, "order-a3").state is payonce.IntentState.UNKNOWN
    assert _paid(provider) == {MERCHANT_A: 1}

    result = _recover(command, provider, journal, PAYONCE_API_KEY=KEY_A)
    assert result.exit_code == 0, result.output
    assert _journaled(journal, "order-a3").state is payonce.IntentState.SUCCEEDED
    assert _paid(provider) == {MERCHANT_A: 1}


def test_a_look_up_under_another_account_s_key_is_never_read_as_absent(
    provider: SandboxServer, tmp_path: Path
) -> None:
    journal = str(tmp_path / "journal.db")
    record = _unknown(provider, journal, KEY_A, "order-a4")
    asked_before = _reconciliations(journal, record.key)
    with payonce.Client(
        base_url=provider.url,
        provider="stripe",
        account=JOURNAL_ACCOUNT,
        api_key=KEY_B,
        journal=journal,
    ) as other:
        (result,) = other.reconcile("order-a4")

    assert result.outcome == "skipped"
    assert result.after is payonce.IntentState.UNKNOWN
    assert credential_fingerprint(KEY_A) in result.detail
    assert _reconciliations(journal, record.key) == asked_before  # nothing was asked


@pytest.mark.anyio
async def test_the_async_client_looks_up_only_with_the_key_that_sent_it(
    provider: SandboxServer, tmp_path: Path
) -> None:
    journal = str(tmp_path / "journal.db")
    record = _unknown(provider, journal, KEY_A, "order-a5")
    asked_before = _reconciliations(journal, record.key)
    options: dict[str, Any] = {
        "base_url": provider.url,
        "provider": "stripe",
        "account": JOURNAL_ACCOUNT,
        "journal": journal,
    }

    async with payonce.AsyncClient(**options, api_key=KEY_B) as other:
        (skipped,) = await other.reconcile("order-a5")
    assert (skipped.outcome, skipped.after) == ("skipped", payonce.IntentState.UNKNOWN)
    assert _reconciliations(journal, record.key) == asked_before

    async with payonce.AsyncClient(**options, transport_only=True, recovery_keys=[KEY_A]) as own:
        (found,) = await own.reconcile("order-a5")
    assert (found.outcome, found.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert _paid(provider) == {MERCHANT_A: 1}


def test_a_connected_account_s_intent_is_looked_up_in_that_account(tmp_path: Path) -> None:
    """A platform's request for a connected account (``Stripe-Account``) journals that
    account scope, and its look-up asks that account: asked of the platform's own, it would
    find nothing, and "nothing" would read as never executed. (A unit of one decision: the
    sandbox has no connected accounts, so the provider is a MockTransport.)"""
    seen: list[httpx.Request] = []

    def stripe_api(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return httpx.Response(200, json={"object": "search_result", "data": []})

    with payonce.Client(
        base_url="https://api.stripe.test",
        provider="stripe",
        api_key=KEY_PLATFORM,
        journal=str(tmp_path / "journal.db"),
        retry=payonce.RetryPolicy(max_attempts=1, initial_wait=0),
        transport=httpx.MockTransport(stripe_api),
    ) as platform:
        with pytest.raises(payonce.OutcomeUnknown):
            platform.post(
                "/v1/payment_intents",
                data={"amount": "2000", "currency": "eur"},
                headers={"Stripe-Account": "acct_connected_1"},
                reference="order-c1",
            )
        (record,) = platform.journal.find("order-c1")
        assert record.account_scope == "stripe-account: acct_connected_1"
        assert record.credential == credential_fingerprint(KEY_PLATFORM)
        platform.reconcile("order-c1")

    lookups = [r for r in seen if r.method == "GET"]
    assert lookups, "the intent was looked up"
    assert all(r.headers.get("stripe-account") == "acct_connected_1" for r in lookups)


# -- an intent enqueued by a service that holds no key ----------------------------------------


def test_an_intent_enqueued_without_a_key_takes_the_first_sender_s_and_no_other_after(
    make_client: Any, sandbox: SandboxServer
) -> None:
    """A service that only enqueues holds no API key (docs/outbox.md): its intent journals
    no credential. The first process that sends it binds its own key before sending; from
    then on only that key sends it again, as for any intent."""
    service = make_client(api_key=None, transport_only=True)
    enqueued = service.enqueue(
        "POST", "/v1/payments", json=PAYMENT, reference="order-e1", connection=None
    )
    assert enqueued.credential is None

    first = make_client(transport=DiesAfterSending())  # the sandbox's key: the worker's
    (died,) = first.resume()
    assert "RuntimeError" in died.detail  # sent, then the process died before the answer
    bound = first.journal.get(enqueued.key)
    assert bound.state is payonce.IntentState.PENDING
    assert bound.credential == credential_fingerprint(DEFAULT_API_KEY)

    other = make_client(api_key="sk_test_another_merchant_key")
    (skipped,) = other.resume()
    assert skipped.state is payonce.IntentState.PENDING
    assert bound.credential in skipped.detail
    assert sandbox.store.executions() == {enqueued.key: 1}  # the other key sent nothing

    (finished,) = make_client(api_key=DEFAULT_API_KEY).resume()
    assert finished.state is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {enqueued.key: 1}


def test_an_intent_enqueued_without_a_key_and_no_key_to_send_it_waits_for_one(
    make_client: Any, sandbox: SandboxServer
) -> None:
    """Never sent, it is not to be abandoned: the operator is told to give a key."""
    service = make_client(api_key=None, transport_only=True)
    enqueued = service.enqueue(
        "POST", "/v1/payments", json=PAYMENT, reference="order-e2", connection=None
    )
    keyless = make_client(api_key=None, transport_only=True, recovery_keys=[])

    (skipped,) = keyless.resume()

    assert skipped.state is payonce.IntentState.PENDING
    assert "never sent" in skipped.detail
    assert "abandon" not in skipped.detail
    assert keyless.journal.get(enqueued.key).credential is None
    assert sandbox.store.executions() == {}
