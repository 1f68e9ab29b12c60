"""The sandbox provider, exercised over real HTTP on loopback."""

from __future__ import annotations

import contextlib
import email.utils
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from helpers.payments import free_port
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import (
    DEFAULT_ACCOUNT,
    DEFAULT_API_KEY,
    Faults,
    SandboxConfig,
    SandboxServer,
    SandboxStore,
    WebhookConfig,
)

OTHER_API_KEY = "sk_test_other"
OTHER_ACCOUNT = "acct_other"
DAY = 24 * 3600.0

Start = Callable[[SandboxConfig], SandboxServer]


def _client(url: str, api_key: str = DEFAULT_API_KEY) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=10)


def _key() -> str:
    return f"key-{uuid.uuid4().hex}"


def _pay(
    http: httpx.Client,
    key: str | None,
    amount: int = 1000,
    *,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> httpx.Response:
    all_headers = {"Idempotency-Key": key} if key is not None else {}
    all_headers.update(headers or {})
    body = {"amount": amount, "currency": "EUR", **fields}
    return http.post("/v1/payments", json=body, headers=all_headers)


@pytest.fixture
def provider(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    """The session's sandbox with a second account, reset for this test."""
    config = SandboxConfig(
        api_keys={DEFAULT_API_KEY: DEFAULT_ACCOUNT, OTHER_API_KEY: OTHER_ACCOUNT}
    )
    return shared_sandboxes.get("two accounts", config)


@pytest.fixture
def http(provider: SandboxServer) -> Iterator[httpx.Client]:
    with _client(provider.url) as client:
        yield client


def test_payment_executes_once(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    response = _pay(http, key, 1250, reference="order-1", metadata={"cart": "42"})

    assert response.status_code == 201
    assert response.headers["Request-Id"].startswith("req_")
    assert "Idempotent-Replayed" not in response.headers
    payment = response.json()
    assert payment["id"].startswith("pay_")
    assert len(payment["id"]) == len("pay_") + 24
    assert payment["object"] == "payment"
    assert payment["account"] == DEFAULT_ACCOUNT
    assert (payment["amount"], payment["currency"]) == (1250, "EUR")
    assert payment["reference"] == "order-1"
    assert payment["status"] == "succeeded"
    assert payment["idempotency_key"] == key
    assert payment["metadata"] == {"cart": "42"}
    assert isinstance(payment["created"], int)
    assert provider.store.executions() == {key: 1}
    assert provider.store.payments() == [payment]


def test_replay_with_same_key_and_body(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    first = _pay(http, key)
    again = _pay(http, key)
    # The RFC 8941 sf-string form of the same key.
    quoted = _pay(http, f'"{key}"')

    for replay in (again, quoted):
        assert replay.status_code == 201
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.content == first.content
        assert replay.headers["Request-Id"] != first.headers["Request-Id"]
    assert provider.store.execution_count(key) == 1


def test_same_key_with_other_body_is_rejected(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    assert _pay(http, key, 1000).status_code == 201

    response = _pay(http, key, 2000)

    assert response.status_code == 422
    assert response.json()["error"]["type"] == "idempotency_key_mismatch"
    assert provider.store.execution_count(key) == 1


def test_missing_key_is_rejected(provider: SandboxServer, http: httpx.Client) -> None:
    response = _pay(http, None)

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "idempotency_key_missing"
    assert "Request-Id" in response.headers
    assert provider.store.total_executions() == 0


def test_overlong_key_is_rejected(provider: SandboxServer, http: httpx.Client) -> None:
    assert _pay(http, "k" * 255).status_code == 201
    response = _pay(http, "k" * 256)

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b'{"amount": 0, "currency": "EUR"}',
        b'{"amount": 10.5, "currency": "EUR"}',
        b'{"amount": true, "currency": "EUR"}',
        b'{"amount": 100, "currency": "EURO"}',
        b'{"amount": 100}',
        b'{"amount": 100, "currency": "EUR", "reference": 7}',
        b'{"amount": 100, "currency": "EUR", "metadata": []}',
        b'{"amount": 100, "currency": "EUR", "amount_typo": 1}',
    ],
)
def test_invalid_request_records_nothing(
    provider: SandboxServer, http: httpx.Client, body: bytes
) -> None:
    key = _key()
    response = http.post("/v1/payments", content=body, headers={"Idempotency-Key": key})

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request"
    # The key was not recorded: a valid request with it is new, not a mismatch.
    assert _pay(http, key).status_code == 201


@pytest.mark.parametrize(
    "authorization", [None, "Bearer sk_test_wrong", f"Basic {DEFAULT_API_KEY}", "Bearer"]
)
def test_bad_credentials_are_rejected(provider: SandboxServer, authorization: str | None) -> None:
    headers = {"Idempotency-Key": _key()}
    if authorization is not None:
        headers["Authorization"] = authorization
    with httpx.Client(base_url=provider.url) as anonymous:
        response = anonymous.post(
            "/v1/payments", json={"amount": 1, "currency": "EUR"}, headers=headers
        )
        lookup = anonymous.get("/v1/payments/pay_x", headers=headers)

    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert lookup.status_code == 401
    assert provider.store.total_executions() == 0


def test_concurrent_requests_with_one_key_conflict(
    provider: SandboxServer, http: httpx.Client
) -> None:
    key = _key()
    with ThreadPoolExecutor(1) as pool:
        # The first is executing at the provider, however long the second takes to come.
        with provider.holding():
            first = pool.submit(_pay, http, key)
            assert provider.wait_held(1), "the first request never reached the provider"
            with _client(provider.url) as client:
                second = _pay(client, key)
        assert first.result(timeout=30).status_code == 201

    assert second.status_code == 409
    assert second.json()["error"]["type"] == "idempotency_key_in_use"
    assert provider.store.executions() == {key: 1}
    retry = _pay(http, key)
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert provider.store.executions() == {key: 1}


def test_a_request_held_at_the_provider_executes_once_let_go(
    provider: SandboxServer, http: httpx.Client
) -> None:
    key = _key()
    with ThreadPoolExecutor(1) as pool:
        with provider.holding():
            paying = pool.submit(_pay, http, key)
            assert provider.wait_held(1), "the payment never reached the provider"
            assert provider.held == 1
            assert provider.store.keys_in_progress() == {key}, "its key is claimed"
            assert provider.store.executions() == {}
            assert not paying.done()
        paid = paying.result(timeout=30)
    assert paid.status_code == 201
    assert provider.held == 0
    assert provider.store.executions() == {key: 1}
    # Let go, nothing is held any more: the next payment answers at once.
    assert _pay(http, _key()).status_code == 201


def test_every_answer_is_dated_once_by_the_clock_keys_expire_by(
    provider: SandboxServer, http: httpx.Client
) -> None:
    """A client judges a key's age by the provider's ``Date``: the sandbox's must be the
    clock it forgets keys by, ``advance_clock`` included, on API and other answers alike."""

    def dated(response: httpx.Response) -> float:
        (date,) = response.headers.get_list("date")
        return email.utils.parsedate_to_datetime(date).timestamp()

    assert abs(dated(_pay(http, _key())) - time.time()) < 5
    provider.advance_clock(DAY + 60)
    assert abs(dated(_pay(http, _key())) - (time.time() + DAY + 60)) < 5
    assert abs(dated(http.head("/")) - (time.time() + DAY + 60)) < 5


def test_expired_key_is_forgotten(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    first = _pay(http, key).json()

    provider.advance_clock(DAY - 60)
    assert _pay(http, key).headers["Idempotent-Replayed"] == "true"

    provider.advance_clock(61)
    second = _pay(http, key)

    assert second.status_code == 201
    assert "Idempotent-Replayed" not in second.headers
    assert second.json()["id"] != first["id"]
    assert provider.store.execution_count(key) == 2
    found = http.get("/v1/payments", params={"idempotency_key": key}).json()
    assert [p["id"] for p in found["data"]] == [first["id"], second.json()["id"]]


def test_fail_before_executes_nothing(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    provider.script(["fail_before"])

    response = _pay(http, key)

    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable"
    assert provider.store.execution_count(key) == 0
    assert _pay(http, key).status_code == 201
    assert provider.store.execution_count(key) == 1


def test_fail_after_loses_a_success_that_a_retry_recovers(
    provider: SandboxServer, http: httpx.Client
) -> None:
    key = _key()
    provider.script(["fail_after"])

    lost = _pay(http, key)
    assert lost.status_code == 503
    assert provider.store.execution_count(key) == 1

    retry = _pay(http, key)
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json() == provider.store.payments()[0]
    assert provider.store.execution_count(key) == 1


def test_drop_after_breaks_the_connection_mid_response(
    provider: SandboxServer, http: httpx.Client
) -> None:
    key = _key()
    provider.script(["drop_after"])

    with pytest.raises(httpx.RemoteProtocolError):
        _pay(http, key)
    assert provider.store.execution_count(key) == 1

    retry = _pay(http, key)
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert provider.store.execution_count(key) == 1


def test_rate_limit_executes_nothing(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    provider.script(["rate_limit"])

    response = _pay(http, key)

    assert response.status_code == 429
    assert response.headers["Retry-After"] == "1"
    assert provider.store.execution_count(key) == 0


def test_fractional_retry_after(provider: SandboxServer, http: httpx.Client) -> None:
    provider.set_faults(Faults(rate_limit_rate=1.0, retry_after_seconds=0.25))

    assert _pay(http, _key()).headers["Retry-After"] == "0.25"


def test_script_is_consumed_in_order(provider: SandboxServer, http: httpx.Client) -> None:
    response = http.post("/_sandbox/script", json={"faults": ["fail_before", "none", "delay"]})
    assert response.status_code == 200

    statuses = [_pay(http, _key()).status_code for _ in range(4)]

    assert statuses == [503, 201, 201, 201]


def test_a_script_can_replace_what_is_still_queued(
    provider: SandboxServer, http: httpx.Client
) -> None:
    http.post("/_sandbox/script", json={"faults": ["fail_before", "fail_before"]})
    replaced = http.post("/_sandbox/script", json={"faults": ["rate_limit"], "replace": True})
    assert replaced.json() == {"script": ["rate_limit"]}
    assert [_pay(http, _key()).status_code for _ in range(2)] == [429, 201]

    http.post("/_sandbox/script", json={"faults": ["fail_before"]})
    cleared = http.post("/_sandbox/script", json={"faults": [], "replace": True})
    assert cleared.json() == {"script": []}
    assert _pay(http, _key()).status_code == 201
    bad = http.post("/_sandbox/script", json={"faults": [], "replace": "yes"})
    assert bad.status_code == 400


def test_fault_header_wins_over_the_script(provider: SandboxServer, http: httpx.Client) -> None:
    provider.script(["fail_before"])

    forced = _pay(http, _key(), headers={"Sandbox-Fault": "rate_limit"})
    scripted = _pay(http, _key())

    assert (forced.status_code, scripted.status_code) == (429, 503)
    assert _pay(http, _key(), headers={"Sandbox-Fault": "bogus"}).status_code == 400


def test_unknown_script_fault_is_rejected(provider: SandboxServer, http: httpx.Client) -> None:
    response = http.post("/_sandbox/script", json={"faults": ["fail_before", "explode"]})

    assert response.status_code == 400
    assert _pay(http, _key()).status_code == 201
    with pytest.raises(ValueError, match="explode"):
        provider.script(["explode"])


def test_decline_is_an_execution_and_replays(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    declined = _pay(http, key, 40200)

    assert declined.status_code == 402
    error = declined.json()["error"]
    assert (error["type"], error["code"]) == ("card_error", "card_declined")
    assert error["payment"]["status"] == "failed"
    assert provider.store.execution_count(key) == 1

    replay = _pay(http, key, 40200)
    assert replay.status_code == 402
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == declined.content
    looked_up = http.get(f"/v1/payments/{error['payment']['id']}")
    assert looked_up.json()["status"] == "failed"
    assert provider.store.execution_count(key) == 1


def test_lookups(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    payment = _pay(http, key, reference="invoice-7").json()
    _pay(http, _key(), reference="invoice-8")

    by_id = http.get(f"/v1/payments/{payment['id']}")
    by_key = http.get("/v1/payments", params={"idempotency_key": key})
    by_reference = http.get("/v1/payments", params={"reference": "invoice-7"})

    assert by_id.status_code == 200
    assert by_id.json() == payment
    assert by_key.json() == {"object": "list", "data": [payment]}
    assert by_reference.json() == {"object": "list", "data": [payment]}
    missing = http.get("/v1/payments/pay_000000000000000000000000")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found"
    assert http.get("/v1/payments").status_code == 400


def test_accounts_are_isolated(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    mine = _pay(http, key, reference="shared-ref").json()

    with _client(provider.url, OTHER_API_KEY) as other:
        assert other.get(f"/v1/payments/{mine['id']}").status_code == 404
        assert other.get("/v1/payments", params={"idempotency_key": key}).json()["data"] == []
        assert other.get("/v1/payments", params={"reference": "shared-ref"}).json()["data"] == []
        # The same key in another account is another request altogether.
        theirs = _pay(other, key, 5)

    assert theirs.status_code == 201
    assert theirs.json()["account"] == OTHER_ACCOUNT
    assert theirs.json()["id"] != mine["id"]
    assert provider.store.execution_count(key) == 2


def _outcomes(server: SandboxServer, prefix: str, count: int = 30) -> list[str]:
    outcomes = []
    with _client(server.url) as client:
        for index in range(count):
            try:
                outcomes.append(str(_pay(client, f"{prefix}-{index}").status_code))
            except httpx.RemoteProtocolError:
                outcomes.append("dropped")
    return outcomes


def test_random_faults_are_reproducible_from_the_seed() -> None:
    faults = Faults(
        seed=1234,
        rate_limit_rate=0.1,
        fail_before_rate=0.2,
        fail_after_rate=0.2,
        drop_after_rate=0.2,
        retry_after_seconds=0,
    )
    runs = []
    for _ in range(2):
        with SandboxServer(SandboxConfig(faults=faults)) as server:
            runs.append(_outcomes(server, "seeded"))
            # Setting the faults again reseeds: the same sequence once more.
            with httpx.Client(base_url=server.url) as control:
                assert (
                    control.post("/_sandbox/faults", json=attrs.asdict(faults)).status_code == 200
                )
            runs.append(_outcomes(server, "reseeded"))

    assert runs[0] == runs[1] == runs[2] == runs[3]
    assert {"201", "429", "503", "dropped"} <= set(runs[0])


def test_control_endpoints(provider: SandboxServer, http: httpx.Client) -> None:
    key = _key()
    _pay(http, key)
    with httpx.Client(base_url=provider.url) as control:
        executions = control.get("/_sandbox/executions")
        assert executions.json() == {"executions": {key: 1}, "total": 1}
        assert "Request-Id" in executions.headers

        assert control.post("/_sandbox/faults", json={"fail_before_rate": 2}).status_code == 400
        assert control.post("/_sandbox/faults", json={"nonsense": 1}).status_code == 400
        assert control.post("/_sandbox/faults", json={"fail_before_rate": 1}).status_code == 200
        assert _pay(http, _key()).status_code == 503

        before = provider.store.clock.now()
        assert control.post("/_sandbox/clock", json={"advance": DAY}).status_code == 200
        assert provider.store.clock.now() >= before + DAY
        assert control.post("/_sandbox/clock", json={"advance": "soon"}).status_code == 400

        assert control.post("/_sandbox/reset").status_code == 200
        assert control.get("/_sandbox/executions").json() == {"executions": {}, "total": 0}
        assert provider.store.clock.now() < before + DAY
        # Reset also restores the configured (fault-free) faults.
        assert _pay(http, _key()).status_code == 201


def test_reset_puts_a_used_server_back_as_it_started() -> None:
    """What one user of a shared server did is gone for the next: payments, keys, counts,
    the clock, scripted and switched faults, webhook deliveries and their record."""
    faults = Faults(seed=99, fail_before_rate=0.3, drop_after_rate=0.2)
    # Deliveries to a closed port fail and wait long for their retry: one stays queued.
    webhooks = WebhookConfig(
        url=f"http://127.0.0.1:{free_port()}/", secrets="s", retry_wait=60, max_retry_wait=60
    )
    with SandboxServer(SandboxConfig(faults=faults, webhooks=webhooks)) as server:
        fresh = _outcomes(server, "fresh")
        key = _key()
        with _client(server.url) as http:
            assert _pay(http, key, headers={"Sandbox-Fault": "none"}).status_code == 201
            server.set_faults(Faults(fail_before_rate=1.0))
            server.script(["rate_limit", "drop_after"])
            server.advance_clock(DAY)
            deadline = time.monotonic() + 10
            while not server.webhook_attempts():
                assert time.monotonic() < deadline, "no webhook delivery was attempted"
                time.sleep(0.01)

            server.reset()

            assert server.store.payments() == []
            assert server.store.executions() == {}
            assert server.store.clock.now() < time.time() + 60
            assert server.webhook_attempts() == []
            assert http.get("/_sandbox/webhooks").json()["pending"] == 0
            # The key is forgotten: another body under it is a new payment, not a mismatch.
            assert _pay(http, key, 7, headers={"Sandbox-Fault": "none"}).status_code == 201
        server.reset()
        # The configured faults again, drawn from their seed as on the first run.
        assert _outcomes(server, "fresh") == fresh


def _refusal_to_reset_at_once(server: SandboxServer) -> str | None:
    try:
        server.reset(timeout=0)
    except RuntimeError as exc:
        return str(exc)
    return None


def test_reset_waits_for_the_requests_in_flight() -> None:
    """A request still being handled would otherwise execute into the fresh state."""
    body_sent = threading.Event()

    def body() -> Iterator[bytes]:
        # The request stays in flight, its body half sent, until the test lets it go on.
        yield b'{"amount": 1000, '
        assert body_sent.wait(10)
        yield b'"currency": "EUR"}'

    with SandboxServer(SandboxConfig(processing_seconds=0.5)) as server:
        assert server.running
        with ThreadPoolExecutor(1) as pool, _client(server.url) as http:
            headers = {"Idempotency-Key": _key(), "Content-Type": "application/json"}
            paying = pool.submit(http.post, "/v1/payments", content=body(), headers=headers)
            deadline = time.monotonic() + 10
            # Until the request reaches the server, a reset that may not wait goes through
            # (and changes nothing); from then on it is refused.
            while (refusal := _refusal_to_reset_at_once(server)) is None:
                assert time.monotonic() < deadline, "the payment never reached the server"
                time.sleep(0.005)
            assert "in flight" in refusal
            body_sent.set()  # the payment executes half a second from now

            server.reset()

            assert paying.result().status_code == 201
        assert server.store.executions() == {}, "the payment executed after the reset"
    assert not server.running


def test_store_is_shared_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    config = SandboxConfig(store_path=str(path))
    with SandboxServer(config) as server, _client(server.url) as client:
        key = _key()
        _pay(client, key)
        other = SandboxStore(path)
        try:
            assert other.executions() == {key: 1}
            other.clock.advance(DAY)
            # The server sees the other handle's clock: the key has expired.
            assert "Idempotent-Replayed" not in _pay(client, key).headers
            assert other.execution_count(key) == 2
        finally:
            other.close()
    assert path.exists()


# -- switches that make the sandbox answer like a real provider -----------------------------


@pytest.fixture
def start(closing: contextlib.ExitStack) -> Start:
    """A sandbox of the test's own in ``config``, stopped at the end of the test."""
    return lambda config: closing.enter_context(SandboxServer(config))


def _form(http: httpx.Client, key: str, body: str, **headers: str) -> httpx.Response:
    headers = {
        "Idempotency-Key": key,
        "Content-Type": "application/x-www-form-urlencoded",
    } | headers
    return http.post("/v1/payments", content=body.encode(), headers=headers)


def test_form_bodies_with_metadata_brackets_when_switched_on(start: Start) -> None:
    server = start(SandboxConfig(form_bodies=True))
    key = _key()
    body = "amount=1250&currency=EUR&reference=order-1&metadata%5Bcart%5D=42&metadata[x]=y"
    with _client(server.url) as http:
        paid = _form(http, key, body)
        # The same parameters as JSON are the same request: a replay, not a mismatch.
        as_json = _pay(http, key, 1250, reference="order-1", metadata={"cart": "42", "x": "y"})

    assert paid.status_code == 201
    assert (paid.json()["amount"], paid.json()["metadata"]) == (1250, {"cart": "42", "x": "y"})
    assert as_json.headers["Idempotent-Replayed"] == "true"
    assert server.store.executions() == {key: 1}


@pytest.mark.parametrize(
    "body",
    [
        "amount=12.5&currency=EUR",
        "amount=%C2%B2&currency=EUR",  # a digit, but not an ASCII one
        "amount=1&amount=2&currency=EUR",
        "amount=1&currency=EUR&metadata=x&metadata[a]=b",
        "amount=1&currency=EUR&metadata[a]=b&metadata[a]=c",
        "amount=1&currency=EUR&nickname=x",
        "amount=1&currency=EUR&&",
        "amount=%FF&currency=EUR",
    ],
)
def test_invalid_form_bodies_record_nothing(start: Start, body: str) -> None:
    server = start(SandboxConfig(form_bodies=True))
    with _client(server.url) as http:
        response = _form(http, _key(), body)

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request"
    assert server.store.total_executions() == 0


def test_form_bodies_are_refused_by_default(provider: SandboxServer, http: httpx.Client) -> None:
    response = _form(http, _key(), "amount=1&currency=EUR")

    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


def test_x_api_key_auth_mode(start: Start) -> None:
    server = start(SandboxConfig(auth="x-api-key"))
    key = _key()
    with httpx.Client(base_url=server.url) as anonymous:
        paid = _pay(anonymous, key, headers={"X-API-Key": DEFAULT_API_KEY})
        lookup = anonymous.get(
            "/v1/payments", params={"idempotency_key": key}, headers={"X-API-Key": DEFAULT_API_KEY}
        )
        bearer = _pay(anonymous, _key(), headers={"Authorization": f"Bearer {DEFAULT_API_KEY}"})

    assert paid.status_code == 201
    assert [p["id"] for p in lookup.json()["data"]] == [paid.json()["id"]]
    assert bearer.status_code == 401
    assert "WWW-Authenticate" not in bearer.headers
    assert server.store.total_executions() == 1


def test_a_custom_key_header(start: Start) -> None:
    server = start(SandboxConfig(key_header="X-Request-Id"))
    with _client(server.url) as http:
        missing = _pay(http, _key())  # sent as Idempotency-Key: not the header it reads
        paid = _pay(http, None, headers={"X-Request-Id": "req-key-1"})

    assert missing.status_code == 400
    assert "X-Request-Id" in missing.json()["error"]["message"]
    assert paid.status_code == 201
    assert server.store.executions() == {"req-key-1": 1}


def test_retry_hints_by_status_on_api_routes_only(start: Start) -> None:
    config = SandboxConfig(
        retry_hint_header="Stripe-Should-Retry", retry_hints={402: False, 503: True, 400: True}
    )
    server = start(config)
    key = _key()
    server.script(["fail_before"])
    with _client(server.url) as http:
        unavailable = _pay(http, _key())
        declined = _pay(http, key, 40200)
        replayed = _pay(http, key, 40200)
        paid = _pay(http, _key())
        control = http.post("/_sandbox/script", json={"faults": "not a list"})

    assert unavailable.headers["Stripe-Should-Retry"] == "true"
    assert declined.headers["Stripe-Should-Retry"] == "false"
    assert replayed.headers["Stripe-Should-Retry"] == "false"
    assert "Stripe-Should-Retry" not in paid.headers
    assert control.status_code == 400
    assert "Stripe-Should-Retry" not in control.headers


def test_no_retry_hint_by_default(provider: SandboxServer, http: httpx.Client) -> None:
    assert not any("retry" in name.lower() for name in _pay(http, _key(), 40200).headers)


def test_the_lock_timeout_fault_answers_409_before_executing(
    provider: SandboxServer, http: httpx.Client
) -> None:
    key = _key()
    provider.script(["lock_timeout"])

    locked = _pay(http, key)
    retry = _pay(http, key)

    assert locked.status_code == 409
    assert locked.json()["error"]["type"] == "lock_timeout"
    assert retry.status_code == 201
    assert "Idempotent-Replayed" not in retry.headers
    assert provider.store.execution_count(key) == 1


def _race(server: SandboxServer, key: str) -> list[httpx.Response]:
    """Two requests with one key, the second while the first executes (held at the
    provider until the second is answered): one executes, the other finds the key in use."""
    auth = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
    with (
        httpx.Client(base_url=server.url, timeout=30) as first_client,
        httpx.Client(base_url=server.url, timeout=30) as second_client,
        ThreadPoolExecutor(1) as pool,
    ):
        with server.holding():
            first = pool.submit(_pay, first_client, key, headers=auth)
            assert server.wait_held(1), "the first request never reached the provider"
            second = _pay(second_client, key, headers=auth)
        return sorted([first.result(), second], key=lambda r: r.status_code)


@pytest.mark.parametrize(("status", "expected"), [(None, 400), (409, 409)])
def test_stripe_dialect_errors(start: Start, status: int | None, expected: int) -> None:
    server = start(SandboxConfig(dialect="stripe", mismatch_status=status))
    key = _key()
    with _client(server.url) as http:
        assert _pay(http, key, 1000).status_code == 201
        mismatch = _pay(http, key, 2000)
        server.script(["lock_timeout", "fail_before", "rate_limit"])
        locked, unavailable, limited = (_pay(http, _key()) for _ in range(3))
    in_use = _race(server, _key())[1]

    assert mismatch.status_code == expected
    error = mismatch.json()["error"]
    assert error["type"] == "idempotency_error"
    assert "code" not in error
    assert error["message"].startswith("Keys for idempotent requests can only be used with")
    assert key in error["message"]
    assert locked.status_code == 409
    assert locked.json()["error"] == {
        "type": "invalid_request_error",
        "code": "lock_timeout",
        "message": "another request is using this payment's objects",
    }
    assert in_use.status_code == 409
    assert in_use.json()["error"]["code"] == "idempotency_key_in_use"
    assert "in-progress" in in_use.json()["error"]["message"]
    assert unavailable.json()["error"]["type"] == "api_error"
    assert limited.json()["error"]["code"] == "rate_limit"
    assert server.store.total_executions() == 2


def test_adyen_dialect_answers_with_result_codes_and_error_codes(start: Start) -> None:
    server = start(SandboxConfig(dialect="adyen"))
    key = _key()
    with _client(server.url) as http:
        authorised = _pay(http, _key(), reference="order-1")
        refused = _pay(http, key, 40200, reference="order-2")
        replayed = _pay(http, key, 40200, reference="order-2")
        invalid = http.post("/v1/payments", json={"amount": 1}, headers={"Idempotency-Key": key})
    with httpx.Client(base_url=server.url) as anonymous:
        unauthorised = _pay(anonymous, _key())
    in_use = _race(server, _key())[1]

    assert (authorised.status_code, authorised.json()["resultCode"]) == (200, "Authorised")
    assert authorised.json()["pspReference"] == authorised.json()["id"]
    assert authorised.json()["merchantReference"] == "order-1"
    assert (refused.status_code, refused.json()["resultCode"]) == (200, "Refused")
    assert replayed.content == refused.content
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert invalid.status_code == 400
    assert invalid.json() == {
        "status": 400,
        "errorCode": "invalid_request",
        "message": "currency must be a 3-letter code",
        "errorType": "validation",
    }
    assert (unauthorised.status_code, unauthorised.json()["errorType"]) == (401, "security")
    assert in_use.status_code == 409
    assert in_use.json()["errorCode"] == "704"
    assert in_use.json()["message"] == "request already processed or in progress"
    assert server.store.total_executions() == 3


def test_metadata_search(provider: SandboxServer, http: httpx.Client) -> None:
    tagged = _pay(http, _key(), metadata={"payonce_idempotency_key": "k'1\\x", "cart": "9"}).json()
    _pay(http, _key(), metadata={"payonce_idempotency_key": "k2"})

    def search(query: str, client: httpx.Client = http) -> httpx.Response:
        return client.get("/v1/payments/search", params={"query": query})

    found = search("metadata['payonce_idempotency_key']:'k\\'1\\\\x'")
    with _client(provider.url, OTHER_API_KEY) as other:
        elsewhere = search("metadata['cart']:'9'", other)

    assert found.status_code == 200
    assert found.json() == {
        "object": "search_result",
        "data": [tagged],
        "has_more": False,
        "url": "/v1/payments/search",
    }
    assert search("metadata['cart']:'9'").json()["data"] == [tagged]
    assert search("metadata['cart']:'10'").json()["data"] == []
    assert elsewhere.json()["data"] == []
    for bad in ["", "status:'succeeded'", "metadata['cart']:9", "metadata['cart']:'9' AND x"]:
        assert search(bad).status_code == 400
    with httpx.Client(base_url=provider.url) as anonymous:
        assert anonymous.get("/v1/payments/search").status_code == 401


def test_provider_presets() -> None:
    stripe = SandboxConfig.like("stripe", processing_seconds=1.0)
    adyen = SandboxConfig.like("adyen")
    mollie = SandboxConfig.like("mollie")
    square = SandboxConfig.like("square")

    assert (stripe.dialect, stripe.form_bodies, stripe.key_lifetime) == ("stripe", True, DAY)
    assert stripe.retry_hint_header == "Stripe-Should-Retry"
    assert stripe.retry_hints == {402: False, 409: True, 503: True}
    assert stripe.processing_seconds == 1.0
    assert (adyen.dialect, adyen.auth, adyen.key_lifetime) == ("adyen", "x-api-key", 31 * DAY)
    assert (mollie.dialect, mollie.key_lifetime) == ("mollie", 3600.0)
    assert (square.dialect, square.auth, square.key_lifetime) == ("square", "bearer", DAY)
    with pytest.raises(ValueError, match="no preset for 'paypal'"):
        SandboxConfig.like("paypal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="4xx"):
        SandboxConfig(mismatch_status=200)
    with pytest.raises(ValueError, match="dialect"):
        SandboxConfig(dialect="paypal")  # type: ignore[arg-type]
