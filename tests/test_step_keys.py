"""A key the caller's code sets on step 2 or later of a block (stripe-python's
``idempotency_key``, an ``Idempotency-Key`` header through ``client.transport()``, Adyen's
``idempotency_key=``) is bound to that step's position on the first run, as a reference
binds step 1: the same code run again with a key drawn per call (a uuid4) is refused
before anything is sent, instead of paying that step once per run; a key derived from the
order replays.

Against the sandbox's Stripe and Adyen dialects over loopback, through the SDKs
themselves, on a real journal file; the crash is a real child process SIGKILLed.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import Adyen
import httpx
import pytest
import stripe

import payonce
from helpers.cli import run_cli
from helpers.payments import MakeClient, payonce_options
from helpers.processes import python_env
from helpers.sandboxes import SharedSandboxes
from helpers.stripe_sdk import stripe_over
from payonce.integrations import adyen as adyen_integration
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

ORDER = {"amount": "4200", "currency": "eur", "payment_method": "pm_card_visa"}
TIP = {"amount": "300", "currency": "eur", "payment_method": "pm_card_visa"}


def _options(
    server: SandboxServer, provider: str, journal: str | Path, **more: Any
) -> dict[str, Any]:
    return {**payonce_options(server, provider, journal), **more}


@pytest.fixture
def stripe_server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("step keys stripe", SandboxConfig.like("stripe"))


@pytest.fixture
def adyen_server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("step keys adyen", SandboxConfig.like("adyen"))


def _tips(server: SandboxServer, order: str) -> list[dict[str, Any]]:
    return [
        i
        for i in server.store.payment_intents()
        if i["metadata"].get("order") == order and i["amount"] == 300
    ]


# -- stripe-python --------------------------------------------------------------------------


@pytest.fixture
def backend() -> str:
    """The journal's store where a test does not ask for each (``location``)."""
    return "sqlite"


@pytest.fixture
def stripe_run(
    stripe_server: SandboxServer, location: str, closing: contextlib.ExitStack
) -> Callable[[str, str | None], stripe.PaymentIntent]:
    """One run of a shop's checkout with a tip: a new process would build the same, and
    close its client when it ends (which writes the block's acknowledgements: read by
    another journal object meanwhile, they would appear a moment later, by the flusher)."""

    def run(order: str, tip_key: str | None) -> stripe.PaymentIntent:
        with payonce.Client(**_options(stripe_server, "stripe", location)) as client:
            return checkout(client, order, tip_key)

    def checkout(client: payonce.Client, order: str, tip_key: str | None) -> stripe.PaymentIntent:
        sdk = stripe_over(client, stripe_server, closing)
        with client.intent(order):
            sdk.v1.payment_intents.create(
                params={"amount": 4200, "currency": "eur", "metadata": {"order": order}}
            )
            tip_options: Any = {} if tip_key is None else {"idempotency_key": tip_key}
            return sdk.v1.payment_intents.create(
                params={"amount": 300, "currency": "eur", "metadata": {"order": order}},
                options=tip_options,
            )

    return run


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_stripe_python_step_keyed_with_a_fresh_uuid4_is_refused_when_the_block_runs_again(
    stripe_server: SandboxServer,
    stripe_run: Callable[[str, str | None], stripe.PaymentIntent],
    location: str,
) -> None:
    first_key = str(uuid.uuid4())
    stripe_run("order-tip-uuid", first_key)
    journal = payonce.open_journal(location)
    before = journal.list_intents()

    second_key = str(uuid.uuid4())
    with pytest.raises(stripe.IdempotencyError) as refused:
        stripe_run("order-tip-uuid", second_key)
    message = str(refused.value)
    assert "step 2 of intent 'order-tip-uuid'" in message
    assert f"journaled under key {first_key} (a key your code set)" in message
    assert f"this run's code sets {second_key}" in message
    assert "Derive it from the order" in message
    mismatch = refused.value.payonce_error  # type: ignore[attr-defined]
    assert isinstance(mismatch, payonce.IntentMismatch)
    assert (mismatch.key, mismatch.reference, mismatch.step) == (first_key, "order-tip-uuid", 2)
    # Nothing sent, nothing journaled: one tip, the journal as it was.
    assert len(_tips(stripe_server, "order-tip-uuid")) == 1
    assert second_key not in stripe_server.store.executions()
    assert journal.list_intents() == before
    journal.close()


def test_a_stripe_python_step_keyed_from_the_order_is_replayed_when_the_block_runs_again(
    stripe_server: SandboxServer, stripe_run: Callable[[str, str | None], stripe.PaymentIntent]
) -> None:
    tip = stripe_run("order-tip-own", "order-tip-own-tip")
    again = stripe_run("order-tip-own", "order-tip-own-tip")
    assert again.id == tip.id
    assert len(_tips(stripe_server, "order-tip-own")) == 1
    assert stripe_server.store.executions()["order-tip-own-tip"] == 1


def test_a_step_first_keyed_by_payonce_is_refused_when_the_code_now_sets_a_key_of_its_own(
    stripe_server: SandboxServer, stripe_run: Callable[[str, str | None], stripe.PaymentIntent]
) -> None:
    stripe_run("order-tip-later", None)
    with pytest.raises(stripe.IdempotencyError, match=r"-step2 \(payonce's key for it\)"):
        stripe_run("order-tip-later", "order-tip-later-tip")
    assert len(_tips(stripe_server, "order-tip-later")) == 1


# -- httpx through client.transport() -------------------------------------------------------


def test_an_idempotency_key_header_drawn_per_call_on_step_2_is_refused_on_a_run_again(
    stripe_server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> None:
    def run(order: str) -> httpx.Response:
        client = closing.enter_context(
            payonce.Client(**_options(stripe_server, "stripe", journal_path))
        )
        http = closing.enter_context(
            httpx.Client(
                base_url=stripe_server.url,
                transport=client.transport(),
                headers={"Authorization": f"Bearer {DEFAULT_API_KEY}"},
            )
        )
        with client.intent(order):
            http.post("/v1/payment_intents", data={**ORDER, "metadata[order]": order})
            return http.post(
                "/v1/payment_intents",
                data={**TIP, "metadata[order]": order},
                headers={"Idempotency-Key": str(uuid.uuid4())},
            )

    assert run("order-httpx-tip").status_code == 200
    with pytest.raises(payonce.IntentMismatch, match="step 2 of intent 'order-httpx-tip'"):
        run("order-httpx-tip")
    assert len(_tips(stripe_server, "order-httpx-tip")) == 1

    # The journal lists the step with its intent, by its reference of its own.
    client = closing.enter_context(
        payonce.Client(**_options(stripe_server, "stripe", journal_path))
    )
    (intent,) = client.journal.find("order-httpx-tip")
    (step,) = client.journal.steps(intent.key)
    assert step.reference == "order-httpx-tip#step2"
    shown = run_cli(["intents", "show", step.key, "--journal", str(journal_path)])
    assert shown.exit_code == 0, shown.stderr
    assert f"step 2 of intent {intent.key} (reference order-httpx-tip)" in shown.stdout


# -- Adyen ----------------------------------------------------------------------------------


def _adyen(server: SandboxServer) -> Adyen.Adyen:
    adyen = Adyen.Adyen(xapikey=DEFAULT_API_KEY, platform="test")
    for api in (adyen.checkout.payments_api, adyen.checkout.modifications_api):
        api.baseUrl = api.baseUrl.replace("https://checkout-test.adyen.com", server.url)
    return adyen


def test_an_adyen_capture_keyed_with_a_fresh_uuid4_is_refused_when_the_block_runs_again(
    adyen_server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> None:
    def run() -> Any:
        adyen = _adyen(adyen_server)
        client = closing.enter_context(
            payonce.Client(
                **_options(
                    adyen_server,
                    "adyen",
                    journal_path,
                    base_url=adyen.checkout.payments_api.baseUrl,
                )
            )
        )
        adyen_integration.use_transport(adyen, client)  # honour the caller's keys
        closing.callback(adyen.client.http_client.close)
        with client.intent("order-adyen-uuid"):
            paid = adyen.checkout.payments_api.payments(
                {
                    "amount": {"value": 1000, "currency": "EUR"},
                    "reference": "order-adyen-uuid",
                    "merchantAccount": "PayonceShop",
                    "paymentMethod": {
                        "type": "scheme",
                        "encryptedCardNumber": "test_4111111111111111",
                    },
                    "returnUrl": "https://shop.example/return",
                }
            )
            return adyen.checkout.modifications_api.capture_authorised_payment(
                {"merchantAccount": "PayonceShop", "amount": {"value": 1000, "currency": "EUR"}},
                paid.message["pspReference"],
                idempotency_key=str(uuid.uuid4()),
            )

    assert run().message["status"] == "received"
    executed = dict(adyen_server.store.executions())
    with pytest.raises(Exception, match="step 2 of intent 'order-adyen-uuid'") as refused:
        run()
    assert isinstance(
        getattr(refused.value, "payonce_error", refused.value), payonce.IntentMismatch
    )
    assert adyen_server.store.executions() == executed
    assert sorted(executed.values()) == [1, 1]


# -- a crash between the steps --------------------------------------------------------------

_WORKER = """
import os, signal, sys, uuid
import httpx, payonce

url, journal, order, api_key = sys.argv[1:5]
client = payonce.Client(base_url=url, provider="stripe", account="acct_shop", journal=journal,
                        transport_only=True)
http = httpx.Client(base_url=url, transport=client.transport(),
                    headers={"Authorization": f"Bearer {api_key}"})
with client.intent(order):
    http.post("/v1/payment_intents", data={"amount": "4200", "currency": "eur",
                                           "metadata[order]": order})
    http.post("/v1/payment_intents", data={"amount": "300", "currency": "eur",
                                           "metadata[order]": order},
              headers={"Idempotency-Key": str(uuid.uuid4())})
    print("step 2 answered", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_block_killed_after_a_uuid4_keyed_step_and_run_again_is_refused_not_paid_again(
    stripe_server: SandboxServer, journal_path: Path, tmp_path: Path
) -> None:
    script = tmp_path / "tip_worker.py"
    script.write_text(_WORKER)
    command = [sys.executable, str(script), stripe_server.url, str(journal_path), "order-killed"]
    command.append(DEFAULT_API_KEY)
    for _ in range(2):
        done = subprocess.run(
            command, env=python_env(), capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != -signal.SIGKILL:
            break
        assert "step 2 answered" in done.stdout
    # The first run was killed between its steps' end and the block's; the second is
    # refused at step 2 (a traceback, exit 1) before anything is sent.
    assert done.returncode == 1, done.stderr
    assert "IntentMismatch" in done.stderr
    assert "step 2 of intent 'order-killed'" in done.stderr
    assert len(_tips(stripe_server, "order-killed")) == 1
    journal = payonce.open_journal(journal_path)
    (intent,) = journal.find("order-killed")
    assert [s.state for s in journal.steps(intent.key)] == [payonce.IntentState.SUCCEEDED]
    journal.close()


# -- a status look-up by reference ----------------------------------------------------------


@pytest.fixture
def by_reference(monkeypatch: pytest.MonkeyPatch) -> str:
    """A provider profile that looks intents up by their reference (forgotten after)."""
    from payonce._providers import _profile

    monkeypatch.setattr(_profile, "_REGISTRY", dict(_profile._REGISTRY))
    lookup = payonce.providers.Lookup(path="/v1/payments", by="reference", param="reference")
    payonce.register_profile(payonce.ProviderProfile(name="by-reference", lookup=lookup))
    return "by-reference"


def test_a_step_is_never_looked_up_by_its_own_reference_which_the_provider_does_not_know(
    make_client: MakeClient, sandbox: SandboxServer, by_reference: str
) -> None:
    client = make_client(provider=by_reference, retry=payonce.RetryPolicy(max_attempts=1))
    payment = {"amount": 4200, "currency": "eur", "reference": "order-looked-up"}
    with client.intent("order-looked-up") as op:
        op.post("/v1/payments", json=payment)
        sandbox.script(["drop_after"])  # step 2 executes; its answer is lost
        with pytest.raises(payonce.OutcomeUnknown):
            op.post("/v1/payments", json={**payment, "amount": 300})
    step_key = op.steps[1][1]
    assert step_key is not None

    (result,) = client.reconcile(step_key)
    assert result.after is payonce.IntentState.UNKNOWN  # not "never executed", not resent
    assert "is a later step of a block" in (result.detail or "")
    assert "'order-looked-up#step2' is payonce's own" in (result.detail or "")
    assert sandbox.store.executions()[step_key] == 1
