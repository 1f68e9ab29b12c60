"""Stripe's PaymentIntents API, served by the sandbox in Stripe's dialect for stripe-python.

``POST /v1/payment_intents`` (create, optionally ``confirm=true``), ``POST
/v1/payment_intents/{id}/confirm``, ``GET /v1/payment_intents/{id}``, ``GET
/v1/payment_intents`` (list) and ``GET /v1/payment_intents/search``, form-encoded as
Stripe's v1 API is. The POSTs run through the same ``KeyGuard`` as the sandbox's own
payments (faults, then the key: replay with ``Idempotent-Replayed: true``, 409 while in
flight, 400 ``idempotency_error`` for other parameters or another endpoint), and each
execution is counted under its key. Keys are scoped per account, as Stripe's are. A POST
without a key executes every time, as on Stripe, and is counted under the key ``""``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from payonce.sandbox._config import SandboxConfig
from payonce.sandbox._dialects import dumps
from payonce.sandbox._errors import ApiError
from payonce.sandbox._guard import UNGUARDED, KeyGuard
from payonce.sandbox._intents import Attempt, Refusal, StripeIntent, confirmed, new_intent
from payonce.sandbox._requests import authenticate, forced_fault, idempotency_key, is_form
from payonce.sandbox._store import Claimed, IntentChange, SandboxStore, StoredResponse
from payonce.sandbox._stripe_params import SearchQuery, endpoint_of, fingerprint, form_params

CREATE: Final = "POST /v1/payment_intents"
SEARCH_URL: Final = "/v1/payment_intents/search"
_MAX_AMOUNT: Final = 99_999_999  # Stripe's largest amount: 999,999.99 in a 2-decimal currency
_CAPTURE_METHODS: Final = frozenset({"automatic", "automatic_async", "manual"})
# Parameters Stripe takes that change nothing the sandbox models: accepted (and part of
# the key's fingerprint) so that ordinary stripe-python calls are not refused.
_IGNORED: Final = frozenset(
    {"expand", "return_url", "off_session", "receipt_email", "use_stripe_sdk", "mandate_data"}
)
_CREATE_FIELDS: Final = frozenset(
    {
        "amount",
        "currency",
        "metadata",
        "payment_method",
        "payment_method_types",
        "capture_method",
        "confirm",
        "description",
        "automatic_payment_methods",
        "statement_descriptor",
        "setup_future_usage",
    }
    | _IGNORED
)
_CONFIRM_FIELDS: Final = frozenset({"payment_method", "capture_method"} | _IGNORED)


def _missing(name: str) -> ApiError:
    return ApiError(
        400, "parameter_missing", f"Missing required param: {name}.", fields={"param": name}
    )


def _invalid(name: str, message: str) -> ApiError:
    return ApiError(400, "invalid_request", message, fields={"param": name})


def _no_such_intent(intent_id: str) -> ApiError:
    return ApiError(
        404, "not_found", f"No such payment_intent: '{intent_id}'", fields={"param": "intent"}
    )


def _refused(refusal: Refusal) -> ApiError:
    fields = {} if refusal.param is None else {"param": refusal.param}
    return ApiError(refusal.status, refusal.type, refusal.message, fields=fields)


def _only(params: Mapping[str, Any], known: frozenset[str]) -> None:
    for name in params:
        if name not in known:
            raise ApiError(
                400,
                "parameter_unknown",
                f"Received unknown parameter: {name}",
                fields={"param": name},
            )


def _string(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _invalid(name, f"Invalid string: {name} must be a string.")
    return value


def _boolean(params: Mapping[str, Any], name: str) -> bool:
    value = params.get(name, "false")
    if value not in ("true", "false"):
        raise _invalid(name, f"Invalid boolean: {value!r}")
    return bool(value == "true")


def _payment_method(params: Mapping[str, Any]) -> str | None:
    method = _string(params, "payment_method")
    if method is not None and not method.startswith("pm_"):
        # The sandbox keeps no PaymentMethods: Stripe's test ids (pm_card_visa...) are all.
        raise ApiError(
            400,
            "not_found",
            f"No such PaymentMethod: '{method}'",
            fields={"param": "payment_method"},
        )
    return method


def _capture_method(params: Mapping[str, Any]) -> str | None:
    method = _string(params, "capture_method")
    if method is not None and method not in _CAPTURE_METHODS:
        raise _invalid(
            "capture_method",
            f"Invalid capture_method: must be one of {', '.join(sorted(_CAPTURE_METHODS))}",
        )
    return method


@attrs.frozen
class _Create:
    """A create request's parameters, checked."""

    amount: int
    currency: str
    metadata: Mapping[str, str]
    payment_method: str | None
    payment_method_types: tuple[str, ...]
    capture_method: str
    description: str | None
    confirm: bool

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> _Create:
        _only(params, _CREATE_FIELDS)
        raw_amount = params.get("amount")
        if raw_amount is None:
            raise _missing("amount")
        if not isinstance(raw_amount, str) or not (raw_amount.isascii() and raw_amount.isdigit()):
            raise ApiError(
                400,
                "parameter_invalid_integer",
                f"Invalid integer: {raw_amount}",
                fields={"param": "amount"},
            )
        amount = int(raw_amount)
        if not 0 < amount <= _MAX_AMOUNT:
            raise _invalid("amount", f"Amount must be between 1 and {_MAX_AMOUNT}.")
        currency = _string(params, "currency")
        if currency is None:
            raise _missing("currency")
        if not (len(currency) == 3 and currency.isascii() and currency.isalpha()):
            raise _invalid("currency", f"Invalid currency: {currency.lower()}.")
        types = params.get("payment_method_types", ["card"])
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise _invalid("payment_method_types", "payment_method_types must be a list.")
        confirm = _boolean(params, "confirm")
        method = _payment_method(params)
        if confirm and method is None:
            raise ApiError(
                400,
                "payment_intent_unexpected_state",
                "You cannot confirm this PaymentIntent because it's missing a payment method. "
                "To confirm the PaymentIntent, pass a payment_method.",
                fields={"param": "payment_method"},
            )
        return cls(
            amount=amount,
            currency=currency.lower(),
            metadata=_metadata(params.get("metadata")),
            payment_method=method,
            payment_method_types=tuple(types),
            capture_method=_capture_method(params) or "automatic_async",
            description=_string(params, "description"),
            confirm=confirm,
        )


def _metadata(value: Any) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _invalid(
            "metadata", "Invalid metadata: values must be strings (metadata[key]=value)."
        )
    # An empty value unsets a key: on a new object, it is simply not set.
    return {name: item for name, item in value.items() if item != ""}


def _answer(attempt: Attempt) -> StoredResponse:
    status, body = attempt.answer()
    return StoredResponse(status, dumps(body))


@attrs.frozen
class PaymentIntentsApi:
    """``/v1/payment_intents``: Stripe's resource, under the sandbox's keys and faults."""

    config: SandboxConfig
    store: SandboxStore
    guard: KeyGuard

    async def _form(self, request: Request) -> dict[str, Any]:
        body = await request.body()
        if body and not is_form(request):
            raise ApiError(
                400,
                "invalid_request",
                "Stripe's v1 API takes form-encoded bodies (application/x-www-form-urlencoded).",
            )
        return form_params(body)

    def _key(self, request: Request) -> str | None:
        if self.config.key_header.lower() not in request.headers:
            return None
        return idempotency_key(request, self.config.key_header)

    async def _claim(
        self, account: str, key: str | None, endpoint: str, params: Mapping[str, Any]
    ) -> Claimed | Response:
        if key is None:
            return Claimed(UNGUARDED)

        def other_endpoint(stored: str) -> str | None:
            first = endpoint_of(stored) or "POST /v1/payments"
            if first == endpoint:
                return None
            return (
                f"Keys for idempotent requests can only be used for the same endpoint they "
                f"were first used for ('{first}' vs '{endpoint}'). Try using a key other than "
                f"'{key}' if you meant to execute a different request."
            )

        return await self.guard.claim(
            account, key, fingerprint(endpoint, params), mismatch=other_endpoint
        )

    async def create(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        key = self._key(request)
        forced = forced_fault(request)
        params = await self._form(request)
        create = _Create.parse(params)
        # Only well-formed requests draw faults, so a 400 never shifts a seeded run.
        plan = await self.guard.faults_before(forced)
        claim = await self._claim(account, key, CREATE, params)
        if not isinstance(claim, Claimed):
            return claim  # the stored answer, replayed
        stored = await self.guard.execute(
            account, key or "", claim, lambda: self._record_create(account, key, claim, create)
        )
        return self.guard.faults_after(plan, stored)

    def _record_create(
        self, account: str, key: str | None, claim: Claimed, create: _Create
    ) -> StoredResponse:
        intent = new_intent(
            account,
            amount=create.amount,
            currency=create.currency,
            payment_method=create.payment_method,
            payment_method_types=create.payment_method_types,
            capture_method=create.capture_method,
            metadata=create.metadata,
            description=create.description,
            now=self.store.clock.now(),
        )
        attempt = Attempt(intent)
        if create.confirm:
            outcome = confirmed(intent, None)
            if isinstance(outcome, Refusal):  # not for a new intent with a payment method
                raise _refused(outcome)
            attempt = outcome
        response = _answer(attempt)
        self.store.record_intent(claim.token, key or "", IntentChange(attempt.intent, response))
        return response

    async def confirm(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        intent_id = request.path_params["intent_id"]
        key = self._key(request)
        forced = forced_fault(request)
        params = await self._form(request)
        _only(params, _CONFIRM_FIELDS)
        method = _payment_method(params)
        capture = _capture_method(params)
        if await run_in_threadpool(self.store.find_intent, account, intent_id) is None:
            raise _no_such_intent(intent_id)
        plan = await self.guard.faults_before(forced)
        endpoint = f"POST /v1/payment_intents/{intent_id}/confirm"
        claim = await self._claim(account, key, endpoint, params)
        if not isinstance(claim, Claimed):
            return claim

        def decide(intent: StripeIntent | None) -> IntentChange | Refusal:
            if intent is None:
                return Refusal(404, "not_found", f"No such payment_intent: '{intent_id}'", "intent")
            if capture is not None:
                intent = attrs.evolve(intent, capture_method=capture)
            outcome = confirmed(intent, method)
            if isinstance(outcome, Refusal):
                return outcome
            return IntentChange(outcome.intent, _answer(outcome))

        def record() -> StoredResponse:
            outcome = self.store.change_intent(claim.token, account, key or "", intent_id, decide)
            if isinstance(outcome, Refusal):
                # Refused by the intent's state: nothing executed, so the key is released.
                raise _refused(outcome)
            return outcome.response

        stored = await self.guard.execute(account, key or "", claim, record)
        return self.guard.faults_after(plan, stored)

    async def retrieve(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        intent_id = request.path_params["intent_id"]
        intent = await run_in_threadpool(self.store.find_intent, account, intent_id)
        if intent is None:
            raise _no_such_intent(intent_id)
        return JSONResponse(intent.to_json())

    async def list(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        limit = _limit(request)
        after = request.query_params.get("starting_after")
        intents = await run_in_threadpool(self.store.account_intents, account)
        if after is not None:
            ids = [intent.id for intent in intents]
            if after not in ids:
                raise _no_such_intent(after)
            intents = intents[ids.index(after) + 1 :]
        return JSONResponse(
            {
                "object": "list",
                "data": [intent.to_json() for intent in intents[:limit]],
                "has_more": len(intents) > limit,
                "url": "/v1/payment_intents",
            }
        )

    async def search(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        query = SearchQuery.parse(request.query_params.get("query", ""))
        limit = _limit(request)
        start = _page(request.query_params.get("page"))
        intents = await run_in_threadpool(self.store.account_intents, account)
        found = [intent for intent in intents if query(intent)]
        end = start + limit
        return JSONResponse(
            {
                "object": "search_result",
                "data": [intent.to_json() for intent in found[start:end]],
                "has_more": end < len(found),
                "next_page": f"page_{end}" if end < len(found) else None,
                "url": SEARCH_URL,
            }
        )


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", "10")
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 100):
        raise _invalid("limit", "limit must be an integer between 1 and 100.")
    return int(raw)


def _page(raw: str | None) -> int:
    # The cursor is opaque to clients; here it is where the next page starts.
    if raw is None:
        return 0
    offset = raw.removeprefix("page_")
    if offset == raw or not (offset.isascii() and offset.isdigit()):
        raise _invalid("page", f"Invalid page: {raw!r}.")
    return int(offset)
