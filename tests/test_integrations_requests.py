"""payonce.integrations.requests: a requests.Session that talks through an httpx transport.

The inner transport is httpx's own (``httpx.HTTPTransport``) and the server the real sandbox
on loopback, so what is proved is the conversion both ways: what requests prepares reaches
the server as sent, what the server answers reaches the requests caller as answered, and
transport failures arrive as the requests exceptions requests-based code catches.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
import requests

import payonce
from payonce.integrations.requests import TransportAdapter
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

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
