"""The sandbox provider's HTTP API, faithful to the server side of the Idempotency-Key contract."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, TypeGuard
from urllib.parse import parse_qsl

import attrs
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from payonce.sandbox._faults import FaultInjector, FaultName, Faults, is_fault_name
from payonce.sandbox._store import (
    Claimed,
    InProgress,
    Mismatch,
    Payment,
    Replay,
    SandboxStore,
    StoredResponse,
    new_payment_id,
)
from payonce.sandbox._webhooks import WebhookConfig, WebhookSender

DEFAULT_API_KEY: Final = "sk_test_payonce"
DEFAULT_ACCOUNT: Final = "acct_demo"
DECLINE_AMOUNT: Final = 40200
MAX_KEY_LENGTH: Final = 255
RESET_TIMEOUT: Final = 30.0
_MAX_AMOUNT: Final = 10**12  # keeps amounts inside SQLite's 64-bit integers
_PAYMENT_FIELDS: Final = frozenset({"amount", "currency", "reference", "metadata"})


def _default_api_keys() -> dict[str, str]:
    return {DEFAULT_API_KEY: DEFAULT_ACCOUNT}


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be non-negative, got {value!r}")


Dialect = Literal["sandbox", "stripe", "adyen"]
AuthMode = Literal["bearer", "x-api-key"]
ProviderLike = Literal["stripe", "adyen", "mollie"]


def _client_error_status(
    instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is not None and not 400 <= value < 500:
        raise ValueError(f"{attribute.name} must be a 4xx status, got {value!r}")


@attrs.frozen
class SandboxConfig:
    """How the sandbox behaves. Every switch defaults to the sandbox's own contract; the
    others make it answer the way a real provider does (``SandboxConfig.like("stripe")``)."""

    api_keys: Mapping[str, str] = attrs.field(factory=_default_api_keys)
    key_lifetime: float = attrs.field(default=24 * 3600.0, validator=_non_negative)
    processing_seconds: float = attrs.field(default=0.0, validator=_non_negative)
    faults: Faults = attrs.field(factory=Faults)
    store_path: str | None = None
    dialect: Dialect = attrs.field(
        default="sandbox", validator=attrs.validators.in_(("sandbox", "stripe", "adyen"))
    )
    """Shape of error bodies: the sandbox's, Stripe's (``type``/``code``, idempotency_error)
    or Adyen's (``errorCode``, 704 while in progress; payments answer 200 with a
    ``resultCode``, ``Refused`` for a decline)."""
    form_bodies: bool = False
    """Also accept ``application/x-www-form-urlencoded`` payments, with Stripe's
    ``metadata[name]=value`` keys."""
    auth: AuthMode = attrs.field(
        default="bearer", validator=attrs.validators.in_(("bearer", "x-api-key"))
    )
    """``Authorization: Bearer <key>``, or Adyen's ``X-API-Key: <key>``."""
    key_header: str = "Idempotency-Key"
    """The request header that carries the idempotency key."""
    retry_hint_header: str | None = None
    """A response header telling clients whether to retry, e.g. ``Stripe-Should-Retry``."""
    retry_hints: Mapping[int, bool] = attrs.field(factory=dict)
    """Its value per response status (API routes only); statuses not listed get none."""
    mismatch_status: int | None = attrs.field(default=None, validator=_client_error_status)
    """Status for a key reused with other parameters; None: 400 for Stripe, else 422."""
    webhooks: WebhookConfig | None = None
    """Where to deliver a signed event for every settled payment (None: no webhooks)."""

    @classmethod
    def like(cls, provider: ProviderLike, **overrides: Any) -> SandboxConfig:
        """A sandbox that answers the way ``provider`` documents (its payonce profile's peer)."""
        try:
            preset = _PRESETS[provider]
        except KeyError:
            known = ", ".join(sorted(_PRESETS))
            raise ValueError(f"no preset for {provider!r}; known: {known}") from None
        return cls(**{**preset, **overrides})


_PRESETS: Final[Mapping[str, Mapping[str, Any]]] = {
    "stripe": {
        "dialect": "stripe",
        "form_bodies": True,
        "key_lifetime": 24 * 3600.0,
        "retry_hint_header": "Stripe-Should-Retry",
        # A decline is final; a lost answer (503) or a busy key/object (409) is worth a retry.
        "retry_hints": {402: False, 409: True, 503: True},
    },
    "adyen": {
        "dialect": "adyen",
        "auth": "x-api-key",
        # Adyen keeps keys "a minimum of 31 days"; payonce's profile assumes only 7.
        "key_lifetime": 31 * 24 * 3600.0,
    },
    "mollie": {"key_lifetime": 3600.0},
}


class ApiError(Exception):
    def __init__(
        self, status: int, type_: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = dict(headers or {})


class ConnectionDropped(Exception):
    """Raised on purpose so that uvicorn closes the socket in the middle of a response."""


class _QuietDrops(logging.Filter):
    # uvicorn logs every exception escaping the app with a traceback; a drop we injected on
    # purpose is not an error worth one.
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ConnectionDropped))


def _silence_injected_drops() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrops) for f in logger.filters):
        logger.addFilter(_QuietDrops())


def _dumps(content: Any) -> bytes:
    # The same encoding as JSONResponse, so a replay is byte-identical to the original.
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _error(status: int, type_: str, message: str, dialect: Dialect = "sandbox") -> JSONResponse:
    return JSONResponse(_error_body(dialect, status, type_, message), status)


# The sandbox's error types under Stripe's names: (type, code).
_STRIPE_ERRORS: Final[Mapping[str, tuple[str, str | None]]] = {
    "idempotency_key_mismatch": ("idempotency_error", None),
    "idempotency_key_in_use": ("invalid_request_error", "idempotency_key_in_use"),
    "lock_timeout": ("invalid_request_error", "lock_timeout"),
    "rate_limit": ("invalid_request_error", "rate_limit"),
    "service_unavailable": ("api_error", None),
    "not_found": ("invalid_request_error", "resource_missing"),
}
# Adyen numbers its errors; 704 is "request already processed or in progress". Other
# errors keep the sandbox's type as their code.
_ADYEN_CODES: Final[Mapping[str, str]] = {"idempotency_key_in_use": "704"}
_DIALECT_MESSAGES: Final[Mapping[tuple[str, str], str]] = {
    ("stripe", "idempotency_key_mismatch"): (
        "Keys for idempotent requests can only be used with the same parameters they were "
        "first used with. Try using a key other than '{key}' if you meant to execute a "
        "different request."
    ),
    ("stripe", "idempotency_key_in_use"): (
        "There is currently another in-progress request using this idempotency key ({key}). "
        "Please try again later."
    ),
    ("adyen", "idempotency_key_in_use"): "request already processed or in progress",
}


def _error_body(dialect: Dialect, status: int, type_: str, message: str) -> dict[str, Any]:
    if dialect == "stripe":
        kind, code = _STRIPE_ERRORS.get(type_, ("invalid_request_error", None))
        error = {"type": kind, "message": message}
        if code is not None:
            error["code"] = code
        return {"error": error}
    if dialect == "adyen":
        kind = "security" if status in (401, 403) else "internal" if status >= 500 else "validation"
        code = _ADYEN_CODES.get(type_, type_)
        return {"status": status, "errorCode": code, "message": message, "errorType": kind}
    return {"error": {"type": type_, "message": message}}


def _retry_after(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


class _DroppedResponse(Response):
    """Promises the whole stored body, sends half of it, then breaks the connection."""

    def __init__(self, stored: StoredResponse) -> None:
        super().__init__(stored.body, status_code=stored.status, media_type="application/json")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message = {
            "type": "http.response.start",
            "status": self.status_code,
            "headers": self.raw_headers,
        }
        await send(start)
        half = self.body[: len(self.body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})
        raise ConnectionDropped


class _RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = "req_" + secrets.token_hex(12)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["Request-Id"] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)


class _Activity:
    """Counts the API requests being handled, so a reset can wait until none is."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._in_flight = 0

    def enter(self) -> None:
        with self._idle:
            self._in_flight += 1

    def leave(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)


class _ActivityMiddleware:
    def __init__(self, app: ASGIApp, activity: _Activity) -> None:
        self.app = app
        self.activity = activity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only the provider's API: a control request (a reset among them) is not waited for.
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        self.activity.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.activity.leave()


class _RetryHintMiddleware:
    """Adds a provider's "should the client retry?" header to API answers, by status."""

    def __init__(self, app: ASGIApp, header: str | None, hints: Mapping[int, bool]) -> None:
        self.app = app
        self.header = header
        self.hints = dict(hints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        header = self.header
        if scope["type"] != "http" or header is None or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        async def send_with_hint(message: Message) -> None:
            if message["type"] == "http.response.start":
                hint = self.hints.get(message["status"])
                if hint is not None:
                    MutableHeaders(scope=message)[header] = "true" if hint else "false"
            await send(message)

        await self.app(scope, receive, send_with_hint)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        raise ApiError(400, "invalid_request", "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "request body must be a JSON object")
    return data


_METADATA_PAIR: Final = re.compile(r"metadata\[([^\[\]]+)\]")


def _form_object(body: bytes) -> dict[str, Any]:
    """A Stripe-style form body as the JSON object it stands for."""
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=True)
    except ValueError:  # UnicodeDecodeError included
        raise ApiError(400, "invalid_request", "request body is not valid form data") from None
    data: dict[str, Any] = {}
    metadata: dict[str, str] = {}
    for name, value in pairs:
        match = _METADATA_PAIR.fullmatch(name)
        target, field = (metadata, match.group(1)) if match else (data, name)
        if field in target:
            raise ApiError(400, "invalid_request", f"{name} is given more than once")
        target[field] = value
    if metadata:
        if "metadata" in data:
            raise ApiError(400, "invalid_request", "metadata is given more than once")
        data["metadata"] = metadata
    amount = data.get("amount")
    # Form values are strings; Stripe reads integer parameters from their digits.
    if isinstance(amount, str) and amount.isascii() and amount.isdigit():
        data["amount"] = int(amount)
    return data


def _is_form(request: Request) -> bool:
    content_type = request.headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded"


# One clause of Stripe's search language: metadata['name']:'value', quotes escaped by "\".
_METADATA_QUERY: Final = re.compile(r"metadata\['((?:[^'\\]|\\.)+)'\]:'((?:[^'\\]|\\.)*)'")


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _is_currency(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 3 and value.isascii() and value.isalpha()


@attrs.frozen
class PaymentRequest:
    amount: int
    currency: str
    reference: str | None
    metadata: Mapping[str, Any]

    @classmethod
    def parse(cls, body: bytes, *, form: bool = False) -> PaymentRequest:
        data = _form_object(body) if form else _json_object(body)
        unknown = set(data) - _PAYMENT_FIELDS
        if unknown:
            raise ApiError(400, "invalid_request", f"unknown fields: {', '.join(sorted(unknown))}")
        amount, currency = data.get("amount"), data.get("currency")
        reference, metadata = data.get("reference"), data.get("metadata", {})
        if not isinstance(amount, int) or isinstance(amount, bool) or not 0 < amount < _MAX_AMOUNT:
            raise ApiError(400, "invalid_request", "amount must be a positive integer")
        if not _is_currency(currency):
            raise ApiError(400, "invalid_request", "currency must be a 3-letter code")
        if reference is not None and not isinstance(reference, str):
            raise ApiError(400, "invalid_request", "reference must be a string")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise ApiError(400, "invalid_request", "metadata must be an object")
        return cls(amount, currency, reference, metadata)

    def fingerprint(self) -> str:
        # Canonical form: the same parameters hash the same whatever the key order or spacing.
        canonical = json.dumps(
            ["POST", "/v1/payments", self.amount, self.currency, self.reference, self.metadata],
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


def _idempotency_key(request: Request, header: str = "Idempotency-Key") -> str:
    key = request.headers.get(header, "")
    # Accept the RFC 8941 sf-string form ("abc") as well as the bare value.
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key:
        raise ApiError(400, "idempotency_key_missing", f"an {header} header is required")
    if len(key) > MAX_KEY_LENGTH:
        raise ApiError(400, "invalid_request", f"{header} exceeds {MAX_KEY_LENGTH} chars")
    return key


def _forced_fault(request: Request) -> FaultName | None:
    name = request.headers.get("sandbox-fault")
    if name is None:
        return None
    if not is_fault_name(name):
        raise ApiError(400, "invalid_request", f"unknown Sandbox-Fault {name!r}")
    return name


def _stored(stored: StoredResponse, *, replayed: bool = False) -> Response:
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return Response(stored.body, stored.status, headers, media_type="application/json")


class Sandbox:
    """One provider: its configuration, store and fault injector, and the app serving them."""

    def __init__(self, config: SandboxConfig, store: SandboxStore, *, owns_store: bool) -> None:
        self.config = config
        self.store = store
        self.injector = FaultInjector(config.faults)
        self.webhooks = WebhookSender(config.webhooks) if config.webhooks is not None else None
        self._owns_store = owns_store
        self._activity = _Activity()
        _silence_injected_drops()
        self.app = Starlette(
            routes=[
                Route("/v1/payments", self._create_payment, methods=["POST"]),
                Route("/v1/payments", self._list_payments, methods=["GET"]),
                Route("/v1/payments/search", self._search_payments, methods=["GET"]),
                Route("/v1/payments/{payment_id}", self._get_payment, methods=["GET"]),
                Route("/_sandbox/executions", self._executions, methods=["GET"]),
                Route("/_sandbox/script", self._script, methods=["POST"]),
                Route("/_sandbox/faults", self._faults, methods=["POST"]),
                Route("/_sandbox/clock", self._clock, methods=["POST"]),
                Route("/_sandbox/reset", self._reset, methods=["POST"]),
                Route("/_sandbox/webhooks", self._webhook_attempts, methods=["GET"]),
            ],
            middleware=[
                Middleware(_ActivityMiddleware, activity=self._activity),
                Middleware(_RequestIdMiddleware),
                Middleware(
                    _RetryHintMiddleware, header=config.retry_hint_header, hints=config.retry_hints
                ),
            ],
            exception_handlers={ApiError: self._api_error, HTTPException: _http_error},
            lifespan=self._lifespan,
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        if self.webhooks is not None:
            self.webhooks.close()
        if self._owns_store:
            self.store.close()

    def reset(self, timeout: float = RESET_TIMEOUT) -> None:
        # A request still being handled would otherwise execute into the fresh state: a
        # payment that no one of the next users asked for.
        if not self._activity.wait_idle(timeout):
            raise RuntimeError(f"the sandbox still had requests in flight after {timeout} s")
        self.store.reset()
        self.injector.reset(self.config.faults)
        if self.webhooks is not None and not self.webhooks.reset(timeout):
            raise RuntimeError(f"a webhook delivery was still in flight after {timeout} s")

    def _authenticate(self, request: Request) -> str:
        if self.config.auth == "x-api-key":
            account = self.config.api_keys.get(request.headers.get("x-api-key", "").strip())
            if account is None:
                raise ApiError(401, "authentication_error", "invalid API key")
            return account
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        account = self.config.api_keys.get(token.strip()) if scheme.lower() == "bearer" else None
        if account is None:
            raise ApiError(
                401, "authentication_error", "invalid API key", {"WWW-Authenticate": "Bearer"}
            )
        return account

    def _key_error(self, status: int, type_: str, message: str, key: str) -> ApiError:
        template = _DIALECT_MESSAGES.get((self.config.dialect, type_))
        return ApiError(status, type_, template.format(key=key) if template else message)

    async def _api_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        response = _error(exc.status, exc.type, exc.message, self.config.dialect)
        response.headers.update(exc.headers)
        return response

    async def _create_payment(self, request: Request) -> Response:
        account = self._authenticate(request)
        key = _idempotency_key(request, self.config.key_header)
        forced = _forced_fault(request)
        form = self.config.form_bodies and _is_form(request)
        params = PaymentRequest.parse(await request.body(), form=form)
        # Only well-formed requests draw faults, so a 400 never shifts a seeded run.
        plan = self.injector.plan(forced)
        faults = self.injector.faults
        if plan.rate_limit:
            retry_after = _retry_after(faults.retry_after_seconds)
            raise ApiError(429, "rate_limit", "too many requests", {"Retry-After": retry_after})
        if plan.fail_before:
            raise ApiError(503, "service_unavailable", "the service is unavailable")
        if plan.lock_timeout:
            raise ApiError(409, "lock_timeout", "another request is using this payment's objects")
        if plan.delay and faults.delay_seconds > 0:
            await asyncio.sleep(faults.delay_seconds)

        claim = await run_in_threadpool(
            self.store.claim, account, key, params.fingerprint(), self.config.key_lifetime
        )
        if isinstance(claim, Replay):
            return _stored(claim.response, replayed=True)
        if isinstance(claim, Mismatch):
            status = self.config.mismatch_status or (
                400 if self.config.dialect == "stripe" else 422
            )
            message = "this key was used with different parameters"
            raise self._key_error(status, "idempotency_key_mismatch", message, key)
        if isinstance(claim, InProgress):
            message = "a request with this key is in flight"
            raise self._key_error(409, "idempotency_key_in_use", message, key)

        stored = await self._execute(account, key, claim, params)
        if plan.fail_after:
            raise ApiError(503, "service_unavailable", "the service is unavailable")
        if plan.drop_after:
            return _DroppedResponse(stored)
        return _stored(stored)

    async def _execute(
        self, account: str, key: str, claim: Claimed, params: PaymentRequest
    ) -> StoredResponse:
        try:
            if self.config.processing_seconds > 0:
                await asyncio.sleep(self.config.processing_seconds)
            return await run_in_threadpool(self._record, account, key, claim, params)
        except BaseException:
            # Nothing was executed (the record is all or nothing), so a retry may run it.
            self.store.release(account, key, claim.token)
            raise

    def _record(
        self, account: str, key: str, claim: Claimed, params: PaymentRequest
    ) -> StoredResponse:
        declined = params.amount == DECLINE_AMOUNT
        payment = Payment(
            id=new_payment_id(),
            account=account,
            amount=params.amount,
            currency=params.currency,
            reference=params.reference,
            status="failed" if declined else "succeeded",
            idempotency_key=key,
            metadata=params.metadata,
            created=self.store.clock.now(),
        )
        if self.config.dialect == "adyen":
            # Adyen answers a refusal with 200 too: the outcome is in resultCode.
            body = {
                **payment.to_json(),
                "pspReference": payment.id,
                "merchantReference": payment.reference,
                "resultCode": "Refused" if declined else "Authorised",
            }
            response = StoredResponse(200, _dumps(body))
        elif declined:
            body = {
                "error": {
                    "type": "card_error",
                    "code": "card_declined",
                    "message": "Your card was declined.",
                    "payment": payment.to_json(),
                }
            }
            response = StoredResponse(402, _dumps(body))
        else:
            response = StoredResponse(201, _dumps(payment.to_json()))
        self.store.record_execution(claim.token, payment, response)
        if self.webhooks is not None:
            self.webhooks.enqueue(payment)
        return response

    async def _get_payment(self, request: Request) -> Response:
        account = self._authenticate(request)
        payment_id = request.path_params["payment_id"]
        payment = await run_in_threadpool(self.store.find_payment, account, payment_id)
        if payment is None:
            raise ApiError(404, "not_found", f"no such payment: {payment_id}")
        return JSONResponse(payment.to_json())

    async def _list_payments(self, request: Request) -> Response:
        account = self._authenticate(request)
        key = request.query_params.get("idempotency_key")
        reference = request.query_params.get("reference")
        if key is None and reference is None:
            raise ApiError(400, "invalid_request", "give idempotency_key or reference")
        found = await run_in_threadpool(
            lambda: self.store.find_payments(account, idempotency_key=key, reference=reference)
        )
        return JSONResponse({"object": "list", "data": [p.to_json() for p in found]})

    async def _search_payments(self, request: Request) -> Response:
        account = self._authenticate(request)
        match = _METADATA_QUERY.fullmatch(request.query_params.get("query", "").strip())
        if match is None:
            raise ApiError(400, "invalid_request", "query must be metadata['name']:'value'")
        name, value = _unescape(match.group(1)), _unescape(match.group(2))
        found = await run_in_threadpool(self.store.search_metadata, account, name, value)
        return JSONResponse(
            {
                "object": "search_result",
                "data": [p.to_json() for p in found],
                "has_more": False,
                "url": "/v1/payments/search",
            }
        )

    async def _executions(self, request: Request) -> Response:
        executions = await run_in_threadpool(self.store.executions)
        return JSONResponse({"executions": executions, "total": sum(executions.values())})

    async def _script(self, request: Request) -> Response:
        names = _json_object(await request.body()).get("faults")
        if not isinstance(names, list):
            raise ApiError(400, "invalid_request", "faults must be a list of fault names")
        try:
            self.injector.script(names)
        except ValueError as exc:
            raise ApiError(400, "invalid_request", str(exc)) from None
        return JSONResponse({"script": self.injector.pending_script()})

    async def _faults(self, request: Request) -> Response:
        try:
            faults = Faults.from_json(_json_object(await request.body()))
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "invalid_request", str(exc)) from None
        self.injector.set_faults(faults)
        return JSONResponse(attrs.asdict(faults))

    async def _clock(self, request: Request) -> Response:
        seconds = _json_object(await request.body()).get("advance")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise ApiError(400, "invalid_request", "advance must be a number of seconds")
        await run_in_threadpool(self.store.clock.advance, seconds)
        return JSONResponse({"now": self.store.clock.now()})

    async def _webhook_attempts(self, request: Request) -> Response:
        if self.webhooks is None:
            raise ApiError(404, "not_found", "this sandbox sends no webhooks")
        return JSONResponse(
            {
                "config": self.webhooks.config.to_json(),
                "attempts": [attempt.to_json() for attempt in self.webhooks.attempts()],
                "pending": self.webhooks.pending(),
            }
        )

    async def _reset(self, request: Request) -> Response:
        try:
            await run_in_threadpool(self.reset)
        except RuntimeError as exc:
            raise ApiError(409, "in_flight", str(exc)) from None
        return JSONResponse({"reset": True})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    type_ = "not_found" if exc.status_code == 404 else "invalid_request"
    response = _error(exc.status_code, type_, exc.detail)
    response.headers.update(exc.headers or {})
    return response


def create_app(config: SandboxConfig | None = None, store: SandboxStore | None = None) -> Starlette:
    """The ASGI app; without a store it opens ``config.store_path`` and closes it on shutdown."""
    config = config or SandboxConfig()
    if store is None:
        return Sandbox(config, SandboxStore(config.store_path), owns_store=True).app
    return Sandbox(config, store, owns_store=False).app
