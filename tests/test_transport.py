"""``client.transport()``: payonce under plain httpx code, against the sandbox speaking
Stripe's PaymentIntents (create, then confirm), over loopback, on a real journal file.

The code under test is what a shop writes with httpx: it sets its own ``Authorization``,
never an idempotency key, and knows nothing of payonce but the transport and the block.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from helpers.payments import FAST_RETRY
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import DEFAULT_API_KEY, SandboxConfig, SandboxServer

STRIPE_LIKE = SandboxConfig.like("stripe")
AUTHORIZATION = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}
# Stripe's profile tags each creation's key into its metadata (for the status look-up),
# and leaves the confirm as written: Stripe, and its dialect here, refuse metadata there.
STRIPE = "stripe"
ORDER = {"amount": "4200", "currency": "eur", "payment_method": "pm_card_visa"}

MakeHttp = Callable[..., httpx.Client]


@pytest.fixture
def server(shared_sandboxes: SharedSandboxes) -> SandboxServer:
    return shared_sandboxes.get("stripe steps", STRIPE_LIKE)


def _options(server: SandboxServer, journal_path: Path) -> dict[str, Any]:
    return {
        "base_url": server.url,
        "provider": STRIPE,
        "account": "acct_shop",
        "journal": journal_path,
        "retry": FAST_RETRY,
        "timeout": 5.0,
        "transport_only": True,
    }


@pytest.fixture
def payonce_client(
    server: SandboxServer, journal_path: Path, closing: contextlib.ExitStack
) -> payonce.Client:
    """A client used only as a transport: the httpx code brings its own credentials."""
    return closing.enter_context(payonce.Client(**_options(server, journal_path)))


@pytest.fixture
def make_http(
    server: SandboxServer, payonce_client: payonce.Client, closing: contextlib.ExitStack
) -> MakeHttp:
    def make(**transport_options: Any) -> httpx.Client:
        transport = payonce_client.transport(**transport_options)
        http = httpx.Client(base_url=server.url, transport=transport, headers=AUTHORIZATION)
        return closing.enter_context(http)

    return make


@pytest.fixture
def http(make_http: MakeHttp) -> httpx.Client:
    return make_http()


def checkout(
    client: payonce.Client, http: httpx.Client, order: str, **more: str
) -> tuple[httpx.Response, httpx.Response]:
    """The shop's checkout: create the PaymentIntent, then confirm it."""
    with client.intent(order):
        created = http.post("/v1/payment_intents", data={**ORDER, "metadata[order]": order, **more})
        created.raise_for_status()
        confirmed = http.post(f"/v1/payment_intents/{created.json()['id']}/confirm")
    return created, confirmed


def _info(response: httpx.Response) -> payonce.ResponseInfo:
    info = payonce.response_info(response)
    assert info is not None
    return info


def _journal_rows(journal_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(journal_path) as conn:
        # All but the acknowledgement, which rides the journal's next write.
        intents = conn.execute(
            "SELECT key, reference, state, fingerprint, request_body, response_status, "
            "response_body, updated_at FROM intents ORDER BY key"
        ).fetchall()
        attempts = conn.execute("SELECT * FROM attempts ORDER BY key, number").fetchall()
    return [*intents, *attempts]


def _intents_by_order(server: SandboxServer) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for intent in server.store.payment_intents():
        found.setdefault(intent["metadata"].get("order", ""), []).append(intent)
    return found


# -- the two-step checkout --------------------------------------------------------------------


def test_a_two_step_checkout_through_the_transport_creates_once_and_confirms_once(
    payonce_client: payonce.Client, http: httpx.Client, server: SandboxServer
) -> None:
    created, confirmed = checkout(payonce_client, http, "order-1")
    assert created.status_code == 200
    assert confirmed.json()["status"] == "succeeded"
    key = _info(created).key
    assert _info(confirmed).key == f"{key}-step2"
    assert server.store.executions() == {key: 1, f"{key}-step2": 1}
    # A read passes through: not journaled, and answered by the provider.
    pi = http.get(f"/v1/payment_intents/{created.json()['id']}")
    assert pi.json()["status"] == "succeeded"
    assert payonce.response_info(pi) is None
    assert [r.key for r in payonce_client.journal.list_intents()] == [f"{key}-step2", key]
    assert payonce_client.unacknowledged() == []


def test_the_same_checkout_run_again_is_answered_from_the_journal(
    payonce_client: payonce.Client, http: httpx.Client, server: SandboxServer
) -> None:
    first = checkout(payonce_client, http, "order-2")
    executions = server.store.executions()
    again = checkout(payonce_client, http, "order-2")
    assert all(_info(r).replayed for r in again)
    assert [r.json() for r in again] == [r.json() for r in first]
    assert server.store.executions() == executions
    assert len(_intents_by_order(server)["order-2"]) == 1


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param(["drop_after"], id="answer-lost"),
        pytest.param(["fail_after"], id="503-after-executing"),
        pytest.param(["fail_before"], id="503-before-executing"),
        pytest.param(["lock_timeout"], id="409-in-flight"),
    ],
)
@pytest.mark.parametrize("step", [1, 2])
def test_a_step_meeting_a_fault_is_retried_under_its_key_and_executes_once(
    payonce_client: payonce.Client,
    http: httpx.Client,
    server: SandboxServer,
    faults: list[str],
    step: int,
) -> None:
    with payonce_client.intent("order-faults"):
        if step == 1:
            server.script(faults)
        created = http.post("/v1/payment_intents", data=ORDER)
        if step == 2:
            server.script(faults)
        confirmed = http.post(f"/v1/payment_intents/{created.json()['id']}/confirm")
    # The SDK's code reads the provider's own object either way, never an empty body.
    assert created.json()["object"] == "payment_intent"
    assert confirmed.json()["status"] == "succeeded"
    assert sorted(server.store.executions().values()) == [1, 1]
    assert len(server.store.payment_intents()) == 1


def test_a_step_whose_outcome_stays_unknown_raises_outcome_unknown_and_is_never_resent(
    payonce_client: payonce.Client, http: httpx.Client, server: SandboxServer
) -> None:
    def pay() -> None:
        with payonce_client.intent("order-unknown"):
            created = http.post("/v1/payment_intents", data=ORDER)
            http.post(f"/v1/payment_intents/{created.json()['id']}/confirm")

    # Every attempt of the confirm meets a 503: whether it executed, payonce cannot tell.
    server.script(["none"] + ["fail_before"] * 5)
    with pytest.raises(payonce.OutcomeUnknown) as unknown:
        pay()
    assert unknown.value.key is not None
    assert unknown.value.key.endswith("-step2")
    executions = server.store.executions()
    with pytest.raises(payonce.OutcomeUnknown):
        pay()  # run again: the create replays, the confirm is refused, nothing is sent
    assert server.store.executions() == executions
    assert list(executions.values()) == [1]  # the create; the confirm never executed


def test_a_created_step_recovered_by_reconciliation_hands_the_code_the_object_found(
    payonce_client: payonce.Client,
    http: httpx.Client,
    server: SandboxServer,
    journal_path: Path,
    closing: contextlib.ExitStack,
) -> None:
    once = payonce.RetryPolicy(max_attempts=1)
    impatient = closing.enter_context(
        payonce.Client(**{**_options(server, journal_path), "retry": once})
    )
    impatient_http = closing.enter_context(
        httpx.Client(base_url=server.url, transport=impatient.transport(), headers=AUTHORIZATION)
    )
    server.script(["drop_after"])  # the create executes; its answer is lost
    with pytest.raises(payonce.OutcomeUnknown) as unknown:
        checkout(impatient, impatient_http, "order-reconciled")
    assert len(server.store.payment_intents()) == 1

    # An operator reconciles it, with the account's key: the search finds the object by the
    # key tagged into its metadata, unconfirmed, which is all a creation asked for.
    operator = closing.enter_context(
        payonce.Client(**{**_options(server, journal_path), "api_key": DEFAULT_API_KEY})
    )
    (result,) = operator.reconcile(unknown.value.key or "")
    assert (result.outcome, result.after) == ("found", payonce.IntentState.SUCCEEDED)

    created, confirmed = checkout(payonce_client, http, "order-reconciled")
    assert created.json()["id"] == server.store.payment_intents()[0]["id"]
    assert created.json()["metadata"]["order"] == "order-reconciled"
    assert confirmed.json()["status"] == "succeeded"
    assert len(server.store.payment_intents()) == 1


def test_a_declined_confirmation_is_handed_to_the_code_as_the_provider_s_answer(
    payonce_client: payonce.Client, http: httpx.Client, server: SandboxServer
) -> None:
    declined = {**ORDER, "payment_method": "pm_card_visa_chargeDeclined"}

    def pay() -> httpx.Response:
        with payonce_client.intent("order-declined"):
            created = http.post("/v1/payment_intents", data=declined)
            return http.post(f"/v1/payment_intents/{created.json()['id']}/confirm")

    answer = pay()
    assert answer.status_code == 402
    assert answer.json()["error"]["decline_code"] == "generic_decline"
    assert _info(answer).state is payonce.IntentState.FAILED
    again = pay()
    assert (again.status_code, _info(again).replayed) == (402, True)
    assert sorted(server.store.executions().values()) == [1, 1]


def test_a_step_changed_between_runs_raises_intent_mismatch_naming_it(
    payonce_client: payonce.Client, http: httpx.Client, server: SandboxServer, journal_path: Path
) -> None:
    # The shop changed its code: step 2 confirms with a card where it confirmed without.
    created, _ = checkout(payonce_client, http, "order-changed")
    before = _journal_rows(journal_path)
    confirm = f"/v1/payment_intents/{created.json()['id']}/confirm"
    with payonce_client.intent("order-changed"):
        http.post("/v1/payment_intents", data={**ORDER, "metadata[order]": "order-changed"})
        with pytest.raises(payonce.IntentMismatch) as refused:
            http.post(confirm, data={"payment_method": "pm_card_visa"})
    assert f"step 2 of intent 'order-changed' (key {refused.value.key}), POST {confirm}," in str(
        refused.value
    )
    differs = str(refused.value).split("its request differs from the one journaled in ")[1]
    assert "the body" in differs.split(".")[0]
    assert _journal_rows(journal_path) == before
    assert len(server.store.executions()) == 2


# -- keys, credentials, where requests go ----------------------------------------------------


def test_a_key_the_caller_sets_on_purpose_is_that_step_s_key(
    payonce_client: payonce.Client, make_http: MakeHttp, server: SandboxServer
) -> None:
    http = make_http()
    with payonce_client.intent("order-own-key") as op:
        created = http.post(
            "/v1/payment_intents", data=ORDER, headers={"Idempotency-Key": "shop-key-1"}
        )
        confirmed = http.post(
            f"/v1/payment_intents/{created.json()['id']}/confirm",
            headers={"Idempotency-Key": "shop-key-2"},
        )
    assert (op.key, _info(confirmed).key) == ("shop-key-1", "shop-key-2")
    assert server.store.executions() == {"shop-key-1": 1, "shop-key-2": 1}


def test_an_sdk_s_disposable_keys_are_replaced_by_the_steps_own(
    payonce_client: payonce.Client, make_http: MakeHttp, server: SandboxServer
) -> None:
    http = make_http(sdk_keys="replace")

    def pay(random_key: str) -> httpx.Response:
        # As stripe-python does: a fresh uuid4 on every call, lost with the process.
        with payonce_client.intent("order-sdk-keys"):
            return http.post(
                "/v1/payment_intents", data=ORDER, headers={"Idempotency-Key": random_key}
            )

    first, again = pay("uuid-a"), pay("uuid-b")
    assert _info(again).replayed
    assert _info(first).key not in ("uuid-a", "uuid-b")
    assert list(server.store.executions()) == [_info(first).key]


def test_the_request_s_authorization_is_sent_and_never_journaled(
    payonce_client: payonce.Client, http: httpx.Client, server: SandboxServer, journal_path: Path
) -> None:
    checkout(payonce_client, http, "order-secret")
    payonce_client.journal.close()
    stored = b"".join(p.read_bytes() for p in journal_path.parent.glob(journal_path.name + "*"))
    assert DEFAULT_API_KEY.encode() not in stored
    assert b"Bearer" not in stored
    with sqlite3.connect(journal_path) as conn:
        headers = [row[0] for row in conn.execute("SELECT request_headers FROM intents")]
    assert headers
    assert all("authorization" not in h.lower() for h in headers)


def test_without_credentials_the_provider_s_refusal_reaches_the_code_and_nothing_executes(
    payonce_client: payonce.Client, server: SandboxServer, closing: contextlib.ExitStack
) -> None:
    http = closing.enter_context(
        httpx.Client(base_url=server.url, transport=payonce_client.transport())
    )
    with payonce_client.intent("order-no-key"):
        answer = http.post("/v1/payment_intents", data=ORDER)
    assert answer.status_code == 401
    assert server.store.executions() == {}


def test_a_request_elsewhere_than_the_client_s_base_url_is_refused_before_sending(
    payonce_client: payonce.Client, closing: contextlib.ExitStack, server: SandboxServer
) -> None:
    http = closing.enter_context(
        httpx.Client(base_url="http://127.0.0.1:9", transport=payonce_client.transport())
    )
    with (
        payonce_client.intent("order-elsewhere"),
        pytest.raises(payonce.ConfigurationError, match="not under this client's base_url"),
    ):
        http.post("/v1/payment_intents", data=ORDER)
    assert payonce_client.journal.list_intents() == []


# -- outside any block -------------------------------------------------------------------------


def test_a_mutating_request_outside_any_block_is_journaled_as_a_one_shot_intent(
    payonce_client: payonce.Client, make_http: MakeHttp, server: SandboxServer
) -> None:
    http = make_http()
    server.script(["drop_after"])  # its answer is lost once: payonce's retry recovers it
    keyed = http.post("/v1/payment_intents", data=ORDER, headers={"Idempotency-Key": "shop-k"})
    fresh = http.post("/v1/payment_intents", data=ORDER)
    assert _info(keyed).key == "shop-k"
    assert _info(fresh).key != "shop-k"
    assert keyed.json()["id"] != fresh.json()["id"]  # two calls, two payments, as asked
    assert len(server.store.payment_intents()) == 2
    assert {r.state for r in payonce_client.journal.list_intents()} == {
        payonce.IntentState.SUCCEEDED
    }


def test_outside_any_block_an_sdk_s_own_key_is_kept_even_when_replaced_in_blocks(
    payonce_client: payonce.Client, make_http: MakeHttp, server: SandboxServer
) -> None:
    http = make_http(sdk_keys="replace")
    # No block, no step to derive a key from: the SDK's key, which its own retry reuses,
    # is the one-shot's, so that retry is answered from the journal, not executed again.
    first = http.post("/v1/payment_intents", data=ORDER, headers={"Idempotency-Key": "sdk-1"})
    retry = http.post("/v1/payment_intents", data=ORDER, headers={"Idempotency-Key": "sdk-1"})
    assert (_info(first).key, _info(retry).replayed) == ("sdk-1", True)
    assert server.store.executions() == {"sdk-1": 1}


def test_a_strict_transport_refuses_a_mutating_request_outside_any_block(
    payonce_client: payonce.Client, make_http: MakeHttp, server: SandboxServer
) -> None:
    http = make_http(outside_intent="refuse")
    with pytest.raises(payonce.ConfigurationError, match="outside any intent block"):
        http.post("/v1/payment_intents", data=ORDER)
    assert http.get("/v1/payment_intents").status_code == 200  # reads are fine
    assert server.store.executions() == {}
    assert payonce_client.journal.list_intents() == []


# -- a block on one client, the request through another ---------------------------------------


def test_a_request_through_another_client_s_transport_inside_a_block_is_refused_unsent(
    payonce_client: payonce.Client,
    server: SandboxServer,
    journal_path: Path,
    closing: contextlib.ExitStack,
) -> None:
    # The code's block is on one client; its httpx client was given a second one's
    # transport (same settings, another object). Let through, the request would be a
    # one-shot under a fresh key, which a run again would pay again.
    twin = closing.enter_context(payonce.Client(**_options(server, journal_path)))
    http = closing.enter_context(
        httpx.Client(base_url=server.url, transport=twin.transport(), headers=AUTHORIZATION)
    )
    before = _journal_rows(journal_path)
    with payonce_client.intent("order-wrong-client") as op:
        with pytest.raises(payonce.ConfigurationError) as refused:
            http.post("/v1/payment_intents", data=ORDER)
        assert http.get("/v1/payment_intents").status_code == 200  # reads still pass
    message = str(refused.value)
    assert f"POST {server.url}/v1/payment_intents went through payonce.Client(" in message
    assert "intent 'order-wrong-client' on payonce.Client(" in message
    assert "another client object with the same settings" in message
    assert "nothing was journaled or sent" in message
    assert op.steps == []
    assert _journal_rows(journal_path) == before
    assert server.store.executions() == {}


@pytest.mark.anyio
async def test_an_async_transport_s_request_inside_the_sync_client_s_block_is_refused(
    payonce_client: payonce.Client,
    async_http: tuple[payonce.AsyncClient, httpx.AsyncClient],
    server: SandboxServer,
    journal_path: Path,
) -> None:
    async_client, http = async_http
    with (
        payonce_client.intent("order-sync-block"),
        pytest.raises(payonce.ConfigurationError) as refused,
    ):
        await http.post("/v1/payment_intents", data=ORDER)
    assert "went through payonce.AsyncClient(provider='stripe'" in str(refused.value)
    assert "`async with <AsyncClient>.intent(...)`" in str(refused.value)
    assert server.store.executions() == {}
    assert payonce_client.journal.list_intents() == []
    # The block on the client that carries the request: a step, as it should be.
    async with async_client.intent("order-async-block") as op:
        await http.post("/v1/payment_intents", data=ORDER)
    assert [key for _, key, _ in op.steps] == list(server.store.executions())


def test_a_block_whose_code_only_read_through_the_transport_does_not_warn(
    payonce_client: payonce.Client, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="payonce"):
        with payonce_client.intent("order-read-only"):
            http.get("/v1/payment_intents")  # wired to this client, just nothing to pay
        assert caplog.records == []
        with payonce_client.intent("order-not-wired"):
            pass
    assert [r.getMessage().split(" ended ")[0] for r in caplog.records] == [
        "the block of intent 'order-not-wired'"
    ]


def test_transport_options_are_checked(payonce_client: payonce.Client) -> None:
    with pytest.raises(payonce.ConfigurationError, match="sdk_keys"):
        payonce_client.transport(sdk_keys="keep")  # type: ignore[arg-type]
    with pytest.raises(payonce.ConfigurationError, match="outside_intent"):
        payonce_client.transport(outside_intent="allow")  # type: ignore[arg-type]


# -- async --------------------------------------------------------------------------------------


@pytest.fixture
async def async_http(
    server: SandboxServer, journal_path: Path
) -> AsyncIterator[tuple[payonce.AsyncClient, httpx.AsyncClient]]:
    client = payonce.AsyncClient(**_options(server, journal_path))
    http = httpx.AsyncClient(
        base_url=server.url, transport=client.transport(), headers=AUTHORIZATION
    )
    yield client, http
    await http.aclose()
    await client.aclose()


async def _async_checkout(
    client: payonce.AsyncClient, http: httpx.AsyncClient, order: str
) -> tuple[httpx.Response, httpx.Response]:
    async with client.intent(order):
        created = await http.post("/v1/payment_intents", data=ORDER)
        confirmed = await http.post(f"/v1/payment_intents/{created.json()['id']}/confirm")
    return created, confirmed


@pytest.mark.anyio
async def test_async_a_two_step_checkout_creates_once_confirms_once_and_replays(
    async_http: tuple[payonce.AsyncClient, httpx.AsyncClient], server: SandboxServer
) -> None:
    client, http = async_http
    server.script(["drop_after"])  # step 1's answer is lost once
    created, confirmed = await _async_checkout(client, http, "order-async")
    assert confirmed.json()["status"] == "succeeded"
    again = await _async_checkout(client, http, "order-async")
    assert all(_info(r).replayed for r in again)
    assert again[1].json() == confirmed.json()
    assert server.store.executions() == {
        _info(created).key: 1,
        f"{_info(created).key}-step2": 1,
    }


@pytest.mark.anyio
async def test_async_a_changed_step_and_a_strict_transport_refuse(
    async_http: tuple[payonce.AsyncClient, httpx.AsyncClient], server: SandboxServer
) -> None:
    client, http = async_http
    created, _ = await _async_checkout(client, http, "order-async-changed")
    async with client.intent("order-async-changed"):
        await http.post("/v1/payment_intents", data=ORDER)
        with pytest.raises(payonce.IntentMismatch, match="step 2 of intent 'order-async-changed'"):
            await http.post(
                f"/v1/payment_intents/{created.json()['id']}/confirm",
                data={"payment_method": "pm_card_visa"},
            )
    strict = httpx.AsyncClient(
        base_url=server.url,
        transport=client.transport(outside_intent="refuse"),
        headers=AUTHORIZATION,
    )
    async with strict:
        with pytest.raises(payonce.ConfigurationError, match="outside any intent block"):
            await strict.post("/v1/payment_intents", data=ORDER)
    assert len(server.store.executions()) == 2


@pytest.mark.anyio
async def test_async_an_unknown_step_raises_and_a_request_outside_a_block_is_one_shot(
    async_http: tuple[payonce.AsyncClient, httpx.AsyncClient], server: SandboxServer
) -> None:
    client, http = async_http
    server.script(["none"] + ["fail_before"] * 5)  # the confirm never gets an answer
    with pytest.raises(payonce.OutcomeUnknown, match="-step2"):
        await _async_checkout(client, http, "order-async-unknown")
    keyed = await http.post(
        "/v1/payment_intents", data=ORDER, headers={"Idempotency-Key": "shop-async-k"}
    )
    again = await http.post(
        "/v1/payment_intents", data=ORDER, headers={"Idempotency-Key": "shop-async-k"}
    )
    assert _info(keyed).key == "shop-async-k"
    assert _info(again).replayed
    assert sorted(server.store.executions().values()) == [1, 1]
