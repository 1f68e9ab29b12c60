"""Answers that are not the provider's: a load balancer's error page, a proxy's redirect, an
answer labelled gzip that is not.

None of them proves a refusal, and none of them may escape as a raw httpx error: the
attempt before may have executed, or this one did and its answer arrived mangled. The
intent is retried under its key and, if the page persists, goes unknown and is reconciled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest

import payonce
from helpers.payments import DECLINED, PAYMENT, MakeClient, leave_pending, make_unknown
from helpers.proxies import Page, mislabelling_in_front_of, pages_in_front_of
from payonce import ProviderProfile
from payonce._lifecycle import Outcome, classify_response
from payonce.providers import get_profile
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

# The built-in profiles, as a client given provider="stripe" (and so on) uses them.
GENERIC, SANDBOX, STRIPE, ADYEN, MOLLIE = map(
    get_profile, ["generic", "sandbox", "stripe", "adyen", "mollie"]
)
DAY = 24 * 3600.0

MakeAsyncClient = Callable[..., payonce.AsyncClient]

NGINX_404 = Page(404, "text/html", b"<html><body><center><h1>404 Not Found</h1></center></body>")
FOREIGN = {
    "a load balancer's 404 during a deploy": NGINX_404,
    "a proxy's 400": Page(400, "text/html", b"<html><h1>400 Bad Request</h1></html>"),
    "a proxy's 408": Page(408, "text/plain", b"request timed out"),
    "a proxy's 413": Page(413, "text/html", b"<html><h1>413 Request Entity Too Large</h1></html>"),
    "a redirect to https": Page(
        301, "text/html", b"<html>301 Moved</html>", (("location", "https://pay.test/"),)
    ),
    "a bare 307": Page(307, None, b"", (("location", "https://pay.test/v1/payments"),)),
    "an empty, typeless 404": Page(404, None, b""),
    "HTML labelled JSON, at the mismatch status": Page(
        422, "application/json", b"<html>Unprocessable</html>"
    ),
}


def _attempts(
    client: payonce.Client | payonce.AsyncClient, reference: str
) -> tuple[str, list[payonce.AttemptRecord]]:
    """The key of the intent named ``reference``, and its journaled attempts."""
    (record,) = client.journal.find(reference)
    return record.key, client.journal.attempts(record.key)


def _state(client: payonce.Client | payonce.AsyncClient, key: str) -> payonce.IntentState:
    record = client.journal.get(key)
    assert record is not None
    return record.state


# -- a page after a lost answer -----------------------------------------------------------------


@pytest.mark.parametrize("page", FOREIGN.values(), ids=FOREIGN.keys())
def test_a_page_after_a_lost_answer_is_no_refusal_and_the_payment_is_made_once(
    make_client: MakeClient, sandbox: SandboxServer, page: Page
) -> None:
    sandbox.script(["drop_after"])  # attempt 1 executes; its answer is lost
    with pages_in_front_of(sandbox.url, [None, page]) as balancer:
        client = make_client(base_url=balancer.url)
        paid = client.post("/v1/payments", json=PAYMENT, reference="order-5")

    assert paid.status_code == 201
    key, (lost, foreign, answered) = _attempts(client, "order-5")
    assert (lost.status_code, lost.ambiguous) == (None, True)
    assert (foreign.status_code, foreign.ambiguous) == (page.status, True)
    assert foreign.error is not None
    assert "not the provider's answer" in foreign.error, "what arrived is kept for diagnosis"
    assert answered.status_code == 201
    assert _state(client, key) is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {key: 1}


def test_a_page_that_persists_leaves_the_intent_unknown_and_reconciliation_finds_the_payment(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    sandbox.script(["drop_after"])
    with pages_in_front_of(sandbox.url, [None] + [NGINX_404] * 20) as balancer:
        behind = make_client(base_url=balancer.url)
        with pytest.raises(payonce.OutcomeUnknown, match="not the provider's answer"):
            behind.post("/v1/payments", json=PAYMENT, reference="order-lb")
        key, held = _attempts(behind, "order-lb")
        assert _state(behind, key) is payonce.IntentState.UNKNOWN

        # Never "use a new reference": the same order raises the same unknown, sends nothing.
        with pytest.raises(payonce.OutcomeUnknown):
            behind.post("/v1/payments", json=PAYMENT, reference="order-lb")
        assert _attempts(behind, "order-lb") == (key, held)

    (looked_up,) = make_client().reconcile("order-lb")
    assert (looked_up.outcome, looked_up.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert sandbox.store.executions() == {key: 1}


# -- what still settles, what still stays pending ------------------------------------------------


def test_the_provider_s_own_refusal_through_the_same_proxy_still_settles_failed(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    with pages_in_front_of(sandbox.url, []) as balancer:
        client = make_client(base_url=balancer.url)
        with pytest.raises(payonce.ProviderError) as refused:
            client.post("/v1/payments", json=DECLINED, reference="order-declined")
    assert refused.value.status_code == 402
    sandbox.stop()  # the replay needs no network
    with pytest.raises(payonce.ProviderError, match="HTTP 402"):
        client.post("/v1/payments", json=DECLINED, reference="order-declined")
    key, attempts = _attempts(client, "order-declined")
    assert _state(client, key) is payonce.IntentState.FAILED
    assert len(attempts) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_a_credentials_refusal_page_still_leaves_the_intent_pending(
    make_client: MakeClient, sandbox: SandboxServer, status: int
) -> None:
    page = Page(status, "text/html", b"<html>Access denied</html>")
    with pages_in_front_of(sandbox.url, [page]) as balancer:
        behind = make_client(base_url=balancer.url)
        with pytest.raises(payonce.AuthenticationError):
            behind.post("/v1/payments", json=PAYMENT, reference="order-denied")
    client = make_client()
    key, _ = _attempts(client, "order-denied")
    assert _state(client, key) is payonce.IntentState.PENDING
    paid = client.post("/v1/payments", json=PAYMENT, reference="order-denied")
    assert paid.status_code == 201
    assert sandbox.store.executions() == {key: 1}


def test_a_firewall_s_refusal_of_an_executed_payment_is_never_resent_once_its_key_expired(
    make_client: MakeClient,
) -> None:
    """A firewall that inspects answers lets the payment through, then answers its own 403
    page. payonce cannot tell that from a refusal before the request ran: the intent stays
    pending (AuthenticationError), but its attempt may have executed, so once the provider
    has forgotten the key it is never resent: it goes unknown, to be reconciled."""
    forgets = SandboxServer(SandboxConfig(key_lifetime=0.5))
    with forgets:
        page = Page(403, "text/html", b"<html>Request blocked</html>", after_relaying=True)
        with pages_in_front_of(forgets.url, [page]) as firewall:
            behind = make_client(base_url=firewall.url)
            with pytest.raises(payonce.AuthenticationError, match="not the provider") as refused:
                behind.post("/v1/payments", json=PAYMENT, reference="order-waf")
        assert "Nothing was executed" not in str(refused.value)
        key = refused.value.key
        assert forgets.store.executions() == {key: 1}
        (attempt,) = behind.journal.attempts(key)
        assert attempt.ambiguous
        assert behind.journal.get(key).state is payonce.IntentState.PENDING  # type: ignore[union-attr]

        forgets.advance_clock(2 * DAY)  # two days go by, at the provider and here
        later = make_client(base_url=forgets.url, clock=lambda: time.time() + 2 * DAY)
        with pytest.raises(payonce.OutcomeUnknown):
            later.post("/v1/payments", json=PAYMENT, reference="order-waf")

        assert forgets.store.executions() == {key: 1}, "never resent with its key forgotten"
        assert later.journal.get(key).state is payonce.IntentState.UNKNOWN  # type: ignore[union-attr]


def test_a_page_that_quotes_the_api_key_back_is_journaled_and_told_redacted(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    echo = b"denied: authorization=Bearer " + DEFAULT_API_KEY.encode()
    seen: list[str] = []

    class Ended(payonce.Hooks):
        def attempt_ended(self, event: payonce.hooks.AttemptEnded) -> None:
            seen.append(str(event.error))

    pages = [Page(404, "text/plain", echo), Page(403, "text/plain", echo)]
    with pages_in_front_of(sandbox.url, pages) as proxy:
        behind = make_client(base_url=proxy.url, hooks=[Ended()])
        with pytest.raises(payonce.AuthenticationError) as refused:
            behind.post("/v1/payments", json=PAYMENT, reference="order-echo")

    errors = [attempt.error or "" for attempt in behind.journal.attempts(refused.value.key)]
    assert len(errors) == 2
    for said in [*errors, *seen]:
        assert "[redacted]" in said
        assert DEFAULT_API_KEY not in said


# -- one decision per answer, per profile ----------------------------------------------------------


def _answer(status: int, content_type: str | None, body: bytes, **headers: str) -> httpx.Response:
    if content_type is not None:
        headers["content-type"] = content_type
    request = httpx.Request("POST", "https://provider.test/v1/payments")
    return httpx.Response(status, headers=headers, content=body, request=request)


def _json(status: int, content_type: str, document: object) -> httpx.Response:
    return _answer(status, content_type, json.dumps(document).encode())


# Each provider's refusal as its documentation shows it: always a JSON body.
GENUINE = [
    pytest.param(
        STRIPE,
        _json(
            404,
            "application/json",
            {"error": {"type": "invalid_request_error", "code": "resource_missing"}},
        ),
        Outcome.FAILED,
        id="stripe resource_missing",
    ),
    pytest.param(
        STRIPE,
        _json(402, "application/json", {"error": {"type": "card_error", "code": "card_declined"}}),
        Outcome.FAILED,
        id="stripe card_declined",
    ),
    pytest.param(
        ADYEN,
        _json(
            422,
            "application/json;charset=UTF-8",
            {
                "status": 422,
                "errorCode": "137",
                "message": "Invalid amount",
                "errorType": "validation",
            },
        ),
        Outcome.FAILED,
        id="adyen validation",
    ),
    pytest.param(
        ADYEN,
        _json(
            422,
            "application/problem+json",
            {
                "type": "https://docs.adyen.com/errors/validation",
                "title": "Invalid",
                "status": 422,
                "detail": "amount",
                "errorCode": "14_030",
            },
        ),
        Outcome.FAILED,
        id="adyen RFC 7807",
    ),
    pytest.param(
        MOLLIE,
        _json(
            422,
            "application/hal+json",
            {
                "status": 422,
                "title": "Unprocessable Entity",
                "detail": "amount too low",
                "field": "amount",
                "_links": {"documentation": {"href": "https://docs"}},
            },
        ),
        Outcome.FAILED,
        id="mollie",
    ),
    pytest.param(
        GENERIC,
        _json(400, "application/problem+json", {"title": "Idempotency-Key is missing"}),
        Outcome.FAILED,
        id="generic missing key",
    ),
    pytest.param(
        GENERIC,
        _json(422, "application/problem+json", {"title": "Idempotency-Key is already used"}),
        Outcome.MISMATCH,
        id="generic key reused",
    ),
    pytest.param(
        SANDBOX,
        _json(402, "application/json", {"error": {"type": "card_error"}}),
        Outcome.FAILED,
        id="sandbox declined",
    ),
]


@pytest.mark.parametrize(("profile", "response", "outcome"), GENUINE)
def test_a_provider_s_own_refusal_settles(
    profile: ProviderProfile, response: httpx.Response, outcome: Outcome
) -> None:
    verdict = classify_response(response, profile)
    assert (verdict.outcome, verdict.ambiguous) == (outcome, False)


PROFILES = [GENERIC, SANDBOX, STRIPE, ADYEN, MOLLIE]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("page", FOREIGN.values(), ids=FOREIGN.keys())
def test_a_page_that_is_not_the_provider_s_proves_no_refusal(
    profile: ProviderProfile, page: Page
) -> None:
    response = _answer(page.status, page.content_type, page.body, **dict(page.headers))
    verdict = classify_response(response, profile)
    assert (verdict.outcome, verdict.ambiguous) == (Outcome.RETRY, True)
    assert verdict.diagnosis is not None
    assert verdict.diagnosis.startswith("not the provider's answer")


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_the_statuses_that_never_settled_are_judged_as_before_whoever_wrote_them(
    profile: ProviderProfile,
) -> None:
    def page(status: int) -> httpx.Response:
        return _answer(status, "text/html", b"<html>...</html>")

    assert classify_response(page(401), profile).outcome is Outcome.REFUSED
    assert classify_response(page(403), profile).outcome is Outcome.REFUSED
    assert (classify_response(page(429), profile).ambiguous, page(429).status_code) == (
        False,
        429,
    )
    for status in (502, 503, 504):
        verdict = classify_response(page(status), profile)
        assert (verdict.outcome, verdict.ambiguous) == (Outcome.RETRY, True)


def test_stripe_s_do_not_retry_header_is_stripe_s_word_on_any_page() -> None:
    response = _answer(400, "text/html", b"<html></html>", **{"Stripe-Should-Retry": "false"})
    assert classify_response(response, STRIPE).outcome is Outcome.FAILED


def test_a_profile_that_declares_no_media_types_takes_any_refusal_as_the_provider_s() -> None:
    anything = ProviderProfile(name="xml-provider", answer_media_types=frozenset())
    assert classify_response(_answer(404, None, b""), anything).outcome is Outcome.FAILED
    assert classify_response(_answer(400, "text/xml", b"<no/>"), anything).outcome is (
        Outcome.FAILED
    )


# -- an answer that cannot be decoded --------------------------------------------------------------


def test_an_answer_that_cannot_be_decoded_is_ambiguous_not_a_raw_httpx_error(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    with mislabelling_in_front_of(sandbox.url, "POST") as proxy:
        client = make_client(base_url=proxy.url)
        with pytest.raises(payonce.OutcomeUnknown, match="could not be decoded"):
            client.post("/v1/payments", json=PAYMENT, reference="order-gzip")
        key, held = _attempts(client, "order-gzip")
        assert all(a.ambiguous and a.error == "DecodingError" for a in held)
        assert _state(client, key) is payonce.IntentState.UNKNOWN

        with pytest.raises(payonce.OutcomeUnknown):
            client.post("/v1/payments", json=PAYMENT, reference="order-gzip")
        assert _attempts(client, "order-gzip") == (key, held), "not a new attempt per call"

        (looked_up,) = client.reconcile("order-gzip")  # the look-up's GET is relayed intact

    assert (looked_up.outcome, looked_up.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert sandbox.store.executions() == {key: 1}


@pytest.mark.anyio
async def test_an_answer_that_cannot_be_decoded_is_ambiguous_for_the_async_client_too(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer
) -> None:
    with mislabelling_in_front_of(sandbox.url, "POST") as proxy:
        client = make_async_client(base_url=proxy.url)
        with pytest.raises(payonce.OutcomeUnknown, match="could not be decoded"):
            await client.post("/v1/payments", json=PAYMENT, reference="order-gzip")
        key, held = _attempts(client, "order-gzip")
        assert all(a.ambiguous and a.error == "DecodingError" for a in held)

        with pytest.raises(payonce.OutcomeUnknown):
            await client.post("/v1/payments", json=PAYMENT, reference="order-gzip")
        assert _attempts(client, "order-gzip") == (key, held)

        (looked_up,) = await client.reconcile("order-gzip")

    assert (looked_up.outcome, looked_up.after) == ("found", payonce.IntentState.SUCCEEDED)
    assert sandbox.store.executions() == {key: 1}


def test_a_look_up_answer_that_cannot_be_decoded_is_a_failed_look_up_asked_again(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = make_unknown(make_client, sandbox, "order-lookup", "drop_after")
    with mislabelling_in_front_of(sandbox.url, "GET") as proxy:
        (looked_up,) = make_client(base_url=proxy.url).reconcile("order-lookup")

    assert looked_up.after is payonce.IntentState.UNKNOWN
    assert looked_up.detail == "status look-up failed: DecodingError"
    (looked_up,) = make_client().reconcile("order-lookup")
    assert looked_up.after is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {record.key: 1}


# A profile that asks its look-up before it resends, and gives up on asking after 4 seconds:
# unreadable look-ups are asked again until then. Long enough for the first attempt to end
# and a look-up to be asked on a loaded machine (at one second, a load of 15 ran it out
# before the first look-up).
VERIFYING = ProviderProfile(
    name="verifying", lookup=payonce.providers.Lookup(path="/v1/payments"), max_processing=0.1
)
SHORT = payonce.RetryPolicy(max_attempts=5, initial_wait=0.1, max_wait=0.1, max_elapsed=4.0)


def _verified_in_vain(client: payonce.Client | payonce.AsyncClient, reference: str) -> str:
    """The key of an intent sent once, then only looked up, every look-up unreadable."""
    key, (only,) = _attempts(client, reference)
    assert only.ambiguous
    looks = client.journal.reconciliations(key)
    assert looks, "the look-ups were journaled"
    assert {(r.outcome, r.detail) for r in looks} == {
        ("error", "status look-up failed: DecodingError")
    }
    return key


@pytest.mark.slow
def test_a_verifying_look_up_that_cannot_be_decoded_sends_nothing_more(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    sandbox.script(["drop_after"])
    with mislabelling_in_front_of(sandbox.url, "GET") as proxy:
        client = make_client(base_url=proxy.url, provider=VERIFYING, retry=SHORT)
        with pytest.raises(payonce.OutcomeUnknown):
            client.post("/v1/payments", json=PAYMENT, reference="order-verify")

    key = _verified_in_vain(client, "order-verify")
    (looked_up,) = make_client(provider=VERIFYING).reconcile("order-verify")
    assert looked_up.after is payonce.IntentState.SUCCEEDED
    assert sandbox.store.executions() == {key: 1}


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_verifying_look_up_that_cannot_be_decoded_sends_nothing_more_async_too(
    make_async_client: MakeAsyncClient, sandbox: SandboxServer
) -> None:
    sandbox.script(["drop_after"])
    with mislabelling_in_front_of(sandbox.url, "GET") as proxy:
        client = make_async_client(base_url=proxy.url, provider=VERIFYING, retry=SHORT)
        with pytest.raises(payonce.OutcomeUnknown):
            await client.post("/v1/payments", json=PAYMENT, reference="order-verify")

    key = _verified_in_vain(client, "order-verify")
    assert sandbox.store.executions() == {key: 1}


@pytest.mark.parametrize("status", [204, 205])
def test_a_no_content_answer_labelled_json_is_a_success(status: int) -> None:
    """Web frameworks label an answer with no content by definition with their default
    type (FastAPI's 204 says application/json): there is nothing in it to misread."""
    for profile in (GENERIC, SANDBOX, STRIPE, ADYEN, MOLLIE):
        answer = _answer(status, "application/json", b"")
        assert classify_response(answer, profile).outcome is Outcome.SUCCEEDED, profile.name
    # A 200 that says JSON and carries nothing is still not the provider's.
    empty_200 = classify_response(_answer(200, "application/json", b""), GENERIC)
    assert empty_200.outcome is Outcome.RETRY
    assert empty_200.ambiguous


def test_a_no_content_answer_of_another_type_is_still_not_the_provider_s() -> None:
    """A proxy's bare ``204 text/html`` is not a framework's empty JSON answer."""
    for status in (204, 205):
        verdict = classify_response(_answer(status, "text/html", b""), GENERIC)
        assert verdict.outcome is Outcome.RETRY
        assert verdict.ambiguous


def test_a_key_the_excerpt_would_cut_in_half_is_redacted_whole(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    """The excerpt journaled of a foreign page is cut at 80 characters: redacted first,
    so a key crossing the cut leaves no part of itself behind."""
    padding = b"x" * (80 - len(b"Authorization: Bearer ") - 4)
    echo = padding + b"Authorization: Bearer " + DEFAULT_API_KEY.encode()
    with pages_in_front_of(sandbox.url, [Page(404, "text/plain", echo)] * 5) as proxy:
        behind = make_client(base_url=proxy.url, retry=payonce.RetryPolicy(max_attempts=1))
        with pytest.raises(payonce.OutcomeUnknown) as unknown:
            behind.post("/v1/payments", json=PAYMENT, reference="order-cut")
    (attempt,) = behind.journal.attempts(unknown.value.key)
    assert attempt.error is not None
    assert DEFAULT_API_KEY[:4] not in attempt.error.split("bytes: ", 1)[1]


def test_resume_says_a_firewall_s_refusal_may_have_executed(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    record = leave_pending(make_client, "order-rw")
    page = Page(403, "text/html", b"<html>Request blocked</html>", after_relaying=True)
    with pages_in_front_of(sandbox.url, [page]) as firewall:
        (result,) = make_client(base_url=firewall.url).resume()

    assert result.key == record.key
    assert result.state is payonce.IntentState.PENDING
    assert "may have executed" in result.detail
    assert "fix the API key" not in result.detail
    assert sandbox.store.executions() == {record.key: 1}


def test_a_key_recovery_took_from_a_function_is_redacted_from_what_is_journaled(
    make_client: MakeClient, sandbox: SandboxServer
) -> None:
    """A key that only a ``recovery_keys`` function gives (or the keyring) is not known
    when the client is built: once it is chosen to send with, it is kept out of what is
    written about the answer, as the client's own key is."""
    left = leave_pending(make_client, "order-recovered")
    echo = b"Authorization: Bearer " + DEFAULT_API_KEY.encode()
    with pages_in_front_of(sandbox.url, [Page(404, "text/plain", echo)] * 5) as proxy:
        recovering = make_client(
            base_url=proxy.url,
            api_key=None,
            transport_only=True,
            recovery_keys=lambda record: [DEFAULT_API_KEY],
            retry=payonce.RetryPolicy(max_attempts=1),
        )
        (resumed,) = recovering.resume()

    assert resumed.key == left.key
    written = [a.error for a in recovering.journal.attempts(left.key) if a.error is not None]
    assert written, "the echoing answer was journaled"
    assert all(DEFAULT_API_KEY not in error for error in written)
    assert DEFAULT_API_KEY not in repr(resumed)
