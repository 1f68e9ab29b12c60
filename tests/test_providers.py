"""The real provider profiles, each over real HTTP against the sandbox answering like it.

Every profile pays once, retries a 503 under one key, stores and replays a definitive
decline, and sends the key and the API key the way its provider expects. Then what is
particular to each: Stripe's form bodies, metadata tag, Stripe-Should-Retry and 409s and
its reconciliation by metadata search; Adyen's X-API-Key, 704 and reconciliation by
merchant reference; Mollie's one-hour keys; and a profile a user defines in a few lines.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import attrs
import httpx
import pytest

import payonce
from helpers.payments import DECLINED, PAYMENT, MakeClient, leave_pending
from helpers.sandboxes import SharedSandboxes
from payonce._lifecycle import LookupKind, Outcome, classify_lookup, classify_response
from payonce._providers import _profile as profile_module
from payonce._providers._adyen import ADYEN, adyen_profile, adyen_reference_lookup
from payonce._providers._mollie import MOLLIE
from payonce._providers._profile import GENERIC, Lookup, ProviderProfile, get_profile
from payonce._providers._stripe import STRIPE, stripe_profile
from payonce._runtime import _reconcile
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

PROFILES = ["generic", "stripe", "adyen", "mollie"]
TAG = "metadata[payonce_idempotency_key]"

Start = Callable[..., SandboxServer]
Like = Callable[..., tuple[SandboxServer, payonce.Client]]


@pytest.fixture
def start(shared_sandboxes: SharedSandboxes, closing: contextlib.ExitStack) -> Start:
    """A sandbox answering like the named provider (``generic``: the sandbox's own rules):
    the session's, reset, or with ``overrides`` one of the test's own."""

    def make(provider: str, **overrides: Any) -> SandboxServer:
        if provider in ("stripe", "adyen", "mollie"):
            config = SandboxConfig.like(provider, **overrides)  # type: ignore[arg-type]
        else:
            config = SandboxConfig(**overrides)
        if overrides:
            return closing.enter_context(SandboxServer(config))
        return shared_sandboxes.get("default" if provider == "generic" else provider, config)

    return make


@pytest.fixture
def like(start: Start, make_client: MakeClient) -> Like:
    """``start(provider, **overrides)`` and a client of it with the provider's profile (or
    the ``profile`` given)."""

    def make(
        provider: str, *, profile: object = None, **overrides: Any
    ) -> tuple[SandboxServer, payonce.Client]:
        server = start(provider, **overrides)
        return server, make_client(base_url=server.url, provider=profile or provider)

    return make


def _body(provider: str, payment: dict[str, Any] = PAYMENT) -> dict[str, Any]:
    # Stripe takes form-encoded parameters; the others JSON.
    return {"data": payment} if provider == "stripe" else {"json": payment}


def _requests(client: payonce.Client) -> list[httpx.Request]:
    seen: list[httpx.Request] = []
    client._http.event_hooks["request"].append(seen.append)
    return seen


def _info(response: httpx.Response) -> payonce.records.ResponseInfo:
    info = payonce.response_info(response)
    assert info is not None
    return info


def _response(
    status: int, body: object = None, headers: dict[str, str] | None = None
) -> httpx.Response:
    if body is None:
        return httpx.Response(status, headers=headers)
    # A provider's JSON answer says it is one.
    content_type = {"content-type": "application/json"}
    return httpx.Response(
        status, headers={**content_type, **(headers or {})}, content=json.dumps(body).encode()
    )


# -- every profile ---------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROFILES)
def test_a_payment_succeeds_once_and_replays_from_the_journal(provider: str, like: Like) -> None:
    server, client = like(provider)
    sent = _requests(client)

    with client.intent(f"order-{provider}") as op:
        paid = op.post("/v1/payments", **_body(provider))
    again = client.post("/v1/payments", reference=f"order-{provider}", **_body(provider))

    assert paid.status_code == (200 if provider == "adyen" else 201)
    assert server.store.executions() == {op.key: 1}
    assert len(sent) == 1, "the second call is answered by the journal"
    assert _info(again).replayed
    assert again.content == paid.content


@pytest.mark.parametrize("provider", PROFILES)
@pytest.mark.parametrize("fault", ["fail_before", "fail_after"])
def test_a_retried_503_executes_once(provider: str, fault: str, like: Like) -> None:
    server, client = like(provider)
    server.script([fault])

    with client.intent("order-503") as op:
        paid = op.post("/v1/payments", **_body(provider))

    assert paid.status_code in (200, 201)
    assert _info(paid).attempts == 2
    # After fail_after the provider had executed the first attempt and replays it.
    assert _info(paid).provider_replayed is (fault == "fail_after")
    assert server.store.executions() == {op.key: 1}


@pytest.mark.parametrize("provider", ["generic", "stripe", "mollie"])
def test_a_definitive_decline_is_stored_and_replayed(provider: str, like: Like) -> None:
    server, client = like(provider)
    sent = _requests(client)

    with pytest.raises(payonce.ProviderError) as first:
        client.post("/v1/payments", reference="order-d", **_body(provider, DECLINED))
    with pytest.raises(payonce.ProviderError) as again:
        client.post("/v1/payments", reference="order-d", **_body(provider, DECLINED))

    assert first.value.status_code == again.value.status_code == 402
    assert _info(first.value.response).attempts == 1
    assert _info(again.value.response).replayed
    assert again.value.response.content == first.value.response.content
    assert len(sent) == 1
    (record,) = client.journal.find("order-d")
    assert record.state is payonce.IntentState.FAILED
    assert server.store.executions() == {record.key: 1}


def test_an_adyen_refusal_is_a_200_stored_and_replayed(like: Like) -> None:
    server, client = like("adyen")
    sent = _requests(client)

    refused = client.post("/v1/payments", reference="order-r", json=DECLINED)
    again = client.post("/v1/payments", reference="order-r", json=DECLINED)

    # Adyen reports a refusal in the body: the HTTP request itself succeeded, once.
    assert (refused.status_code, refused.json()["resultCode"]) == (200, "Refused")
    assert _info(again).replayed
    assert again.json() == refused.json()
    assert len(sent) == 1
    assert server.store.total_executions() == 1


@pytest.mark.parametrize(
    ("provider", "quoted", "auth_header", "auth_value"),
    [
        ("generic", True, "Authorization", f"Bearer {DEFAULT_API_KEY}"),
        ("stripe", False, "Authorization", f"Bearer {DEFAULT_API_KEY}"),
        ("adyen", False, "X-API-Key", DEFAULT_API_KEY),
        ("mollie", False, "Authorization", f"Bearer {DEFAULT_API_KEY}"),
    ],
)
def test_the_key_and_the_api_key_go_where_the_provider_expects_them(
    provider: str, quoted: bool, auth_header: str, auth_value: str, like: Like
) -> None:
    server, client = like(provider)
    sent = _requests(client)
    server.script(["fail_before"])

    with client.intent("order-h") as op:
        op.post("/v1/payments", **_body(provider))

    assert op.key is not None
    expected_key = f'"{op.key}"' if quoted else op.key
    assert [r.headers["Idempotency-Key"] for r in sent] == [expected_key] * 2
    assert {r.headers[auth_header] for r in sent} == {auth_value}
    if auth_header != "Authorization":
        assert all("Authorization" not in r.headers for r in sent)
    assert server.store.executions() == {op.key: 1}


# -- Stripe ----------------------------------------------------------------------------------


def test_stripe_sends_the_same_form_bytes_with_the_metadata_tag_on_every_attempt(
    like: Like,
) -> None:
    server, client = like("stripe")
    sent = _requests(client)
    server.script(["fail_before", "fail_after"])
    form = {"amount": 4200, "currency": "eur", "metadata[order]": "cmd_9182"}

    with client.intent("order-f") as op:
        paid = op.post("/v1/payments", data=form)

    assert op.key is not None
    bodies = [r.content for r in sent]
    assert len(bodies) == 3
    assert len(set(bodies)) == 1, "every attempt carries the same bytes"
    assert {r.headers["Content-Type"] for r in sent} == {"application/x-www-form-urlencoded"}
    assert parse_qsl(bodies[0].decode()) == [
        ("amount", "4200"),
        ("currency", "eur"),
        ("metadata[order]", "cmd_9182"),
        (TAG, op.key),
    ]
    assert paid.json()["metadata"] == {"order": "cmd_9182", "payonce_idempotency_key": op.key}
    assert server.store.executions() == {op.key: 1}
    # The journal keeps the caller's body: the tag is derived from the key at send time.
    record = client.journal.get(op.key)
    assert record is not None
    assert b"payonce_idempotency_key" not in record.body


@pytest.mark.parametrize(
    "body",
    [
        {"json": PAYMENT},
        {"content": b'{"amount": 4200}', "headers": {"Content-Type": "application/json"}},
    ],
    ids=["json=", "raw JSON content"],
)
def test_a_json_body_for_stripe_s_v1_api_is_refused_before_it_is_journaled(
    like: Like, body: dict[str, Any]
) -> None:
    server, client = like("stripe")
    client.post("/v1/payments", data=PAYMENT, reference="order-paid")
    held = [(r.key, r.state) for r in client.journal.list_intents()]

    with pytest.raises(payonce.ConfigurationError, match=r"form-encoded bodies.*data=") as error:
        client.post("/v1/payment_intents", reference="order-j", **body)

    assert "POST /v1/payment_intents" in str(error.value)
    assert [(r.key, r.state) for r in client.journal.list_intents()] == held
    assert server.store.total_executions() == 1


def test_a_mismatch_of_a_form_body_names_the_field_that_differs(like: Like) -> None:
    server, client = like("stripe")
    client.post("/v1/payments", data=PAYMENT, reference="order-form")
    with pytest.raises(payonce.IntentMismatch, match=r"in the body \(field amount\) \("):
        client.post("/v1/payments", data={**PAYMENT, "amount": 1}, reference="order-form")
    assert server.store.total_executions() == 1


def test_a_json_body_is_refused_for_stripe_s_v1_api_when_v1_is_in_the_base_url(
    like: Like, make_client: MakeClient
) -> None:
    server, _ = like("stripe")
    client = make_client(base_url=server.url + "/v1", provider="stripe")
    with pytest.raises(payonce.ConfigurationError, match="POST /v1/payment_intents"):
        client.post("/payment_intents", json=PAYMENT, reference="order-j1")
    assert server.store.total_executions() == 0


def test_stripe_s_v2_api_takes_json() -> None:
    assert stripe_profile().refuse_request("POST", "/v2/core/events", "application/json") is None
    form = "application/x-www-form-urlencoded"
    assert stripe_profile().refuse_request("POST", "/v1/payment_intents", form) is None


def test_stripe_without_metadata_tagging_sends_the_body_untouched(like: Like) -> None:
    _, client = like("stripe", profile=stripe_profile(tag_metadata=False))
    sent = _requests(client)

    paid = client.post("/v1/payments", data=PAYMENT, reference="order-u")

    assert sent[0].content == b"amount=4200&currency=eur"
    assert paid.json()["metadata"] == {}
    assert client.provider.lookup is None


def test_stripe_should_retry_false_on_a_5xx_is_definitive(like: Like) -> None:
    # Stripe replays a stored 500 and says so: retrying could only get it again.
    server, client = like("stripe", retry_hints={503: False})
    sent = _requests(client)
    server.script(["fail_before"])

    with pytest.raises(payonce.ProviderError) as refused:
        client.post("/v1/payments", data=PAYMENT, reference="order-5xx")
    with pytest.raises(payonce.ProviderError) as replayed:
        client.post("/v1/payments", data=PAYMENT, reference="order-5xx")

    assert refused.value.status_code == 503
    assert refused.value.response.headers["Stripe-Should-Retry"] == "false"
    assert _info(refused.value.response).attempts == 1
    assert _info(replayed.value.response).replayed
    assert client.journal.find("order-5xx")[0].state is payonce.IntentState.FAILED
    assert len(sent) == 1, "never resent"
    assert server.store.total_executions() == 0


def test_stripe_should_retry_true_on_a_4xx_retries(like: Like) -> None:
    # A 402 the provider calls retryable: payonce retries it under the key until it gives up,
    # and the provider keeps replaying its one execution.
    server, client = like("stripe", retry_hints={402: True})
    sent = _requests(client)

    with pytest.raises(payonce.OutcomeUnknown):
        client.post("/v1/payments", data=DECLINED, reference="order-t")

    assert len(sent) == 5  # FAST_RETRY.max_attempts
    (record,) = client.journal.find("order-t")
    assert record.state is payonce.IntentState.UNKNOWN
    assert server.store.executions() == {record.key: 1}


@pytest.mark.parametrize("status", [409, 400])
def test_stripe_idempotency_error_is_an_intent_mismatch(
    status: int, start: Start, make_client: MakeClient, tmp_path: Path
) -> None:
    # Another journal (another service, a lost file) already used this key for another body.
    server = start("stripe", mismatch_status=status)
    other = make_client(base_url=server.url, provider="stripe", journal=tmp_path / "other.db")
    other.post("/v1/payments", data={"amount": 1, "currency": "eur"}, key="shared-key-1")
    ours = make_client(base_url=server.url, provider="stripe")
    sent = _requests(ours)

    with pytest.raises(payonce.IntentError) as caught:
        ours.post("/v1/payments", data=PAYMENT, key="shared-key-1")

    assert len(sent) == 1, "a mismatch is definitive: never retried"
    assert ours.journal.get("shared-key-1").state is payonce.IntentState.FAILED  # type: ignore[union-attr]
    assert server.store.total_executions() == 1
    assert isinstance(caught.value, payonce.IntentMismatch)


def test_a_stripe_lock_conflict_is_retried(like: Like) -> None:
    server, client = like("stripe")
    server.script(["lock_timeout"])

    with client.intent("order-l") as op:
        paid = op.post("/v1/payments", data=PAYMENT)

    assert paid.status_code == 201
    assert _info(paid).attempts == 2
    assert server.store.executions() == {op.key: 1}


@pytest.mark.parametrize(
    ("provider", "in_use"), [("stripe", "idempotency_key_in_use"), ("adyen", "704")]
)
def test_a_key_in_use_by_another_worker_is_waited_out(
    provider: str, in_use: str, start: Start, make_client: MakeClient, tmp_path: Path
) -> None:
    # Two journals, one key, two workers at once: the second is told the key is in use
    # (Stripe's 409 idempotency_key_in_use, Adyen's 704), retries under the key, and
    # receives the first one's payment.
    server = start(provider, processing_seconds=1.0)
    slow_retry = payonce.RetryPolicy(max_attempts=30, initial_wait=0.2, max_wait=0.2, jitter=False)
    first = make_client(base_url=server.url, provider=provider, journal=tmp_path / "a.db")
    second = make_client(
        base_url=server.url, provider=provider, journal=tmp_path / "b.db", retry=slow_retry
    )
    answers: list[httpx.Response] = []
    second._http.event_hooks["response"].append(answers.append)
    results: dict[str, httpx.Response] = {}

    def pay(name: str, client: payonce.Client) -> None:
        results[name] = client.post("/v1/payments", key="busy-key", **_body(provider))

    worker = threading.Thread(target=pay, args=("first", first))
    worker.start()
    # The second goes once the first is executing at the provider, however loaded the host.
    deadline = time.monotonic() + 30
    while "busy-key" not in server.store.keys_in_progress():
        assert time.monotonic() < deadline, "the first request never reached the provider"
        time.sleep(0.01)
    pay("second", second)
    worker.join()

    answers[0].read()
    assert answers[0].status_code == 409
    error = answers[0].json()
    assert (error["error"]["code"] if provider == "stripe" else error["errorCode"]) == in_use
    assert results["second"].json()["id"] == results["first"].json()["id"]
    assert _info(results["second"]).provider_replayed
    assert server.store.executions() == {"busy-key": 1}


def _unknown(
    make_client: MakeClient, server: SandboxServer, provider: object, faults: list[str], **kw: Any
) -> tuple[payonce.Client, payonce.IntentRecord]:
    client = make_client(
        base_url=server.url,
        provider=provider,
        retry=payonce.RetryPolicy(max_attempts=len(faults), initial_wait=0),
    )
    server.script(faults)
    with pytest.raises(payonce.OutcomeUnknown):
        client.post("/v1/payments", **kw)
    (record,) = client.journal.find(kw["reference"])
    assert record.state is payonce.IntentState.UNKNOWN
    return client, record


def _require_query_lookups(client: payonce.Client, record: payonce.IntentRecord) -> None:
    request = _reconcile.lookup_request(client._core, record, client._http)
    assert "metadata[" in unquote(request.url.query.decode())


# The sandbox's search lives at /v1/payments/search; Stripe's at /v1/payment_intents/search.
SANDBOX_STRIPE = stripe_profile(search_path="/v1/payments/search")


def test_a_stripe_intent_that_executed_is_reconciled_by_metadata_search(
    start: Start, make_client: MakeClient
) -> None:
    server = start("stripe")
    client, record = _unknown(
        make_client, server, SANDBOX_STRIPE, ["drop_after"], data=PAYMENT, reference="order-s"
    )
    assert server.store.executions() == {record.key: 1}
    _require_query_lookups(client, record)

    (result,) = client.reconcile("order-s")

    assert (result.outcome, result.after) == ("found", payonce.IntentState.SUCCEEDED)
    replay = client.post("/v1/payments", data=PAYMENT, reference="order-s")
    assert _info(replay).replayed
    assert replay.json()["metadata"] == {"payonce_idempotency_key": record.key}
    assert server.store.executions() == {record.key: 1}


def test_a_stripe_intent_that_never_executed_goes_back_to_pending_and_pays_once(
    start: Start, make_client: MakeClient
) -> None:
    server = start("stripe")
    client, record = _unknown(
        make_client, server, SANDBOX_STRIPE, ["lock_timeout"] * 2, data=PAYMENT, reference="o-n"
    )
    assert server.store.total_executions() == 0
    _require_query_lookups(client, record)

    (result,) = client.reconcile(record.key)

    assert (result.outcome, result.after) == ("not_found", payonce.IntentState.PENDING)
    paid = client.post("/v1/payments", data=PAYMENT, reference="o-n")
    assert paid.status_code == 201
    assert server.store.executions() == {record.key: 1}


@pytest.mark.anyio
async def test_the_async_client_uses_the_same_stripe_hooks(
    start: Start, journal_path: Path
) -> None:
    server = start("stripe")
    server.script(["lock_timeout", "fail_after"])
    sent: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    async with payonce.AsyncClient(
        base_url=server.url,
        provider="stripe",
        api_key=DEFAULT_API_KEY,
        journal=journal_path,
        retry=payonce.RetryPolicy(initial_wait=0.001, max_wait=0.01),
    ) as client:
        client._http.event_hooks["request"].append(record)
        async with client.intent("order-async") as op:
            paid = await op.post("/v1/payments", data=PAYMENT)

    assert op.key is not None
    assert len(sent) == 3
    assert {r.content for r in sent} == {
        f"amount=4200&currency=eur&metadata[payonce_idempotency_key]={op.key}".encode()
    }
    assert paid.json()["metadata"] == {"payonce_idempotency_key": op.key}
    assert server.store.executions() == {op.key: 1}


# -- Adyen -----------------------------------------------------------------------------------


def test_adyen_refuses_a_key_longer_than_64_characters_before_sending(like: Like) -> None:
    server, client = like("adyen")

    with pytest.raises(payonce.ConfigurationError, match="at most 64"):
        client.post("/v1/payments", json=PAYMENT, key="k" * 65)
    assert client.post("/v1/payments", json=PAYMENT, key="k" * 64).status_code == 200
    assert server.store.total_executions() == 1


def test_the_adyen_sandbox_refuses_a_bearer_token(start: Start, make_client: MakeClient) -> None:
    server = start("adyen")
    bearer = make_client(base_url=server.url, provider="mollie")  # Authorization: Bearer

    with pytest.raises(payonce.ProviderError) as refused:
        bearer.post("/v1/payments", json=PAYMENT, reference="order-b")

    assert refused.value.status_code == 401
    assert refused.value.response.json()["errorType"] == "security"
    assert server.store.total_executions() == 0


def test_an_adyen_intent_is_reconciled_by_its_merchant_reference(
    start: Start, make_client: MakeClient
) -> None:
    server = start("adyen")
    profile = adyen_profile(lookup=adyen_reference_lookup("/v1/payments"))
    body = {**PAYMENT, "reference": "order-a1"}  # the merchant reference is the intent's
    client, record = _unknown(
        make_client, server, profile, ["drop_after"], json=body, reference="order-a1"
    )
    sent = _requests(client)

    (result,) = client.reconcile("order-a1")

    assert (result.outcome, result.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert dict(httpx.QueryParams(sent[0].url.query)) == {"reference": "order-a1"}
    assert sent[0].headers["X-API-Key"] == DEFAULT_API_KEY
    replay = client.post("/v1/payments", json=body, reference="order-a1")
    assert replay.json()["reference"] == "order-a1"
    assert server.store.executions() == {record.key: 1}


def test_the_registered_adyen_profile_reconciles_by_resending_under_its_key(
    start: Start, make_client: MakeClient
) -> None:
    # Adyen has no status look-up to ask with: within its key lifetime the journaled
    # request is resent under its key, which Adyen answers with what it executed.
    server = start("adyen")
    client, _ = _unknown(
        make_client, server, "adyen", ["drop_after"], json=PAYMENT, reference="order-a2"
    )

    (result,) = client.reconcile("order-a2")

    assert (result.outcome, result.after) == ("resent", payonce.IntentState.SUCCEEDED)
    assert server.store.executions() == {result.key: 1}


# -- Mollie ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("minutes_later", "resent"), [(30, True), (120, False)])
def test_mollie_resends_an_intent_that_may_have_executed_only_within_one_hour(
    minutes_later: int, resent: bool, start: Start, make_client: MakeClient
) -> None:
    server = start("mollie")
    record = leave_pending(make_client, "order-m", base_url=server.url, provider="mollie")
    assert server.store.executions() == {record.key: 1}

    server.advance_clock(minutes_later * 60)  # the provider's clock, as the client's
    later = make_client(
        base_url=server.url, provider="mollie", clock=lambda: time.time() + minutes_later * 60
    )
    sent = _requests(later)
    if resent:
        paid = later.post("/v1/payments", json=PAYMENT, reference="order-m")
        assert _info(paid).provider_replayed
        assert [r.method for r in sent] == ["HEAD", "POST"], "its time asked, then resent"
    else:
        with pytest.raises(payonce.OutcomeUnknown, match="key lifetime of 3600s"):
            later.post("/v1/payments", json=PAYMENT, reference="order-m")
        assert [r.method for r in sent] == ["HEAD"], "nothing was resent, only its time asked"
        assert later.journal.get(record.key).state is payonce.IntentState.UNKNOWN  # type: ignore[union-attr]
    assert server.store.executions() == {record.key: 1}


# -- a user-defined profile ------------------------------------------------------------------


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiles registered by a test are forgotten after it."""
    monkeypatch.setattr(profile_module, "_REGISTRY", dict(profile_module._REGISTRY))


@pytest.mark.usefixtures("registry")
def test_a_user_defined_profile_is_registered_and_used_by_name(
    start: Start, make_client: MakeClient
) -> None:
    server = start("generic", key_header="X-Acme-Request-Id", key_lifetime=6 * 3600.0)
    acme = payonce.ProviderProfile(
        name="acme",
        key_header="X-Acme-Request-Id",
        key_max_length=40,
        key_lifetime=6 * 3600.0,
        lookup=payonce.providers.Lookup(path="/v1/payments", by="reference", param="reference"),
    )
    payonce.register_profile(acme)
    client = make_client(base_url=server.url, provider="acme")
    sent = _requests(client)
    server.script(["fail_after"])

    with client.intent("order-acme") as op:
        paid = op.post("/v1/payments", json={**PAYMENT, "reference": "order-acme"})

    assert client.provider is acme
    assert client.provider.verifies, "a consistent look-up: verify before resend"
    posted = [r for r in sent if r.method == "POST"]
    assert [r.headers["X-Acme-Request-Id"] for r in posted] == [op.key], "not resent"
    assert [r.url.params["reference"] for r in sent if r.method == "GET"] == ["order-acme"]
    assert all("Idempotency-Key" not in r.headers for r in sent)
    assert paid.json()["status"] == "succeeded", "settled from the provider's record"
    assert server.store.executions() == {op.key: 1}
    with pytest.raises(payonce.ConfigurationError, match="at most 40"):
        client.post("/v1/payments", json=PAYMENT, key="k" * 41)


def test_the_built_in_profiles_are_registered_by_name() -> None:
    assert [get_profile(name) for name in ("generic", "stripe", "adyen", "mollie")] == [
        GENERIC,
        STRIPE,
        ADYEN,
        MOLLIE,
    ]
    assert (STRIPE.key_lifetime, ADYEN.key_lifetime, MOLLIE.key_lifetime) == (
        24 * 3600.0,
        7 * 24 * 3600.0,
        3600.0,
    )
    assert (STRIPE.key_max_length, ADYEN.key_max_length, MOLLIE.key_max_length) == (255, 64, 255)
    assert GENERIC.quote_key
    assert not any(p.quote_key for p in (STRIPE, ADYEN, MOLLIE))
    assert ADYEN.auth_headers("k") == {"X-API-Key": "k"}
    assert "x-api-key" in ADYEN.secret_headers()


# -- the hooks on their own ------------------------------------------------------------------


def _stripe_error(type_: str, code: str | None = None, message: str = "") -> dict[str, Any]:
    error = {"type": type_, "message": message}
    if code is not None:
        error["code"] = code
    return {"error": error}


MISMATCH_TEXT = (
    "Keys for idempotent requests can only be used with the same parameters they were first "
    "used with. Try using a key other than 'k1' if you meant to execute a different request."
)
IDEMPOTENCY = _stripe_error("idempotency_error")
IDEMPOTENCY_WORDED = _stripe_error("idempotency_error", message=MISMATCH_TEXT)
# The wording of older API versions, before the idempotency_error type existed.
OLD_MISMATCH = _stripe_error("invalid_request_error", message=MISMATCH_TEXT)
IN_USE = _stripe_error("invalid_request_error", "idempotency_key_in_use")
LOCKED = _stripe_error("invalid_request_error", "lock_timeout")
INVALID = _stripe_error("invalid_request_error", message="amount is invalid")
NO = {"Stripe-Should-Retry": "false"}
YES = {"Stripe-Should-Retry": "true"}


@pytest.mark.parametrize(
    ("status", "body", "headers", "outcome", "ambiguous"),
    [
        (400, IDEMPOTENCY, {}, Outcome.MISMATCH, False),
        (404, IDEMPOTENCY, {}, Outcome.MISMATCH, False),
        (409, IDEMPOTENCY_WORDED, {}, Outcome.MISMATCH, False),
        (400, OLD_MISMATCH, {}, Outcome.MISMATCH, False),
        # A 409 idempotency_error that does not say "other parameters" may be "key in use".
        (409, IDEMPOTENCY, {}, Outcome.RETRY, True),
        (409, IN_USE, {}, Outcome.RETRY, True),
        (409, LOCKED, {}, Outcome.RETRY, True),
        (409, None, {}, Outcome.RETRY, True),
        (409, INVALID, NO, Outcome.FAILED, False),
        (400, INVALID, {}, Outcome.FAILED, False),
        (400, INVALID, YES, Outcome.RETRY, True),
        (402, _stripe_error("card_error", "card_declined"), NO, Outcome.FAILED, False),
        (500, _stripe_error("api_error"), NO, Outcome.FAILED, False),
        (500, _stripe_error("api_error"), {}, Outcome.RETRY, True),
        (429, _stripe_error("invalid_request_error", "rate_limit"), {}, Outcome.RETRY, False),
        (200, {"id": "pi_1"}, NO, Outcome.SUCCEEDED, False),
    ],
)
def test_stripe_verdicts(
    status: int,
    body: object,
    headers: dict[str, str],
    outcome: Outcome,
    ambiguous: bool,
) -> None:
    verdict = classify_response(_response(status, body, headers), STRIPE)
    assert (verdict.outcome, verdict.ambiguous) == (outcome, ambiguous)


@pytest.mark.parametrize(
    ("status", "body", "headers", "outcome"),
    [
        (409, {"status": 409, "errorCode": "704", "errorType": "validation"}, {}, Outcome.RETRY),
        (422, {"status": 422, "errorCode": "704", "errorType": "validation"}, {}, Outcome.RETRY),
        # Validation errors are definitive, not key mismatches.
        (422, {"status": 422, "errorCode": "101", "errorType": "validation"}, {}, Outcome.FAILED),
        (422, {"status": 422, "errorCode": "101"}, {"Transient-Error": "true"}, Outcome.RETRY),
        (500, {"status": 500, "errorCode": "905"}, {}, Outcome.RETRY),
        (200, {"resultCode": "Refused"}, {}, Outcome.SUCCEEDED),
    ],
)
def test_adyen_verdicts(
    status: int, body: object, headers: dict[str, str], outcome: Outcome
) -> None:
    assert classify_response(_response(status, body, headers), ADYEN).outcome is outcome


@pytest.mark.parametrize(
    ("profile", "status", "body", "outcome"),
    [
        # Mollie's "API idempotency" page: a key reused with other parameters is a 400.
        pytest.param(
            MOLLIE,
            400,
            {"status": 400, "title": "Bad Request", "detail": "The Idempotency-Key was reused"},
            Outcome.MISMATCH,
            id="mollie-400-naming-the-key",
        ),
        pytest.param(
            MOLLIE,
            422,
            {"status": 422, "title": "Unprocessable Entity", "detail": "idempotency key reused"},
            Outcome.MISMATCH,
            id="mollie-422-naming-the-key",
        ),
        pytest.param(
            MOLLIE,
            400,
            {"status": 400, "title": "Bad Request", "detail": "The amount is invalid"},
            Outcome.FAILED,
            id="mollie-400-about-the-request",
        ),
        pytest.param(
            ADYEN,
            422,
            {"status": 422, "errorCode": "idempotency_key_mismatch", "errorType": "validation"},
            Outcome.MISMATCH,
            id="adyen-422-naming-the-key",
        ),
        pytest.param(
            ADYEN,
            422,
            {"status": 422, "errorCode": "101", "message": "Invalid card number"},
            Outcome.FAILED,
            id="adyen-422-about-the-request",
        ),
    ],
)
def test_a_refusal_naming_the_idempotency_key_is_a_mismatch_not_a_decline(
    profile: ProviderProfile, status: int, body: dict[str, Any], outcome: Outcome
) -> None:
    assert classify_response(_response(status, body), profile).outcome is outcome


def test_mollie_treats_422_as_a_definitive_refusal_not_a_mismatch() -> None:
    verdict = classify_response(_response(422, {"status": 422, "field": "amount"}), MOLLIE)
    assert verdict.outcome is Outcome.FAILED
    assert classify_response(_response(409), MOLLIE).outcome is Outcome.RETRY


@pytest.mark.parametrize(
    ("body", "content_type", "sent"),
    [
        (b"amount=4200", "application/x-www-form-urlencoded", b"amount=4200&" + b"%s=K-1"),
        (b"", "application/x-www-form-urlencoded; charset=utf-8", b"%s=K-1"),
        # Already tagged by the caller: their value is what Stripe sees.
        (b"metadata%5Bpayonce_idempotency_key%5D=mine", "application/x-www-form-urlencoded", None),
        (b'{"amount":4200}', "application/json", None),
        (b"raw", None, None),
    ],
)
def test_stripe_tags_form_bodies_only(
    body: bytes, content_type: str | None, sent: bytes | None
) -> None:
    tag = b"metadata[payonce_idempotency_key]"  # brackets literal, as stripe-python sends them
    expected = body if sent is None else sent.replace(b"%s", tag)
    assert STRIPE.prepare_body(body, content_type, "K-1") == expected


def test_stripe_search_quotes_the_key() -> None:
    lookup = STRIPE.lookup
    assert isinstance(lookup, Lookup)
    assert lookup.path == "/v1/payment_intents/search"
    assert lookup.params("01J'x\\y") == {
        "query": "metadata['payonce_idempotency_key']:'01J\\'x\\\\y'"
    }


@pytest.mark.parametrize(
    "body", [b"not json", b"[1]", b'{"error": "boom"}', b'{"error": {"code": ["x"]}}']
)
def test_stripe_reads_unexpected_409_bodies_as_a_conflict(body: bytes) -> None:
    verdict = classify_response(httpx.Response(409, content=body), STRIPE)
    assert (verdict.outcome, verdict.ambiguous) == (Outcome.RETRY, True)


@pytest.mark.parametrize(
    ("method", "path", "body", "tagged", "settled_by_the_object"),
    [
        ("POST", "/v1/payment_intents", b"amount=1&currency=eur", True, True),
        ("POST", "/v1/payment_intents", b"amount=1&confirm=true", True, False),
        ("POST", "/proxy/v1/refunds", b"payment_intent=pi_1", True, True),
        ("POST", "/v1/payment_intents/pi_1/confirm", b"", False, False),
        ("POST", "/v1/payment_intents/pi_1", b"metadata[a]=b", False, False),
        ("DELETE", "/v1/customers", b"", False, False),
    ],
)
def test_stripe_tags_and_settles_by_the_object_found_only_what_creates(
    method: str, path: str, body: bytes, tagged: bool, settled_by_the_object: bool
) -> None:
    # A confirm or a capture takes no metadata at Stripe (a 400), and an update's tag would
    # replace the key its object was created under; a bare creation did all it asked once
    # the object exists, whatever its status.
    assert STRIPE.prepares(method, path) is tagged
    assert STRIPE.lookup is not None
    assert STRIPE.lookup.creation_only(method, path, body) is settled_by_the_object
    # Only what carries the tag can be found by the search at all.
    assert STRIPE.lookup.finds(method, path) is tagged


@attrs.frozen
class _Journaled:
    method: str
    url: str
    body: bytes = b""


def test_an_empty_search_for_a_confirm_is_not_read_as_never_executed() -> None:
    # A confirm carries no metadata tag: Stripe's search could never find it, so its empty
    # answer must not tell the operator "the provider has no record" of a confirm that may
    # well have charged the card.
    assert STRIPE.lookup is not None
    empty = httpx.Response(200, json={"object": "search_result", "data": []})
    confirm = _Journaled("POST", "https://api.stripe.com/v1/payment_intents/pi_1/confirm")
    verdict = classify_lookup(empty, STRIPE.lookup, confirm)
    assert verdict.kind is LookupKind.ABSENT  # a resend under the key stays safe in its window
    assert "cannot see a POST /v1/payment_intents/pi_1/confirm" in verdict.detail
    assert "proves nothing" in verdict.detail
    create = _Journaled("POST", "https://api.stripe.com/v1/payment_intents", b"amount=1")
    assert classify_lookup(empty, STRIPE.lookup, create).detail == "the provider has no record"
