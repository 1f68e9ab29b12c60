"""The sandbox speaking Stripe's PaymentIntents API, driven by stripe-python itself.

stripe-python is the client here, as a shop runs it: it encodes the forms, sends the
Idempotency-Key, retries what it judges retryable and raises its own exceptions. What
each test proves is counted at the sandbox: executions per idempotency key.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import httpx
import pytest
import requests
import stripe

from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxConfig, SandboxServer

OTHER_API_KEY = "sk_test_other_shop"
OTHER_ACCOUNT = "acct_other_shop"
STRIPE_LIKE = SandboxConfig.like(
    "stripe", api_keys={DEFAULT_API_KEY: DEFAULT_ACCOUNT, OTHER_API_KEY: OTHER_ACCOUNT}
)

MakeStripe = Callable[..., stripe.StripeClient]


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("stripe resources", STRIPE_LIKE)


@pytest.fixture
def slow_server(closing: contextlib.ExitStack) -> SandboxServer:
    """A Stripe-speaking sandbox whose every execution takes 0.5 s: time to meet it in flight."""
    config = attrs.evolve(STRIPE_LIKE, processing_seconds=0.5)
    return closing.enter_context(SandboxServer(config))


@pytest.fixture
def make_stripe(closing: contextlib.ExitStack) -> MakeStripe:
    """stripe-python pointed at a sandbox, over its default HTTP client (requests), with a
    session of the test's own so that its connections are closed when the test ends."""

    def make(
        server: SandboxServer, api_key: str = DEFAULT_API_KEY, max_network_retries: int = 2
    ) -> stripe.StripeClient:
        session = closing.enter_context(requests.Session())
        http = stripe.RequestsClient(session=session)
        return stripe.StripeClient(
            api_key,
            base_addresses={"api": server.url},
            max_network_retries=max_network_retries,
            http_client=http,
        )

    return make


@pytest.fixture
def client(server: SandboxServer, make_stripe: MakeStripe) -> stripe.StripeClient:
    return make_stripe(server)


def _key() -> str:
    return f"order-{uuid.uuid4().hex}"


def _order(n: int = 1, **more: Any) -> dict[str, Any]:
    return {"amount": 4200 + n, "currency": "eur", "metadata": {"order": f"cmd_{n}"}, **more}


def _replayed(obj: stripe.StripeObject) -> bool:
    response = obj.last_response
    assert response is not None
    return response.headers.get("Idempotent-Replayed") == "true"


# -- the status flow ---------------------------------------------------------------------------


def test_a_payment_intent_is_created_confirmed_and_retrieved(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    key = _key()
    created = client.v1.payment_intents.create(
        params=_order(payment_method="pm_card_visa"), options={"idempotency_key": key}
    )

    assert created.id.startswith("pi_")
    assert (created.object, created.status) == ("payment_intent", "requires_confirmation")
    assert (created.amount, created.currency) == (4201, "eur")
    assert created.metadata.to_dict() == {"order": "cmd_1"}
    assert created.client_secret.startswith(f"{created.id}_secret_")
    assert created.livemode is False
    assert isinstance(created.created, int)

    paid = client.v1.payment_intents.confirm(created.id)

    assert (paid.id, paid.status, paid.amount_received) == (created.id, "succeeded", 4201)
    assert str(paid.latest_charge).startswith("ch_")
    assert client.v1.payment_intents.retrieve(created.id).status == "succeeded"
    assert server.store.execution_count(key) == 1


def test_without_a_payment_method_an_intent_waits_for_one_and_confirm_takes_it(
    client: stripe.StripeClient,
) -> None:
    created = client.v1.payment_intents.create(params=_order())
    assert (created.status, created.payment_method) == ("requires_payment_method", None)

    paid = client.v1.payment_intents.confirm(created.id, params={"payment_method": "pm_card_visa"})

    assert (paid.status, paid.payment_method) == ("succeeded", "pm_card_visa")


def test_confirm_true_at_creation_pays_in_one_request(client: stripe.StripeClient) -> None:
    paid = client.v1.payment_intents.create(
        params=_order(payment_method="pm_card_visa", confirm=True)
    )
    assert paid.status == "succeeded"

    held = client.v1.payment_intents.create(
        params=_order(payment_method="pm_card_visa", confirm=True, capture_method="manual")
    )
    assert (held.status, held.amount_capturable, held.amount_received) == (
        "requires_capture",
        4201,
        0,
    )


def test_a_declining_test_card_raises_card_error_and_leaves_the_intent_to_retry(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    created = client.v1.payment_intents.create(
        params=_order(payment_method="pm_card_visa_chargeDeclined")
    )
    key = _key()

    with pytest.raises(stripe.CardError) as declined:
        client.v1.payment_intents.confirm(created.id, options={"idempotency_key": key})

    assert declined.value.http_status == 402
    assert declined.value.code == "card_declined"
    error = declined.value.error
    assert error is not None
    assert (error.type, error.decline_code) == ("card_error", "generic_decline")
    assert error.payment_intent is not None
    assert error.payment_intent.status == "requires_payment_method"
    after = client.v1.payment_intents.retrieve(created.id)
    assert (after.status, after.payment_method) == ("requires_payment_method", None)
    assert after.last_payment_error is not None
    assert after.last_payment_error.code == "card_declined"
    assert server.store.execution_count(key) == 1, "a decline is an execution: it is stored"

    # The same key replays the decline; another card, under a new key, pays.
    with pytest.raises(stripe.CardError) as replayed:
        client.v1.payment_intents.confirm(created.id, options={"idempotency_key": key})
    assert replayed.value.headers is not None
    assert replayed.value.headers.get("Idempotent-Replayed") == "true"
    paid = client.v1.payment_intents.confirm(created.id, params={"payment_method": "pm_card_visa"})
    assert (paid.status, paid.last_payment_error) == ("succeeded", None)
    assert server.store.execution_count(key) == 1


def test_an_intent_that_succeeded_cannot_be_confirmed_again(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    paid = client.v1.payment_intents.create(
        params=_order(payment_method="pm_card_visa", confirm=True)
    )
    key = _key()

    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.payment_intents.confirm(paid.id, options={"idempotency_key": key})

    assert (refused.value.http_status, refused.value.code) == (
        400,
        "payment_intent_unexpected_state",
    )
    assert server.store.execution_count(key) == 0, "refused before executing: nothing kept"


def test_two_confirmations_under_two_keys_at_once_charge_once(
    slow_server: SandboxServer, make_stripe: MakeStripe
) -> None:
    # Two workers confirm the same intent at the same moment, each with a key of its own:
    # the idempotency layer cannot tell them apart, the intent's state must.
    client = make_stripe(slow_server, max_network_retries=0)
    created = client.v1.payment_intents.create(params=_order(payment_method="pm_card_visa"))

    def confirm(key: str) -> str:
        try:
            return str(
                client.v1.payment_intents.confirm(
                    created.id, options={"idempotency_key": key}
                ).status
            )
        except stripe.InvalidRequestError as refused:
            return str(refused.code)

    # Both are at the provider, held there until the other has arrived, however loaded the
    # machine: then both go on at once.
    with ThreadPoolExecutor(2) as pool:
        with slow_server.holding():
            confirming = [pool.submit(confirm, key) for key in ("worker-a", "worker-b")]
            assert slow_server.wait_held(2), "the two confirmations never met at the provider"
        outcomes = sorted(outcome.result() for outcome in confirming)

    assert outcomes == ["payment_intent_unexpected_state", "succeeded"]
    executions = slow_server.store.executions()
    assert executions.get("worker-a", 0) + executions.get("worker-b", 0) == 1


def test_a_missing_intent_is_resource_missing(client: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.payment_intents.retrieve("pi_does_not_exist")

    assert (missing.value.http_status, missing.value.code) == (404, "resource_missing")
    assert missing.value.param == "intent"


@pytest.mark.parametrize(
    ("params", "code", "param"),
    [
        ({"currency": "eur"}, "parameter_missing", "amount"),
        ({"amount": 100}, "parameter_missing", "currency"),
        ({"amount": "lots", "currency": "eur"}, "parameter_invalid_integer", "amount"),
        ({"amount": 100, "currency": "eur", "colour": "red"}, "parameter_unknown", "colour"),
        (
            {"amount": 100, "currency": "eur", "confirm": True},
            "payment_intent_unexpected_state",
            "payment_method",
        ),
    ],
)
def test_invalid_parameters_are_refused_in_stripe_s_words_and_execute_nothing(
    server: SandboxServer,
    client: stripe.StripeClient,
    params: dict[str, Any],
    code: str,
    param: str,
) -> None:
    key = _key()
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.payment_intents.create(params=params, options={"idempotency_key": key})  # type: ignore[arg-type]

    error = refused.value
    assert (error.http_status, error.code, error.param) == (400, code, param)
    assert server.store.total_executions() == 0


def test_intents_are_listed_newest_first_page_by_page(client: stripe.StripeClient) -> None:
    ids = [client.v1.payment_intents.create(params=_order(n)).id for n in range(3)]

    first = client.v1.payment_intents.list(params={"limit": 2})

    assert (first.object, first.has_more) == ("list", True)
    assert [pi.id for pi in first.data] == [ids[2], ids[1]]
    assert [pi.id for pi in first.auto_paging_iter()] == ids[::-1]


# -- search ----------------------------------------------------------------------------------


def test_search_finds_intents_by_metadata(client: stripe.StripeClient) -> None:
    first = client.v1.payment_intents.create(params=_order(1))
    client.v1.payment_intents.create(params=_order(2))

    found = client.v1.payment_intents.search(params={"query": "metadata['order']:'cmd_1'"})

    assert isinstance(found, stripe.SearchResultObject)
    assert found.object == "search_result"
    assert found.url == "/v1/payment_intents/search"
    assert (found.has_more, found.next_page) == (False, None)
    assert [pi.id for pi in found.data] == [first.id]
    assert isinstance(found.data[0], stripe.PaymentIntent)
    nothing = client.v1.payment_intents.search(params={"query": "metadata['order']:'cmd_9'"})
    assert (nothing.data, nothing.has_more) == ([], False)


def test_search_combines_clauses_and_pages_newest_first(client: stripe.StripeClient) -> None:
    ids = [
        client.v1.payment_intents.create(
            params=_order(n, payment_method="pm_card_visa", confirm=n % 2 == 0)
        ).id
        for n in range(5)
    ]

    paid = client.v1.payment_intents.search(
        params={"query": "status:'succeeded' AND amount>4200", "limit": 1}
    )
    assert paid.has_more
    assert paid.next_page is not None
    assert [pi.id for pi in paid.auto_paging_iter()] == [ids[4], ids[2]]
    either = client.v1.payment_intents.search(
        params={"query": "metadata['order']:'cmd_0' OR metadata['order']:'cmd_3'"}
    )
    assert [pi.id for pi in either.data] == [ids[3], ids[0]]
    unpaid = client.v1.payment_intents.search(
        params={"query": "-status:'succeeded' AND currency:'eur'"}
    )
    assert [pi.id for pi in unpaid.data] == [ids[3], ids[1]]


@pytest.mark.parametrize(
    "query",
    [
        "",
        "metadata['order']",
        "colour:'red'",
        "status:'x' AND currency:'eur' OR amount:1",
        "amount~1",
    ],
)
def test_a_malformed_search_query_is_refused(client: stripe.StripeClient, query: str) -> None:
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.payment_intents.search(params={"query": query})

    assert (refused.value.http_status, refused.value.param) == (400, "query")


# -- idempotency -----------------------------------------------------------------------------


def test_the_same_key_and_parameters_replay_the_first_answer(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    key = _key()
    first = client.v1.payment_intents.create(params=_order(), options={"idempotency_key": key})
    client.v1.payment_intents.confirm(first.id, params={"payment_method": "pm_card_visa"})

    again = client.v1.payment_intents.create(params=_order(), options={"idempotency_key": key})

    assert again.id == first.id
    assert _replayed(again)
    assert not _replayed(first)
    # As Stripe does, the stored answer is replayed as it was, not the object as it is now.
    assert again.status == "requires_payment_method"
    assert again.to_dict() == first.to_dict()
    assert server.store.execution_count(key) == 1
    assert len(server.store.payment_intents()) == 1


def test_the_same_key_with_other_parameters_raises_idempotency_error(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    key = _key()
    client.v1.payment_intents.create(params=_order(1), options={"idempotency_key": key})

    with pytest.raises(stripe.IdempotencyError) as refused:
        client.v1.payment_intents.create(params=_order(2), options={"idempotency_key": key})

    assert refused.value.http_status == 400
    assert "can only be used with the same parameters" in str(refused.value.user_message)
    assert key in str(refused.value.user_message)
    assert server.store.execution_count(key) == 1


def test_a_key_reused_on_another_endpoint_raises_idempotency_error(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    key = _key()
    created = client.v1.payment_intents.create(
        params=_order(payment_method="pm_card_visa"), options={"idempotency_key": key}
    )

    with pytest.raises(stripe.IdempotencyError) as refused:
        client.v1.payment_intents.confirm(created.id, options={"idempotency_key": key})

    message = str(refused.value.user_message)
    assert "same endpoint" in message
    confirm = f"POST /v1/payment_intents/{created.id}/confirm"
    assert f"('POST /v1/payment_intents' vs '{confirm}')" in message
    assert client.v1.payment_intents.retrieve(created.id).status == "requires_confirmation"


def test_a_key_in_flight_is_409_and_stripe_python_retries_it_into_the_one_intent(
    slow_server: SandboxServer, make_stripe: MakeStripe
) -> None:
    impatient = make_stripe(slow_server, max_network_retries=0)
    patient = make_stripe(slow_server)
    key = _key()

    def create_at_once(client: stripe.StripeClient, start: threading.Barrier | None = None) -> Any:
        if start is not None:
            start.wait()
        try:
            return client.v1.payment_intents.create(
                params=_order(), options={"idempotency_key": key}
            )
        except stripe.APIError as error:
            return error

    # Two callers, one key: the second meets the first in flight (held at the provider).
    with ThreadPoolExecutor(1) as pool:
        with slow_server.holding():
            creating = pool.submit(create_at_once, impatient)
            assert slow_server.wait_held(1), "the first request never reached the provider"
            in_flight = create_at_once(impatient)
        created = creating.result()
    assert isinstance(in_flight, stripe.APIError), in_flight
    assert isinstance(created, stripe.PaymentIntent), created
    # stripe-python raises a 409 as APIError, whose code only its error object carries.
    assert in_flight.http_status == 409
    assert in_flight.error is not None
    assert in_flight.error.code == "idempotency_key_in_use"
    assert in_flight.headers is not None
    assert in_flight.headers.get("Stripe-Should-Retry") == "true"

    # With retries, stripe-python backs off the 409 and receives the one intent.
    key = _key()
    start = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: create_at_once(patient, start), range(2)))
    assert all(isinstance(pi, stripe.PaymentIntent) for pi in both)
    assert both[0].id == both[1].id
    assert sorted(_replayed(pi) for pi in both) == [False, True]
    assert slow_server.store.execution_count(key) == 1
    assert len(slow_server.store.payment_intents()) == 2, "one per key"
    assert created.id != both[0].id


def test_keys_are_scoped_per_account(server: SandboxServer, make_stripe: MakeStripe) -> None:
    ours, theirs = make_stripe(server), make_stripe(server, OTHER_API_KEY)
    key = _key()

    mine = ours.v1.payment_intents.create(params=_order(1), options={"idempotency_key": key})
    other = theirs.v1.payment_intents.create(params=_order(2), options={"idempotency_key": key})

    assert mine.id != other.id
    assert not _replayed(other)
    assert server.store.execution_count(key) == 2, "one per account"
    with pytest.raises(stripe.InvalidRequestError):
        theirs.v1.payment_intents.retrieve(mine.id)
    assert [
        pi.id for pi in theirs.v1.payment_intents.search(params={"query": "currency:'eur'"}).data
    ] == [other.id]


# -- faults ----------------------------------------------------------------------------------


def test_a_503_before_executing_is_retried_by_stripe_python_and_executes_once(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    server.script(["fail_before"])
    key = _key()

    created = client.v1.payment_intents.create(params=_order(), options={"idempotency_key": key})

    assert not _replayed(created), "the retry was the first execution"
    assert server.store.execution_count(key) == 1
    assert server.store.total_executions() == 1


def test_a_503_after_executing_is_retried_into_the_replay(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    server.script(["fail_after"])
    key = _key()

    created = client.v1.payment_intents.create(params=_order(), options={"idempotency_key": key})

    assert _replayed(created), "executed by the first attempt, whose answer was lost"
    assert server.store.execution_count(key) == 1
    assert len(server.store.payment_intents()) == 1


def test_a_503_is_raised_as_api_error_when_stripe_python_may_not_retry(
    server: SandboxServer, make_stripe: MakeStripe
) -> None:
    client = make_stripe(server, max_network_retries=0)
    server.script(["fail_after"])
    key = _key()

    with pytest.raises(stripe.APIError) as lost:
        client.v1.payment_intents.create(params=_order(), options={"idempotency_key": key})

    assert lost.value.http_status == 503
    assert lost.value.headers is not None
    assert lost.value.headers.get("Stripe-Should-Retry") == "true"
    assert server.store.execution_count(key) == 1, "it executed all the same"
    # The caller that keeps its key learns the outcome; one that drew a new key would pay twice.
    again = client.v1.payment_intents.create(params=_order(), options={"idempotency_key": key})
    assert _replayed(again)
    assert server.store.execution_count(key) == 1


def test_a_connection_dropped_after_executing_is_told_by_the_replay_under_the_same_key(
    server: SandboxServer, client: stripe.StripeClient
) -> None:
    server.script(["drop_after"])
    key = _key()
    order = _order(payment_method="pm_card_visa", confirm=True)

    # stripe-python's requests client does not retry an answer cut off mid-body (requests'
    # ChunkedEncodingError is no ConnectionError): the caller is left not knowing.
    with pytest.raises(stripe.APIConnectionError) as lost:
        client.v1.payment_intents.create(params=order, options={"idempotency_key": key})
    assert lost.value.should_retry is False
    assert server.store.execution_count(key) == 1, "it executed all the same"

    paid = client.v1.payment_intents.create(params=order, options={"idempotency_key": key})

    assert (paid.status, _replayed(paid)) == ("succeeded", True)
    assert server.store.execution_count(key) == 1


def test_faults_strike_confirm_too(server: SandboxServer, client: stripe.StripeClient) -> None:
    created = client.v1.payment_intents.create(params=_order(payment_method="pm_card_visa"))
    server.script(["fail_after"])
    key = _key()

    paid = client.v1.payment_intents.confirm(created.id, options={"idempotency_key": key})

    assert (paid.status, _replayed(paid)) == ("succeeded", True)
    assert server.store.execution_count(key) == 1


# -- on the wire ------------------------------------------------------------------------------


def test_a_post_without_a_key_executes_every_time_as_on_stripe(server: SandboxServer) -> None:
    # stripe-python always sends a key; a raw client may not, and Stripe then executes each.
    with httpx.Client(base_url=server.url, auth=(DEFAULT_API_KEY, "")) as http:
        answers = [
            http.post("/v1/payment_intents", data={"amount": "100", "currency": "usd"})
            for _ in range(2)
        ]

    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["id"] != answers[1].json()["id"]
    assert server.store.executions() == {"": 2}


def test_a_json_body_is_refused(server: SandboxServer) -> None:
    headers = {"Authorization": f"Bearer {DEFAULT_API_KEY}", "Idempotency-Key": _key()}
    with httpx.Client(base_url=server.url, headers=headers) as http:
        refused = http.post("/v1/payment_intents", json={"amount": 100, "currency": "usd"})

    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "form-encoded" in refused.json()["error"]["message"]
    assert server.store.total_executions() == 0


def test_payment_intents_are_served_in_stripe_s_dialect_only(
    make_sandbox: Callable[..., SandboxServer],
) -> None:
    server = make_sandbox()
    with httpx.Client(base_url=server.url, auth=(DEFAULT_API_KEY, "")) as http:
        assert http.get("/v1/payment_intents/pi_1").status_code == 404
        assert http.post("/v1/payment_intents", data={"amount": "1"}).status_code in (404, 405)
