"""payonce.integrations.requests: a requests.Session that talks through an httpx transport.

The inner transport is httpx's own (``httpx.HTTPTransport``) and the server the real sandbox
on loopback, so what is proved is the conversion both ways: what requests prepares reaches
the server as sent, what the server answers reaches the requests caller as answered, and
transport failures arrive as the requests exceptions requests-based code catches.
"""

from __future__ import annotations

import contextlib
import json
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests

import payonce
from helpers.payments import FAST_RETRY
from helpers.processes import python_output
from helpers.sandboxes import SharedSandboxes
from payonce.integrations.requests import TransportAdapter
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

AUTH = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        adapter = TransportAdapter(httpx.HTTPTransport())
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        yield session


def test_a_payment_created_and_read_back_through_the_adapter(
    session: requests.Session, sandbox: SandboxServer
) -> None:
    key = str(uuid.uuid4())
    created = session.post(
        f"{sandbox.url}/v1/payments",
        json={"amount": 1250, "currency": "eur", "reference": "order-1"},
        headers={**AUTH, "Idempotency-Key": key},
        timeout=5,
    )
    assert created.status_code == 201
    assert created.headers["content-type"] == "application/json"
    assert created.encoding is None or created.encoding.lower() == "utf-8"
    assert created.url == f"{sandbox.url}/v1/payments"
    assert created.request.headers["Idempotency-Key"] == key
    payment = created.json()
    assert (payment["amount"], payment["reference"], payment["idempotency_key"]) == (
        1250,
        "order-1",
        key,
    )

    found = session.get(f"{sandbox.url}/v1/payments/{payment['id']}", headers=AUTH, timeout=5)
    assert found.ok
    assert found.json() == payment
    assert sandbox.store.execution_count(key) == 1


def test_a_form_body_a_query_and_a_refusal_arrive_as_sent_and_answered(
    session: requests.Session, sandbox: SandboxServer
) -> None:
    refused = session.post(
        f"{sandbox.url}/v1/payments",
        data={"amount": "12", "currency": "eur"},  # the default sandbox takes JSON only
        headers={**AUTH, "Idempotency-Key": "k-form"},
        timeout=5,
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request"
    with pytest.raises(requests.HTTPError):
        refused.raise_for_status()

    listed = session.get(
        f"{sandbox.url}/v1/payments", params={"reference": "none such"}, headers=AUTH, timeout=5
    )
    assert listed.json() == {"object": "list", "data": []}
    assert sandbox.store.total_executions() == 0


def test_a_streamed_answer_is_read_in_chunks(
    session: requests.Session, sandbox: SandboxServer
) -> None:
    answer = session.get(
        f"{sandbox.url}/v1/payments", params={"reference": "r"}, headers=AUTH, stream=True
    )
    body = b"".join(answer.iter_content(chunk_size=3))
    answer.close()
    assert json.loads(body) == {"object": "list", "data": []}


def test_a_dropped_answer_fails_as_it_does_with_requests_own_adapter(
    session: requests.Session, sandbox: SandboxServer
) -> None:
    def create(through: requests.Session, key: str) -> None:
        through.post(
            f"{sandbox.url}/v1/payments",
            json={"amount": 500, "currency": "eur"},
            headers={**AUTH, "Idempotency-Key": key},
            timeout=5,
        )

    sandbox.script(["drop_after", "drop_after"])
    with pytest.raises(requests.exceptions.RequestException) as through_adapter:
        create(session, "k-drop-adapter")
    with requests.Session() as plain, pytest.raises(requests.RequestException) as plainly:
        create(plain, "k-drop-plain")
    # The body cut halfway: requests' own adapter says ChunkedEncodingError, and so does ours.
    assert type(through_adapter.value) is type(plainly.value)
    assert isinstance(through_adapter.value, requests.exceptions.ChunkedEncodingError)
    assert sandbox.store.execution_count("k-drop-adapter") == 1


def test_nobody_listening_is_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port once the socket is closed.
    with requests.Session() as session:
        session.mount("http://", TransportAdapter(httpx.HTTPTransport()))
        with pytest.raises(requests.exceptions.ConnectionError) as caught:
            session.get(f"http://127.0.0.1:{port}/v1/payments", timeout=2)
    assert not isinstance(caught.value, requests.exceptions.Timeout)


def test_a_slow_answer_is_a_read_timeout(
    session: requests.Session, make_sandbox: Callable[..., SandboxServer]
) -> None:
    slow = make_sandbox(processing_seconds=1.0)
    with pytest.raises(requests.exceptions.ReadTimeout):
        session.post(
            f"{slow.url}/v1/payments",
            json={"amount": 500, "currency": "eur"},
            headers={**AUTH, "Idempotency-Key": "k-slow"},
            timeout=(2, 0.2),
        )
    slow.wait_idle()


def test_a_payonce_error_from_the_transport_goes_up_unchanged() -> None:
    class Refusing(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            raise payonce.OutcomeUnknown(
                "no answer", key="k-1", reference="order-1", reason="lost answer"
            )

    with requests.Session() as session:
        session.mount("https://", TransportAdapter(Refusing()))
        with pytest.raises(payonce.OutcomeUnknown) as caught:
            session.post("https://psp.example/v1/payments", json={})
    assert caught.value.key == "k-1"


def test_an_async_transport_is_refused_with_a_clear_error() -> None:
    with pytest.raises(TypeError, match="synchronous httpx transport"):
        TransportAdapter(httpx.AsyncHTTPTransport())  # type: ignore[arg-type]


def test_closing_the_session_closes_the_transport() -> None:
    class Recording(httpx.HTTPTransport):
        closed = False

        def close(self) -> None:
            self.closed = True
            super().close()

    transport = Recording()
    session = requests.Session()
    session.mount("http://", TransportAdapter(transport))
    session.close()
    assert transport.closed


# -- Client.requests_adapter(): payonce under a requests.Session --------------------------------

STRIPE_ORDER = {"amount": "4200", "currency": "eur", "payment_method": "pm_card_visa"}
STRIPE_AUTH = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}


@pytest.fixture
def stripe_like(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("stripe steps", SandboxConfig.like("stripe"))


@pytest.fixture
def stripe_payonce(
    stripe_like: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> Callable[..., payonce.Client]:
    """payonce clients used only through their requests adapter, on the test's journal."""

    def make(**overrides: Any) -> payonce.Client:
        options = {
            "base_url": stripe_like.url,
            "provider": "stripe",
            "account": "acct_shop",
            "journal": journal_path,
            "retry": FAST_RETRY,
            "timeout": 5.0,
            "transport_only": True,
            **overrides,
        }
        return closing.enter_context(payonce.Client(**options))

    return make


def mounted(
    client: payonce.Client, closing: contextlib.ExitStack, **options: Any
) -> requests.Session:
    session = closing.enter_context(requests.Session())
    session.headers.update(STRIPE_AUTH)
    session.mount("http://", client.requests_adapter(**options))
    return session


def requests_checkout(
    session: requests.Session, url: str, order: str, key: Callable[[], str] | None = None
) -> tuple[requests.Response, requests.Response]:
    """A shop's checkout on requests: create the PaymentIntent, then confirm it."""

    def keys() -> dict[str, str]:
        return {} if key is None else {"Idempotency-Key": key()}

    created = session.post(
        f"{url}/v1/payment_intents",
        data={**STRIPE_ORDER, "metadata[order]": order},
        headers=keys(),
        timeout=5,
    )
    created.raise_for_status()
    confirmed = session.post(
        f"{url}/v1/payment_intents/{created.json()['id']}/confirm", headers=keys(), timeout=5
    )
    return created, confirmed


def test_a_requests_checkout_through_the_client_s_adapter_retries_a_lost_answer_under_one_key(
    stripe_like: SandboxServer,
    stripe_payonce: Callable[..., payonce.Client],
    closing: contextlib.ExitStack,
) -> None:
    client = stripe_payonce()
    session = mounted(client, closing)
    with client.intent("order-1") as op:
        stripe_like.script(["drop_after"])  # step 1 executes, its answer is lost
        created, confirmed = requests_checkout(session, stripe_like.url, "order-1")
    assert created.json()["object"] == "payment_intent"  # never an empty body
    assert confirmed.json()["status"] == "succeeded"
    keys = [key for _, key, _ in op.steps]
    assert stripe_like.store.executions() == {key: 1 for key in keys}

    # Run again (another session, another client on the same journal): both steps replay.
    again_client = stripe_payonce()
    with again_client.intent("order-1"):
        again = requests_checkout(mounted(again_client, closing), stripe_like.url, "order-1")
    assert [r.json() for r in again] == [created.json(), confirmed.json()]
    assert stripe_like.store.executions() == {key: 1 for key in keys}
    assert len(stripe_like.store.payment_intents()) == 1


def test_the_adapter_replaces_a_key_drawn_per_call_when_told_to(
    stripe_like: SandboxServer,
    stripe_payonce: Callable[..., payonce.Client],
    closing: contextlib.ExitStack,
) -> None:
    def run() -> requests.Response:
        client = stripe_payonce()
        session = mounted(client, closing, sdk_keys="replace")
        with client.intent("order-2"):
            fresh = lambda: str(uuid.uuid4())  # noqa: E731  # as requests-based SDKs draw keys
            return requests_checkout(session, stripe_like.url, "order-2", fresh)[1]

    stripe_like.script(["none", "fail_after"])
    paid = run()
    assert run().json() == paid.json()
    assert sorted(stripe_like.store.executions().values()) == [1, 1]
    assert len(stripe_like.store.payment_intents()) == 1


def test_the_adapter_raises_payonce_s_own_errors_and_refuses_outside_a_block_when_told(
    stripe_like: SandboxServer,
    stripe_payonce: Callable[..., payonce.Client],
    closing: contextlib.ExitStack,
    journal_path: Path,
) -> None:
    client = stripe_payonce()
    session = mounted(client, closing, outside_intent="refuse")
    before = journal_path.read_bytes()
    with pytest.raises(payonce.ConfigurationError, match="outside any intent block"):
        session.post(f"{stripe_like.url}/v1/payment_intents", data=STRIPE_ORDER, timeout=5)
    assert stripe_like.store.total_executions() == 0
    assert journal_path.read_bytes() == before  # nothing journaled either

    stripe_like.script(["none", *["fail_before"] * FAST_RETRY.max_attempts])
    with client.intent("order-3"), pytest.raises(payonce.OutcomeUnknown) as unknown:
        requests_checkout(session, stripe_like.url, "order-3")
    assert (unknown.value.key or "").endswith("-step2")


def test_requests_adapter_without_requests_names_the_extra_to_install(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "sys.modules['requests'] = None  # as if it were not installed\n"
        "import payonce\n"
        f"client = payonce.Client(base_url='https://psp.example', provider='stripe', "
        f"journal={str(tmp_path / 'j.db')!r}, transport_only=True)\n"
        "try:\n"
        "    client.requests_adapter()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert "pip install 'payonce[requests]'" in python_output(script)
